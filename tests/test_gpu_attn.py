"""Gated full-attention decode (native/src/attn_decode.cuh) and a prefill call's flash attention
(native/src/attn_prefill.cuh) against numpy, qwen38.md §3.2.

Oracles: the reference engine's ops (rms_norm, rope_tables, apply_rope: the cached k) and `attend` (float32
attention over an unrounded float32 cache), and a float64 numpy model over the very cache the kernel holds
(the cache bytes it returns, dequantised), so that the second figure measures the kernel's arithmetic alone.
Bounds: vs the float64 model of the same cache, 1e-5 relative (fp32 softmax; tensor-core products with q and
the probabilities as hi + lo fp16 pairs, fp32 accumulation); vs the float32
cache, 2e-3 (F16 cache) and 2.5e-2 (Q8_0 cache): the cache's own rounding. Row t of a T-row step must equal
row t of any other T bit for bit (T-invariance), and row 0 of the 1-row step at n_past + t when the split is
the same. OPENJET_GPU_REPORT=path appends the measured figures as JSON lines.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import pytest
from gpu_report import report

from openjet_launcher.engine import kernels_test_attn as ka
from openjet_launcher.errors import OpenJetError
from openjet_launcher.reference.attention import attend
from openjet_launcher.reference.ops import apply_rope, rms_norm, rope_tables

pytestmark = pytest.mark.gpu

HD, N_ROT, BASE, EPS = 256, 64, 1e7, 1e-6
SIZES = {"27b": (24, 4), "tiny": (4, 2)}          # (q heads, kv heads)
FMTS = ["F16", "Q8_0"]
BOUND_VS_F32_CACHE = {"F16": 2e-3, "Q8_0": 2.5e-2}
BOUND_VS_MODEL = 1e-5


# ------------------------------------------------------------------------------ numpy model of the cache


def quantize_rows(x: np.ndarray, fmt: str) -> np.ndarray:
    """float32 [..., 256] -> cache bytes [..., row_bytes] exactly as the kernel stores them."""
    x = np.ascontiguousarray(x, np.float32)
    if fmt == "F16":
        return x.astype(np.float16).view(np.uint8)
    b = x.reshape(x.shape[:-1] + (8, 32))
    d = np.abs(b).max(axis=-1, keepdims=True) / np.float32(127)           # as ggml: d = amax / 127
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = (b * inv).astype(np.float32)
    q = np.trunc(v.astype(np.float64) + np.copysign(0.5, v)).astype(np.int8)   # roundf: half away from 0
    out = np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], axis=-1)
    return out.reshape(x.shape[:-1] + (272,))


def dequantize_rows(raw: np.ndarray, fmt: str) -> np.ndarray:
    raw = np.ascontiguousarray(raw)
    if fmt == "F16":
        return raw.view(np.float16).astype(np.float64)
    b = raw.reshape(raw.shape[:-1] + (8, 34))
    d = b[..., :2].copy().view(np.float16).astype(np.float64)
    q = b[..., 2:].view(np.int8).astype(np.float64)
    return (q * d).reshape(raw.shape[:-1] + (HD,))


def attend64(q: np.ndarray, keys: np.ndarray, values: np.ndarray, n_past: int, n_head: int, n_kv: int) -> np.ndarray:
    """Causal GQA attention in float64: q [T, n_head, 256] at positions n_past.., keys/values [n_kv, L, 256]."""
    t, n_ctx, group = len(q), keys.shape[1], n_head // n_kv
    future = np.arange(n_ctx)[None, :] > (n_past + np.arange(t))[:, None]
    out = np.empty((t, n_head, HD))
    for h in range(n_head):
        s = q[:, h].astype(np.float64) @ keys[h // group].T / np.sqrt(HD)
        s[future] = -np.inf
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, h] = (p / p.sum(axis=1, keepdims=True)) @ values[h // group]
    return out.reshape(t, n_head * HD)


def sigmoid64(x):
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


def rel_err(y: np.ndarray, ref: np.ndarray) -> float:
    """Largest over rows of ||y - ref|| / ||ref||."""
    return float(max(np.linalg.norm(y[i] - ref[i]) / np.linalg.norm(ref[i]) for i in range(len(ref))))


# ------------------------------------------------------------------------------ problems


@functools.lru_cache(maxsize=4)
def prefix(fmt: str, n_kv: int, n_past: int):
    """A random cached prefix: float32 k (as after norm and RoPE: unit rms) and v, and their cache bytes."""
    rng = np.random.default_rng(1000 + n_past + 7 * n_kv)
    k = rng.standard_normal((n_kv, n_past, HD), dtype=np.float32)
    v = rng.standard_normal((n_kv, n_past, HD), dtype=np.float32)
    return k, v, quantize_rows(k, fmt), quantize_rows(v, fmt)


def step_inputs(rng, t: int, n_head: int, n_kv: int):
    qproj = (rng.standard_normal((t, n_head * 2 * HD)) * 3).astype(np.float32)
    k = (rng.standard_normal((t, n_kv * HD)) * 2).astype(np.float32)
    v = rng.standard_normal((t, n_kv * HD)).astype(np.float32)
    qn = rng.uniform(0.5, 1.5, HD).astype(np.float32)
    kn = rng.uniform(0.5, 1.5, HD).astype(np.float32)
    return qproj, k, v, qn, kn


def reference_qk(qproj, k, qn, kn, n_past: int, n_head: int, n_kv: int):
    """The reference engine's q [T, n_head, 256] and cached k [T, n_kv, 256] (RMSNorm, then partial NeoX RoPE)."""
    t = len(qproj)
    cos, sin = rope_tables(n_past + np.arange(t), N_ROT, BASE)
    q = apply_rope(rms_norm(qproj.reshape(t, n_head, 2, HD)[:, :, 0], qn, EPS), cos, sin)
    kr = apply_rope(rms_norm(k.reshape(t, n_kv, HD), kn, EPS), cos, sin)
    return q, kr


