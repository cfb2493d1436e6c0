"""k-quant codecs against the independent oracle, gguf-py's `gguf.quants` (step 1 of the correctness chain).

Dequantizers must equal gguf bit for bit; Q8_0/F16/BF16 quantizers too. Our Q4_K/Q5_K/Q6_K quantizers are
not ggml's (no scale search), so they are checked by the error bounds stated in quants.py and by gguf
decoding their bytes to the same floats as we do.
"""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf import quants as oracle

from openjet_launcher.errors import ModelFileError
from openjet_launcher.model.quants import block_size, dequantize, quantize, row_bytes

DEQUANT_TYPES = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.Q3_K, T.IQ4_NL, T.IQ4_XS, T.IQ3_S]
K_TYPES = [T.Q4_K, T.Q5_K, T.Q6_K]

# Byte offsets of the fp16 scale fields in each block (ggml-common.h block structs).
FP16_FIELDS = {T.Q8_0: [0], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.Q3_K: [108],
               T.IQ4_NL: [0], T.IQ4_XS: [0], T.IQ3_S: [0]}

# Relative RMS error on Gaussian data: measured 0.0796 / 0.0392 / 0.0200 on 1M samples; ~10% margin.
GAUSSIAN_REL_RMS = {T.Q4_K: 0.088, T.Q5_K: 0.043, T.Q6_K: 0.022}


def finite_fp16(rng, n):
    """fp16 values spanning the format: zeros, subnormals, ~1e-8..1e4 log-uniform, random finite patterns."""
    kind = rng.integers(0, 4, n)
    mag = (10.0 ** rng.uniform(-8, 4, n)) * rng.choice([-1.0, 1.0], n)
    bits = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    bits = np.where((bits & 0x7C00) == 0x7C00, bits & 0x83FF, bits)  # exponent 31 (inf/NaN) -> subnormal
    sub = rng.integers(0, 1 << 10, n, dtype=np.uint16) | (rng.integers(0, 2, n, dtype=np.uint16) << 15)
    out = np.select([kind == 0, kind == 1, kind == 2], [mag.astype(np.float16).view(np.uint16), bits, sub],
                    np.zeros(n, np.uint16))
    return out.astype(np.uint16)


def random_blocks(rng, qtype, n_blocks):
    """Random bytes with every fp16 scale field finite (the oracle would give NaN for NaN/inf scales)."""
    _, bpb = GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, (n_blocks, bpb), dtype=np.uint8)
    if qtype == T.F32:
        u = b.view(np.uint32)
        u[(u & 0x7F800000) == 0x7F800000] &= 0x807FFFFF
    elif qtype in (T.F16, T.BF16):
        u = b.view(np.uint16)
        mask = 0x7C00 if qtype == T.F16 else 0x7F80
        u[(u & mask) == mask] &= ~np.uint16(mask)
    for at in FP16_FIELDS.get(qtype, []):
        b[:, at:at + 2] = finite_fp16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return b


def extreme_rows(rng):
    """(rows, 256) float32: blocks that stress the scale arithmetic."""
    base = rng.standard_normal((16, 256)).astype(np.float32)
    rows = [
        np.zeros(256), np.full(256, 3.25), np.full(256, -7.5), np.full(256, 1e4), np.full(256, -1e-8),
        base[0] * 1e4, base[1] * 1e-8, base[2] * 1e-30, -np.abs(base[3]) - 5, np.abs(base[4]) + 100,
        np.where(np.arange(256) == 17, 1e4, 0.0), np.where(np.arange(256) == 200, -1e4, 1e-6),
        base[5] * np.repeat(10.0 ** np.arange(-4, 4), 32),  # sub-block scales spanning 8 decades
        np.repeat(rng.standard_normal(16) * 1e3, 16), base[6].round(), np.linspace(-1e4, 1e4, 256),
    ]
    return np.stack(rows).astype(np.float32)


