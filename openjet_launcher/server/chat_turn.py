"""One chat turn on the worker, what every chat-shaped surface shares (chat completions, Anthropic
messages, OpenAI Responses): template messages -> prompt tokens (prompt-injection guard on), the job with
its token budget, and the model's text parsed into reasoning, content and whole tool calls as it comes.

Each surface maps its own request to template messages (OpenAI chat dicts) and the parsed events to its
own response shape; nothing here knows a wire format.
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
from .core import ServerCore
from .errors import APIError, escape_for_log
from .worker import Failed, Finished, GenerationResult, Job

log = logging.getLogger("openjet.server")

OutputEvent = ReasoningDelta | ContentDelta | ToolCallEvent


@dataclass
class ChatTurn:
    job: Job
    parser: OutputParser
    prompt_tokens: int


async def render_prompt(core: ServerCore, messages: Sequence[Mapping[str, Any]],
                        tools: Sequence[Mapping[str, Any]] | None, template_kwargs: Mapping[str, Any]
                        ) -> tuple[list[int], bool]:
    """Prompt token ids, and whether the prompt opened a think block (the output starts as reasoning).
    A conversation the template rejects is a ChatTemplateError (400)."""
    if core.template is None:
        raise APIError(400, "this model file has no chat template: use /v1/completions")

    def render() -> tuple[list[int], bool]:
        rendered = core.template.render_prompt(messages, tools=tools, add_generation_prompt=True,
                                               **template_kwargs)
        ids = core.tokenizer.encode(rendered.text, allow_special=True, literal_spans=rendered.literal_spans)
        return ids, rendered.text.rstrip().endswith(THINK_OPEN)

    return await asyncio.to_thread(render)


async def start_turn(core: ServerCore, messages: Sequence[Mapping[str, Any]], *,
                     tools: Sequence[Mapping[str, Any]] | None, template_kwargs: Mapping[str, Any],
                     params: SamplingParams, max_tokens: int | None, stops: list[str],
                     make_call_id: Callable[[int], str] = random_call_id) -> ChatTurn:
    """Render, check the context, queue the job. `tools` None turns tool-call parsing off."""
    prompt, thinking = await render_prompt(core, messages, tools, template_kwargs)
    job = core.submit(prompt, params, core.token_budget(len(prompt), max_tokens), stops)
    return ChatTurn(job, OutputParser(thinking=thinking, tools=tools, make_call_id=make_call_id), len(prompt))


async def turn_events(core: ServerCore, turn: ChatTurn, request: Request | None = None
                      ) -> AsyncIterator[OutputEvent | Finished | Failed]:
    """The parsed output as it comes, then the worker's Finished or Failed. Parse warnings go to the log.
    With `request` (a non-streaming answer) a client that disconnects cancels the job; a stream that is
    closed early cancels it too."""
    source = core.collect(request, turn.job) if request is not None else core.events(turn.job)
    async with contextlib.aclosing(source) as events:
        async for event in events:
            if isinstance(event, Failed):
                yield event
                return
            parsed = turn.parser.finish() if isinstance(event, Finished) else turn.parser.feed(event.text)
            for e in parsed:
                if isinstance(e, ParseWarning):
                    log.warning("model output: %s", escape_for_log(e.message))
                else:
                    yield e
            if isinstance(event, Finished):
                yield event
                return



async def complete_turn(core: ServerCore, turn: ChatTurn, request: Request,
                        add: Callable[[OutputEvent], object]) -> GenerationResult:
    """A non-streaming answer: each parsed event to `add`, then the result; an engine failure is its APIError."""
    async for event in turn_events(core, turn, request):
        if isinstance(event, Failed):
            raise APIError(event.status, event.message)
        if isinstance(event, Finished):
            return event.result
        add(event)
    raise AssertionError("the worker's events ended without Finished or Failed")
