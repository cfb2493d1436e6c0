"""Known model output, replayed by the scripted engine through the real tokenizer, output parser and SSE
code: reasoning, XML tool calls and stop strings, checked end to end with the `openai` SDK."""

from __future__ import annotations

import json

import openai
import pytest

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
TOOL_OUTPUT = ("The user wants the weather.</think>\n\nLet me check."
               "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
               "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")


@pytest.fixture(scope="module")
def client(scripted):
    return openai.OpenAI(base_url=scripted.base + "/v1", api_key="x", max_retries=0)


def test_thinking_goes_to_reasoning_content(client, say):
    say("Two plus two is four.</think>\n\nThe answer is 4.")
    r = client.chat.completions.create(model="m", messages=ASK, max_tokens=100)
    m = r.choices[0].message
    assert m.model_extra["reasoning_content"] == "Two plus two is four."
    assert m.content == "The answer is 4." and r.choices[0].finish_reason == "stop"


def test_thinking_off_gives_all_content(client, say):
    say("Plain answer.")
    r = client.chat.completions.create(model="m", messages=ASK, max_tokens=100,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].message.content == "Plain answer."
    assert r.choices[0].message.model_extra.get("reasoning_content") is None


def test_xml_tool_call_becomes_structured_tool_calls(client, say):
    say(TOOL_OUTPUT)
    r = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, max_tokens=200)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}


def test_streamed_tool_call_accumulates_to_the_same_call(client, say):
    say(TOOL_OUTPUT)
    chunks = list(client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, max_tokens=200, stream=True))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].index == 0
    assert json.loads(calls[0].function.arguments) == {"city": "Paris", "days": 3}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    reasoning = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks)
    assert reasoning == "The user wants the weather."


def test_tool_choice_none_leaves_the_xml_as_text(client, say):
    say(TOOL_OUTPUT)
    r = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=200)
    assert r.choices[0].message.tool_calls is None and "<tool_call>" in r.choices[0].message.content


def test_a_past_tool_call_and_its_result_render(client, say):
    say("Done.</think>\n\nIt is sunny.")
    history = ASK + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    r = client.chat.completions.create(model="m", messages=history, tools=TOOLS, max_tokens=50)
    assert r.choices[0].message.content == "It is sunny."


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_ends_the_output_before_it_and_never_leaks_a_prefix(client, say, stream):
    say("alpha beta STOP gamma", end=False)
    kwargs = dict(model="m", prompt="x", max_tokens=50, stop=["STOP", "beta gamma"])
    if stream:
        chunks = list(client.completions.create(stream=True, **kwargs))
        pieces = [c.choices[0].text for c in chunks]
        assert all("S" not in p for p in pieces)          # no partial "STOP" ever went out
        text, reason = "".join(pieces), chunks[-1].choices[0].finish_reason
    else:
        r = client.completions.create(**kwargs)
        text, reason = r.choices[0].text, r.choices[0].finish_reason
    assert text == "alpha beta " and reason == "stop"


def test_held_back_stop_prefix_is_released_when_it_does_not_complete(scripted, client, say):
    say("alpha ST", end=False)
    n = len(scripted.engine.script)
    r = client.completions.create(model="m", prompt="x", max_tokens=n, stop=["STOP"])
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].text == "alpha ST"


def test_stop_on_end_of_generation_and_max_tokens(client, say):
    say("one two three")
    r = client.completions.create(model="m", prompt="x", max_tokens=100)
    assert r.choices[0].text == "one two three" and r.choices[0].finish_reason == "stop"
    r = client.completions.create(model="m", prompt="x", max_tokens=2)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 2


def two_turns(scripted, client, say):
    """ASK answered, then the conversation's second turn; the engine's prefill and replay counts of the second."""
    say("Fine.</think>\n\nOK.")
    a = client.chat.completions.create(model="m", messages=ASK, max_tokens=20)
    history = ASK + [{"role": "assistant", "content": "OK.", "reasoning_content": "Fine."},
                     {"role": "user", "content": "Thanks"}]
    scripted.engine.prefills.clear()
    scripted.engine.replayed = 0
    return a, client.chat.completions.create(model="m", messages=history, max_tokens=20)


def test_conversation_reuse_counts_reused_and_new_prompt_tokens(scripted, client, say):
    a, b = two_turns(scripted, client, say)
    t = b.model_extra["timings"]
    assert t["cache_n"] >= a.usage.prompt_tokens - 1 and t["cache_n"] + t["prompt_n"] == b.usage.prompt_tokens
    assert sum(scripted.engine.prefills) == t["prompt_n"]
    assert scripted.engine.replayed == 0     # rewound to a checkpoint: the rest is prefilled, not replayed
    assert b.usage.prompt_tokens_details.cached_tokens == t["cache_n"]


def test_an_engine_whose_prefill_is_not_decodes_keeps_only_the_previous_prompt(scripted, client, say):
    """Engine.prefill_matches_decode False (the CUDA engine's default prefill numerics): the next turn keeps at
    most the previous prompt and prefills the decoded answer again, so its state is a fresh prefill's; it
    rewinds to the checkpoint before the previous prompt's last token and prefills from there in one call."""
    scripted.engine.exact_prefill = False
    try:
        a, b = two_turns(scripted, client, say)
    finally:
        scripted.engine.exact_prefill = True
    t = b.model_extra["timings"]
    assert t["cache_n"] == a.usage.prompt_tokens - 1
    assert sum(scripted.engine.prefills) == t["prompt_n"] == b.usage.prompt_tokens - t["cache_n"]
    assert scripted.engine.replayed == 0 and len(scripted.engine.prefills) == 2   # the run, then the last token
