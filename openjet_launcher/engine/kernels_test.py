"""ctypes binding of the engine's test-only C API (native/include/openjet_test.h): runs one kernel family on
numpy arrays, for the GPU tests (tests/test_gpu_gemv.py) and benchmarks (native/bench/bench_gemv.py). Also the
binding helpers (_bind, _check, _ptr, _f32, _f32_shaped) that kernels_test_gdn and kernels_test_attn share.

Weights are GGUF bytes as `openjet_launcher.model.quants.quantize` writes them: uint8 [n, row_bytes]
(F32: float32 [n, k] also accepted). Activations are float32 [t, k] with t = 1..128 token rows (decode:
1..8; more: the prefill path, groups of 8).
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..errors import OpenJetError
from .native import load_library

# GGML type ids the GEMV reads.
QTYPES = {"F32": 0, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
BLOCK = {0: (1, 4), 8: (32, 34), 12: (256, 144), 13: (256, 176), 14: (256, 210)}  # (elements, bytes)
MAX_T = 8

_P = ctypes.c_void_p
_I = ctypes.c_int
_F = ctypes.c_float
_declared: set[tuple[int, str]] = set()


def _bind(what: str, signatures: dict[str, list]) -> ctypes.CDLL:
    """The engine library with openjet_test_last_error and openjet_test_<name>(*argtypes) -> int declared for
    every name of `signatures`; `what` names that part of the test API when the library lacks it."""
    lib = load_library()
    if (id(lib), what) in _declared:
        return lib
    try:
        lib.openjet_test_last_error.argtypes = []
        lib.openjet_test_last_error.restype = ctypes.c_char_p
        for name, argtypes in signatures.items():
            fn = getattr(lib, f"openjet_test_{name}")
            fn.argtypes = argtypes
            fn.restype = _I
    except AttributeError as e:
        raise OpenJetError(f"the engine library has no {what} (missing {e}): rebuild it") from e
    _declared.add((id(lib), what))
    return lib


def _lib() -> ctypes.CDLL:
    return _bind("test API", {
        "pack_act": [_P, _I, _I, _P, _F, _P, _P, _P],
        "rmsnorm": [_P, _I, _I, _P, _F, _P],
        "add_norm_pack": [_P, _P, _P, _I, _I, _F, _P, _P, _P, _P, _P],
        "gemv": [_I, _P, _I, _I, _P, _I, _P],
        "gemv_tiled": [_I, _P, _I, _I, _P, _I, _P],
        "gemv_tma": [_I, _P, _I, _I, _P, _I, _I, _P],
        "gemv_f32_pair": [_P, _P, _I, _I, _P, _I, _P, _P],
        "bench_gemv_f32_pair": [_I, _I, _I, _I, _I, _P],
        "tile_layout": [_I, _P, _I, _I, _P],
        "gemv_packed": [_I, _P, _I, _I, _P, _P, _P, _I, _P],
        "prefill_gate_up": [_I, _P, _P, _I, _I, _P, _I, _P, _P, _P],
        "prefill_gate_up_half": [_I, _P, _P, _I, _I, _P, _I, _P, _P, _P, _P],
        "embed": [_I, _P, _I, _I, _P, _I, _P],
        "mtp_input_pack": [_P, _I, _I, _P, _I, _P, _P, _P, _F, _P, _P, _P],
        "topk": [_P, _I, _I, _I, _I, _P, _P, _I, _P, _P],
        "sample_top": [_P, _I, _P, _I, _I, ctypes.c_double, ctypes.c_double, ctypes.c_double, ctypes.c_double, _P,
                       _P, _P, _P],
        "gemv_shape": [_I, _I, _I, _P, _P, _P],
        "bench_gemv": [_I, _P, _I, _I, _I, _I, _I, _I, _P],
        "bench_gemv_layout": [_I, _P, _I, _I, _I, _I, _I, _I, _I, _P],
        "bench_copy": [ctypes.c_size_t, _I, _I, _P],
        "bench_boundary": [_I, _I, _I, _I, _I, _I, _I, _I, _P, _P, _P],
        "bench_pack_chain": [_I, _P, _I, _I, _I, _I, _I, _I, _P],
        "gemv_fold": [_I, _P, _I, _I, _P, _I, _P, _I, _P, _P, ctypes.c_float, _P, _P, _P, _P, _P, _P, _P, _P, _P, _I,
                      _I],
        "gemv_swiglu_rows": [_I, _P, _I, _I, _P, _P, _I, _P, _P, _I, _I, _P, _P, _P, _P, _P, _P],
        "fold_add_norm_pack": [_P, _P, _P, _I, _I, ctypes.c_float, _P, _P, _P, _P, _P, _P, _P],
        "set_gemv_half": [_I],
        "set_add_norm_max_est": [_I],
        "dense_gemm_available": [],
        "gemv_tma_available": [],
        "launch_count": [_I, _P],
        "ffn_pack_rows": [_I, _I, _I, _I, _P],
        "ffn_scratch": [_I, _P, _P],
    })


def _check(lib: ctypes.CDLL, status: int, what: str) -> None:
    """Raises OpenJetError with the library's message when a test API call returned a failure status."""
    if status != 0:
        msg = lib.openjet_test_last_error().decode("utf-8", errors="replace")
        raise OpenJetError(f"{what} failed (status {status}): {msg}")


def _ptr(a: np.ndarray | None) -> ctypes.c_void_p | None:
    return None if a is None else a.ctypes.data_as(ctypes.c_void_p)


