"""Every tensor a qwen35 file holds, with its ggml shape and its role, in file order.

Roles group tensors that a quantisation recipe treats alike (qwen38.md §2.2); the recipes in
``recipe.py`` map roles to types. Shapes are ggml ``ne``: ne[0] is the input dimension.
"""

from __future__ import annotations

from dataclasses import dataclass

from .shape import ModelShape


@dataclass(frozen=True)
class TensorSpec:
    name: str
    ne: tuple[int, ...]
    role: str
    block: int | None = None     # blk.N index, None for global tensors


# Roles whose tensors are small vectors or F32 matrices in every recipe we run.
VECTOR_ROLES = frozenset({"norm", "ssm_conv1d", "ssm_dt", "ssm_a", "ssm_norm"})


def _gdn_block(s: ModelShape, b: int) -> list[TensorSpec]:
    e, conv, vi, nv = s.n_embd, s.ssm_conv_dim, s.ssm_d_inner, s.ssm_n_v_heads
    p = f"blk.{b}."
    return [
        TensorSpec(p + "attn_norm.weight", (e,), "norm", b),
        TensorSpec(p + "attn_qkv.weight", (e, conv), "attn_qkv", b),
        TensorSpec(p + "attn_gate.weight", (e, vi), "attn_gate", b),
        TensorSpec(p + "ssm_alpha.weight", (e, nv), "ssm_alpha", b),
        TensorSpec(p + "ssm_beta.weight", (e, nv), "ssm_beta", b),
        TensorSpec(p + "ssm_conv1d.weight", (s.ssm_conv_kernel, conv), "ssm_conv1d", b),
        TensorSpec(p + "ssm_dt.bias", (nv,), "ssm_dt", b),
        TensorSpec(p + "ssm_a", (nv,), "ssm_a", b),
        TensorSpec(p + "ssm_norm.weight", (s.ssm_head_dim,), "ssm_norm", b),
        TensorSpec(p + "ssm_out.weight", (vi, e), "ssm_out", b),
    ]


def _attention_block(s: ModelShape, b: int) -> list[TensorSpec]:
    e, p = s.n_embd, f"blk.{b}."
    return [
        TensorSpec(p + "attn_norm.weight", (e,), "norm", b),
        TensorSpec(p + "attn_q.weight", (e, 2 * s.q_dim), "attn_q", b),   # per head [query 256 | gate 256]
        TensorSpec(p + "attn_k.weight", (e, s.kv_dim), "attn_k", b),
        TensorSpec(p + "attn_v.weight", (e, s.kv_dim), "attn_v", b),
        TensorSpec(p + "attn_q_norm.weight", (s.head_dim,), "norm", b),
        TensorSpec(p + "attn_k_norm.weight", (s.head_dim,), "norm", b),
        TensorSpec(p + "attn_output.weight", (s.q_dim, e), "attn_output", b),
    ]


def _ffn(s: ModelShape, b: int) -> list[TensorSpec]:
    e, f, p = s.n_embd, s.n_ff, f"blk.{b}."
    return [
        TensorSpec(p + "post_attention_norm.weight", (e,), "norm", b),
        TensorSpec(p + "ffn_gate.weight", (e, f), "ffn_gate", b),
        TensorSpec(p + "ffn_up.weight", (e, f), "ffn_up", b),
        TensorSpec(p + "ffn_down.weight", (f, e), "ffn_down", b),
    ]


def _mtp_extra(s: ModelShape, b: int) -> list[TensorSpec]:
    e, p = s.n_embd, f"blk.{b}.nextn."
    return [
        TensorSpec(p + "eh_proj.weight", (2 * e, e), "eh_proj", b),   # input = [embedding ‖ hidden]
        TensorSpec(p + "enorm.weight", (e,), "norm", b),
        TensorSpec(p + "hnorm.weight", (e,), "norm", b),
        TensorSpec(p + "shared_head_norm.weight", (e,), "norm", b),
    ]


def expected_tensors(s: ModelShape, with_mtp: bool = True) -> list[TensorSpec]:
    """The tensors of a file of shape ``s`` in the order our writer stores them."""
    out = [TensorSpec("token_embd.weight", (s.n_embd, s.n_vocab), "token_embd")]
    for b in range(s.n_layer):
        mixer = _attention_block(s, b) if s.is_attention_layer(b) else _gdn_block(s, b)
        out += mixer + _ffn(s, b)
    if with_mtp:
        for b in range(s.n_layer, s.n_block):
            out += _attention_block(s, b) + _ffn(s, b) + _mtp_extra(s, b)
    out += [TensorSpec("output_norm.weight", (s.n_embd,), "norm"),
            TensorSpec("output.weight", (s.n_embd, s.n_vocab), "output")]
    return out
