"""The reference engine's weights: every tensor of the file dequantised once to float32 and laid out for
``x @ W`` (matrices transposed to [in, out], C-contiguous), projections that read the same input fused.

Memory: 4 bytes per weight. The tiny and small synthetic models take 36 MB and 600 MB; the real
Qwen3.8-27B (27.3 G weights) would need about 102 GiB of RAM, so the loader refuses files above a limit:
the reference engine is an oracle for test-size models, the GPU engine runs the real one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from ..errors import OpenJetError
from ..model import quants
from ..model.config import ModelConfig
from ..model.gguf_file import GGUFFile

DEFAULT_MAX_WEIGHT_BYTES = 16 << 30


@dataclass(frozen=True)
class FFNWeights:
    norm: np.ndarray            # post_attention_norm [n_embd]
    gate_up: np.ndarray         # [n_embd, 2 n_ff]: ffn_gate ‖ ffn_up
    down: np.ndarray            # [n_ff, n_embd]


@dataclass(frozen=True)
class GDNWeights:
    norm: np.ndarray            # attn_norm [n_embd]
    w_in: np.ndarray            # [n_embd, conv_dim + d_inner + 2 n_v]: attn_qkv ‖ attn_gate ‖ ssm_beta ‖ ssm_alpha
    conv: np.ndarray            # ssm_conv1d [kernel, conv_dim]; tap kernel-1 multiplies the current token
    dt_bias: np.ndarray         # ssm_dt.bias [n_v]
    ssm_a: np.ndarray           # -exp(A_log) [n_v]
    ssm_norm: np.ndarray        # gated-norm weight [head_dim], plain w
    w_out: np.ndarray           # ssm_out [d_inner, n_embd]


@dataclass(frozen=True)
class AttentionWeights:
    norm: np.ndarray            # attn_norm [n_embd]
    w_q: np.ndarray             # attn_q [n_embd, 2 q_dim]: per head [query | gate]
    w_kv: np.ndarray            # [n_embd, 2 kv_dim]: attn_k ‖ attn_v
    q_norm: np.ndarray          # [head_dim]
    k_norm: np.ndarray          # [head_dim]
    w_out: np.ndarray           # attn_output [q_dim, n_embd]


@dataclass(frozen=True)
class Layer:
    mixer: GDNWeights | AttentionWeights
    ffn: FFNWeights


@dataclass(frozen=True)
class MTPWeights:
    enorm: np.ndarray           # [n_embd]
    hnorm: np.ndarray           # [n_embd]
    eh_proj: np.ndarray         # [2 n_embd, n_embd]; input [embedding ‖ hidden]
    attn: AttentionWeights
    ffn: FFNWeights
    head_norm: np.ndarray       # shared_head_norm [n_embd]


@dataclass(frozen=True)
class ModelWeights:
    token_embd: np.ndarray      # [n_vocab, n_embd] (a row gather)
    layers: tuple[Layer, ...]
    output_norm: np.ndarray     # [n_embd]
    output: np.ndarray          # [n_embd, n_vocab]
    mtp: MTPWeights | None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in _arrays(self))


def float32_bytes(gguf: GGUFFile) -> int:
    """Bytes the file's tensors take once dequantised to float32."""
    return 4 * sum(math.prod(info.ne) for info in gguf.tensors.values())


def check_weight_budget(gguf: GGUFFile, max_bytes: int = DEFAULT_MAX_WEIGHT_BYTES) -> None:
    """OpenJetError when the file's weights as float32 pass max_bytes (before anything is read or built)."""
    need = float32_bytes(gguf)
    if need > max_bytes:
        raise OpenJetError(
            f"{gguf.path.name}: the numpy reference engine keeps every weight as float32 and would need "
            f"{need / 2**30:.1f} GiB (limit {max_bytes / 2**30:.1f} GiB). It is meant for test-size models: "
            f"run this file with the GPU engine (a program with the RAM may pass ReferenceEngine.load a larger "
            f"max_weight_bytes).")


