"""Random k-quant codes for synthetic models: ``synth --codes random``.

A speed benchmark needs weights with the real layout and sane scales, not weights that came from
quantising floats: random code bits stream through the kernels at the same speed. This module writes
every Q4_K / Q5_K / Q6_K / Q8_0 block directly from random bits (1.1 GB per CPU-second against 30 MB
for quantising ``init_rows``' floats, measured on one core of a dev machine; the writes into the
file's pages then set the pace), with the scale fields of each tensor chosen so that its dequantised
weights have mean 0 and the standard deviation ``init_rows`` draws them with (gain / sqrt(fan_in),
``synth._GAIN`` per role; 1 for ``token_embd``), so activations stay finite through all 64 layers as
with the quantised init.

Per tensor the block header is a constant; the codes are random bits from the same per-chunk seed as
``init_rows`` (``default_rng([tensor seed, row0])``), so a file is the same for any worker count.

  Q4_K  d = dmin, every sub-block sc = S (even, <= 8), m = 7.5 S:   w = d S (q - 7.5),  q uniform 0..15
  Q5_K  d = dmin, sc = S (even, <= 4), m = 15.5 S:                   w = d S (q - 15.5), q uniform 0..31
  Q6_K  sub-block scales +S, -S, +S, ... (int8, S <= 127):           w = +-d S (q - 32),  q uniform 0..63
        (q - 32 has mean -0.5; the alternating sign cancels it within each block)
  Q8_0  codes uniform over -127..127 with -128 read as 0 (mean 0):   w = d q
All products are exact in float32 (fp16 d times a small integer), so the mean is exactly 0 over a
uniform code distribution. S and d are picked per tensor to get the target std closest after the fp16
rounding of d: the largest S whose d is a normal fp16 within 2**-10 of the target (real files use
much of the scale range), else the closest.

Tensors of other types, and roles whose init is not a zero-mean normal (norms, conv, ssm_a, dt: F32 in
the unsloth recipe anyway), are written as in the default mode, byte for byte.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter

from . import quants
from .inventory import TensorSpec
from .shape import ModelShape
from .synth import _GAIN, TensorPlan, _chunks, _encode_chunk, finish_part, new_part, start_gguf
from .vocab import VocabAssets

# Roles whose init_rows is not N(0, std^2): they keep the quantised init in every mode.
_NOT_NORMAL = frozenset({"norm", "ssm_norm", "ssm_conv1d", "ssm_a", "ssm_dt"})

# Per type: the sub-block scale values allowed and E[(code - offset)^2] of a uniformly random code,
# so that a weight's std is d * S * sqrt(that).
_CODE_VAR = {
    Q.Q4_K: (16 * 16 - 1) / 12,                      # q - 7.5, q in 0..15
    Q.Q5_K: (32 * 32 - 1) / 12,                      # q - 15.5, q in 0..31
    Q.Q6_K: (64 * 64 - 1) / 12 + 0.25,               # q - 32 in -32..31: variance + mean^2
    Q.Q8_0: 2 * (127 * 128 * 255 / 6) / 256,         # -127..127 and 0 twice (-128 -> 0)
}
_SCALES = {
    Q.Q4_K: np.arange(2, 9, 2),                      # m = 7.5 S <= 63
    Q.Q5_K: np.arange(2, 5, 2),                      # m = 15.5 S <= 63
    Q.Q6_K: np.arange(1, 128),                       # int8 scale
    Q.Q8_0: np.array([1]),                           # no sub-block scale
}
RANDOM_TYPES = frozenset(_CODE_VAR)


def init_std(spec: TensorSpec) -> float | None:
    """The std of ``synth.init_rows``' normal draw for this tensor, or None where its init is not N(0, s^2)."""
    if spec.role in _NOT_NORMAL:
        return None
    if spec.role == "token_embd":
        return 1.0
    return _GAIN.get(spec.role, 1.0) / math.sqrt(spec.ne[0])


def pick_scales(qtype: Q, std: float) -> tuple[np.float16, int]:
    """(fp16 d, sub-block scale S) whose dequantised random codes have std closest to ``std``."""
    s = _SCALES[qtype]
    unit = math.sqrt(_CODE_VAR[qtype])
    with np.errstate(over="ignore", under="ignore"):
        d = (std / (s * unit)).astype(np.float16)
    got = d.astype(np.float64) * s * unit
    ok = np.isfinite(got) & (got > 0)
    if not ok.any():
        raise ValueError(f"{qtype.name}: std {std!r} is outside what an fp16 scale can give")
    err = np.where(ok, np.abs(got - std) / std, np.inf)
    close = np.flatnonzero((err <= 2.0 ** -10) & (d >= np.float16(2.0 ** -14)))  # normal fp16 d: <= 2**-11
    i = int(close[-1]) if len(close) else int(np.argmin(err))  # the largest S that keeps d normal
    return d[i], int(s[i])


