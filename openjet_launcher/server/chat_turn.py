"""One chat turn on the worker, what every chat-shaped surface shares (chat completions, Anthropic
messages, OpenAI Responses): template messages -> prompt tokens (prompt-injection guard on), the job with
its token budget, and the model's text parsed into reasoning, content and whole tool calls as it comes.

Each surface maps its own request to template messages (OpenAI chat dicts) and the parsed events to its
own response shape; nothing here knows a wire format.

The answer may start in the prompt, which the model then continues (ChatTemplate.render_prompt's
`continue_final_message`): a prefill (the conversation ends with the start of the assistant's answer), and a
forced tool call (tool_choice naming a function, or requiring any): its opening in the model's call format
(tool_calls.call_opening) is written as the assistant's text, after a prefill's text if there is one. The
parser reads that opening before the model's output, so the call comes back whole; a prefill's text is not
repeated in the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from ..sampling import SamplingParams
from ..text.output import ContentDelta, OutputParser, ParseWarning, ReasoningDelta, ToolCallEvent, random_call_id
from ..text.reasoning import THINK_OPEN
from ..text.tool_calls import call_opening, index_tools
from .core import ServerCore
from .errors import APIError, EngineFailure, escape_for_log
from .protocol.openai import ForcedCall
from .worker import Failed, Finished, GenerationResult, Job, Started

log = logging.getLogger("openjet.server")

OutputEvent = ReasoningDelta | ContentDelta | ToolCallEvent


@dataclass
class ChatTurn:
    job: Job
    parser: OutputParser
    prompt_tokens: int
    one_call: bool = False  # the request asked for at most one tool call (parallel_tool_calls false): later ones go
    calls: int = 0


@dataclass(frozen=True)
class TurnPrompt:
    ids: list[int]
    thinking: bool          # the prompt opened a think block: the output starts as reasoning
    continues: bool         # the prompt ends in the answer's text (a prefill): the output goes on from it
    output_prefix: str      # the start of the output that the prompt wrote (a forced call's opening)


async def render_prompt(core: ServerCore, messages: Sequence[Mapping[str, Any]],
                        tools: Sequence[Mapping[str, Any]] | None, template_kwargs: Mapping[str, Any], *,
                        continue_final: bool = False, forced: ForcedCall | None = None) -> TurnPrompt:
    """The prompt of a turn: a new assistant answer, or the continuation of the last (assistant) message with
    `continue_final`; `forced` opens a tool call there (see the module docstring). A conversation the template
    rejects is a ChatTemplateError (400)."""
    if core.template is None:
        raise APIError(400, "this model file has no chat template: use /v1/completions")
    prefill = bool(continue_final and messages and messages[-1].get("content"))
    opening = ""
    if forced is not None:
        names = list(index_tools(tools or ()))
        opening = call_opening(forced.name if forced.name is not None or len(names) != 1 else names[0])
        messages = _open_call(messages, opening, continue_final)
        continue_final = True

    def render() -> TurnPrompt:
        rendered = core.template.render_prompt(messages, tools=tools, continue_final_message=continue_final,
                                               **template_kwargs)
        ids = core.tokenizer.encode(rendered.text, allow_special=True, literal_spans=rendered.literal_spans)
        return TurnPrompt(ids, thinking=rendered.text.rstrip().endswith(THINK_OPEN),
                          continues=prefill and not opening, output_prefix=opening)

    return await asyncio.to_thread(render)


def _open_call(messages: Sequence[Mapping[str, Any]], opening: str, after_last: bool) -> list[Mapping[str, Any]]:
    """The conversation with a call's opening as the assistant's text: after the last message's text (a blank
    line between, as the template writes text and calls), or as a new assistant message."""
    if not after_last:
        return [*messages, {"role": "assistant", "content": opening}]
    last = messages[-1]
    text = last.get("content") or ""
    return [*messages[:-1], {**last, "content": f"{text}\n\n{opening}" if text else opening}]


async def start_turn(core: ServerCore, messages: Sequence[Mapping[str, Any]], *,
                     tools: Sequence[Mapping[str, Any]] | None, template_kwargs: Mapping[str, Any],
                     params: SamplingParams, max_tokens: int | None, stops: list[str],
                     make_call_id: Callable[[int], str] = random_call_id, continue_final: bool = False,
                     forced: ForcedCall | None = None, prompt_param: str = "messages", one_call: bool = False
                     ) -> ChatTurn:
    """Render, check the context, queue the job. `tools` None turns tool-call parsing off; `prompt_param` is the
    request field a too-long prompt is reported on; `one_call`: at most one tool call is answered (the request
    asked no parallel calls: the model's later ones are left out, with a warning in the log)."""
    prompt = await render_prompt(core, messages, tools, template_kwargs, continue_final=continue_final,
                                 forced=forced)
    job = core.submit(prompt.ids, params, core.token_budget(len(prompt.ids), max_tokens, prompt_param), stops)
    parser = OutputParser(thinking=prompt.thinking, tools=tools, make_call_id=make_call_id,
                          prefix=prompt.output_prefix, continues=prompt.continues)
    return ChatTurn(job, parser, len(prompt.ids), one_call)


async def turn_events(core: ServerCore, turn: ChatTurn, request: Request | None = None, *, with_start: bool = False
                      ) -> AsyncIterator[OutputEvent | Started | Finished | Failed]:
    """The parsed output as it comes, then the worker's Finished or Failed; first the worker's Started when
    `with_start`. Parse warnings go to the log. With `request` (a non-streaming answer) a client that
    disconnects cancels the job; a stream that is closed early cancels it too."""
    source = core.collect(request, turn.job) if request is not None else core.events(turn.job, with_start)
    async with contextlib.aclosing(source) as events:
        async for event in events:
            if isinstance(event, Started):
                yield event
                continue
            if isinstance(event, Failed):
                yield event
                return
            parsed = turn.parser.finish() if isinstance(event, Finished) else turn.parser.feed(event.text)
            for e in parsed:
                if isinstance(e, ParseWarning):
                    log.warning("model output: %s", escape_for_log(e.message))
                elif isinstance(e, ToolCallEvent) and turn.one_call and turn.calls:
                    log.warning("model output: a further tool call (%s) left out: the request asked for at most one",
                                escape_for_log(e.call.name))
                else:
                    turn.calls += isinstance(e, ToolCallEvent)
                    yield e
            if isinstance(event, Finished):
                yield event
                return



async def complete_turn(core: ServerCore, turn: ChatTurn, request: Request,
                        add: Callable[[OutputEvent], object]) -> GenerationResult:
    """A non-streaming answer: each parsed event to `add`, then the result; an engine failure is its APIError."""
    async for event in turn_events(core, turn, request):
        if isinstance(event, Failed):
            raise EngineFailure(event.status, event.message)
        if isinstance(event, Finished):
            return event.result
        add(event)
    raise AssertionError("the worker's events ended without Finished or Failed")
