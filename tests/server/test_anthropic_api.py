"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) through the real `anthropic` SDK:
on the tiny synthetic model, and on the scripted engine double for the output a random model never writes
(thinking, tool_use blocks, stop sequences). Bad requests get Anthropic's error shape."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from openjet_launcher.server import ServerSettings, create_app

from .conftest import LiveServer, prompt_text
from .scripted import ScriptedEngine

HELLO = [{"role": "user", "content": "Say hello."}]
TOOLS = [{"name": "get_weather", "description": "Weather of a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                           "required": ["city"]}}]
NOW = {"name": "now", "input_schema": {"type": "object", "properties": {}}}
TOOL_OUTPUT = ("The user wants the weather.</think>\n\nLet me check."
               "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
               "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")

THINK = {"type": "enabled", "budget_tokens": 1024}  # thinking blocks in the answer


def sse_events(response: httpx.Response) -> list[tuple[str, dict]]:
    """Raw SSE: (event name, data) pairs; the name always equals the data's `type`."""
    events = []
    for block in response.text.split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        data = json.loads(lines["data"])
        assert lines["event"] == data["type"]
        events.append((lines["event"], data))
    return events


def assert_event_grammar(names: list[str]) -> None:
    """message_start, (ping), then per block start, deltas, stop, then message_delta, message_stop."""
    names = [n for n in names if n != "ping"]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    body = names[1:-2]
    i = 0
    while i < len(body):
        assert body[i] == "content_block_start", names
        j = body.index("content_block_stop", i)
        assert set(body[i + 1:j]) <= {"content_block_delta"}, names
        i = j + 1


# ------------------------------------------------------------------------------------------ tiny model

@pytest.fixture(scope="module")
def client(tiny_server):
    return anthropic.Anthropic(base_url=tiny_server.base, api_key="unused", max_retries=0)


def test_message_has_the_anthropic_shape_and_usage(client):
    m = client.messages.create(model="tiny", max_tokens=6, messages=HELLO, extra_body={"temperature": 0})
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant" and m.model == "tiny"
    assert m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None
    assert all(b.type == "text" for b in m.content)  # (no thinking block: the request did not enable thinking)
    assert 1 <= m.usage.output_tokens <= 6
    counted = client.messages.count_tokens(model="tiny", messages=HELLO).input_tokens
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == counted


TIMINGS = {"prompt_n", "prompt_per_second", "predicted_n", "predicted_per_second", "cache_n", "draft_n",
           "draft_n_accepted"}


def test_message_reports_chats_timings(client):
    m = client.messages.create(model="tiny", max_tokens=6, messages=HELLO, extra_body={"temperature": 0})
    t = m.model_extra["timings"]
    assert TIMINGS <= set(t)
    assert (t["prompt_n"], t["cache_n"], t["predicted_n"]) == \
        (m.usage.input_tokens, m.usage.cache_read_input_tokens, m.usage.output_tokens)


def test_stream_helper_accumulates_to_the_complete_message(client):
    kwargs = dict(model="tiny", max_tokens=8, messages=HELLO, extra_body={"temperature": 0})
    whole = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as stream:
        names = [e.type for e in stream]
        final = stream.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    assert names[0] == "message_start" and names[-1] == "message_stop"


def test_raw_stream_events_come_in_order(tiny_server):
    body = {"model": "tiny", "max_tokens": 8, "messages": HELLO, "stream": True, "temperature": 0}
    r = httpx.post(tiny_server.base + "/v1/messages", json=body, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r)
    assert_event_grammar([n for n, _ in events])
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["id"].startswith("msg_")
    delta = next(d for n, d in events if n == "message_delta")
    assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens") and delta["usage"]["output_tokens"] >= 1
    indices = [d["index"] for n, d in events if n == "content_block_start"]
    assert indices == list(range(len(indices)))
    assert "timings" not in start
    timings = events[-1][1]["timings"]                  # on message_stop, the last event
    assert TIMINGS <= set(timings) and timings["predicted_n"] == delta["usage"]["output_tokens"]


def test_count_tokens_counts_system_and_tools(client):
    base = client.messages.count_tokens(model="tiny", messages=HELLO).input_tokens
    with_system = client.messages.count_tokens(model="tiny", messages=HELLO, system="Be brief.").input_tokens
    with_tools = client.messages.count_tokens(model="tiny", messages=HELLO, tools=TOOLS).input_tokens
    assert base < with_system < with_tools


# -------------------------------------------------------------------------------------- scripted engine

@pytest.fixture(scope="module")
def sclient(scripted):
    return anthropic.Anthropic(base_url=scripted.base, api_key="unused", max_retries=0)


def test_thinking_becomes_a_thinking_block_before_the_text(sclient, say):
    say("Two plus two is four.</think>\n\nThe answer is 4.")
    m = sclient.messages.create(model="m", max_tokens=100, messages=HELLO,
                                thinking={"type": "enabled", "budget_tokens": 1024})
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == "Two plus two is four." and m.content[0].signature == ""
    assert m.content[1].text == "The answer is 4." and m.stop_reason == "end_turn"


@pytest.mark.parametrize("stream", [False, True])
def test_without_a_thinking_field_the_answer_holds_no_thinking_block(scripted, sclient, say, stream):
    """Anthropic's API returns thinking blocks only where the request enabled thinking: without the field the model
    still thinks (its default) but the answer is its text (and calls), so `content[0].text` is the text."""
    say("Let me think.</think>\n\nHello!")
    if stream:
        with sclient.messages.stream(model="m", max_tokens=100, messages=HELLO) as s:
            m = s.get_final_message()
    else:
        m = sclient.messages.create(model="m", max_tokens=100, messages=HELLO)
    assert [(b.type, b.text) for b in m.content] == [("text", "Hello!")]


def test_thinking_disabled_gives_text_only(sclient, say):
    say("Plain answer.")
    m = sclient.messages.create(model="m", max_tokens=100, messages=HELLO, thinking={"type": "disabled"})
    assert [(b.type, b.text) for b in m.content] == [("text", "Plain answer.")]


def test_tool_call_becomes_a_tool_use_block_with_typed_input(sclient, say):
    say(TOOL_OUTPUT)
    m = sclient.messages.create(model="m", max_tokens=200, messages=HELLO, tools=TOOLS, thinking=THINK)
    assert [b.type for b in m.content] == ["thinking", "text", "tool_use"]
    use = m.content[2]
    assert use.id.startswith("toolu_") and use.name == "get_weather" and use.input == {"city": "Paris", "days": 3}
    assert m.content[1].text == "Let me check." and m.stop_reason == "tool_use"


def test_streamed_tool_use_arrives_as_input_json_delta(scripted, sclient, say):
    say(TOOL_OUTPUT)
    with sclient.messages.stream(model="m", max_tokens=200, messages=HELLO, tools=TOOLS, thinking=THINK) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[2].input == {"city": "Paris", "days": 3} and final.stop_reason == "tool_use"

    r = httpx.post(scripted.base + "/v1/messages", timeout=30,
                   json={"model": "m", "max_tokens": 200, "messages": HELLO, "tools": TOOLS, "stream": True,
                         "thinking": THINK})
    events = sse_events(r)
    assert_event_grammar([n for n, _ in events])
    starts = [d["content_block"] for n, d in events if n == "content_block_start"]
    assert [b["type"] for b in starts] == ["thinking", "text", "tool_use"] and starts[2]["input"] == {}
    kinds = {d["delta"]["type"] for n, d in events if n == "content_block_delta"}
    assert kinds == {"thinking_delta", "text_delta", "input_json_delta"}
    partial = "".join(d["delta"]["partial_json"] for n, d in events
                      if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta")
    assert json.loads(partial) == {"city": "Paris", "days": 3}


def test_tool_choice_none_leaves_the_xml_as_text(sclient, say):
    say(TOOL_OUTPUT)
    m = sclient.messages.create(model="m", max_tokens=200, messages=HELLO, tools=TOOLS, tool_choice={"type": "none"})
    assert [b.type for b in m.content] == ["text"] and "<tool_call>" in m.content[0].text


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequence_is_reported(sclient, say, stream):
    say("alpha beta STOP gamma")
    kwargs = dict(model="m", max_tokens=50, messages=HELLO, stop_sequences=["STOP"], thinking={"type": "disabled"})
    if stream:
        with sclient.messages.stream(**kwargs) as s:
            m = s.get_final_message()
    else:
        m = sclient.messages.create(**kwargs)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "STOP"
    assert m.content[0].text == "alpha beta"


def test_max_tokens_is_reported(sclient, say):
    say("one two three four five six seven")
    m = sclient.messages.create(model="m", max_tokens=3, messages=HELLO, thinking={"type": "disabled"})
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3


def test_history_with_thinking_tool_use_and_tool_result_renders_as_chat_does(scripted, sclient, say):
    """The same conversation in Anthropic's and OpenAI's shapes is the same prompt."""
    say("Done.</think>\n\nIt is sunny.")
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": [
                   {"type": "thinking", "thinking": "Check it.", "signature": ""},
                   {"type": "text", "text": "Let me check."},
                   {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
               {"role": "user", "content": [
                   {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                   {"type": "text", "text": "Thanks!"}]}]
    m = sclient.messages.create(model="m", max_tokens=50, system="Be brief.", messages=history, tools=TOOLS)
    assert m.content[-1].text == "It is sunny."
    chat = openai.OpenAI(base_url=scripted.base + "/v1", api_key="x", max_retries=0).chat.completions.create(
        model="m", max_tokens=50, tools=[{"type": "function", "function": {
            "name": t["name"], "description": t["description"], "parameters": t["input_schema"]}} for t in TOOLS],
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "Let me check.", "reasoning_content": "Check it.",
                   "tool_calls": [{"id": "toolu_1", "type": "function",
                                   "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                  {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
                  {"role": "user", "content": "Thanks!"}])
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert chat.model_extra["timings"]["prompt_n"] <= 1      # the same prompt: all of it reused


# ------------------------------------------------------------------------------------ prefill, tool_choice

TURN_START = "<|im_start|>assistant\n<think>\n\n</think>\n\n"     # spec §1.2: an assistant turn without thinking
PREFILLED = HELLO + [{"role": "assistant", "content": "The answer is"}]


@pytest.mark.parametrize("stream", [False, True])
def test_a_final_assistant_message_is_continued_and_only_the_new_text_returned(scripted, sclient, say, stream):
    """Anthropic's prefill: the model continues the last assistant message, the response holds the continuation."""
    say(" 42.")
    kwargs = dict(model="m", max_tokens=20, messages=PREFILLED)
    if stream:
        with sclient.messages.stream(**kwargs) as s:
            m = s.get_final_message()
    else:
        m = sclient.messages.create(**kwargs)
    assert prompt_text(scripted).endswith("<|im_start|>user\nSay hello.<|im_end|>\n" + TURN_START + "The answer is")
    assert [(b.type, b.text) for b in m.content] == [("text", " 42.")] and m.stop_reason == "end_turn"
    counted = sclient.messages.count_tokens(model="m", messages=PREFILLED).input_tokens
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == counted


def test_an_empty_final_assistant_message_leaves_a_new_answer_to_write(scripted, sclient, say):
    say("Hi!")
    sclient.messages.create(model="m", max_tokens=20, messages=HELLO)
    fresh = prompt_text(scripted)
    for empty in ("", []):
        sclient.messages.create(model="m", max_tokens=20, messages=HELLO + [{"role": "assistant", "content": empty}])
        assert prompt_text(scripted) == fresh


def test_tool_choice_tool_makes_the_answer_that_call(scripted, sclient, say):
    say("<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>")
    m = sclient.messages.create(model="m", max_tokens=100, messages=HELLO, tools=TOOLS + [NOW],
                                tool_choice={"type": "tool", "name": "get_weather"})
    assert prompt_text(scripted).endswith(TURN_START + "<tool_call>\n<function=get_weather>\n")
    assert [(b.type, b.name, b.input) for b in m.content] == [("tool_use", "get_weather", {"city": "Paris"})]
    assert m.stop_reason == "tool_use"


def test_tool_choice_any_opens_a_call_whose_tool_the_model_names(scripted, sclient, say):
    say("=now>\n</function>\n</tool_call>")
    m = sclient.messages.create(model="m", max_tokens=100, messages=HELLO, tools=TOOLS + [NOW],
                                tool_choice={"type": "any"})
    assert prompt_text(scripted).endswith(TURN_START + "<tool_call>\n<function")
    assert [(b.type, b.name, b.input) for b in m.content] == [("tool_use", "now", {})]
    counted = sclient.messages.count_tokens(model="m", messages=HELLO, tools=TOOLS + [NOW],
                                            tool_choice={"type": "any"}).input_tokens
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == counted


def test_message_start_reports_the_same_usage_split_as_the_end_of_the_stream(scripted, say):
    """The second identical request reuses its prompt: message_start says so already, as message_delta does."""
    say("fine")
    body = {"model": "m", "max_tokens": 5, "messages": HELLO, "stream": True}
    for _ in range(2):
        events = sse_events(httpx.post(scripted.base + "/v1/messages", json=body, timeout=30))
        start = events[0][1]["message"]["usage"]
        final = next(d for n, d in events if n == "message_delta")["usage"]
        keys = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
        assert {k: start[k] for k in keys} == {k: final[k] for k in keys}
    assert final["cache_read_input_tokens"] > 0


# ------------------------------------------------------------------------------------------ bad requests

OK = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
USER = {"role": "user", "content": "hi"}


def _with(**fields):
    return {**OK, **fields}


def _without(key):
    return {k: v for k, v in OK.items() if k != key}


def _msg(content, role="user"):
    return _with(messages=[{"role": role, "content": content}])


BAD = {
    "missing max_tokens": _without("max_tokens"),
    "max_tokens 0": _with(max_tokens=0),
    "max_tokens string": _with(max_tokens="5"),
    "max_tokens float": _with(max_tokens=5.0),
    "missing model": _without("model"),
    "missing messages": _without("messages"),
    "messages empty": _with(messages=[]),
    "messages not a list": _with(messages={"role": "user", "content": "hi"}),
    "message not an object": _with(messages=["hi"]),
    "role system": _with(messages=[{"role": "system", "content": "hi"}]),
    "role tool": _with(messages=[{"role": "tool", "content": "hi"}]),
    "content int": _msg(5),
    "content missing": _with(messages=[{"role": "user"}]),
    "block not an object": _msg(["hi"]),
    "image block": _msg([{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]),
    "document block": _msg([{"type": "document", "source": {"type": "text", "data": "x"}}]),
    "unknown block": _msg([{"type": "video", "text": "x"}]),
    "text block without text": _msg([{"type": "text"}]),
    "text block text int": _msg([{"type": "text", "text": 3}]),
    "tool_use in a user message": _msg([{"type": "tool_use", "id": "t", "name": "f", "input": {}}]),
    "tool_result in an assistant message": _with(messages=[USER, {"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": "x"}]}]),
    "tool_use input not an object": _with(messages=[USER, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": "{}"}]}, USER]),
    "tool_result with an image": _msg([{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "image", "source": {}}]}]),
    "system int": _with(system=5),
    "system image block": _with(system=[{"type": "image", "source": {}}]),
    "temperature string": _with(temperature="0.5"),
    "temperature above 1": _with(temperature=1.5),
    "top_k negative": _with(top_k=-1),
    "top_p zero": _with(top_p=0),
    "stop_sequences string": _with(stop_sequences="STOP"),
    "stop_sequences empty string": _with(stop_sequences=[""]),
    "stream string": _with(stream="yes"),
    "tool without input_schema": _with(tools=[{"name": "f"}]),
    "tool schema string": _with(tools=[{"name": "f", "input_schema": "object"}]),
    "tool schema not an object type": _with(tools=[{"name": "f", "input_schema": {"type": "array"}}]),
    "tool schema unknown type": _with(tools=[{"name": "f", "input_schema": {
        "type": "object", "properties": {"x": {"type": "strin"}}}}]),
    "tool schema properties list": _with(tools=[{"name": "f", "input_schema": {"type": "object", "properties": []}}]),
    "tool name with spaces": _with(tools=[{"name": "get weather", "input_schema": {"type": "object"}}]),
    "server tool": _with(tools=[{"type": "web_search_20250305", "name": "web_search"}]),
    "tool_choice bad type": _with(tool_choice={"type": "sometimes"}),
    "tool_choice tool without name": _with(tools=TOOLS, tool_choice={"type": "tool"}),
    "tool_choice names an unknown tool": _with(tools=TOOLS, tool_choice={"type": "tool", "name": "nope"}),
    "tool_choice any without tools": _with(tool_choice={"type": "any"}),
    "thinking bad type": _with(thinking={"type": "sometimes"}),
    "thinking budget zero": _with(thinking={"type": "enabled", "budget_tokens": 0}),
    "user content empty list": _msg([]),
    "user content empty string": _msg(""),
    "empty assistant message before the last": _with(messages=[USER, {"role": "assistant", "content": []}, USER]),
    "chat_template_kwargs sets messages": _with(chat_template_kwargs={"messages": []}),
    "prompt longer than the context": _msg("word " * 5000),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_request_gets_an_anthropic_error_and_the_next_request_works(scripted, say, name):
    r = httpx.post(scripted.base + "/v1/messages", json=BAD[name], timeout=30)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    say("fine")
    ok = httpx.post(scripted.base + "/v1/messages", json=OK, timeout=30)
    assert ok.status_code == 200 and ok.json()["type"] == "message"


@pytest.mark.parametrize("raw", [b"{not json", b'{"model": "m", "max_tokens": 5, "temperature": NaN, "messages": []}',
                                 b"[]", b""])
def test_body_that_is_not_a_json_object_gets_an_anthropic_error(scripted, raw):
    r = httpx.post(scripted.base + "/v1/messages", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["type"] == "error"


def test_sdk_raises_its_typed_errors(sclient, scripted):
    with pytest.raises(anthropic.BadRequestError) as e:
        sclient.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    assert "text only" in e.value.body["error"]["message"]
    r = httpx.get(scripted.base + "/v1/messages/nope")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.get(scripted.base + "/v1/messages")
    assert r.status_code == 405 and r.json()["type"] == "error"


def test_count_tokens_rejects_bad_requests_in_the_same_shape(scripted):
    r = httpx.post(scripted.base + "/v1/messages/count_tokens", json={"model": "m", "messages": [
        {"role": "user", "content": [{"type": "image", "source": {}}]}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(scripted.base + "/v1/messages/count_tokens", json={"model": "m", "messages": HELLO})
    assert r.status_code == 200 and r.json()["input_tokens"] > 0


def test_engine_failure_is_an_api_error(scripted, sclient, say):
    say("fine")
    scripted.engine.fail_on_prefill = True
    with pytest.raises(anthropic.InternalServerError) as e:
        sclient.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "fail now"}])
    assert e.value.body["error"]["type"] == "api_error"
    assert sclient.messages.create(model="m", max_tokens=5, messages=HELLO).type == "message"


def test_the_sdk_authenticates_with_x_api_key(text_layer):
    tokenizer, template = text_layer
    engine = ScriptedEngine(tokenizer.n_vocab, tokenizer.encode("hi"))
    settings = ServerSettings(model_id="m", n_ctx=512, api_key="sekrit")
    with LiveServer(create_app(engine, tokenizer, template, settings)) as server:
        good = anthropic.Anthropic(base_url=server.base, api_key="sekrit", max_retries=0)
        assert good.messages.count_tokens(model="m", messages=HELLO).input_tokens > 0
        bad = anthropic.Anthropic(base_url=server.base, api_key="wrong", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as e:
            bad.messages.create(model="m", max_tokens=5, messages=HELLO)
        raw = e.value.response.json()
        assert raw["type"] == "error" and raw["error"]["type"] == "authentication_error" and raw["error"]["message"]
        r = httpx.post(server.base + "/v1/messages/count_tokens", json={"model": "m", "messages": HELLO})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert r.json()["type"] == "error"
        r = httpx.get(server.base + "/v1/models")                 # other surfaces keep OpenAI's shape
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
