"""Decode kernels (issue 6) against numpy: activation packing, RMSNorm, the tensor-core GEMV family on GGUF
blocks (Q4_K, Q5_K, Q6_K, Q8_0) and F32, and the Q4_K embedding gather.

Oracles: `openjet_launcher.model.quants.dequantize` (bit-equal to gguf) for the weights and a few lines of
numpy for the activation pack (power-of-two row scale, fp16 round to nearest even, 32-block sums in the
kernel's butterfly order: bit-equal). With x packed the same way, the GEMV must equal
dequantize(W) @ (fp16 x) up to fp32 summation order (~1e-6 relative); against the unrounded x the
difference is the fp16 rounding (~3e-4 relative). Row t of a T-row call must equal a 1-row call bit for bit.

OPENJET_GPU_REPORT=path appends the measured error figures as JSON lines (for the issue notes).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from gpu_report import report

from openjet_launcher.engine import kernels_test as kt
from openjet_launcher.errors import OpenJetError
from openjet_launcher.model.quants import _k4_scales, dequantize, quantize

pytestmark = pytest.mark.gpu

Q = kt.QTYPES
KQUANTS = ["Q4_K", "Q5_K", "Q6_K", "Q8_0"]
# (n, k) = (out, in) of the 27B model's decode GEMVs (spec qwen38.md §2.2)
SHAPES_27B = [(10240, 5120), (17408, 5120), (5120, 17408), (5120, 6144)]
# small shapes: odd n (Q6_K rows then start off 16-byte alignment; partial 16-row tiles), k of 1..9 units
SHAPES_SMALL = [(1, 256), (3, 512), (7, 768), (33, 1280), (130, 2304)]


def pack_act_numpy(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(xh uint16 [t, k], xsum uint16 [t, k/32 * 2], xinv float32 [t]) exactly as act_pack.cuh computes them."""
    x = x.astype(np.float32)
    amax = np.abs(x).max(axis=1)
    e = np.frexp(amax)[1]
    sh = np.where(amax > 0, np.clip(15 - e, -100, 100), 0)
    return pack_scaled_numpy(x, np.ldexp(np.float32(1), sh).astype(np.float32))


