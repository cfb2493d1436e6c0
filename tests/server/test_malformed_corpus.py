"""A corpus of malformed requests over every JSON endpoint: each is a 4xx with an error body in that
endpoint's format (OpenAI's, or Anthropic's on /v1/messages), never a 5xx, and the next valid request on the
same endpoint gets the same answer as before the corpus ran (the scripted engine makes answers exact).

Chat completions reuse the 26 cases of test_limits_and_errors.MALFORMED; the Anthropic and Responses cases
run only when those routes are registered (checked against app.routes at test time)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx
import pytest

from openjet_launcher.server import ServerSettings, create_app

from .conftest import LiveServer
from .scripted import ScriptedEngine
from .test_limits_and_errors import MALFORMED as CHAT_MALFORMED

SCRIPT = "a b c d e f g h"
USER = [{"role": "user", "content": "hi"}]


@dataclass(frozen=True)
class Endpoint:
    path: str
    valid: dict
    shape: str = "openai"            # the error body's format: "openai" or "anthropic"


ENDPOINTS = {
    "chat": Endpoint("/v1/chat/completions", {"messages": USER, "max_tokens": 3}),
    "completions": Endpoint("/v1/completions", {"prompt": "hello", "max_tokens": 3}),
    "tokenize": Endpoint("/tokenize", {"content": "hello world"}),
    "detokenize": Endpoint("/detokenize", {"tokens": [1, 2, 3]}),
    "messages": Endpoint("/v1/messages", {"model": "m", "messages": USER, "max_tokens": 3}, "anthropic"),
    "count_tokens": Endpoint("/v1/messages/count_tokens", {"model": "m", "messages": USER}, "anthropic"),
    "responses": Endpoint("/v1/responses", {"input": "hi", "max_output_tokens": 3}),
}


def deep(n: int, inner: bytes = b"1") -> bytes:
    return b'{"a":' * n + inner + b"}" * n


def with_(endpoint: str, **fields) -> dict:
    return {**ENDPOINTS[endpoint].valid, **fields}


def raw(endpoint: str, field: str, literal: str) -> bytes:
    """The valid body with `field` set to a JSON literal json.dumps cannot write (NaN, 1e999, "\\ud800")."""
    body = json.dumps({k: v for k, v in ENDPOINTS[endpoint].valid.items() if k != field})
    return (body[:-1] + f', "{field}": {literal}}}').encode()


# Every JSON endpoint: malformed at the level of bytes and JSON.
def _generic(e: str) -> dict:
    return {
        "invalid JSON": b'{"a": ',
        "empty body": b"",
        "whitespace body": b"  \n ",
        "array body": b"[1, 2]",
        "string body": b'"hello"',
        "null body": b"null",
        "non-UTF-8 bytes": b'{"x": "\xff\xfe"}',
        "UTF-8-encoded surrogate": b'{"x": "\xed\xa0\x80"}',
        "bad unicode escape": b'{"x": "\\ud8zz"}',
        "1000 levels of objects": deep(1000),
        "1000 levels of arrays": b"[" * 1000 + b"]" * 1000,
        "deep nesting in an ignored field": raw(e, "extra", deep(200).decode()),
        "NaN literal in an ignored field": raw(e, "extra", "NaN"),
        "form-encoded body": b"a=1&b=2",
    }


CASES: dict[str, dict[str, object]] = {
    "chat": {**CHAT_MALFORMED, **_generic("chat"),
             "max_tokens negative": with_("chat", max_tokens=-1),
             "max_tokens huge exponent": raw("chat", "max_tokens", "1e999"),
             "temperature huge exponent": raw("chat", "temperature", "1e999"),
             "temperature -Infinity": raw("chat", "temperature", "-Infinity"),
             "top_p string NaN": with_("chat", top_p="NaN"),
             "max_completion_tokens 0": with_("chat", max_completion_tokens=0),
             "message not an object": with_("chat", messages=["hi"]),
             "message without role": with_("chat", messages=[{"content": "hi"}]),
             "role a number": with_("chat", messages=[{"role": 1, "content": "hi"}]),
             "lone surrogate as role": raw("chat", "messages", '[{"role": "\\ud800", "content": "hi"}]'),
             "user message without content": with_("chat", messages=[{"role": "user"}]),
             "content an object": with_("chat", messages=[{"role": "user", "content": {"text": "hi"}}]),
             "content part null": with_("chat", messages=[{"role": "user", "content": [None]}]),
             "content part a number": with_("chat", messages=[{"role": "user", "content": [1]}]),
             "text part without text": with_("chat", messages=[{"role": "user", "content": [{"type": "text"}]}]),
             "tools an object": with_("chat", tools={"type": "function"}),
             "tool parameters an array": with_("chat", tools=[{"type": "function",
                                                             "function": {"name": "f", "parameters": []}}]),
             "tool parameters of type string": with_("chat", tools=[{"type": "function", "function": {
                 "name": "f", "parameters": {"type": "string"}}}]),
             "tool required not strings": with_("chat", tools=[{"type": "function", "function": {
                 "name": "f", "parameters": {"type": "object", "required": [1]}}}]),
             "tool without function": with_("chat", tools=[{"type": "function"}]),
             "tool_choice unknown": with_("chat", tool_choice="sometimes"),
             "stream a string": with_("chat", stream="yes"),
             "stream_options a list": with_("chat", stream=True, stream_options=[True]),
             "seed past 64 bits": with_("chat", seed=2**70),
             "stop a list of numbers": with_("chat", stop=[1, 2]),
             "17 stop strings": with_("chat", stop=[f"s{i}" for i in range(17)]),
             "chat_template_kwargs a list": with_("chat", chat_template_kwargs=["enable_thinking"]),
             "logprobs true": with_("chat", logprobs=True),
             "top_logprobs alone": with_("chat", top_logprobs=2),
             "response_format json_object": with_("chat", response_format={"type": "json_object"}),
             "response_format json_schema": with_("chat", response_format={"type": "json_schema", "json_schema": {
                 "name": "x", "schema": {"type": "object"}}}),
             "reasoning_effort unknown": with_("chat", reasoning_effort="max"),
             "chat_template_kwargs sets messages": with_("chat", chat_template_kwargs={"messages": []}),
             "chat_template_kwargs sets tools": with_("chat", chat_template_kwargs={"tools": None}),
             "chat_template_kwargs sets add_generation_prompt": with_("chat", chat_template_kwargs={
                 "add_generation_prompt": False}),
             "tool_choice names no tool": with_("chat", tool_choice={"type": "function", "function": {"name": "f"}}),
             "continue_final_message after a user message": with_("chat", continue_final_message=True),
             "huge string under the size limit": with_("chat", messages=[{"role": "user", "content": "x" * 19_000}]),
             },
    "completions": {**_generic("completions"),
                    "no prompt": {"max_tokens": 3},
                    "prompt a number": with_("completions", prompt=5),
                    "prompt an object": with_("completions", prompt={"text": "hi"}),
                    "prompt list of lists": with_("completions", prompt=[[1, 2]]),
                    "prompt empty list": with_("completions", prompt=[]),
                    "token id past the vocabulary": with_("completions", prompt=[10**9]),
                    "negative token id": with_("completions", prompt=[-1]),
                    "two prompts": with_("completions", prompt=["a", "b"]),
                    "prompt longer than the context": with_("completions", prompt=[5] * 400),
                    "max_tokens 0": with_("completions", max_tokens=0),
                    "max_tokens negative": with_("completions", max_tokens=-5),
                    "max_tokens a float": with_("completions", max_tokens=2.5),
                    "NaN temperature": raw("completions", "temperature", "NaN"),
                    "Infinity top_p": raw("completions", "top_p", "Infinity"),
                    "echo": with_("completions", echo=True),
                    "suffix": with_("completions", suffix="x"),
                    "n 2": with_("completions", n=2),
                    "empty stop string": with_("completions", stop=[""]),
                    "logprobs 2": with_("completions", logprobs=2),
                    },
    "tokenize": {**_generic("tokenize"),
                 "no content": {},
                 "content a number": {"content": 5},
                 "content null": {"content": None},
                 "content a list": {"content": ["a"]},
                 "with_pieces a string": with_("tokenize", with_pieces="yes"),
                 "parse_special a number": with_("tokenize", parse_special=1),
                 },
    "detokenize": {**_generic("detokenize"),
                   "no tokens": {},
                   "tokens a string": {"tokens": "1 2"},
                   "tokens floats": {"tokens": [1.5]},
                   "tokens booleans": {"tokens": [True]},
                   "token past the vocabulary": {"tokens": [10**9]},
                   "negative token": {"tokens": [-1]},
                   "tokens nested": {"tokens": [[1]]},
                   "token NaN": raw("detokenize", "tokens", "[NaN]"),
                   },
    "messages": {**_generic("messages"),
                 "no max_tokens": {"model": "m", "messages": USER},
                 "max_tokens 0": with_("messages", max_tokens=0),
                 "max_tokens negative": with_("messages", max_tokens=-1),
                 "no messages": {"model": "m", "max_tokens": 3},
                 "messages empty": with_("messages", messages=[]),
                 "system role in messages": with_("messages", messages=[{"role": "system", "content": "x"}]),
                 "unknown role": with_("messages", messages=[{"role": "wizard", "content": "x"}]),
                 "block not an object": with_("messages", messages=[{"role": "user", "content": ["hi"]}]),
                 "image block": with_("messages", messages=[{"role": "user", "content": [
                     {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]),
                 "unknown block type": with_("messages", messages=[{"role": "user", "content": [{"type": "x"}]}]),
                 "NaN temperature": raw("messages", "temperature", "NaN"),
                 "temperature 1.5": with_("messages", temperature=1.5),
                 "bad tool schema": with_("messages", tools=[{"name": "f", "input_schema": {"type": "banana"}}]),
                 "tool_choice names no tool": with_("messages", tool_choice={"type": "tool", "name": "f"}),
                 "user content an empty list": with_("messages", messages=[{"role": "user", "content": []}]),
                 "chat_template_kwargs sets add_generation_prompt": with_("messages", chat_template_kwargs={
                     "add_generation_prompt": True}),
                 "prompt longer than the context": with_("messages", messages=[{"role": "user",
                                                                                "content": "word " * 400}]),
                 },
    "count_tokens": {**_generic("count_tokens"),
                     "no messages": {"model": "m"},
                     "messages a string": with_("count_tokens", messages="hi"),
                     "system a number": with_("count_tokens", system=5),
                     "chat_template_kwargs sets messages": with_("count_tokens", chat_template_kwargs={"messages": 1}),
                     },
    "responses": {**_generic("responses"),
                  "no input": {"max_output_tokens": 3},
                  "input empty": with_("responses", input=[]),
                  "input a number": with_("responses", input=5),
                  "item not an object": with_("responses", input=["hi"]),
                  "unknown item type": with_("responses", input=[{"type": "web_search_call"}]),
                  "item_reference": with_("responses", input=[{"type": "item_reference", "id": "x"}]),
                  "max_output_tokens 0": with_("responses", max_output_tokens=0),
                  "NaN temperature": raw("responses", "temperature", "NaN"),
                  "previous_response_id": with_("responses", previous_response_id="resp_x"),
                  "bad tool schema": with_("responses", tools=[{"type": "function", "name": "f",
                                                                "parameters": {"type": "banana"}}]),
                  "function call arguments not JSON": with_("responses", input=[
                      {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"}]),
                  "prompt longer than the context": with_("responses", input="word " * 400),
                  "chat_template_kwargs sets continue_final_message": with_("responses", chat_template_kwargs={
                      "continue_final_message": True}),
                  },
}

CORPUS = [(e, name) for e, cases in CASES.items() for name in cases]


@pytest.fixture(scope="module")
def server(text_layer):
    tokenizer, template = text_layer
    engine = ScriptedEngine(tokenizer.n_vocab, tokenizer.encode(SCRIPT))
    # The same limits as test_limits_and_errors, whose cases assume them (context 300, body 20 kB, top_k 32).
    settings = ServerSettings(model_id="m", n_ctx=300, max_body_bytes=20_000, max_top_k=32)
    with LiveServer(create_app(engine, tokenizer, template, settings)) as s:
        s.paths = {path for path, _ in served_routes(s.app)}
        s.expected = {e: _answer(post(s, ep.path, ep.valid)) for e, ep in ENDPOINTS.items() if ep.path in s.paths}
        yield s


def served_routes(app) -> list[tuple[str, frozenset[str]]]:
    """(path, methods) of every route, included routers flattened (FastAPI >= 0.16x wraps them)."""
    out = []

    def walk(routes, prefix=""):
        for r in routes:
            inner = getattr(r, "original_router", None)
            if inner is not None:
                walk(inner.routes, prefix + getattr(getattr(r, "include_context", None), "prefix", ""))
            elif hasattr(r, "path"):
                out.append((prefix + r.path, frozenset(getattr(r, "methods", None) or ())))
    walk(app.routes)
    return out


def post(server, path: str, body, headers: dict | None = None) -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.base + path, content=data, timeout=30,
                      headers=headers or {"content-type": "application/json"})


# Ids and times change per request; the reused-token counts depend on what the engine served before.
_VOLATILE = {"id", "created", "created_at", "timings", "system_fingerprint", "prompt_tokens_details",
             "cache_read_input_tokens", "cache_creation_input_tokens", "input_tokens", "input_tokens_details"}


def _answer(r: httpx.Response):
    """A valid request's answer without the parts that change per request (ids, times)."""
    assert r.status_code == 200, r.text

    def strip(v):
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if k not in _VOLATILE and not k.endswith("_ms")}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v
    return strip(r.json())


