"""OpenAI's Responses API (`/v1/responses`, what Codex speaks) through the real `openai` SDK: on the tiny
synthetic model, and on the scripted engine double for reasoning items and function calls. Nothing is
stored (store=false semantics). Bad requests get OpenAI's error shape."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from .conftest import prompt_text

TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                         "required": ["city"]}}]
TOOL_OUTPUT = ("The user wants the weather.</think>\n\nLet me check."
               "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
               "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")


def sse_events(response: httpx.Response) -> list[dict]:
    """Raw SSE data objects; each block's `event:` name equals its data's `type`."""
    events = []
    for block in response.text.split("\n\n"):
        if block.strip():
            lines = dict(line.split(": ", 1) for line in block.split("\n"))
            data = json.loads(lines["data"])
            assert lines["event"] == data["type"]
            events.append(data)
    return events


def assert_event_grammar(events: list[dict]) -> None:
    """created, in_progress, then per item added ... done, then completed; sequence numbers 0, 1, 2..."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    types = [e["type"] for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    body, i = types[2:-1], 0
    item_events = {"message": ["response.content_part.added", "response.output_text.delta",
                               "response.output_text.done", "response.content_part.done"],
                   "reasoning": ["response.content_part.added", "response.reasoning_text.delta",
                                 "response.reasoning_text.done", "response.content_part.done"],
                   "function_call": ["response.function_call_arguments.delta",
                                     "response.function_call_arguments.done"]}
    items = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
    for kind in items:
        assert body[i] == "response.output_item.added", types
        j = body.index("response.output_item.done", i)
        inner = body[i + 1:j]
        deduped = [t for k, t in enumerate(inner) if k == 0 or inner[k - 1] != t]   # deltas repeat
        assert deduped == item_events[kind], (kind, inner)
        i = j + 1
    assert i == len(body)


# ------------------------------------------------------------------------------------------ tiny model

@pytest.fixture(scope="module")
def client(tiny_server):
    return openai.OpenAI(base_url=tiny_server.base + "/v1", api_key="unused", max_retries=0)


def test_response_has_the_responses_shape_and_usage(client):
    r = client.responses.create(model="tiny", input="Say hello.", max_output_tokens=6, temperature=0)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "tiny"
    assert r.status in ("completed", "incomplete") and r.output
    assert {item.type for item in r.output} <= {"reasoning", "message"}
    u = r.usage
    assert 1 <= u.output_tokens <= 6 and u.total_tokens == u.input_tokens + u.output_tokens
    assert 0 <= u.input_tokens_details.cached_tokens < u.input_tokens
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"


def test_response_reports_chats_timings(client):
    r = client.responses.create(model="tiny", input="Say hello.", max_output_tokens=6, temperature=0)
    t = r.model_extra["timings"]
    assert {"prompt_n", "prompt_per_second", "predicted_n", "predicted_per_second", "cache_n", "draft_n",
            "draft_n_accepted"} <= set(t)
    assert t["predicted_n"] == r.usage.output_tokens and t["cache_n"] == r.usage.input_tokens_details.cached_tokens
    assert t["prompt_n"] + t["cache_n"] == r.usage.input_tokens


def test_stream_helper_accumulates_to_the_complete_response(client):
    kwargs = dict(model="tiny", input=[{"role": "user", "content": "Say hello."}], max_output_tokens=8, temperature=0)
    whole = client.responses.create(**kwargs)
    with client.responses.stream(**kwargs) as stream:
        types = [e.type for e in stream]
        final = stream.get_final_response()
    strip = lambda items: [{k: v for k, v in i.model_dump().items() if k != "id"} for i in items]  # noqa: E731
    assert strip(final.output) == strip(whole.output) and final.status == whole.status
    assert final.output_text == whole.output_text and final.usage.output_tokens == whole.usage.output_tokens
    assert types[0] == "response.created" and types[-1] == "response.completed"


def test_raw_stream_events_come_in_order_with_sequence_numbers(tiny_server):
    body = {"model": "tiny", "input": "Say hello.", "max_output_tokens": 8, "stream": True, "temperature": 0}
    r = httpx.post(tiny_server.base + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r)
    assert_event_grammar(events)
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    final = events[-1]["response"]
    assert final["status"] in ("completed", "incomplete") and len(final["output"]) == sum(
        e["type"] == "response.output_item.done" for e in events)
    assert "timings" not in events[0]["response"]
    assert final["timings"]["predicted_n"] == final["usage"]["output_tokens"]


# -------------------------------------------------------------------------------------- scripted engine

@pytest.fixture(scope="module")
def sclient(scripted):
    return openai.OpenAI(base_url=scripted.base + "/v1", api_key="unused", max_retries=0)


