"""GGML block codecs (dequantize and quantize) in vectorised numpy.

Each format packs `elements_per_block` values into `bytes_per_block` bytes; fp16 fields (d, dmin) are
little-endian IEEE half. The layouts and formulas are ggml's (ggml-common.h, ggml-quants.c):

  F32     1 elem    4 B  x = f32
  F16     1 elem    2 B  x = f16
  BF16    1 elem    2 B  x = top half of an f32
  Q8_0   32 elem   34 B  d | q[32] int8                                   x = d*q
  Q4_K  256 elem  144 B  d | dmin | 12 B (sc,m)x8 6-bit | q 4-bit         x = d*sc[s]*q - dmin*m[s]       s = e//32
  Q5_K  256 elem  176 B  d | dmin | 12 B (sc,m)x8 | qh[32] bit 4 | q 4-bit  same, q 5-bit
  Q6_K  256 elem  210 B  ql[128] low 4 | qh[64] high 2 | sc[16] int8 | d  x = d*sc[s]*(q-32)             s = e//16
  Q3_K  256 elem  110 B  hmask[32] | q[64] 2-bit | 12 B sc x16 6-bit | d  x = d*(sc[s]-32)*(q2-4*!hbit)   s = e//16
  IQ4_NL 32 elem   18 B  d | q 4-bit                                      x = d*kvalues_iq4nl[q]
  IQ4_XS 256 elem 136 B  d | sc_h u16 | sc_l[4] | q 4-bit                 x = d*(ls[s]-32)*kvalues_iq4nl[q]  s = e//32
  IQ3_S 256 elem  110 B  d | qs[64] | qh[8] | signs[32] | sc[4] 4-bit     x = d*(1+2*sc[s])*grid[qs|qh<<8][e%4]*sign

Bit-exactness: every dequantizer performs the same float32 operations in the same order as ggml's C
reference (e.g. Q4_K: (d*sc)*q - dmin*m, no fused multiply-add), so its output equals
`gguf.quants.dequantize` bit for bit. Tests check that against gguf on random blocks.

Quantizers (F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K) are simple and deterministic, no search:
  Q8_0  as ggml: d = amax/127 -> fp16; q = round-half-away(x * (1/d)) with the f32 d (bit-equal to gguf).
  Q4_K/Q5_K  per 32-sub-block: lo = min(min(x), 0) (the format's offset -dmin*m is never positive),
        m = ceil(-lo/dmin); step = ceil((max(x) + dmin*m)/n / d) * d, n = 15 or 31; q = rint((x + dmin*m)/step).
        Rounding the sub-block scale and min *up* keeps [lo, max(x)] representable, so no code clips:
        |err| <= step/2 <= range/(2n) + (A + R)/(120 n) + 2**-24 + A*2**-20
        where range = max(x) - min(min(x), 0) of the sub-block, and A = max|x|, R = max range, both over
        the 256-element super-block (the second term is the 6-bit scale quantisation, the third fp16
        underflow of d/dmin, the last float32 rounding).
  Q6_K  per 16-sub-block: step = ceil(amax/31.5 / d) * d, q = clip(rint(x/step), -32, 31); the code
        range [-32, 31] reaches +-31.5 steps with a half-step error at most, so
        |err| <= amax/63 + A/7900 + 2**-24 + A*2**-20   (amax of the sub-block, A = max|x| of the super-block).
The fp16 super-block scales are rounded up (never down) so the 6/8-bit sub-block scales never overflow.
Inputs that are not finite, or whose fp16 scales would exceed 65504, raise ValueError (Q8_0: |x| > ~8.3e6;
Q4_K/Q5_K: a sub-block range beyond ~6.2e7/~1.3e8 or a min below ~-4.1e6; Q6_K: |x| > ~2.6e8; F16: |x| > 65504).
We refuse rather than clip, so a synthetic model never carries silently saturated weights.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

from ..errors import ModelFileError

QK_K = 256
_CHUNK_ELEMENTS = 1 << 16  # ~64K elements per step: intermediates stay in L2 (2^14..2^18 measured, 2^16 best)

# ggml-common.h kvalues_iq4nl: the 16 non-linear levels of IQ4_NL / IQ4_XS.
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)

# ggml-common.h iq3s_grid[512]: each uint32 holds four odd magnitudes 1..15, one per byte. Written here as
# four hex digits per entry, high byte first, i.e. ggml's literal with each byte's leading 0 dropped
# (0x01010103 -> "1113"); element k of an entry is byte k (little-endian), the entry's last digit first.
_IQ3S_GRID_HEX = (
    "111111131115111b111f1131113311351139113d11511153115b117711911195119b119f11b311b711d111d511f311f9"
    "11ff131113131315131913311333133b13511357135f1373137b139913d313db13f515111513151b151f15311537153d"
    "1553155b157115791595159b159f15b315b715f115f717171733173b1751175517731777177d179917b117b517df17f3"
    "17fb19111937193f1953195919751991199719b319f11b151b191b511b551b5d1b771b931b9b1b9f1bdd1bf71d1d1d33"
    "1d371d731db51df31f111f151f191f511f551f5d1f771fb11fb93111311331153119313131333137313b313f31513155"
    "31733179317d31b931bd31d331f5331133133317331d33313339335333713377339333b133b533f133fd35113535353b"
    "353f3551355935753591359735bb35d135f537133719371f373137373753375f37713779379337d537f13917391b3935"
    "3939397339773995399d39b139b93b133b313b373b533b713b753bb33d513d593d5f3d993d9d3f133f173f313f353f53"
    "3f7b3f933fd53ff1511151135117511b511f513151355139513d51535157515f5171517551935197519b51b151b551df"
    "51f151f751fb5311531553315337533f5355535b53735379539553b355135519551f555355575571557f559355b755bf"
    "55f355f957115715571b57335755575957735777579557b157dd5913591f595159575975597b599359f559fb5b195b33"
    "5b555b7f5b915bb75bf15d115d155d1f5d535dbb5dd35f1b5f335f5d5f715f975fb1711571337137713b713f71557173"
    "7177717b71957199719f71b371d771f373137317731b733973537357739173d173f573fd7511753575517575757975b1"
    "77137731773977537757775f777177937797779f77bb77f779177933793d7955797379b579d179d97b137b317b357b5b"
    "7b757b997bbd7bf77d3d7d937f137f177f517f557f7b91119119913591519159915f9175919391b191f19315931f9333"
    "933793559371937b939793b393bb951395179531953b95539577959195bf95d595f1971997339737975197559773977b"
    "991199159959997f999199f39b1b9b1f9b539bd59d379d799dd19f319f3b9f719f979fb3b115b131b139b155b191b199"
    "b19fb1b5b1ddb1f9b313b317b31bb335b353b375b3f5b511b533b557b571b57db5b7b715b71fb731b75fb799b7b3b7db"
    "b7f7b913b919b951b975b99dbb35bb5dbbb3bbb7bd95bf15bf19bf55d133d137d13bd173d177d1d1d311d351d35fd3d9"
    "d535d579d595d5bbd5d5d5f1d711d739d753d791d95bd997d9d5db11db17db79dbd1dd1bdd91df33df37f111f119f11f"
    "f151f155f17df191f1b9f1d5f315f333f359f397f39bf513f519f531f53df553f571f5b3f715f775f77bf7b7f913f91b"
    "f937f951f9b1fb55fb95fd15fd73ff11"
)
IQ3S_GRID = np.array([int(c, 16) for c in _IQ3S_GRID_HEX], np.float32).reshape(512, 4)[:, ::-1].copy()

_SHIFT_0_4 = np.array([0, 4], np.uint8)
_SHIFT_2BIT = np.array([0, 2, 4, 6], np.uint8)
_SIGN = np.array([1, -1], np.float32)


# ---------------------------------------------------------------------------------------------- helpers


def _qtype(qtype) -> T:
    try:
        return T(int(qtype))
    except (TypeError, ValueError):
        raise ModelFileError(f"unknown GGML tensor type {qtype!r}") from None


def block_size(qtype) -> tuple[int, int]:
    """(elements_per_block, bytes_per_block) of a GGML type."""
    return tuple(GGML_QUANT_SIZES[_qtype(qtype)])


def row_bytes(n_elements: int, qtype) -> int:
    """Bytes that `n_elements` values (a whole number of blocks) take in `qtype`."""
    epb, bpb = block_size(qtype)
    if n_elements % epb:
        raise ValueError(f"{_qtype(qtype).name} needs a multiple of {epb} elements, got {n_elements}")
    return n_elements // epb * bpb


def _f16(b: np.ndarray, at: int) -> np.ndarray:
    """The fp16 field at byte `at` of each block, as a float32 column (n, 1)."""
    return np.ascontiguousarray(b[:, at:at + 2]).view(np.float16).astype(np.float32)


def _nibbles(b: np.ndarray) -> np.ndarray:
    """(..., k) bytes -> (..., 2, k): low nibbles, then high nibbles."""
    return (b[..., None, :] >> _SHIFT_0_4[:, None]) & np.uint8(0x0F)


def _bits(b: np.ndarray) -> np.ndarray:
    """(..., k) bytes -> (..., k, 8): bit i of each byte at [..., i]."""
    return np.unpackbits(b[..., None], axis=-1, bitorder="little")


def _k4_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack Q4_K/Q5_K's 12 bytes into 8 six-bit scales and 8 six-bit mins (ggml get_scale_min_k4).

    bytes 0-3: sc0-3 | sc4-7 bits 4-5 in bits 6-7; bytes 4-7: m0-3 | m4-7 bits 4-5 in bits 6-7;
    bytes 8-11: sc4-7 low nibble | m4-7 low nibble << 4.
    """
    a, b, c = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([a & 63, (c & 0x0F) | ((a >> 6) << 4)], axis=1)
    m = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=1)
    return sc, m


