"""Which quantisation recipe a file follows, decided from the tensor types read from the file.

(a) unsloth Q4_K_M: runs as is.
(b) plain llama-quantize Q4_K_M: runs after re-encoding ssm_out to Q5_K, ssm_alpha/ssm_beta to F32
    and nextn.eh_proj to Q8_0 at load (the four roles where the two recipes differ, qwen38.md §7).
(c) a mixed recipe like unsloth's UD-Q4_K_XL: every type is one we can decode; its engine comes later.
(d) unsupported: names the first tensor that does not fit and what was expected.
Never decided from the file name.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gguf import GGMLQuantizationType as Q

from .config import ModelConfig
from .gguf_file import GGUFFile
from .inventory import VECTOR_ROLES, TensorSpec, expected_tensors

UNSLOTH_Q4_K_M = "unsloth-Q4_K_M"
PLAIN_Q4_K_M = "llama-quantize-Q4_K_M"
MIXED = "mixed"
UNSUPPORTED = "unsupported"

# Roles whose Q4_K_M type is Q6_K on "more bits" layers and Q4_K elsewhere (llama.cpp's rule).
MORE_BITS_ROLES = frozenset({"attn_qkv", "attn_v", "ffn_down"})


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's Q4_K_M placement: the first and last eighth of the blocks, and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


# unsloth Q4_K_M, role -> type (the MORE_BITS_ROLES resolve through use_more_bits).
UNSLOTH_TYPES: dict[str, Q] = {
    **{role: Q.F32 for role in VECTOR_ROLES},
    "ssm_alpha": Q.F32, "ssm_beta": Q.F32, "ssm_out": Q.Q5_K, "eh_proj": Q.Q8_0,
    "attn_gate": Q.Q4_K, "attn_q": Q.Q4_K, "attn_k": Q.Q4_K, "attn_output": Q.Q4_K,
    "ffn_gate": Q.Q4_K, "ffn_up": Q.Q4_K, "token_embd": Q.Q4_K, "output": Q.Q6_K,
}
# Where a plain llama-quantize Q4_K_M differs: it stores these four roles as Q4_K.
PLAIN_CONVERSIONS: dict[str, Q] = {"ssm_out": Q.Q5_K, "ssm_alpha": Q.F32, "ssm_beta": Q.F32, "eh_proj": Q.Q8_0}
# Types our codecs decode, for weight matrices of a mixed recipe.
MIXED_MATRIX_TYPES = frozenset({Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K,
                                Q.IQ4_XS, Q.IQ4_NL, Q.Q3_K, Q.IQ3_S})


def unsloth_type(spec: TensorSpec, n_block: int) -> Q:
    if spec.role in MORE_BITS_ROLES:
        return Q.Q6_K if use_more_bits(spec.block, n_block) else Q.Q4_K
    return UNSLOTH_TYPES[spec.role]


@dataclass
class RecipeVerdict:
    kind: str
    runnable: bool                                   # our engines run it (after listed conversions)
    has_mtp: bool
    problem: str | None = None                       # for UNSUPPORTED: the first tensor that does not fit
    conversions: list[tuple[str, str, str]] = field(default_factory=list)   # (tensor, from, to)
    census: dict[str, int] = field(default_factory=dict)                   # type name -> tensors
    role_types: dict[str, dict[str, int]] = field(default_factory=dict)    # role -> type name -> tensors


def classify(gguf: GGUFFile, config: ModelConfig) -> RecipeVerdict:
    shape = config.shape
    specs = expected_tensors(shape, with_mtp=config.has_mtp)
    census = Counter(info.qtype.name for info in gguf.tensors.values())
    verdict = RecipeVerdict(kind=UNSUPPORTED, runnable=False, has_mtp=config.has_mtp,
                            census=dict(sorted(census.items())))

    expected_names = {s.name for s in specs}
    extra = [n for n in gguf.tensors if n not in expected_names]
    if extra:
        verdict.problem = f"tensor {extra[0]} is not part of a qwen35 model of this shape"
        return verdict

    role_types: dict[str, Counter] = {}
    unsloth_ok, plain_ok = True, True
    for spec in specs:
        info = gguf.tensors.get(spec.name)
        if info is None:
            verdict.problem = f"tensor {spec.name} is missing"
            return verdict
        if info.ne != spec.ne:
            verdict.problem = f"tensor {spec.name} has shape {list(info.ne)}, expected {list(spec.ne)}"
            return verdict
        qtype = info.qtype
        role_types.setdefault(spec.role, Counter())[qtype.name] += 1
        want = unsloth_type(spec, shape.n_block)
        allowed = {Q.Q4_K, Q.Q6_K} if spec.role in MORE_BITS_ROLES else {want}
        if qtype in allowed:
            continue
        unsloth_ok = False
        if spec.role in PLAIN_CONVERSIONS and qtype == Q.Q4_K:
            verdict.conversions.append((spec.name, qtype.name, PLAIN_CONVERSIONS[spec.role].name))
        else:
            plain_ok = False
        fits_mixed = qtype == Q.F32 if spec.role in VECTOR_ROLES else qtype in MIXED_MATRIX_TYPES
        if not fits_mixed:
            expected = "F32" if spec.role in VECTOR_ROLES else "one of " + ", ".join(
                sorted(t.name for t in MIXED_MATRIX_TYPES))
            verdict.problem = f"tensor {spec.name} is {qtype.name}, expected {expected}"
            return verdict

    verdict.role_types = {r: dict(sorted(c.items())) for r, c in sorted(role_types.items())}
    if unsloth_ok:
        verdict.kind, verdict.runnable = UNSLOTH_Q4_K_M, True
    elif plain_ok:
        verdict.kind, verdict.runnable = PLAIN_Q4_K_M, True
    else:
        verdict.kind, verdict.conversions = MIXED, []
    return verdict
