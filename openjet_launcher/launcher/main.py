"""`openjet-launch` with no command: from nothing to a served model with a tray icon.

    lock (one launcher per user) -> port free? -> tray icon where there is a display (amber: preparing) ->
    engine: the GPU checked and settings chosen, or the CPU path explained -> model file (download, its
    percent in the tray; or the bundled demo) -> can our engine run it? (else `--fallback llama-server`) ->
    Supervisor starts the server -> the icon (or the terminal's status line) follows it -> Quit / Ctrl-C
    stops the server (or cancels the download: it resumes next time) and releases the lock.

cli.py wires `add_default_options(parser)` into the top-level parser and calls `run_default(args)` when no
subcommand is given.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import OpenJetError
from ..model.shape import QWEN38_27B, ModelShape
from . import dirs
from .presets import CPU_PATH
from .supervisor import (EVERY_ADDRESS, FAILED, AlreadyRunning, InstanceLock, Supervisor, TerminalStatus, bind_problem,
                         health_url, port_number, serve_command)

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8080
LOCK_NAME = "openjet-launch.lock"
SERVE_PREFIX: list[str] | None = None  # None: `python -m openjet_launcher serve` (tests point it elsewhere)
EXIT_ALREADY_RUNNING = 3
SERVE_KV = {"fp16": "f16", "q8_0": "q8_0"}  # the presets' KV format -> `serve --kv` (the CUDA engine's names)
# At most this many MTP drafts per step on the CUDA engine: each cycle drafts as many as draft_depth.DraftDepth
# expects to pay best (acceptance measured per depth, the H200's cycle costs). On the demo model's acceptance
# with the 27B's H200 cycle costs (bench/draft_depth.py: random, repeated-phrase and stdlib-code prompts) it
# came within 1.6% of the best fixed depth each time (2, 2 and 3 there) and 3% above a fixed 3 twice, allowed
# 3 or 7 alike; 7 lets text that repeats draft deep.
DEFAULT_DRAFTS = 7


def add_default_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "serving (what `openjet-launch` does with no command)",
        "Download the model if needed, check the GPU, pick settings that fit it, start the server at "
        f"http://{DEFAULT_HOST}:{DEFAULT_PORT}/v1 and show a tray icon. No NVIDIA GPU? `{CPU_PATH}` serves a "
        "tiny demo model on the CPU to try the API and your clients.")
    g.add_argument("--model", default=None, metavar="REPO/FILE|PATH|demo",
                   help="the model: a Hugging Face REPO/FILE, a local .gguf path, or 'demo' (the small trained "
                        "model bundled for the CPU path). Default: unsloth/Qwen3.8-27B-GGUF/Qwen3.8-27B-Q4_K_M.gguf")
    g.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to listen on (default {DEFAULT_HOST}: this machine only; 0.0.0.0 opens it to "
                        "the network, use --api-key then)")
    g.add_argument("--port", type=port_number, default=DEFAULT_PORT, help=f"port, 1..65535 (default {DEFAULT_PORT})")
    g.add_argument("--ctx", type=int, default=None, metavar="TOKENS",
                   help="context length per conversation (default: the most that fits the GPU)")
    g.add_argument("--gpu", type=int, default=None, metavar="N",
                   help="use GPU N, numbered as nvidia-smi numbers them (default: the one with the most free memory)")
    g.add_argument("--engine", choices=["cuda", "reference"], default=None,
                   help="cuda: the fast GPU engine (default with a usable GPU); reference: the exact, slow CPU "
                        "engine (default for --model demo)")
    g.add_argument("--api-key", default=None, metavar="KEY",
                   help="require this key from clients (default $OPENJET_API_KEY; none on 127.0.0.1)")
    g.add_argument("--fallback", choices=["llama-server"], default=None,
                   help="for a GGUF OpenJet's engine cannot run (another quant or architecture), serve it with "
                        "llama.cpp's llama-server from PATH instead, with the same host, port and context")
    g.add_argument("--draft", type=int, default=None, metavar="N",
                   help=f"MTP speculative decoding on the GPU with at most N drafts per step, as many as pay "
                        f"(0 turns it off; default {DEFAULT_DRAFTS}, what one GPU step verifies); the output is what "
                        "plain decoding gives")
    g.add_argument("--no-tray", action="store_true",
                   help="no tray icon: status in the terminal, Ctrl-C stops (headless machines, services)")
    g.add_argument("--chat-url", default=None, metavar="URL",
                   help="what the tray's 'Open chat' opens, e.g. your Open WebUI (default $OPENJET_CHAT_URL or "
                        "http://localhost:3000)")


@dataclass
class LaunchPlan:
    """What to run and how to describe it."""

    command: list[str]
    model_label: str
    device_label: str
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _say(text: str) -> None:
    print(f"openjet-launch: {text}", file=sys.stderr, flush=True)


def _no_gpu_message(hw, model: str) -> str:
    why = [p.message for p in hw.why_not()] or ["no usable NVIDIA GPU was found"]
    return (f"OpenJet cannot serve {model} on this machine's GPU:\n  - " + "\n  - ".join(why) +
            f"\nTo try the API and your clients on the CPU (a tiny demo model, slow but exact):\n  {CPU_PATH}\n"
            "`openjet-launch doctor` shows the full report.")


def _unreadable(path: Path) -> str | None:
    """Why `path` is no GGUF file at all (then llama-server cannot help either), or None."""
    from ..model.gguf_file import GGUFFile

    if not path.is_file():
        return f"{path}: not a file"
    try:
        GGUFFile(path)
    except Exception as e:  # the reader's words; OpenJetError already says what it found
        return str(e) if isinstance(e, OpenJetError) else f"{path}: not a readable GGUF file ({e})"
    return None


def _our_engine_problem(path: Path) -> str | None:
    """None when OpenJet's engine runs this file, else why not."""
    from ..model.inspect import inspect_file

    try:
        report = inspect_file(str(path))
    except OpenJetError as e:
        return str(e)
    except Exception as e:  # another architecture or a damaged file: the reader's words
        return f"{path.name} could not be read as a Qwen3.8 model ({type(e).__name__}: {e})"
    if report["runnable"]:
        return None
    recipe = report["recipe"]
    return recipe.get("problem") or f"{recipe.get('kind')} recipe: OpenJet has no engine for it yet"


