"""Element-wise and normalisation ops of the qwen35 forward (qwen38.md §3), float32 in and out.

Conventions are the GGUF ones: every RMSNorm weight is used as stored (the file holds 1+w where HF
holds w), ``ssm_a`` is already -exp(A_log).
"""

from __future__ import annotations

import numpy as np

SOFTPLUS_THRESHOLD = 20.0     # PyTorch's F.softplus: the identity above it


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """y = x * (mean(x^2) + eps)^-1/2 * w over the last axis (plain-w ggml form)."""
    ms = np.mean(np.square(x), axis=-1, keepdims=True)
    return x * (1.0 / np.sqrt(ms + np.float32(eps))) * w


def l2_normalize(x: np.ndarray, eps: float) -> np.ndarray:
    """x * (sum(x^2) + eps)^-1/2 over the last axis: HF's/FLA's form (ggml's is x / max(|x|, eps); for
    |x|^2 >> eps the two differ by about eps / (2 |x|^2) relative)."""
    return x * (1.0 / np.sqrt(np.sum(np.square(x), axis=-1, keepdims=True) + np.float32(eps)))


def sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):          # exp(-x) -> inf for x < -88 gives the right limit 0
        return 1.0 / (1.0 + np.exp(-x))


def silu(x: np.ndarray) -> np.ndarray:
    return x * sigmoid(x)


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + e^x), the identity above 20 (PyTorch's threshold)."""
    return np.where(x > SOFTPLUS_THRESHOLD, x, np.log1p(np.exp(np.minimum(x, SOFTPLUS_THRESHOLD))))


def softmax(x: np.ndarray) -> np.ndarray:
    """Over the last axis; -inf entries get probability 0."""
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def rope_tables(positions: np.ndarray, n_rot: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [T, n_rot/2] of theta_i = pos * base^(-2i/n_rot). Angles in float64, then rounded:
    text-only positions make interleaved M-RoPE (all three axes = the position) plain partial RoPE."""
    half = n_rot // 2
    inv_freq = base ** (-np.arange(half, dtype=np.float64) / half)
    angle = np.asarray(positions, np.float64)[:, None] * inv_freq
    return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """NeoX rotation of the first n_rot dims of x [T, heads, head_dim], pairs (i, i + n_rot/2);
    the other dims pass through."""
    half = cos.shape[-1]
    c, s = cos[:, None, :], sin[:, None, :]
    x1, x2 = x[..., :half], x[..., half:2 * half]
    out = x.copy()
    out[..., :half] = x1 * c - x2 * s
    out[..., half:2 * half] = x1 * s + x2 * c
    return out


def swiglu(x: np.ndarray, gate_up: np.ndarray, down: np.ndarray) -> np.ndarray:
    """down(silu(gate x) * up x), with gate ‖ up fused into one [n_embd, 2 n_ff] matrix."""
    gu = x @ gate_up
    n_ff = gu.shape[-1] // 2
    return (silu(gu[..., :n_ff]) * gu[..., n_ff:]) @ down