def run(fmt, n_head, n_kv, n_past, inputs):
    _, _, kc, vc = prefix(fmt, n_kv, n_past)
    qproj, k, v, qn, kn = inputs
    return ka.attn_decode(ka.KV_TYPES[fmt], qproj, k, v, qn, kn, kc, vc, n_head=n_head, n_kv=n_kv)


def assert_switch_keeps_bits(monkeypatch, name, value, fmt, n_head, n_kv, n_past, inputs, what):
    """run() with the environment variable `name` unset and set to `value`: every output bit and cache row equal."""
    monkeypatch.delenv(name, raising=False)
    plain = run(fmt, n_head, n_kv, n_past, inputs)
    monkeypatch.setenv(name, value)
    switched = run(fmt, n_head, n_kv, n_past, inputs)
    for a, b in zip(plain, switched):
        np.testing.assert_array_equal(a, b, err_msg=f"{fmt} n_past={n_past} t={len(inputs[0])} {name}={value} {what}")


# ------------------------------------------------------------------------------ tests


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("n_past", [0, 1, 100, 4096, 32768])
def test_attn_decode_matches_numpy(fmt, size, n_past):
    n_head, n_kv = SIZES[size]
    rng = np.random.default_rng(n_past * 3 + n_head)
    k_pre, v_pre, kc_pre, vc_pre = prefix(fmt, n_kv, n_past)
    for t in ([1, 2, 5, 8] if n_past <= 100 else [1, 8]):
        inputs = step_inputs(rng, t, n_head, n_kv)
        qproj, k, v, qn, kn = inputs
        o, k_out, v_out = run(fmt, n_head, n_kv, n_past, inputs)
        assert np.isfinite(o).all()
        q_ref, k_ref = reference_qk(qproj, k, qn, kn, n_past, n_head, n_kv)
        gate = sigmoid64(qproj.reshape(t, n_head, 2, HD)[:, :, 1].reshape(t, n_head * HD))

        # the cache: prefix untouched, v appended raw, k after norm + RoPE within the format's rounding
        np.testing.assert_array_equal(k_out[:, :n_past], kc_pre)
        np.testing.assert_array_equal(v_out[:, :n_past], vc_pre)
        np.testing.assert_array_equal(v_out[:, n_past:], quantize_rows(v.reshape(t, n_kv, HD).swapaxes(0, 1), fmt))
        k_new = dequantize_rows(k_out[:, n_past:], fmt)                         # [n_kv, t, 256]
        k_want = k_ref.swapaxes(0, 1).astype(np.float64)
        if fmt == "F16":
            k_dev = np.abs(k_new - k_want).max() / np.abs(k_want).max()
            np.testing.assert_allclose(k_new, k_want, rtol=2.0 ** -10, atol=1e-6)
        else:  # within one quantisation step of the block
            step = np.abs(k_want.reshape(n_kv, t, 8, 32)).max(axis=-1, keepdims=True) / 127
            k_dev = float((np.abs(k_new - k_want).reshape(n_kv, t, 8, 32) / step).max())
            assert k_dev <= 1.0 + 1e-3, f"cached k off by {k_dev:.3f} quantisation steps"

        # attention: vs float64 over the kernel's own cache, and vs float32 over an unrounded cache
        keys, values = dequantize_rows(k_out, fmt), dequantize_rows(v_out, fmt)
        ref_model = attend64(q_ref, keys, values, n_past, n_head, n_kv) * gate
        e_model = rel_err(o, ref_model)
        s = SimpleNamespace(n_head=n_head, n_head_kv=n_kv, head_dim=HD)
        keys32 = np.concatenate([k_pre, k_ref.swapaxes(0, 1)], axis=1)
        values32 = np.concatenate([v_pre, v.reshape(t, n_kv, HD).swapaxes(0, 1)], axis=1)
        ref_f32 = attend(q_ref, keys32, values32, n_past, s).astype(np.float64) * gate
        e_f32 = rel_err(o, ref_f32)
        report(test="attn_decode", fmt=fmt, size=size, n_past=n_past, t=t, rel_err_vs_model=e_model,
               rel_err_vs_f32_cache=e_f32, cached_k_dev=float(k_dev))
        assert e_model < BOUND_VS_MODEL, f"{fmt} {size} n_past={n_past} t={t}: {e_model:.2e} vs the f64 model"
        assert e_f32 < BOUND_VS_F32_CACHE[fmt], f"{fmt} {size} n_past={n_past} t={t}: {e_f32:.2e} vs f32 cache"


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("n_past", [0, 100, 4096, 32768])
def test_row_is_bit_identical_for_every_t(fmt, n_past):
    n_head, n_kv = SIZES["27b"]
    inputs = step_inputs(np.random.default_rng(77 + n_past), 8, n_head, n_kv)
    o8, k8, v8 = run(fmt, n_head, n_kv, n_past, inputs)
    for t in range(1, 8):
        o, k_out, _ = run(fmt, n_head, n_kv, n_past, tuple(x[:t] for x in inputs[:3]) + inputs[3:])
        np.testing.assert_array_equal(o, o8[:t], err_msg=f"rows of a {t}-row step differ from the 8-row step")
        np.testing.assert_array_equal(k_out, k8[:, :n_past + t])
    report(test="t_invariance", fmt=fmt, n_past=n_past, bit_identical=True)