def _local_model(spec: str | None) -> Path | None:
    """The model's file when it is already here without a download (the demo, a path), else None."""
    if spec == "demo":
        from ..server.cli import demo_model_path

        return demo_model_path()
    path = Path(spec).expanduser() if spec else None
    return path if path is not None and path.is_file() else None


def _file_shape(path: Path | None) -> ModelShape | None:
    """The shape a GGUF declares (n_nextn 0 where it has no MTP head) for the memory plan, or None when it cannot
    be read (what is wrong with such a file is said by the checks that need it)."""
    if path is None:
        return None
    from ..model.config import read_config
    from ..model.gguf_file import GGUFFile

    try:
        config = read_config(GGUFFile(path))
    except Exception:
        return None
    return config.shape if config.has_mtp else dataclasses.replace(config.shape, n_nextn=0)


def _resolve_model(spec: str | None, progress=None) -> Path:
    """'demo', a path, or a Hugging Face spec (the default model when none is given), as `serve` resolves it;
    progress(done_bytes, total_bytes) as a download goes (the tray's status)."""
    if spec is None:
        from .download import ensure_model

        return ensure_model(None, progress=progress).path
    from ..server.cli import model_path

    return model_path(spec, progress=progress)


def plan_launch(args: argparse.Namespace, progress=None) -> LaunchPlan:
    """Decide engine, model file, settings and command; raises OpenJetError with what to do. progress: as
    download.ensure_model takes it."""
    demo = args.model == "demo"
    engine = args.engine or ("reference" if demo else "cuda")
    if args.draft is not None:
        from ..draft_depth import check_draft_count

        check_draft_count(args.draft)
    if args.ctx is not None:
        from ..server.cli import check_ctx

        check_ctx(args.ctx)  # the server's rule, before a server is started only to crash on it
    from ..server.cli import api_key_setting, is_loopback

    notes: list[str] = []
    env: dict[str, str] = {}
    api_key = api_key_setting(args.api_key)
    if api_key:
        env["OPENJET_API_KEY"] = api_key  # through the environment: never visible in the process list
    elif not is_loopback(args.host):  # the server logs this too, but its log is not the user's terminal
        notes.append(f"warning: listening on {args.host} without an API key: anyone who can reach this "
                     "machine can use the model (set --api-key or OPENJET_API_KEY)")

    gpu = None
    gpu_problem = None
    if engine == "cuda":                       # the demo model too: it is a Q4_K_M file the GPU engine loads
        from ..server.cli import ENGINES

        from .hardware import detect
        hw = detect(args.gpu, model=_file_shape(_local_model(args.model)) or QWEN38_27B, ctx=args.ctx)
        if hw.chosen is None:
            gpu_problem = _no_gpu_message(hw, "Qwen3.8-27B" if args.model is None else
                                          "the demo model" if demo else args.model)
        elif "cuda" not in ENGINES:
            gpu_problem = (f"this OpenJet build's server has no CUDA engine yet ({hw.chosen.label} was found). "
                           f"The CPU path works today: {CPU_PATH}")
        else:
            gpu = hw.chosen
        if gpu_problem and not args.fallback:
            raise OpenJetError(gpu_problem)
    else:
        if not demo:
            notes.append("the reference engine runs on the CPU in fp32: fine for test-size models, far too slow "
                         "for Qwen3.8-27B")
        if args.gpu is not None:
            notes.append(f"--gpu {args.gpu} does not apply: the reference engine runs on the CPU")

    path = _resolve_model(args.model, progress)
    problem = None if demo else _our_engine_problem(path)
    if gpu_problem and not problem:
        problem = gpu_problem.splitlines()[0]
    if problem:
        if unreadable := _unreadable(path):  # not a model file at all: llama-server cannot serve it either
            raise OpenJetError(unreadable)
        if not args.fallback:
            raise OpenJetError(f"{problem}\nTo serve this file with llama.cpp instead: "
                               f"openjet-launch --model {path} --fallback llama-server")
        from .fallback import api_key_env, fallback_command

        notes.append(f"OpenJet's engine cannot run {path.name} ({problem}); serving it with llama-server")
        command = fallback_command(args.fallback, path, host=args.host, port=args.port, ctx=args.ctx)
        env.pop("OPENJET_API_KEY", None)
        env.update(api_key_env(api_key))
        if gpu is not None:  # the GPU chosen (--gpu), as for our engine: llama.cpp would spread over every visible one
            env["CUDA_VISIBLE_DEVICES"] = gpu.uuid
        return LaunchPlan(command, path.name, "llama-server", env, notes)

    ctx = args.ctx
    extra: list[str] = []
    device = "CPU (reference engine)"
    if gpu is not None:
        from .presets import choose_settings

        s = choose_settings(gpu.total_memory_bytes, gpu.free_memory_bytes, gpu.sm_count, gpu.compute_capability,
                            requested_ctx=args.ctx,   # within what the CUDA engine v1 does (presets.CUDA_V1)
                            model=_file_shape(path) or QWEN38_27B)
        ctx = s.n_ctx
        n_draft = DEFAULT_DRAFTS if args.draft is None else args.draft
        extra = ["--kv", SERVE_KV[s.kv_format], "--draft", str(n_draft), "--prefill-chunk", str(s.prefill_chunk)]
        env["CUDA_VISIBLE_DEVICES"] = gpu.uuid  # by uuid: CUDA's order may differ from nvidia-smi's
        device = gpu.label
        notes.append(f"{gpu.label}: KV {s.kv_format}, context {s.n_ctx} tokens, prefill chunk {s.prefill_chunk}")
    elif args.draft is not None:
        extra = ["--draft", str(args.draft)]  # the reference engine speculates too (exact, slow)
    command = serve_command(path, engine=engine, host=args.host, port=args.port, ctx=ctx, extra=extra,
                            prefix=SERVE_PREFIX)
    return LaunchPlan(command, "demo" if demo else path.name, device, env, notes)


