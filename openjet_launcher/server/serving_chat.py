"""`POST /v1/chat/completions`: render the conversation with the GGUF's template (prompt-injection
guard on), run it on the worker, parse reasoning and tool calls from the text, answer as one JSON
object or as SSE chunks."""

from __future__ import annotations

import time

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..text.output import ContentDelta, ParsedOutput, ReasoningDelta, ToolCallEvent
from .body import parse_request
from .chat_turn import ChatTurn, complete_turn, start_turn, turn_events
from .core import ServerCore, new_id, sse, usage_of
from .errors import error_body
from .protocol.openai import (AssistantMessage, ChatChoice, ChatCompletionRequest, ChatCompletionResponse,
                              ToolCallFunction, ToolCallOut, Usage, template_kwargs)
from .worker import Failed, Finished

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _finish_reason(finish: str, n_calls: int) -> str:
    if finish == "stop" and n_calls:
        return "tool_calls"
    return "length" if finish == "length" else "stop"


async def create_chat_completion(core: ServerCore, request: Request):
    s = core.settings
    req = await parse_request(request, ChatCompletionRequest, s.max_body_bytes, s.max_json_depth)
    turn = await start_turn(core, req.messages_for_template(), tools=req.tools_for_template(),
                            template_kwargs=template_kwargs(req.chat_template_kwargs, req.reasoning_effort),
                            params=core.sampling_params(req), max_tokens=req.max_completion_tokens or req.max_tokens,
                            stops=core.stop_strings(req.stop), continue_final=req.continue_final_message,
                            forced=req.forced_call(), one_call=req.parallel_tool_calls is False)
    ids = (new_id("chatcmpl"), int(time.time()), req.model or s.model_id)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(_stream(core, turn, ids, include_usage), media_type="text/event-stream",
                                 headers=SSE_HEADERS)
    return await _complete(core, request, turn, ids)


async def _complete(core: ServerCore, request: Request, turn: ChatTurn, ids) -> JSONResponse:
    parsed = ParsedOutput()
    result = await complete_turn(core, turn, request, parsed.add)
    chat_id, created, model = ids
    calls = [ToolCallOut(id=c.id, function=ToolCallFunction(name=c.name, arguments=c.arguments))
             for c in parsed.tool_calls]
    message = AssistantMessage(content=parsed.content or (None if calls else ""),
                               reasoning_content=parsed.reasoning or None, tool_calls=calls or None)
    body = ChatCompletionResponse(
        id=chat_id, created=created, model=model,
        choices=[ChatChoice(message=message, finish_reason=_finish_reason(result.finish_reason, len(calls)))],
        usage=Usage(**usage_of(result)), timings=result.timings())
    return JSONResponse(body.model_dump(exclude_none=True))


def _chunk(ids, delta: dict | None, finish_reason: str | None = None, **extra) -> dict:
    chat_id, created, model = ids
    out = {"id": chat_id, "object": "chat.completion.chunk", "created": created, "model": model,
           "choices": [] if delta is None else
           [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
    out.update(extra)
    return out


async def _stream(core: ServerCore, turn: ChatTurn, ids, include_usage: bool):
    n_calls = 0
    yield sse(_chunk(ids, {"role": "assistant", "content": ""}))
    async for event in turn_events(core, turn):
        if isinstance(event, Failed):
            yield sse(error_body(event.status, event.message))
            break
        if isinstance(event, Finished):
            finish = event.result
            if finish.finish_reason == "cancelled":   # nobody is reading
                return
            yield sse(_chunk(ids, {}, _finish_reason(finish.finish_reason, n_calls), timings=finish.timings()))
            if include_usage:
                yield sse(_chunk(ids, None, usage=usage_of(finish), timings=finish.timings()))
            continue
        n_calls += isinstance(event, ToolCallEvent)
        yield sse(_chunk(ids, _delta(event)))
    yield sse("[DONE]")


def _delta(event) -> dict:
    if isinstance(event, ReasoningDelta):
        return {"reasoning_content": event.text}
    if isinstance(event, ContentDelta):
        return {"content": event.text}
    return {"tool_calls": [event.to_openai_delta()]}
