"""The MTP ("nextn") head, blk.{n_layer} (qwen38.md §3.3).

For a pair (x_{t+1}, h_t), h_t the trunk's post-output_norm hidden state at position t:
    c  = [rms(E[x_{t+1}], enorm) ‖ rms(h_t, hnorm)]          (embedding half first)
    u  = eh_proj c
    u += Attn(rms(u, attn_norm))                              (one gated-attention layer, own KV cache)
    u += FFN(rms(u, post_attention_norm))
    h' = rms(u, shared_head_norm);  logits = output h'        (shared lm_head), predicting x_{t+2}
The layer is the head's first and only one, so its KV entries depend on its input alone: filling the
cache for the verified pairs needs eh_proj and the k/v projections, not the attention or the FFN.
"""

from __future__ import annotations

import numpy as np

from ..model.shape import ModelShape
from .attention import KVCache, attention_mixer, project_kv
from .ops import rms_norm, rope_tables, swiglu
from .weights import MTPWeights


def mtp_input(m: MTPWeights, s: ModelShape, token_embd: np.ndarray, tokens: np.ndarray,
              hidden: np.ndarray) -> np.ndarray:
    """u = eh_proj [rms(E[x], enorm) ‖ rms(h, hnorm)] for pairs (tokens [T], hidden [T, n_embd])."""
    c = np.concatenate([rms_norm(token_embd[tokens], m.enorm, s.rms_eps),
                        rms_norm(hidden, m.hnorm, s.rms_eps)], axis=-1)
    return c @ m.eh_proj


def mtp_fill(m: MTPWeights, s: ModelShape, token_embd: np.ndarray, tokens: np.ndarray, hidden: np.ndarray,
             positions: np.ndarray, cache: KVCache) -> None:
    """Append the cache entries of the pairs (tokens[i], hidden[i]) at ``positions``."""
    a = rms_norm(mtp_input(m, s, token_embd, tokens, hidden), m.attn.norm, s.rms_eps)
    cos, sin = rope_tables(positions, s.n_rot, s.rope_base)
    cache.append(*project_kv(m.attn, s, a, cos, sin))


def mtp_forward(m: MTPWeights, s: ModelShape, token_embd: np.ndarray, output: np.ndarray, tokens: np.ndarray,
                hidden: np.ndarray, positions: np.ndarray, cache: KVCache) -> tuple[np.ndarray, np.ndarray]:
    """The whole head over pairs at ``positions`` (appending their entries to ``cache``):
    (h' [T, n_embd], logits [T, n_vocab])."""
    u = mtp_input(m, s, token_embd, tokens, hidden)
    u = u + attention_mixer(m.attn, s, rms_norm(u, m.attn.norm, s.rms_eps), cache, positions)
    u = u + swiglu(rms_norm(u, m.ffn.norm, s.rms_eps), m.ffn.gate_up, m.ffn.down)
    h = rms_norm(u, m.head_norm, s.rms_eps)
    return h, h @ output