def _pack_k4_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Inverse of _k4_scales: (n, 8) uint8 scales and mins (each < 64) -> (n, 12) bytes."""
    return np.concatenate([
        sc[:, :4] | ((sc[:, 4:] >> 4) << 6),
        m[:, :4] | ((m[:, 4:] >> 4) << 6),
        (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4),
    ], axis=1)


def _fp16_up(v: np.ndarray, what: str) -> np.ndarray:
    """Smallest fp16 >= v (v >= 0, float32), so a scale derived from it never needs a code beyond range."""
    with np.errstate(over="ignore"):  # overflow becomes inf, refused just below
        h = v.astype(np.float16)
    h = np.where(h.astype(np.float32) < v, np.nextafter(h, np.float16(np.inf)), h)
    if not np.isfinite(h).all():
        raise ValueError(f"{what}: values too large for the format's fp16 scale (max 65504)")
    return h


def _ceil_codes(need: np.ndarray, d: np.ndarray, top: int) -> np.ndarray:
    """ceil(need / d) as uint8 in [0, top]; 0 where d == 0 (then need is 0 too)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.ceil(need / d)
    c = np.where(d > 0, c, 0)
    return np.clip(c, 0, top).astype(np.uint8)


def _recip(s: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", over="ignore"):  # 1/0 is masked; 1/subnormal -> inf, handled by callers
        return np.where(s > 0, np.float32(1) / s, np.float32(0))


def _check_finite(v: np.ndarray, what: str) -> None:
    if not np.isfinite(v).all():
        raise ValueError(f"{what}: input holds NaN or infinity")


# -------------------------------------------------------------------------------------- dequantizers
# Each takes (n, bytes_per_block) uint8 and returns (n, elements_per_block) float32.


def _dq_q8_0(b):
    return b[:, 2:].view(np.int8).astype(np.float32) * _f16(b, 0)


def _dq_q4_k(b):
    n = len(b)
    sc, m = _k4_scales(b[:, 4:16])
    ds = (_f16(b, 0) * sc.astype(np.float32))[:, :, None]
    dm = (_f16(b, 2) * m.astype(np.float32))[:, :, None]
    # byte 32*j + l holds element 64*j + l (low nibble) and 64*j + 32 + l (high nibble)
    q = _nibbles(b[:, 16:].reshape(n, 4, 32)).reshape(n, 8, 32).astype(np.float32)
    return (ds * q - dm).reshape(n, QK_K)


def _dq_q5_k(b):
    n = len(b)
    sc, m = _k4_scales(b[:, 4:16])
    ds = (_f16(b, 0) * sc.astype(np.float32))[:, :, None]
    dm = (_f16(b, 2) * m.astype(np.float32))[:, :, None]
    lo = _nibbles(b[:, 48:].reshape(n, 4, 32)).reshape(n, 8, 32)
    hi = _bits(b[:, 16:48]).transpose(0, 2, 1)  # qh[l] bit s = bit 4 of element 32*s + l
    q = (lo | (hi << 4)).astype(np.float32)
    return (ds * q - dm).reshape(n, QK_K)


def _dq_q6_k(b):
    n = len(b)
    ds = (_f16(b, 208) * b[:, 192:208].view(np.int8).astype(np.float32))[:, :, None]
    # element 128*h + 32*k + l: low 4 bits in ql[64*h + 32*(k%2) + l] nibble k//2, high 2 in qh[32*h + l] >> 2k
    lo = _nibbles(b[:, :128].reshape(n, 2, 2, 32)).transpose(0, 1, 3, 2, 4).reshape(n, 2, 4, 32)
    hi = (b[:, 128:192].reshape(n, 2, 1, 32) >> _SHIFT_2BIT[:, None]) & np.uint8(3)
    q = ((lo | (hi << 4)).view(np.int8) - np.int8(32)).astype(np.float32)
    return (ds * q.reshape(n, 16, 16)).reshape(n, QK_K)


def _dq_q3_k(b):
    n = len(b)
    s = b[:, 96:108]
    # 6-bit scale i: low 4 bits in byte i%8 (low nibble for i < 8, high for i >= 8), high 2 bits in
    # byte 8 + i%4 at bit 2*(i//4)
    low = np.concatenate([s[:, :8] & 0x0F, s[:, :8] >> 4], axis=1)
    high = ((s[:, None, 8:12] >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3).reshape(n, 16)
    ds = (_f16(b, 108) * ((low | (high << 4)).view(np.int8) - np.int8(32)).astype(np.float32))[:, :, None]
    # element 128*h + 32*j + l: 2 bits at qs[32*h + l] >> 2j, high bit = hmask[l] bit (4h + j); clear bit means -4
    q2 = (b[:, 32:96].reshape(n, 2, 1, 32) >> _SHIFT_2BIT[:, None]) & np.uint8(3)
    hb = _bits(b[:, :32]).transpose(0, 2, 1).reshape(n, 2, 4, 32)
    q = (q2.view(np.int8) - ((np.uint8(1) - hb) << 2).view(np.int8)).astype(np.float32)
    return (ds * q.reshape(n, 16, 16)).reshape(n, QK_K)


def _dq_iq4_nl(b):
    n = len(b)
    q = _nibbles(b[:, 2:]).reshape(n, 32)  # element l < 16: low nibble of byte l; l >= 16: high of l-16
    return _f16(b, 0) * KVALUES_IQ4NL.astype(np.float32)[q]


def _dq_iq4_xs(b):
    n = len(b)
    sh = b[:, 2].astype(np.uint16) | (b[:, 3].astype(np.uint16) << 8)
    low = _nibbles(b[:, 4:8]).transpose(0, 2, 1).reshape(n, 8)  # sub-block s: nibble s%2 of byte s//2
    high = ((sh[:, None] >> (2 * np.arange(8, dtype=np.uint16))) & 3).astype(np.uint8)
    ls = (low | (high << 4)).view(np.int8) - np.int8(32)
    ds = (_f16(b, 0) * ls.astype(np.float32))[:, :, None]
    q = _nibbles(b[:, 8:].reshape(n, 8, 16)).reshape(n, 8, 32)
    return (ds * KVALUES_IQ4NL.astype(np.float32)[q]).reshape(n, QK_K)


def _dq_iq3_s(b):
    n = len(b)
    sc = _nibbles(b[:, 106:110]).transpose(0, 2, 1).reshape(n, 8)  # sub-block s: nibble s%2 of byte s//2
    db = _f16(b, 0) * (1 + 2 * sc).astype(np.float32)
    # group g (4 elements) of sub-block s: grid index qs[8s + g] | (bit g of qh[s]) << 8
    idx = b[:, 2:66].astype(np.uint16) | (_bits(b[:, 66:74]).reshape(n, 64).astype(np.uint16) << 8)
    v = db[:, :, None] * IQ3S_GRID[idx].reshape(n, 8, 32)
    sign = _SIGN[_bits(b[:, 74:106]).reshape(n, 8, 32)]  # element e: bit e%8 of signs[e//8] set = negative
    return (v * sign).reshape(n, QK_K)


# ---------------------------------------------------------------------------------------- quantizers
# Each takes (n, elements_per_block) float32 and returns (n, bytes_per_block) uint8.


def _q_q8_0(x):
    amax = np.abs(x).max(axis=1, keepdims=True)
    _check_finite(amax, "Q8_0")
    d = amax / np.float32(127)
    with np.errstate(over="ignore"):
        d16 = d.astype(np.float16)
    if np.isinf(d16).any():
        raise ValueError("Q8_0: |x| above ~8.3e6 overflows the fp16 block scale")
    inv = _recip(d)
    inv[np.isinf(inv)] = 0  # |x| < ~4e-37: 1/d overflows; d16 is 0 there anyway, so codes 0 decode the same
    v = x * inv  # ggml: codes use the f32 d, not the stored fp16 one
    q = np.trunc(v.astype(np.float64) + np.copysign(0.5, v))  # round half away from zero, exact in f64
    return np.concatenate([d16.view(np.uint8), q.astype(np.int8).view(np.uint8)], axis=1)


def _k_asym(x, nmax: int, name: str):
    """Shared Q4_K/Q5_K encoder: returns (d16, dmin16, sc, m, q) with q in [0, nmax], shape (n, 8, 32)."""
    n = len(x)
    xs = x.reshape(n, 8, 32)
    hi = xs.max(axis=2)
    lo = np.minimum(xs.min(axis=2), 0)  # the offset -dmin*m can only move the grid down
    _check_finite(hi - lo, name)
    off = -lo
    dmin16 = _fp16_up(off.max(axis=1, keepdims=True) / np.float32(63), name)
    dmin = dmin16.astype(np.float32)
    m = _ceil_codes(off, dmin, 63)
    big_m = dmin * m.astype(np.float32)  # the decoder's exact f32 offset
    need = (hi + big_m) / np.float32(nmax)  # step that spans [lo, hi] with codes 0..nmax
    d16 = _fp16_up(need.max(axis=1, keepdims=True) / np.float32(63), name)
    d = d16.astype(np.float32)
    sc = _ceil_codes(need, d, 63)
    step = d * sc.astype(np.float32)  # the decoder's exact f32 step
    v = (xs + big_m[:, :, None]) * _recip(step)[:, :, None]
    q = np.clip(np.rint(v, out=v), 0, nmax, out=v).astype(np.uint8)
    return d16, dmin16, sc, m, q


def _q_q4_k(x):
    n = len(x)
    d16, dmin16, sc, m, q = _k_asym(x, 15, "Q4_K")
    q = q.reshape(n, 4, 2, 32)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, 128)
    return np.concatenate([d16.view(np.uint8), dmin16.view(np.uint8), _pack_k4_scales(sc, m), qs], axis=1)


def _q_q5_k(x):
    n = len(x)
    d16, dmin16, sc, m, q = _k_asym(x, 31, "Q5_K")
    qh = np.packbits((q >> 4).transpose(0, 2, 1), axis=2, bitorder="little").reshape(n, 32)
    q = (q & 0x0F).reshape(n, 4, 2, 32)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, 128)
    return np.concatenate([d16.view(np.uint8), dmin16.view(np.uint8), _pack_k4_scales(sc, m), qh, qs], axis=1)


