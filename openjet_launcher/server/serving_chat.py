"""`POST /v1/chat/completions`: render the conversation with the GGUF's template (prompt-injection
guard on), run it on the worker, parse reasoning and tool calls from the text, answer as one JSON
object or as SSE chunks."""

from __future__ import annotations

import asyncio
import logging
import time

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..text.output import (ContentDelta, OutputParser, ParsedOutput, ParseWarning, ReasoningDelta,
                           ToolCallEvent)
from ..text.reasoning import THINK_OPEN
from .body import parse_request
from .core import ServerCore, new_id, sse, usage_of
from .errors import APIError, error_body, escape_for_log
from .protocol.openai import (AssistantMessage, ChatChoice, ChatCompletionRequest, ChatCompletionResponse,
                              ToolCallFunction, ToolCallOut, Usage)
from .worker import Failed, Finished, TextDelta

log = logging.getLogger("openjet.server")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _template_kwargs(req: ChatCompletionRequest) -> dict:
    kwargs = req.chat_template_kwargs.model_dump(exclude_none=True) if req.chat_template_kwargs else {}
    if req.reasoning_effort is not None:
        kwargs.setdefault("reasoning_effort", req.reasoning_effort)
    return kwargs


def _finish_reason(finish: str, n_calls: int) -> str:
    if finish == "stop" and n_calls:
        return "tool_calls"
    return "length" if finish == "length" else "stop"


def _log_warnings(events) -> None:
    for e in events:
        if isinstance(e, ParseWarning):
            log.warning("model output: %s", escape_for_log(e.message))


async def create_chat_completion(core: ServerCore, request: Request):
    s = core.settings
    req = await parse_request(request, ChatCompletionRequest, s.max_body_bytes, s.max_json_depth)
    if core.template is None:
        raise APIError(400, "this model file has no chat template: use /v1/completions")
    tools = [t.for_template() for t in req.tools] if req.tools and req.tool_choice != "none" else None
    messages = [m.for_template() for m in req.messages]
    params = core.sampling_params(req)
    stops = core.stop_strings(req.stop)

    def render() -> tuple[list[int], bool]:
        rendered = core.template.render_prompt(messages, tools=tools, add_generation_prompt=True,
                                               **_template_kwargs(req))
        ids = core.tokenizer.encode(rendered.text, allow_special=True, literal_spans=rendered.literal_spans)
        return ids, rendered.text.rstrip().endswith(THINK_OPEN)

    prompt, thinking = await asyncio.to_thread(render)     # ChatTemplateError -> 400
    max_tokens = core.token_budget(len(prompt), req.max_completion_tokens or req.max_tokens)
    job = core.submit(prompt, params, max_tokens, stops)
    parser = OutputParser(thinking=thinking, tools=tools)
    ids = (new_id("chatcmpl"), int(time.time()), req.model or s.model_id)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(_stream(core, job, parser, ids, include_usage), media_type="text/event-stream",
                                 headers=SSE_HEADERS)
    return await _complete(core, request, job, parser, ids)


async def _complete(core: ServerCore, request: Request, job, parser: OutputParser, ids) -> JSONResponse:
    parsed = ParsedOutput()
    result = None
    async for event in core.collect(request, job):
        if isinstance(event, TextDelta):
            events = parser.feed(event.text)
        elif isinstance(event, Finished):
            events, result = parser.finish(), event.result
        else:
            raise APIError(event.status, event.message)
        _log_warnings(events)
        for e in events:
            parsed.add(e)
    assert result is not None
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


def _deltas(events) -> list[dict]:
    out = []
    for e in events:
        if isinstance(e, ReasoningDelta):
            out.append({"reasoning_content": e.text})
        elif isinstance(e, ContentDelta):
            out.append({"content": e.text})
        elif isinstance(e, ToolCallEvent):
            out.append({"tool_calls": [e.to_openai_delta()]})
    return out


async def _stream(core: ServerCore, job, parser: OutputParser, ids, include_usage: bool):
    n_calls = 0
    yield sse(_chunk(ids, {"role": "assistant", "content": ""}))
    async for event in core.events(job):
        if isinstance(event, Failed):
            yield sse(error_body(event.status, event.message))
            break
        finish = event.result if isinstance(event, Finished) else None
        events = parser.finish() if finish else parser.feed(event.text)
        _log_warnings(events)
        for delta in _deltas(events):
            n_calls += "tool_calls" in delta
            yield sse(_chunk(ids, delta))
        if finish:
            if finish.finish_reason == "cancelled":   # nobody is reading
                return
            yield sse(_chunk(ids, {}, _finish_reason(finish.finish_reason, n_calls), timings=finish.timings()))
            if include_usage:
                yield sse(_chunk(ids, None, usage=usage_of(finish), timings=finish.timings()))
    yield sse("[DONE]")
