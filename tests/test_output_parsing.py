"""Model output -> reasoning, content and tool calls (openjet_launcher.text.output).

The oracles: hand-written expected results for each rule; `split_reasoning` (the think rules stated for a
complete text) for outputs without tool calls; and, for streaming, the complete parse itself: every split
of an output into deltas must accumulate to it, and nothing emitted may later prove wrong (what has been
emitted is always a prefix of the final reasoning, content and calls).
"""

from __future__ import annotations

import json
import random
import re

import pytest

from openjet_launcher.text.output import (
    ContentDelta,
    OutputParser,
    ParsedOutput,
    ReasoningDelta,
    ToolCallEvent,
    accumulate,
    parse_complete,
)
from openjet_launcher.text.reasoning import split_reasoning
from openjet_launcher.text.tool_calls import ToolCall, call_opening

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "configure",
            "parameters": {
                "type": "object",
                "properties": {
                    "verbose": {"type": "boolean"},
                    "ratio": {"type": "number"},
                    "options": {"type": "object", "properties": {"depth": {"type": "integer"}}},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "note": {"type": ["string", "null"]},
                    "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                    "mode": {"enum": ["fast", "slow"]},
                    "nothing": {"type": "null"},
                },
            },
        },
    },
    {  # Anthropic's shape is accepted too
        "name": "write_file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}},
    },
]


def call_id(index: int) -> str:
    return f"call_{index}"


def parse(text: str, thinking: bool = True, tools: list | None = TOOLS) -> ParsedOutput:
    return parse_complete(text, thinking=thinking, tools=tools, make_call_id=call_id)


def xml_call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def args(call: ToolCall) -> dict:
    return json.loads(call.arguments)


# ---- reasoning and content ----


def test_reasoning_then_content_with_the_newlines_around_the_tags_stripped():
    out = parse("Let me think.\nStep two.\n</think>\n\nThe answer is 4.")
    assert (out.reasoning, out.content) == ("Let me think.\nStep two.", "The answer is 4.")
    assert (out.tool_calls, out.warnings) == ([], [])


def test_no_closing_tag_yet_means_everything_is_reasoning():
    out = parse("Still thinking about\nthe problem")
    assert (out.reasoning, out.content) == ("Still thinking about\nthe problem", "")


def test_thinking_off_makes_everything_content():
    out = parse("Hello there.\n", thinking=False)
    assert (out.reasoning, out.content) == ("", "Hello there.")


def test_thinking_off_but_a_think_block_emitted_anyway_is_still_reasoning():
    out = parse("<think>\nhmm\n</think>\n\nHi!", thinking=False)
    assert (out.reasoning, out.content) == ("hmm", "Hi!")


def test_a_think_tag_the_model_emits_although_the_prompt_opened_one_is_dropped():
    out = parse("<think>\nreasoning\n</think>\n\nanswer")
    assert (out.reasoning, out.content) == ("reasoning", "answer")


def test_empty_reasoning_and_a_stray_closing_tag_in_the_content():
    out = parse("</think>\n\nanswer</think> more")
    assert (out.reasoning, out.content) == ("", "answer more")
    assert len(out.warnings) == 1 and "stray </think>" in out.warnings[0]


def test_text_that_only_looks_like_a_tag_start_is_kept():
    out = parse("a < b and c<d <thinking> <tool\n</think>\n\nx <tools> y <", tools=TOOLS)
    assert (out.reasoning, out.content) == ("a < b and c<d <thinking> <tool", "x <tools> y <")


@pytest.mark.parametrize("thinking", [True, False])
def test_without_tool_calls_the_parser_follows_the_think_rules(thinking):
    for text in CORPUS_TEXTS:
        if "<tool_call>" in text:
            continue
        out = parse(text, thinking=thinking)
        assert (out.reasoning, out.content) == split_reasoning(text, thinking), text


# ---- tool calls ----


def test_arguments_are_typed_by_the_schema():
    call = xml_call(
        "configure",
        verbose="true",
        ratio="0.25",
        options='{"depth": 3}',
        tags='["a", "b"]',
        note="null",
        limit="7",
        mode="fast",
        nothing="null",
    )
    out = parse("ok\n</think>\n\n" + call)
    assert out.content == "" and out.warnings == []
    assert out.tool_calls == [ToolCall("call_0", "configure", out.tool_calls[0].arguments)]
    assert args(out.tool_calls[0]) == {
        "verbose": True,
        "ratio": 0.25,
        "options": {"depth": 3},
        "tags": ["a", "b"],
        "note": None,
        "limit": 7,
        "mode": "fast",
        "nothing": None,
    }