def _q_q6_k(x):
    n = len(x)
    xs = x.reshape(n, 16, 16)
    amax = np.abs(xs).max(axis=2)
    _check_finite(amax, "Q6_K")
    need = amax / np.float32(31.5)  # codes reach -32 and +31: +-31.5 steps round with <= half a step
    d16 = _fp16_up(need.max(axis=1, keepdims=True) / np.float32(127), "Q6_K")
    d = d16.astype(np.float32)
    sc = _ceil_codes(need, d, 127)
    v = xs * _recip(d * sc.astype(np.float32))[:, :, None]
    q = (np.clip(np.rint(v, out=v), -32, 31, out=v) + 32).astype(np.uint8).reshape(n, 2, 4, 32)
    ql = (q[:, :, 0:2] & 0x0F) | ((q[:, :, 2:4] & 0x0F) << 4)  # ql[64h + 32k' + l]: k' low, k'+2 high
    qh = ((q >> 4) << _SHIFT_2BIT[:, None]).sum(axis=2, dtype=np.uint8)  # qh[32h + l] bits 2k
    return np.concatenate([ql.reshape(n, 128), qh.reshape(n, 64), sc, d16.view(np.uint8)], axis=1)


# ------------------------------------------------------------------------------------------ dispatch

_DEQUANT = {
    T.Q8_0: _dq_q8_0, T.Q4_K: _dq_q4_k, T.Q5_K: _dq_q5_k, T.Q6_K: _dq_q6_k,
    T.Q3_K: _dq_q3_k, T.IQ4_NL: _dq_iq4_nl, T.IQ4_XS: _dq_iq4_xs, T.IQ3_S: _dq_iq3_s,
}
_QUANT = {T.Q8_0: _q_q8_0, T.Q4_K: _q_q4_k, T.Q5_K: _q_q5_k, T.Q6_K: _q_q6_k}


