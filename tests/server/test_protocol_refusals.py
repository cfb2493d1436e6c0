"""Request fields that change the output are honoured or refused, never dropped, and errors a client must recognise
are worded so that it does (found in a review against the official SDKs; each test failed before its fix)."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
RTOOLS = [{"type": "function", "name": "get_weather", "description": "Weather", "parameters": PARAMS}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def test_a_function_call_item_with_blank_arguments_is_no_500(scripted, say):
    """/v1/responses took blank arguments as {} in validation, then decoded them again for the template (a 500)."""
    say("Done.</think>\n\nSunny.")
    body = {"input": [{"role": "user", "content": "Weather?"},
                      {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": " "},
                      {"type": "function_call_output", "call_id": "c1", "output": "sunny"}],
            "tools": RTOOLS}
    r = httpx.post(scripted.base + "/v1/responses", json=body, timeout=30)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path, body, field", [
    ("/v1/completions", {"prompt": "x", "max_tokens": 3, "best_of": 4}, "best_of"),
    ("/v1/chat/completions", {"messages": ASK, "logit_bias": {"1234": -100}}, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"7": 5}}, "logit_bias"),
    ("/v1/chat/completions", {"messages": ASK, "functions": [{"name": "get_weather", "parameters": PARAMS}]},
     "functions"),
    ("/v1/chat/completions", {"messages": ASK, "function_call": "auto"}, "function_call"),
])
def test_fields_that_would_change_the_output_are_refused_not_ignored(scripted, say, path, body, field):
    say("hello")
    r = httpx.post(scripted.base + path, json=body, timeout=30)
    assert r.status_code == 400 and field in r.text, r.text


def test_an_empty_logit_bias_is_no_bias(scripted, say):
    say("hello")
    r = httpx.post(scripted.base + "/v1/chat/completions", json={"messages": ASK, "logit_bias": {}}, timeout=30)
    assert r.status_code == 200, r.text


def test_a_context_overflow_on_the_messages_api_is_worded_as_anthropics(scripted, say):
    """Anthropic's clients recognise an overflow by its wording ("prompt is too long: N tokens > M maximum"); the
    OpenAI surfaces keep the context_length_exceeded code (test_load_and_faults)."""
    client = anthropic.Anthropic(base_url=scripted.base, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "word " * 5000}])
    assert "prompt is too long" in str(e.value) and "maximum" in str(e.value), str(e.value)


def _call(city: str) -> str:
    return f"<tool_call>\n<function=get_weather>\n<parameter=city>\n{city}\n</parameter>\n</function>\n</tool_call>"


TWO_CALLS = "ok</think>\n\n" + _call("Paris") + "\n" + _call("Rome")


def test_no_parallel_tool_calls_gives_at_most_one_call_on_every_surface(scripted, say):
    """parallel_tool_calls false (chat, Responses) and disable_parallel_tool_use (messages) were read only to be echoed
    back: an agent that asked for one call got two. Now the model's first call is the answer's only one."""
    import openai
    oc = openai.OpenAI(base_url=scripted.base + "/v1", api_key="x", max_retries=0)
    ac = anthropic.Anthropic(base_url=scripted.base, api_key="x", max_retries=0)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": PARAMS}}]
    ask = [{"role": "user", "content": "Weather in Paris and Rome?"}]
    for parallel, want in ((None, 2), (False, 1)):
        extra = {} if parallel is None else {"parallel_tool_calls": parallel}
        say(TWO_CALLS)
        r = oc.chat.completions.create(model="m", messages=ask, tools=tools, **extra)
        assert len(r.choices[0].message.tool_calls) == want and r.choices[0].finish_reason == "tool_calls"
        say(TWO_CALLS)
        rr = oc.responses.create(model="m", input="Weather in Paris and Rome?", tools=RTOOLS, **extra)
        assert sum(o.type == "function_call" for o in rr.output) == want
        say(TWO_CALLS)
        choice = {} if parallel is None else {"tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}
        m = ac.messages.create(model="m", max_tokens=200, messages=ask, tools=[
            {"name": "get_weather", "description": "Weather", "input_schema": PARAMS}], **choice)
        assert sum(b.type == "tool_use" for b in m.content) == want and m.stop_reason == "tool_use"


DEEP_ARGUMENTS = '{"a": ' + "[" * 1000 + "]" * 1000 + "}"


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"max_tokens": 1, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                              "function": {"name": "f", "arguments": DEEP_ARGUMENTS}}]},
        {"role": "tool", "tool_call_id": "c", "content": "r"}]}),
    ("/v1/responses", {"max_output_tokens": 1, "input": [
        {"role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": DEEP_ARGUMENTS},
        {"type": "function_call_output", "call_id": "c", "output": "r"}]}),
], ids=["chat", "responses"])
def test_tool_call_arguments_nested_too_deep_are_a_400(scripted, say, path, body):
    """Arguments are a JSON string, so the body's depth check cannot see inside them: 1,000 levels made json.loads
    raise RecursionError, a 500 (design.md: deep nesting is a 400); on Python 3.12 they parsed and the template's
    rendering failed instead, with other words."""
    say("ok")
    r = httpx.post(scripted.base + path, json=body, timeout=30)
    assert r.status_code == 400 and "arguments are nested too deeply" in r.text, r.text


def test_tool_call_arguments_are_bounded_at_the_bodys_depth_whatever_the_python():
    """The bound is ours (64 levels, the body's default), not where this Python's recursion ends."""
    from openjet_launcher.server.protocol.openai import arguments_object
    from openjet_launcher.server.settings import ServerSettings
    from openjet_launcher.text.tool_calls import MAX_JSON_DEPTH as ARGUMENTS_MAX_DEPTH
    assert ARGUMENTS_MAX_DEPTH == ServerSettings().max_json_depth == 64

    def nested(levels: int) -> str:  # an object holding levels - 1 lists
        return '{"a": ' + "[" * (levels - 1) + "]" * (levels - 1) + "}"
    deepest = nested(ARGUMENTS_MAX_DEPTH)
    assert arguments_object(deepest) == json.loads(deepest)
    for levels in (ARGUMENTS_MAX_DEPTH + 1, 200):
        with pytest.raises(ValueError, match="nested too deeply"):
            arguments_object(nested(levels))


def test_a_developer_message_is_the_system_turn_for_a_template_without_that_role(text_layer):
    """Qwen's own template raises on a `developer` role; chat completions render leading system and developer
    messages as one system turn, as /v1/responses does (recent OpenAI clients send `developer`)."""
    from openjet_launcher.model.sdist import SdistError, sdist_member
    from openjet_launcher.server.protocol.openai import ChatCompletionRequest
    from openjet_launcher.text.chat import ChatTemplate
    tokenizer, _ = text_layer
    try:
        real = ChatTemplate(sdist_member("models/templates/Qwen3.5-4B.jinja").decode("utf-8"),
                            control_tokens=tokenizer.control_tokens)
    except SdistError as e:
        pytest.skip(f"llama-cpp-python sdist unavailable: {e}")
    req = ChatCompletionRequest.model_validate({"messages": [
        {"role": "system", "content": "Be kind."}, {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "hi"}]})
    assert real.render(req.messages_for_template()) == real.render(
        [{"role": "system", "content": "Be kind.\n\nBe brief."}, {"role": "user", "content": "hi"}])
