"""Model configuration from GGUF metadata, checked against what our engines are built for.

Three levels (qwen38.md §2.1):
* a required key missing or with a value our kernels cannot run is a ModelFileError naming the
  key, the expected and the found value;
* a missing optional key is a warning (its default is used);
* a shape other than Qwen3.8-27B's (our synthetic test models) is not an error: it is reported by
  ``deviations_from_27b`` so that tools can say which engine runs the file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from ..errors import ModelFileError
from .gguf_file import GGUFFile
from .shape import ARCH, FAMILY_CONSTANTS, GGUF_KEYS, QWEN38_27B, ModelShape

_FLOAT_FIELDS = {"rope_base", "rms_eps"}


@dataclass(frozen=True)
class ModelConfig:
    shape: ModelShape
    name: str
    alignment: int
    has_mtp: bool                       # nextn_predict_layers > 0 and the blk.N.nextn tensors present
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    n_tokens: int                       # entries of tokenizer.ggml.tokens
    warnings: tuple[str, ...]

    def deviations_from_27b(self) -> list[tuple[str, object, object]]:
        """(field, Qwen3.8-27B value, this file's value) for every shape field that differs."""
        out = []
        for f in fields(ModelShape):
            want, got = getattr(QWEN38_27B, f.name), getattr(self.shape, f.name)
            if want != got:
                out.append((f.name, want, got))
        return out


def read_config(gguf: GGUFFile) -> ModelConfig:
    md = gguf.metadata
    arch = gguf.architecture
    if arch != ARCH:
        raise ModelFileError(
            f"{gguf.path.name}: general.architecture is {arch!r}, expected {ARCH!r} "
            f"(OpenJet runs Qwen3.5/3.6/3.8 files only)")

    warnings: list[str] = []
    values: dict[str, object] = {}
    for key in GGUF_KEYS:
        full = f"{ARCH}.{key.name}"
        if full not in md:
            if key.required:
                raise ModelFileError(f"{gguf.path.name}: required key {full} is missing")
            warnings.append(f"optional key {full} is missing; using {key.default}")
            values.setdefault(key.field, key.default)
            continue
        values[key.field] = _coerce(full, key.field, md[full])

    n_block = values.pop("n_block")
    n_nextn = values["n_nextn"]
    if n_nextn not in (0, 1) or n_nextn >= n_block:
        raise ModelFileError(f"{gguf.path.name}: {ARCH}.nextn_predict_layers: expected 0 or 1, found {n_nextn}")
    _check_block_count(gguf, n_block, n_nextn)    # before any loop over the layers (a huge count would hang)
    d_inner = values.pop("ssm_d_inner")
    value_length = values.pop("value_length")
    values["n_layer"] = n_block - n_nextn
    values["n_vocab"] = _n_vocab(gguf)
    shape = ModelShape(**values)
    if d_inner != shape.ssm_d_inner:
        raise ModelFileError(
            f"{gguf.path.name}: {ARCH}.ssm.inner_size: expected {shape.ssm_d_inner} "
            f"(time_step_rank {shape.ssm_n_v_heads} x state_size {shape.ssm_head_dim}), found {d_inner}")

    _check_family(gguf, shape)
    if value_length != shape.head_dim:
        raise ModelFileError(f"{gguf.path.name}: {ARCH}.attention.value_length: expected {shape.head_dim} "
                             f"(= key_length), found {value_length}")
    _check_optional(gguf, shape, warnings)

    tokens = md.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list):
        raise ModelFileError(f"{gguf.path.name}: required key tokenizer.ggml.tokens is missing")
    if len(tokens) > shape.n_vocab:
        raise ModelFileError(
            f"{gguf.path.name}: tokenizer.ggml.tokens: expected at most {shape.n_vocab} entries "
            f"(token_embd rows), found {len(tokens)}")
    for k, want in (("tokenizer.ggml.model", "gpt2"), ("tokenizer.ggml.pre", ARCH)):
        if md.get(k) != want:
            warnings.append(f"{k} is {md.get(k)!r}, expected {want!r}")

    mtp_names = [f"blk.{shape.n_layer}.nextn.{n}.weight" for n in ("eh_proj", "enorm", "hnorm", "shared_head_norm")]
    has_mtp = n_nextn > 0 and all(n in gguf.tensors for n in mtp_names)
    if n_nextn > 0 and not has_mtp:
        warnings.append(f"{ARCH}.nextn_predict_layers is {n_nextn} but the MTP tensors "
                        f"(blk.{shape.n_layer}.nextn.*) are absent: no speculative decoding")

    return ModelConfig(
        shape=shape,
        name=str(md.get("general.name", gguf.path.stem)),
        alignment=int(md.get("general.alignment", 32)),
        has_mtp=has_mtp,
        bos_id=md.get("tokenizer.ggml.bos_token_id"),
        eos_id=md.get("tokenizer.ggml.eos_token_id"),
        pad_id=md.get("tokenizer.ggml.padding_token_id"),
        n_tokens=len(tokens),
        warnings=tuple(warnings),
    )