@pytest.mark.parametrize("fmt", FMTS)
def test_a_launch_made_for_a_shorter_length_reads_the_real_one_on_the_device(fmt, monkeypatch):
    """AttnDecodeArgs::pos (an attention launch captured into a CUDA graph and replayed at a later length: engine.cu's
    graphs): a step made for the first length L of n_past's chunk size (its split, checks and grid) that reads the real
    length n_past on the device (OPENJET_TEST_ATTN_CAPTURED_AT=L) gives every output bit and appended cache row of the
    step made for n_past, though the chunk count grows between them (70: 1 -> 2 chunks of 64 keys; 4,096 on 132 SMs:
    17 -> 33 chunks of 128)."""
    n_head, n_kv = SIZES["27b"]
    inputs = step_inputs(np.random.default_rng(19), 8, n_head, n_kv)
    checked = {}
    for n_past in (70, 1100, 4096, 32768):
        ck = ka.attn_split(n_past, n_kv, 1)["chunk_keys"]
        lo, hi = 0, n_past  # the first length of that chunk size (it grows with the length)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if ka.attn_split(mid, n_kv, 1)["chunk_keys"] == ck else (mid + 1, hi)
        for t in (1, 5, 8):
            cut = tuple(x[:t] for x in inputs[:3]) + inputs[3:]
            assert_switch_keeps_bits(monkeypatch, "OPENJET_TEST_ATTN_CAPTURED_AT", str(lo), fmt, n_head, n_kv, n_past,
                                     cut, "(the replayed launch)")
        checked[n_past] = (lo, ka.attn_split(lo, n_kv, 1)["n_chunks"], ka.attn_split(n_past, n_kv, 1)["n_chunks"])
    monkeypatch.setenv("OPENJET_TEST_ATTN_CAPTURED_AT", str(checked[4096][0] - 1))  # another chunk size: refused
    with pytest.raises(OpenJetError, match="OPENJET_TEST_ATTN_CAPTURED_AT"):
        run(fmt, n_head, n_kv, 4096, tuple(x[:1] for x in inputs[:3]) + inputs[3:])
    report(test="device_length", fmt=fmt, made_for_and_chunks=checked, bit_identical=True)
    assert all(a < b for _, a, b in checked.values()), checked  # each replay ran more chunks than its launch's length


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("n_past", [100, 4096])
def test_verify_row_equals_sequential_decode(fmt, n_past):
    """Row t of an 8-row step at n_past == the 1-row step at n_past + t over the same cache (same split)."""
    n_head, n_kv = SIZES["27b"]
    qproj, k, v, qn, kn = step_inputs(np.random.default_rng(5 + n_past), 8, n_head, n_kv)
    o8, k8, v8 = run(fmt, n_head, n_kv, n_past, (qproj, k, v, qn, kn))
    for t in range(8):
        same_split = ka.attn_split(n_past, n_kv, 8)["chunk_keys"] == ka.attn_split(n_past + t, n_kv, 1)["chunk_keys"]
        o1, _, _ = ka.attn_decode(ka.KV_TYPES[fmt], qproj[t:t + 1], k[t:t + 1], v[t:t + 1], qn, kn,
                                  k8[:, :n_past + t], v8[:, :n_past + t], n_head=n_head, n_kv=n_kv)
        if same_split:
            np.testing.assert_array_equal(o1[0], o8[t])
        else:
            assert rel_err(o1, o8[t:t + 1]) < 1e-5
    report(test="verify_vs_sequential", fmt=fmt, n_past=n_past, bit_identical=True)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("limit", [100_000, 62_000])