def test_thinking_becomes_a_reasoning_item_before_the_message(sclient, say):
    say("Two plus two is four.</think>\n\nThe answer is 4.")
    r = sclient.responses.create(model="m", input="2+2?", max_output_tokens=100)
    assert [i.type for i in r.output] == ["reasoning", "message"] and r.status == "completed"
    reasoning, message = r.output
    assert reasoning.id.startswith("rs_") and reasoning.summary == []
    assert [(c.type, c.text) for c in reasoning.content] == [("reasoning_text", "Two plus two is four.")]
    assert message.role == "assistant" and message.status == "completed"
    assert [(c.type, c.text, c.annotations) for c in message.content] == [("output_text", "The answer is 4.", [])]
    assert r.output_text == "The answer is 4." and 0 < r.usage.output_tokens_details.reasoning_tokens


def test_reasoning_effort_none_turns_thinking_off(sclient, say):
    say("Plain answer.")
    r = sclient.responses.create(model="m", input="hi", max_output_tokens=100, reasoning={"effort": "none"})
    assert [i.type for i in r.output] == ["message"] and r.output_text == "Plain answer."


def test_tool_call_becomes_a_function_call_item(sclient, say):
    say(TOOL_OUTPUT)
    r = sclient.responses.create(model="m", input="Weather in Paris?", tools=TOOLS, max_output_tokens=200)
    assert [i.type for i in r.output] == ["reasoning", "message", "function_call"]
    call = r.output[2]
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert json.loads(call.arguments) == {"city": "Paris", "days": 3} and call.status == "completed"


def test_streamed_function_call_has_argument_events(scripted, sclient, say):
    say(TOOL_OUTPUT)
    with sclient.responses.stream(model="m", input="Weather in Paris?", tools=TOOLS, max_output_tokens=200) as s:
        final = s.get_final_response()
    assert [i.type for i in final.output] == ["reasoning", "message", "function_call"]
    assert json.loads(final.output[2].arguments) == {"city": "Paris", "days": 3}

    r = httpx.post(scripted.base + "/v1/responses", timeout=30, json={
        "model": "m", "input": "Weather in Paris?", "tools": TOOLS, "stream": True})
    events = sse_events(r)
    assert_event_grammar(events)
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert json.loads(done["arguments"]) == json.loads(deltas) == {"city": "Paris", "days": 3}
    reasoning = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert reasoning == "The user wants the weather."


def test_max_output_tokens_makes_the_response_incomplete(sclient, say):
    say("one two three four five six seven")
    r = sclient.responses.create(model="m", input="count", max_output_tokens=3, reasoning={"effort": "none"})
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[-1].status == "incomplete" and r.usage.output_tokens == 3


