"""Gated DeltaNet mixer (qwen38.md §3.1) with its two algorithms for the delta rule: the per-token
recurrence (decode) and the chunked WY / UT-transform form (prefill, §3.4).

Heads are in GGUF ("tiled") order: value head v reads key head v mod n_k_heads. The recurrent state is
S[v][k][v_dim] in float32 (HF's layout: S^T k sums over the middle axis).

The delta rule per value head, token t (§3.4's check):
    S_t = e^{g_t} (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = S_t^T q_t
"""

from __future__ import annotations

import math

import numpy as np

from ..model.shape import ModelShape
from .ops import l2_normalize, rms_norm, sigmoid, silu, softplus
from .weights import GDNWeights


def causal_conv(x: np.ndarray, conv_state: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Depthwise causal conv over [conv_state ‖ x]: out_t = sum_j w[j] * x_{t-K+1+j} (tap K-1 = the current
    token). x [T, C] raw projections, conv_state [K-1, C] the previous K-1 raw inputs, w [K, C].
    Returns (out [T, C] before the silu, the new conv state = the last K-1 raw inputs)."""
    kernel, n = len(w), len(x)
    xs = np.concatenate([conv_state, x])
    out = xs[0:n] * w[0]
    for j in range(1, kernel):
        out += xs[j:j + n] * w[j]
    return out, xs[len(xs) - (kernel - 1):]


def delta_rule_recurrent(q: np.ndarray, k: np.ndarray, v: np.ndarray, beta: np.ndarray, g: np.ndarray,
                         state: np.ndarray) -> np.ndarray:
    """One token at a time (§3.1 step 6). q, k [T, H, d_k] (q already scaled), v [T, H, d_v], beta and
    g [T, H]; ``state`` [H, d_k, d_v] is updated in place. Returns o [T, H, d_v]."""
    decay = np.exp(g)
    o = np.empty_like(v)
    for t in range(len(q)):
        state *= decay[t][:, None, None]
        kt = k[t][:, None, :]                                   # [H, 1, d_k]
        delta = beta[t][:, None] * (v[t] - (kt @ state)[:, 0])  # beta (v - S^T k)
        state += k[t][:, :, None] * delta[:, None, :]           # S += k delta^T
        o[t] = (q[t][:, None, :] @ state)[:, 0]                 # S^T q
    return o


def delta_rule_chunked(q: np.ndarray, k: np.ndarray, v: np.ndarray, beta: np.ndarray, g: np.ndarray,
                       state: np.ndarray, chunk_size: int) -> np.ndarray:
    """The same map, C = ``chunk_size`` tokens at a time (§3.4). Chunk-local quantities for all chunks at
    once; only the state recurrence across chunks is a loop. ``state`` is updated in place."""
    n_tok, n_head, d_v = v.shape
    c = chunk_size
    n_chunk = -(-n_tok // c)
    pad = n_chunk * c - n_tok

    def chunked(x: np.ndarray) -> np.ndarray:          # [T, H, ...] -> [H, n_chunk, C, ...]; zero padding
        x = np.moveaxis(x, 0, 1)                        # (beta = g = 0 there: the state is left unchanged)
        if pad:
            x = np.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        return x.reshape(n_head, n_chunk, c, *x.shape[2:])

    q, k, v, beta, g = (chunked(x) for x in (q, k, v, beta, g))
    gamma = np.cumsum(g, axis=-1)                                   # gamma_t = sum_{s<=t} g_s
    gamma_end = gamma[..., -1]                                      # Gamma = gamma_C
    causal = np.tril(np.ones((c, c), dtype=bool))
    decay = np.exp(np.where(causal, gamma[..., :, None] - gamma[..., None, :], -np.inf))   # D, masked before exp
    kk = k @ np.swapaxes(k, -1, -2)
    lower = np.tril(beta[..., :, None] * kk * decay, -1)            # L_ij = beta_i (k_i . k_j) D_ij, i > j
    # (I + L) [U | W] = [beta V | beta e^gamma K]; |L_ij| < 1 on a unit diagonal, so LAPACK's pivoting
    # never swaps rows and this is forward substitution.
    rhs = np.concatenate([beta[..., None] * v, (beta * np.exp(gamma))[..., None] * k], axis=-1)
    uw = np.linalg.solve(lower + np.eye(c, dtype=np.float32), rhs)
    u, w = uw[..., :d_v], uw[..., d_v:]
    qk = (q @ np.swapaxes(k, -1, -2)) * decay                       # (Q K^T) ⊙ D, diagonal included
    q_decayed = q * np.exp(gamma)[..., None]                         # Q ⊙ e^gamma
    k_decayed = k * np.exp(gamma_end[..., None] - gamma)[..., None]  # K ⊙ e^(Gamma - gamma)

    o = np.empty_like(u)
    for i in range(n_chunk):
        v_new = u[:, i] - w[:, i] @ state                          # V' = U - W S: the effective writes
        o[:, i] = q_decayed[:, i] @ state + qk[:, i] @ v_new
        state *= np.exp(gamma_end[:, i])[:, None, None]
        state += np.swapaxes(k_decayed[:, i], -1, -2) @ v_new      # S' = e^Gamma S + (K ⊙ e^(Gamma-gamma))^T V'
    return np.moveaxis(o.reshape(n_head, n_chunk * c, d_v)[:, :n_tok], 0, 1)


def gdn_mixer(w: GDNWeights, s: ModelShape, a: np.ndarray, conv_state: np.ndarray, ssm_state: np.ndarray,
              chunk_size: int | None) -> np.ndarray:
    """The mixer over tokens a [T, n_embd] (already attn_norm'ed). ``conv_state`` [K-1, conv_dim] and
    ``ssm_state`` [n_v, d, d] are updated in place. ``chunk_size`` None: the recurrence; else chunked."""
    n_tok, d, n_k, n_v = len(a), s.ssm_head_dim, s.ssm_n_k_heads, s.ssm_n_v_heads
    key_dim, conv_dim, d_inner = s.ssm_key_dim, s.ssm_conv_dim, s.ssm_d_inner
    proj = a @ w.w_in                                               # qkv ‖ z ‖ b ‖ alpha
    qkv = proj[:, :conv_dim]
    z = proj[:, conv_dim:conv_dim + d_inner].reshape(n_tok, n_v, d)
    b = proj[:, conv_dim + d_inner:conv_dim + d_inner + n_v]
    alpha = proj[:, conv_dim + d_inner + n_v:]

    conv_out, conv_state[...] = causal_conv(qkv, conv_state, w.conv)   # on all channels, before the split
    x = silu(conv_out)
    q = l2_normalize(x[:, :key_dim].reshape(n_tok, n_k, d), s.rms_eps) * np.float32(1.0 / math.sqrt(d))
    k = l2_normalize(x[:, key_dim:2 * key_dim].reshape(n_tok, n_k, d), s.rms_eps)
    v = x[:, 2 * key_dim:].reshape(n_tok, n_v, d)
    r = n_v // n_k
    q, k = np.tile(q, (1, r, 1)), np.tile(k, (1, r, 1))             # tiled: value head v reads key head v mod n_k
    beta = sigmoid(b)
    g = w.ssm_a * softplus(alpha + w.dt_bias)                       # ssm_a = -exp(A_log): g <= 0

    if chunk_size is None:
        o = delta_rule_recurrent(q, k, v, beta, g, ssm_state)
    else:
        o = delta_rule_chunked(q, k, v, beta, g, ssm_state, chunk_size)
    y = rms_norm(o, w.ssm_norm, s.rms_eps) * silu(z)                # per-head gated RMSNorm, plain w
    return y.reshape(n_tok, d_inner) @ w.w_out
