"""Known model output, replayed by the scripted engine through the real tokenizer, output parser and SSE
code: reasoning, XML tool calls and stop strings, checked end to end with the `openai` SDK."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from .conftest import prompt_text

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


# ------------------------------------------------------------------------------ reasoning effort

@pytest.mark.parametrize("effort", ["none", "minimal", "low", "medium", "high", "xhigh"])
def test_every_openai_reasoning_effort_renders_as_the_responses_api_renders_it(scripted, client, say, effort):
    """OpenAI's efforts (chat's `reasoning_effort`, Responses' `reasoning.effort`) map onto the template's xhigh,
    medium and low the same way on both APIs; "none" turns thinking off."""
    say("Fine.")
    r = client.chat.completions.create(model="m", messages=ASK, max_tokens=5, reasoning_effort=effort)
    assert r.choices[0].finish_reason == "stop"
    chat_prompt = prompt_text(scripted)
    client.responses.create(model="m", input=ASK, max_output_tokens=5, reasoning={"effort": effort})
    assert prompt_text(scripted) == chat_prompt
    template_effort = {"none": None, "minimal": "low", "high": "xhigh"}.get(effort, effort)
    expected = scripted.core.template.render(ASK, reasoning_effort=template_effort, enable_thinking=effort != "none")
    assert chat_prompt == expected
    if effort == "none":
        assert chat_prompt.endswith("<think>\n\n</think>\n\n") and r.choices[0].message.content == "Fine."


def test_an_unknown_reasoning_effort_is_a_400_that_names_the_accepted_values(scripted):
    r = httpx.post(scripted.base + "/v1/chat/completions", timeout=30,
                   json={"messages": ASK, "max_tokens": 5, "reasoning_effort": "max"})
    assert r.status_code == 400, r.text
    assert all(f"'{e}'" in r.json()["error"]["message"] for e in ("none", "minimal", "low", "medium", "high", "xhigh"))


# ------------------------------------------------------------------------------ tool_choice and prefill

CALL_REST = "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"   # a call after its opening
NOW = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
TURN_START = "<|im_start|>assistant\n<think>\n\n</think>\n\n"     # spec §1.2: an assistant turn without thinking


def chat_calls(client, stream: bool, **kwargs) -> tuple[list, str | None, str]:
    """(name, arguments) of the answer's tool calls, its content and finish_reason, streamed or not."""
    if not stream:
        choice = client.chat.completions.create(model="m", max_tokens=100, **kwargs).choices[0]
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or ()]
        return calls, choice.message.content, choice.finish_reason
    chunks = list(client.chat.completions.create(model="m", max_tokens=100, stream=True, **kwargs))
    calls = [(c.function.name, json.loads(c.function.arguments))
             for k in chunks if k.choices for c in k.choices[0].delta.tool_calls or ()]
    content = "".join(k.choices[0].delta.content or "" for k in chunks if k.choices)
    return calls, content or None, chunks[-1].choices[0].finish_reason


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_choice_naming_a_function_makes_the_answer_that_call(scripted, client, say, stream):
    """The prompt opens the call in the model's format (spec §1.2) after an empty think block; the model writes
    its parameters, and the answer is the whole call."""
    say(CALL_REST)
    calls, content, finish = chat_calls(client, stream, messages=ASK, tools=TOOLS + [NOW],
                                        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert prompt_text(scripted).endswith(TURN_START + "<tool_call>\n<function=get_weather>\n")
    assert (calls, content, finish) == ([("get_weather", {"city": "Paris"})], None, "tool_calls")


def test_tool_choice_required_opens_a_call_whose_function_the_model_names(scripted, client, say):
    say("=now>\n</function>\n</tool_call>")
    calls, _, finish = chat_calls(client, False, messages=ASK, tools=TOOLS + [NOW], tool_choice="required")
    assert prompt_text(scripted).endswith(TURN_START + "<tool_call>\n<function")
    assert (calls, finish) == ([("now", {})], "tool_calls")
    say(CALL_REST)      # with one tool, "required" can only mean that one: it is named
    calls, _, _ = chat_calls(client, False, messages=ASK, tools=TOOLS, tool_choice="required")
    assert prompt_text(scripted).endswith(TURN_START + "<tool_call>\n<function=get_weather>\n")
    assert calls == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("tools,choice,says", [
    (TOOLS, {"type": "function", "function": {"name": "get_time"}}, "'get_time'"),
    (None, "required", "no tools")], ids=["unknown name", "no tools"])
def test_a_tool_choice_that_needs_a_tool_the_request_lacks_is_a_400(scripted, tools, choice, says):
    r = httpx.post(scripted.base + "/v1/chat/completions", timeout=30,
                   json={"messages": ASK, "max_tokens": 5, "tools": tools, "tool_choice": choice})
    assert r.status_code == 400 and says in r.json()["error"]["message"], r.text


def test_a_call_to_a_function_the_request_did_not_declare_is_returned_as_text(client, say):
    unknown = "<tool_call>\n<function=search>\n<parameter=q>\ncats\n</parameter>\n</function>\n</tool_call>"
    say("Hm.</think>\n\nSearching." + unknown)
    calls, content, finish = chat_calls(client, False, messages=ASK, tools=TOOLS)
    assert (calls, content, finish) == ([], "Searching." + unknown, "stop")


def test_continue_final_message_continues_the_assistants_text(scripted, client, say):
    """vLLM's `continue_final_message`: the prompt ends inside the last (assistant) message, which the model
    continues; the answer is the continuation only."""
    say(" 42.")
    r = client.chat.completions.create(model="m", max_tokens=20, messages=ASK + [
        {"role": "assistant", "content": "The answer is"}], extra_body={"continue_final_message": True,
                                                                        "add_generation_prompt": False})
    assert prompt_text(scripted).endswith("<|im_start|>user\nWeather in Paris?<|im_end|>\n" + TURN_START
                                          + "The answer is")
    assert r.choices[0].message.content == " 42." and r.choices[0].finish_reason == "stop"


def test_a_character_cut_by_max_tokens_is_dropped_not_a_replacement_character(scripted, say):
    """The tiny model's byte tokens split an emoji in two: max_tokens = 1 ends after its first half, which the next
    token would have completed; the answer leaves it out (it was U+FFFD), streamed or not, and 2 tokens give it."""
    say("\U0001F600\U0001F600")
    body = {"model": "scripted", "prompt": "x", "max_tokens": 1}
    r = httpx.post(scripted.base + "/v1/completions", json=body, timeout=30).json()
    assert r["choices"][0]["text"] == "" and r["choices"][0]["finish_reason"] == "length"
    streamed = httpx.post(scripted.base + "/v1/completions", json={**body, "stream": True}, timeout=30).text
    assert "\\ufffd" not in streamed and "\ufffd" not in streamed
    r = httpx.post(scripted.base + "/v1/completions", json={**body, "max_tokens": 2}, timeout=30).json()
    assert r["choices"][0]["text"] == "\U0001F600"