def test_string_arguments_keep_their_text_minus_one_newline_each_side():
    content = "\n  indented\n\n<b>html</b>\n"
    out = parse("</think>" + xml_call("write_file", path="a.txt", content=content))
    assert args(out.tool_calls[0]) == {"path": "a.txt", "content": content}
    out = parse("</think>" + xml_call("get_weather", city="123", days="2"))
    assert args(out.tool_calls[0]) == {"city": "123", "days": 2}  # a string stays a string


def test_python_literals_are_accepted_for_booleans_and_null():
    out = parse("</think>" + xml_call("configure", verbose="True", nothing="None", note="None"))
    assert args(out.tool_calls[0]) == {"verbose": True, "nothing": None, "note": None}


def test_a_value_that_does_not_parse_falls_back_to_the_string_with_a_warning():
    out = parse("</think>" + xml_call("get_weather", city="Oslo", days="three"))
    assert args(out.tool_calls[0]) == {"city": "Oslo", "days": "three"}
    assert len(out.warnings) == 1 and "'days'" in out.warnings[0]
    out = parse("</think>" + xml_call("configure", ratio="NaN"))  # json.loads would take it; JSON would not
    assert args(out.tool_calls[0]) == {"ratio": "NaN"} and len(out.warnings) == 1


def test_a_call_to_a_function_the_request_did_not_declare_stays_text_with_a_warning():
    # OpenAI and Anthropic clients run only the tools they declared: a call to another is not one they can run.
    call = xml_call("search", query="cats", limit="5")
    out = parse("</think>\n\nLet me search.\n" + call)
    assert out.tool_calls == [] and out.content == "Let me search.\n" + call
    assert len(out.warnings) == 1 and "'search', which is not among the request's tools" in out.warnings[0]
    out = parse("Plan.\n" + call + "\n</think>\n\nDone.")  # in the think block it stays reasoning
    assert (out.reasoning, out.content, out.tool_calls) == ("Plan.\n" + call, "Done.", [])
    out = parse("</think>" + call + xml_call("get_weather", city="Rome"))  # scanning goes on after it
    assert out.content == call and [c.name for c in out.tool_calls] == ["get_weather"]


def test_an_unknown_parameter_keeps_its_string_and_warns():
    out = parse("</think>" + xml_call("get_weather", city="Rome", color="7"))
    assert args(out.tool_calls[0]) == {"city": "Rome", "color": "7"} and "not in the schema" in out.warnings[0]


def test_two_calls_with_text_before_them():
    text = (
        "I need the weather.\n</think>\n\nLet me check both cities.\n\n"
        + xml_call("get_weather", city="Paris", days="1")
        + "\n"
        + xml_call("get_weather", city="Lyon")
    )
    out = parse(text)
    assert out.reasoning == "I need the weather." and out.content == "Let me check both cities."
    assert [(c.id, c.name, args(c)) for c in out.tool_calls] == [
        ("call_0", "get_weather", {"city": "Paris", "days": 1}),
        ("call_1", "get_weather", {"city": "Lyon"}),
    ]
    assert out.warnings == []


def test_a_call_without_parameters_and_with_loose_whitespace():
    out = parse("</think><tool_call><function=get_weather>\n\n</function>  </tool_call>")
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("get_weather", "{}")]


def test_tags_inside_a_value_are_part_of_the_value():
    value = "x = '</parameter>'\n<think>not a tag</think> </function> <tool_call> </tool_call>\ny"
    out = parse("</think>" + xml_call("write_file", path="t.py", content=value))
    assert args(out.tool_calls[0]) == {"path": "t.py", "content": value}
    assert out.content == "" and out.reasoning == ""


def test_a_call_inside_the_think_block_ends_the_reasoning():
    out = parse("I will look it up.\n" + xml_call("get_weather", city="Oslo"))
    assert out.reasoning == "I will look it up." and out.content == ""
    assert [c.name for c in out.tool_calls] == ["get_weather"]
    assert "inside the think block" in out.warnings[0]


def test_a_malformed_call_inside_the_think_block_stays_reasoning():
    raw = MALFORMED["missing </function>"]
    out = parse("Plan.\n" + raw + "\nmore\n</think>\n\nDone.")
    assert (out.reasoning, out.content, out.tool_calls) == ("Plan.\n" + raw + "\nmore", "Done.", [])
    assert "kept as reasoning" in out.warnings[0]