def run_default(args: argparse.Namespace) -> int:
    """The default action; returns the exit status (0 after a clean stop, 1 on failure, 3 if already running)."""
    _stop_on_signals()
    try:
        lock = InstanceLock(dirs.ensure_dir(dirs.config_dir(), "OPENJET_CONFIG_DIR") / LOCK_NAME, args.host,
                            args.port)
        lock.acquire()
    except AlreadyRunning as e:
        _say(str(e))
        return EXIT_ALREADY_RUNNING
    except OpenJetError as e:
        _say(f"error: {e}")
        return 1
    except OSError as e:  # a config folder we may not write in (ensure_dir checks it exists, not that)
        where = Path(e.filename or lock.path)
        if isinstance(e, PermissionError) and where.exists() and os.access(where.parent, os.W_OK):
            _say(f"error: the launcher's lock {where} belongs to another user (an earlier `sudo openjet-launch`?): "
                 "remove it, or set OPENJET_CONFIG_DIR to another folder")
        else:
            _say(f"error: cannot write the launcher's lock {where}: {e.strerror or e}. Set OPENJET_CONFIG_DIR to a "
                 "folder you can write")
        return 1
    try:
        return _serve(args)
    except OpenJetError as e:
        _say(f"error: {e}")
        return 1
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    finally:
        lock.release()


def _interrupt(*_):
    raise KeyboardInterrupt  # unwinds through _serve's `finally`: the server stops, the lock goes


