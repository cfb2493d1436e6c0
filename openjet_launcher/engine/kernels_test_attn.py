"""ctypes binding of the gated attention decode's test-only C API (native/include/openjet_test_attn.h), for
tests/test_gpu_attn.py; ``python -m openjet_launcher.engine.kernels_test_attn`` prints the benchmark.

Caches are uint8 [n_kv, rows, row_bytes] as the kernel stores them: F16 (kv type 1) 256 halves per row, Q8_0
(kv type 8) 8 ggml blocks {fp16 d, int8 q[32]} per row. Head dim 256, t = 1..8 query rows (a prefill call's
flash attention, attn_prefill: 1..4096).
"""

from __future__ import annotations

import ctypes

import numpy as np

from .kernels_test import _F, _I, _P, _bind, _check, _f32_shaped, _ptr

KV_TYPES = {"F16": 1, "Q8_0": 8}
ROW_BYTES = {1: 512, 8: 272}
HEAD_DIM = 256
MAX_T = 8


def _lib() -> ctypes.CDLL:
    return _bind("attention test API", {
        "attn_decode": [_I, _I, _I, _I, _I, _P, _P, _P, _P, _P, _F, _F, _I, _P, _P, _P, _P, _P],
        "attn_prefill": [_I, _I, _I, _I, _I, _P, _P, _P, _P, _P, _F, _F, _I, _P, _P, _P, _P, _P, _I],
        "attn_split": [_I, _I, _I, _P, _P, _P],
        "attn_prefill_wgmma_available": [],
        "attn_store_kv": [_I, _I, _I, _I, _I, _P, _P, _P, _F, _F, _I, _P, _P, _P, _P],
        "bench_attn_decode": [_I, _I, _I, _I, _I, _I, _I, _I, _I, _P],
        "bench_attn_prefill": [_I, _I, _I, _I, _I, _I, _I, _I, _P],
    })


def attn_prefill_wgmma_available() -> bool:
    """Whether this library and GPU run the prefill attention on warpgroup MMA (a 90a build on compute capability
    9.0; taken there unless OPENJET_ATTN_PREFILL_WGMMA=0: native/src/attn_prefill_wgmma_ws.cu by default,
    attn_prefill_wgmma.cu with 1)."""
    return bool(_lib().openjet_test_attn_prefill_wgmma_available())


def _kv_inputs(kv_type: int, t: int, k, v, k_norm, k_cache, v_cache, n_kv: int):
    """The step's k, v rows and k_norm as float32 of their shapes, the caches as contiguous uint8 [n_kv, n_past,
    row_bytes] (checked), n_past, and empty outputs for the n_past + t rows."""
    rb = ROW_BYTES.get(kv_type, 1)  # an unknown type: the library names the error
    k = _f32_shaped(k, (t, n_kv * HEAD_DIM), "k")
    v = _f32_shaped(v, (t, n_kv * HEAD_DIM), "v")
    k_norm = _f32_shaped(k_norm, (HEAD_DIM,), "k_norm")
    k_cache = np.ascontiguousarray(k_cache, dtype=np.uint8)
    v_cache = np.ascontiguousarray(v_cache, dtype=np.uint8)
    n_past = k_cache.shape[1]
    if kv_type in ROW_BYTES and (k_cache.shape != (n_kv, n_past, rb) or v_cache.shape != k_cache.shape):
        raise ValueError(f"caches must be uint8 [{n_kv}, n_past, {rb}], got {k_cache.shape} and {v_cache.shape}")
    k_out = np.empty((n_kv, n_past + t, rb), np.uint8)
    return k, v, k_norm, k_cache, v_cache, n_past, k_out, np.empty_like(k_out)


