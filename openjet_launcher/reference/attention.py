"""Gated full attention (qwen38.md §3.2) and its KV cache.

q rows of attn_q are interleaved per head [query | gate]; q and k get the per-head RMSNorm, then partial
NeoX RoPE on the first n_rot dims; GQA: query head h reads kv head h div (n_head / n_head_kv); scale
1/sqrt(head_dim); float32 softmax; the output is multiplied by sigmoid(gate) element-wise before
attn_output. The cache holds k after norm and RoPE, and raw v.
"""

from __future__ import annotations

import math

import numpy as np

from ..model.shape import ModelShape
from .ops import apply_rope, rms_norm, rope_tables, sigmoid, softmax
from .weights import AttentionWeights

QUERY_BLOCK = 256       # queries per score matrix: bounds a long prompt's [heads, T, n_ctx] scores


class KVCache:
    """Keys and values of one attention layer, [n_kv, capacity, head_dim] float32, grown by doubling."""

    def __init__(self, n_kv: int, head_dim: int):
        self.length = 0
        self.k = np.zeros((n_kv, 0, head_dim), np.float32)
        self.v = np.zeros((n_kv, 0, head_dim), np.float32)

    def append(self, k: np.ndarray, v: np.ndarray) -> None:
        """k, v [T, n_kv, head_dim], at cache positions length .. length+T-1."""
        end = self.length + len(k)
        if end > self.k.shape[1]:
            capacity = max(end, 2 * self.k.shape[1], 64)
            for name in ("k", "v"):
                old = getattr(self, name)
                new = np.zeros((old.shape[0], capacity, old.shape[2]), np.float32)
                new[:, :self.length] = old[:, :self.length]
                setattr(self, name, new)
        self.k[:, self.length:end] = np.swapaxes(k, 0, 1)
        self.v[:, self.length:end] = np.swapaxes(v, 0, 1)
        self.length = end

    def truncate(self, n: int) -> None:
        self.length = min(self.length, n)

    def keys(self) -> np.ndarray:
        return self.k[:, :self.length]

    def values(self) -> np.ndarray:
        return self.v[:, :self.length]

    def copy(self) -> "KVCache":
        out = KVCache.__new__(KVCache)
        out.length, out.k, out.v = self.length, self.k.copy(), self.v.copy()
        return out

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


def project_kv(w: AttentionWeights, s: ModelShape, a: np.ndarray, cos: np.ndarray,
               sin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cache entries of tokens a [T, n_embd] (attn_norm'ed): k (normed, rotated) and v, [T, n_kv, head_dim]."""
    kv = (a @ w.w_kv).reshape(len(a), 2, s.n_head_kv, s.head_dim)
    return apply_rope(rms_norm(kv[:, 0], w.k_norm, s.rms_eps), cos, sin), kv[:, 1]


def attend(q: np.ndarray, keys: np.ndarray, values: np.ndarray, n_past: int, s: ModelShape) -> np.ndarray:
    """Causal GQA attention of q [T, n_head, head_dim] at cache positions n_past.. over keys/values
    [n_kv, n_past + T, head_dim]. Returns [T, n_head * head_dim]."""
    n_tok, n_ctx, hd = len(q), keys.shape[1], s.head_dim
    group = s.n_head // s.n_head_kv
    qh = q.reshape(n_tok, s.n_head_kv, group, hd).transpose(1, 2, 0, 3).reshape(s.n_head_kv, group * n_tok, hd)
    scores = (qh @ np.swapaxes(keys, 1, 2)).reshape(s.n_head_kv, group, n_tok, n_ctx)
    scores *= np.float32(1.0 / math.sqrt(hd))
    if n_tok > 1:
        future = np.arange(n_ctx)[None, :] > (n_past + np.arange(n_tok))[:, None]
        scores[..., future] = -np.inf
    prob = softmax(scores).reshape(s.n_head_kv, group * n_tok, n_ctx)
    out = (prob @ values).reshape(s.n_head_kv, group, n_tok, hd)
    return out.transpose(2, 0, 1, 3).reshape(n_tok, s.n_head * hd)


def attention_mixer(w: AttentionWeights, s: ModelShape, a: np.ndarray, cache: KVCache,
                    positions: np.ndarray) -> np.ndarray:
    """The mixer over tokens a [T, n_embd] (attn_norm'ed) at ``positions``; appends their entries to ``cache``."""
    n_tok, hd = len(a), s.head_dim
    cos, sin = rope_tables(positions, s.n_rot, s.rope_base)
    qg = (a @ w.w_q).reshape(n_tok, s.n_head, 2, hd)                 # per head [query | gate]
    q = apply_rope(rms_norm(qg[:, :, 0], w.q_norm, s.rms_eps), cos, sin)
    k, v = project_kv(w, s, a, cos, sin)
    n_past = cache.length
    cache.append(k, v)
    keys, values = cache.keys(), cache.values()
    o = np.concatenate([attend(q[i:i + QUERY_BLOCK], keys[:, :n_past + i + QUERY_BLOCK],
                               values[:, :n_past + i + QUERY_BLOCK], n_past + i, s)
                        for i in range(0, n_tok, QUERY_BLOCK)])
    return (o * sigmoid(qg[:, :, 1].reshape(n_tok, s.q_dim))) @ w.w_out
