"""Model output -> reasoning, content and tool calls, incrementally: what the server streams and returns.

`OutputParser.feed(delta)` takes decoded text as it comes (the streaming detokenizer has already held
back incomplete UTF-8) and returns events; `finish()` ends the output. `parse_complete(text)` is the
same parser fed once, so the non-streaming answer equals what any streaming split accumulates to.

Three modes, one buffer of text not yet decided:

* reasoning (the start, when the prompt opened the think block) and content look for tags: `</think>`,
  `<think>` and, when the request has tools, `<tool_call>` (reasoning.py gives the think rules). Text
  before a tag goes out at once; a suffix that could still become a tag (`</thi`, `<tool_`) is held
  back until the next delta says it cannot. In the reasoning, `<tool_call>` ends the reasoning only
  when `<function=` follows and the call proves valid (Qwen3.5-family models sometimes call a tool
  without closing the think block; vLLM's Qwen3 reasoning parser makes the same exception); otherwise
  it is reasoning text. A call begun in the reasoning ends at `</think>` at the latest (unfinished there, it
  is reasoning text, and `</think>` still ends the reasoning).
* tool call: from `<tool_call>` on, nothing is emitted until tool_calls.ToolCallScanner has the whole
  call. Then it goes out as one ToolCallEvent with its complete arguments; a call that turns out
  malformed (garbage inside, `</function>` missing, output ending inside it) goes out raw as content
  (as reasoning when it began there), with a warning, and scanning goes on after the point where it
  went wrong. A call to a function the request did not declare goes out the same way: the client could
  not run it. Emitting whole calls is a choice: a call's name streamed early could not be
  taken back when the call proves malformed, and typed arguments (an integer, an object) are only
  known once their value is closed. OpenAI clients accept a whole call in one delta
  (`ToolCallEvent.to_openai_delta`).

Reasoning and content each come out stripped of leading and trailing whitespace: leading whitespace is
dropped, trailing whitespace is held back until more text follows it, and dropped at the end. An output
that continues text the prompt already holds (an assistant prefill) keeps its leading whitespace: it is
the continuation's own (" 42" after "The answer is").
Warnings are events too, so a stream's accumulation and the complete parse carry the same ones.

The prompt may also hold the start of the output for the model to go on from (a forced tool call's
opening, tool_calls.call_opening): the parser reads that `prefix` first, as if the model had written it.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

from openjet_launcher.text.reasoning import THINK_CLOSE, THINK_OPEN
from openjet_launcher.text.tool_calls import (
    TOOL_CALL_OPEN,
    Malformed,
    ToolCall,
    ToolCallScanner,
    build_call,
    index_tools,
    starts_call,
)


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ToolCallEvent:
    """A complete tool call; `index` counts the calls of this output from 0."""

    index: int
    call: ToolCall

    def to_openai_delta(self) -> dict[str, Any]:
        """The `choices[].delta.tool_calls[]` entry of a chat.completion.chunk carrying the whole call."""
        return {"index": self.index, **self.call.to_openai()}


@dataclass(frozen=True)
class ParseWarning:
    """Something the model wrote that had to be guessed at or kept as text; for the server's log."""

    message: str


Event = Union[ReasoningDelta, ContentDelta, ToolCallEvent, ParseWarning]


@dataclass
class ParsedOutput:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def add(self, event: Event) -> None:
        if isinstance(event, ReasoningDelta):
            self.reasoning += event.text
        elif isinstance(event, ContentDelta):
            self.content += event.text
        elif isinstance(event, ToolCallEvent):
            self.tool_calls.append(event.call)
        else:
            self.warnings.append(event.message)


def accumulate(events: Iterable[Event]) -> ParsedOutput:
    parsed = ParsedOutput()
    for event in events:
        parsed.add(event)
    return parsed


def random_call_id(index: int) -> str:
    """`call_` + 24 hex digits, the shape vLLM gives (`uuid4().hex[:24]`)."""
    return "call_" + secrets.token_hex(12)


