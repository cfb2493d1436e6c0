"""``openjet-launch inspect``: what a GGUF file is, and whether (and how) OpenJet runs it."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict

from .config import read_config
from .gguf_file import GGUFFile
from .recipe import MIXED, PLAIN_Q4_K_M, UNSLOTH_Q4_K_M, classify

_VERDICT_TEXT = {
    UNSLOTH_Q4_K_M: "unsloth Q4_K_M: runs as is",
    PLAIN_Q4_K_M: "plain llama-quantize Q4_K_M: runs after re-encoding {n} tensors at load",
    MIXED: "mixed recipe (UD-Q4_K_XL-like): every type is decodable, but its engine is not built yet",
}


def inspect_file(path: str) -> dict:
    """A JSON-able report. Raises ModelFileError for files that cannot be read as a qwen35 model."""
    gguf = GGUFFile(path)
    config = read_config(gguf)
    verdict = classify(gguf, config)
    bytes_by_type: dict[str, int] = defaultdict(int)
    for info in gguf.tensors.values():
        bytes_by_type[info.qtype.name] += info.n_bytes
    return {
        "file": str(gguf.path),
        "file_bytes": gguf.file_size,
        "name": config.name,
        "architecture": gguf.architecture,
        "metadata_keys": len(gguf.metadata),
        "tensors": len(gguf.tensors),
        "shape": asdict(config.shape),
        "is_qwen38_27b_shape": not config.deviations_from_27b(),
        "deviations_from_27b": [{"field": f, "qwen38_27b": w, "file": g} for f, w, g in config.deviations_from_27b()],
        "layers": {"trunk": config.shape.n_layer,
                   "attention": sum(config.shape.is_attention_layer(i) for i in range(config.shape.n_layer)),
                   "mtp_head": config.has_mtp},
        "tokens": config.n_tokens,
        "recipe": asdict(verdict),
        "tensor_bytes_by_type": dict(sorted(bytes_by_type.items())),
        "warnings": list(config.warnings),
        "runnable": verdict.runnable,
    }


def format_report(r: dict) -> str:
    s = r["shape"]
    v = r["recipe"]
    lines = [
        f"file      {r['file']}  ({r['file_bytes'] / 1e9:.3f} GB, {r['tensors']} tensors, {r['metadata_keys']} keys)",
        f"model     {r['name']} ({r['architecture']})",
        f"layers    {s['n_layer']} trunk: {s['n_layer'] - r['layers']['attention']} Gated DeltaNet + "
        f"{r['layers']['attention']} full attention; MTP head "
        + ("present" if r["layers"]["mtp_head"] else "absent (no speculative decoding)"),
        f"sizes     hidden {s['n_embd']}, ffn {s['n_ff']}, heads {s['n_head']}/{s['n_head_kv']} x {s['head_dim']}, "
        f"DeltaNet heads {s['ssm_n_k_heads']} k / {s['ssm_n_v_heads']} v x {s['ssm_head_dim']}, "
        f"vocab {s['n_vocab']} rows ({r['tokens']} tokens)",
    ]
    if r["is_qwen38_27b_shape"]:
        lines.append("shape     Qwen3.8-27B")
    else:
        diffs = ", ".join(f"{d['field']} {d['file']} (27B: {d['qwen38_27b']})" for d in r["deviations_from_27b"])
        lines.append(f"shape     not the 27B shape (a test model?): {diffs}")
    lines.append("types     " + ", ".join(f"{t} {n}" for t, n in v["census"].items()))
    lines.append("bytes     " + ", ".join(f"{t} {b / 1e9:.3f} GB" for t, b in r["tensor_bytes_by_type"].items()))
    if v["kind"] in _VERDICT_TEXT:
        lines.append("recipe    " + _VERDICT_TEXT[v["kind"]].format(n=len(v["conversions"])))
    else:
        lines.append(f"recipe    unsupported: {v['problem']}")
    for name, old, new in v["conversions"]:
        lines.append(f"          convert {name}: {old} -> {new}")
    if v["kind"] == MIXED:
        for role, types in v["role_types"].items():
            lines.append(f"          {role:<12} " + ", ".join(f"{t} {n}" for t, n in types.items()))
    for w in r["warnings"]:
        lines.append(f"warning   {w}")
    lines.append("verdict   " + ("OK: OpenJet can run this file" if r["runnable"] else "NOT RUNNABLE"))
    return "\n".join(lines)