def _coerce(full: str, field: str, value: object) -> object:
    if field == "rope_sections":
        if not isinstance(value, list) or len(value) not in (3, 4) or not all(isinstance(v, int) for v in value):
            raise ModelFileError(f"{full}: expected 3 or 4 integers, found {value!r}")
        return tuple(value) + (0,) * (4 - len(value))     # old files stored 3 sections
    if field in _FLOAT_FIELDS:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ModelFileError(f"{full}: expected a number, found {value!r}")
        return float(f"{value:.7g}")     # stored as f32: 9.99999997e-07 means 1e-06
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ModelFileError(f"{full}: expected a non-negative integer, found {value!r}")
    return value


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):      # stored as f32
        return math.isclose(a, b, rel_tol=1e-6)
    return a == b


def _key_of(field: str) -> str:
    return next(f"{ARCH}.{k.name}" for k in GGUF_KEYS if k.field == field)


def _check_family(gguf: GGUFFile, shape: ModelShape) -> None:
    """The per-head sizes, RoPE layout, epsilons and layer pattern our kernels are written for."""
    for field, want in FAMILY_CONSTANTS.items():
        got = getattr(shape, field)
        if not _same(got, want):
            raise ModelFileError(f"{gguf.path.name}: {_key_of(field)}: expected {want}, found {got}")
    for field, divisor_field in (("n_head", "n_head_kv"), ("ssm_n_v_heads", "ssm_n_k_heads")):
        n, d = getattr(shape, field), getattr(shape, divisor_field)
        if d == 0 or n % d:
            raise ModelFileError(
                f"{gguf.path.name}: {_key_of(divisor_field)}: expected a divisor of {_key_of(field)} = {n}, found {d}")
    if shape.n_layer % shape.full_attn_interval:
        raise ModelFileError(
            f"{gguf.path.name}: {ARCH}.block_count: expected trunk layers to be a multiple of "
            f"{shape.full_attn_interval}, found {shape.n_layer}")


def _check_optional(gguf: GGUFFile, shape: ModelShape, warnings: list[str]) -> None:
    md = gguf.metadata
    scale = md.get(f"{ARCH}.attention.scale")
    if scale is not None and (not isinstance(scale, (int, float)) or isinstance(scale, bool)
                              or not _same(float(scale), 1.0 / math.sqrt(shape.head_dim))):
        raise ModelFileError(
            f"{gguf.path.name}: {ARCH}.attention.scale: expected {1.0 / math.sqrt(shape.head_dim)}, found {scale}")
    recurrent = md.get(f"{ARCH}.attention.recurrent_layers")
    if recurrent is not None:
        want = [not shape.is_attention_layer(il) for il in range(shape.n_layer)]
        got = [bool(x) for x in recurrent][: shape.n_layer] if isinstance(recurrent, list) else recurrent
        if got != want:
            raise ModelFileError(
                f"{gguf.path.name}: {ARCH}.attention.recurrent_layers: expected attention every "
                f"{shape.full_attn_interval}th layer (3, 7, ...), found {recurrent!r}")
    if "general.alignment" not in md:
        warnings.append("optional key general.alignment is missing; using 32")


def _check_block_count(gguf: GGUFFile, n_block: int, n_nextn: int) -> None:
    """The trunk's layers blk.0 to blk.{n_layer - 1} must be stored, several tensors each (the MTP block may be
    absent: a warning below)."""
    n_layer = n_block - n_nextn
    last = f"blk.{n_layer - 1}."
    if n_layer > len(gguf.tensors) or not any(n.startswith(last) for n in gguf.tensors):
        stored = {n.split(".")[1] for n in gguf.tensors if n.startswith("blk.")}
        raise ModelFileError(
            f"{gguf.path.name}: {ARCH}.block_count: found {n_block} ({n_layer} trunk layers + {n_nextn} MTP), "
            f"but the file stores no tensor {last}* ({len(stored)} blk.N layers in all): "
            f"the file is damaged or was written wrongly")


def _n_vocab(gguf: GGUFFile) -> int:
    info = gguf.tensors.get("token_embd.weight")
    if info is None or len(info.ne) != 2:
        raise ModelFileError(f"{gguf.path.name}: tensor token_embd.weight is missing")
    return info.ne[1]