class _Stripped:
    """One output channel with surrounding whitespace removed as the text streams through; `started`: text
    came before (the prompt's), so leading whitespace is kept."""

    def __init__(self, started: bool = False) -> None:
        self._started = started
        self._held = ""  # trailing whitespace, sent only if more text follows

    def push(self, text: str) -> str:
        if not self._started:
            text = text.lstrip()
            if not text:
                return ""
            self._started = True
        body = text.rstrip()
        if not body:
            self._held += text
            return ""
        out, self._held = self._held + body, text[len(body) :]
        return out


_REASONING, _CONTENT, _TOOL_CALL = "reasoning", "content", "tool call"
_TAGS = {_REASONING: (THINK_CLOSE, THINK_OPEN, TOOL_CALL_OPEN), _CONTENT: (TOOL_CALL_OPEN, THINK_OPEN, THINK_CLOSE)}


class OutputParser:
    """Incremental parser of one generation.

    thinking: the prompt opened the think block (enable_thinking true), so the output starts as reasoning.
    tools: the request's `tools` (OpenAI or Anthropic shapes); None or empty turns tool-call parsing off,
        and `<tool_call>` is then plain text (tool_choice "none" should pass None).
    make_call_id: index -> id of each call; random `call_...` ids by default.
    prefix: the start of the output that the prompt wrote (a forced call's opening), read before the model's.
    continues: the output continues text of the prompt's (an assistant prefill): its leading whitespace stays.
    """

    def __init__(
        self,
        thinking: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        make_call_id: Callable[[int], str] = random_call_id,
        prefix: str = "",
        continues: bool = False,
    ) -> None:
        self._tools = index_tools(tools) if tools else None
        self._make_call_id = make_call_id
        self._mode = _REASONING if thinking else _CONTENT
        self._buf = prefix  # text not yet emitted; in a tool call it starts with `<tool_call>`
        self._scanner: ToolCallScanner | None = None
        self._call_from = _CONTENT  # the mode a call began in: a malformed call's text goes back there
        self._channels = {_REASONING: _Stripped(), _CONTENT: _Stripped()}
        self._channels[self._mode] = _Stripped(started=continues)
        self._n_calls = 0
        self._finished = False

    def feed(self, text: str) -> list[Event]:
        if self._finished:
            raise RuntimeError("OutputParser.feed() after finish()")
        self._buf += text
        events: list[Event] = []
        self._run(events, at_end=False)
        return events

    def finish(self) -> list[Event]:
        """End of output: a held-back tag prefix goes out as text, an unclosed call as raw text."""
        if self._finished:
            return []
        events: list[Event] = []
        self._run(events, at_end=True)
        self._finished = True
        return events

    def _run(self, events: list[Event], at_end: bool) -> None:
        while True:
            if self._mode == _TOOL_CALL:
                if not self._end_tool_call(events, at_end):
                    return
                continue
            kind, at, tag = self._find_tag()
            self._emit(events, self._mode, self._buf[:at])
            self._buf = self._buf[at:]
            if kind != "tag":
                if at_end:  # a held-back tag prefix that never completed is text
                    self._emit(events, self._mode, self._buf)
                    self._buf = ""
                return
            if tag == TOOL_CALL_OPEN:
                self._call_from, self._mode, self._scanner = self._mode, _TOOL_CALL, ToolCallScanner()
                continue  # the buffer keeps `<tool_call>`: the scanner reads from it
            self._buf = self._buf[len(tag) :]
            if tag == THINK_CLOSE:
                if self._mode == _CONTENT:
                    events.append(ParseWarning("stray </think> in the content: dropped"))
                self._mode = _CONTENT
            else:  # `<think>`: dropped in the reasoning, opens a think block in the content
                self._mode = _REASONING

    def _end_tool_call(self, events: list[Event], at_end: bool) -> bool:
        """Scan the call in the buffer; False while it is incomplete and the output goes on."""
        assert self._scanner is not None and self._tools is not None
        buf = self._buf
        think_close = buf.find(THINK_CLOSE) if self._call_from == _REASONING else -1
        if think_close != -1:  # a call begun in the reasoning ends with it: never an argument running past `</think>`
            buf = buf[:think_close]
        elif self._call_from == _REASONING and not at_end:  # a `</think>` still arriving: scan up to it (any split
            buf = buf[: len(buf) - _partial_tag(buf, THINK_CLOSE)]  # then reaches the complete parse's verdict)
        verdict = self._scanner.advance(buf)
        if verdict is None and think_close != -1:
            verdict = Malformed(think_close, "</think> inside the call")
        elif verdict is None:
            if not at_end:
                return False
            verdict = self._scanner.at_end(buf)
        self._scanner = None
        if isinstance(verdict, Malformed):
            self._keep_as_text(events, verdict.at, f"malformed tool call, kept as {self._call_from}: {verdict.reason}")
        elif verdict.name not in self._tools:  # the client could not run it
            self._keep_as_text(events, verdict.end, f"tool call to {verdict.name!r}, which is not among the "
                                                    f"request's tools, kept as {self._call_from}")
        else:
            if self._call_from == _REASONING:
                events.append(ParseWarning("tool call inside the think block (no </think>): reasoning ends there"))
            call, warnings = build_call(verdict, self._make_call_id(self._n_calls), self._tools)
            events.append(ToolCallEvent(self._n_calls, call))
            events.extend(ParseWarning(w) for w in warnings)
            self._n_calls += 1
            self._buf, self._mode = self._buf[verdict.end :], _CONTENT
        return True

    def _keep_as_text(self, events: list[Event], at: int, warning: str) -> None:
        """The call's text up to `at` goes out as text of the mode the call began in; scanning resumes there."""
        events.append(ParseWarning(warning))
        self._emit(events, self._call_from, self._buf[:at])
        self._buf, self._mode = self._buf[at:], self._call_from

    def _find_tag(self) -> tuple[str, int, str]:
        """First tag of the current mode in the buffer: ("tag", at, tag), ("hold", at, "") when the
        buffer from `at` on could still become one, or ("none", len, "")."""
        buf = self._buf
        pos = 0
        while (at := buf.find("<", pos)) != -1:
            for tag in _TAGS[self._mode]:
                if tag == TOOL_CALL_OPEN and self._tools is None:
                    continue
                if buf.startswith(tag, at):
                    if tag == TOOL_CALL_OPEN and self._mode == _REASONING:
                        opens = starts_call(buf, at)
                        if opens is None:
                            return "hold", at, ""
                        if not opens:
                            break  # `<tool_call>` written in the reasoning, not a call: text
                    return "tag", at, tag
                if tag.startswith(buf[at:]):
                    return "hold", at, ""
            pos = at + 1
        return "none", len(buf), ""

    def _emit(self, events: list[Event], mode: str, text: str) -> None:
        text = self._channels[mode].push(text) if text else ""
        if not text:
            return
        cls = ReasoningDelta if mode == _REASONING else ContentDelta
        if events and type(events[-1]) is cls:
            events[-1] = cls(events[-1].text + text)  # one delta per kind and feed
        else:
            events.append(cls(text))


def _partial_tag(buf: str, tag: str) -> int:
    """The length of the longest end of `buf` that is a proper start of `tag` (0: none)."""
    for n in range(min(len(tag) - 1, len(buf)), 0, -1):
        if tag.startswith(buf[-n:]):
            return n
    return 0


def parse_complete(
    text: str,
    thinking: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
    make_call_id: Callable[[int], str] = random_call_id,
    prefix: str = "",
    continues: bool = False,
) -> ParsedOutput:
    """The non-streaming parse: the incremental parser fed the whole text at once."""
    parser = OutputParser(thinking=thinking, tools=tools, make_call_id=make_call_id, prefix=prefix, continues=continues)
    return accumulate(parser.feed(text) + parser.finish())