def attn_decode(kv_type: int, qproj, k, v, q_norm, k_norm, k_cache, v_cache, *, n_head: int, n_kv: int,
                eps: float = 1e-6, rope_base: float = 1e7, n_rot: int = 64
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One step of t = len(qproj) rows after the n_past cached rows of k_cache / v_cache (uint8
    [n_kv, n_past, row_bytes]). Returns (o [t, n_head*256], k_cache', v_cache' [n_kv, n_past + t, row_bytes])."""
    return _attn("attn_decode", kv_type, qproj, k, v, q_norm, k_norm, k_cache, v_cache, n_head, n_kv, eps,
                 rope_base, n_rot)


def attn_prefill(kv_type: int, qproj, k, v, q_norm, k_norm, k_cache, v_cache, *, n_head: int, n_kv: int,
                 eps: float = 1e-6, rope_base: float = 1e7, n_rot: int = 64, rows: int = 0
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A prefill call's attention (the flash kernel, attn_prefill.cuh) over t = len(qproj) <= 4096 rows, otherwise
    as attn_decode; rows: query rows per block (64, 128, or 0: the library's choice; the same bits)."""
    return _attn("attn_prefill", kv_type, qproj, k, v, q_norm, k_norm, k_cache, v_cache, n_head, n_kv, eps,
                 rope_base, n_rot, rows)


def _attn(name: str, kv_type: int, qproj, k, v, q_norm, k_norm, k_cache, v_cache, n_head: int, n_kv: int,
          eps: float, rope_base: float, n_rot: int, *extra: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lib = _lib()
    t = len(qproj)
    qproj = _f32_shaped(qproj, (t, n_head * 2 * HEAD_DIM), "qproj")
    q_norm = _f32_shaped(q_norm, (HEAD_DIM,), "q_norm")
    k, v, k_norm, k_cache, v_cache, n_past, k_out, v_out = _kv_inputs(kv_type, t, k, v, k_norm, k_cache, v_cache,
                                                                      n_kv)
    o = np.empty((t, n_head * HEAD_DIM), np.float32)
    _check(lib, getattr(lib, f"openjet_test_{name}")(kv_type, n_head, n_kv, n_past, t, _ptr(qproj), _ptr(k), _ptr(v),
                                                   _ptr(q_norm), _ptr(k_norm), eps, rope_base, n_rot,
                                                   _ptr(k_cache) if n_past else None,
                                                   _ptr(v_cache) if n_past else None, _ptr(k_out), _ptr(v_out),
                                                   _ptr(o), *extra), name)
    return o, k_out, v_out


def attn_store_kv(kv_type: int, k, v, k_norm, k_cache, v_cache, *, n_head: int, n_kv: int, eps: float = 1e-6,
                  rope_base: float = 1e7, n_rot: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """The cache rows of t = len(k) tokens appended after the n_past cached rows (launch_attn_store_kv: no q, no
    attention). Returns (k_cache', v_cache') [n_kv, n_past + t, row_bytes]."""
    lib = _lib()
    t = len(k)
    k, v, k_norm, k_cache, v_cache, n_past, k_out, v_out = _kv_inputs(kv_type, t, k, v, k_norm, k_cache, v_cache,
                                                                      n_kv)
    _check(lib, lib.openjet_test_attn_store_kv(kv_type, n_head, n_kv, n_past, t, _ptr(k), _ptr(v), _ptr(k_norm),
                                               eps, rope_base, n_rot, _ptr(k_cache) if n_past else None,
                                               _ptr(v_cache) if n_past else None, _ptr(k_out), _ptr(v_out)),
           "attn_store_kv")
    return k_out, v_out


def attn_split(n_past: int, n_kv: int, t: int) -> dict:
    """The context split the launch picks on this device."""
    lib = _lib()
    v = (ctypes.c_int * 3)()
    _check(lib, lib.openjet_test_attn_split(n_past, n_kv, t, ctypes.byref(v, 0), ctypes.byref(v, 4),
                                            ctypes.byref(v, 8)), "attn_split")
    return {"chunk_keys": v[0], "n_chunks": v[1], "sm_count": v[2]}


def bench_attn_decode(kv_type: int, n_head: int, n_kv: int, n_past: int, t: int, copies: int, reps: int,
                      runs: int, split_factor: int = 1) -> list[float]:
    """Microseconds per decode step (one attention layer), one figure per run; split_factor sizes the context
    split as for that many times the SMs (1: the library's choice)."""
    lib = _lib()
    us = np.empty(runs, np.float32)
    _check(lib, lib.openjet_test_bench_attn_decode(kv_type, n_head, n_kv, n_past, t, split_factor, copies, reps,
                                                   runs, _ptr(us)), "bench_attn_decode")
    return [float(x) for x in us]


def bench_attn_prefill(kv_type: int, n_head: int, n_kv: int, n_past: int, t: int, reps: int, runs: int,
                       rows: int = 0) -> list[float]:
    """Microseconds per prefill call's attention (one layer: prep and the flash kernel) over t rows after n_past
    cached ones, one figure per run; rows: query rows per block (0: the library's choice)."""
    lib = _lib()
    us = np.empty(runs, np.float32)
    _check(lib, lib.openjet_test_bench_attn_prefill(kv_type, n_head, n_kv, n_past, t, rows, reps, runs, _ptr(us)),
           "bench_attn_prefill")
    return [float(x) for x in us]


def prefill_flop(n_head: int, n_past: int, t: int) -> int:
    """Tensor-core FLOP of a prefill call's attention: S = Q K^T and P V over the keys each row sees (causal),
    2 x 2 x 256 per (row, key, q head)."""
    keys = t * n_past + t * (t + 1) // 2
    return 4 * HEAD_DIM * n_head * keys


def kv_bytes_read(kv_type: int, n_kv: int, n_ctx_rows: int) -> int:
    """K and V bytes one step reads: every cached row of every kv head, once."""
    return 2 * n_kv * n_ctx_rows * ROW_BYTES[kv_type]


def main() -> None:
    """Time per attention layer of the 27B model (24 q heads, 4 kv heads) against the copy bandwidth."""
    import statistics

    from .kernels_test import bench_copy

    copy = statistics.median(bench_copy(1 << 30, 10, 5))
    print(f"device-to-device copy (read + write): {copy:.0f} GB/s")
    print(f"{'kv':>5} {'n_ctx':>6} {'T':>2} {'split':>5} {'us/layer':>9} {'KV MB':>7} {'GB/s':>7} {'of copy':>8}")
    for name, kv_type in KV_TYPES.items():
        for n_ctx in (4096, 32768):
            for t in (1, 4, 8):
                kv_b = kv_bytes_read(kv_type, 4, n_ctx + t)
                copies = max(2, -(-(256 << 20) // kv_b))  # > 5x the 50 MB L2 over the rotation
                for factor in (1, 2, 4):  # 1: the library's split; 2, 4: as for 2x, 4x the SMs
                    us = statistics.median(bench_attn_decode(kv_type, 24, 4, n_ctx, t, copies, 30, 5, factor))
                    gbs = kv_b / (us * 1e-6) / 1e9
                    print(f"{name:>5} {n_ctx:>6} {t:>2} {f'x{factor}':>5} {us:>9.1f} {kv_b / 1e6:>7.1f} "
                          f"{gbs:>7.0f} {gbs / copy:>7.0%}")


if __name__ == "__main__":
    main()
