"""Live servers for the HTTP tests: uvicorn in a thread on a free loopback port, the tiny synthetic
model (module-scoped) or a scripted engine double.

Which engine serves the tiny model: OPENJET_TEST_ENGINE=reference (default: the numpy ReferenceEngine, with
2 MTP drafts per greedy step) or cuda (the GPU engine v1, built exactly as `serve MODEL --engine cuda` builds
it: server/cli.py's own code path, so top_k <= 32, also with 2 drafts). scripts/gpu_server_tests.sh runs the cuda
mode on the GPU machine. What the switch changes:

* `tiny_server` (test_openai_api, test_anthropic_api, test_responses_api: the model-backed API tests) and the
  live `serve` launch of test_serve_cli run on the chosen engine. Those tests check the API's shape, usage,
  timings, streaming == non-streaming, seeded repeats and conversation reuse: none depends on what the
  random tiny model writes, so they run on either engine.
* Under cuda, without a GPU or a built engine library, they skip with the GPU probe's reason (the same
  probe as the `gpu` marker's, tests/conftest.py); OPENJET_REQUIRE_GPU=1 makes that a failure instead.
* Every model-backed test runs on both engines, the speculative one too (the cuda server takes --draft 2
  since 2026-12-01; before, `serve --engine cuda` refused drafts and that test was reference-only).
* Not affected, on both settings: the tests on the scripted engine double (exact known output: tool calls,
  thinking, stop strings, malformed requests, limits, faults, fuzzing) and the `serve demo` test, which runs
  the bundled trained model on the reference engine, as `serve demo` does by default.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import threading
import time

import pytest

# The GPU machine's image has no web stack: skip the HTTP tests there instead of failing collection.
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

from openjet_launcher.model.gguf_file import GGUFFile  # noqa: E402
from openjet_launcher.model.synth import synthesize  # noqa: E402
from openjet_launcher.reference import ReferenceEngine  # noqa: E402
from openjet_launcher.server import ServerSettings, create_app  # noqa: E402
from openjet_launcher.text.chat import ChatTemplate  # noqa: E402
from openjet_launcher.text.tokenizer import Tokenizer  # noqa: E402

from .scripted import ScriptedEngine  # noqa: E402

ENGINES = ("reference", "cuda")
TEST_ENGINE = os.environ.get("OPENJET_TEST_ENGINE", "").strip().lower() or "reference"
if TEST_ENGINE not in ENGINES:
    raise pytest.UsageError(f"OPENJET_TEST_ENGINE={TEST_ENGINE!r}: use one of {', '.join(ENGINES)}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, app):
        self.app = app
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            load_error = self.app.state.core.worker.load_error
            if load_error:                  # the model will never load: say why now, not in 60 s
                self.__exit__(None, None, None)
                raise RuntimeError(f"the server's model failed to load: {load_error}")
            time.sleep(0.05)
        raise RuntimeError("the server did not become ready")

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(20)

    @property
    def core(self):
        return self.app.state.core


def wait_for(predicate, timeout: float = 15.0) -> bool:
    """Poll `predicate` every 50 ms until it holds (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def prompt_text(server) -> str:
    """The prompt the server's engine ran last, as text: its slot's state up to the prompt's end."""
    slot = server.core.worker.slots[0]
    return server.core.tokenizer.decode(list(slot.state.tokens[:slot.prompt_end]))


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("server-model") / "tiny.gguf"
    synthesize("tiny", path, show_progress=False)
    return path


@pytest.fixture(scope="session")
def text_layer(tiny_path):
    gguf = GGUFFile(tiny_path)
    return Tokenizer.from_gguf(gguf), ChatTemplate.from_gguf(gguf)


@pytest.fixture(scope="session")
def engine_under_test() -> str:
    """OPENJET_TEST_ENGINE, once it can run here: under cuda, skips (or, with OPENJET_REQUIRE_GPU=1, fails)
    the tests that use it when no GPU can run the engine or the library is not built."""
    if TEST_ENGINE == "cuda":
        from conftest import gpu_unavailable_reason     # tests/conftest.py: the `gpu` marker's probe

        reason = gpu_unavailable_reason()
        if reason is not None:
            message = f"OPENJET_TEST_ENGINE=cuda needs a GPU and the built engine: {reason}"
            if os.environ.get("OPENJET_REQUIRE_GPU", "") not in ("", "0"):
                pytest.fail(f"OPENJET_REQUIRE_GPU is set: {message}")
            pytest.skip(message)
    return TEST_ENGINE


@pytest.fixture(scope="session")
def serve_engine_args(engine_under_test) -> list[str]:
    """The `serve` options that pick the engine under test (none for the reference engine, the default)."""
    return [] if engine_under_test == "reference" else ["--engine", engine_under_test]


def serve_app(model: str, *options: str):
    """The app `openjet-launch serve MODEL OPTIONS...` would serve, built by server/cli.py and not started
    (uvicorn.Server.run is stubbed). The model loads when a LiveServer starts it."""
    from openjet_launcher.server import cli

    parser = argparse.ArgumentParser()
    cli.add_serve_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", model, *options])
    ran = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(uvicorn.Server, "run", lambda server, sockets=None: ran.update(app=server.config.app))
        mp.delenv("OPENJET_API_KEY", raising=False)
        assert args.func(args) == 0
    return ran["app"]


@pytest.fixture(scope="module")
def tiny_server(tiny_path, text_layer, engine_under_test, serve_engine_args):
    if engine_under_test == "reference":
        tokenizer, template = text_layer
        settings = ServerSettings(model_id="tiny", n_ctx=1024, n_draft=2)
        app = create_app(ReferenceEngine.load(tiny_path), tokenizer, template, settings)
    else:       # as `serve` builds it: top_k <= 32 (server/cli.py)
        app = serve_app(str(tiny_path), *serve_engine_args, "--ctx", "1024", "--model-id", "tiny", "--draft", "2")
    with LiveServer(app) as server:
        yield server


@pytest.fixture(scope="module")
def scripted(text_layer):
    """A live server on the scripted engine double (tests/server/scripted.py), one per test module."""
    tokenizer, template = text_layer
    engine = ScriptedEngine(tokenizer.n_vocab)
    settings = ServerSettings(model_id="scripted", n_ctx=4096)
    with LiveServer(create_app(engine, tokenizer, template, settings)) as server:
        server.engine, server.tokenizer = engine, tokenizer
        yield server


@pytest.fixture
def say(scripted):
    """Set the model's next output: text (special tokens allowed) followed by <|im_end|>."""
    def set_output(text: str, end: bool = True) -> None:
        ids = scripted.tokenizer.encode(text, allow_special=True)
        if end:
            ids.append(scripted.tokenizer.token_to_id("<|im_end|>"))
        scripted.engine.script = ids
    return set_output


def raw_stream_request(server, body: dict, rcvbuf: int | None = None) -> socket.socket:
    """A chat-completions request on a raw socket (rcvbuf: a small receive buffer, for a reader that stalls)."""
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", server.port))
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    return sock