def _f32(x, ndim: int) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != ndim:
        raise ValueError(f"expected a {ndim}-d float32 array, got shape {x.shape}")
    return x


def _f32_shaped(x, shape: tuple[int, ...], name: str) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape != shape:
        raise ValueError(f"{name} has shape {x.shape}, expected {shape}")
    return x


def _weights(qtype: int, w: np.ndarray, k: int) -> tuple[np.ndarray, int]:
    """(contiguous bytes, n) of a weight matrix with k columns."""
    if qtype not in BLOCK:
        raise ValueError(f"qtype {qtype} is not one of {sorted(BLOCK)}")
    w = np.ascontiguousarray(w)
    epb, bpb = BLOCK[qtype]
    if k % epb:
        raise ValueError(f"k = {k} is not a multiple of {epb}")
    raw = w.view(np.uint8).reshape(w.shape[0], -1)
    if raw.shape[1] != k // epb * bpb:
        raise ValueError(f"weights of {raw.shape[1]} bytes per row do not hold k = {k} (need {k // epb * bpb})")
    return raw, raw.shape[0]


def pack_arrays(t: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Host arrays for t rows of a pack of k-element rows, as the test API fills them: xh uint16 [t, k], xsum uint16
    [t, k / 32 * 2], xinv float32 [t] (pack_act says what they hold)."""
    return np.empty((t, k), np.uint16), np.empty((t, k // 32 * 2), np.uint16), np.empty(t, np.float32)


def pack_act(x, norm_w=None, eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The GEMV's input format for x [t, k] (with norm_w, of rmsnorm(x) * norm_w): (xh uint16 [t, k] fp16 bits,
    quads stored 0, 2, 1, 3; xsum uint16 [t, k/32 * 2] fp16 bits of the 32-block sums / 32 as hi + lo;
    xinv float32 [t]); see native/src/act_pack.cuh."""
    lib = _lib()
    x = _f32(x, 2)
    t, k = x.shape
    w = None if norm_w is None else _f32(norm_w, 1)
    xh, xsum, xinv = pack_arrays(t, k)
    _check(lib, lib.openjet_test_pack_act(_ptr(x), t, k, _ptr(w), eps, _ptr(xh), _ptr(xsum), _ptr(xinv)), "pack_act")
    return xh, xsum, xinv


def add_norm_pack(h, delta, w, eps: float = 1e-6) -> tuple[np.ndarray, ...]:
    """The engine's add-norm pack of decode rows (launch_add_norm_pack): h [t, k] + delta (None: no add) and a =
    rmsnorm(h) * w, packed. Returns (h after the add, a, xh, xsum, xinv) as pack_act gives the pack."""
    lib = _lib()
    h = _f32(h, 2)
    t, k = h.shape
    d = None if delta is None else _f32(delta, 2)
    w = _f32(w, 1)
    if (d is not None and d.shape != h.shape) or w.shape != (k,):
        raise ValueError(f"add_norm_pack: delta must be {h.shape} and w ({k},)")
    h_out, a_out = np.empty_like(h), np.empty_like(h)
    xh, xsum, xinv = pack_arrays(t, k)
    _check(lib, lib.openjet_test_add_norm_pack(_ptr(h), _ptr(d), _ptr(w), t, k, eps, _ptr(h_out), _ptr(a_out),
                                               _ptr(xh), _ptr(xsum), _ptr(xinv)), "add_norm_pack")
    return h_out, a_out, xh, xsum, xinv


def rmsnorm(x, w, eps: float = 1e-6) -> np.ndarray:
    lib = _lib()
    x = _f32(x, 2)
    w = _f32(w, 1)
    y = np.empty_like(x)
    _check(lib, lib.openjet_test_rmsnorm(_ptr(x), x.shape[0], x.shape[1], _ptr(w), eps, _ptr(y)), "rmsnorm")
    return y


def gemv(qtype: int, w, x, tiled: bool = False) -> np.ndarray:
    """y [t, n] = W x (x packed to fp16 first, unless W is F32); tiled: W moved into the tile layout on the device
    and read there, as the engine reads its weights (openjet_test_gemv_tiled)."""
    lib = _lib()
    x = _f32(x, 2)
    t, k = x.shape
    raw, n = _weights(qtype, w, k)
    y = np.empty((t, n), np.float32)
    fn = lib.openjet_test_gemv_tiled if tiled else lib.openjet_test_gemv
    _check(lib, fn(qtype, _ptr(raw), n, k, _ptr(x), t, _ptr(y)), "gemv_tiled" if tiled else "gemv")
    return y


def gemv_tma(qtype: int, w, x, form: int = -1) -> np.ndarray:
    """y [t, n] = W x on the producer-warp decode GEMV (gemv_tma.cu, the engine's default on a 9.0 GPU with a 90a
    build; W moved into the tile layout first): form -1 the default's choice for t, 1 or 2 one of its forms. The
    library refuses where it cannot run (gemv_tma_available) or where the call took another kernel."""
    lib = _lib()
    x = _f32(x, 2)
    t, k = x.shape
    raw, n = _weights(qtype, w, k)
    y = np.empty((t, n), np.float32)
    _check(lib, lib.openjet_test_gemv_tma(qtype, _ptr(raw), n, k, _ptr(x), t, form, _ptr(y)), "gemv_tma")
    return y


def gemv_f32_pair(w0, w1, x) -> tuple[np.ndarray, np.ndarray]:
    """(W0 x, W1 x) for two F32 matrices of one shape in one launch_gemv_pair, as the engine's prefill projects a GDN
    layer's beta and alpha (openjet_test_gemv_f32_pair: under the prefill's own numerics prefill_f32.cu's GEMM, any row
    count; OPENJET_PREFILL_F32=rows, or OPENJET_PREFILL_GEMM=exact: decode's kernels)."""
    lib = _lib()
    x = _f32(x, 2)
    t, k = x.shape
    raw0, n = _weights(QTYPES["F32"], w0, k)
    raw1, n1 = _weights(QTYPES["F32"], w1, k)
    if n1 != n:
        raise ValueError(f"the two matrices have {n} and {n1} rows")
    y0, y1 = np.empty((t, n), np.float32), np.empty((t, n), np.float32)
    _check(lib, lib.openjet_test_gemv_f32_pair(_ptr(raw0), _ptr(raw1), n, k, _ptr(x), t, _ptr(y0), _ptr(y1)),
           "gemv_f32_pair")
    return y0, y1


def bench_gemv_f32_pair(n: int, k: int, t: int, reps: int, runs: int) -> list[float]:
    """Microseconds per gemv_f32_pair-shaped call over t rows, one figure per run (openjet_test_bench_gemv_f32_pair;
    OPENJET_PREFILL_F32 in the environment picks the kernel)."""
    lib = _lib()
    us = np.empty(runs, np.float32)
    _check(lib, lib.openjet_test_bench_gemv_f32_pair(n, k, t, reps, runs, _ptr(us)), "bench_gemv_f32_pair")
    return [float(v) for v in us]


def tile_layout(qtype: int, w, k: int) -> np.ndarray:
    """W's bytes in the tile layout, moved by the device (openjet_test_tile_layout), as a flat uint8 array (each row's
    unit in a 4-byte-aligned piece, zeros after it)."""
    lib = _lib()
    raw, n = _weights(qtype, w, k)
    epb, bpb = BLOCK[qtype]
    pitch = (256 // epb * bpb + 3) // 4 * 4  # a row's unit, rounded up to 4 bytes (Q6_K: 210 -> 212)
    out = np.empty(n * (k // 256) * pitch, np.uint8)
    _check(lib, lib.openjet_test_tile_layout(qtype, _ptr(raw), n, k, _ptr(out)), "tile_layout")
    return out


def gemv_packed(qtype: int, w, xh, xsum, xinv) -> np.ndarray:
    """y [t, n] = W x for activations already packed (as pack_act returns them)."""
    lib = _lib()
    xh = np.ascontiguousarray(xh, dtype=np.uint16)
    t, k = xh.shape
    xsum = np.ascontiguousarray(xsum, dtype=np.uint16)
    if xsum.shape != (t, k // 32 * 2):
        raise ValueError(f"xsum has shape {xsum.shape}, expected {(t, k // 32 * 2)}")
    xinv = _f32_shaped(xinv, (t,), "xinv")
    raw, n = _weights(qtype, w, k)
    y = np.empty((t, n), np.float32)
    _check(lib, lib.openjet_test_gemv_packed(qtype, _ptr(raw), n, k, _ptr(xh), _ptr(xsum), _ptr(xinv), t, _ptr(y)),
           "gemv_packed")
    return y


def _gate_up_inputs(qtype: int, w_gate, w_up, x):
    """(x as float32 [t, k], t, k, the gate's and up's raw blocks, n) for the gate-and-up test calls; gate and up of
    one shape, else ValueError."""
    x = _f32(x, 2)
    t, k = x.shape
    raw_g, n = _weights(qtype, w_gate, k)
    raw_u, n_u = _weights(qtype, w_up, k)
    if n_u != n:
        raise ValueError(f"gate has {n} rows, up {n_u}")
    return x, t, k, raw_g, raw_u, n


def prefill_gate_up(qtype: int, w_gate, w_up, x) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pack (xh, xsum, xinv as pack_act returns them) of silu(G x) * (U x), x [t, k] packed first: a prefill
    call's ffn_down input as the engine makes it (one GEMM for G and U; OPENJET_PREFILL_FFN_FUSED=0: two)."""
    lib = _lib()
    x, t, k, raw_g, raw_u, n = _gate_up_inputs(qtype, w_gate, w_up, x)
    xh, xsum, xinv = pack_arrays(t, n)
    _check(lib, lib.openjet_test_prefill_gate_up(qtype, _ptr(raw_g), _ptr(raw_u), n, k, _ptr(x), t, _ptr(xh),
                                                 _ptr(xsum), _ptr(xinv)), "prefill_gate_up")
    return xh, xsum, xinv


def prefill_gate_up_half(qtype: int, w_gate, w_up, x) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The FFN's fp16 form on x [t, k] (t >= DENSE_MIN_ROWS; the dense GEMM: a 90a build on sm_90) beside the fp32
    epilogue on the same rows: (v float32 [t, n] = silu(G x) * (U x) by the fp32 epilogue, in natural order; h uint16
    [t, n], the fp16 form's bits in the pack's element order; inv float32 [t], its row factors; norms float32 [2], the
    largest row norms of G and U as the device summed them)."""
    lib = _lib()
    x, t, k, raw_g, raw_u, n = _gate_up_inputs(qtype, w_gate, w_up, x)
    v, h = np.empty((t, n), np.float32), np.empty((t, n), np.uint16)
    inv, norms = np.empty(t, np.float32), np.empty(2, np.float32)
    _check(lib, lib.openjet_test_prefill_gate_up_half(qtype, _ptr(raw_g), _ptr(raw_u), n, k, _ptr(x), t, _ptr(v),
                                                      _ptr(h), _ptr(inv), _ptr(norms)), "prefill_gate_up_half")
    return v, h, inv, norms


def embed(qtype: int, table, dim: int, ids) -> np.ndarray:
    """float32 [len(ids), dim]: rows `ids` of a quantised table [vocab, dim]."""
    lib = _lib()
    raw, vocab = _weights(qtype, table, dim)
    ids = np.ascontiguousarray(ids, dtype=np.int32).reshape(-1)
    out = np.empty((len(ids), dim), np.float32)
    _check(lib, lib.openjet_test_embed(qtype, _ptr(raw), vocab, dim, _ptr(ids), len(ids), _ptr(out)), "embed")
    return out


def mtp_input_pack(table, dim: int, ids, hs, enorm, hnorm, eps: float = 1e-6
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """pack_act's (xh, xsum, xinv) of the rows [rmsnorm(embed(ids)) * enorm | rmsnorm(hs) * hnorm] of 2 dim, made in
    one launch (openjet_test_mtp_input_pack, the engine's MTP input pack); a Q4_K table, t = len(ids) <= 8, an id
    outside the vocabulary giving a row of zeros."""
    lib = _lib()
    raw, vocab = _weights(QTYPES["Q4_K"], table, dim)
    ids = np.ascontiguousarray(ids, dtype=np.int32).reshape(-1)
    hs, enorm, hnorm = _f32(hs, 2), _f32(enorm, 1), _f32(hnorm, 1)
    t, k = len(ids), 2 * dim
    if hs.shape != (t, dim) or enorm.shape != (dim,) or hnorm.shape != (dim,):
        raise ValueError(f"hs {hs.shape}, enorm {enorm.shape}, hnorm {hnorm.shape} do not fit {t} ids of dim {dim}")
    xh, xsum, xinv = pack_arrays(t, k)
    _check(lib, lib.openjet_test_mtp_input_pack(_ptr(raw), vocab, dim, _ptr(ids), t, _ptr(hs), _ptr(enorm),
                                                _ptr(hnorm), eps, _ptr(xh), _ptr(xsum), _ptr(xinv)), "mtp_input_pack")
    return xh, xsum, xinv


def topk(x, k: int, n_valid: int | None = None, penalties: dict[int, float] | None = None
         ) -> tuple[np.ndarray, np.ndarray]:
    """(values float32 [rows, k], ids int32 [rows, k]): each row's top k among ids < n_valid after
    z[id] -= delta for the penalties (the device sampler's first step)."""
    lib = _lib()
    x = _f32(x, 2)
    rows, n = x.shape
    pen_ids = np.fromiter((penalties or {}).keys(), np.int32)
    pen_deltas = np.fromiter((penalties or {}).values(), np.float32)
    values, ids = np.empty((rows, k), np.float32), np.empty((rows, k), np.int32)
    _check(lib, lib.openjet_test_topk(_ptr(x), rows, n, n if n_valid is None else n_valid, k, _ptr(pen_ids),
                                      _ptr(pen_deltas), len(pen_ids), _ptr(values), _ptr(ids)), "topk")
    return values, ids


def sample_top(x, k: int, temperature: float, top_p: float, min_p: float, u: float, n_valid: int | None = None,
               row_ids=None) -> tuple[int, np.ndarray, np.ndarray]:
    """A sampled draft step's pick from the row x (sample_top.cuh): its top k among ids < n_valid (entry i being
    token row_ids[i]), the transform and the draw with u: (the id, q's ids increasing, q's probabilities)."""
    lib = _lib()
    x = _f32(x, 1)
    n = len(x)
    rows = None if row_ids is None else np.ascontiguousarray(row_ids, np.int32)
    if rows is not None and rows.shape != (n,):
        raise OpenJetError(f"sample_top: row_ids has shape {rows.shape}, the row {n} entries")
    pick, q_len = ctypes.c_int32(), ctypes.c_int()
    q_ids, q_probs = np.empty(k, np.int32), np.empty(k, np.float64)
    _check(lib, lib.openjet_test_sample_top(_ptr(x), n, _ptr(rows), n if n_valid is None else n_valid, k, temperature,
                                            top_p, min_p, u, ctypes.byref(pick), _ptr(q_ids), _ptr(q_probs),
                                            ctypes.byref(q_len)), "sample_top")
    return int(pick.value), q_ids[:q_len.value].copy(), q_probs[:q_len.value].copy()


def gemv_shape(qtype: int, n: int, k: int) -> dict:
    """The launch shape of the GEMV for these sizes (the same on every GPU and for every t)."""
    lib = _lib()
    v = (ctypes.c_int * 3)()
    _check(lib, lib.openjet_test_gemv_shape(qtype, n, k, ctypes.byref(v, 0), ctypes.byref(v, 4),
                                            ctypes.byref(v, 8)), "gemv_shape")
    return {"rows_per_block": v[0], "warps_per_block": v[1], "blocks": v[2]}


def bench_gemv(qtype: int, w, k: int, t: int, copies: int, reps: int, runs: int, tiled: bool = False) -> list[float]:
    """Microseconds per GEMV call, one figure per run (see openjet_test_bench_gemv; tiled: the weights in the tile
    layout, openjet_test_bench_gemv_layout)."""
    lib = _lib()
    raw, n = _weights(qtype, w, k)
    us = np.empty(runs, np.float32)
    _check(lib, lib.openjet_test_bench_gemv_layout(qtype, _ptr(raw), n, k, t, int(tiled), copies, reps, runs, _ptr(us)),
           "bench_gemv")
    return [float(v) for v in us]


GEMV_TILES = {"env": -1, "auto": 0, "16": 1, "8": 2}


def set_gemv_tiles(tiles: str) -> None:
    """The decode GEMV's tile rows for the calls that follow, in this process: "16", "8" (half tiles, the same
    bits), "auto" (half tiles where they fit one wave of the GPU) or "env" (what OPENJET_GEMV_HALF says: by
    default auto)."""
    if tiles not in GEMV_TILES:
        raise ValueError(f"tiles must be one of {', '.join(GEMV_TILES)}, got {tiles!r}")
    lib = _lib()
    _check(lib, lib.openjet_test_set_gemv_half(GEMV_TILES[tiles]), "set_gemv_half")


def set_add_norm_max_est(on: bool | None) -> None:
    """The add-norm cluster pack's scale from its bound where the bound pins the max (OPENJET_ADD_NORM_MAX_EST) for the
    calls that follow, in this process: True, False, or None (what the environment says)."""
    lib = _lib()
    _check(lib, lib.openjet_test_set_add_norm_max_est(-1 if on is None else int(bool(on))), "set_add_norm_max_est")


def dense_gemm_available() -> bool:
    """Whether this library and GPU run the dense prefill GEMM (a 90a build with CUTLASS on compute capability 9.0;
    OPENJET_PREFILL_GEMM=dense then takes it: native/src/dense_gemm.cuh)."""
    return bool(_lib().openjet_test_dense_gemm_available())


def gemv_tma_available() -> bool:
    """Whether this library and GPU run the producer-warp decode GEMV (a 90a build on compute capability 9.0; decode
    calls then take it unless OPENJET_GEMV_TMA=0: native/src/gemv_tma.cu)."""
    return bool(_lib().openjet_test_gemv_tma_available())


# prefill_gemm.cuh's kDenseMinRows: a prefill call of fewer rows takes the fast kernel (the same bits) even where the
# dense GEMM runs.
DENSE_MIN_ROWS = 256

# launch_count.h's counted paths, in its order (22 unused: the removed norm fold's, then the norm tail's).
COUNTED = {"dense_gemm": 0, "gdn_two_phase": 1, "gdn_snapshot": 2, "gdn_state_tensor_cores": 3,
           "attn_prefill_f16_rows": 4, "prefill_gate_up": 5, "ffn_persistent": 6, "tiled_weights": 7,
           "pack_cluster": 8, "gemv_int": 9, "swiglu_split": 10, "dense_gemm_swiglu": 11,
           "attn_prefill_wgmma": 12, "prefill_f16_kept": 13, "gdn_norm_pack": 14,
           "prefill_residual": 15, "attn_prep_rows": 16, "gdn_state_rounded": 17,
           "gdn_local_tensor_cores": 18, "dense_gemm_swiglu_half": 19, "gdn_pack_bounded": 20, "gemv_tma": 21,
           "attn_planned": 23, "trunk_graph_capture": 24, "trunk_graph_replay": 25,
           "cycle_graph_capture": 26, "cycle_graph_replay": 27, "mtp_input_pack": 28, "ffn_persistent_tma": 29,
           "gdn_step_pack": 30, "gemv_fold": 31, "fold_add_norm": 32,
           "swiglu_self": 33, "gdn_staged": 34, "gdn_late_launch": 35, "gemv_group": 36,
           "attn_own_pack": 37, "gemv_tma_form_forced": 38, "fold_rows": 39,
           "swiglu_rows": 40}


def prefill_f32_block_rows(t: int, n: int, matrices: int, sms: int, optin: int) -> int:
    """The W rows (48 or 16) a block of the prefill's tf32x3 F32 GEMM takes for t rows x n, `matrices` in one launch,
    on a GPU of `sms` multiprocessors whose blocks may opt in to `optin` bytes of shared memory
    (openjet_test_prefill_f32_block_rows; host arithmetic, no GPU needed)."""
    lib = _lib()
    rows = ctypes.c_int(0)
    _check(lib, lib.openjet_test_prefill_f32_block_rows(t, n, matrices, sms, optin, ctypes.byref(rows)),
           "prefill_f32_block_rows")
    return rows.value


def ffn_pack_rows(n_embd: int, n_ff: int, k_out: int, next_proj: bool) -> tuple[int, int]:
    """The persistent FFN's pack rows (openjet_test_ffn_pack_rows; host arithmetic, no GPU needed): where the tail's
    rows start in rows of k_out (-1: k_out 0, no tail) and where the next norm's rows start in rows of n_embd (0
    without the next layer's input projections)."""
    lib = _lib()
    rows = (ctypes.c_int * 2)()
    _check(lib, lib.openjet_test_ffn_pack_rows(n_embd, n_ff, k_out, int(next_proj), rows), "ffn_pack_rows")
    return rows[0], rows[1]


def ffn_scratch(n_ff: int) -> tuple[int, int]:
    """What the engine allocates for the persistent FFN (openjet_test_ffn_scratch; host arithmetic): its ints of
    counters and flags at FFN width n_ff, and its 8-byte profile slots."""
    lib = _lib()
    ints, slots = ctypes.c_int(0), ctypes.c_int(0)
    _check(lib, lib.openjet_test_ffn_scratch(n_ff, ctypes.byref(ints), ctypes.byref(slots)), "ffn_scratch")
    return ints.value, slots.value


def launch_count(path: str) -> int:
    """Launches so far, in this process, of a path whose output may equal another's bit for bit ("dense_gemm": the
    dense prefill GEMM; "gdn_two_phase": the two-phase chunked GDN; "gdn_snapshot": its state written at a chunk
    boundary for a checkpoint taken inside a prefill call; "gdn_state_tensor_cores": its state phase on tensor cores;
    "attn_prefill_f16_rows": the prefill attention on fp16 rows of a Q8_0 cache; "prefill_gate_up": a prefill's FFN
    gate and up in one GEMM; "ffn_persistent": a decode step's FFN in one persistent launch; "tiled_weights": a
    GEMV, prefill GEMM, dequantisation or row gather reading weights in the tile layout; "pack_cluster": a decode row's
    pack on a cluster of blocks; "gemv_int": a decode call on the integer GEMV, OPENJET_GEMV_INT; "swiglu_split": a
    prefill's swiglu pack in two passes, OPENJET_PREFILL_SWIGLU; "dense_gemm_swiglu": the dense gate-and-up GEMM whose
    epilogue writes silu(g) u; "attn_prefill_wgmma": the prefill attention on warpgroup MMA,
    OPENJET_ATTN_PREFILL_WGMMA; "prefill_f16_kept": a prefill GEMM on the engine's kept fp16 weights,
    OPENJET_PREFILL_F16_WEIGHTS; "gdn_norm_pack": a prefill's GDN gated norm and out-projection pack in one pass,
    OPENJET_GDN_NORM_PACK; "prefill_residual": a prefill projection added to the residual stream in the dense GEMM's
    epilogue, OPENJET_PREFILL_RESIDUAL; "attn_prep_rows": an attention call's prep a row a block,
    OPENJET_ATTN_PREP_ROWS; "gdn_state_rounded": the chunked GDN's tf32 state phase on operands the local phase rounded,
    the default, against OPENJET_GDN_STATE_TC=tf32-cvt; "gdn_local_tensor_cores": its local phase's A and Aq on
    tensor cores, OPENJET_GDN_LOCAL_TC; "dense_gemm_swiglu_half": the FFN's gate and up on the kept fp16 rows writing
    fp16 silu(g) u under its bound's scale, OPENJET_PREFILL_SWIGLU; "gdn_pack_bounded": a prefill's GDN gated norm
    packed under its bound's row scales, OPENJET_GDN_PACK_BOUND; "gemv_tma": a decode GEMV on the producer-warp kernel,
    OPENJET_GEMV_TMA; "attn_planned": attention chunk blocks in the planned tile pipeline, OPENJET_ATTN_PIPE;
    "trunk_graph_capture" / "trunk_graph_replay": a decode trunk captured as a CUDA graph / launched again,
    OPENJET_BENCH_GRAPH; "cycle_graph_capture" / "cycle_graph_replay": the same for a whole greedy cycle,
    openjet_engine_cycle_greedy; "mtp_input_pack": the MTP head's embedding, input norms and pack in one launch,
    OPENJET_MTP_INPUT_PACK; "ffn_persistent_tma": a persistent FFN launch in its producer-warp form,
    OPENJET_FFN_TMA; "gdn_step_pack": a GDN step that packs its own output for the out projection,
    OPENJET_GDN_STEP_PACK; "gemv_fold": a GEMV of the fold, A's epilogue or B reading it, OPENJET_FOLD;
    "fold_add_norm": a prefill's add-norm on the fold's numerics, where a decode step's is the fold; "swiglu_self": gate
    / up packing their own swiglu, OPENJET_SWIGLU_SELF; "gdn_staged": a GDN step in its staged form,
    OPENJET_GDN_STAGED; "gdn_late_launch": a GDN step letting the next kernels in past its first barrier,
    OPENJET_GDN_LATE; "gemv_group": one producer-warp GEMV launch of a layer's input projections of two types, or of
    three, OPENJET_GEMV_GROUP; "attn_own_pack": an attention combine packing its own output, OPENJET_ATTN_OWN_PACK;
    "gemv_tma_form_forced": a producer-warp GEMV launch on the form OPENJET_GEMV_TMA names where the default's choice
    by t would take the other, its fold's and group launches included; "fold_rows": the fold's B at more than one
    token row making its rows' pack itself instead of a pack launch, OPENJET_FOLD_ROWS; "swiglu_rows": a down projection
    at more than one token row making its swiglu pack itself instead of the swiglu pack launch, OPENJET_SWIGLU_ROWS): how
    a test sees that the path ran."""
    lib = _lib()
    out = ctypes.c_longlong(0)
    _check(lib, lib.openjet_test_launch_count(COUNTED[path], ctypes.byref(out)), "launch_count")
    return out.value


def bench_copy(nbytes: int, reps: int, runs: int) -> list[float]:
    """Device-to-device copy bandwidth in GB/s (bytes read + written), one figure per run."""
    lib = _lib()
    out = np.empty(runs, np.float32)
    _check(lib, lib.openjet_test_bench_copy(nbytes, reps, runs, _ptr(out)), "bench_copy")
    return [float(v) for v in out]


def bench_boundary(blocks_per_sm: int, threads: int, arrivals_per_block: int, rounds: int, runs: int,
                   read_bytes: int = 0, block_wait: bool = False, rotated: bool = False) -> dict:
    """A phase boundary's cost with no work on either side (bench_boundary.cu), one figure per run: `handover_us`, a
    launch's hand-over to the next under PDL; `barrier_us`, a grid-wide barrier round in a resident grid (every warp
    polling the counter, or with `block_wait` warp 0 of each block, which then releases the block); with
    `read_bytes`, each followed by every warp reading the same bytes through L2 (a projection's activation row), from
    its start or, `rotated`, each warp from a 512-byte piece of its own; with what the device counted: `launches`,
    the hand-over launches (1 + (runs + 1) x rounds), and `arrivals`, per run (rounds x grid x arrivals_per_block)."""
    lib = _lib()
    handover, barrier = np.empty(runs, np.float32), np.empty(runs, np.float32)
    counts = np.empty(1 + runs, np.int32)
    _check(lib, lib.openjet_test_bench_boundary(blocks_per_sm, threads, arrivals_per_block, int(block_wait),
                                                read_bytes, int(rotated), rounds, runs, _ptr(handover),
                                                _ptr(barrier), _ptr(counts)), "bench_boundary")
    return {"handover_us": [float(v) for v in handover], "barrier_us": [float(v) for v in barrier],
            "launches": int(counts[0]), "arrivals": [int(v) for v in counts[1:]]}


PACK_CHAIN_MODES = {"none": 0, "add_norm_pack": 1, "empty": 2, "empty_cluster": 3, "empty_8_blocks": 4, "fold": 5,
                    "fold_out_only": 6, "fold_in_only": 7}


def bench_pack_chain(qtype: int, w, k: int, t: int, middle: str, copies: int, reps: int, runs: int) -> list[float]:
    """Microseconds per chain GEMV A -> middle -> GEMV B (both k x k, the tile layout, the engine's decode GEMV) in a
    CUDA graph of `reps` chains, one figure per run: what the middle (PACK_CHAIN_MODES: none; the engine's add-norm
    pack of A's output into B's input; an empty kernel of one block, of a cluster of 8 blocks, or of 8 blocks; the fold,
    no middle: gemv_fold.cuh, and for timing its halves alone, A's epilogue or B's reading) costs at a boundary of the step (openjet_test_bench_pack_chain)."""
    if middle not in PACK_CHAIN_MODES:
        raise ValueError(f"middle must be one of {', '.join(PACK_CHAIN_MODES)}, got {middle!r}")
    lib = _lib()
    raw, n = _weights(qtype, w, k)
    if n != k:
        raise ValueError(f"bench_pack_chain takes a square matrix, got {n} x {k}")
    us = np.empty(runs, np.float32)
    _check(lib, lib.openjet_test_bench_pack_chain(qtype, _ptr(raw), k, t, PACK_CHAIN_MODES[middle], copies, reps,
                                                  runs, _ptr(us)), "bench_pack_chain")
    return [float(v) for v in us]


def _fold_rows(t: int, n: int, norm_w) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The norm's weights checked as [n] float32, and host arrays for what a fold leaves of t rows of n: h_out, u,
    part [t, n / 16, 4], the normed rows a and the pack (xh, xsum, xinv: pack_arrays)."""
    norm_w = _f32(norm_w, 1)
    if norm_w.shape != (n,):
        raise ValueError(f"norm_w must be [{n}], got {list(norm_w.shape)}")
    out = {"h_out": np.empty((t, n), np.float32), "u": np.empty((t, n), np.float32),
           "part": np.empty((t, n // 16, 4), np.float32), "a": np.empty((t, n), np.float32)}
    out["xh"], out["xsum"], out["xinv"] = pack_arrays(t, n)
    return norm_w, out


def gemv_fold(qtype: int, wa, wb, x, h, norm_w, eps: float = 1e-6, rows: bool = False,
              grid_sms: int = 0) -> dict[str, np.ndarray]:
    """The fold (gemv_fold.cuh, an experiment; Q4_K, Q5_K or Q6_K, a 90a build on 9.0) between two decode GEMVs: A
    (wa [n, ka]) over x [t, ka] ends its tiles with h + y -> h_out, u = h_out * norm_w and each 16-row tile's partials
    (q, m, s, 0); B (wb [nb, n]) reads a pack made from u and the partials alone (at t = 1 in each block's shared
    memory, else by launch_fold_pack, or with `rows` by B's own first t blocks: OPENJET_FOLD_ROWS). grid_sms: both
    GEMVs' grids sized for that many SMs (0: all). Returns h_out, u [t, n], part [t, n / 16, 4], y [t, nb]
    (B's output) and scales [t, 2] (B's rows' c and inv); what B leaves for the kernels after it: a [t, n] (the normed
    rows fl(u r)) and its pack (xh, xsum, xinv: pack_arrays)."""
    lib = _lib()
    x, h = _f32(x, 2), _f32(h, 2)
    t, ka = x.shape
    raw_a, n = _weights(qtype, wa, ka)
    raw_b, nb = _weights(qtype, wb, n)
    if h.shape != (t, n):
        raise ValueError(f"h must be [{t}, {n}], got {list(h.shape)}")
    norm_w, out = _fold_rows(t, n, norm_w)
    out["y"], out["scales"] = np.empty((t, nb), np.float32), np.empty((t, 2), np.float32)
    _check(lib, lib.openjet_test_gemv_fold(qtype, _ptr(raw_a), n, ka, _ptr(raw_b), nb, _ptr(x), t, _ptr(h),
                                           _ptr(norm_w), eps,
                                           *(_ptr(out[k]) for k in ("h_out", "u", "part", "y", "scales", "a", "xh",
                                                                    "xsum", "xinv")), int(rows), grid_sms), "gemv_fold")
    return out


def gemv_swiglu_rows(qtype: int, wa, g, up, h, norm_w, rows: bool, grid_sms: int = 0) -> dict[str, np.ndarray]:
    """The down projection's side of OPENJET_SWIGLU_ROWS (Q4_K, Q5_K or Q6_K, a 90a build on 9.0): A (wa [n, ka]) as
    the fold's A over h [t, n] and norm_w [n], its input the swiglu pack of g and up [t, ka], made by the swiglu pack
    launch before it (rows False) or by A's own first blocks (rows True, t > 1); grid_sms as gemv_fold's. Returns A's
    h_out, u [t, n], part [t, n / 16, 4] and the pack it read (xh, xsum, xinv: pack_arrays)."""
    lib = _lib()
    g, up, h = _f32(g, 2), _f32(up, 2), _f32(h, 2)
    t, ka = g.shape
    if up.shape != (t, ka):
        raise ValueError(f"up must be [{t}, {ka}], got {list(up.shape)}")
    raw_a, n = _weights(qtype, wa, ka)
    if h.shape != (t, n):
        raise ValueError(f"h must be [{t}, {n}], got {list(h.shape)}")
    norm_w, out = _fold_rows(t, n, norm_w)
    del out["a"]
    out["xh"], out["xsum"], out["xinv"] = pack_arrays(t, ka)
    _check(lib, lib.openjet_test_gemv_swiglu_rows(qtype, _ptr(raw_a), n, ka, _ptr(g), _ptr(up), t, _ptr(h),
                                                  _ptr(norm_w), int(rows), grid_sms,
                                                  *(_ptr(out[k]) for k in ("h_out", "u", "part", "xh", "xsum", "xinv"))),
           "gemv_swiglu_rows")
    return out


def fold_add_norm_pack(h, delta, norm_w, eps: float = 1e-6) -> dict[str, np.ndarray]:
    """A prefill's add-norm on the fold's numerics (launch_fold_add_norm_pack, a 90a build on 9.0): h [t, k] plus
    delta [t, k] (None: h is already the sum), then what gemv_fold's A and B make of that sum: h_out, u, part, the
    normed rows a and the pack (xh, xsum, xinv), under the same names."""
    lib = _lib()
    h = _f32(h, 2)
    t, k = h.shape
    if delta is not None:
        delta = _f32(delta, 2)
        if delta.shape != (t, k):
            raise ValueError(f"delta must be [{t}, {k}], got {list(delta.shape)}")
    norm_w, out = _fold_rows(t, k, norm_w)
    _check(lib, lib.openjet_test_fold_add_norm_pack(_ptr(h), None if delta is None else _ptr(delta), _ptr(norm_w), t,
                                                    k, eps, *(_ptr(out[n]) for n in ("h_out", "u", "part", "a", "xh",
                                                                                     "xsum", "xinv"))),
           "fold_add_norm_pack")
    return out


# ------------------------------------------------------------------------------ the integer GEMV (experiment)

IMMA_QTYPES = (12, 14)  # Q4_K, Q6_K


def _lib_imma() -> ctypes.CDLL:
    return _bind("integer GEMV test API", {
        "gemv_imma": [_I, _P, _I, _I, _P, _I, _I, _I, _I, _P],
        "gemv_imma_from_pack": [_I, _P, _I, _I, _P, _I, _I, _P],
        "bench_gemv_imma": [_I, _P, _I, _I, _I, _I, _I, _I, _I, _I, _I, _P],
    })


def gemv_imma(qtype: int, w, x, stages: int = 0, persistent: int = 0, tiled: bool = False) -> np.ndarray:
    """y [t, n] = W x on the integer tensor cores (native/src/gemv_imma.cuh: x as int16 per 256-block in two int8
    digits), t = 1..8; stages: its cp.async depth (0: default); persistent: 1 (or True) a grid of the blocks the GPU
    holds, 2 the producer-warp form (launch_gemv_tma_imma; tiled only, stages unused); tiled: W moved into the tile
    layout on the device first (weight_layout.cuh; n % 16 == 0)."""
    lib = _lib_imma()
    x = _f32(x, 2)
    t, k = x.shape
    raw, n = _weights(qtype, w, k)
    y = np.empty((t, n), np.float32)
    _check(lib, lib.openjet_test_gemv_imma(qtype, _ptr(raw), n, k, _ptr(x), t, stages, int(persistent), int(tiled),
                                           _ptr(y)), "gemv_imma")
    return y


def gemv_imma_from_pack(qtype: int, w, x, tiled: bool = False) -> np.ndarray:
    """The integer GEMV as the engine runs it under OPENJET_GEMV_INT: x packed as the fp16 GEMV's pack first (its
    fp16 rounding kept), the integer pack made from that (openjet_test_gemv_imma_from_pack)."""
    lib = _lib_imma()
    x = _f32(x, 2)
    t, k = x.shape
    raw, n = _weights(qtype, w, k)
    y = np.empty((t, n), np.float32)
    _check(lib, lib.openjet_test_gemv_imma_from_pack(qtype, _ptr(raw), n, k, _ptr(x), t, int(tiled), _ptr(y)),
           "gemv_imma_from_pack")
    return y


def bench_gemv_imma(qtype: int, w, k: int, t: int, copies: int, reps: int, runs: int, stages: int = 0,
                    persistent: int = 0, tiled: bool = False) -> list[float]:
    """Microseconds per integer GEMV call, one figure per run (as bench_gemv; persistent as gemv_imma's; tiled: the
    weights in the tile layout)."""
    lib = _lib_imma()
    raw, n = _weights(qtype, w, k)
    us = np.empty(runs, np.float32)
    _check(lib, lib.openjet_test_bench_gemv_imma(qtype, _ptr(raw), n, k, t, stages, int(persistent), int(tiled), copies,
                                                 reps, runs, _ptr(us)),
           "bench_gemv_imma")
    return [float(v) for v in us]
