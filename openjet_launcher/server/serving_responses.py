"""`POST /v1/responses`: OpenAI's Responses API (Codex's protocol) over the same chat turn as chat
completions (chat_turn.py). Nothing is stored: a `previous_response_id` is a 400 that says to send the
whole conversation.

Output items follow the parsed output in order: a new item whenever the kind changes (reasoning, message,
function_call). One `_Items` builder makes both the complete answer and the stream, so they always agree.
Stream: response.created, response.in_progress; per item output_item.added, then for reasoning and
messages content_part.added, *.delta..., *.done, content_part.done, and for calls
function_call_arguments.delta/.done; output_item.done; then response.completed (its status "incomplete"
when max_output_tokens ran out), or response.failed when the engine failed. Every event has a
sequence_number.
"""

from __future__ import annotations

import secrets
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..text.output import ReasoningDelta, ToolCallEvent
from .body import parse_request
from .chat_turn import OutputEvent, complete_turn, start_turn, turn_events
from .core import ServerCore, sse
from .errors import APIError
from .protocol.openai import SamplingFields
from .protocol.responses import (FunctionCallOut, InputTokensDetails, MessageItemOut, OutputText,
                                 OutputTokensDetails, ReasoningItemOut, ReasoningTextOut, ResponseObject,
                                 ResponsesRequest, ResponseUsage)
from .serving_chat import SSE_HEADERS
from .worker import Failed, Finished, GenerationResult


def register_responses(router: APIRouter, core: ServerCore) -> None:
    @router.post("/v1/responses")
    async def responses(request: Request):
        return await create_response(core, request)


def _id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


async def create_response(core: ServerCore, request: Request):
    s = core.settings
    req = await parse_request(request, ResponsesRequest, s.max_body_bytes, s.max_json_depth)
    if req.previous_response_id is not None:
        raise APIError(400, f"previous_response_id {req.previous_response_id!r} is unknown: this server keeps no "
                            f"responses (store=false semantics); send the whole conversation in `input`",
                       param="previous_response_id", code="previous_response_not_found")
    params = core.sampling_params(SamplingFields(temperature=req.temperature, top_p=req.top_p))
    tools = req.tools_for_template()
    turn = await start_turn(core, req.for_template(), tools=tools, template_kwargs=req.template_kwargs(),
                            params=params, max_tokens=req.max_output_tokens, stops=[], forced=req.forced_call(),
                            prompt_param="input", one_call=req.parallel_tool_calls is False)
    shell = ResponseObject(
        id=_id("resp_"), created_at=int(time.time()), status="in_progress", model=req.model or s.model_id,
        instructions=req.instructions, max_output_tokens=req.max_output_tokens,
        parallel_tool_calls=req.parallel_tool_calls is not False,
        reasoning={"effort": req.reasoning.effort, "summary": None} if req.reasoning else None,
        temperature=req.temperature, top_p=req.top_p, tool_choice=req.tool_choice or "auto",
        tools=[t.model_dump(exclude_none=True) for t in req.tools or ()], metadata=req.metadata or {})
    if req.stream:
        return StreamingResponse(_stream(core, turn, shell), media_type="text/event-stream", headers=SSE_HEADERS)

    items = _Items()
    result = await complete_turn(core, turn, request, items.add)
    items.finish(result)
    return JSONResponse(_final(core, shell, items, result).model_dump(exclude_none=True))


def _final(core: ServerCore, shell: ResponseObject, items: "_Items", result: GenerationResult) -> ResponseObject:
    incomplete = result.finish_reason == "length"
    reasoning = "\n".join(c.text for i in items.output if isinstance(i, ReasoningItemOut) for c in i.content)
    usage = ResponseUsage(
        input_tokens=result.prompt_tokens, input_tokens_details=InputTokensDetails(cached_tokens=result.reused_tokens,
                                                                                  cache_write_tokens=0),
        output_tokens=result.completion_tokens,
        # the parser splits text, not tokens: the reasoning's length re-tokenized, at most all the output
        output_tokens_details=OutputTokensDetails(
            reasoning_tokens=min(len(core.tokenizer.encode(reasoning)) if reasoning else 0, result.completion_tokens)),
        total_tokens=result.prompt_tokens + result.completion_tokens)
    return shell.model_copy(update={
        "status": "incomplete" if incomplete else "completed", "output": items.output, "usage": usage,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None, "timings": result.timings()})


