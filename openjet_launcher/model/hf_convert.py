"""transformers `Qwen3_5ForCausalLM` -> qwen35 GGUF, transforming tensors exactly as llama.cpp's converter does.

The tests' independent reference: a tiny random HF model is written as a GGUF file, and transformers then
computes with exactly the weights the file holds, so our engines can be compared with it value for value.

The transforms (qwen38.md §2.3; llama.cpp `conversion/qwen.py`: `Qwen3NextModel.modify_tensors`,
`_LinearAttentionVReorderBase.modify_tensors`, the MTP mixin's `filter_tensors`), in the converter's order:
  1. MTP remap: mtp.fc -> blk.{n_layer}.nextn.eh_proj, pre_fc_norm_embedding -> nextn.enorm,
     pre_fc_norm_hidden -> nextn.hnorm, mtp.norm -> nextn.shared_head_norm, mtp.layers.0.* -> blk.{n_layer}.*.
  2. V-head reorder, grouped (v = r*kh + j) -> tiled (v' = n_k*j + kh), so that key head = v' mod n_k: the
     v rows of in_proj_qkv, all rows of in_proj_z / in_proj_a / in_proj_b, A_log, dt_bias, the v channels
     of conv1d and the input columns of out_proj.
  3. A_log -> ssm_a = -exp(A_log) (with torch.exp, as the converter, so files agree bit for bit);
     dt_bias -> ssm_dt.bias; conv1d [C, 1, K] -> [C, K]; +1 on every `*norm.weight` except the GDN gated
     norm (linear_attn.norm -> ssm_norm), the MTP norms included since they are renamed first.
  attn_q keeps HF's per-head interleaved [query | gate] rows; nothing else changes.

Exactness of the inverse (GGUF -> HF): permutations and renames are exact; w = (1+w) - 1 is exact when w
lies on the float32 grid of 1+w, and A_log = log(exp(A_log)) holds for "round-trip" values only:
`random_tiny_model` draws both kinds so, and then the inverse of an F32 file is the original bit for bit.
Whatever the weights, HF's 1 + ((1+w) - 1) reproduces the file's 1+w exactly when 1+w >= 0.5 (Sterbenz),
so transformers loaded with the effective state dict computes with the file's norms.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
from gguf import GGMLQuantizationType as Q

from ..errors import OpenJetError
from . import quants
from .inventory import TensorSpec, expected_tensors
from .recipe import unsloth_type
from .shape import FAMILY_CONSTANTS, ModelShape
from .synth import write_gguf
from .vocab import small_vocab

RECIPES = ("f32", "unsloth")

# HF name inside `model.layers.N.` (and `mtp.layers.0.`) -> GGUF name inside `blk.N.`.
LAYER_NAMES: dict[str, str] = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.A_log": "ssm_a",
    "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GLOBAL_NAMES: dict[str, str] = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
# MTP head tensors outside its decoder layer -> GGUF name inside `blk.{n_layer}.`.
MTP_NAMES: dict[str, str] = {
    "mtp.fc.weight": "nextn.eh_proj.weight",
    "mtp.pre_fc_norm_embedding.weight": "nextn.enorm.weight",
    "mtp.pre_fc_norm_hidden.weight": "nextn.hnorm.weight",
    "mtp.norm.weight": "nextn.shared_head_norm.weight",
}
MTP_LAYER_PREFIX = "mtp.layers.0."


class VAxis(NamedTuple):
    """Where a GDN tensor (HF layout, conv squeezed) holds its value heads, for the V-head reorder."""
    axis: int            # 0 = rows / channels, 1 = input columns
    after_qk: bool       # only the entries after the q and k channels (2 * key_dim) are value heads
    per_head: int        # entries per value head: 0 = ssm_head_dim, else this number


V_REORDERED: dict[str, VAxis] = {      # GGUF name inside blk.N.
    "attn_qkv.weight": VAxis(0, True, 0),
    "ssm_conv1d.weight": VAxis(0, True, 0),
    "attn_gate.weight": VAxis(0, False, 0),
    "ssm_alpha.weight": VAxis(0, False, 1),
    "ssm_beta.weight": VAxis(0, False, 1),
    "ssm_a": VAxis(0, False, 1),
    "ssm_dt.bias": VAxis(0, False, 1),
    "ssm_out.weight": VAxis(1, False, 0),
}


# ---------------------------------------------------------------------------------------------- names

def gguf_name(hf: str, n_layer: int) -> str:
    """GGUF name of HF tensor `hf` (MTP tensors become block `n_layer`)."""
    if hf in GLOBAL_NAMES:
        return GLOBAL_NAMES[hf]
    if hf in MTP_NAMES:
        return f"blk.{n_layer}.{MTP_NAMES[hf]}"
    if hf.startswith(MTP_LAYER_PREFIX):
        block, rest = n_layer, hf[len(MTP_LAYER_PREFIX):]
    elif hf.startswith("model.layers."):
        idx, _, rest = hf[len("model.layers."):].partition(".")
        block = int(idx)
    else:
        raise OpenJetError(f"HF tensor {hf} has no qwen35 GGUF counterpart")
    if rest not in LAYER_NAMES:
        raise OpenJetError(f"HF tensor {hf} has no qwen35 GGUF counterpart")
    return f"blk.{block}.{LAYER_NAMES[rest]}"


_HF_LAYER = {g: h for h, g in LAYER_NAMES.items()}
_HF_GLOBAL = {g: h for h, g in GLOBAL_NAMES.items()}
_HF_MTP = {g: h for h, g in MTP_NAMES.items()}


def hf_name(gguf: str, n_layer: int) -> str:
    """Inverse of `gguf_name`."""
    if gguf in _HF_GLOBAL:
        return _HF_GLOBAL[gguf]
    block, rest = gguf[len("blk."):].split(".", 1)
    if int(block) == n_layer:
        return _HF_MTP[rest] if rest in _HF_MTP else MTP_LAYER_PREFIX + _HF_LAYER[rest]
    return f"model.layers.{block}.{_HF_LAYER[rest]}"


# ----------------------------------------------------------------------------------------------- shape

def shape_from_hf(config, with_mtp: bool) -> ModelShape:
    """The qwen35 shape of an HF `Qwen3_5TextConfig`; raises OpenJetError when our kernels cannot run it."""
    rope = dict(getattr(config, "rope_parameters", None) or {})
    partial = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 0.25))
    sections = list(rope.get("mrope_section", [11, 11, 10]))       # llama.cpp's default when absent
    shape = ModelShape(
        n_embd=config.hidden_size, n_ff=config.intermediate_size,
        n_layer=config.num_hidden_layers, n_nextn=1 if with_mtp else 0,
        n_head=config.num_attention_heads, n_head_kv=config.num_key_value_heads,
        head_dim=config.head_dim, n_rot=int(config.head_dim * partial),
        rope_sections=tuple(sections + [0] * (4 - len(sections))),
        ssm_n_k_heads=config.linear_num_key_heads, ssm_n_v_heads=config.linear_num_value_heads,
        ssm_head_dim=config.linear_key_head_dim, n_vocab=config.vocab_size,
        n_ctx_train=config.max_position_embeddings,
        rope_base=float(rope.get("rope_theta", getattr(config, "rope_theta", 1e7))),
        rms_eps=float(config.rms_norm_eps), ssm_conv_kernel=config.linear_conv_kernel_dim,
    )
    problems = [f"{f} is {getattr(shape, f)}, expected {want}" for f, want in FAMILY_CONSTANTS.items()
                if f != "full_attn_interval" and not _close(getattr(shape, f), want)]
    if config.linear_value_head_dim != config.linear_key_head_dim:
        problems.append(f"linear_value_head_dim {config.linear_value_head_dim} != linear_key_head_dim "
                        f"{config.linear_key_head_dim}")
    want_types = ["full_attention" if shape.is_attention_layer(i) else "linear_attention"
                  for i in range(shape.n_layer)]
    if list(config.layer_types) != want_types:
        problems.append(f"layer_types must put full attention every {shape.full_attn_interval}th layer")
    if shape.n_layer % shape.full_attn_interval or shape.ssm_n_v_heads % shape.ssm_n_k_heads:
        problems.append("layers must be a multiple of 4 and value heads a multiple of key heads")
    if getattr(config, "tie_word_embeddings", False):
        problems.append("tie_word_embeddings must be False (qwen35 files carry a separate output.weight)")
    if problems:
        raise OpenJetError("HF config does not fit the Qwen3.8 family: " + "; ".join(problems))
    return shape


def _close(a, b) -> bool:
    return math.isclose(a, b, rel_tol=1e-6) if isinstance(b, float) else a == b


# ------------------------------------------------------------------------------------------ transforms

def tiled_order(n_k: int, n_v: int, head: int) -> np.ndarray:
    """Index array: tiled[p] = grouped[order[p]] along the value axis (n_v heads of `head` entries).

    Tiled head v' = n_k*j + kh holds grouped head v = r*kh + j (r = n_v / n_k), so key head = v' mod n_k.
    """
    r = n_v // n_k
    return np.arange(n_v * head).reshape(n_k, r, head).transpose(1, 0, 2).reshape(-1)


def _reorder_v_heads(x: np.ndarray, rest: str, shape: ModelShape, inverse: bool = False) -> np.ndarray:
    """Grouped -> tiled value heads of block tensor `rest` (tiled -> grouped with `inverse`)."""
    if rest not in V_REORDERED:
        return x
    where = V_REORDERED[rest]
    order = tiled_order(shape.ssm_n_k_heads, shape.ssm_n_v_heads, where.per_head or shape.ssm_head_dim)
    if where.after_qk:                                                   # q and k channels stay in place
        order = np.concatenate([np.arange(2 * shape.ssm_key_dim), 2 * shape.ssm_key_dim + order])
    if len(order) != x.shape[where.axis]:
        raise OpenJetError(f"{rest}: {x.shape[where.axis]} entries on the value-head axis, expected {len(order)}")
    return np.take(x, np.argsort(order) if inverse else order, axis=where.axis)


def _block_rest(name: str) -> str:
    """`blk.N.rest` -> `rest`; global names unchanged."""
    return name.split(".", 2)[2] if name.startswith("blk.") else name


def _is_plus_one_norm(gguf: str) -> bool:
    return gguf.endswith("norm.weight") and not gguf.endswith("ssm_norm.weight")


def _neg_exp(x: np.ndarray) -> np.ndarray:
    import torch
    return (-torch.exp(torch.from_numpy(np.array(x, np.float32)))).numpy()


def _log_neg(a: np.ndarray) -> np.ndarray:
    import torch
    return torch.log(-torch.from_numpy(np.array(a, np.float32))).numpy()


def to_gguf_tensors(state: Mapping[str, np.ndarray], shape: ModelShape) -> dict[str, np.ndarray]:
    """HF tensors (float32, HF names and layouts) -> GGUF tensors (float32, numpy view (rows, ne[0]))."""
    specs = {s.name: s for s in expected_tensors(shape, with_mtp=shape.n_nextn > 0)}
    out: dict[str, np.ndarray] = {}
    for hf, value in state.items():
        name = gguf_name(hf, shape.n_layer)
        if name not in specs:
            raise OpenJetError(f"HF tensor {hf} -> {name} is not part of a qwen35 model of this shape")
        x = np.asarray(value, dtype=np.float32)
        rest = _block_rest(name)
        if rest == "ssm_conv1d.weight":
            x = x.reshape(x.shape[0], x.shape[-1])                        # [C, 1, K] -> [C, K]
        x = _reorder_v_heads(x, rest, shape)
        if rest == "ssm_a":
            x = _neg_exp(x)
        elif _is_plus_one_norm(name):
            x = x + np.float32(1)
        want = tuple(reversed(specs[name].ne))
        if x.shape != want:
            raise OpenJetError(f"HF tensor {hf} has shape {value.shape}; {name} needs {want[::-1]} (ggml ne)")
        out[name] = np.ascontiguousarray(x)
    missing = [n for n in specs if n not in out]
    if missing:
        raise OpenJetError(f"the HF state dict lacks the source of {missing[0]} ({hf_name(missing[0], shape.n_layer)})")
    return out


def to_hf_tensors(tensors: Mapping[str, np.ndarray], shape: ModelShape) -> dict[str, np.ndarray]:
    """Inverse of `to_gguf_tensors`: GGUF tensors (float32) -> HF names and layouts."""
    out: dict[str, np.ndarray] = {}
    for name, value in tensors.items():
        x = np.asarray(value, dtype=np.float32)
        rest = _block_rest(name)
        if rest == "ssm_a":
            x = _log_neg(x)
        elif _is_plus_one_norm(name):
            x = x - np.float32(1)
        x = _reorder_v_heads(x, rest, shape, inverse=True)
        if rest == "ssm_conv1d.weight":
            x = x[:, None, :]                                             # [C, K] -> [C, 1, K]
        out[hf_name(name, shape.n_layer)] = np.ascontiguousarray(x, dtype=np.float32)
    return out


# ------------------------------------------------------------------------------------------- the file

def recipe_types(shape: ModelShape, recipe: str) -> list[tuple[TensorSpec, Q]]:
    """Each tensor of the file in order with its type: all F32, or the unsloth Q4_K_M recipe."""
    if recipe not in RECIPES:
        raise OpenJetError(f"unknown recipe {recipe!r}: choose one of {', '.join(RECIPES)}")
    specs = expected_tensors(shape, with_mtp=shape.n_nextn > 0)
    return [(s, Q.F32 if recipe == "f32" else unsloth_type(s, shape.n_block)) for s in specs]


def hf_to_gguf(model_or_state_dict, config, path: str | os.PathLike[str], recipe: str = "f32",
               mtp_state: Mapping | None = None) -> dict[str, np.ndarray]:
    """Write the HF model (plus an optional MTP head in HF `mtp.*` names) as a qwen35 GGUF at `path`.

    Returns the effective HF state dict (HF names, float32 numpy, `mtp.*` included when given): every
    tensor as the file holds it (dequantised), mapped back through the inverse transforms. Loaded into
    the HF model (`load_hf_state`), transformers computes with exactly the file's weights.
    """
    state = _numpy_state(model_or_state_dict)
    if mtp_state is not None:
        state.update(_numpy_state(mtp_state))
    shape = shape_from_hf(config, with_mtp=any(k.startswith("mtp.") for k in state))
    typed = recipe_types(shape, recipe)
    tensors = to_gguf_tensors(state, shape)
    encoded = [quants.quantize(tensors[s.name].reshape(-1, s.ne[0]), qtype) for s, qtype in typed]
    write_gguf(path, shape, small_vocab(shape.n_vocab), typed, lambda i: encoded[i],
               name=f"OpenJet HF-converted Qwen3.5-family ({recipe})")
    held = {s.name: quants.dequantize(raw, qtype).reshape(tensors[s.name].shape)
            for (s, qtype), raw in zip(typed, encoded)}
    return to_hf_tensors(held, shape)


def load_hf_state(model, state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Load the trunk tensors of an effective state dict into `model` (strict); returns the `mtp.*` rest."""
    import torch
    trunk = {k: torch.from_numpy(np.array(v)) for k, v in state.items() if not k.startswith("mtp.")}
    model.load_state_dict(trunk, strict=True)
    return {k: v for k, v in state.items() if k.startswith("mtp.")}