def test_rows_split_for_small_shared_memory_keep_every_bit(fmt, limit, monkeypatch):
    """The 100 KB SMs of sm_86/89/120 cannot hold a chunk block of all 48 rows of an 8-row step (F16 cache 146
    KB, Q8_0 114 KB): the rows go to several blocks (attn_rows_per_block_max). Emulated here by a lower limit
    (OPENJET_ATTN_SMEM_LIMIT, bytes; 100,000: blocks of 16 rows F16, 32 Q8_0, as the real 101,376; 62,000: 8
    and 16): every output bit equals the one-block run (an mma's output element depends only on its own row)."""
    n_head, n_kv = SIZES["27b"]
    inputs = step_inputs(np.random.default_rng(11), 8, n_head, n_kv)
    for n_past in (100, 4096):
        for t in (1, 3, 8):
            cut = tuple(x[:t] for x in inputs[:3]) + inputs[3:]
            assert_switch_keeps_bits(monkeypatch, "OPENJET_ATTN_SMEM_LIMIT", str(limit), fmt, n_head, n_kv, n_past, cut,
                                     "(rows split over blocks)")
    report(test="rows_split", fmt=fmt, limit=limit, bit_identical=True)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("stages", ["auto", "2", "3", "4"])
def test_the_planned_tile_pipeline_keeps_every_bit(fmt, stages, monkeypatch):
    """OPENJET_ATTN_PIPE=1 (the default: attn_decode.cuh's planned form, the tiles' copies unrolled, Q8_0 rows unpadded in 16-byte
    pieces, a ring of OPENJET_ATTN_STAGES tiles) against the two-stage loop form: at contexts whose chunks hold many
    tiles (the H200's split gives 32,768 keys 512-key chunks: 16 tiles, the ring wrapping; 8,190 a last tile of 6 keys)
    and steps of 1, 5 and 8 rows (blocks of 8, 32 and 48 rows), every output bit and the appended cache rows equal,
    and the planned launches counted where the asked depth fits a block (auto and 2 always do)."""
    from openjet_launcher.engine import kernels_test as kt
    n_head, n_kv = SIZES["27b"]
    inputs = step_inputs(np.random.default_rng(13), 8, n_head, n_kv)
    ran = {}
    for n_past in (8190, 32768):
        for t in (1, 5, 8):
            cut = tuple(x[:t] for x in inputs[:3]) + inputs[3:]
            monkeypatch.setenv("OPENJET_ATTN_PIPE", "0")  # (unset: the planned form, the default)
            monkeypatch.delenv("OPENJET_ATTN_STAGES", raising=False)
            loop = run(fmt, n_head, n_kv, n_past, cut)
            monkeypatch.setenv("OPENJET_ATTN_PIPE", "1")
            monkeypatch.setenv("OPENJET_ATTN_STAGES", stages)
            before = kt.launch_count("attn_planned")
            planned = run(fmt, n_head, n_kv, n_past, cut)
            ran[(n_past, t)] = kt.launch_count("attn_planned") - before
            for a, b in zip(loop, planned):
                np.testing.assert_array_equal(a, b, err_msg=f"{fmt} n_past={n_past} t={t} stages={stages}")
    report(test="planned_tile_pipeline", fmt=fmt, stages=stages, planned_launches={str(k): v for k, v in ran.items()})
    if stages in ("auto", "2"):
        assert all(n > 0 for n in ran.values()), ran


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("n_past", [0, 100, 4096])
def test_store_kv_appends_the_rows_a_step_appends(fmt, n_past):
    """launch_attn_store_kv (the MTP head's cache fill: no q, no attention) leaves the prefix alone, appends v as
    numpy quantises it and k within the format's rounding of the reference's RMSNorm + RoPE, and byte for byte
    the rows a full attention step of the same inputs appends, also for a prefill-sized 40 rows, which the full
    step takes in 8-row steps here."""
    n_head, n_kv = SIZES["27b"]
    _, _, kc, vc = prefix(fmt, n_kv, n_past)
    rng = np.random.default_rng(5 + n_past)
    for t in (1, 5, 8, 40):
        qproj, k, v, qn, kn = step_inputs(rng, t, n_head, n_kv)
        k_store, v_store = ka.attn_store_kv(ka.KV_TYPES[fmt], k, v, kn, kc, vc, n_head=n_head, n_kv=n_kv)
        np.testing.assert_array_equal(k_store[:, :n_past], kc)
        np.testing.assert_array_equal(v_store[:, :n_past], vc)
        np.testing.assert_array_equal(v_store[:, n_past:], quantize_rows(v.reshape(t, n_kv, HD).swapaxes(0, 1), fmt))
        _, k_ref = reference_qk(qproj, k, qn, kn, n_past, n_head, n_kv)
        np.testing.assert_allclose(dequantize_rows(k_store[:, n_past:], fmt), k_ref.swapaxes(0, 1),
                                   rtol=2.0 ** -10 if fmt == "F16" else 0,
                                   atol=1e-6 if fmt == "F16" else float(np.abs(k_ref).max()) / 127 + 1e-6)
        k_step, v_step = kc, vc
        for r0 in range(0, t, 8):
            r1 = min(t, r0 + 8)
            _, k_step, v_step = ka.attn_decode(ka.KV_TYPES[fmt], qproj[r0:r1], k[r0:r1], v[r0:r1], qn, kn, k_step,
                                               v_step, n_head=n_head, n_kv=n_kv)
        np.testing.assert_array_equal(k_store, k_step, err_msg=f"{fmt} n_past={n_past} t={t}: k rows")
        np.testing.assert_array_equal(v_store, v_step, err_msg=f"{fmt} n_past={n_past} t={t}: v rows")
    report(test="store_kv", fmt=fmt, n_past=n_past, bit_identical=True)