class _Items:
    """Parser events -> output items, and the stream events that build them (payloads without
    sequence_number)."""

    def __init__(self) -> None:
        self.output: list[ReasoningItemOut | MessageItemOut | FunctionCallOut] = []
        self._open: str | None = None          # "reasoning" or "message" while such an item takes deltas

    def add(self, event: OutputEvent) -> list[dict]:
        if isinstance(event, ToolCallEvent):
            out = self._close("completed")
            call = event.call
            item = FunctionCallOut(id=_id("fc_"), call_id=call.id, name=call.name, arguments=call.arguments)
            index = self._start(item)
            where = {"item_id": item.id, "output_index": index}
            return out + [
                {"type": "response.output_item.added", "output_index": index,
                 "item": {**_dump(item), "arguments": "", "status": "in_progress"}},
                {"type": "response.function_call_arguments.delta", **where, "delta": call.arguments},
                {"type": "response.function_call_arguments.done", **where, "arguments": call.arguments,
                 "name": call.name},
                {"type": "response.output_item.done", "output_index": index, "item": _dump(item)}]
        kind = "reasoning" if isinstance(event, ReasoningDelta) else "message"
        out = []
        if self._open != kind:
            out = self._close("completed")
            if kind == "reasoning":
                item = ReasoningItemOut(id=_id("rs_"), content=[ReasoningTextOut(text="")], status="in_progress")
            else:
                item = MessageItemOut(id=_id("msg_"), content=[OutputText(text="")], status="in_progress")
            index = self._start(item)
            self._open = kind
            out += [{"type": "response.output_item.added", "output_index": index,
                     "item": {**_dump(item), "content": []}},
                    {"type": "response.content_part.added", **self._where(), "part": _dump(item.content[0])}]
        part = self.output[-1].content[0]
        part.text += event.text
        delta = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        return out + [{"type": delta, **self._where(), "delta": event.text, **extra}]

    def finish(self, result: GenerationResult) -> list[dict]:
        return self._close("incomplete" if result.finish_reason == "length" else "completed")

    def _start(self, item) -> int:
        self.output.append(item)
        return len(self.output) - 1

    def _where(self) -> dict:
        return {"item_id": self.output[-1].id, "output_index": len(self.output) - 1, "content_index": 0}

    def _close(self, status: str) -> list[dict]:
        if self._open is None:
            return []
        item = self.output[-1]
        item.status = status
        part = item.content[0]
        done = ({"type": "response.reasoning_text.done", **self._where(), "text": part.text}
                if self._open == "reasoning" else
                {"type": "response.output_text.done", **self._where(), "text": part.text, "logprobs": []})
        self._open = None
        return [done, {"type": "response.content_part.done", **self._where(), "part": _dump(part)},
                {"type": "response.output_item.done", "output_index": len(self.output) - 1, "item": _dump(item)}]


def _dump(model) -> dict:
    return model.model_dump(exclude_none=True)


async def _stream(core: ServerCore, turn, shell: ResponseObject):
    seq = 0

    def event(payload: dict) -> str:
        nonlocal seq
        payload = {**payload, "sequence_number": seq}
        seq += 1
        return f"event: {payload['type']}\n" + sse(payload)

    yield event({"type": "response.created", "response": _dump(shell)})
    yield event({"type": "response.in_progress", "response": _dump(shell)})
    items = _Items()
    async for ev in turn_events(core, turn):
        if isinstance(ev, Failed):
            failed = shell.model_copy(update={"status": "failed", "output": items.output,
                                              "error": {"code": "server_error", "message": ev.message}})
            yield event({"type": "response.failed", "response": _dump(failed)})
            return
        if not isinstance(ev, Finished):
            for payload in items.add(ev):
                yield event(payload)
            continue
        result = ev.result
        if result.finish_reason == "cancelled":      # nobody is reading
            return
        for payload in items.finish(result):
            yield event(payload)
        # Always response.completed, its status "incomplete" when max_output_tokens ran out: the SDK's stream
        # helper and vLLM/llama.cpp end that way (OpenAI's own service sends response.incomplete).
        yield event({"type": "response.completed", "response": _dump(_final(core, shell, items, result))})