def test_an_unclosed_call_in_the_think_block_ends_at_the_think_close():
    """A call drafted in the reasoning and never closed stops at `</think>`: it stays reasoning and the answer after
    it is content (the call's value ran on to the next `</parameter>`, past `</think>`: the answer was lost, or a later
    real call's text became its argument)."""
    draft = "I could call <tool_call>\n<function=get_weather>\n<parameter=city>\nParis, but no."
    out = parse(draft + "</think>\n\nIt is sunny.")
    assert (out.reasoning, out.content, out.tool_calls) == (draft, "It is sunny.", [])
    assert "</think> inside the call" in out.warnings[0]
    out = parse(draft + "</think>\n\n" + xml_call("get_weather", city="Paris"))
    assert out.reasoning == draft and [args(c) for c in out.tool_calls] == [{"city": "Paris"}]


def test_a_value_nested_too_deep_for_json_is_passed_as_text_with_a_warning():
    """An array parameter nested 1,200 deep (json.loads raises RecursionError on Python 3.11, parses it on 3.12) or 65
    deep (past the request body's bound, which the server would refuse as a client's arguments): the raw text with a
    warning, not a crash of the request; 64 deep is still an array."""
    for levels in (1200, 65):
        deep = "[" * levels + "]" * levels
        out = parse("</think>" + xml_call("configure", tags=deep))
        assert [args(c) for c in out.tool_calls] == [{"tags": deep}]
        assert "not valid JSON" in out.warnings[0]
    ok = "[" * 64 + "]" * 64
    out = parse("</think>" + xml_call("configure", tags=ok))
    assert [args(c) for c in out.tool_calls] == [{"tags": json.loads(ok)}] and not out.warnings


def test_a_value_of_another_json_type_than_the_schema_says_is_passed_with_a_warning():
    out = parse("</think>" + xml_call("get_weather", city="Rome", days='"5"'))
    assert args(out.tool_calls[0]) == {"city": "Rome", "days": "5"}
    assert "is JSON of type string where the schema says integer" in out.warnings[0]


def test_a_tool_call_tag_mentioned_in_the_reasoning_is_text():
    out = parse("I should use <tool_call> tags.\n</think>\n\nDone.")
    assert (out.reasoning, out.content, out.tool_calls) == ("I should use <tool_call> tags.", "Done.", [])


def test_without_tools_the_markup_is_plain_content():
    text = "</think>\n\n" + xml_call("get_weather", city="Paris")
    out = parse(text, tools=None)
    assert out.tool_calls == [] and out.content == xml_call("get_weather", city="Paris")
    assert parse(text, tools=[]).content == out.content


def test_calls_get_random_openai_style_ids_by_default():
    text = "</think>" + xml_call("get_weather", city="A") + xml_call("get_weather", city="B")
    calls = parse_complete(text, tools=TOOLS).tool_calls
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", c.id) for c in calls) and calls[0].id != calls[1].id


def test_a_streamed_call_is_one_event_in_openai_delta_shape():
    parser = OutputParser(thinking=False, tools=TOOLS, make_call_id=call_id)
    events = parser.feed(xml_call("get_weather", city="Nice", days="4")) + parser.finish()
    assert events == [ToolCallEvent(0, ToolCall("call_0", "get_weather", '{"city": "Nice", "days": 4}'))]
    assert events[0].to_openai_delta() == {
        "index": 0,
        "id": "call_0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Nice", "days": 4}'},
    }


# ---- malformed calls: raw text as content, a warning, never an exception ----