def _check_error_shape(r: httpx.Response, shape: str) -> None:
    body = r.json()
    if shape == "anthropic":
        assert body["type"] == "error", body
        assert isinstance(body["error"]["type"], str) and body["error"]["type"]
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
        assert isinstance(body["error"]["message"], str) and body["error"]["message"] and body["error"]["type"]


def test_the_corpus_holds_at_least_60_cases_on_the_endpoints_served(server):
    served = [c for c in CORPUS if ENDPOINTS[c[0]].path in server.paths]
    assert len(served) >= 60
    assert {"chat", "completions", "tokenize", "detokenize"} <= {e for e, _ in served}


def test_valid_answers_are_exact(server):
    """The oracle the corpus compares against: the scripted engine's text, through the real tokenizer."""
    expected = server.core.tokenizer.decode(server.core.tokenizer.encode(SCRIPT)[:3])
    chat = server.expected["chat"]["choices"][0]["message"]
    assert (chat.get("content") or "") + (chat.get("reasoning_content") or "") in (expected, expected.strip())
    assert server.expected["completions"]["choices"][0]["text"] == expected
    assert server.expected["tokenize"]["tokens"] == server.core.tokenizer.encode("hello world")


@pytest.mark.parametrize("endpoint,name", CORPUS, ids=[f"{e}: {n}" for e, n in CORPUS])
def test_malformed_request_is_a_4xx_in_the_endpoints_format_and_the_next_request_is_answered(server, endpoint,
                                                                                             name):
    ep = ENDPOINTS[endpoint]
    if ep.path not in server.paths:
        pytest.skip(f"{ep.path} is not served yet")
    body = CASES[endpoint][name]
    headers = {"content-type": "application/x-www-form-urlencoded"} if name == "form-encoded body" else None
    r = post(server, ep.path, body, headers)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:500])
    _check_error_shape(r, ep.shape)
    assert _answer(post(server, ep.path, ep.valid)) == server.expected[endpoint]


