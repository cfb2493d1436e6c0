"""ctypes binding of the GDN decode step's test-only C API (native/include/openjet_test_gdn.h), for
tests/test_gpu_gdn.py and native/bench/bench_gdn.py.

Layouts (float32): qkv [t, conv_dim], z [t, n_v*128], b and alpha [t, n_v], conv_w [conv_dim, 4] (the
reference's causal_conv takes its transpose [4, conv_dim]), conv state [3, conv_dim] oldest first, state
[n_v, 128 (k), 128 (v)] (the reference's layout), y [t, n_v*128]. t = 1..8.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..errors import OpenJetError
from .native import load_library

HEAD_DIM = 128
MAX_T = 8

_P = ctypes.c_void_p
_I = ctypes.c_int
_F = ctypes.c_float
_declared: set[int] = set()


def _lib() -> ctypes.CDLL:
    lib = load_library()
    if id(lib) in _declared:
        return lib
    try:
        lib.openjet_test_gdn_last_error.argtypes = []
        lib.openjet_test_gdn_last_error.restype = ctypes.c_char_p
        lib.openjet_test_gdn_step.argtypes = [_I, _I, _I, _F] + [_P] * 12
        lib.openjet_test_gdn_step.restype = _I
        lib.openjet_test_bench_gdn.argtypes = [_I, _I, _I, _I, _I, _I, _P]
        lib.openjet_test_bench_gdn.restype = _I
    except AttributeError as e:
        raise OpenJetError(f"the engine library has no GDN test API (missing {e}): rebuild it") from e
    _declared.add(id(lib))
    return lib


def _check(lib: ctypes.CDLL, status: int, what: str) -> None:
    if status != 0:
        msg = lib.openjet_test_gdn_last_error().decode("utf-8", errors="replace")
        raise OpenJetError(f"{what} failed (status {status}): {msg}")


def _f32(x, shape: tuple[int, ...], name: str) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape != shape:
        raise ValueError(f"{name} has shape {x.shape}, expected {shape}")
    return x


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    return a.ctypes.data_as(ctypes.c_void_p)


def gdn_step(n_k: int, n_v: int, qkv, z, b, alpha, conv_w, conv_state, ssm_a, dt_bias, norm_w, state,
             eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One GDN decode step over t = len(qkv) tokens. Returns (y [t, n_v*128], new conv state [3, conv_dim],
    new state [n_v, 128, 128]); the arguments are left unchanged."""
    lib = _lib()
    d = HEAD_DIM
    conv_dim, vd = (2 * n_k + n_v) * d, n_v * d
    qkv = np.ascontiguousarray(qkv, dtype=np.float32)
    if qkv.ndim != 2:
        raise ValueError(f"qkv must be [t, conv_dim], got shape {qkv.shape}")
    t = qkv.shape[0]
    qkv = _f32(qkv, (t, conv_dim), "qkv")
    z = _f32(z, (t, vd), "z")
    b = _f32(b, (t, n_v), "b")
    alpha = _f32(alpha, (t, n_v), "alpha")
    conv_w = _f32(conv_w, (conv_dim, 4), "conv_w")
    cs_in = _f32(conv_state, (3, conv_dim), "conv_state")
    ssm_a = _f32(ssm_a, (n_v,), "ssm_a")
    dt_bias = _f32(dt_bias, (n_v,), "dt_bias")
    norm_w = _f32(norm_w, (d,), "norm_w")
    s = _f32(state, (n_v, d, d), "state").copy()
    cs_out = np.empty_like(cs_in)
    y = np.empty((t, vd), np.float32)
    _check(lib, lib.openjet_test_gdn_step(n_k, n_v, t, eps, *map(_ptr, (qkv, z, b, alpha, conv_w, cs_in, cs_out,
                                                                        ssm_a, dt_bias, norm_w, s, y))), "gdn_step")
    return y, cs_out, s


def bench_gdn(n_k: int, n_v: int, t: int, copies: int, reps: int, runs: int) -> list[float]:
    """Microseconds per step, one figure per run (see openjet_test_bench_gdn)."""
    lib = _lib()
    us = np.empty(runs, np.float32)
    _check(lib, lib.openjet_test_bench_gdn(n_k, n_v, t, copies, reps, runs, _ptr(us)), "bench_gdn")
    return [float(v) for v in us]