def pack_scaled_numpy(x: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pack of x [t, k] under the row scales `scale` [t] (powers of two; the maximum's in pack_act_numpy, a
    bound's in the bounded packs), as act_pack.cuh's pack_block writes it: (xh, xsum, xinv = 1 / scale)."""
    t, k = x.shape
    x = x.astype(np.float32)
    scale = scale.astype(np.float32)
    h = (x * scale[:, None]).astype(np.float16)
    s = h.astype(np.float32).reshape(t, k // 32, 32)
    for m in (16, 8, 4, 2, 1):  # the kernel's xor butterfly; lane 0 writes
        s = s + s[..., np.arange(32) ^ m]
    xh, xsum = pack_layout_numpy(h, s[..., 0] / np.float32(32))
    return xh, xsum, (np.float32(1) / scale).astype(np.float32)


def pack_layout_numpy(h: np.ndarray, s32: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A pack's stored arrays from its fp16 values h [t, k] and its 32-block sums / 32, s32 [t, k / 32] (float32):
    (xh uint16 [t, k], each quad stored 0, 2, 1, 3; xsum uint16 [t, k / 32 * 2], hi and lo halves at act_sum_pos)."""
    t, k = h.shape
    xh = h.view(np.uint16).reshape(t, k // 4, 4)[..., [0, 2, 1, 3]].reshape(t, k)
    hi = s32.astype(np.float16)
    lo = (s32 - hi.astype(np.float32)).astype(np.float16)
    b = np.arange(k // 32)
    pos = (b >> 3) * 16 + ((b & 7) >> 1) * 4 + (b & 1)  # act_sum_pos
    xsum = np.zeros((t, k // 32 * 2), np.uint16)
    xsum[:, pos], xsum[:, pos + 2] = hi.view(np.uint16), lo.view(np.uint16)
    return xh, xsum


def unpack_act(xh: np.ndarray, xinv: np.ndarray) -> np.ndarray:
    """float64 x as the GEMV sees it: fp16 values in element order, times 1/s."""
    t, k = xh.shape
    h = xh.reshape(t, k // 4, 4)[..., [0, 2, 1, 3]].reshape(t, k).view(np.float16)
    return h.astype(np.float64) * xinv.astype(np.float64)[:, None]


def rel_err(y: np.ndarray, ref: np.ndarray, scale: np.ndarray | None = None) -> float:
    """Largest over token rows of ||y - ref|| / ||scale|| (scale = ref by default). With scale = |W| @ |x|
    the figure does not blow up where a row's sum cancels (n = 1: a single dot product)."""
    scale = ref if scale is None else scale
    return float(max(np.linalg.norm(y[i] - ref[i]) / np.linalg.norm(scale[i]) for i in range(len(ref))))


def random_x(rng, t: int, k: int) -> np.ndarray:
    x = rng.standard_normal((t, k), dtype=np.float32)
    x *= np.float32(2.0) ** rng.integers(-3, 4, size=(t, k // 32, 1)).repeat(32, axis=2).reshape(t, k)
    return x


def random_raw(rng, qtype: str, n: int, k: int, exp_lo: int = -14, exp_hi: int = -6) -> np.ndarray:
    """Random GGUF blocks (every bit random) with finite fp16 scale fields of magnitude 2**[exp_lo, exp_hi]."""
    epb, bpb = kt.BLOCK[Q[qtype]]
    raw = rng.integers(0, 256, size=(n, k // epb, bpb), dtype=np.uint8)

    def f16(count):
        e = rng.integers(exp_lo, exp_hi + 1, size=raw.shape[:2] + (count,))
        with np.errstate(over="ignore"):  # 2**15 * 1.99 rounds past 65504: clamped just below
            v = (rng.uniform(1.0, 2.0, size=e.shape) * np.exp2(e)).astype(np.float16)
        v[~np.isfinite(v)] = np.float16(65504)
        return v.view(np.uint8).reshape(raw.shape[:2] + (2 * count,))

    at = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208, 1), "Q8_0": (0, 1)}[qtype]
    raw[:, :, at[0]:at[0] + 2 * at[1]] = f16(at[1])
    return raw.reshape(n, -1)


def check_gemv(qtype: str, raw: np.ndarray, x: np.ndarray, *, label: str) -> None:
    y = kt.gemv(Q[qtype], raw, x)
    assert np.isfinite(y).all()
    w = dequantize(raw, Q[qtype]).astype(np.float64)
    xd = unpack_act(*pack_act_numpy(x)[::2])
    ref_q = (w @ xd.T).T
    ref_x = (w @ x.astype(np.float64).T).T
    e_q, e_x = rel_err(y, ref_q), rel_err(y, ref_x)
    c_q = rel_err(y, ref_q, (np.abs(w) @ np.abs(xd).T).T)
    report(test="gemv", qtype=qtype, n=raw.shape[0], k=x.shape[1], t=x.shape[0], label=label,
           rel_err_vs_emulated=e_q, err_vs_emulated_over_abs_sum=c_q, rel_err_vs_unquantised_x=e_x)
    assert c_q < 1e-5, f"{qtype} {label}: error {c_q:.2e} of |W| @ |x| against the fp16-x reference"
    if raw.shape[0] >= 128:  # norm over many rows: the plain relative error is well conditioned
        assert e_q < 1e-5, f"{qtype} {label}: {e_q:.2e} relative error against the fp16-x reference"
        assert e_x < 1e-3, f"{qtype} {label}: {e_x:.2e} relative error against the unrounded x"


# ------------------------------------------------------------------------------ activation packing


def test_pack_act_equals_numpy():
    rng = np.random.default_rng(1)
    x = random_x(rng, 5, 5120)
    x[1, 64:96] = 0.0  # an all-zero block
    x[2, :32] = np.float32(1e-30)  # far below the row's max: fp16 flushes it to zero
    x[3] *= np.float32(1e4)  # would overflow fp16 without the row scale
    x[4] = 0.0  # an all-zero row: scale 1
    got = kt.pack_act(x)
    want = pack_act_numpy(x)
    for g, w_, name in zip(got, want, ("xh", "xsum", "xinv")):
        np.testing.assert_array_equal(g, w_, err_msg=name)
    assert np.isfinite(unpack_act(got[0], got[2])).all()
    np.testing.assert_allclose(unpack_act(got[0], got[2])[3], x[3], rtol=2 ** -11, atol=0)


@pytest.mark.parametrize("threads", ["auto", "256", "512", "1024"])
def test_pack_act_of_a_prefills_rows_equals_numpy(threads, monkeypatch):
    """More than 8 rows take a prefill's block sizes (act_pack.cuh, row_pack_threads; OPENJET_ROW_PACK_THREADS):
    numpy's pack bit for bit, plain and after the norm, for rows of 6,144 (the 27B's GDN and attention outputs,
    held in registers) and 17,408 (longer than the smaller blocks hold: each value computed twice)."""
    monkeypatch.setenv("OPENJET_ROW_PACK_THREADS", threads)
    rng = np.random.default_rng(4)
    for k in (6144, 17408):
        x = random_x(rng, 40, k)
        x[3] *= np.float32(1e4)
        x[5] = 0.0
        w = rng.uniform(0.5, 1.5, k).astype(np.float32)
        for got, want, how in ((kt.pack_act(x), pack_act_numpy(x), "plain"),
                               (kt.pack_act(x, w, 1e-6), pack_act_numpy(kt.rmsnorm(x, w, 1e-6)), "normed")):
            for g, w_, name in zip(got, want, ("xh", "xsum", "xinv")):
                np.testing.assert_array_equal(g, w_, err_msg=f"{threads} threads, k={k}, {how}: {name}")


def test_rmsnorm_matches_numpy():
    rng = np.random.default_rng(2)
    x = random_x(rng, 4, 5120)
    w = rng.uniform(0.5, 1.5, 5120).astype(np.float32)
    y = kt.rmsnorm(x, w, 1e-6)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64 ** 2).mean(axis=1, keepdims=True) + 1e-6) * w
    err = float(np.abs(y - ref).max() / np.abs(ref).max())
    report(test="rmsnorm", max_err_over_max=err)
    np.testing.assert_allclose(y, ref, rtol=2e-6, atol=1e-6 * np.abs(ref).max())


def test_fused_rmsnorm_pack_equals_pack_of_rmsnorm():
    rng = np.random.default_rng(3)
    x = random_x(rng, 5, 17408)
    w = rng.uniform(0.5, 1.5, 17408).astype(np.float32)
    got = kt.pack_act(x, w, 1e-6)
    want = pack_act_numpy(kt.rmsnorm(x, w, 1e-6))
    for g, w_, name in zip(got, want, ("xh", "xsum", "xinv")):
        np.testing.assert_array_equal(g, w_, err_msg=name)


# ---------------------------------------------------------------------------------------------- GEMV


@pytest.mark.parametrize("qtype", KQUANTS)
@pytest.mark.parametrize("n,k", SHAPES_SMALL)
def test_gemv_small_shapes_match_numpy(qtype, n, k):
    rng = np.random.default_rng(n * 7 + k)
    raw = quantize(rng.standard_normal((n, k), dtype=np.float32), Q[qtype])
    for t in (1, 3, 8):
        check_gemv(qtype, raw, random_x(rng, t, k), label=f"small t={t}")


@pytest.mark.parametrize("qtype", KQUANTS)
@pytest.mark.parametrize("n,k", SHAPES_27B)
def test_gemv_27b_shapes_match_numpy(qtype, n, k):
    rng = np.random.default_rng(n + k)
    raw = quantize(rng.standard_normal((n, k), dtype=np.float32), Q[qtype])
    check_gemv(qtype, raw, random_x(rng, 8, k), label="27b t=8")
    check_gemv(qtype, raw, random_x(rng, 1, k), label="27b t=1")


@pytest.mark.parametrize("qtype", KQUANTS)
@pytest.mark.parametrize("exp_lo,exp_hi", [(-24, 15), (10, 15), (-24, -20)])
def test_gemv_raw_blocks_with_extreme_scales(qtype, exp_lo, exp_hi):
    """Every bit of the blocks random, fp16 scales from subnormal to 65504: against the same
    activations packed in numpy (gemv_packed), so only the weight path is under test."""
    rng = np.random.default_rng(exp_lo + 100)
    n, k = 67, 2048
    raw = random_raw(rng, qtype, n, k, exp_lo, exp_hi)
    xh, xsum, xinv = pack_act_numpy(random_x(rng, 4, k))
    y = kt.gemv_packed(Q[qtype], raw, xh, xsum, xinv)
    ref = (dequantize(raw, Q[qtype]).astype(np.float64) @ unpack_act(xh, xinv).T).T
    e = rel_err(y, ref)
    report(test="gemv_raw_extreme", qtype=qtype, exp=[exp_lo, exp_hi], rel_err_vs_emulated=e)
    assert e < 1e-5


def test_lm_head_q6_k_rows_match_numpy():
    """5120 -> 248320 in Q6_K (1.04 GB): all rows computed, a sample (and the last rows) checked."""
    rng = np.random.default_rng(5)
    n, k = 248320, 5120
    raw = random_raw(rng, "Q6_K", n, k)
    x = random_x(rng, 2, k)
    y = kt.gemv(Q["Q6_K"], raw, x)
    assert np.isfinite(y).all()
    rows = np.concatenate([rng.choice(n, 4096, replace=False), np.arange(n - 64, n)])
    xh, _, xinv = pack_act_numpy(x)
    ref = (dequantize(raw[rows], Q["Q6_K"]).astype(np.float64) @ unpack_act(xh, xinv).T).T
    e = rel_err(y[:, rows], ref)
    report(test="lm_head_q6_k", rows_checked=len(rows), rel_err_vs_emulated=e)
    assert e < 1e-5


@pytest.mark.parametrize("qtype", KQUANTS + ["F32"])
def test_gemv_rows_do_not_depend_on_t(qtype):
    """Row t of a T-row call equals the 1-row call on x[t] bit for bit, for every T = 1..8."""
    rng = np.random.default_rng(6)
    n, k = (48, 5120) if qtype == "F32" else (5120, 6144)
    w = rng.standard_normal((n, k), dtype=np.float32)
    raw = w if qtype == "F32" else quantize(w, Q[qtype])
    x = random_x(rng, 8, k)
    singles = np.concatenate([kt.gemv(Q[qtype], raw, x[i:i + 1]) for i in range(8)])
    for t in range(1, 9):
        yt = kt.gemv(Q[qtype], raw, x[:t])
        np.testing.assert_array_equal(yt, singles[:t], err_msg=f"T={t}")


# The decode GEMV's other tile settings (kernels_test.set_gemv_tiles): 8-row tiles everywhere, and "auto" (the
# default: 8-row tiles where they fit one wave of the GPU and help).
@pytest.mark.parametrize("tiles", ["8", "auto"])
@pytest.mark.parametrize("qtype", KQUANTS)
def test_decode_shapes_give_the_bits_of_16_row_tiles(qtype, tiles):
    """Each tile setting against 16-row tiles, bit for bit: a half tile's rows g + 8 are zeros in the mma, which
    leaves rows g alone. Partial tiles (n = 33, 1,000), warps with odd and even unit counts and rows alternating
    4-byte alignment (k = 1,280 / 2,560: 5 / 10 units a row), the 27B's n = 5,120 shape, t = 1, 3, 8; the 16-row
    results are the ones the other tests check against numpy."""
    rng = np.random.default_rng(21)
    try:
        for n, k in [(33, 1280), (1000, 2560), (5120, 6144)]:
            raw = random_raw(rng, qtype, n, k)
            x = random_x(rng, 8, k)
            for t in (1, 3, 8):
                kt.set_gemv_tiles("16")
                base = kt.gemv(Q[qtype], raw, x[:t])
                kt.set_gemv_tiles(tiles)
                got = kt.gemv(Q[qtype], raw, x[:t])
                assert np.isfinite(base).all()
                np.testing.assert_array_equal(got, base, err_msg=f"{n}x{k} T={t}")
    finally:
        kt.set_gemv_tiles("env")


@pytest.mark.parametrize("qtype", KQUANTS)
def test_the_tile_layout_moves_the_bytes_as_numpy_does(qtype):
    """The tile layout (weight_layout.cuh): each group of 16 rows stored unit by unit, i.e. numpy's
    [n / 16, 16, units, unit_bytes] -> [n / 16, units, 16, pitch] with each piece zero-padded to a multiple of 4
    bytes (Q6_K: 210 -> 212); every byte random."""
    rng = np.random.default_rng(31)
    epb, bpb = kt.BLOCK[Q[qtype]]
    for n, k in [(16, 256), (48, 1280), (160, 2304)]:
        raw = rng.integers(0, 256, size=(n, k // epb * bpb), dtype=np.uint8)
        ub = 256 // epb * bpb
        pieces = raw.reshape(n // 16, 16, k // 256, ub).transpose(0, 2, 1, 3)
        want = np.zeros(pieces.shape[:3] + ((ub + 3) // 4 * 4,), np.uint8)
        want[..., :ub] = pieces
        want = want.ravel()
        np.testing.assert_array_equal(kt.tile_layout(Q[qtype], raw, k), want, err_msg=f"{n}x{k}")


def assert_tiled_gives_row_bits(qtype: str, raw, x, what: str, launches: int | None = None) -> None:
    """kt.gemv on W moved into the tile layout equals it on the row layout bit for bit (the row layout's outputs are
    checked against numpy in the tests above), and the tiled-read counter rose: by `launches` where given, else at
    all."""
    base = kt.gemv(Q[qtype], raw, x)
    before = kt.launch_count("tiled_weights")
    got = kt.gemv(Q[qtype], raw, x, tiled=True)
    ran = kt.launch_count("tiled_weights") - before
    assert ran == launches if launches is not None else ran > 0, f"{what}: {ran} launches read the tile layout"
    assert np.isfinite(base).all()
    np.testing.assert_array_equal(got, base, err_msg=what)


@pytest.mark.parametrize("tiles", ["16", "8"])
@pytest.mark.parametrize("qtype", KQUANTS)
def test_the_tile_layout_gives_the_row_layouts_bits(qtype, tiles):
    """The decode GEMV reading W in the tile layout (the same bytes, other strides) against the row layout, bit for
    bit, in 16-row and half tiles: 1..17 units a warp (k = 1,280 / 17,408), rows off 16-byte alignment (Q6_K's 212-byte
    pieces), the 27B's n = 5,120 and 17,408 shapes, t = 1, 3, 8 (the row layout's bits are the ones checked against
    numpy above; the launch counter shows the tiled read ran). A shape without a tile layout is an error that says
    so."""
    rng = np.random.default_rng(23)
    try:
        kt.set_gemv_tiles(tiles)
        for n, k in [(48, 1280), (5120, 17408), (17408, 5120)]:
            raw = random_raw(rng, qtype, n, k)
            x = random_x(rng, 8, k)
            for t in (1, 3, 8):
                assert_tiled_gives_row_bits(qtype, raw, x[:t], f"{n}x{k} T={t}", launches=1)
    finally:
        kt.set_gemv_tiles("env")
    raw = random_raw(rng, qtype, 40, 256)
    with pytest.raises(OpenJetError, match="no tile layout for qtype .* n 40"):
        kt.gemv(Q[qtype], raw, random_x(rng, 1, 256), tiled=True)


@pytest.mark.parametrize("qtype", KQUANTS)
def test_the_producer_warp_gemv_gives_the_cp_async_bits_call_after_call(qtype):
    """The producer-warp decode GEMV (gemv_tma.cu, the default on a 9.0 GPU with a 90a build: one thread's bulk
    copies fill the consumer warps' rings, each slot handed back after a proxy fence) against the cp.async kernel on
    the same tiled W, bit for bit: its default choice and both forms, t = 1, 4, 5, 8, a shape of more tiles than the
    GPU holds blocks (562 tiles, quarters of 2 and 3 units) and the 27B's ffn_down (320 tiles of 17-unit quarters),
    five calls each at 4 and 8 rows; and each shape's 8-row output against numpy (dequantize(W) @ the fp16 pack of
    x, as check_gemv). (The integer GEMV's producer-warp form, without the fence, had a run of one slot's rows wrong
    in 22 of 30 Q6_K calls at 8 rows on an H100: a bulk copy landing under the consumer's reads.)"""
    if not kt.gemv_tma_available():
        pytest.skip("the producer-warp GEMV needs a 90a build on a 9.0 GPU")
    rng = np.random.default_rng(41)
    for n, k in [(8992, 2304), (5120, 17408)]:
        raw = random_raw(rng, qtype, n, k)
        x = random_x(rng, 8, k)
        w = dequantize(raw, Q[qtype]).astype(np.float64)
        xd = unpack_act(*pack_act_numpy(x)[::2])
        err = rel_err(kt.gemv_tma(Q[qtype], raw, x), (w @ xd.T).T, (np.abs(w) @ np.abs(xd).T).T)
        assert err < 1e-5, f"{n}x{k}: error {err:.2e} of |W| @ |x| against the fp16-x reference"
        for t in (1, 4, 5, 8):
            want = kt.gemv(Q[qtype], raw, x[:t], tiled=True)
            assert np.isfinite(want).all()
            for form in (-1, 1, 2):
                for call in range(5 if t in (4, 8) else 1):
                    np.testing.assert_array_equal(kt.gemv_tma(Q[qtype], raw, x[:t], form), want,
                                                  err_msg=f"{n}x{k} T={t} form {form} call {call}")
    with pytest.raises(OpenJetError, match="form 3"):
        kt.gemv_tma(Q[qtype], random_raw(rng, qtype, 16, 256), random_x(rng, 1, 256), 3)


@pytest.mark.parametrize("gemm", ["fast", "dense", "exact", "shared", "grouped"])
@pytest.mark.parametrize("qtype", KQUANTS)
def test_prefill_calls_read_the_tile_layout_with_the_row_layouts_bits(qtype, gemm, monkeypatch):
    """Every prefill path (OPENJET_PREFILL_GEMM: the fast GEMM's FastA loads, the dense path's dequantisation, the exact
    kernels with shared or grouped activations) reading W in the tile layout gives the row layout's outputs bit for bit
    (those are checked against numpy elsewhere), over partial token groups and blocks (t = 9, 40, 300: the dense path
    takes 256 rows and more) and rows off 16-byte alignment; the launch counter shows a tiled read ran. Q8_0 has no
    fast GEMM: "fast" and "dense" take the exact kernels for it."""
    if gemm == "dense" and not kt.dense_gemm_available():
        pytest.skip("no dense prefill GEMM in this build or on this GPU")
    monkeypatch.setenv("OPENJET_PREFILL_GEMM", gemm)
    rng = np.random.default_rng(37)
    for n, k in [(48, 1280), (1040, 2560)]:
        raw = random_raw(rng, qtype, n, k)
        x = random_x(rng, 300, k)
        for t in (9, 40, 300):
            assert_tiled_gives_row_bits(qtype, raw, x[:t], f"{gemm} {n}x{k} T={t}")


@pytest.mark.parametrize("kernel", ["shared", "grouped"])
@pytest.mark.parametrize("qtype", KQUANTS + ["F32"])
def test_prefill_rows_in_groups_of_8_equal_decode_rows(qtype, kernel, monkeypatch):
    """A prefill call of up to 128 rows gives every row the bits of a decode call holding it, partial last
    groups and row blocks included; with each prefill kernel forced (OPENJET_PREFILL_GEMM; by default the
    engine picks one per shape, so both must hold). Also checked against the emulation."""
    monkeypatch.setenv("OPENJET_PREFILL_GEMM", kernel)
    rng = np.random.default_rng(16)
    n, k = (48, 5120) if qtype == "F32" else (1040, 2560)  # 65 tiles: the group/tile split of the grid
    w = rng.standard_normal((n, k), dtype=np.float32)
    raw = w if qtype == "F32" else quantize(w, Q[qtype])
    x = random_x(rng, 128, k)
    steps = np.concatenate([kt.gemv(Q[qtype], raw, x[i:i + 8]) for i in range(0, 128, 8)])
    for t in (9, 37, 120, 128):  # F32: 120 = full groups only, in one launch
        np.testing.assert_array_equal(kt.gemv(Q[qtype], raw, x[:t]), steps[:t], err_msg=f"T={t}")
    # steps' rows 121..127 came from one 8-row call: a 3-row tail call must agree with it too
    np.testing.assert_array_equal(kt.gemv(Q[qtype], raw, x[125:128]), steps[125:128])
    if qtype != "F32":
        xh, _, xinv = pack_act_numpy(x)
        ref = (dequantize(raw, Q[qtype]).astype(np.float64) @ unpack_act(xh, xinv).T).T
        e = rel_err(steps, ref)
        report(test="gemv_prefill_rows", qtype=qtype, kernel=kernel, t=128, rel_err_vs_emulated=e)
        assert e < 1e-5


def fast_weights(qtype: str, raw: np.ndarray) -> np.ndarray:
    """The fast prefill GEMM's weights (prefill_gemm.cuh) in numpy, each rounded once from the exact value (float64
    holds it exactly): Q4_K/Q5_K w = fp16(q ds - dm), ds = fp16(d sc), dm = fp16(dmin m); Q6_K w = fp16((q - 32)
    ds), ds = fp16(d sc), sc the element's 16-element sub-block scale (ggml's layouts); Q8_0 w = fp16(q d)."""
    n = raw.shape[0]
    epb, bpb = kt.BLOCK[Q[qtype]]
    b = raw.reshape(n * (raw.shape[1] // bpb), bpb)
    f16 = lambda at: b[:, at:at + 2].copy().view(np.float16)[:, 0].astype(np.float32)  # noqa: E731
    if qtype == "Q8_0":
        q = b[:, 2:].view(np.int8).astype(np.float64)
        return (q * f16(0).astype(np.float64)[:, None]).astype(np.float16).reshape(n, -1)
    if qtype == "Q6_K":
        ql, qh, sc = b[:, :128], b[:, 128:192], b[:, 192:208].view(np.int8)
        ds = (f16(208)[:, None] * sc.astype(np.float32)).astype(np.float16).astype(np.float64)
        w = np.empty((len(b), 256))
        for half in range(2):
            for p in range(4):
                low = (ql[:, 64 * half + 32 * (p & 1):][:, :32] >> (4 * (p >> 1))) & 15
                high = (qh[:, 32 * half:32 * half + 32] >> (2 * p)) & 3
                q = (low | (high << 4)).astype(np.float64) - 32
                scale = ds[:, 8 * half + 2 * p + np.arange(32) // 16]
                w[:, 128 * half + 32 * p:128 * half + 32 * p + 32] = q * scale
        return w.astype(np.float16).reshape(n, -1)
    sc, m = _k4_scales(b[:, 4:16])
    ds = (f16(0)[:, None] * sc.astype(np.float32)).astype(np.float16).astype(np.float64)
    dm = (f16(2)[:, None] * m.astype(np.float32)).astype(np.float16).astype(np.float64)
    qs = b[:, 16:] if qtype == "Q4_K" else b[:, 48:]
    qs = qs.reshape(len(b), 4, 1, 32)
    q = np.concatenate([qs & 15, qs >> 4], axis=2).reshape(len(b), 8, 32)  # sub-block 2j + half, element l
    if qtype == "Q5_K":
        q = q | (((b[:, None, 16:48] >> np.arange(8)[None, :, None]) & 1) << 4)  # bit sb of qh[l]
    return (q.astype(np.float64) * ds[..., None] - dm[..., None]).astype(np.float16).reshape(n, -1)


@pytest.mark.parametrize("kernel", ["mma", "dense"])
@pytest.mark.parametrize("qtype", KQUANTS)
@pytest.mark.parametrize("n, k", [(1040, 2560), (201, 256), (17408, 256)])
def test_fast_prefill_gemm_matches_its_numerics(qtype, n, k, kernel, monkeypatch):
    """OPENJET_PREFILL_GEMM=fast (Q4_K/Q5_K/Q6_K/Q8_0, t > 8 rows): against its own numerics in numpy (fp16 weights as
    the kernel rounds them, the pack's fp16 activations, float64 sums), within the fp32 chain's rounding; against
    the exact weights within the fp16 rounding of the weights; and chunk sizes give the same bits (each output
    depends on its own row and token only), across its three tile shapes too (16-token tiles up to 16 rows, 64 up
    to 64 rows and where 128-token ones would not fill a wave, 128 from n = 17408 and 130 rows up on the H200).
    Partial row and token tiles; k = 256: fewer k steps than B stages; n = 201 with Q6_K: rows that start off
    4-byte alignment. kernel "dense": OPENJET_PREFILL_GEMM=dense (the weights written out as fp16, then CUTLASS's
    Hopper GEMM: dense_gemm.cuh; a 90a build with CUTLASS on sm_90), the same checks, and the mma kernel's bits
    (measured on the H200: wgmma sums the k16 products in the same chain) for calls of kt.DENSE_MIN_ROWS rows or
    more, the mma kernel below (so the 300-row call against its halves compares the two paths); n = 201 is not a
    multiple of 4, so that shape keeps the mma kernel there."""
    monkeypatch.setenv("OPENJET_PREFILL_GEMM", "fast")
    if kernel == "dense":
        if not kt.dense_gemm_available():
            pytest.skip("no dense GEMM here: it needs a 90a build with CUTLASS (scripts/fetch_cutlass.py) on sm_90")
        monkeypatch.setenv("OPENJET_PREFILL_GEMM", "dense")
    dense_before, calls = kt.launch_count("dense_gemm"), []

    def gemv(xs):
        calls.append(len(xs))
        return kt.gemv(Q[qtype], raw, xs)

    rng = np.random.default_rng(n + k)
    raw = random_raw(rng, qtype, n, k)
    x = random_x(rng, 300, k)
    xh, _, xinv = pack_act_numpy(x)
    xd = unpack_act(xh, xinv)
    w16 = fast_weights(qtype, raw).astype(np.float64)
    w = dequantize(raw, Q[qtype]).astype(np.float64)
    for t in (9, 16, 40, 130, 300):
        y = gemv(x[:t])
        assert np.isfinite(y).all()
        ref = (w16 @ xd[:t].T).T
        scale = (np.abs(w16) @ np.abs(xd[:t]).T).T
        e_own, e_exact = rel_err(y, ref, scale), rel_err(y, (w @ xd[:t].T).T, scale)
        report(test="fast_prefill_gemm", kernel=kernel, qtype=qtype, n=n, k=k, t=t, err_vs_own_numerics=e_own,
               err_vs_exact_weights=e_exact)
        assert e_own < 1e-5, f"t={t}: {e_own:.2e} of |W| @ |x| against the kernel's own numerics"
        assert e_exact < 1e-3, f"t={t}: {e_exact:.2e} of |W| @ |x| against the exact weights"
    whole = gemv(x)
    halves = np.concatenate([gemv(x[:150]), gemv(x[150:])])
    np.testing.assert_array_equal(whole, halves)
    for t in (9, 16, 17, 40):  # 16- and 64-token tiles against the 300-row call's
        np.testing.assert_array_equal(gemv(x[:t]), whole[:t], err_msg=f"t={t}")
    # the dense GEMM ran for every call of DENSE_MIN_ROWS rows or more where it takes the shape (n % 4 == 0), never
    # otherwise
    dense_calls = kt.launch_count("dense_gemm") - dense_before
    big = sum(t >= kt.DENSE_MIN_ROWS for t in calls)
    assert big and dense_calls == (big if kernel == "dense" and n % 4 == 0 else 0), (dense_calls, calls)
    if kernel == "dense":  # the mma kernel's bits (the same k16 chain), at 2-3x its speed (bench_prefill_gemm.py)
        monkeypatch.setenv("OPENJET_PREFILL_GEMM", "fast")
        np.testing.assert_array_equal(whole, kt.gemv(Q[qtype], raw, x), err_msg="against the mma kernel")


@pytest.mark.parametrize("kernel", ["mma", "dense"])
@pytest.mark.parametrize("qtype", KQUANTS)
@pytest.mark.parametrize("n, k", [(1280, 2560), (256, 256), (17408, 256)])
def test_prefill_gate_and_up_in_one_gemm_give_the_two_gemms_bits(qtype, n, k, kernel, monkeypatch):
    """A prefill's ffn_down input (launch_ffn_gate_up_pack): gate and up in one GEMM, the fast kernel with the two
    matrices' rows interleaved in 8-row groups and silu(g) u in its epilogue, or (kernel "dense") both dequantised
    into one [2n, k] fp16 matrix, rows interleaved one by one, for one CUTLASS GEMM whose epilogue writes silu(g) u
    of each column pair (dense_gemm_swiglu.cu) for the pack to read. Its pack must be the bits
    of two GEMMs and the swiglu pack (OPENJET_PREFILL_FFN_FUSED=0), at 16-, 64- and 128-token tiles and on the dense
    path from kt.DENSE_MIN_ROWS rows (the launch counters show which path ran), and match numpy's silu(G x) (U x)
    over the fast GEMM's own weights within the pack's fp16 rounding. n = 17408 (the 27B's n_ff): 128-token tiles
    from 130 rows on the H200. (n is the down projection's k, a multiple of 256, so the interleaved 2n rows fill
    whole 128-row tiles; other n are refused: test_a_pack_of_a_row_not_whole_units_is_refused.)"""
    monkeypatch.setenv("OPENJET_PREFILL_GEMM", "fast")
    if kernel == "dense":
        if not kt.dense_gemm_available():
            pytest.skip("no dense GEMM here: it needs a 90a build with CUTLASS (scripts/fetch_cutlass.py) on sm_90")
        monkeypatch.setenv("OPENJET_PREFILL_GEMM", "dense")
    rng = np.random.default_rng(n + 3 * k)
    raw_g, raw_u = random_raw(rng, qtype, n, k), random_raw(rng, qtype, n, k)
    w16g, w16u = (fast_weights(qtype, r).astype(np.float64) for r in (raw_g, raw_u))
    x = random_x(rng, 300, k)
    for t in (9, 40, 130, 300):
        fused_before, dense_before = kt.launch_count("prefill_gate_up"), kt.launch_count("dense_gemm")
        swiglu_before = kt.launch_count("dense_gemm_swiglu")
        fused = kt.prefill_gate_up(Q[qtype], raw_g, raw_u, x[:t])
        dense_fused = kt.launch_count("dense_gemm") - dense_before
        assert kt.launch_count("prefill_gate_up") == fused_before + 1, "the one-GEMM path did not run"
        monkeypatch.setenv("OPENJET_PREFILL_FFN_FUSED", "0")
        two = kt.prefill_gate_up(Q[qtype], raw_g, raw_u, x[:t])
        monkeypatch.delenv("OPENJET_PREFILL_FFN_FUSED")
        assert kt.launch_count("prefill_gate_up") == fused_before + 1, "OPENJET_PREFILL_FFN_FUSED=0 took one GEMM"
        dense_two = kt.launch_count("dense_gemm") - dense_before - dense_fused
        swiglu_epilogue = kt.launch_count("dense_gemm_swiglu") - swiglu_before
        big = kernel == "dense" and t >= kt.DENSE_MIN_ROWS
        # the dense one GEMM writes silu(g) u in its epilogue (OPENJET_PREFILL_SWIGLU unset); two are plain GEMMs
        assert (dense_fused, swiglu_epilogue, dense_two) == ((0, 1, 2) if big else (0, 0, 0)), \
            (t, dense_fused, swiglu_epilogue, dense_two)
        for name, a, b in zip(("xh", "xsum", "xinv"), fused, two):
            np.testing.assert_array_equal(a, b, err_msg=f"t={t}: {name}")
        xh, _, xinv = pack_act_numpy(x[:t])
        xd = unpack_act(xh, xinv)
        g, u = (w16g @ xd.T).T, (w16u @ xd.T).T
        with np.errstate(over="ignore"):  # e^-g = inf: silu(g) = -0
            ref = g / (1.0 + np.exp(-g)) * u
        e = rel_err(unpack_act(fused[0], fused[2]), ref)
        report(test="prefill_gate_up", kernel=kernel, qtype=qtype, n=n, k=k, t=t, rel_err_vs_numpy=e)
        assert e < 2e-3, f"t={t}: {e:.2e} against numpy's silu(G x) (U x)"


@pytest.mark.parametrize("fused", ["1", "0"])
@pytest.mark.parametrize("qtype, n, k", [("Q4_K", 17408, 512), ("Q6_K", 2304, 256)])
def test_the_prefill_swiglu_pack_gives_the_one_pass_bits_every_way(qtype, n, k, fused, monkeypatch):
    """A prefill's swiglu pack (more than 8 rows) every way OPENJET_PREFILL_SWIGLU offers, against the one-pass kernel
    that keeps a row in registers (`rows`): the default (unset: where the dense GEMM takes gate and up in one, its
    epilogue writes silu(g) u and a streaming pack reads those rows, dense_gemm_swiglu.cu; elsewhere as `split`) and
    `split` (two streaming passes, elementwise.cu: silu(g) u over the gate cells and per-2,048-column maxima, then the
    pack), with gate and up in one GEMM (fused "1") and in two (fused "0"): the same pack bits, each path's launch
    counted only where it should run (n = 17408: the 27B's rows, 8.5 blocks of 2,048 columns; 2304 a row of one and
    a part)."""
    monkeypatch.setenv("OPENJET_PREFILL_FFN_FUSED", fused)
    rng = np.random.default_rng(n + k)
    raw_g, raw_u = random_raw(rng, qtype, n, k), random_raw(rng, qtype, n, k)
    x = random_x(rng, 300, k)
    for t in (9, 300):
        packs, ran = {}, {}
        for mode in ("default", "split", "rows"):
            if mode != "default":
                monkeypatch.setenv("OPENJET_PREFILL_SWIGLU", mode)
            before = {c: kt.launch_count(c) for c in ("swiglu_split", "dense_gemm_swiglu")}
            packs[mode] = kt.prefill_gate_up(Q[qtype], raw_g, raw_u, x[:t])
            ran[mode] = tuple(kt.launch_count(c) - b for c, b in before.items())
            monkeypatch.delenv("OPENJET_PREFILL_SWIGLU", raising=False)
        # the fast kernel's one GEMM packs in its own epilogue; the dense one GEMM (from DENSE_MIN_ROWS rows) writes
        # silu(g) u in its epilogue unless asked not to; every other path reads the swiglu pack
        dense_one = fused == "1" and kt.dense_gemm_available() and t >= kt.DENSE_MIN_ROWS
        fast_fused = fused == "1" and not dense_one
        split = 0 if fast_fused else 1
        assert ran == {"default": (0, 1) if dense_one else (split, 0), "split": (split, 0), "rows": (0, 0)}, (t, ran)
        for mode in ("default", "split"):
            for name, a, b in zip(("xh", "xsum", "xinv"), packs[mode], packs["rows"]):
                np.testing.assert_array_equal(a, b, err_msg=f"t={t}, {mode}: {name}")


@pytest.mark.parametrize("qtype, n, k, exps", [("Q4_K", 17408, 512, (-14, -6)), ("Q6_K", 2304, 1024, (-6, -2)),
                                               ("Q8_0", 1024, 256, (-10, -4))])
def test_the_ffns_fp16_form_is_the_fp32_epilogues_values_under_a_bounded_scale(qtype, n, k, exps, monkeypatch):
    """launch_ffn_gate_up_pack's fp16 form (the engine's default on its kept fp16 rows: dense_gemm_swiglu.cu
    launch_dense_gemm_swiglu_half after the row scales) against the fp32 swiglu epilogue on the same rows: h, in the
    pack's element order, is fp16(v s) for every element (numpy's float16 rounding, subnormals included), s = 1 / inv
    a power of two a row; every |v| s below 2^15 (no overflow); s the scale of the bound max(||x|| G, 0.2785) ||x|| U
    in numpy (G, U: the largest row norms, which equal numpy's of the fp16 rows; a factor 2 allowed where the fp32 sums
    straddle an exponent); the path's launch counted. Where v s is a normal fp16 number, h is then the pack's value
    times a power of two, which the down GEMM's row factor 1 / s undoes exactly."""
    if not kt.dense_gemm_available():
        pytest.skip("no dense GEMM here: it needs a 90a build with CUTLASS (scripts/fetch_cutlass.py) on sm_90")
    monkeypatch.setenv("OPENJET_PREFILL_GEMM", "dense")
    monkeypatch.delenv("OPENJET_PREFILL_SWIGLU", raising=False)
    rng = np.random.default_rng(n + 5 * k)
    raw_g, raw_u = (random_raw(rng, qtype, n, k, *exps) for _ in range(2))
    t = 300
    x = random_x(rng, t, k)
    before = kt.launch_count("dense_gemm_swiglu_half")
    v, h, inv, norms = kt.prefill_gate_up_half(Q[qtype], raw_g, raw_u, x)
    assert kt.launch_count("dense_gemm_swiglu_half") == before + 1, "the fp16 form did not run"
    ref_norms = [float(np.sqrt((fast_weights(qtype, r).astype(np.float64) ** 2).sum(axis=1)).max())
                 for r in (raw_g, raw_u)]
    np.testing.assert_allclose(norms, ref_norms, rtol=1e-5)
    assert np.isfinite(v).all()
    s = 1.0 / inv.astype(np.float64)
    assert np.all(np.frexp(s)[0] == 0.5), "a row scale is not a power of two"
    scaled = np.abs(v.astype(np.float64)) * s[:, None]
    assert scaled.max() < 2.0 ** 15, scaled.max()
    xh, _, xinv = pack_act_numpy(x)
    nx = np.linalg.norm(unpack_act(xh, xinv), axis=1)
    bound = np.maximum(nx * ref_norms[0], 0.2785) * nx * ref_norms[1] * 1.0625
    s_ref = np.ldexp(1.0, 15 - np.frexp(bound)[1])
    assert np.all((s == s_ref) | (s == 2 * s_ref) | (2 * s == s_ref)), "not the bound's scale"
    want = (v * s[:, None].astype(np.float32)).astype(np.float16).view(np.uint16)
    want = want.reshape(t, n // 4, 4)[..., [0, 2, 1, 3]].reshape(t, n)  # the pack's element order (act_quad_pos)
    np.testing.assert_array_equal(h, want)
    report(test="ffn_fp16_form", qtype=qtype, n=n, k=k, same_scale=float(np.mean(s == s_ref)),
           largest_scaled=float(scaled.max()), subnormal_share=float(np.mean((scaled < 2.0 ** -14) & (scaled > 0))),
           bound_over_max=float(np.median(bound / np.abs(v.astype(np.float64)).max(axis=1))))


def test_a_pack_of_a_row_not_whole_units_is_refused():
    """A pack's sums are laid out per 256-element unit (act_pack.cuh, act_sum_pos): a row of 96 or 1,056 elements
    would write its last sums into the next row's, where two rows' blocks race (seen on the H200, 2026-12-03), so such
    a k is an error naming it; the one-GEMM gate and up refuse such an n (its output is the down projection's pack)."""
    rng = np.random.default_rng(5)
    for k in (96, 1056):
        with pytest.raises(OpenJetError, match=f"k \\({k}\\) not a multiple of 256"):
            kt.pack_act(random_x(rng, 9, k))
    raw = random_raw(rng, "Q4_K", 96, 256)
    with pytest.raises(OpenJetError, match="n = 96 is not a multiple of 256"):
        kt.prefill_gate_up(Q["Q4_K"], raw, raw, random_x(rng, 9, 256))


def test_f32_projection_matches_numpy():
    rng = np.random.default_rng(7)
    w = rng.standard_normal((48, 5120), dtype=np.float32)
    x = random_x(rng, 8, 5120)
    y = kt.gemv(Q["F32"], w, x)
    ref = (w.astype(np.float64) @ x.astype(np.float64).T).T
    e = rel_err(y, ref)
    report(test="gemv_f32", rel_err=e)
    assert e < 1e-5


@pytest.mark.parametrize("form", ["rows", "tf32x3", "tf32x3-rna"])
@pytest.mark.parametrize("n", [48, 40, 100])
def test_prefill_f32_pair_rows_do_not_depend_on_t_and_match_float64(n, form, monkeypatch):
    """A GDN layer's beta and alpha as a prefill projects them, both in one launch_gemv_pair, with each
    OPENJET_PREFILL_F32 form: rows (decode's kernels, so every row has the bits of the decode call of <= 8 rows
    holding it), tf32x3 (the default; prefill_f32.cu's GEMM, numerics of its own: the products on tensor cores in
    3xTF32, each chunk's products added in fp32, 4 k slices summed in order) and tf32x3-rna (the same, both split
    parts rounded by cvt.rna: the default before 2026-12-04). For every form a
    row's values do not depend on the call's row count or the row's place in it (the chunk sizes' invariance: T =
    300 against T = 1, 7, 37, 64, 65 and 128), each matrix lands in its own output (not swapped, every value
    written: the outputs start as NaN), and both match float64 to fp32's accuracy; n = 40 and 100 leave row tiles
    partly empty."""
    monkeypatch.setenv("OPENJET_PREFILL_F32", form)
    rng = np.random.default_rng(41)
    k = 5120
    w0, w1 = (rng.standard_normal((n, k), dtype=np.float32) for _ in range(2))
    x = random_x(rng, 300, k)
    full0, full1 = kt.gemv_f32_pair(w0, w1, x)
    for w, y, what in ((w0, full0, "beta"), (w1, full1, "alpha")):
        ref = (w.astype(np.float64) @ x.astype(np.float64).T).T
        e = rel_err(y, ref)
        report(test="prefill_f32_pair", form=form, n=n, t=300, matrix=what, rel_err=e)
        assert e < 1e-5, what
        if form == "rows":
            steps = np.concatenate([kt.gemv(Q["F32"], w, x[i:i + 8]) for i in range(0, 300, 8)])
            np.testing.assert_array_equal(y, steps, err_msg=f"{what}: decode's bits")
    for t0, t in ((0, 1), (5, 7), (100, 37), (0, 64), (200, 65), (172, 128)):
        y0, y1 = kt.gemv_f32_pair(w0, w1, x[t0:t0 + t])
        np.testing.assert_array_equal(y0, full0[t0:t0 + t], err_msg=f"beta rows {t0}..{t0 + t}")
        np.testing.assert_array_equal(y1, full1[t0:t0 + t], err_msg=f"alpha rows {t0}..{t0 + t}")


def test_prefill_f32_tf32x3_wide_and_narrow_blocks_give_the_same_bits(monkeypatch):
    """OPENJET_PREFILL_F32=tf32x3 takes 48 rows a block where the call gives every multiprocessor a block and 16 rows
    below that (or where the wide block's shared memory does not fit: tests/test_prefill_f32_blocks.py): each n8
    tile's sums are its own, so a row's values must not depend on which. A call of 8,168 rows (wide blocks on any
    sm_90 GPU of up to 510 multiprocessors) against calls of 300 rows (narrow on any of 21 or more) on slices of it,
    its last partial token tile included; and tf32x3 is the default (the variable unset)."""
    monkeypatch.setenv("OPENJET_PREFILL_F32", "tf32x3")
    rng = np.random.default_rng(45)
    n, k, t = 48, 5120, 8168
    w0, w1 = (rng.standard_normal((n, k), dtype=np.float32) for _ in range(2))
    x = rng.standard_normal((t, k), dtype=np.float32)
    big0, big1 = kt.gemv_f32_pair(w0, w1, x)
    for t0 in (0, 8000, t - 300):
        y0, y1 = kt.gemv_f32_pair(w0, w1, x[t0:t0 + 300])
        np.testing.assert_array_equal(y0, big0[t0:t0 + 300], err_msg=f"beta rows {t0}..")
        np.testing.assert_array_equal(y1, big1[t0:t0 + 300], err_msg=f"alpha rows {t0}..")
    monkeypatch.delenv("OPENJET_PREFILL_F32")
    unset0, unset1 = kt.gemv_f32_pair(w0, w1, x[:300])
    np.testing.assert_array_equal(unset0, big0[:300], err_msg="the default is not tf32x3")
    np.testing.assert_array_equal(unset1, big1[:300], err_msg="the default is not tf32x3")


def test_prefill_f32_pair_under_exact_numerics_gives_decode_bits(monkeypatch):
    """OPENJET_PREFILL_GEMM=exact: a prefill's beta and alpha keep decode's bits (gemv.cu's kernels) even where
    OPENJET_PREFILL_F32 asks for a GEMM, each row those of the decode call (<= 8 rows) holding it."""
    monkeypatch.setenv("OPENJET_PREFILL_GEMM", "exact")
    monkeypatch.setenv("OPENJET_PREFILL_F32", "tf32x3")
    rng = np.random.default_rng(43)
    n, k = 48, 5120
    w0, w1 = (rng.standard_normal((n, k), dtype=np.float32) for _ in range(2))
    x = random_x(rng, 37, k)
    y0, y1 = kt.gemv_f32_pair(w0, w1, x)
    for w, y, what in ((w0, y0, "beta"), (w1, y1, "alpha")):
        steps = np.concatenate([kt.gemv(Q["F32"], w, x[i:i + 8]) for i in range(0, 37, 8)])
        np.testing.assert_array_equal(y, steps, err_msg=what)


# ---------------------------------------------------------------------------------------------- embed


def test_embed_q4_k_rows_equal_dequantize_bitwise():
    rng = np.random.default_rng(8)
    vocab, dim = 300, 5120
    table = quantize(rng.standard_normal((vocab, dim), dtype=np.float32), Q["Q4_K"])
    ids = np.array([0, 299, 17, 17, 150], np.int32)
    out = kt.embed(Q["Q4_K"], table, dim, ids)
    np.testing.assert_array_equal(out, dequantize(table[ids], Q["Q4_K"]))


def test_embed_full_vocabulary_table_last_rows():
    rng = np.random.default_rng(9)
    vocab, dim = 248320, 5120
    table = random_raw(rng, "Q4_K", vocab, dim)
    ids = np.array([vocab - 1, 0, 123456, vocab - 2], np.int32)
    out = kt.embed(Q["Q4_K"], table, dim, ids)
    np.testing.assert_array_equal(out, dequantize(table[ids], Q["Q4_K"]))


@pytest.mark.parametrize("dim", [256, 1280, 5120, 12288])
def test_mtp_input_pack_gives_the_four_launches_bits(dim):
    """launch_mtp_input_pack (the MTP head's input in one cluster launch) against what the engine launched before it:
    the embedding (launch_embed), an RMSNorm of each half (launch_rmsnorm) and the pack of the row of 2 dim
    (launch_pack_act), bit for bit, for 1..8 rows with distinct hidden rows and an id outside the vocabulary (a row of
    zeros, as launch_embed writes). Widths from the tiny model's to past the 27B's (its 5,120: five 32-blocks a warp)."""
    from openjet_launcher.engine import probe_in_child
    if probe_in_child()["devices"][0]["sm"] < 90 or os.environ.get("OPENJET_PACK_CLUSTER", "2") != "2":
        pytest.skip("the one-launch MTP input pack runs on clusters: compute capability 9.0+, OPENJET_PACK_CLUSTER=2")
    rng = np.random.default_rng(dim)
    vocab, eps = 40, 1e-6
    table = quantize(rng.standard_normal((vocab, dim), dtype=np.float32), Q["Q4_K"])
    enorm = (1.0 + 0.1 * rng.standard_normal(dim)).astype(np.float32)
    hnorm = (1.0 + 0.1 * rng.standard_normal(dim)).astype(np.float32)
    for t in (1, 3, 8):
        ids = rng.integers(0, vocab, t).astype(np.int32)
        if t > 1:
            ids[1] = vocab + 5  # outside the vocabulary
        hs = (rng.standard_normal((t, dim)) * rng.uniform(0.1, 30.0, (t, 1))).astype(np.float32)
        emb = np.zeros((t, dim), np.float32)
        inside = (ids >= 0) & (ids < vocab)
        emb[inside] = kt.embed(Q["Q4_K"], table, dim, ids[inside])
        cat = np.concatenate([kt.rmsnorm(emb, enorm, eps), kt.rmsnorm(hs, hnorm, eps)], axis=1)
        want = kt.pack_act(cat)
        got = kt.mtp_input_pack(table, dim, ids, hs, enorm, hnorm, eps)
        for g, w, what in zip(got, want, ("xh", "xsum", "xinv")):
            np.testing.assert_array_equal(g, w, err_msg=f"{what}, dim {dim}, t {t}")


# ---------------------------------------------------------------------------------------------- errors


def test_errors_are_values_with_messages():
    rng = np.random.default_rng(10)
    raw = quantize(rng.standard_normal((4, 256), dtype=np.float32), Q["Q4_K"])
    with pytest.raises(OpenJetError, match="token rows must be 1..8192"):
        kt.gemv(Q["Q4_K"], raw, np.ones((8193, 256), np.float32))
    with pytest.raises(OpenJetError, match="outside the vocabulary"):
        kt.embed(Q["Q4_K"], raw, 256, np.array([4], np.int32))
    q8 = quantize(rng.standard_normal((4, 96), dtype=np.float32), Q["Q8_0"])
    with pytest.raises(OpenJetError, match="multiple of 256"):
        kt.gemv(Q["Q8_0"], q8, np.ones((1, 96), np.float32))
    y = kt.gemv(Q["Q4_K"], raw, np.ones((1, 256), np.float32))  # the library still works after errors
    assert np.isfinite(y).all()
