"""Live servers for the HTTP tests: uvicorn in a thread on a free loopback port, the tiny synthetic
model (module-scoped) or a scripted engine double."""

from __future__ import annotations

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


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("server-model") / "tiny.gguf"
    synthesize("tiny", path, show_progress=False)
    return path


@pytest.fixture(scope="session")
def text_layer(tiny_path):
    gguf = GGUFFile(tiny_path)
    return Tokenizer.from_gguf(gguf), ChatTemplate.from_gguf(gguf)


@pytest.fixture(scope="module")
def tiny_server(tiny_path, text_layer):
    tokenizer, template = text_layer
    settings = ServerSettings(model_id="tiny", n_ctx=1024, n_draft=2)
    with LiveServer(create_app(ReferenceEngine.load(tiny_path), tokenizer, template, settings)) as server:
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