# A prefill call's flash attention (attn_prefill.cuh): q, the values and the probabilities as single fp16 (Q8_0
# values as fp16(code * d)), so ~2^-12 relative per operand instead of decode's ~1e-6. Measured on the H200
# (f5639df): vs the model 2.1-5.0e-4, vs the float32 cache F16 2.0-5.5e-4, Q8_0 5.4e-3-1.1e-2; the bounds ~3x that
# (Q8_0: decode's, the cache's own rounding).
PREFILL_BOUND_VS_MODEL = 1.5e-3
PREFILL_BOUND_VS_F32_CACHE = {"F16": 2e-3, "Q8_0": 2.5e-2}


def prefill(fmt, n_head, n_kv, inputs, k_cache, v_cache):
    qproj, k, v, qn, kn = inputs
    return ka.attn_prefill(ka.KV_TYPES[fmt], qproj, k, v, qn, kn, k_cache, v_cache, n_head=n_head, n_kv=n_kv)


@pytest.fixture(autouse=True)
def q8_0_kernel_by_default(monkeypatch):
    """A Q8_0 cache's prefill reads fp16 rows converted once per call by default (OPENJET_ATTN_PREFILL_F16, the
    F16 kernel's tiles); these tests hold the Q8_0 kernel itself to the bounds (it runs where the rows do not fit
    the engine's scratch) unless a test asks for the rows."""
    monkeypatch.setenv("OPENJET_ATTN_PREFILL_F16", "0")


@pytest.fixture(params=["32", "64"])
def keys(request, monkeypatch):
    """The flash kernel's keys per tile (OPENJET_ATTN_PREFILL_KEYS, read at each call): each tile size is numerics
    of its own, so each must pass the bounds and keep row invariance; 64 needs the 228 KB SMs (sm_90/100)."""
    monkeypatch.setenv("OPENJET_ATTN_PREFILL_KEYS", request.param)
    return int(request.param)