MALFORMED = {
    "unclosed at the end": "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
    "unclosed after </function>": "<tool_call>\n<function=get_weather>\n</function>\n",
    "missing </function>": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</tool_call>",
    "no function name": "<tool_call>\n<function=>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    "no function tag": "<tool_call>\n{\"name\": \"get_weather\"}\n</tool_call>",
    "garbage inside": "<tool_call>\n<function=get_weather>\nplease\n</function>\n</tool_call>",
    "name with spaces": "<tool_call>\n<function=get weather>\n</function>\n</tool_call>",
    "text after </function>": "<tool_call>\n<function=get_weather>\n</function>\noops</tool_call>",
    "bad parameter name": "<tool_call>\n<function=get_weather>\n<parameter=\nx>\n1\n</parameter>\n</function>\n"
    "</tool_call>",
    "name never closed": "<tool_call>\n<function=" + "a" * 300 + "\n",
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_call_becomes_content_with_a_warning(case):
    raw = MALFORMED[case]
    out = parse("Thinking.\n</think>\n\nHere.\n" + raw)
    assert out.reasoning == "Thinking." and out.tool_calls == []
    assert out.content == ("Here.\n" + raw).strip()
    assert any("malformed tool call" in w for w in out.warnings)


def test_a_valid_call_after_a_malformed_one_is_still_parsed():
    out = parse("</think>" + MALFORMED["missing </function>"] + "\n" + xml_call("get_weather", city="Bern"))
    assert out.content == MALFORMED["missing </function>"]
    assert [(c.id, args(c)) for c in out.tool_calls] == [("call_0", {"city": "Bern"})]


# ---- streaming: any split accumulates to the complete parse, and nothing emitted is taken back ----

CORPUS = [
    (True, "Let me think.\nStep two.\n</think>\n\nThe answer is 4."),
    (True, "Still thinking about\nthe problem\n"),
    (False, "Hello there.\n\nSecond paragraph.\n"),
    (False, "<think>\nhmm\n</think>\n\nHi!"),
    (True, "<think>\nreasoning\n</think>\n\nanswer</think> more"),
    (True, "a < b and c<d <thinking> <tool\n</think>\n\nx <tools> y <"),
    (True, "first\n</think>\n\nmid <think>second thought</think> end"),
    (True, "Héllo wörld 世界 🙂\n</think>\n\nÇa va? 🙂"),
    (True, "I need the weather.\n</think>\n\nLet me check both cities.\n\n"
     + xml_call("get_weather", city="Paris", days="1") + "\n" + xml_call("get_weather", city="Lyon")),
    (True, "ok\n</think>\n\n" + xml_call("configure", verbose="true", ratio="0.25", options='{"depth": 3}',
                                         tags='["a", "b"]', note="null", limit="7", mode="fast")),
    (False, xml_call("write_file", path="t.py",
                     content="x = '</parameter>'\n<think>no</think> </function>\n<tool_call> </tool_call>\ny")),
    (True, "I will look it up.\n" + xml_call("get_weather", city="Oslo") + "\n\nAfter."),
    (True, "I should use <tool_call> tags.\n<tool_call>\nlater\n</think>\n\nDone."),
    (True, "Plan.\n" + MALFORMED["garbage inside"] + "\nmore\n</think>\n\nDone."),
    (True, "Draft <tool_call>\n<function=get_weather>\n<parameter=city>\nParis ...</think>\n\n"
     + xml_call("get_weather", city="Paris")),
    # calls begun in the reasoning and cut by `</think>` at every stage of the scan (a split inside `</think>` must
    # reach the complete parse's verdict and warning)
    (True, "Draft <tool_call>\n<function=get_weather>\n</think>\n\nSunny."),
    (True, "Draft <tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</think>\n\nSunny."),
    (True, "Draft <tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function></think>x"),
    (True, "Draft <tool_call>\n<function=get_weather>\n<parameter=ci</think>\n\nSunny."),
    (True, "Draft <tool_call>\n<func</think>\n\nSunny."),
    (True, "x\n</think>\n\n" + MALFORMED["missing </function>"] + "\n" + xml_call("get_weather", city="Bern")),
    (False, "before " + xml_call("search", q="1") + " mid " + xml_call("get_weather", city="A", days="x") + " after"),
] + [(True, "Thinking.\n</think>\n\nHere.\n" + raw) for raw in MALFORMED.values()]
CORPUS_TEXTS = [text for _, text in CORPUS]
TAGS = ("<think>", "</think>", "<tool_call>")


def stream(chunks: list[str], thinking: bool, tools: list | None) -> tuple[ParsedOutput, list[list]]:
    parser = OutputParser(thinking=thinking, tools=tools, make_call_id=call_id)
    batches = [parser.feed(chunk) for chunk in chunks] + [parser.finish()]
    return accumulate(event for batch in batches for event in batch), batches


def check_stream(chunks: list[str], thinking: bool, tools: list | None, final: ParsedOutput) -> None:
    got, batches = stream(chunks, thinking, tools)
    assert got == final, chunks
    so_far = ParsedOutput()
    plain = "<" not in final.reasoning + final.content  # then no tag piece may ever show in a delta
    for batch in batches:
        for event in batch:
            so_far.add(event)
            if isinstance(event, (ReasoningDelta, ContentDelta)):
                assert event.text, chunks
                assert not (plain and "<" in event.text), (event, chunks)
        assert final.reasoning.startswith(so_far.reasoning), (so_far, chunks)
        assert final.content.startswith(so_far.content), (so_far, chunks)
        assert final.tool_calls[: len(so_far.tool_calls)] == so_far.tool_calls, chunks


@pytest.mark.parametrize("tools", [TOOLS, None], ids=["tools", "no-tools"])
@pytest.mark.parametrize("thinking,text", CORPUS, ids=[f"out{i}" for i in range(len(CORPUS))])
def test_every_split_accumulates_to_the_complete_parse(thinking, text, tools):
    final = parse(text, thinking=thinking, tools=tools)
    check_stream([text], thinking, tools, final)
    check_stream(list(text), thinking, tools, final)
    for cut in range(len(text) + 1):
        check_stream([text[:cut], text[cut:]], thinking, tools, final)
    rng = random.Random(len(text))
    for _ in range(30):
        cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(2, 12))))
        check_stream([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])], thinking, tools, final)


