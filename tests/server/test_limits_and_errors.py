"""Bad input gets a 4xx with an OpenAI error body and never breaks the next request; limits; API keys;
cancellation, stalled readers and engine failures free the engine."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest

from openjet_launcher.server import ServerSettings, create_app
from openjet_launcher.server.stops import StopStringMatcher

from .conftest import LiveServer, raw_stream_request, wait_for
from .scripted import ScriptedEngine

OK = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture(scope="module")
def server(text_layer):
    tokenizer, template = text_layer
    engine = ScriptedEngine(tokenizer.n_vocab, tokenizer.encode("a b c d e f g h"))
    settings = ServerSettings(model_id="m", n_ctx=300, max_body_bytes=20_000, stall_timeout_s=1.0,
                              max_pending_events=4, max_top_k=32)
    with LiveServer(create_app(engine, tokenizer, template, settings)) as s:
        s.engine = engine
        yield s


def chat(server, body, **kw):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(server.base + "/v1/chat/completions", content=data,
                      headers={"content-type": "application/json", **kw.pop("headers", {})}, timeout=30, **kw)


def with_(**fields):
    return {**OK, **fields}


def msg(content, role="user"):
    return with_(messages=[{"role": role, "content": content}])


MALFORMED = {
    "not json": b"{not json",
    "empty body": b"",
    "array body": b"[1, 2]",
    "NaN temperature": b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
    "infinite top_p": b'{"messages": [{"role": "user", "content": "hi"}], "top_p": Infinity}',
    "string max_tokens": with_(max_tokens="5"),
    "max_tokens 0": with_(max_tokens=0),
    "bool temperature": with_(temperature=True),
    "temperature 3": with_(temperature=3.0),
    "unknown role": msg("hi", role="wizard"),
    "content part a string": msg(["hello"]),
    "image part": msg([{"type": "image_url", "image_url": {"url": "http://x"}}]),
    "no messages": with_(messages=[]),
    "messages not a list": with_(messages="hi"),
    "deep nesting": b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    "bad tool schema": with_(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "banana"}}}]),
    "tool not an object": with_(tools=["f"]),
    "bad tool name": with_(tools=[{"type": "function", "function": {"name": "a b"}}]),
    "tool call arguments not json": msg(None, role="assistant") | {"messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]},
    "top_k over the GPU limit": with_(top_k=64),
    "n 2": with_(n=2),
    "empty stop": with_(stop=[""]),
    "template rejects": {"messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "late"}]},
    "bad reasoning effort": with_(chat_template_kwargs={"reasoning_effort": "extreme"}),
    "prompt longer than the context": msg("word " * 400),
    "body too large": msg("x" * 30_000),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_request_is_a_4xx_with_an_openai_error_and_the_next_request_works(server, name):
    r = chat(server, MALFORMED[name])
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    error = r.json()["error"]
    assert isinstance(error["message"], str) and error["message"] and error["type"]
    assert set(error) == {"message", "type", "param", "code"}
    assert chat(server, OK).status_code == 200


def test_blank_tool_call_arguments_mean_no_arguments(server):
    """Whitespace-only arguments pass validation as {}; the template must read them the same way (schemathesis
    found a 500 here: the validator and the template decoded them differently)."""
    r = chat(server, {"messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "\r\n "}}]},
        {"role": "tool", "content": "ok"}], "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_context_error_names_both_numbers(server):
    r = chat(server, msg("word " * 400))
    assert r.status_code == 400 and "300" in r.json()["error"]["message"]
    assert str(r.json()["error"]["message"]).count("tokens") >= 2
    assert chat(server, msg("x" * 30_000)).status_code == 413


def test_lone_surrogates_become_replacement_characters(server):
    r = httpx.post(server.base + "/tokenize", content=b'{"content": "a\\ud800b"}',
                   headers={"content-type": "application/json"})
    ids = r.json()["tokens"]
    text = httpx.post(server.base + "/detokenize", json={"tokens": ids}).json()["content"]
    assert text == "a\ufffdb"
    assert chat(server, b'{"messages": [{"role": "user", "content": "\\udc00 hi"}], "max_tokens": 2}').status_code == 200


def test_text_parts_are_joined_with_newlines(server):
    r = chat(server, msg([{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]))
    assert r.status_code == 200
    ids = httpx.post(server.base + "/tokenize", json={"content": "one\ntwo"}).json()["tokens"]
    prompt = list(server.core.worker.slots[0].state.tokens)
    assert any(prompt[i:i + len(ids)] == ids for i in range(len(prompt)))


def test_unknown_path_and_method_get_openai_errors(server):
    r = httpx.get(server.base + "/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(server.base + "/v1/chat/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_engine_failure_is_a_500_and_resets_the_state(server):
    assert chat(server, OK).status_code == 200
    server.engine.fail_on_prefill = True
    r = chat(server, with_(messages=[{"role": "user", "content": "hi there"}]))
    assert r.status_code == 500 and "scripted failure" in r.json()["error"]["message"]
    assert server.core.worker.slots[0].state.n_tokens == 0
    assert chat(server, OK).status_code == 200


def test_a_client_that_disconnects_mid_stream_frees_the_engine(server):
    metrics = server.core.metrics
    before = metrics.requests_cancelled_total
    server.engine.step_delay = 0.02
    try:
        sock = raw_stream_request(server, with_(max_tokens=250, stream=True))
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        sock.close()
        assert wait_for(lambda: metrics.requests_cancelled_total == before + 1)
    finally:
        server.engine.step_delay = 0.0
    assert chat(server, OK).status_code == 200


def test_a_stream_reader_that_stops_reading_is_dropped_after_the_stall_timeout(server):
    metrics = server.core.metrics
    before = metrics.requests_stalled_total
    # A long answer with big chunks: the socket buffers fill, then the 4 pending events, then 1 s passes.
    server.engine.script = server.core.tokenizer.encode("word " * 50)
    settings = server.core.settings
    old_ceiling, settings.n_ctx = settings.n_ctx, 100_000
    server.core.worker.n_ctx = 100_000
    try:
        sock = raw_stream_request(server, with_(max_tokens=30_000, stream=True), rcvbuf=2048)
        assert wait_for(lambda: metrics.requests_stalled_total == before + 1, timeout=60)
        # A reader that comes back finds the cut said, not a stream that merely ends as if the answer were whole.
        sock.settimeout(10)
        got = b""
        while b"[DONE]" not in got and (chunk := sock.recv(65536)):
            got += chunk
        sock.close()
        assert b"the stream was cut after" in got and b'"finish_reason": "length"' not in got
    finally:
        settings.n_ctx = server.core.worker.n_ctx = old_ceiling
    assert chat(server, OK).status_code == 200


def test_queued_requests_past_the_limit_get_503(server):
    worker = server.core.worker
    old, worker.max_queue = worker.max_queue, 0
    try:
        r = chat(server, OK)
        assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full"
    finally:
        worker.max_queue = old


def test_clients_that_left_the_queue_do_not_fill_it(server):
    """A queued request whose client disconnected stays in the queue until the worker reaches it, but waits for
    nothing: it used to count against max_queue (a 503 'queue_full' with nobody waiting) and in queue_depth."""
    worker, engine = server.core.worker, server.engine
    old = worker.max_queue, engine.step_delay, engine.script
    worker.max_queue, engine.step_delay = 2, 0.05
    engine.script = server.core.tokenizer.encode("word " * 50)
    try:
        busy = raw_stream_request(server, with_(max_tokens=400, stream=True))      # holds the engine ~20 s
        assert wait_for(lambda: worker.busy == 1)
        left = [raw_stream_request(server, with_(stream=True)) for _ in range(2)]
        assert wait_for(lambda: worker._jobs.qsize() == 2)
        for sock in left:
            sock.close()
        assert wait_for(lambda: worker.queue_depth == 0, 10)                     # seen as gone, still in the queue
        assert worker._jobs.qsize() == 2
        answer = []
        waiting = threading.Thread(target=lambda: answer.append(chat(server, OK)), daemon=True)
        waiting.start()                                                           # queued (was: a 503 at once)
        assert wait_for(lambda: answer or worker.queue_depth == 1, 10) and not answer
        assert worker._jobs.qsize() == 1                                          # the two that left were dropped
        busy.close()                                                              # the engine frees: it is served
        waiting.join(30)
        assert answer and answer[0].status_code == 200, answer and answer[0].text
    finally:
        worker.max_queue, engine.step_delay, engine.script = old


def rejected_total(server) -> int:
    """openjet_requests_rejected_total as /metrics reports it."""
    line = next(x for x in httpx.get(server.base + "/metrics").text.splitlines()
                if x.startswith("openjet_requests_rejected_total "))
    return int(float(line.split()[1]))


def test_every_request_answered_with_an_error_before_generation_counts_once_as_rejected(server):
    before = rejected_total(server)
    worker = server.core.worker
    refused = [chat(server, with_(max_tokens=0)),                           # validation
               chat(server, msg("word " * 400)),                            # the context (token_budget)
               chat(server, MALFORMED["template rejects"]),                 # the template
               chat(server, with_(top_k=64)),                               # sampling
               httpx.post(server.base + "/v1/completions", json={"prompt": [5] * 400}, timeout=30),
               httpx.post(server.base + "/v1/messages", json={"model": "m", "max_tokens": 0, "messages": []})]
    old, worker.max_queue = worker.max_queue, 0
    try:
        refused.append(chat(server, OK))                                     # the queue
    finally:
        worker.max_queue = old
    assert [r.status_code for r in refused] == [400] * 6 + [503]
    assert rejected_total(server) == before + len(refused)
    assert chat(server, OK).status_code == 200                              # generated: not rejected
    server.engine.fail_on_prefill = True                                    # failed while generating: not rejected
    assert chat(server, with_(messages=[{"role": "user", "content": "fails"}])).status_code == 500
    assert rejected_total(server) == before + len(refused)


# ------------------------------------------------------------------------------------------- API key

@pytest.fixture(scope="module")
def keyed(text_layer):
    tokenizer, template = text_layer
    engine = ScriptedEngine(tokenizer.n_vocab, tokenizer.encode("ok"))
    settings = ServerSettings(model_id="m", n_ctx=512, api_key="s3cret")
    with LiveServer(create_app(engine, tokenizer, template, settings)) as s:
        yield s


def test_api_key_protects_everything_but_health(keyed):
    base = keyed.base
    assert httpx.get(base + "/health").status_code == 200
    for path in ("/v1/models", "/props", "/metrics"):
        r = httpx.get(base + path)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(base + "/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(base + "/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert httpx.get(base + "/v1/models", headers={"x-api-key": "s3cret"}).status_code == 200
    props = httpx.get(base + "/props", headers={"x-api-key": "s3cret"}).text
    assert "s3cret" not in props and '"api_key_required":true' in props.replace(" ", "")


def test_a_generation_request_refused_for_its_key_counts_as_rejected(keyed):
    metrics = keyed.core.metrics
    before = metrics.requests_rejected_total
    assert httpx.post(keyed.base + "/v1/chat/completions", json=OK).status_code == 401
    assert httpx.get(keyed.base + "/v1/models").status_code == 401          # not a generation request
    assert metrics.requests_rejected_total == before + 1


def test_openai_sdk_with_the_key(keyed):
    import openai
    good = openai.OpenAI(base_url=keyed.base + "/v1", api_key="s3cret", max_retries=0)
    assert good.chat.completions.create(model="m", messages=OK["messages"], max_tokens=2).choices
    bad = openai.OpenAI(base_url=keyed.base + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


# ------------------------------------------------------------------------------------------- units

def test_stop_matcher_holds_back_possible_starts_only():
    m = StopStringMatcher(["</end>", "xyz"])
    out = m.push("abc</e") + m.push("nx") + m.push("</en")
    assert out == "abc</enx" and not m.stopped
    assert m.push("d> tail") == "" and m.stopped
    m = StopStringMatcher(["xyz"])
    assert m.push("ax") == "a" and m.flush() == "x"


def test_log_escaping_neutralises_control_characters():
    from openjet_launcher.server.errors import escape_for_log
    assert escape_for_log("a\x1b[31mred\nnext\u202e") == "a\\x1b[31mred\\x0anext\\u202e"


def test_a_key_with_a_trailing_newline_still_admits_its_clients(text_layer):
    """A key read from a secret file keeps its newline; header values arrive stripped, so it matched no client (every
    request 401, no warning). The key is compared without its surrounding whitespace."""
    tokenizer, template = text_layer
    settings = ServerSettings(model_id="m", n_ctx=512, api_key="k3y\n")
    with LiveServer(create_app(ScriptedEngine(tokenizer.n_vocab), tokenizer, template, settings)) as s:
        assert httpx.get(s.base + "/v1/models", headers={"x-api-key": "k3y"}).status_code == 200
        assert httpx.get(s.base + "/v1/models", headers={"Authorization": "Bearer k3y"}).status_code == 200
        assert httpx.get(s.base + "/v1/models", headers={"x-api-key": "k3"}).status_code == 401


def test_a_key_of_only_whitespace_is_refused(text_layer):
    """Stripped, it would be empty, and an empty x-api-key header would match it."""
    tokenizer, template = text_layer
    with pytest.raises(ValueError, match="empty"):
        create_app(ScriptedEngine(tokenizer.n_vocab), tokenizer, template,
                   ServerSettings(model_id="m", n_ctx=512, api_key=" \n"))


def test_requests_queued_when_the_engine_breaks_are_refused_and_counted(text_layer):
    """The engine breaks (a failed generation whose reset fails too) with two requests queued behind it: they get the
    503 a later request gets and count as rejected (they were 500s in no counter)."""
    from concurrent.futures import ThreadPoolExecutor

    tokenizer, template = text_layer
    engine = ScriptedEngine(tokenizer.n_vocab)
    with LiveServer(create_app(engine, tokenizer, template, ServerSettings(model_id="m", n_ctx=512))) as s:
        started, release = threading.Event(), threading.Event()

        def boom(state, tokens, **kw):  # fails once both requests wait behind it (a fixed sleep raced a slow machine)
            started.set()
            release.wait(30)
            raise RuntimeError("boom")

        def sticky():
            raise RuntimeError("sticky")
        engine.prefill, engine.new_state = boom, sticky
        metrics = s.core.metrics
        before = (metrics.requests_failed_total, metrics.requests_rejected_total)
        with ThreadPoolExecutor(3) as pool:
            first = pool.submit(httpx.post, s.base + "/v1/chat/completions", json=OK, timeout=30)
            assert started.wait(10)
            queued = [pool.submit(httpx.post, s.base + "/v1/chat/completions", json=OK, timeout=30) for _ in range(2)]
            assert wait_for(lambda: s.core.worker._jobs.qsize() == 2)
            release.set()
            codes = [first.result().status_code] + [f.result().status_code for f in queued]
        assert codes == [500, 503, 503]
        assert (metrics.requests_failed_total, metrics.requests_rejected_total) == (before[0] + 1, before[1] + 2)