def prefill_or_skip(keys, *args):
    try:
        return prefill(*args)
    except OpenJetError:
        if keys == 32:
            raise
        pytest.skip("64-key tiles need more shared memory than this device has")


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("n_past, t", [(0, 1), (0, 100), (100, 37), (4096, 300), (32768, 64)])
def test_attn_prefill_matches_numpy(fmt, size, n_past, t, keys):
    """The flash kernel against float64 attention over the cache it wrote and against float32 over an unrounded
    cache; the cache rows it appends are the ones a decode step's prep (attn_store_kv) appends, bit for bit."""
    n_head, n_kv = SIZES[size]
    rng = np.random.default_rng(7 * n_past + t + n_head)
    k_pre, v_pre, kc_pre, vc_pre = prefix(fmt, n_kv, n_past)
    inputs = step_inputs(rng, t, n_head, n_kv)
    qproj, k, v, qn, kn = inputs
    o, k_out, v_out = prefill_or_skip(keys, fmt, n_head, n_kv, inputs, kc_pre, vc_pre)
    assert np.isfinite(o).all()
    k_st, v_st = ka.attn_store_kv(ka.KV_TYPES[fmt], k, v, kn, kc_pre, vc_pre, n_head=n_head, n_kv=n_kv)
    np.testing.assert_array_equal(k_out, k_st)
    np.testing.assert_array_equal(v_out, v_st)

    q_ref, k_ref = reference_qk(qproj, k, qn, kn, n_past, n_head, n_kv)
    gate = sigmoid64(qproj.reshape(t, n_head, 2, HD)[:, :, 1].reshape(t, n_head * HD))
    ref_model = attend64(q_ref, dequantize_rows(k_out, fmt), dequantize_rows(v_out, fmt), n_past, n_head, n_kv) * gate
    e_model = rel_err(o, ref_model)
    s = SimpleNamespace(n_head=n_head, n_head_kv=n_kv, head_dim=HD)
    keys32 = np.concatenate([k_pre, k_ref.swapaxes(0, 1)], axis=1)
    values32 = np.concatenate([v_pre, v.reshape(t, n_kv, HD).swapaxes(0, 1)], axis=1)
    e_f32 = rel_err(o, attend(q_ref, keys32, values32, n_past, s).astype(np.float64) * gate)
    report(test="attn_prefill", fmt=fmt, size=size, n_past=n_past, t=t, keys=keys, rel_err_vs_model=e_model,
           rel_err_vs_f32_cache=e_f32)
    assert e_model < PREFILL_BOUND_VS_MODEL, f"{fmt} {size} n_past={n_past} t={t}: {e_model:.2e} vs the f64 model"
    assert e_f32 < PREFILL_BOUND_VS_F32_CACHE[fmt], f"{fmt} {size} n_past={n_past} t={t}: {e_f32:.2e} vs f32 cache"


@pytest.mark.parametrize("fmt", FMTS)
def test_attn_prefill_rows_keep_their_bits_in_any_split_of_calls(fmt, keys):
    """Row invariance (attn_prefill.cuh): 300 rows after 100 cached ones in one call, and in two calls cut at 37
    and at 64 (the second call's blocks then start at other rows), give every row and cache byte the same bits."""
    n_head, n_kv = SIZES["27b"]
    _, _, kc, vc = prefix(fmt, n_kv, 100)
    inputs = step_inputs(np.random.default_rng(88), 300, n_head, n_kv)
    o_all, k_all, v_all = prefill_or_skip(keys, fmt, n_head, n_kv, inputs, kc, vc)
    for cut in (37, 64):
        o1, k1, v1 = prefill(fmt, n_head, n_kv, tuple(x[:cut] for x in inputs[:3]) + inputs[3:], kc, vc)
        o2, k2, v2 = prefill(fmt, n_head, n_kv, tuple(x[cut:] for x in inputs[:3]) + inputs[3:], k1, v1)
        np.testing.assert_array_equal(np.concatenate([o1, o2]), o_all, err_msg=f"calls cut at {cut}")
        np.testing.assert_array_equal(k2, k_all)
        np.testing.assert_array_equal(v2, v_all)
    report(test="attn_prefill_row_invariance", fmt=fmt, keys=keys, bit_identical=True)


