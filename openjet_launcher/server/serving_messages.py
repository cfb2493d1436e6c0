"""`POST /v1/messages` and `/v1/messages/count_tokens`: Anthropic's Messages API over the same chat turn
as chat completions (chat_turn.py); errors come out in Anthropic's shape (errors.py re-shapes them on
these paths).

Content blocks follow the parsed output in order: a new block whenever the kind changes (thinking, text,
tool_use). Thinking blocks only where the request enabled thinking, as Anthropic's API returns them: without a
`thinking` field the model still thinks (its template's default) but the answer holds its text and calls alone, so a
client that reads `content[0].text` finds the text there. One `_Blocks` builder makes both the complete answer and the stream, so they always agree.
Stream: message_start, ping, then per block content_block_start / _delta (thinking_delta, text_delta,
input_json_delta) / _stop, then message_delta (stop_reason, usage) and message_stop.
"""

from __future__ import annotations

import json
import secrets

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..text.output import ReasoningDelta, ToolCallEvent
from .body import parse_request
from .chat_turn import ChatTurn, OutputEvent, complete_turn, render_prompt, start_turn, turn_events
from .core import ServerCore, sse
from .errors import anthropic_error_body
from .protocol.anthropic import (CountTokensRequest, CountTokensResponse, MessageResponse, MessagesRequest,
                                 TextBlock, ThinkingBlock, ToolUseBlock, Usage)
from .protocol.openai import SamplingFields
from .serving_chat import SSE_HEADERS
from .worker import Failed, Finished, GenerationResult, Started


def register_messages(router: APIRouter, core: ServerCore) -> None:
    @router.post("/v1/messages")
    async def messages(request: Request):
        return await create_message(core, request)

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        return await count_message_tokens(core, request)


def _id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def _stop_reason(result: GenerationResult, n_tool_uses: int) -> str:
    if result.finish_reason == "length":
        return "max_tokens"
    if result.stop_string is not None:
        return "stop_sequence"
    return "tool_use" if n_tool_uses else "end_turn"


def _usage(result: GenerationResult) -> Usage:
    return Usage(input_tokens=result.prefilled_tokens, output_tokens=result.completion_tokens,
                 cache_read_input_tokens=result.reused_tokens)


def _start_usage(turn: ChatTurn, started: Started) -> Usage:
    """message_start's usage: the final usage's split of the prompt (prefilled, reused), no output yet."""
    return Usage(input_tokens=turn.prompt_tokens - started.reused_tokens, output_tokens=0,
                 cache_read_input_tokens=started.reused_tokens)


async def count_message_tokens(core: ServerCore, request: Request) -> dict:
    s = core.settings
    req = await parse_request(request, CountTokensRequest, s.max_body_bytes, s.max_json_depth)
    prompt = await render_prompt(core, req.for_template(), req.tools_for_template(), req.template_kwargs(),
                                 continue_final=req.continues_answer(), forced=req.forced_call())
    return CountTokensResponse(input_tokens=len(prompt.ids)).model_dump()


async def create_message(core: ServerCore, request: Request):
    s = core.settings
    req = await parse_request(request, MessagesRequest, s.max_body_bytes, s.max_json_depth)
    params = core.sampling_params(SamplingFields(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k))
    turn = await start_turn(core, req.for_template(), tools=req.tools_for_template(),
                            template_kwargs=req.template_kwargs(), params=params, max_tokens=req.max_tokens,
                            stops=core.stop_strings(req.stop_sequences), make_call_id=lambda i: _id("toolu_"),
                            continue_final=req.continues_answer(), forced=req.forced_call(),
                            one_call=bool(req.tool_choice and req.tool_choice.disable_parallel_tool_use))
    message = {"id": _id("msg_"), "model": req.model}
    show_thinking = req.thinking is not None and req.thinking.type != "disabled"
    if req.stream:
        return StreamingResponse(_stream(core, turn, message, show_thinking), media_type="text/event-stream",
                                 headers=SSE_HEADERS)

    blocks = _Blocks(show_thinking)
    result = await complete_turn(core, turn, request, blocks.add)
    blocks.finish()
    body = MessageResponse(**message, content=blocks.content, stop_reason=_stop_reason(result, blocks.n_tool_uses),
                           stop_sequence=result.stop_string, usage=_usage(result), timings=result.timings())
    return JSONResponse(body.model_dump())


