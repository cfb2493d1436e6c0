"""`openjet-launch serve MODEL`: load a GGUF, warm up, serve the HTTP API with uvicorn.

The lead wires `add_serve_parser(subparsers)` into openjet_launcher/cli.py.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import logging
import os
import re
import sys
from importlib import resources
from pathlib import Path

from ..errors import ModelFileError, ModelLoadError, OpenJetError
from .errors import escape_for_log
from .settings import ServerSettings

log = logging.getLogger("openjet.server")

ENGINES = ("reference", "cuda")    # cuda: engine v1 (native/include/openjet_engine.h)
MIN_CTX = 16                       # tokens: the warm-up prompt, a chat template's frame and a few tokens of answer


def check_ctx(n_ctx: int) -> int:
    """`--ctx N` as the server and the launcher take it; else an OpenJetError."""
    if n_ctx < MIN_CTX:
        raise OpenJetError(f"--ctx {n_ctx} is too small: give at least {MIN_CTX} tokens")
    return n_ctx


def _at_least_one(text: str) -> int:
    """A serve limit (connections, bytes, queue): an integer >= 1 (0 or less made a server that refuses everything
    while /health says it is up)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of at least 1")
    return value


def positive_seconds(text: str) -> float:
    """A timeout option (argparse's type): a finite number of seconds above 0, at most a day."""
    import math

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= 86400):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of seconds above 0 (at most 86400)")
    return value


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    from ..launcher.supervisor import port_number

    p = subparsers.add_parser(
        "serve", help="serve a model over HTTP (OpenAI chat completions, completions, Responses; Anthropic messages)",
        description="Serve a qwen35 GGUF over HTTP: /v1/chat/completions, /v1/completions, /v1/responses, "
                    "/v1/messages, /v1/models, /health, /props, /metrics, /tokenize, /detokenize. MODEL 'demo' "
                    "serves the small trained demo model bundled with the package (27 MB, docs/DEMO_MODEL.md); a "
                    "Hugging Face REPO/FILE.gguf is downloaded into the models folder and verified.")
    D = ServerSettings()
    p.add_argument("model", metavar="MODEL",
                   help="path of a qwen35 GGUF file, a Hugging Face REPO/FILE.gguf or REPO (downloaded on first "
                        "use), or 'demo'")
    p.add_argument("--engine", choices=ENGINES, default="reference", help="which engine runs the model: reference (numpy, CPU, exact; test-size models) or cuda (the GPU engine v1)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=port_number, default=8080, help="port, 1..65535 (default 8080)")
    p.add_argument("--ctx", type=int, default=None, metavar="N",
                   help="context size in tokens, prompt and output together (default: the model's, at most 32768)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="require this key (Authorization: Bearer KEY or x-api-key); default $OPENJET_API_KEY")
    from ..engine.cuda import KV_TYPES, PREFILL_ROWS, PREFILL_ROWS_MAX

    p.add_argument("--kv", choices=list(KV_TYPES), default=None,
                   help="the CUDA engine's KV cache format (default f16; q8_0 holds about twice the context; "
                        "openjet-launch picks it per GPU)")
    p.add_argument("--draft", type=int, default=0, metavar="N",
                   help="MTP speculative decoding with at most N drafts per step (each step drafts as many as "
                        "the request's acceptance so far makes pay), for requests without penalties; the tokens "
                        "keep their distribution (greedy: the same tokens). Default 0, at most 7")
    p.add_argument("--prefill-chunk", type=int, default=None, metavar="N",
                   help=f"the CUDA engine's prompt tokens per prefill chunk, 1..{PREFILL_ROWS_MAX} (default "
                        f"{PREFILL_ROWS}; each chunk reads the weights once and takes ~260 KB of GPU memory per "
                        "token at 27B; openjet-launch picks it per GPU)")
    p.add_argument("--model-id", default=None, help="the id /v1/models reports (default: the file name)")
    limits = p.add_argument_group("limits (on by default; see openjet_launcher/server/limits.py)")
    limits.add_argument("--max-tokens", type=int, default=None, metavar="N",
                        help=f"per-request ceiling on generated tokens; a larger max_tokens is clamped "
                             f"(default {D.max_tokens_ceiling})")
    limits.add_argument("--stall-timeout", type=positive_seconds, default=60.0, metavar="S",
                        help="a stream reader that reads nothing for S seconds counts as gone and its generation "
                             "stops (default 60)")
    limits.add_argument("--max-connections", type=_at_least_one, default=D.max_connections, metavar="N",
                        help=f"simultaneous connections; a request on one more is answered 503 "
                             f"(default {D.max_connections})")
    limits.add_argument("--request-timeout", type=positive_seconds, default=D.request_timeout_s, metavar="S",
                        help=f"a request's headers and body must arrive within S seconds, else 408 and the "
                             f"connection is closed (default {D.request_timeout_s:g})")
    limits.add_argument("--keep-alive", type=positive_seconds, default=D.keep_alive_s, metavar="S",
                        help=f"an idle keep-alive connection is closed after S seconds (default {D.keep_alive_s:g})")
    limits.add_argument("--max-body", type=_at_least_one, default=D.max_body_bytes, metavar="BYTES",
                        help=f"largest request body; larger is a 413 (default {D.max_body_bytes})")
    limits.add_argument("--max-inflight", type=_at_least_one, default=D.max_inflight_bytes, metavar="BYTES",
                        help=f"request body bytes held at once over all connections; past it a 503 "
                             f"(default {D.max_inflight_bytes})")
    limits.add_argument("--max-queue", type=_at_least_one, default=D.max_queue, metavar="N",
                        help=f"requests waiting for the engine; more is a 503 (default {D.max_queue})")
    p.set_defaults(func=cmd_serve)
    return p


DEMO_FILE = "openjet-demo.gguf"  # openjet_launcher/assets/: the trained demo model (docs/DEMO_MODEL.md)
_verified_demo: set[Path] = set()  # files whose sha256 this process has checked


def bundled_demo_file() -> Path:
    """Where the package keeps the trained demo model. The file may be absent (a source checkout without it)."""
    ref = resources.files("openjet_launcher").joinpath("assets").joinpath(DEMO_FILE)
    # A wheel or a checkout gives a pathlib.Path (the engines map the file); any other Traversable: beside us.
    return ref if isinstance(ref, Path) else Path(__file__).resolve().parents[1] / "assets" / DEMO_FILE


def _recorded_sha256(path: Path) -> str:
    """The sha256 recorded beside the file, in `sha256sum` format (`PATH.sha256`: "HEX  NAME")."""
    sums = path.with_name(path.name + ".sha256")
    try:
        line = sums.read_text(encoding="utf-8").strip()
    except OSError:
        line = ""
    m = re.fullmatch(r"([0-9a-f]{64}) [ *](\S+)", line)
    if not m or m.group(2) != path.name:
        raise ModelFileError(f"{sums}: missing or not a sha256sum line for {path.name}; this OpenJet install is "
                             f"incomplete: reinstall openjet-launcher (pip install --force-reinstall openjet-launcher)")
    return m.group(1)


def verify_demo_model(path: Path) -> Path:
    """Check the bundled demo model against its recorded sha256, once per process and file (~50 ms)."""
    if path in _verified_demo:
        return path
    want = _recorded_sha256(path)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != want:
        raise ModelFileError(f"{path}: the bundled demo model is damaged (sha256 {digest.hexdigest()}, expected "
                             f"{want}); reinstall openjet-launcher (pip install --force-reinstall openjet-launcher)")
    _verified_demo.add(path)
    return path


def synthetic_demo_path() -> Path:
    """The tiny synthetic model (random weights) in the cache folder (`$OPENJET_CACHE`, launcher/dirs.py),
    written on first use: the demo when the package has no trained one."""
    from ..launcher.dirs import cache_dir, ensure_dir

    path = cache_dir() / "models" / "openjet-synthetic-tiny.gguf"
    if not path.exists():
        from ..model.synth import synthesize
        ensure_dir(path.parent, "OPENJET_CACHE")  # (a file there, no permission: one line naming the setting)
        tmp = path.with_suffix(".gguf.tmp")
        synthesize("tiny", tmp, show_progress=False)
        tmp.replace(path)
    return path


def demo_model_path() -> Path:
    """MODEL 'demo': the trained demo model bundled in the package, checked against its sha256 (a mismatch is
    an error, never a silent fallback). Without the file (a source checkout where it was removed), the
    synthetic `tiny` model, with a one-line warning on stderr."""
    path = bundled_demo_file()
    if path.is_file():
        return verify_demo_model(path)
    print(f"openjet-launch: warning: the bundled demo model ({path}) is missing; serving the synthetic tiny "
          f"model with random weights instead (its text is noise)", file=sys.stderr, flush=True)
    return synthetic_demo_path()


def model_path(spec: str, progress=None) -> Path:
    """MODEL as `serve` takes it: 'demo', a path, else a Hugging Face REPO/FILE.gguf or REPO, downloaded into the
    models folder and verified when missing (launcher/download.py; its errors say what to give instead);
    progress: as ensure_model takes it."""
    if spec == "demo":
        return demo_model_path()
    path = Path(spec).expanduser()
    if path.exists():
        return path
    from ..launcher.download import ensure_model

    return ensure_model(spec, progress=progress).path


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def draft_vocabulary(tokenizer):
    """The shipped draft-vocabulary list (model/draft_vocab.py) mapped onto this model's tokens (sorted int32
    ids), or None (the MTP head then drafts over the full vocabulary); logged either way."""
    from ..model.draft_vocab import DraftVocabError, draft_ids_for

    try:
        mapping = draft_ids_for(tokenizer)
    except DraftVocabError as e:
        log.warning("draft vocabulary unreadable, drafting over the full vocabulary: %s", escape_for_log(e))
        return None
    log.info("%s", escape_for_log(mapping.describe()))
    return mapping.ids


def api_key_setting(value: str | None) -> str | None:
    """--api-key's value, else OPENJET_API_KEY, stripped (header values arrive stripped: a key read with its secret
    file's newline matched no client); None where neither gives a key."""
    return (value or os.environ.get("OPENJET_API_KEY") or "").strip() or None


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from ..model.config import read_config
    from ..model.gguf_file import GGUFFile
    from ..reference import ReferenceEngine
    from ..text.chat import ChatTemplate, ChatTemplateError
    from ..text.tokenizer import Tokenizer
    from .app import create_app
    from .limits import uvicorn_options

    from ..draft_depth import check_draft_count
    from ..launcher.supervisor import bind_problem, die_with_parent

    die_with_parent()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(name)s: %(message)s")
    check_draft_count(args.draft)
    if args.ctx is not None:
        check_ctx(args.ctx)  # before the bind check and the load
    from ..engine.cuda import PREFILL_ROWS, PREFILL_ROWS_MAX

    if args.max_tokens is not None and args.max_tokens < 1:  # (before a download of the model, too)
        raise OpenJetError(f"--max-tokens {args.max_tokens}: a request must be allowed at least 1 token")
    if args.prefill_chunk is not None and not 1 <= args.prefill_chunk <= PREFILL_ROWS_MAX:
        raise OpenJetError(f"--prefill-chunk {args.prefill_chunk}: expected 1..{PREFILL_ROWS_MAX} tokens")
    if problem := bind_problem(args.host, args.port):  # before the model loads, which can take minutes
        raise OpenJetError(problem)
    path = model_path(args.model)
    if not path.is_file():
        raise OpenJetError(f"{path}: no such file")
    gguf = GGUFFile(path)
    config = read_config(gguf)
    tokenizer = Tokenizer.from_gguf(gguf)
    try:
        template = ChatTemplate.from_gguf(gguf)
    except ChatTemplateError as e:
        log.warning("%s: /v1/chat/completions is off", escape_for_log(e))
        template = None
    n_ctx_train = config.shape.n_ctx_train
    n_ctx = args.ctx if args.ctx is not None else check_ctx(min(n_ctx_train, 32768))
    if n_ctx > n_ctx_train:
        log.warning("--ctx %d is beyond the model's training context of %d tokens", n_ctx, n_ctx_train)
    api_key = api_key_setting(args.api_key)
    if not is_loopback(args.host) and not api_key:
        log.warning("listening on %s without an API key: anyone who can reach this address can use the model "
                    "(set --api-key or OPENJET_API_KEY)", escape_for_log(args.host))
    settings = ServerSettings(model_id=args.model_id or path.name, engine_name=args.engine, host=args.host,
                              port=args.port, n_ctx=n_ctx, api_key=api_key, n_draft=args.draft,
                              stall_timeout_s=args.stall_timeout, max_connections=args.max_connections,
                              request_timeout_s=args.request_timeout, keep_alive_s=args.keep_alive,
                              max_body_bytes=args.max_body, max_inflight_bytes=args.max_inflight,
                              max_queue=args.max_queue)
    if args.max_tokens is not None:
        settings.max_tokens_ceiling = args.max_tokens
    if args.engine == "cuda":
        from ..engine.cuda import CudaEngine
        from ..launcher.memory import STATE_COPIES, V1_CHECKPOINTS
        from ..sampling import GPU_MAX_TOP_K

        settings.max_top_k = GPU_MAX_TOP_K       # the API contract of the GPU path (design.md §6)
        # Without drafts the MTP head is left on the host: less memory, and no per-step cache fill. With
        # them, the host runs each cycle (speculative.py); the device keeps the state a rejection returns to.
        use_mtp = args.draft > 0
        draft_ids = draft_vocabulary(tokenizer) if use_mtp else None

        kv_type = args.kv or "f16"
        # The launcher's memory plan holds STATE_COPIES states (launcher/memory.py): the live one, the one a
        # rejected draft returns to (with drafts the engine's own verify shadow, else a checkpoint) and a
        # checkpoint at the prompt's end.
        n_checkpoints = V1_CHECKPOINTS if use_mtp else STATE_COPIES - 1

        def load():
            engine = CudaEngine.load(path, n_ctx=n_ctx, kv_type=kv_type, n_checkpoints=n_checkpoints, mtp=use_mtp,
                                     prefill_rows=args.prefill_chunk or PREFILL_ROWS)
            if draft_ids is not None and engine.has_mtp:
                engine.set_draft_vocabulary(draft_ids)
            return engine
    else:
        if args.kv:
            log.warning("--kv %s: the reference engine keeps its caches in float32; ignored", args.kv)
        if args.prefill_chunk:
            log.warning("--prefill-chunk %d: the reference engine's prefill is not chunked that way; ignored",
                        args.prefill_chunk)
        load = lambda: ReferenceEngine.load(path)  # noqa: E731
    server: uvicorn.Server | None = None

    def load_failed(_: str) -> None:
        server.should_exit = True  # a failed load never gets better: exit, and say why below

    app = create_app(load, tokenizer, template, settings, on_load_failed=load_failed)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="info",
                                           **uvicorn_options(settings)))
    log.info("serving %s on http://%s:%d/v1 (n_ctx %d, engine %s)", escape_for_log(path.name), args.host,
             args.port, n_ctx, args.engine)
    server.run()
    if error := app.state.core.worker.load_error:
        raise ModelLoadError(f"the model failed to load: {error}")
    if error := app.state.core.worker.engine_error:
        raise OpenJetError(f"the engine failed while serving and was stopped: {error}")
    return 0