@pytest.mark.parametrize("n_past, t", [(0, 1), (0, 300), (100, 37), (4096, 200), (32768, 64)])
def test_attn_prefill_on_fp16_rows_of_a_q8_0_cache_gives_the_q8_0_kernels_bits(n_past, t, keys, monkeypatch):
    """OPENJET_ATTN_PREFILL_F16=1 (the default; attn_prefill.cu, launch_fmt): the Q8_0 cache's rows converted to
    fp16 once per call and the F16 kernel run on them at the Q8_0 kernel's tile shape: the very fp16 tiles the Q8_0
    kernel makes for itself, so every output and cache byte is the same; its launch counter shows it ran."""
    from openjet_launcher.engine import kernels_test as kt

    n_head, n_kv = SIZES["27b"]
    _, _, kc, vc = prefix("Q8_0", n_kv, n_past)
    inputs = step_inputs(np.random.default_rng(5 * n_past + t), t, n_head, n_kv)
    tiles = prefill_or_skip(keys, "Q8_0", n_head, n_kv, inputs, kc, vc)
    monkeypatch.setenv("OPENJET_ATTN_PREFILL_F16", "1")
    before = kt.launch_count("attn_prefill_f16_rows")
    rows = prefill("Q8_0", n_head, n_kv, inputs, kc, vc)
    assert kt.launch_count("attn_prefill_f16_rows") == before + 1, "the fp16-rows path did not run"
    for a, b, what in zip(tiles, rows, ("o", "k cache", "v cache")):
        np.testing.assert_array_equal(b, a, err_msg=f"n_past={n_past} t={t}: {what}")
    report(test="attn_prefill_f16_rows", n_past=n_past, t=t, keys=keys, bit_identical=True)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("n_past, t", [(100, 300), (4096, 200)])
def test_attn_prefill_block_sizes_give_the_same_bits(fmt, n_past, t, keys):
    """64- and 128-row blocks (attn_prefill.cu): a warp's 16 rows see the same tiles in the same order either way,
    so every output and cache byte is the same. 4,096 cached rows: most tiles lie wholly before the rows (the mask
    and, mostly, the rescale skipped)."""
    n_head, n_kv = SIZES["27b"]
    _, _, kc, vc = prefix(fmt, n_kv, n_past)
    qproj, k, v, qn, kn = step_inputs(np.random.default_rng(n_past + t), t, n_head, n_kv)
    out = {}
    for rows in (64, 128):
        try:
            out[rows] = ka.attn_prefill(ka.KV_TYPES[fmt], qproj, k, v, qn, kn, kc, vc, n_head=n_head, n_kv=n_kv,
                                        rows=rows)
        except OpenJetError:
            if rows == 64 and keys == 32:
                raise
            pytest.skip(f"{rows}-row blocks of {keys} keys need more shared memory than this device has")
    for a, b, what in zip(out[64], out[128], ("o", "k cache", "v cache")):
        np.testing.assert_array_equal(a, b, err_msg=f"{fmt} n_past={n_past} t={t}: {what}")
    report(test="attn_prefill_block_sizes", fmt=fmt, n_past=n_past, t=t, keys=keys, bit_identical=True)


@pytest.mark.parametrize("form", ["1", "2"])
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("n_past, t", [(0, 1), (0, 300), (100, 37), (100, 128), (1000, 300), (4096, 200)])
def test_attn_prefill_on_wgmma_gives_the_mma_kernels_bits(fmt, n_past, t, form, monkeypatch):
    """OPENJET_ATTN_PREFILL_WGMMA=1 (attn_prefill_wgmma.cu) against 0: the F16 tiles at 128 rows x 64 keys on
    Hopper's warpgroup MMA, the same k16 chains in the same order and the same per-warp softmax, so every output and
    cache byte is the mma.sync kernel's; a warpgroup's tiles wholly masked for some of its warps change nothing (t
    not a multiple of 128, cached rows before). Q8_0: its fp16 rows (OPENJET_ATTN_PREFILL_F16=1) take the F16
    kernel. Its launch counter shows it ran. form 2 (the default where it runs): the same kernel warp-specialised
    (attn_prefill_wgmma_ws.cu: a producer warpgroup, mbarrier rings); its cases include a block whose second
    warpgroup has no row (t = 300: it releases every tile unread) and a first warpgroup that skips the last tile
    (100, 128), which would hang the launch if a release were missing."""
    from openjet_launcher.engine import kernels_test as kt

    if not ka.attn_prefill_wgmma_available():
        pytest.skip("the wgmma kernel needs a 90a build on compute capability 9.0")
    monkeypatch.delenv("OPENJET_ATTN_PREFILL_KEYS", raising=False)    # the default: 64 keys with 128-row blocks
    monkeypatch.setenv("OPENJET_ATTN_PREFILL_F16", "1")
    n_head, n_kv = SIZES["27b"]
    _, _, kc, vc = prefix(fmt, n_kv, n_past)
    qproj, k, v, qn, kn = step_inputs(np.random.default_rng(3 * n_past + t), t, n_head, n_kv)
    out = {}
    for wgmma in ("0", form):
        monkeypatch.setenv("OPENJET_ATTN_PREFILL_WGMMA", wgmma)
        before = kt.launch_count("attn_prefill_wgmma")
        out[wgmma] = ka.attn_prefill(ka.KV_TYPES[fmt], qproj, k, v, qn, kn, kc, vc, n_head=n_head, n_kv=n_kv,
                                     rows=128)
        assert kt.launch_count("attn_prefill_wgmma") == before + (wgmma != "0"), f"OPENJET_ATTN_PREFILL_WGMMA={wgmma}"
    for a, b, what in zip(out["0"], out[form], ("o", "k cache", "v cache")):
        assert a.tobytes() == b.tobytes(), f"WGMMA={form} {fmt} n_past={n_past} t={t}: {what}: " + (
            f"{np.count_nonzero(a.view(np.uint8) != b.view(np.uint8))} bytes differ" if a.shape == b.shape else "")
    report(test="attn_prefill_wgmma", form=form, fmt=fmt, n_past=n_past, t=t, bit_identical=True)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("n_rot", [64, 96, 256])