def _numpy_state(src) -> dict[str, np.ndarray]:
    if hasattr(src, "state_dict"):
        src = src.state_dict()
    return {k: v.detach().cpu().float().numpy() if hasattr(v, "detach") else np.asarray(v, np.float32)
            for k, v in src.items()}


# ------------------------------------------------------------------------------------ tiny HF models

def tiny_hf_config(**overrides):
    """A tiny `Qwen3_5TextConfig` with the family's per-head sizes (shape.FAMILY_CONSTANTS), fp32, eager.

    3 value heads per key head (2 key, 6 value), so a grouped/tiled mix-up changes the output.
    """
    from transformers import Qwen3_5TextConfig

    args = dict(
        vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=256,
        linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
        tie_word_embeddings=False, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        attn_implementation="eager", dtype="float32",
    )
    args.update(overrides)
    return Qwen3_5TextConfig(**args)


def random_tiny_model(seed: int = 0, config=None):
    """(`Qwen3_5ForCausalLM` in eval mode, MTP head state dict in HF `mtp.*` names), every weight random.

    Linear weights N(0, gain/sqrt(fan_in)) (gain 0.5 into the residual stream, 2 for lm_head), embedding
    N(0, 1), zero-centred norms N(0, 0.1) (HF initialises them to 0; random ones exercise the +1), the
    gated norm 1 + N(0, 0.1), conv U(-0.5, 0.5), A ~ U(1, 16), dt_bias = softplus^-1(dt) with
    dt ~ logU(1e-3, 1e-1) (synth.py's choices). Deterministic in `seed`; torch's global RNG is not used.
    """
    import torch
    from transformers import Qwen3_5ForCausalLM
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer

    config = config or tiny_hf_config()
    model = Qwen3_5ForCausalLM(config).eval()      # HF's own init is overwritten below, from `seed` alone
    attn_layer = Qwen3_5DecoderLayer(config, config.layer_types.index("full_attention"))
    mtp_shapes = {MTP_LAYER_PREFIX + k: v.shape for k, v in attn_layer.state_dict().items()}
    h = config.hidden_size
    mtp_shapes.update({"mtp.fc.weight": (h, 2 * h), "mtp.pre_fc_norm_embedding.weight": (h,),
                       "mtp.pre_fc_norm_hidden.weight": (h,), "mtp.norm.weight": (h,)})

    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(_random_weight(rng, name, tuple(p.shape))))
    mtp = {k: torch.from_numpy(_random_weight(rng, k, tuple(s))) for k, s in mtp_shapes.items()}
    return model, mtp


