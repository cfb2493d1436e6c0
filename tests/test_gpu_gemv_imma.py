"""The integer-tensor-core decode GEMV (native/src/gemv_imma.cuh, an experiment for issue 6) against numpy.

Oracle: the activations quantised as the kernel's pack does (per token row and 256-block: s = 32639 / max|x| in
fp32, x_int = rint(x s); a few lines of numpy, bit-equal by IEEE fp32) and `dequantize` (bit-equal to gguf) for the
weights; then W @ (x_int / s) in float64. Inside a super-block the kernel's sums are exact integers, so the only
rounding left is its fp32 combination per super-block (~1e-7 relative). Against the unquantised x the difference is
the activations' 15-bit rounding. Row t of a T-row call must equal a 1-row call bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_report import report
from test_gpu_gemv import pack_act_numpy, unpack_act

from openjet_launcher.engine import kernels_test as kt
from openjet_launcher.errors import OpenJetError
from openjet_launcher.model.quants import dequantize, quantize

pytestmark = pytest.mark.gpu

Q = kt.QTYPES
TYPES = ["Q4_K", "Q5_K", "Q6_K"]
SHAPES = [(1, 256), (7, 768), (33, 1280), (130, 2304), (5120, 17408), (10240, 5120)]


def quantise_x_numpy(x: np.ndarray) -> np.ndarray:
    """x as the integer GEMV sees it (float64): x_int * inv per 256-block, as gemv_imma.cu's pack computes them."""
    t, k = x.shape
    xb = x.reshape(t, k // 256, 256).astype(np.float32)
    amax = np.abs(xb).max(axis=2, keepdims=True)
    with np.errstate(divide="ignore"):
        s = np.where(amax > 0, np.float32(32639) / amax, np.float32(0)).astype(np.float32)
    xi = np.clip(np.rint(xb * s), -32639, 32639)
    inv = np.where(amax > 0, amax / np.float32(32639), np.float32(0)).astype(np.float32)
    return (xi.astype(np.float64) * inv.astype(np.float64)).reshape(t, k)


def random_x(rng, t: int, k: int) -> np.ndarray:
    x = rng.standard_normal((t, k), dtype=np.float32)
    x *= np.float32(2.0) ** rng.integers(-3, 4, size=(t, k // 32, 1)).repeat(32, axis=2).reshape(t, k)
    return x


def rel(y, ref, scale):
    return float(max(np.linalg.norm(y[i] - ref[i]) / np.linalg.norm(scale[i]) for i in range(len(ref))))


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("qtype", TYPES)
def test_integer_gemv_matches_its_numerics(qtype, n, k):
    rng = np.random.default_rng(n + k)
    raw = quantize(rng.standard_normal((n, k), dtype=np.float32), Q[qtype])
    w = dequantize(raw, Q[qtype]).astype(np.float64)
    for t in (1, 3, 8):
        x = random_x(rng, t, k)
        y = kt.gemv_imma(Q[qtype], raw, x)
        assert np.isfinite(y).all()
        xq = quantise_x_numpy(x)
        ref_q, ref_x = (w @ xq.T).T, (w @ x.astype(np.float64).T).T
        c_q = rel(y, ref_q, (np.abs(w) @ np.abs(xq).T).T)
        c_x = rel(y, ref_x, (np.abs(w) @ np.abs(x.astype(np.float64)).T).T)
        fp16 = kt.gemv(Q[qtype], raw, x)  # the fp16 GEMV's distance from the unquantised x, for comparison
        c_16 = rel(fp16, ref_x, (np.abs(w) @ np.abs(x.astype(np.float64)).T).T)
        report(test="gemv_imma", qtype=qtype, n=n, k=k, t=t, err_vs_emulated=c_q, err_vs_unquantised_x=c_x,
               fp16_gemv_err_vs_unquantised_x=c_16)
        assert c_q < 2e-6, f"{qtype} {n}x{k} t={t}: {c_q:.2e} of |W| @ |x| against the integer numerics"
        assert c_x < 1e-4, f"{qtype} {n}x{k} t={t}: {c_x:.2e} of |W| @ |x| against the unquantised x"


@pytest.mark.parametrize("qtype", TYPES)
def test_integer_gemv_rows_do_not_depend_on_t_or_stages(qtype):
    """Row t of a T-row call equals the 1-row call bit for bit for T = 1..8, whatever the cp.async depth and grid."""
    rng = np.random.default_rng(3)
    n, k = 9001, 2048  # more 16-row tiles than an H200 holds blocks (528), the last one partial
    raw = quantize(rng.standard_normal((n, k), dtype=np.float32), Q[qtype])
    x = random_x(rng, 8, k)
    singles = np.concatenate([kt.gemv_imma(Q[qtype], raw, x[i:i + 1]) for i in range(8)])
    for t in range(1, 9):
        np.testing.assert_array_equal(kt.gemv_imma(Q[qtype], raw, x[:t]), singles[:t], err_msg=f"T={t}")
    for stages in (2, 3, 6):
        np.testing.assert_array_equal(kt.gemv_imma(Q[qtype], raw, x, stages), singles, err_msg=f"stages {stages}")
    for t in (1, 5, 8):  # a grid of the blocks the GPU holds, each streaming several tiles
        np.testing.assert_array_equal(kt.gemv_imma(Q[qtype], raw, x[:t], 3, persistent=True), singles[:t])


@pytest.mark.parametrize("qtype", TYPES)
def test_integer_gemv_reads_the_tile_layout_with_the_row_layouts_bits(qtype):
    """W in the tile layout (weight_layout.cuh: a 16-row group's pieces of a unit contiguous; Q6_K's at 212 bytes)
    gives the row layout's bits, at T = 1, 4, 8, one block per tile and a persistent grid; and a matrix with no
    tile layout (n % 16 != 0) is refused, not read wrong."""
    rng = np.random.default_rng(5)
    n, k = 8992, 2048  # 562 tiles: more than an H200 holds blocks (528)
    raw = quantize(rng.standard_normal((n, k), dtype=np.float32), Q[qtype])
    x = random_x(rng, 8, k)
    for t in (1, 4, 8):
        rows = kt.gemv_imma(Q[qtype], raw, x[:t])
        np.testing.assert_array_equal(kt.gemv_imma(Q[qtype], raw, x[:t], tiled=True), rows, err_msg=f"T={t}")
        np.testing.assert_array_equal(kt.gemv_imma(Q[qtype], raw, x[:t], 3, persistent=True, tiled=True), rows,
                                      err_msg=f"T={t}, persistent")
    odd = quantize(rng.standard_normal((40, k), dtype=np.float32), Q[qtype])
    with pytest.raises(OpenJetError, match="no tile layout for qtype .* n 40"):
        kt.gemv_imma(Q[qtype], odd, x[:1], tiled=True)


@pytest.mark.parametrize("qtype", TYPES)
def test_the_producer_warp_form_gives_the_integer_gemvs_bits(qtype):
    """The integer GEMV on the producer-warp GEMV's shape (launch_gemv_tma_imma: one thread's bulk copies feed the
    consumer warps' rings, a grid of the blocks the GPU holds) gives the cp.async form's bits at every T, over more
    tiles than the GPU holds blocks, call after call; it reads the tile layout only, and says so for the row layout.
    (Before the consumers fenced their reads of a ring slot ahead of handing it back, 22 of 30 Q6_K calls at T=8 on
    an H100 had a run of one slot's rows wrong: the next bulk copy into the slot landed under the reads. Repeated
    calls at 4 and 8 rows make that visible: 10 calls miss a fault of that rate with odds ~1e-6.)"""
    if not kt.gemv_tma_available():
        pytest.skip("the producer-warp GEMV needs a 90a build on a 9.0 GPU")
    rng = np.random.default_rng(7)
    n, k = 8992, 2304  # 562 tiles; 9 units a row: quarters of 2 and 3 units
    raw = quantize(rng.standard_normal((n, k), dtype=np.float32), Q[qtype])
    x = random_x(rng, 8, k)
    for t in (1, 2, 4, 5, 8):
        want = kt.gemv_imma(Q[qtype], raw, x[:t], tiled=True)
        for call in range(10 if t in (4, 8) else 1):
            np.testing.assert_array_equal(kt.gemv_imma(Q[qtype], raw, x[:t], persistent=2, tiled=True), want,
                                          err_msg=f"T={t}, call {call}")
    with pytest.raises(OpenJetError, match="reads the tile layout"):
        kt.gemv_imma(Q[qtype], raw, x[:1], persistent=2)


@pytest.mark.parametrize("qtype", TYPES)
def test_the_engines_integer_gemv_reads_the_fp16_pack(qtype):
    """OPENJET_GEMV_INT's path (launch_gemv with the integer pack's scratch: gemv.cu launch_imma, which the test API
    requires to have run): x packed as the fp16 GEMV's pack (act_pack.cuh), the integer pack made from its fp16
    values h, the engine's grid. Against numpy's emulation of both roundings (the pack's
    fp16, then the integer blocks of h, times the row's 1/s); a row of an 8-row call equals its 1-row call bit for
    bit; the tile layout gives the row layout's bits."""
    rng = np.random.default_rng(6)
    for n, k in ((130, 2304), (5120, 17408)):
        raw = quantize(rng.standard_normal((n, k), dtype=np.float32), Q[qtype])
        w = dequantize(raw, Q[qtype]).astype(np.float64)
        x = random_x(rng, 8, k)
        xh, _, xinv = pack_act_numpy(x)
        h = unpack_act(xh, np.ones_like(xinv)).astype(np.float32)  # the pack's fp16 values, exact
        xq = quantise_x_numpy(h) * xinv.astype(np.float64)[:, None]
        y = kt.gemv_imma_from_pack(Q[qtype], raw, x)
        err = rel(y, (w @ xq.T).T, (np.abs(w) @ np.abs(xq).T).T)
        report(test="gemv_imma_from_pack", qtype=qtype, n=n, k=k, err_vs_emulated=err)
        assert err < 2e-6, f"{qtype} {n}x{k}: {err:.2e} of |W| @ |x| against the emulated roundings"
        singles = np.concatenate([kt.gemv_imma_from_pack(Q[qtype], raw, x[i:i + 1]) for i in range(8)])
        np.testing.assert_array_equal(y, singles)
        if n % 16 == 0:
            np.testing.assert_array_equal(kt.gemv_imma_from_pack(Q[qtype], raw, x, tiled=True), y)


def test_integer_gemv_extreme_activations():
    """Zeros, a single huge outlier per block and tiny values: no overflow, zeros stay zeros."""
    rng = np.random.default_rng(4)
    n, k = 64, 2048
    raw = quantize(rng.standard_normal((n, k), dtype=np.float32), Q["Q4_K"])
    w = dequantize(raw, Q["Q4_K"]).astype(np.float64)
    x = np.zeros((3, k), np.float32)
    x[1] = 1e-30 * rng.standard_normal(k)
    x[2] = rng.standard_normal(k)
    x[2, ::256] = 3e4
    y = kt.gemv_imma(Q["Q4_K"], raw, x)
    assert (y[0] == 0).all()
    xq = quantise_x_numpy(x)
    ref = (w @ xq.T).T
    assert rel(y[1:], ref[1:], (np.abs(w) @ np.abs(xq).T).T[1:]) < 2e-6