def block_header(qtype: Q, d: np.float16, s: int) -> np.ndarray:
    """The constant non-code bytes of every block (Q6_K: its 18 trailing bytes), uint8."""
    d16 = np.array([d], np.float16).view(np.uint8)
    if qtype in (Q.Q4_K, Q.Q5_K):
        m = s * 15 // 2 if qtype == Q.Q4_K else s * 31 // 2
        sc = np.full((1, 8), s, np.uint8)
        return np.concatenate([d16, d16, quants._pack_k4_scales(sc, np.full((1, 8), m, np.uint8))[0]])
    if qtype == Q.Q6_K:
        sc = np.array([s, -s] * 8, np.int8).view(np.uint8)
        return np.concatenate([sc, d16])
    if qtype == Q.Q8_0:
        return d16
    raise ValueError(f"no random codes for {qtype.name}")


def random_blocks(qtype: Q, n_blocks: int, d: np.float16, s: int, rng: np.random.Generator) -> np.ndarray:
    """``n_blocks`` blocks of random codes with the header of (d, s): uint8 (n_blocks, bytes_per_block)."""
    _, bpb = quants.block_size(qtype)
    head = block_header(qtype, d, s)
    n_code = bpb - len(head)
    codes = rng.bit_generator.random_raw(n_blocks * n_code // 8).view(np.uint8).reshape(n_blocks, n_code)
    out = np.empty((n_blocks, bpb), np.uint8)
    if qtype == Q.Q6_K:                               # ql | qh | scales | d
        out[:, :n_code] = codes
        out[:, n_code:] = head
    else:                                             # d | (dmin | scales) | (qh |) qs
        out[:, :len(head)] = head
        out[:, len(head):] = codes
    if qtype == Q.Q8_0:
        q = out[:, 2:]
        q[q == 0x80] = 0                              # int8 -128 -> 0: codes symmetric about 0
    return out


def encode_chunk(args: tuple[TensorSpec, Q, int, int, int]) -> np.ndarray:
    """``synth._encode_chunk`` with random codes: same arguments, same output shape, same seed."""
    spec, qtype, seed, row0, n_rows = args
    std = init_std(spec) if qtype in RANDOM_TYPES else None
    if std is None:
        return _encode_chunk(args)
    d, s = pick_scales(qtype, std)
    epb, _ = quants.block_size(qtype)
    rng = np.random.default_rng([seed, row0])
    blocks = random_blocks(qtype, n_rows * spec.ne[0] // epb, d, s, rng)
    return blocks.reshape(n_rows, quants.row_bytes(spec.ne[0], qtype))


def _write_chunk(args: tuple[str, int, tuple[TensorSpec, Q, int, int, int]]) -> int:
    """Encode one chunk and write it at its offset in the (pre-sized) file; returns its bytes."""
    path, offset, chunk = args
    data = encode_chunk(chunk)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data.data)
    return data.nbytes


def write_random(path: str | os.PathLike[str], shape: ModelShape, vocab: VocabAssets, plans: list[TensorPlan],
                 name: str, pool: Executor | None = None, progress: Callable[[int], None] | None = None,
                 replace: bool = True) -> None:
    """``synth.write_gguf`` for random codes, with the tensor data written by the workers.

    Generating random codes is so cheap (~1 GB per CPU-second) that shipping every chunk back to one process
    to concatenate and write would be the bottleneck; instead the header goes first, the file is sized,
    and each chunk is written at its offset by the process that made it (GGUF: data from the header's
    end padded to the alignment, each tensor padded to it; padding is zeros, as ``write_gguf``
    writes it). The result is byte for byte what ``write_gguf`` writes with ``encode_chunk``'s bytes.
    Written to a new part file and renamed when complete (synth.new_part, synth.finish_part).
    """
    path = Path(path)
    part = new_part(path)
    w = start_gguf(part, shape, vocab, [(p.spec, p.qtype) for p in plans], name)
    try:
        align = w.data_alignment
        w.close()
        at = GGUFWriter.ggml_pad(part.stat().st_size, align)
        tasks = []
        for p in plans:
            row_bytes = quants.row_bytes(p.spec.ne[0], p.qtype)
            tasks += [(str(part), at + c[3] * row_bytes, c) for c in _chunks(p)]
            at += GGUFWriter.ggml_pad(p.n_bytes, align)
        os.truncate(part, at)
        for n in pool.map(_write_chunk, tasks) if pool else map(_write_chunk, tasks):
            if progress:
                progress(n)
        finish_part(part, path, replace)
    except BaseException:
        w.close()
        part.unlink(missing_ok=True)
        raise