class _Blocks:
    """Parser events -> content blocks, and the stream events that build them (name, payload)."""

    def __init__(self, show_thinking: bool = True) -> None:
        self.show_thinking = show_thinking     # False: reasoning left out (the request did not enable thinking)
        self.content: list[TextBlock | ThinkingBlock | ToolUseBlock] = []
        self.n_tool_uses = 0
        self._open: str | None = None          # "thinking" or "text" while such a block takes deltas

    def add(self, event: OutputEvent) -> list[tuple[str, dict]]:
        if isinstance(event, ToolCallEvent):
            out = self._close()
            call = event.call
            block = ToolUseBlock(id=call.id, name=call.name, input=json.loads(call.arguments))
            index = self._start(block)
            self.n_tool_uses += 1
            return out + [
                ("content_block_start", {"type": "content_block_start", "index": index,
                                         "content_block": {**block.model_dump(), "input": {}}}),
                ("content_block_delta", {"type": "content_block_delta", "index": index,
                                         "delta": {"type": "input_json_delta", "partial_json": call.arguments}}),
                ("content_block_stop", {"type": "content_block_stop", "index": index})]
        kind = "thinking" if isinstance(event, ReasoningDelta) else "text"
        if kind == "thinking" and not self.show_thinking:
            return []
        out = []
        if self._open != kind:
            out = self._close()
            block = ThinkingBlock(thinking="") if kind == "thinking" else TextBlock(text="")
            index = self._start(block)
            self._open = kind
            out.append(("content_block_start", {"type": "content_block_start", "index": index,
                                                "content_block": block.model_dump()}))
        block = self.content[-1]
        if kind == "thinking":
            block.thinking += event.text
            delta = {"type": "thinking_delta", "thinking": event.text}
        else:
            block.text += event.text
            delta = {"type": "text_delta", "text": event.text}
        out.append(("content_block_delta", {"type": "content_block_delta", "index": len(self.content) - 1,
                                            "delta": delta}))
        return out

    def finish(self) -> list[tuple[str, dict]]:
        return self._close()

    def _start(self, block) -> int:
        self.content.append(block)
        return len(self.content) - 1

    def _close(self) -> list[tuple[str, dict]]:
        if self._open is None:
            return []
        self._open = None
        return [("content_block_stop", {"type": "content_block_stop", "index": len(self.content) - 1})]


def _event(name: str, payload: dict) -> str:
    return f"event: {name}\n" + sse(payload)


async def _stream(core: ServerCore, turn: ChatTurn, message: dict, show_thinking: bool):
    # message_start's usage splits the prompt into prefilled and reused tokens as the final usage does; the split is
    # known once the worker has matched the prompt against its cache (Started), before the prefill. So message_start
    # waits for the queue, never for the prefill; the response's headers go out at once.
    blocks = _Blocks(show_thinking)
    async for event in turn_events(core, turn, with_start=True):
        if isinstance(event, Started):
            start = MessageResponse(**message, content=[], stop_reason=None, usage=_start_usage(turn, event))
            start = start.model_dump(exclude={"timings"})           # known at the end: message_stop carries them
            yield _event("message_start", {"type": "message_start", "message": start})
            yield _event("ping", {"type": "ping"})
            continue
        if isinstance(event, Failed):
            yield _event("error", anthropic_error_body(event.status, event.message))
            return
        if not isinstance(event, Finished):
            for name, payload in blocks.add(event):
                yield _event(name, payload)
            continue
        result = event.result
        if result.finish_reason == "cancelled":      # nobody is reading
            return
        for name, payload in blocks.finish():
            yield _event(name, payload)
        delta = {"stop_reason": _stop_reason(result, blocks.n_tool_uses), "stop_sequence": result.stop_string}
        yield _event("message_delta", {"type": "message_delta", "delta": delta, "usage": _usage(result).model_dump()})
        yield _event("message_stop", {"type": "message_stop", "timings": result.timings()})