def test_a_partial_tag_is_held_back_and_released_as_soon_as_it_cannot_be_a_tag():
    parser = OutputParser(thinking=True, tools=TOOLS)
    assert parser.feed("abc </thi") == [ReasoningDelta("abc")]
    assert parser.feed("s is text") == [ReasoningDelta(" </this is text")]
    assert parser.feed("\n<tool_") == []
    assert parser.feed("call>\n") == []  # `<function=` may still follow
    assert parser.feed("but no") == [ReasoningDelta("\n<tool_call>\nbut no")]
    assert parser.feed("\n</think>\n\n<") == []
    assert parser.feed("3") == [ContentDelta("<3")]
    assert parser.finish() == []


def test_end_of_output_releases_a_held_prefix_as_text():
    parser = OutputParser(thinking=False, tools=TOOLS)
    assert parser.feed("see <tool_ca") == [ContentDelta("see")]
    assert parser.finish() == [ContentDelta(" <tool_ca")]


# ---- output that starts in the prompt: a forced call's opening, a prefill's continuation ----

FORCED_REST = "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"


def test_a_forced_calls_opening_written_by_the_prompt_is_parsed_with_the_output():
    # The prompt ends with the opening (tool_choice names get_weather); the model writes the rest of the call.
    assert call_opening("get_weather") == "<tool_call>\n<function=get_weather>\n"
    for cut in range(len(FORCED_REST) + 1):
        parser = OutputParser(thinking=False, tools=TOOLS, make_call_id=call_id, prefix=call_opening("get_weather"))
        out = accumulate(parser.feed(FORCED_REST[:cut]) + parser.feed(FORCED_REST[cut:]) + parser.finish())
        assert out == ParsedOutput(tool_calls=[ToolCall("call_0", "get_weather", '{"city": "Paris"}')])


def forced(text: str, name: str | None) -> ParsedOutput:
    return parse_complete(text, thinking=False, tools=TOOLS, make_call_id=call_id, prefix=call_opening(name))


def test_an_opening_without_a_name_lets_the_model_name_one_of_the_tools():
    assert call_opening(None) == "<tool_call>\n<function"
    out = forced("=get_weather>\n" + FORCED_REST, None)
    assert [(c.name, args(c)) for c in out.tool_calls] == [("get_weather", {"city": "Paris"})]
    out = forced("=search>\n" + FORCED_REST, None)  # a function the request did not declare: text
    assert out.tool_calls == [] and out.content == call_opening(None) + "=search>\n" + FORCED_REST


def test_a_continued_answer_keeps_its_leading_whitespace():
    # After the prefill "The answer is", the model's " 42." is the text to append, space included.
    assert parse_complete(" 42.\n", thinking=False, continues=True).content == " 42."
    parser = OutputParser(thinking=False, continues=True)
    assert accumulate(parser.feed(" ") + parser.feed("42.") + parser.finish()).content == " 42."
    assert parse(" 42.\n", thinking=False).content == "42."  # a new answer is stripped


def test_a_number_that_overflows_a_double_stays_text_not_infinity():
    """1e400 parsed as float('inf'), and json.dumps wrote the arguments with Infinity, which no strict JSON parser
    takes (found in review): a number parameter that overflows is passed as its text, with a warning."""
    from openjet_launcher.text.output import parse_complete
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "n": {"type": "number"}, "o": {"type": "object"}}}}}]
    for param in ("<parameter=n>\n1e400\n</parameter>", '<parameter=o>\n{"x": -1e999}\n</parameter>'):
        out = parse_complete(f"r</think><tool_call>\n<function=f>\n{param}\n</function>\n</tool_call>", tools=tools)
        arguments = out.tool_calls[0].arguments
        json.loads(arguments, parse_constant=lambda c: pytest.fail(f"{c} in {arguments}"))