def k_bound(x, qtype):
    """Per-element |dequant(quant(x)) - x| bound stated in quants.py's docstring, from x alone."""
    xb = x.reshape(-1, 256).astype(np.float64)
    a = np.abs(xb).max(axis=1, keepdims=True)
    if qtype == T.Q6_K:
        sub = np.abs(xb.reshape(-1, 16, 16)).max(axis=2) / 63 + a / 7900
    else:
        n = 15 if qtype == T.Q4_K else 31
        xs = xb.reshape(-1, 8, 32)
        span = xs.max(axis=2) - np.minimum(xs.min(axis=2), 0)
        sub = span / (2 * n) + (a + span.max(axis=1, keepdims=True)) / (120 * n)
    sub = sub + 2.0 ** -24 + a * 2.0 ** -20
    return np.repeat(sub, 256 // sub.shape[1], axis=1).reshape(x.shape)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# ------------------------------------------------------------------------------------------- dequantize


@pytest.mark.parametrize("qtype", DEQUANT_TYPES, ids=lambda t: t.name)
def test_dequantize_equals_gguf_bit_for_bit_on_random_blocks(rng, qtype):
    epb, _ = GGML_QUANT_SIZES[qtype]
    n_blocks = 10_000 if epb > 1 else 100_000
    raw = random_blocks(rng, qtype, n_blocks).reshape(100, -1)  # 100 rows of whole blocks
    ours = dequantize(raw, qtype)
    want = oracle.dequantize(raw, qtype)
    assert ours.dtype == np.float32 and ours.shape == want.shape == (100, n_blocks // 100 * epb)
    assert np.isfinite(ours).all()
    assert np.array_equal(ours.view(np.uint32), np.ascontiguousarray(want, np.float32).view(np.uint32))


def test_dequantize_keeps_leading_axes_and_accepts_int_type(rng):
    raw = random_blocks(rng, T.Q4_K, 30).reshape(3, 5, 2 * 144)
    out = dequantize(raw, int(T.Q4_K))
    assert out.shape == (3, 5, 512)
    assert np.array_equal(out, dequantize(raw.reshape(15, 288), T.Q4_K).reshape(3, 5, 512))


@pytest.mark.parametrize("qtype", [T.Q2_K, T.IQ2_XXS, T.Q4_0, T.TQ1_0], ids=lambda t: t.name)
def test_dequantize_unsupported_type_is_a_model_file_error_naming_it(qtype):
    with pytest.raises(ModelFileError, match=qtype.name):
        dequantize(np.zeros((1, GGML_QUANT_SIZES[qtype][1]), np.uint8), qtype)


def test_dequantize_unknown_type_number_is_a_model_file_error():
    with pytest.raises(ModelFileError):
        dequantize(np.zeros((1, 34), np.uint8), 9999)


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K, T.Q6_K, T.IQ3_S, T.F16, T.F32], ids=lambda t: t.name)
def test_dequantize_partial_block_is_a_model_file_error(qtype):
    _, bpb = GGML_QUANT_SIZES[qtype]
    with pytest.raises(ModelFileError, match=qtype.name):
        dequantize(np.zeros((2, 3 * bpb + 1), np.uint8), qtype)


# --------------------------------------------------------------------------------- exact quantizers


@pytest.mark.parametrize("qtype", [T.Q8_0, T.F16, T.BF16], ids=lambda t: t.name)
def test_exact_quantizers_equal_gguf_bit_for_bit(rng, qtype):
    normal = rng.standard_normal((400, 1024)).astype(np.float32)
    heavy = np.clip(rng.standard_t(2, (64, 256)), -50, 50) * 10.0 ** rng.uniform(-8, 3, (64, 1))  # < fp16 max
    for x in (normal, heavy.astype(np.float32), extreme_rows(rng)):
        ours = quantize(x, qtype)
        want = np.ascontiguousarray(oracle.quantize(x, qtype)).view(np.uint8).reshape(ours.shape)
        assert ours.dtype == np.uint8 and ours.shape == (x.shape[0], row_bytes(x.shape[1], qtype))
        assert np.array_equal(ours, want)


def test_q8_0_rounds_ties_half_away_from_zero_like_ggml():
    # amax 127 makes d exactly 1, so k + 0.5 are exact ties: ggml's roundf sends them away from zero
    x = np.concatenate([[127.0], np.arange(-15, 16) + 0.5]).astype(np.float32)[None, :]
    q = quantize(x, T.Q8_0)[0, 2:].view(np.int8)
    assert np.array_equal(q[1:], (np.arange(-15, 16) + np.where(np.arange(-15, 16) >= 0, 1, 0)))
    assert np.array_equal(quantize(x, T.Q8_0), oracle.quantize(x, T.Q8_0))


# ------------------------------------------------------------------------------------- K quantizers