def _on_stop_signals(handler) -> None:
    """handler for Ctrl-C, SIGTERM and a closed terminal (SIGHUP), where this platform has them, on the main thread
    only; a signal that was ignored when we started (nohup) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        return
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None and signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, handler)


def _stop_on_signals() -> None:
    """Those signals stop the server and release the lock, at any point (a download included)."""
    _on_stop_signals(_interrupt)


def _serve(args: argparse.Namespace) -> int:
    if problem := bind_problem(args.host, args.port):
        raise OpenJetError(problem)
    if not args.no_tray:
        from .tray import tray_unavailable_reason

        reason = tray_unavailable_reason()
        if reason is None:
            return _serve_in_tray(args)
        _say(f"no tray icon: {reason}; running in the terminal (--no-tray hides this line)")
    sup, status = _supervisor(args, plan_launch(args))
    sup.start()
    try:
        return _run_terminal(sup)
    finally:
        status.close()
        _stop_server(sup)


def _url_shown(args: argparse.Namespace) -> str:
    from .menu import api_base_url

    url = api_base_url(args.host, args.port)
    if args.host in EVERY_ADDRESS:  # the URL is this machine's; say where the network reaches it
        return f"{url} (listening on every address of this machine, port {args.port})"
    return url


def _supervisor(args: argparse.Namespace, plan: LaunchPlan, log_dir: Path | None = None
                ) -> tuple[Supervisor, TerminalStatus]:
    """The server's Supervisor for `plan` (not started), with the terminal's status line on it."""
    for note in plan.notes:
        _say(note)
    sup = Supervisor(plan.command, health_url(args.host, args.port),
                     log_dir=log_dir or dirs.ensure_dir(dirs.log_dir(), "OPENJET_LOG_DIR"),
                     env={**os.environ, **plan.env})
    status = TerminalStatus(plan.model_label, _url_shown(args))
    sup.on_state(status)
    _say(f"server log: {sup.log_path}")
    return sup, status


def _labels_before_plan(args: argparse.Namespace) -> tuple[str, str]:
    """The tray's model and device words until plan_launch has decided them."""
    from .download import DEFAULT_FILE

    model = "demo" if args.model == "demo" else (Path(args.model).name if args.model else DEFAULT_FILE)
    cpu = (args.engine or ("reference" if args.model == "demo" else "cuda")) != "cuda"
    return model, "CPU (reference engine)" if cpu else "GPU not chosen yet"


def _stderr_is_terminal() -> bool:
    return sys.stderr is not None and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


def _serve_in_tray(args: argparse.Namespace) -> int:
    """The tray icon first, then the plan (a download shows its percent there), then the server.

    A preparation that fails is printed; on a terminal the launcher then ends with status 1 as without a tray, and
    from the desktop (no terminal) the icon stays red with the reason until Quit (its Start tries again)."""
    from .menu import TrayController
    from .preparation import LaunchSession

    statuses: list[TerminalStatus] = []

    def make_supervisor(plan: LaunchPlan) -> Supervisor:
        sup, status = _supervisor(args, plan, log_dir)
        statuses.append(status)
        controller.model, controller.gpu = plan.model_label, plan.device_label
        return sup

    log_dir = dirs.ensure_dir(dirs.log_dir(), "OPENJET_LOG_DIR")
    session = LaunchSession(lambda progress: plan_launch(args, progress), make_supervisor, log_dir=log_dir)
    model, device = _labels_before_plan(args)
    controller = TrayController(session, model=model, gpu=device, host=args.host, port=args.port, log_dir=log_dir,
                                chat_url=args.chat_url)
    on_terminal = _stderr_is_terminal()

    def preparation_failed(state: str, message: str) -> None:
        if state == FAILED and session.supervisor is None:
            _say(f"error: {message}")
            if on_terminal:
                controller.quit_requested.set()
    session.on_state(preparation_failed)
    session.start()
    try:
        code = _run_tray(controller)
    finally:
        for status in statuses:
            status.close()
        _stop_server(session)
    return 1 if session.supervisor is None and session.state == FAILED else code


def _stop_server(sup) -> None:
    """Stop a Supervisor, or a LaunchSession (its download cancelled, or its server stopped)."""
    _stop_on_signals()  # the tray's handlers only ask it to quit
    if sup.proc is not None and sup.proc.poll() is None:
        _say(f"stopping the server (up to {sup.stop_timeout_s:g} s; Ctrl-C again ends it at once) ...")
    sup.stop()  # a signal while it waits kills the child (Supervisor.stop)


def _run_terminal(sup: Supervisor) -> int:
    """Wait for Ctrl-C (or SIGTERM, SIGHUP); a server that failed for good ends the launcher with status 1."""
    failed = threading.Event()
    sup.on_state(lambda s, m: failed.set() if s == FAILED else None)
    if sup.state == FAILED:  # it failed before the callback was there (sup.start() comes first)
        failed.set()
    try:
        while not failed.wait(0.5):
            pass
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 0
    return 1


def _run_tray(controller) -> int:
    from .tray import Tray

    try:
        tray = Tray(controller)
    except Exception as e:  # a backend that imports but cannot start: the terminal still works
        _say(f"no tray icon ({type(e).__name__}: {e}); running in the terminal")
        return _run_terminal(controller.supervisor)
    _on_stop_signals(lambda *_: controller.quit_requested.set())
    tray.run()
    _say("quit")
    return 0