# The message of a 400 names the problem that applies, not the first alternative of a field of several types.
CLEAR = {
    "function_call arguments not JSON": ("responses", with_("responses", input=[
        {"role": "user", "content": "hi"}, {"type": "function_call", "call_id": "c", "name": "f", "arguments": "x"}]),
        "arguments must be a JSON object"),
    "input_image part": ("responses", with_("responses", input=[{"role": "user", "content": [
        {"type": "input_image", "image_url": "http://x/y.png"}]}]), "input_image: this model reads text only"),
    "tool_result holding an image": ("messages", with_("messages", messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}]}]),
        "image block: this model reads text only"),
    "content a number": ("chat", with_("chat", messages=[{"role": "user", "content": 5}]),
                         "messages.0.content: Input should be a valid string or a valid list"),
    "prompt a list of lists": ("completions", with_("completions", prompt=[[1, 2]]),
                               "prompt.0: Input should be a valid integer or a valid string"),
    "chat_template_kwargs sets messages": ("chat", CASES["chat"]["chat_template_kwargs sets messages"],
                                           "'messages' is set by the server"),
    "chat_template_kwargs sets add_generation_prompt (messages)": (
        "messages", CASES["messages"]["chat_template_kwargs sets add_generation_prompt"],
        "'add_generation_prompt' is set by the server"),
    "chat_template_kwargs sets continue_final_message (responses)": (
        "responses", CASES["responses"]["chat_template_kwargs sets continue_final_message"],
        "'continue_final_message' is set by the server"),
    "completions logprobs": ("completions", CASES["completions"]["logprobs 2"], "logprobs are not supported"),
    "chat top_logprobs": ("chat", CASES["chat"]["top_logprobs alone"], "logprobs are not supported"),
    "chat response_format": ("chat", CASES["chat"]["response_format json_schema"], "structured output"),
    "responses text.format": ("responses", with_("responses", text={"format": {"type": "json_object"}}),
                              "structured output"),
    "Anthropic user content []": ("messages", CASES["messages"]["user content an empty list"], "non-empty content"),
}


def error_message(r: httpx.Response) -> str:
    return r.json()["error"]["message"]


@pytest.mark.parametrize("name", CLEAR)
def test_the_error_names_the_problem_that_applies(server, name):
    endpoint, body, says = CLEAR[name]
    r = post(server, ENDPOINTS[endpoint].path, body)
    assert r.status_code == 400 and says in error_message(r), r.text
    assert "more problems" not in error_message(r) and ".str" not in error_message(r)


@pytest.mark.parametrize("endpoint,field", [("chat", "messages"), ("completions", "prompt"), ("responses", "input")])
def test_a_prompt_longer_than_the_context_is_reported_on_the_field_that_holds_it(server, endpoint, field):
    r = post(server, ENDPOINTS[endpoint].path, CASES[endpoint]["prompt longer than the context"]
             if endpoint != "chat" else with_("chat", messages=[{"role": "user", "content": "word " * 400}]))
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    assert r.json()["error"]["param"] == field


def test_a_plain_text_response_format_is_accepted(server):
    assert post(server, "/v1/chat/completions", with_("chat", response_format={"type": "text"})).status_code == 200