_RESIDUAL_WRITERS = ("out_proj.weight", "o_proj.weight", "down_proj.weight")


def _random_weight(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name.endswith("linear_attn.norm.weight"):                 # plain-w gated norm
        return (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if _is_plus_one_norm(gguf_name(name, 0)):                    # zero-centred: on the float32 grid of 1+w
        return (np.round(0.1 * rng.standard_normal(shape) * 2.0**23) / 2.0**23).astype(np.float32)
    if name.endswith("A_log"):
        return _roundtrip_log(rng.uniform(1.0, 16.0, shape))
    if name.endswith("dt_bias"):                                 # softplus^-1(dt)
        dt = np.exp(rng.uniform(math.log(1e-3), math.log(1e-1), shape))
        return (dt + np.log(-np.expm1(-dt))).astype(np.float32)
    if name.endswith("conv1d.weight"):
        return rng.uniform(-0.5, 0.5, shape).astype(np.float32)
    if name.endswith("embed_tokens.weight"):
        return rng.standard_normal(shape).astype(np.float32)
    gain = 2.0 if name == "lm_head.weight" else 0.5 if name.endswith(_RESIDUAL_WRITERS) else 1.0
    return (rng.standard_normal(shape) * (gain / math.sqrt(shape[-1]))).astype(np.float32)


def _roundtrip_log(a: np.ndarray) -> np.ndarray:
    """float32 log(a), nudged to values x with log(exp(x)) == x (torch's float32 exp/log), so that the
    file's -exp(A_log) maps back to the same A_log bit for bit."""
    import torch
    x = torch.log(torch.from_numpy(np.asarray(a, np.float32)))
    for _ in range(8):
        y = torch.log(torch.exp(x))
        if torch.equal(x, y):
            return x.numpy()
        x = y
    raise OpenJetError("A_log did not settle on an exp/log round-trip value")
