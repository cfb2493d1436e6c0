"""``openjet-launch doctor``: can this machine serve Qwen3.8-27B on its GPU, with which settings, and if
not, why not and what to do.

It reports the Python and package versions, the engine library, the NVIDIA driver, every GPU (NVML and
the engine's probe, joined), the settings ``choose_settings`` picks for the chosen GPU, and the verdict:
the GPU path, or the CPU path (``openjet-launch --engine reference --model demo``) with the reasons.

Exit status: 0 when the GPU path is ready (a usable GPU and settings that fit), 1 otherwise, the full
report printed either way; so ``openjet-launch doctor && openjet-launch`` starts the server only where a
GPU can run it. A machine without a GPU is a state, not an error: no traceback, no error line.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import textwrap
from importlib import metadata
from typing import Any

from ..errors import OpenJetError
from .hardware import PROBE_TIMEOUT_S, HardwareReport, detect
from ..server.cli import check_ctx, positive_seconds
from .presets import CPU_PATH, choose_settings, gib

PACKAGES = ("openjet-launcher", "numpy", "gguf", "tokenizers", "jinja2", "nvidia-ml-py", "huggingface_hub",
            "fastapi", "uvicorn", "pydantic", "platformdirs")


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def doctor_report(gpu: int | None = None, ctx: int | None = None, agents: int = 1, kv: str | None = None,
                  probe_timeout_s: float = PROBE_TIMEOUT_S, hardware: HardwareReport | None = None) -> dict[str, Any]:
    """Everything ``doctor`` prints, as data (``doctor --json``)."""
    from .. import __version__

    if ctx is not None:
        check_ctx(ctx)  # the server's rule: doctor must not call ready what serve refuses
    hw = hardware if hardware is not None else detect(gpu, probe_timeout_s, ctx=ctx)
    settings, settings_error = None, None
    g = hw.chosen
    if g is not None:
        try:
            settings = choose_settings(g.total_memory_bytes, g.free_memory_bytes, g.sm_count, g.compute_capability,
                                       requested_ctx=ctx, requested_agents=agents, requested_kv=kv).to_dict()
        except OpenJetError as e:
            settings_error = str(e)
    ready = settings is not None
    if ready:
        verdict = {"ready": True, "path": "gpu",
                   "message": f"{g.label} can serve Qwen3.8-27B: run `openjet-launch`."}
    elif g is not None:  # the GPU is fine; what was asked of it is not
        verdict = {"ready": False, "path": "gpu", "why": [settings_error],
                   "message": f"{g.label} is usable, but not with the settings asked for (--ctx, --kv, --agents): "
                              f"{settings_error}"}
    else:
        why = [p.message for p in hw.why_not()] + ([settings_error] if settings_error else [])
        verdict = {"ready": False, "path": "cpu", "why": why or ["no usable NVIDIA GPU"],
                   "message": f"No usable NVIDIA GPU: OpenJet cannot serve Qwen3.8-27B here. The CPU path "
                              f"(numpy reference engine and a tiny demo model, for trying the API): {CPU_PATH}",
                   "command": CPU_PATH}
    return {
        "python": {"version": platform.python_version(), "executable": sys.executable,
                   "platform": f"{platform.system()} {platform.machine()}"},
        "openjet_launcher": __version__,
        "packages": package_versions(),
        "hardware": hw.to_dict(),
        "settings": settings,
        "settings_error": settings_error,
        "verdict": verdict,
    }


def _wrap(text: str, indent: str) -> str:
    return textwrap.fill(text, width=100, initial_indent=indent, subsequent_indent=" " * len(indent),
                         break_on_hyphens=False)


def format_report(r: dict[str, Any]) -> str:
    hw, eng = r["hardware"], r["hardware"]["engine"]
    lines = ["OpenJet doctor", "",
             f"Python       {r['python']['version']} ({r['python']['platform']}) {r['python']['executable']}",
             _wrap("Packages     " + ", ".join(f"{k} {v}" for k, v in r["packages"].items() if v), ""),
             ]
    missing = [k for k, v in r["packages"].items() if v is None]
    if missing:
        lines.append("  not installed: " + ", ".join(missing))
    lines.append("")
    if eng["built"]:
        archs = ""
        if eng["sass"] is not None:
            archs = (f"; code for {', '.join(f'sm_{a}' for a in eng['sass'])}"
                     f" (PTX {', '.join(f'compute_{a}' for a in eng['ptx'] or []) or 'none'})")
        runtime = f", CUDA runtime {hw['cuda_runtime_version']}" if hw["cuda_runtime_version"] else ""
        lines.append(f"Engine       {eng['path']} (version {eng['version'] or '?'}{runtime}{archs})")
        hopper = any(g["compute_capability"] == "9.0" for g in hw["gpus"])
        if eng.get("dense_prefill_gemm"):
            lines.append("  prefill    dense GEMM for H100 / H200 (sm_90a, CUTLASS) compiled in")
        elif hopper and eng.get("dense_prefill_gemm") is False:
            lines.append(_wrap("this build has no dense prefill GEMM for the H100 / H200 here, so prompts read ~1.5x "
                               "slower: a release wheel has it; a source build needs CUTLASS's headers (python "
                               "scripts/fetch_cutlass.py, then rebuild)", "  ! "))
    else:
        lines.append("Engine       not built")
    driver = hw["driver_version"] or "none found"
    cuda = f" (supports CUDA {hw['cuda_driver_version']})" if hw["cuda_driver_version"] else ""
    lines.append(f"Driver       {driver}{cuda}")
    lines.append("")
    if hw["gpus"]:
        lines.append("GPUs")
        chosen = hw["chosen"]
        for g in hw["gpus"]:
            mark = "  <- chosen" if chosen and chosen["uuid"] == g["uuid"] else ""
            n = g["index"] if g["index"] is not None else f"cuda:{g['cuda_index']}"
            mem = (f"{gib(g['total_memory_bytes'])} ({gib(g['free_memory_bytes'])} free)"
                   if g["total_memory_bytes"] and g["free_memory_bytes"] is not None else "memory ?")
            sms = f"{g['sm_count']} SMs" if g["sm_count"] else "SMs ?"
            kernel = {True: f"kernel ok (sm_{g['kernel_arch']})", False: "kernel FAILED", None: "not probed"}
            lines.append(f"  {n}  {g['name']}  cc {g['compute_capability']}  {sms}  {mem}  "
                         f"{kernel[g['kernel_ok']]}{mark}")
            lines += [_wrap(p["message"], "     ! ") for p in g["problems"]]
    else:
        lines.append("GPUs         none found")
    lines.append("")
    s = r["settings"]
    if s:
        m = s["memory"]
        why_one = next((x.split(": ", 1)[1] for x in s["reasons"] if x.startswith("1 agent: ")), "")
        agents = f"{s['n_agents']} agent" + ("s" if s["n_agents"] > 1 else "") + (f" ({why_one})" if why_one else "")
        embd = "in host memory" if s["embd_on_host"] else "on the GPU"
        lines.append(f"Settings     KV {s['kv_format']}, context {s['n_ctx']} tokens, prefill chunk "
                     f"{s['prefill_chunk']}, embedding table {embd}, {agents}")
        lines.append(f"  memory     weights {gib(m['weights'])} + KV {gib(m['kv_cache'])} + state "
                     f"{gib(m['agent_state'])} + scratch "
                     f"{gib(m['prefill_scratch'] + m['decode_workspace'] + m['draft_rows'])} + "
                     f"CUDA context {gib(m['cuda_context'])} + margin {gib(m['safety_margin'])} = {gib(m['total'])}")
        lines += [f"  why        {x}" for x in s["reasons"]]
    elif r["settings_error"]:
        lines.append(_wrap(f"Settings     none fit: {r['settings_error']}", ""))
    else:
        lines.append("Settings     none (no usable GPU)")
    lines.append("")
    v = r["verdict"]
    if v["ready"]:
        lines.append(f"Ready        {v['message']}")
    elif v["path"] == "gpu":
        lines.append(_wrap(f"Not ready    {v['message']}", ""))
    else:
        lines.append("Not ready    no usable NVIDIA GPU, because:")
        lines += [_wrap(w, "  - ") for w in v["why"]]
        lines.append("")
        lines.append("CPU path     slow, exact; a tiny demo model for trying the API and the clients:")
        lines.append(f"             {v['command']}")
    return "\n".join(lines)


def _cmd_doctor(args: argparse.Namespace) -> int:
    report = doctor_report(gpu=args.gpu, ctx=args.ctx, agents=args.agents, kv=args.kv,
                           probe_timeout_s=args.probe_timeout)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0 if report["verdict"]["ready"] else 1


def add_doctor_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "doctor", help="check this machine: driver, GPU, engine, the settings OpenJet would pick",
        description="Report Python and package versions, the engine library, the NVIDIA driver, every GPU "
                    "(NVML joined with the engine's probe), the settings picked for the chosen GPU, and what "
                    "to do when none can serve. Exit status 0 when the GPU path is ready, 1 otherwise (the "
                    f"report says why and gives the CPU path, `{CPU_PATH}`).")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--gpu", type=int, default=None, metavar="N",
                   help="check GPU N (nvidia-smi's numbering; default: the usable one with the most free memory)")
    p.add_argument("--ctx", type=int, default=None, help="check a requested context per agent (tokens)")
    p.add_argument("--agents", type=int, default=1, help="check a number of agents (default 1)")
    p.add_argument("--kv", choices=["fp16", "q8_0", "q4_0"], default=None, help="check a KV cache format")
    p.add_argument("--probe-timeout", type=positive_seconds, default=PROBE_TIMEOUT_S, metavar="S",
                   help=f"seconds the engine's GPU probe may take (default {PROBE_TIMEOUT_S:g})")
    p.set_defaults(func=_cmd_doctor)
    return p
