"""ctypes binding of the GDN decode step's test-only C API (native/include/openjet_test_gdn.h), for
tests/test_gpu_gdn.py and native/bench/bench_gdn.py.

Layouts (float32): qkv [t, conv_dim], z [t, n_v*128], b and alpha [t, n_v], conv_w [conv_dim, 4] (the
reference's causal_conv takes its transpose [4, conv_dim]), conv state [3, conv_dim] oldest first, state
[n_v, 128 (k), 128 (v)] (the reference's layout), y [t, n_v*128]. t = 1..8192.
"""

from __future__ import annotations

import ctypes

import numpy as np

from .kernels_test import _F, _I, _P, _bind, _check, _f32_shaped, _ptr, pack_arrays

HEAD_DIM = 128
MAX_T = 8


def _lib() -> ctypes.CDLL:
    return _bind("GDN test API", {"gdn_step": [_I, _I, _I, _F] + [_P] * 12,
                                  "gdn_step_replay": [_I] * 5 + [_F] + [_P] * 12,
                                  "gdn_step_bounded_pack": [_I, _I, _I, _F] + [_P] * 14,
                                  "bench_gdn": [_I, _I, _I, _I, _I, _I, _P],
                                  "gdn_probe": [_I, _I, _P, _P, _P]})


def _step_inputs(n_k: int, n_v: int, qkv, z, b, alpha, conv_w, conv_state, ssm_a, dt_bias, norm_w, state):
    """The step's arguments as contiguous float32 arrays of their shapes (ValueError naming a wrong one):
    (t, qkv, z, b, alpha, conv_w, conv_state, ssm_a, dt_bias, norm_w, state)."""
    d = HEAD_DIM
    conv_dim, vd = (2 * n_k + n_v) * d, n_v * d
    qkv = np.ascontiguousarray(qkv, dtype=np.float32)
    if qkv.ndim != 2:
        raise ValueError(f"qkv must be [t, conv_dim], got shape {qkv.shape}")
    t = qkv.shape[0]
    qkv = _f32_shaped(qkv, (t, conv_dim), "qkv")
    z = _f32_shaped(z, (t, vd), "z")
    b = _f32_shaped(b, (t, n_v), "b")
    alpha = _f32_shaped(alpha, (t, n_v), "alpha")
    conv_w = _f32_shaped(conv_w, (conv_dim, 4), "conv_w")
    cs_in = _f32_shaped(conv_state, (3, conv_dim), "conv_state")
    ssm_a = _f32_shaped(ssm_a, (n_v,), "ssm_a")
    dt_bias = _f32_shaped(dt_bias, (n_v,), "dt_bias")
    norm_w = _f32_shaped(norm_w, (d,), "norm_w")
    return t, qkv, z, b, alpha, conv_w, cs_in, ssm_a, dt_bias, norm_w, _f32_shaped(state, (n_v, d, d), "state")