def test_replayed_history_renders_as_chat_does(scripted, sclient, say):
    """Codex sends back the reasoning, message and function_call items with the call's output: the same
    prompt as the equivalent chat conversation, so the whole of it is reused."""
    say("Done.</think>\n\nIt is sunny.")
    r = sclient.responses.create(model="m", max_output_tokens=50, tools=TOOLS, instructions="Be brief.", input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "Check it."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me check."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"role": "user", "content": "Thanks!"}])
    assert r.output_text == "It is sunny."
    chat = sclient.chat.completions.create(
        model="m", max_tokens=50, tools=[{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
                                         for t in TOOLS],
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "Let me check.", "reasoning_content": "Check it.",
                   "tool_calls": [{"id": "call_1", "type": "function",
                                   "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                  {"role": "user", "content": "Thanks!"}])
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert chat.model_extra["timings"]["prompt_n"] <= 1


def test_previous_response_id_is_refused_with_a_clear_message(sclient):
    with pytest.raises(openai.BadRequestError) as e:
        sclient.responses.create(model="m", input="hi", previous_response_id="resp_123")
    assert e.value.body["param"] == "previous_response_id" and "whole conversation" in e.value.body["message"]


def test_a_tool_choice_naming_a_function_makes_the_answer_that_call(scripted, sclient, say):
    """The prompt opens the call after an empty think block (spec §1.2); the model writes its parameters."""
    say("<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>")
    now = {"type": "function", "name": "now", "parameters": {"type": "object", "properties": {}}}
    r = sclient.responses.create(model="m", input="Weather in Paris?", tools=TOOLS + [now], max_output_tokens=100,
                                 tool_choice={"type": "function", "name": "get_weather"})
    assert prompt_text(scripted).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"
                                          "<tool_call>\n<function=get_weather>\n")
    assert [(i.type, i.name, json.loads(i.arguments)) for i in r.output] == [
        ("function_call", "get_weather", {"city": "Paris"})]
    assert r.tool_choice.type == "function" and r.tool_choice.name == "get_weather"


def test_plain_text_format_is_accepted(sclient, say):
    say("fine")
    r = sclient.responses.create(model="m", input="hi", max_output_tokens=5, text={"format": {"type": "text"}})
    assert r.status == "completed"


# ------------------------------------------------------------------------------------------ bad requests

OK = {"model": "m", "input": "hi", "max_output_tokens": 5}


def _with(**fields):
    return {**OK, **fields}


def _item(**item):
    return _with(input=[item])


BAD = {
    "missing input": {"model": "m"},
    "input int": _with(input=5),
    "input empty list": _with(input=[]),
    "item not an object": _with(input=["hi"]),
    "unknown item type": _item(type="web_search_call", id="x"),
    "item_reference": _item(type="item_reference", id="msg_1"),
    "role tool": _item(role="tool", content="hi"),
    "message without content": _item(role="user"),
    "content part not an object": _item(role="user", content=["hi"]),
    "input_image part": _item(role="user", content=[{"type": "input_image", "image_url": "http://x/y.png"}]),
    "input_file part": _item(role="user", content=[{"type": "input_file", "file_id": "f"}]),
    "text part without text": _item(role="user", content=[{"type": "input_text"}]),
    "function_call arguments not JSON": _with(input=[{"role": "user", "content": "hi"}, {
        "type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"}]),
    "function_call arguments a list": _with(input=[{"role": "user", "content": "hi"}, {
        "type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]),
    "function_call without call_id": _item(type="function_call", name="f", arguments="{}"),
    "function_call_output int": _item(type="function_call_output", call_id="c", output=5),
    "reasoning content wrong part": _item(type="reasoning", summary=[], content=[{"type": "output_text", "text": "x"}]),
    "instructions int": _with(instructions=5),
    "max_output_tokens 0": _with(max_output_tokens=0),
    "max_output_tokens string": _with(max_output_tokens="5"),
    "temperature 3": _with(temperature=3),
    "top_p string": _with(top_p="1"),
    "stream string": _with(stream="true"),
    "reasoning effort unknown": _with(reasoning={"effort": "extreme"}),
    "tool type web_search": _with(tools=[{"type": "web_search"}]),
    "tool nested in function (chat shape)": _with(tools=[{"type": "function", "function": {"name": "f"}}]),
    "tool schema not an object type": _with(tools=[{"type": "function", "name": "f",
                                                    "parameters": {"type": "string"}}]),
    "tool schema unknown type": _with(tools=[{"type": "function", "name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "strin"}}}}]),
    "tool name bad": _with(tools=[{"type": "function", "name": "get weather!", "parameters": {"type": "object"}}]),
    "tool_choice bad": _with(tool_choice="sometimes"),
    "tool_choice names an unknown function": _with(tools=TOOLS, tool_choice={"type": "function", "name": "nope"}),
    "tool_choice required without tools": _with(tool_choice="required"),
    "tool_choice a hosted tool": _with(tools=TOOLS, tool_choice={"type": "file_search"}),
    "text format json_schema": _with(text={"format": {"type": "json_schema", "name": "x", "schema": {}}}),
    "text format json_object": _with(text={"format": {"type": "json_object"}}),
    "chat_template_kwargs sets tools": _with(chat_template_kwargs={"tools": []}),
    "previous_response_id": _with(previous_response_id="resp_abc"),
    "no user message": _item(role="assistant", content="hi"),
    "system message after the start": _with(input=[{"role": "user", "content": "hi"},
                                                   {"role": "system", "content": "late"}]),
    "prompt longer than the context": _with(input="word " * 5000),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_request_gets_an_openai_error_and_the_next_request_works(scripted, say, name):
    r = httpx.post(scripted.base + "/v1/responses", json=BAD[name], timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and isinstance(error["message"], str) and error["message"]
    say("fine")
    ok = httpx.post(scripted.base + "/v1/responses", json=OK, timeout=30)
    assert ok.status_code == 200 and ok.json()["object"] == "response"


def test_engine_failure_is_a_server_error_and_a_failed_stream(scripted, sclient, say):
    say("fine")
    scripted.engine.fail_on_prefill = True
    with pytest.raises(openai.InternalServerError):
        sclient.responses.create(model="m", input="fail now", max_output_tokens=5)
    scripted.engine.fail_on_prefill = True
    r = httpx.post(scripted.base + "/v1/responses", json={**OK, "input": "fail again", "stream": True}, timeout=30)
    events = sse_events(r)
    assert events[-1]["type"] == "response.failed" and events[-1]["response"]["status"] == "failed"
    assert "scripted failure" in events[-1]["response"]["error"]["message"]
    assert sclient.responses.create(model="m", input="hi", max_output_tokens=5).object == "response"