def dequantize(raw: np.ndarray, qtype) -> np.ndarray:
    """Decode GGML bytes to float32. The last axis of `raw` holds whole blocks and becomes the element
    axis (same convention as gguf.quants.dequantize); leading axes are kept."""
    t = _qtype(qtype)
    raw = np.ascontiguousarray(raw)
    if raw.dtype != np.uint8:
        raw = raw.view(np.uint8)
    if t not in _DEQUANT and t not in (T.F32, T.F16, T.BF16):
        raise ModelFileError(f"tensor type {t.name} is not supported (supported: F32, F16, BF16, "
                             + ", ".join(k.name for k in _DEQUANT) + ")")
    epb, bpb = block_size(t)
    if raw.ndim == 0 or raw.shape[-1] % bpb:
        raise ModelFileError(f"{t.name} data of {raw.shape[-1] if raw.ndim else 0} bytes per row is not "
                             f"a whole number of {bpb}-byte blocks")
    shape = raw.shape[:-1] + (raw.shape[-1] // bpb * epb,)
    if t == T.F32:
        return raw.view(np.float32).reshape(shape)
    if t == T.F16:
        return raw.view(np.float16).astype(np.float32).reshape(shape)
    if t == T.BF16:
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    blocks = raw.reshape(-1, bpb)
    out = np.empty((len(blocks), epb), np.float32)
    step = max(1, _CHUNK_ELEMENTS // epb)
    fn = _DEQUANT[t]
    with np.errstate(invalid="ignore"):  # a NaN/inf scale in the file decodes to NaN, as in ggml: not our warning
        for i in range(0, len(blocks), step):
            out[i:i + step] = fn(blocks[i:i + step])
    return out.reshape(shape)


def quantize(x: np.ndarray, qtype) -> np.ndarray:
    """Encode float32 values as GGML bytes: output shape x.shape[:-1] + (row_bytes(x.shape[-1]),), uint8.
    Supports F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K; raises ValueError for other types, a last axis that is
    not a whole number of blocks, non-finite input, or magnitudes beyond the format's fp16 range."""
    t = _qtype(qtype)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if t not in _QUANT and t not in (T.F32, T.F16, T.BF16):
        raise ValueError(f"quantizing to {t.name} is not supported (supported: F32, F16, BF16, "
                         + ", ".join(k.name for k in _QUANT) + ")")
    if x.ndim == 0:
        raise ValueError("quantize needs at least one axis")
    epb, bpb = block_size(t)
    shape = x.shape[:-1] + (row_bytes(x.shape[-1], t),)
    if t == T.F32:
        _check_finite(x, "F32")
        return x.view(np.uint8).reshape(shape).copy()
    if t == T.F16:
        _check_finite(x, "F16")
        with np.errstate(over="ignore"):  # overflow becomes inf, refused just below
            h = x.astype(np.float16)
        if np.isinf(h).any():
            raise ValueError("F16: |x| above 65504 overflows float16")
        return h.view(np.uint8).reshape(shape)
    if t == T.BF16:
        _check_finite(x, "BF16")
        u = x.view(np.uint32)
        h = ((u + (np.uint32(0x7FFF) + ((u >> 16) & 1))) >> 16).astype(np.uint16)  # round to nearest even
        if ((h & 0x7FFF) == 0x7F80).any():
            raise ValueError("BF16: |x| rounds beyond the largest bfloat16")
        return h.view(np.uint8).reshape(shape)
    rows = x.reshape(-1, epb)
    out = np.empty((len(rows), bpb), np.uint8)
    step = max(1, _CHUNK_ELEMENTS // epb)
    fn = _QUANT[t]
    for i in range(0, len(rows), step):
        out[i:i + step] = fn(rows[i:i + step])
    return out.reshape(shape)