def gdn_step(n_k: int, n_v: int, qkv, z, b, alpha, conv_w, conv_state, ssm_a, dt_bias, norm_w, state,
             eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One GDN decode step over t = len(qkv) tokens. Returns (y [t, n_v*128], new conv state [3, conv_dim],
    new state [n_v, 128, 128]); the arguments are left unchanged."""
    lib = _lib()
    t, qkv, z, b, alpha, conv_w, cs_in, ssm_a, dt_bias, norm_w, state = _step_inputs(
        n_k, n_v, qkv, z, b, alpha, conv_w, conv_state, ssm_a, dt_bias, norm_w, state)
    s = state.copy()
    cs_out = np.empty_like(cs_in)
    y = np.empty((t, n_v * HEAD_DIM), np.float32)
    _check(lib, lib.openjet_test_gdn_step(n_k, n_v, t, eps, *map(_ptr, (qkv, z, b, alpha, conv_w, cs_in, cs_out,
                                                                        ssm_a, dt_bias, norm_w, s, y))), "gdn_step")
    return y, cs_out, s


def gdn_step_replay(n_k: int, n_v: int, replay: int, commit: int, qkv, z, b, alpha, conv_w, conv_state, ssm_a,
                    dt_bias, norm_w, state, conv_state_out, eps: float = 1e-6
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The step with a fused replay (openjet_test_gdn_step_replay): qkv, b, alpha of replay + t rows, the first
    `replay` replayed from a ring, z of the t own rows; state and conv state written after `commit` rows (-1: all).
    Returns (y [t, n_v*128], conv_state_out (the given array's copy where nothing was written), state)."""
    lib = _lib()
    rows, qkv, _, b, alpha, conv_w, cs_in, ssm_a, dt_bias, norm_w, state = _step_inputs(
        n_k, n_v, qkv, np.zeros((len(qkv), n_v * HEAD_DIM), np.float32), b, alpha, conv_w, conv_state, ssm_a,
        dt_bias, norm_w, state)
    t = rows - replay
    z = _f32_shaped(z, (t, n_v * HEAD_DIM), "z")
    s, cs_out = state.copy(), _f32_shaped(conv_state_out, cs_in.shape, "conv_state_out").copy()
    y = np.empty((t, n_v * HEAD_DIM), np.float32)
    _check(lib, lib.openjet_test_gdn_step_replay(
        n_k, n_v, replay, t, commit, eps, *map(_ptr, (qkv, z, b, alpha, conv_w, cs_in, cs_out, ssm_a, dt_bias, norm_w,
                                                      s, y))), "gdn_step_replay")
    return y, cs_out, s


def gdn_step_bounded_pack(n_k: int, n_v: int, qkv, z, b, alpha, conv_w, conv_state, ssm_a, dt_bias, norm_w, state,
                          scales, eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same step (the two-phase chunked form) with its output packed under the row scales `scales` [t]
    (launch_gdn_step's bounded pack): (h uint16 [t, n_v*128], the pack's element order; sum uint16
    [t, n_v*128/32*2]; inv float32 [t]); the arguments are left unchanged."""
    lib = _lib()
    t, qkv, z, b, alpha, conv_w, cs_in, ssm_a, dt_bias, norm_w, state = _step_inputs(
        n_k, n_v, qkv, z, b, alpha, conv_w, conv_state, ssm_a, dt_bias, norm_w, state)
    scales = _f32_shaped(scales, (t,), "scales")
    vd = n_v * HEAD_DIM
    h, sums, inv = pack_arrays(t, vd)
    _check(lib, lib.openjet_test_gdn_step_bounded_pack(
        n_k, n_v, t, eps, *map(_ptr, (qkv, z, b, alpha, conv_w, cs_in, ssm_a, dt_bias, norm_w, state, scales, h,
                                      sums, inv))), "gdn_step_bounded_pack")
    return h, sums, inv


def bench_gdn(n_k: int, n_v: int, t: int, copies: int, reps: int, runs: int) -> list[float]:
    """Microseconds per step, one figure per run (see openjet_test_bench_gdn)."""
    lib = _lib()
    us = np.empty(runs, np.float32)
    _check(lib, lib.openjet_test_bench_gdn(n_k, n_v, t, copies, reps, runs, _ptr(us)), "bench_gdn")
    return [float(v) for v in us]


# GdnProbePoint's names, in order (gdn_decode.cuh): the phase that ends at each point.
GDN_PROBE_POINTS = ("entry", "waited", "projected", "loaded", "conv", "normed", "kq", "delta", "gated_norm",
                    "published", "met", "end")


def gdn_probe(blocks: int) -> dict:
    """What the last GDN step launched under OPENJET_BENCH_GDN_PROBE=1 recorded (openjet_test_gdn_probe) for its first
    `blocks` blocks: clock [blocks, 12] (each point's clock64, GDN_PROBE_POINTS' order), ns [blocks, 2] (the global
    timer at entry and end), sm [blocks]."""
    lib = _lib()
    clock = np.zeros((blocks, len(GDN_PROBE_POINTS)), np.int64)
    ns = np.zeros((blocks, 2), np.uint64)
    sm = np.zeros(blocks, np.uint32)
    _check(lib, lib.openjet_test_gdn_probe(blocks, len(GDN_PROBE_POINTS), _ptr(clock), _ptr(ns), _ptr(sm)),
           "gdn_probe")
    return {"clock": clock, "ns": ns, "sm": sm}
