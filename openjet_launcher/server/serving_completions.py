"""`POST /v1/completions`: raw text (or token ids) in, text out; no template, no parsing. The caller owns
the whole prompt, so special-token texts in it become their ids (llama.cpp's default)."""

from __future__ import annotations

import asyncio
import time

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from .body import parse_request
from .core import ServerCore, new_id, sse, usage_of
from .errors import APIError, EngineFailure, error_body
from .protocol.openai import CompletionChoice, CompletionRequest, CompletionResponse, Usage
from .serving_chat import SSE_HEADERS
from .worker import Failed, Finished, TextDelta


async def create_completion(core: ServerCore, request: Request):
    s = core.settings
    req = await parse_request(request, CompletionRequest, s.max_body_bytes, s.max_json_depth)
    params = core.sampling_params(req)
    stops = core.stop_strings(req.stop)
    if isinstance(req.prompt, str):
        prompt = await asyncio.to_thread(core.tokenizer.encode, req.prompt, True)
    else:
        n = core.tokenizer.n_vocab
        bad = next((t for t in req.prompt if not 0 <= t < n), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is outside the vocabulary of {n} tokens", param="prompt")
        prompt = list(req.prompt)
    job = core.submit(prompt, params, core.token_budget(len(prompt), req.max_tokens, "prompt"), stops)
    ids = (new_id("cmpl"), int(time.time()), req.model or s.model_id)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(_stream(core, job, ids, include_usage), media_type="text/event-stream",
                                 headers=SSE_HEADERS)
    text, result = [], None
    async for event in core.collect(request, job):
        if isinstance(event, TextDelta):
            text.append(event.text)
        elif isinstance(event, Finished):
            result = event.result
        else:
            raise EngineFailure(event.status, event.message)
    cid, created, model = ids
    body = CompletionResponse(id=cid, created=created, model=model,
                              choices=[CompletionChoice(text="".join(text), finish_reason=_reason(result))],
                              usage=Usage(**usage_of(result)), timings=result.timings())
    return JSONResponse(body.model_dump(exclude_none=True))


def _reason(result) -> str:
    return "length" if result.finish_reason == "length" else "stop"


def _chunk(ids, text: str | None, finish_reason: str | None = None, **extra) -> dict:
    cid, created, model = ids
    out = {"id": cid, "object": "text_completion", "created": created, "model": model,
           "choices": [] if text is None else
           [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]}
    out.update(extra)
    return out


async def _stream(core: ServerCore, job, ids, include_usage: bool):
    async for event in core.events(job):
        if isinstance(event, TextDelta):
            yield sse(_chunk(ids, event.text))
        elif isinstance(event, Failed):
            yield sse(error_body(event.status, event.message))
            break
        else:
            result = event.result
            if result.finish_reason == "cancelled":
                return
            yield sse(_chunk(ids, "", _reason(result), timings=result.timings()))
            if include_usage:
                yield sse(_chunk(ids, None, usage=usage_of(result), timings=result.timings()))
    yield sse("[DONE]")
