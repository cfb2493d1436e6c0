"""What every API surface shares: the loaded pieces, request -> sampling parameters and token budget,
and running a job on the worker from the event loop (with cancellation when the client goes away)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request
from gguf import TokenType

from ..sampling import SamplingParams
from ..text.chat import ChatTemplate
from ..text.tokenizer import Tokenizer
from .errors import APIError
from .metrics import Metrics
from .protocol.openai import SamplingFields
from .settings import ServerSettings
from .worker import Channel, EngineWorker, Event, Failed, Finished, Job, Started


def n_valid_tokens(tokenizer: Tokenizer) -> int:
    """Ids at or past this are padding rows (UNUSED) the sampler never produces."""
    for i in range(tokenizer.n_vocab - 1, -1, -1):
        if tokenizer.token_type(i) != TokenType.UNUSED:
            return i + 1
    return tokenizer.n_vocab


@dataclass
class ServerCore:
    worker: EngineWorker
    tokenizer: Tokenizer
    template: ChatTemplate | None
    settings: ServerSettings
    metrics: Metrics
    created: int = field(default_factory=lambda: int(time.time()))

    # ------------------------------------------------------------------------------ request -> job

    def sampling_params(self, req: SamplingFields) -> SamplingParams:
        params = SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            # Unset top_k on an engine that samples from the top k logits means that k, not "off".
            top_k=(self.settings.max_top_k or 0) if req.top_k is None else req.top_k,
            top_p=1.0 if req.top_p is None else req.top_p,
            min_p=req.min_p or 0.0,
            seed=req.seed,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
        )
        return params.validate(self.settings.max_top_k)    # SamplingError -> 400

    def stop_strings(self, stops: list[str] | None) -> list[str]:
        stops = list(stops or [])
        s = self.settings
        if len(stops) > s.max_stop_strings:
            raise APIError(400, f"at most {s.max_stop_strings} stop strings, got {len(stops)}", param="stop")
        if any(len(x) > s.max_stop_chars for x in stops):
            raise APIError(400, f"a stop string is longer than {s.max_stop_chars} characters", param="stop")
        return stops

    def token_budget(self, n_prompt: int, requested: int | None, prompt_param: str = "messages") -> int:
        """Tokens the request may generate; a prompt that leaves no room in the context is a 400 about the
        request's field `prompt_param`."""
        n_ctx = self.settings.n_ctx
        if n_prompt == 0:
            raise APIError(400, "the prompt is empty")
        if n_prompt >= n_ctx:
            # (worded as Anthropic's own: clients recognise an overflow by "prompt is too long", OpenAI's by the code)
            raise APIError(400, f"prompt is too long: {n_prompt} tokens > {n_ctx - 1} maximum (the context holds "
                                f"{n_ctx} tokens, prompt and output together); shorten the conversation or serve with "
                                f"a larger --ctx", code="context_length_exceeded", param=prompt_param)
        room = n_ctx - n_prompt
        ceiling = self.settings.max_tokens_ceiling
        return min(requested or ceiling, ceiling, room)

    # ------------------------------------------------------------------------------ running

    def submit(self, prompt: list[int], params: SamplingParams, max_tokens: int, stops: list[str]) -> Job:
        loop = asyncio.get_running_loop()
        s = self.settings
        job = Job(prompt, params, max_tokens, Channel(loop, s.max_pending_events, s.stall_timeout_s), stops)
        self.worker.submit(job)
        return job

    async def events(self, job: Job, with_start: bool = False) -> AsyncIterator[Event]:
        """The job's events until Finished or Failed (Started too when `with_start`); leaving early (the client
        went away, the stream was closed) cancels the job."""
        try:
            while True:
                event = await job.channel.get()
                if isinstance(event, Started) and not with_start:
                    continue
                yield event
                if isinstance(event, (Finished, Failed)):
                    return
        finally:
            job.cancel("client disconnected")

    async def collect(self, request: Request, job: Job) -> AsyncIterator[Event]:
        """`events` for a non-streaming answer: a disconnect while generating cancels the job."""
        async def watch() -> None:
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    job.cancel("client disconnected")
                    return

        watcher = asyncio.create_task(watch())
        try:
            async for event in self.events(job):
                yield event
        finally:
            watcher.cancel()


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage_of(result) -> dict:
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": result.reused_tokens}}


def sse(payload: dict | str) -> str:
    import json
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n"