def load_weights(gguf: GGUFFile, config: ModelConfig,
                 max_bytes: int = DEFAULT_MAX_WEIGHT_BYTES) -> ModelWeights:
    check_weight_budget(gguf, max_bytes)
    s = config.shape
    t = _Tensors(gguf)
    layers = tuple(
        Layer(_attention(t, f"blk.{il}.") if s.is_attention_layer(il) else _gdn(t, f"blk.{il}."),
              _ffn(t, f"blk.{il}."))
        for il in range(s.n_layer))
    mtp = None
    if config.has_mtp:
        p = f"blk.{s.n_layer}."
        mtp = MTPWeights(enorm=t.vector(p + "nextn.enorm.weight"), hnorm=t.vector(p + "nextn.hnorm.weight"),
                         eh_proj=t.matrix(p + "nextn.eh_proj.weight"), attn=_attention(t, p),
                         ffn=_ffn(t, p), head_norm=t.vector(p + "nextn.shared_head_norm.weight"))
    return ModelWeights(token_embd=t.rows("token_embd.weight"), layers=layers,
                        output_norm=t.vector("output_norm.weight"), output=t.matrix("output.weight"), mtp=mtp)


class _Tensors:
    def __init__(self, gguf: GGUFFile):
        self.gguf = gguf

    def rows(self, name: str) -> np.ndarray:
        """The tensor in numpy view [rows, ne0] (a GGUF matrix [in, out] is out rows of in values)."""
        info = self.gguf.tensors[name]
        x = quants.dequantize(self.gguf.raw(name), info.qtype).reshape(info.rows, info.ne[0])
        return np.array(x, dtype=np.float32)          # a copy: F32 tensors would otherwise stay memory-mapped

    def vector(self, name: str) -> np.ndarray:
        return self.rows(name).reshape(-1)

    def matrix(self, name: str) -> np.ndarray:
        """[in, out], for y = x @ W."""
        return np.ascontiguousarray(self.rows(name).T)

    def fused(self, *names: str) -> np.ndarray:
        return np.ascontiguousarray(np.concatenate([self.rows(n) for n in names], axis=0).T)


def _gdn(t: _Tensors, p: str) -> GDNWeights:
    return GDNWeights(
        norm=t.vector(p + "attn_norm.weight"),
        w_in=t.fused(p + "attn_qkv.weight", p + "attn_gate.weight", p + "ssm_beta.weight", p + "ssm_alpha.weight"),
        conv=t.matrix(p + "ssm_conv1d.weight"), dt_bias=t.vector(p + "ssm_dt.bias"), ssm_a=t.vector(p + "ssm_a"),
        ssm_norm=t.vector(p + "ssm_norm.weight"), w_out=t.matrix(p + "ssm_out.weight"))


def _attention(t: _Tensors, p: str) -> AttentionWeights:
    return AttentionWeights(
        norm=t.vector(p + "attn_norm.weight"), w_q=t.matrix(p + "attn_q.weight"),
        w_kv=t.fused(p + "attn_k.weight", p + "attn_v.weight"),
        q_norm=t.vector(p + "attn_q_norm.weight"), k_norm=t.vector(p + "attn_k_norm.weight"),
        w_out=t.matrix(p + "attn_output.weight"))


def _ffn(t: _Tensors, p: str) -> FFNWeights:
    return FFNWeights(norm=t.vector(p + "post_attention_norm.weight"),
                      gate_up=t.fused(p + "ffn_gate.weight", p + "ffn_up.weight"),
                      down=t.matrix(p + "ffn_down.weight"))


def _arrays(obj) -> list[np.ndarray]:
    if isinstance(obj, np.ndarray):
        return [obj]
    if isinstance(obj, tuple):
        return [a for x in obj for a in _arrays(x)]
    if obj is None:
        return []
    return [a for f in fields(obj) for a in _arrays(getattr(obj, f.name))]
