"""``openjet-launch``: the one command users run. Subcommands are added as their issues land.

Errors that a user can act on (OpenJetError) print as one line on stderr with exit code 1;
usage errors exit 2 (argparse's convention).
"""

from __future__ import annotations

import argparse
import json
import sys

from .errors import OpenJetError


def _cmd_inspect(args: argparse.Namespace) -> int:
    from .model.inspect import format_report, inspect_file

    try:
        report = inspect_file(args.file)
    except OpenJetError:
        raise
    except Exception as e:  # a damaged file must never end in a traceback
        raise OpenJetError(f"{args.file}: could not be read as a GGUF model ({type(e).__name__}: {e})") from None
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    if not report["runnable"]:
        recipe = report["recipe"]
        why = recipe["problem"] or f"{recipe['kind']} recipe: no engine for it yet"
        raise OpenJetError(f"{args.file}: OpenJet cannot run this file: {why}")
    return 0


def _cmd_synth(args: argparse.Namespace) -> int:
    from .model.synth import synthesize

    summary = synthesize(args.preset, args.out, seed=args.seed, workers=args.workers,
                         show_progress=not args.quiet)
    print(json.dumps(summary))
    return 0


def _cmd_probe(args: argparse.Namespace) -> int:
    from .engine import probe

    print(json.dumps(probe(), indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="openjet-launch",
        description="Run Qwen3.8-27B on one NVIDIA GPU. Tools for GGUF model files and the GPU engine.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    q = sub.add_parser("inspect", help="describe a GGUF file and say whether OpenJet can run it",
                       description="Read a GGUF file's metadata and tensor list; check the Qwen3.8 config and "
                                   "the quantisation recipe. Exit code 0 only for a file OpenJet can run.")
    q.add_argument("file", metavar="FILE.gguf")
    q.add_argument("--json", action="store_true", help="print the full report as JSON")
    q.set_defaults(func=_cmd_inspect)

    s = sub.add_parser("synth", help="write a synthetic Qwen3.8 model (random weights) for tests and benchmarks",
                       description="Write a qwen35 GGUF with random weights in the unsloth Q4_K_M recipe. "
                                   "Presets: tiny (CPU tests, ~1 MB), small (GPU tests), full (the exact 27B "
                                   "shapes, about 17.1 GB; uses all cores).")
    s.add_argument("--preset", required=True, choices=["tiny", "small", "full"])
    s.add_argument("out", metavar="OUT.gguf")
    s.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    s.add_argument("--workers", type=int, default=None, help="processes for quantisation (default: all cores for full)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=_cmd_synth)

    pr = sub.add_parser("probe", help="what the GPU engine sees: driver, devices, compiled architectures",
                        description="Load the native engine library and report CUDA driver/runtime versions, "
                                    "every GPU and whether a kernel launches on it (JSON).")
    pr.set_defaults(func=_cmd_probe)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except OpenJetError as e:
        print(f"openjet-launch {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"openjet-launch {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
