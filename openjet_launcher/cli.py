"""``openjet-launch``: the one command users run. Subcommands are added as their issues land.

Errors that a user can act on (OpenJetError) print as one line on stderr with exit code 1 (4: `serve`'s model
failed to load, errors.EXIT_LOAD_FAILED); usage errors exit 2 (argparse's convention).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .errors import OpenJetError


def _cmd_inspect(args: argparse.Namespace) -> int:
    from .model.inspect import format_report, inspect_file

    try:
        report = inspect_file(args.file)
    except Exception as e:  # a damaged file must never end in a traceback
        why = str(e) if isinstance(e, OpenJetError) else \
            f"{args.file}: could not be read as a GGUF model ({type(e).__name__}: {e})"
        if args.json:  # a script reading the JSON still gets an answer
            print(json.dumps({"file": args.file, "runnable": False, "error": why}, indent=2))
        raise OpenJetError(why) from None
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    if not report["runnable"]:
        recipe = report["recipe"]
        why = recipe["problem"] or f"{recipe['kind']} recipe: no engine for it yet"
        raise OpenJetError(f"{args.file}: OpenJet cannot run this file: {why}")
    return 0


def _cmd_synth(args: argparse.Namespace) -> int:
    from .model.synth import synthesize

    from .launcher.main import _interrupt, _on_stop_signals

    _on_stop_signals(_interrupt)  # a closed terminal or a kill: the part file is removed as on Ctrl-C

    try:
        summary = synthesize(args.preset, args.out, seed=args.seed, workers=args.workers,
                             show_progress=not args.quiet, codes=args.codes, replace=args.force)
    except OSError as e:  # a folder it may not write to, a disk that fills
        why = e.strerror or str(e)
        if e.errno is None and "requested and" in why:  # numpy's tofile on a short write: the disk filled up
            why = f"the disk is full ({why})"
        raise OpenJetError(f"cannot write {e.filename or args.out}: {why}") from None
    print(json.dumps(summary))
    return 0


def _cmd_probe(args: argparse.Namespace) -> int:
    from .engine import probe

    report = probe()
    print(json.dumps(report, indent=2))
    return 1 if report.get("error") else 0  # scripts can test the status: no usable CUDA is a failure


def _cmd_run(args: argparse.Namespace) -> int:
    import time

    from .draft_depth import check_draft_count
    from .generate import generate
    from .model.gguf_file import GGUFFile
    from .reference import ReferenceEngine
    from .sampling import Sampler, SamplingParams
    from .reference.weights import check_weight_budget
    from .server.cli import demo_model_path
    from .server.core import n_valid_tokens
    from .text.chat import ChatTemplate
    from .text.tokenizer import StreamingDetokenizer, Tokenizer

    if args.n_tokens < 1:
        raise OpenJetError(f"-n {args.n_tokens}: generate at least 1 token")
    if args.seed is not None and args.seed < 0:
        raise OpenJetError(f"--seed {args.seed}: choose 0 or more")
    check_draft_count(args.draft)
    model = str(demo_model_path()) if args.model == "demo" else args.model  # 'demo' as `serve` takes it
    t0 = time.perf_counter()
    gguf = GGUFFile(model)
    check_weight_budget(gguf)  # before the tokenizer and the weights: a 27B file is refused in seconds, not 36
    tok = Tokenizer.from_gguf(gguf)
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
                   [{"role": "user", "content": args.prompt}]
        text = ChatTemplate.from_gguf(gguf).render(messages, enable_thinking=not args.no_think)
        prompt = tok.encode(text, allow_special=True)
    else:
        prompt = tok.encode(args.prompt)
    if not prompt:
        raise OpenJetError("the prompt is empty")
    engine = ReferenceEngine.load(model)
    load_s = time.perf_counter() - t0
    if args.draft and not engine.config.has_mtp:
        print(f"openjet-launch run: --draft {args.draft}: this model has no MTP head, so it generates without "
              "drafts", file=sys.stderr)
    n_valid = n_valid_tokens(tok)  # (the file's token_type key may be absent: the tokenizer knows the types)
    greedy = args.temperature is None or args.temperature == 0
    params = SamplingParams(temperature=0.0 if greedy else args.temperature, top_k=args.top_k,
                            top_p=args.top_p, min_p=args.min_p, seed=args.seed)
    detok = StreamingDetokenizer(tok)

    def show(token: int) -> None:
        if token in tok.eog_ids:  # the stop token ends the text; it is not part of it
            return
        sys.stdout.write(detok.push(token))
        sys.stdout.flush()

    gen = generate(engine, engine.new_state(), prompt, Sampler(params, n_valid), args.n_tokens,
                   stop_ids=tok.eog_ids, n_draft=args.draft, on_token=show)
    sys.stdout.write(detok.flush() + "\n")
    t = gen.timings()
    summary = (f"[{len(prompt)} prompt tokens at {t['prompt_per_second']:.1f} tok/s, {len(gen.tokens)} generated "
               f"at {t['predicted_per_second']:.1f} tok/s, stop: {gen.stop_reason}, load {load_s:.1f} s")
    if gen.drafted:
        summary += f", drafts accepted {gen.accepted}/{gen.drafted}"
    print(summary + "]", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="openjet-launch",
        description="Run Qwen3.8-27B on one NVIDIA GPU. Without a command: download the model if needed, "
                    "detect the GPU, choose settings, start the server and show a tray icon. "
                    "Without a usable GPU: openjet-launch --engine reference --model demo")
    from .launcher.main import add_default_options
    add_default_options(p)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    q = sub.add_parser("inspect", help="describe a GGUF file and say whether OpenJet can run it",
                       description="Read a GGUF file's metadata and tensor list; check the Qwen3.8 config and "
                                   "the quantisation recipe. Exit code 0 only for a file OpenJet can run.")
    q.add_argument("file", metavar="FILE.gguf")
    q.add_argument("--json", action="store_true", help="print the full report as JSON")
    q.set_defaults(func=_cmd_inspect)

    s = sub.add_parser("synth", help="write a synthetic Qwen3.8 model (random weights) for tests and benchmarks",
                       description="Write a qwen35 GGUF with random weights in the unsloth Q4_K_M recipe. "
                                   "Presets: tiny (CPU tests, ~6 MB), small (GPU tests), full (the exact 27B "
                                   "shapes, about 17.1 GB; uses up to 16 cores).")
    s.add_argument("--preset", required=True, choices=["tiny", "small", "full"])
    s.add_argument("out", metavar="OUT.gguf")
    s.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    s.add_argument("--workers", type=int, default=None, help="processes for quantisation (default: for full, all cores up to 16)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--force", action="store_true", help="replace OUT.gguf if it exists (a regular file only)")
    s.add_argument("--codes", choices=["quantised", "random"], default="quantised",
                   help="quantised (default): the random init's floats quantised; random: random k-quant/Q8_0 "
                        "codes with scales giving the same mean and std, for speed benchmarks (~40x less CPU to write)")
    s.set_defaults(func=_cmd_synth)

    r = sub.add_parser("run", help="generate text from a GGUF on the CPU reference engine (debugging)",
                       description="Generate from a GGUF with the numpy reference engine: slow, exact, for "
                                   "test-size models. Greedy unless --temperature is given.")
    r.add_argument("model", metavar="MODEL", help="path of a qwen35 GGUF file, or 'demo' (the bundled demo model)")
    r.add_argument("-p", "--prompt", required=True, help="the prompt text (the user message with --chat)")
    r.add_argument("-n", "--n-tokens", type=int, default=64, help="tokens to generate at most (default 64)")
    r.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    r.add_argument("--system", default=None, help="system message (with --chat)")
    r.add_argument("--no-think", action="store_true", help="with --chat: enable_thinking=false")
    r.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: greedy)")
    r.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    r.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1.0 = off)")
    r.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p x the top probability")
    r.add_argument("--seed", type=int, default=None, help="sampling seed")
    r.add_argument("--draft", type=int, default=0, metavar="N",
                   help="MTP speculative decoding with at most N drafts per step (greedy: the same output; "
                        "sampled: the same distribution)")
    r.set_defaults(func=_cmd_run)

    from .launcher.doctor import add_doctor_parser
    from .launcher.download import add_download_parser
    from .launcher.presets import add_presets_parser
    from .server.cli import add_serve_parser
    add_download_parser(sub)
    add_serve_parser(sub)
    add_doctor_parser(sub)
    add_presets_parser(sub)

    pr = sub.add_parser("probe", help="what the GPU engine sees: driver, devices, compiled architectures",
                        description="Load the native engine library and report CUDA driver/runtime versions, "
                                    "every GPU and whether a kernel launches on it (JSON).")
    pr.set_defaults(func=_cmd_probe)
    return p


def _options_before_the_command(argv: list[str]) -> list[str]:
    """The default action's options given before a subcommand (`openjet-launch --api-key K serve ...`): the
    subcommand's parser has options of the same names, whose defaults argparse would put over them, silently (a
    server without the key asked for)."""
    from .launcher.main import add_default_options

    top = argparse.ArgumentParser(add_help=False)
    add_default_options(top)
    top.add_argument("rest", nargs=argparse.REMAINDER)
    given, _ = top.parse_known_args(argv)
    return [a.option_strings[-1] for a in top._actions
            if a.dest != "rest" and getattr(given, a.dest, None) != a.default]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        from .launcher.main import run_default
        return run_default(args)       # the default action: download, detect, serve, tray
    if early := _options_before_the_command(argv):
        command = parser._subparsers._group_actions[0].choices[args.command]
        theirs = {o for a in command._actions for o in a.option_strings}
        if early[0] in theirs:
            parser.error(f"{', '.join(early)} before `{args.command}` would be ignored: put it after the command "
                         f"(openjet-launch {args.command} ... {early[0]} ...)")
        parser.error(f"{early[0]} does not apply to `{args.command}` (it is an option of the launch itself: "
                     f"openjet-launch {early[0]} ... without a command)")
    try:
        return args.func(args)
    except OpenJetError as e:
        print(f"openjet-launch {args.command}: error: {e}", file=sys.stderr)
        return getattr(e, "exit_code", 1)
    except KeyboardInterrupt:
        print(f"openjet-launch {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader left (`| head`): no traceback, and none when Python flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
