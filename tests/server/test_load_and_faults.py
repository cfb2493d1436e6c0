"""Load and faults on loopback, against a real uvicorn run with the limits `serve` applies (limits.py), set small
so each test is bounded in count and time: a flood of connections, slow requests (slowloris), a stream reader
that stops reading, oversized bodies and bytes in flight, and the API key on every route."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from openjet_launcher.server import ServerSettings, create_app
from openjet_launcher.server.limits import uvicorn_options

from .conftest import LiveServer, raw_stream_request, wait_for
from .scripted import ScriptedEngine
from .test_malformed_corpus import served_routes

OK = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
LIMITS = dict(max_connections=50, request_timeout_s=1.0, keep_alive_s=2.0, stall_timeout_s=1.0,
              max_pending_events=4, max_body_bytes=20_000, max_inflight_bytes=30_000)


class LimitedServer(LiveServer):
    """LiveServer under the uvicorn options `serve` uses (connection limit, arrival timer, keep-alive)."""

    def __init__(self, app, settings: ServerSettings):
        super().__init__(app)
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on",
                                **uvicorn_options(settings))
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)


def limited_server(text_layer, **limits):
    tokenizer, template = text_layer
    engine = ScriptedEngine(tokenizer.n_vocab, tokenizer.encode("a b c d e f g h"))
    settings = ServerSettings(model_id="m", n_ctx=300, **limits)
    server = LimitedServer(create_app(engine, tokenizer, template, settings), settings)
    server.engine = engine
    return server


@pytest.fixture(scope="module")
def server(text_layer):
    with limited_server(text_layer, **LIMITS) as s:
        yield s


@pytest.fixture(scope="module")
def flood_server(text_layer):
    """LIMITS with a request timer of 10 s: opening the flood's 300 connections can take longer than the 1 s the
    slow-request tests need on a busy 2-core machine, and would then end the 50 admitted ones with 408."""
    with limited_server(text_layer, **{**LIMITS, "request_timeout_s": 10.0}) as s:
        yield s


def chat_ok(server) -> bool:
    r = httpx.post(server.base + "/v1/chat/completions", json=OK, timeout=30)
    return r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def connect(server, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
    return sock


def read_all(sock: socket.socket) -> bytes:
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except (ConnectionResetError, socket.timeout):
        pass
    return out


# --------------------------------------------------------------------------------------- connections

def test_300_simultaneous_connections_past_the_limit_get_503_or_refused_and_service_resumes(flood_server):
    server, n = flood_server, 300

    async def one(opened: asyncio.Event, started: list) -> str:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", server.port), 10)
        except (OSError, asyncio.TimeoutError):
            return "refused"
        started.append(1)
        await opened.wait()                 # every connection is open before any request is sent
        try:
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), 15)
            return line.split()[1].decode() if line else "closed"
        except (OSError, asyncio.TimeoutError, IndexError):
            return "closed"
        finally:
            writer.close()

    async def flood() -> list[str]:
        opened, started = asyncio.Event(), []
        tasks = [asyncio.create_task(one(opened, started)) for _ in range(n)]
        while len(started) + sum(t.done() for t in tasks) < n:
            await asyncio.sleep(0.01)
        opened.set()
        return await asyncio.gather(*tasks)

    t0 = time.monotonic()
    outcomes = asyncio.run(flood())
    print({k: outcomes.count(k) for k in set(outcomes)})
    assert time.monotonic() - t0 < 30
    assert set(outcomes) <= {"200", "503", "refused", "closed"}, outcomes
    # The first 50 connections are served through the flood; the rest are turned away.
    assert 40 <= outcomes.count("200") <= 50
    assert outcomes.count("503") + outcomes.count("refused") + outcomes.count("closed") >= n - 50
    assert wait_for(lambda: chat_ok(server), 10)           # service resumes once the flood is gone


# --------------------------------------------------------------------------------------- slowloris

def test_a_connection_that_sends_no_request_is_closed_after_the_request_timeout(server):
    sock = connect(server)
    sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")   # headers never finished
    t0 = time.monotonic()
    answer = read_all(sock)
    elapsed = time.monotonic() - t0
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408") and 0.8 < elapsed < 5, (answer[:80], elapsed)


def test_a_body_that_arrives_too_slowly_gets_408_and_the_connection_is_closed(server):
    body = json.dumps(OK).encode()
    sock = connect(server)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body))
    t0, closed = time.monotonic(), False
    for i in range(len(body)):              # one byte per 0.2 s: the whole body would take > 8 s
        try:
            sock.sendall(body[i:i + 1])
        except OSError:
            closed = True
            break
        time.sleep(0.2)
        if time.monotonic() - t0 > 3:
            break
    sock.settimeout(5)
    answer = read_all(sock)
    elapsed = time.monotonic() - t0
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b'"code": "request_timeout"' in answer
    assert closed or elapsed < 5
    assert chat_ok(server)


# --------------------------------------------------------------------------------------- a reader that stops

def test_a_stream_reader_that_stops_reading_stops_the_generation_within_the_timeout(server):
    core, engine = server.core, server.engine
    engine.script = core.tokenizer.encode("word " * 50)
    before = core.metrics.requests_stalled_total
    settings, worker = core.settings, core.worker
    old_ctx = settings.n_ctx
    settings.n_ctx = worker.n_ctx = 100_000
    try:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        sock.connect(("127.0.0.1", server.port))
        data = json.dumps({**OK, "max_tokens": 90_000, "stream": True}).encode()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
        assert sock.recv(64).startswith(b"HTTP/1.1 200")        # then it reads nothing more
        t0 = time.monotonic()
        assert wait_for(lambda: core.metrics.requests_stalled_total == before + 1, timeout=20)
        # Buffers fill first (kernel, transport, 4 pending events), then the 1 s stall timeout runs.
        assert time.monotonic() - t0 < 10
        assert wait_for(lambda: worker.busy == 0, 2)
        generated = core.metrics.generated_tokens_total
        time.sleep(0.3)
        assert core.metrics.generated_tokens_total == generated          # the engine stopped
        sock.close()
    finally:
        settings.n_ctx = worker.n_ctx = old_ctx
        engine.script = core.tokenizer.encode("a b c d e f g h")
    assert chat_ok(server)


def test_a_reader_that_stops_reading_is_disconnected_and_its_bytes_in_flight_freed(server):
    """After the stall the engine is freed (above), but uvicorn's send() waited for the full socket for ever: the
    connection, its body's bytes in flight (17 kB of the 30 kB allowed here: every other body was then refused 503)
    and a graceful shutdown were held until the client left. The write side now aborts the connection."""
    core, engine = server.core, server.engine
    engine.script = core.tokenizer.encode("word " * 50)
    settings, worker = core.settings, core.worker
    old_ctx = settings.n_ctx
    settings.n_ctx = worker.n_ctx = 100_000
    body = {**OK, "max_tokens": 90_000, "stream": True, "messages": [{"role": "user", "content": "y " * 8_500}]}
    try:
        sock = raw_stream_request(server, body, rcvbuf=2048)
        assert sock.recv(64).startswith(b"HTTP/1.1 200")        # then it reads nothing more
        other = {**OK, "messages": [{"role": "user", "content": "z " * 8_000}]}
        assert wait_for(lambda: httpx.post(server.base + "/v1/chat/completions", json=other,
                                           timeout=30).status_code == 200, timeout=30)
        sock.settimeout(10)
        t0 = time.monotonic()
        read_all(sock)                                           # what was buffered, then the server's close
        assert time.monotonic() - t0 < 9, "the stalled connection was still open"
        sock.close()
    finally:
        settings.n_ctx = worker.n_ctx = old_ctx
        engine.script = core.tokenizer.encode("a b c d e f g h")
    assert chat_ok(server)


def test_the_write_stall_abort_waits_while_the_client_still_takes_bytes():
    """The abort is for a client that takes nothing: one that drains a large body slowly (below the low-water mark
    only after several stall periods) has its timer re-armed as long as the buffer shrinks (it was cut mid-body:
    24 MB read steadily at 2 MB/s was cut at 11 MB)."""
    from types import SimpleNamespace

    from openjet_launcher.server.limits import LimitsProtocol

    timers, aborted = [], []
    sizes = iter([900_000, 500_000, 500_000])         # the buffer at each look: shrinking, then stuck
    fake = SimpleNamespace(write_stall_s=2.0, _stall_left=1_000_000, _stalled=None,
                           transport=SimpleNamespace(get_write_buffer_size=lambda: next(sizes),
                                                     abort=lambda: aborted.append(True)),
                           loop=SimpleNamespace(call_later=lambda delay, fn: timers.append(delay) or "timer"))
    fake._write_stalled = lambda: LimitsProtocol._write_stalled(fake)
    LimitsProtocol._write_stalled(fake)               # 1,000,000 -> 900,000: progress, wait again
    assert timers == [2.0] and not aborted and fake._stall_left == 900_000
    LimitsProtocol._write_stalled(fake)               # -> 500,000: progress
    assert timers == [2.0, 2.0] and not aborted
    LimitsProtocol._write_stalled(fake)               # 500,000 again: nothing taken for a whole period
    assert aborted == [True] and fake._stalled is None


# --------------------------------------------------------------------------------------- body size

def test_an_oversized_body_is_a_413_whether_declared_or_chunked(server):
    big = json.dumps({**OK, "messages": [{"role": "user", "content": "x" * 30_000}]}).encode()
    r = httpx.post(server.base + "/v1/chat/completions", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunks():
        for i in range(0, len(big), 4096):
            yield big[i:i + 4096]
    r = httpx.post(server.base + "/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert chat_ok(server)


def test_bodies_in_flight_past_the_limit_get_503_and_service_resumes(server):
    rejected = server.core.metrics.requests_rejected_total
    body = json.dumps({**OK, "messages": [{"role": "user", "content": "y" * 17_000}]}).encode()
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    held = connect(server)
    held.sendall(head + body[:100])          # 17 kB declared and held in flight, of 30 kB allowed
    time.sleep(0.2)
    second = connect(server)
    second.sendall(head + body)
    second.settimeout(5)
    answer = read_all(second)
    second.close()
    assert answer.startswith(b"HTTP/1.1 503") and b'"code": "server_busy"' in answer, answer[:300]
    held.sendall(body[100:])                 # the first completes (its prompt is past the context: a 400)
    held.settimeout(5)
    assert held.recv(64).startswith(b"HTTP/1.1 400")
    held.close()
    # Its bytes were released: the same body now gets through the limit (and is a 400 for its length).
    r = httpx.post(server.base + "/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert server.core.metrics.requests_rejected_total == rejected + 3       # the 503 and the two 400s
    assert chat_ok(server)


def _http_json(answer: bytes) -> dict:
    return json.loads(answer.split(b"\r\n\r\n", 1)[1])


def test_limit_answers_on_anthropic_paths_are_in_anthropics_shape(server):
    path = b"/v1/messages"
    body = json.dumps({"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "z" * 17_000}]}).encode()
    head = (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (path, len(body)))
    held = connect(server)
    held.sendall(head + body[:100])          # held in flight until the request timeout: 408
    time.sleep(0.2)
    second = connect(server)
    second.sendall(head + body)              # past the bytes in flight: 503
    second.settimeout(5)
    busy = read_all(second)
    second.close()
    held.settimeout(5)
    late = read_all(held)
    held.close()
    assert busy.startswith(b"HTTP/1.1 503") and late.startswith(b"HTTP/1.1 408"), (busy[:100], late[:100])
    busy, late = _http_json(busy), _http_json(late)
    assert busy["type"] == "error" and busy["error"]["type"] == "overloaded_error" and busy["error"]["message"]
    assert late["type"] == "error" and "did not arrive" in late["error"]["message"]
    big = json.dumps({"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "x" * 30_000}]})
    r = httpx.post(server.base + "/v1/messages", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large" and r.json()["type"] == "error"
    assert chat_ok(server)


# --------------------------------------------------------------------------------------- API key

@pytest.fixture(scope="module")
def keyed(text_layer):
    tokenizer, template = text_layer
    settings = ServerSettings(model_id="m", n_ctx=300, api_key="k3y", **LIMITS)
    engine = ScriptedEngine(tokenizer.n_vocab, tokenizer.encode("ok"))
    with LimitedServer(create_app(engine, tokenizer, template, settings), settings) as s:
        yield s


def test_the_api_key_is_enforced_on_every_route_but_health(keyed):
    routes = [(path.replace("{model_id}", "m").replace("{model_id:path}", "m"), methods)
              for path, methods in served_routes(keyed.app)]
    assert len(routes) >= 10
    checked = 0
    for path, methods in routes:
        for method in sorted(methods - {"HEAD"}):
            body = json.dumps(OK) if method == "POST" else None
            r = httpx.request(method, keyed.base + path, content=body, timeout=30)
            if path == "/health":
                assert r.status_code == 200
                continue
            assert r.status_code == 401, (method, path, r.status_code)
            anthropic = path.startswith("/v1/messages")
            assert (r.json()["type"] == "error") if anthropic else (r.json()["error"]["code"] == "invalid_api_key")
            assert r.json()["error"]["type"] == "authentication_error"
            ok = httpx.request(method, keyed.base + path, content=body, timeout=30, headers={"x-api-key": "k3y"})
            assert ok.status_code != 401, (method, path)
            checked += 1
    assert checked >= 9


# --------------------------------------------------------------------------------------- configuration

def test_every_limit_is_on_by_default_and_documented_in_serve_help():
    import argparse

    from openjet_launcher.server.cli import add_serve_parser

    parser = argparse.ArgumentParser()
    serve = add_serve_parser(parser.add_subparsers())
    text = serve.format_help()
    for option in ("--max-connections", "--request-timeout", "--keep-alive", "--max-body", "--max-inflight",
                   "--max-queue", "--max-tokens", "--stall-timeout"):
        assert option in text, option
    d = ServerSettings()
    assert d.max_connections and d.request_timeout_s and d.max_inflight_bytes and d.max_body_bytes
    assert d.max_tokens_ceiling and d.stall_timeout_s and d.max_queue
    options = uvicorn_options(d)
    assert options["http"].max_connections == d.max_connections
    assert options["http"].request_timeout_s == d.request_timeout_s


class BreakingEngine(ScriptedEngine):
    """A scripted engine that breaks as a CUDA engine does after a sticky device error: once `broken`, a prefill and
    even a fresh state (the worker's reset after a failed request) raise."""

    broken = False

    def new_state(self):
        if self.broken:
            raise RuntimeError("openjet_engine_reset: an illegal memory access was encountered")
        return super().new_state()

    def prefill(self, state, tokens, **kw):
        if self.broken:
            raise RuntimeError("openjet_engine_prefill: an illegal memory access was encountered")
        return super().prefill(state, tokens, **kw)


def test_an_engine_that_cannot_be_reset_fails_each_request_instead_of_hanging(text_layer):
    """A request fails and the reset after it fails too: that request still gets its error, and the server then
    refuses every request with a 503 naming the engine's failure (/health too) and asks `serve` to exit
    (on_load_failed), where the worker thread used to die and leave every request waiting forever."""
    tokenizer, template = text_layer
    engine = BreakingEngine(tokenizer.n_vocab, tokenizer.encode("a b c"))
    exits = []
    app = create_app(engine, tokenizer, template, ServerSettings(model_id="m", n_ctx=300), on_load_failed=exits.append)
    with LiveServer(app) as s:
        engine.broken = True
        first = httpx.post(s.base + "/v1/chat/completions", json=OK, timeout=10)
        assert first.status_code == 500 and "illegal memory access" in first.json()["error"]["message"], first.text
        assert wait_for(lambda: s.core.worker.engine_error is not None, 5)
        assert exits and "openjet_engine_reset" in exits[0]
        engine.broken = False  # a later request must not reach the engine
        later = httpx.post(s.base + "/v1/chat/completions", json=OK, timeout=10)
        assert later.status_code == 503 and "restart the server" in later.json()["error"]["message"], later.text
        health = httpx.get(s.base + "/health", timeout=10)
        assert health.status_code == 503 and "engine failed" in health.json()["error"]["message"]
        assert s.core.worker._thread.is_alive()