def test_the_prep_a_row_a_block_keeps_every_bit(fmt, size, n_rot, monkeypatch):
    """OPENJET_ATTN_PREP_ROWS (unset or 1, the default; read at each call): a call of more than a decode step's rows
    norms, rotates and stores every head of a row in one block (attn_prep_heads_of_row: row_rms_scale's sums in its
    order, the row's RoPE angles once) instead of a block per (row, head): the flash prefill of 300 rows after 100
    cached gives every output and cache byte it gives with 0, at the 27B's rotated dims (64) and at others (96: pairs
    that cross a warp's 32 dims, 256: all), and the launch counter shows which ran. (Decode's kernels take the new
    prep for a `pairs` prefill's calls of 9-64 rows: the engine's exact-prefill tests hold those to decode's bits.)"""
    from openjet_launcher.engine import kernels_test as kt

    n_head, n_kv = SIZES[size]
    _, _, kc, vc = prefix(fmt, n_kv, 100)
    qproj, k, v, qn, kn = step_inputs(np.random.default_rng(17 + n_rot), 300, n_head, n_kv)
    out = {}
    for rows in ("0", "1"):
        monkeypatch.setenv("OPENJET_ATTN_PREP_ROWS", rows)
        before = kt.launch_count("attn_prep_rows")
        out[rows] = ka.attn_prefill(ka.KV_TYPES[fmt], qproj, k, v, qn, kn, kc, vc, n_head=n_head, n_kv=n_kv,
                                    n_rot=n_rot)
        assert kt.launch_count("attn_prep_rows") == before + (rows == "1"), f"OPENJET_ATTN_PREP_ROWS={rows}"
    for a, b, what in zip(out["0"], out["1"], ("o", "k cache", "v cache")):
        np.testing.assert_array_equal(b, a, err_msg=f"{fmt} {size} n_rot={n_rot}: {what}")
    report(test="attn_prep_rows", fmt=fmt, size=size, n_rot=n_rot, bit_identical=True)


def test_split_depends_on_context_not_t():
    for n_past in (0, 1, 100, 4096, 32768, 100000):
        splits = [ka.attn_split(n_past, 4, t) for t in range(1, 9)]
        assert len({s["chunk_keys"] for s in splits}) == 1
        assert splits[0]["sm_count"] > 0
        for t, s in enumerate(splits, 1):
            assert s["n_chunks"] * s["chunk_keys"] >= n_past + t > (s["n_chunks"] - 1) * s["chunk_keys"]
        report(test="split", n_past=n_past, **splits[0])


def test_bad_arguments_raise():
    rng = np.random.default_rng(0)
    qproj, k, v, qn, kn = step_inputs(rng, 1, 24, 4)
    empty = np.zeros((4, 0, 512), np.uint8)
    with pytest.raises(OpenJetError, match="kv_type"):
        ka.attn_decode(2, qproj, k, v, qn, kn, np.zeros((4, 0, 512), np.uint8), empty, n_head=24, n_kv=4)
    big = step_inputs(rng, 9, 24, 4)
    with pytest.raises(OpenJetError, match="t = 9"):
        ka.attn_decode(1, *big, empty, empty, n_head=24, n_kv=4)
    with pytest.raises(OpenJetError, match="multiple of n_kv"):
        ka.attn_decode(1, qproj[:, :10 * 512], k[:, :4 * HD], v[:, :4 * HD], qn, kn, empty, empty, n_head=10, n_kv=4)
    with pytest.raises(OpenJetError, match="t = 4097"):
        ka.attn_prefill(1, *step_inputs(rng, 4097, 4, 2), np.zeros((2, 0, 512), np.uint8),
                        np.zeros((2, 0, 512), np.uint8), n_head=4, n_kv=2)