def k_test_data(rng):
    return {
        "normal": rng.standard_normal((256, 1024)).astype(np.float32),
        "uniform": rng.uniform(-3, 5, (64, 1024)).astype(np.float32),
        "student_t3": rng.standard_t(3, (64, 1024)).astype(np.float32),
        "scaled": (rng.standard_normal((64, 1024)) * 10.0 ** rng.uniform(-8, 4, (64, 1))).astype(np.float32),
        "extreme": extreme_rows(rng),
    }


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_k_quant_round_trip_stays_within_the_stated_bound(rng, qtype):
    for name, x in k_test_data(rng).items():
        q = quantize(x, qtype)
        assert q.shape == (x.shape[0], row_bytes(x.shape[1], qtype))
        y = dequantize(q, qtype)
        assert np.isfinite(y).all(), name
        err = np.abs(y.astype(np.float64) - x)
        bound = k_bound(x, qtype)
        worst = np.unravel_index(np.argmax(err - bound), x.shape)
        assert (err <= bound).all(), f"{name}: err {err[worst]:.3g} > bound {bound[worst]:.3g} at {worst}"


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_k_quant_bytes_decode_identically_in_gguf(rng, qtype):
    # gguf decoding our bytes to our floats proves they are a valid block layout, not just self-consistent
    for name, x in k_test_data(rng).items():
        q = quantize(x, qtype)
        assert np.array_equal(dequantize(q, qtype).view(np.uint32),
                              np.ascontiguousarray(oracle.dequantize(q, qtype), np.float32).view(np.uint32)), name


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_k_quant_gaussian_relative_rms_error(rng, qtype):
    x = rng.standard_normal((1024, 1024)).astype(np.float32)
    y = dequantize(quantize(x, qtype), qtype)
    rel = np.sqrt(np.mean((y - x) ** 2) / np.mean(x ** 2))
    assert rel < GAUSSIAN_REL_RMS[qtype]


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_k_quant_is_exact_on_zero_blocks_and_deterministic(rng, qtype):
    z = np.zeros((2, 512), np.float32)
    assert np.array_equal(dequantize(quantize(z, qtype), qtype), z)
    x = rng.standard_normal((8, 512)).astype(np.float32)
    assert np.array_equal(quantize(x, qtype), quantize(x.copy(), qtype))
    # chunking must not change bytes: one row at a time equals all rows at once
    assert np.array_equal(np.concatenate([quantize(r[None], qtype) for r in x]), quantize(x, qtype))


@pytest.mark.parametrize("qtype", [T.Q8_0, *K_TYPES], ids=lambda t: t.name)
def test_quantize_handles_float32_subnormal_inputs(rng, qtype):
    x = (rng.standard_normal((4, 256)) * np.array([[1e-36], [1e-39], [1e-44], [0.0]])).astype(np.float32)
    with np.errstate(over="raise", invalid="raise"):  # underflow is expected here
        y = dequantize(quantize(x, qtype), qtype)
    assert np.isfinite(y).all() and (np.abs(y - x) <= 2.0 ** -24).all()


# ----------------------------------------------------------------------------------- quantize errors


@pytest.mark.parametrize("qtype, big", [(T.Q8_0, 1e7), (T.Q4_K, 1e8), (T.Q5_K, 1e9), (T.Q6_K, 1e9),
                                        (T.F16, 1e5), (T.BF16, 3.4e38)], ids=lambda v: getattr(v, "name", ""))
def test_quantize_refuses_magnitudes_beyond_the_fp16_scale(qtype, big):
    x = np.zeros((1, 256), np.float32)
    x[0, 3] = big
    with pytest.raises(ValueError, match=qtype.name):
        quantize(x, qtype)


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.F32, T.F16, T.BF16], ids=lambda t: t.name)
def test_quantize_refuses_nan_and_infinity(qtype):
    for bad in (np.nan, np.inf, -np.inf):
        x = np.ones((1, 256), np.float32)
        x[0, 100] = bad
        with pytest.raises(ValueError, match="NaN or infinity"):
            quantize(x, qtype)


def test_quantize_rejects_a_partial_block_and_unsupported_types():
    with pytest.raises(ValueError, match="multiple of 256"):
        quantize(np.zeros((2, 300), np.float32), T.Q4_K)
    with pytest.raises(ValueError, match="IQ4_XS"):
        quantize(np.zeros((1, 256), np.float32), T.IQ4_XS)


def test_quantize_keeps_leading_axes(rng):
    x = rng.standard_normal((3, 5, 512)).astype(np.float32)
    q = quantize(x, T.Q6_K)
    assert q.shape == (3, 5, 420)
    assert np.array_equal(q.reshape(15, 420), quantize(x.reshape(15, 512), T.Q6_K))


def test_sizes_match_ggml():
    for qtype in DEQUANT_TYPES:
        epb, bpb = GGML_QUANT_SIZES[qtype]
        assert block_size(qtype) == (epb, bpb)
        assert row_bytes(5120, qtype) == 5120 // epb * bpb
