"""The engine worker: one thread owns the engine and its sequence state; requests queue for it.

Design note.
* Threads: the engine's calls block for milliseconds to seconds, so they never run on the event loop.
  `EngineWorker` takes `Job`s from a queue and runs them one at a time on its `Slot`s (one today; the
  engine can hold several states, and a batched engine would step several slots per weight read).
* Worker -> asyncio: each job has a `Channel`: the worker puts events (Started once the prompt is matched
  against the state, text deltas, then one Finished or Failed) with `loop.call_soon_threadsafe`; the handler
  awaits them. At most `max_pending` events wait unread: past that the worker waits for the reader, and a
  reader that takes nothing for `stall_timeout_s` counts as gone (the job is cancelled and the engine freed).
* Cancellation: the handler sets `job.cancelled` when the client disconnects; the worker checks it
  between tokens and stops there, leaving a consistent state.
* Text: the worker detokenizes (holding back incomplete UTF-8) and applies stop strings (holding back
  a possible start of one), so it stops decoding at the token that completes a stop string and the
  events carry only text that will never be taken back. Parsing reasoning and tool calls is the
  handler's business.
* Conversation reuse (`Slot.load_prompt`): the new prompt is matched against the state's tokens (the
  previous prompt + the tokens emitted since); the state is cut back with `engine.truncate` to the latest
  checkpoint at or before the end of the common prefix, and everything after it is prefilled in one call (the
  reused count is that checkpoint's position: the tokens not run again). A checkpoint is
  recorded before the last token of every prompt, so a repeated prompt (a regenerated answer) or a
  conversation whose re-rendered history diverges after the previous prompt rewinds cheaply; a divergence before any checkpoint starts over. A failed
  request resets the state: a half-updated cache never serves the next request. An engine whose prefill does not
  leave decode's bits (`Engine.prefill_matches_decode`) keeps no more than the previous prompt: the tokens decoded
  after it are prefilled again, so the next answer is the one a fresh prefill of the conversation gives.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..draft_depth import DraftDepth
from ..engine.interface import Engine, SequenceState
from ..errors import OpenJetError
from ..sampling import Sampler, SamplingParams
from ..speculative import can_speculate, draft_limit, plain_step, speculative_cycle
from ..text.tokenizer import StreamingDetokenizer, Tokenizer
from .errors import APIError, escape_for_log
from .metrics import Metrics
from .stops import StopStringMatcher

log = logging.getLogger("openjet.server")


# ------------------------------------------------------------------------------------------- results

@dataclass
class GenerationResult:
    prompt_tokens: int                   # the whole prompt
    reused_tokens: int = 0               # kept from the state (not prefilled)
    completion_tokens: int = 0           # tokens generated, an end-of-generation token included
    finish_reason: str = "length"        # "stop" (EOG token or stop string), "length", "cancelled"
    stop_string: str | None = None       # the stop string that ended the output, if one did
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0

    @property
    def prefilled_tokens(self) -> int:
        return self.prompt_tokens - self.reused_tokens

    def timings(self) -> dict[str, float]:
        """llama.cpp's `timings` names, plus ours for reuse and drafts."""
        p, d = self.prefill_seconds, self.decode_seconds
        return {
            "prompt_n": self.prefilled_tokens,
            "prompt_ms": p * 1e3,
            "prompt_per_second": self.prefilled_tokens / p if p > 0 else 0.0,
            "predicted_n": self.completion_tokens,
            "predicted_ms": d * 1e3,
            "predicted_per_second": self.completion_tokens / d if d > 0 else 0.0,
            "cache_n": self.reused_tokens,
            "draft_n": self.drafted,
            "draft_n_accepted": self.accepted,
        }


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class Started:
    """The worker took the job and matched its prompt against the state: `reused_tokens` are kept, the rest is
    prefilled next."""
    reused_tokens: int


@dataclass(frozen=True)
class Finished:
    result: GenerationResult


@dataclass(frozen=True)
class Failed:
    message: str
    status: int = 500


Event = TextDelta | Started | Finished | Failed


# ------------------------------------------------------------------------------------------- channel

class Channel:
    """Worker thread -> event loop, with a bound on unread events (see the design note)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_pending: int, stall_timeout_s: float):
        self._loop = loop
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self._pending = 0
        self._cond = threading.Condition()
        self.max_pending = max_pending
        self.stall_timeout_s = stall_timeout_s

    def put(self, event: Event, cancelled: threading.Event | None = None, force: bool = False) -> bool:
        """From the worker. False when the reader stalled (nothing taken for stall_timeout_s), was
        cancelled meanwhile, or the loop is gone."""
        with self._cond:
            if not force:
                deadline = time.monotonic() + self.stall_timeout_s
                while self._pending >= self.max_pending:
                    if cancelled is not None and cancelled.is_set():
                        return False
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(min(left, 0.05))
            self._pending += 1
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the event loop closed
            return False
        return True

    async def get(self) -> Event:
        event = await self._queue.get()
        with self._cond:
            self._pending -= 1
            self._cond.notify_all()
        return event


STALLED = "stream reader stalled"  # Job.cancel_reason when the reader took nothing for stall_timeout_s


@dataclass
class Job:
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    channel: Channel
    stops: Sequence[str] = ()
    cancelled: threading.Event = field(default_factory=threading.Event)
    cancel_reason: str = ""

    def cancel(self, reason: str) -> None:
        if not self.cancelled.is_set():
            self.cancel_reason = reason
            self.cancelled.set()


# ---------------------------------------------------------------------------------------------- slot

def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.nonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))[0]
    return int(diff[0]) if len(diff) else n


class Slot:
    """One sequence state and the conversation-reuse policy over it."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.state: SequenceState = engine.new_state()
        self.prompt_end = 0  # tokens of the state that prefill wrote (the last prompt); decode wrote the rest

    def reset(self) -> None:
        self.state = self.engine.new_state()
        self.prompt_end = 0

    def load_prompt(self, prompt: Sequence[int], matched: Callable[[int], object] = lambda reused: None
                    ) -> tuple[np.ndarray, int]:
        """Bring the state to exactly `prompt`, prefilling only what it lacks. Returns the last prompt
        token's logits and the number of tokens reused, which `matched` hears before the prefill."""
        state = self.state
        # At least the last prompt token is run again: its logits are not kept.
        common = min(common_prefix(state.tokens, prompt), len(prompt) - 1)
        if not self.engine.prefill_matches_decode:  # decoded tokens are prefilled again (see the design note)
            common = min(common, self.prompt_end)
        if common < state.n_tokens:
            # Rewind to the latest checkpoint at or before the common prefix and prefill everything after it in
            # one call below: what a truncate to `common` would replay, without a separate (short) replay call.
            common = max((p for p in state.checkpoint_positions if p <= common), default=0)
            if common:
                self.engine.truncate(state, common)
            else:                                  # nothing to rewind to: start over
                self.reset()
                state = self.state
        matched(common)
        # A checkpoint before the last prompt token: the next request may repeat this prompt (a regenerated
        # answer) or diverge anywhere after it (a re-rendered history), and both rewind to there.
        rest = list(prompt[common:])
        g = self.engine.prefill_checkpoint_stride
        if g:
            # Calls start on multiples of g and the prefill checkpoints the last one it passes: the prompt in one
            # call (a checkpoint of ours before its last token would be dropped by the rewind to that chunk's start,
            # and those tokens prefilled twice), split only where it ends on a multiple of g (the call would then
            # leave none before the end).
            f = (len(prompt) - 1) // g * g
            if len(prompt) % g == 0 and f > common:
                self.engine.prefill(state, rest[:f - common])
                rest = rest[f - common:]
                if state.n_tokens not in state.checkpoint_positions:
                    self.engine.checkpoint(state)
        else:
            if len(rest) > 1:
                self.engine.prefill(state, rest[:-1])
                rest = rest[-1:]
            if state.n_tokens not in state.checkpoint_positions:
                self.engine.checkpoint(state)
        logits = self.engine.prefill(state, rest).logits[-1]
        self.prompt_end = len(prompt)
        return logits, common


# -------------------------------------------------------------------------------------------- worker

class EngineWorker:
    """Owns the engine (or its loader) on one thread; see the module's design note."""

    def __init__(self, engine: Engine | Callable[[], Engine], tokenizer: Tokenizer, *, n_valid: int,
                 n_ctx: int, n_draft: int = 0, max_queue: int = 64, metrics: Metrics | None = None,
                 on_load_failed: Callable[[str], None] | None = None):
        self._engine_or_loader = engine
        self.on_load_failed = on_load_failed  # `serve` ends the process: a failed load (or a broken engine) never
                                              # gets better
        self.engine: Engine | None = None
        self.tokenizer = tokenizer
        self.n_valid = n_valid
        self.n_ctx = n_ctx
        self.n_draft = n_draft
        self.max_queue = max_queue
        self.metrics = metrics or Metrics()
        self.slots: list[Slot] = []
        self.ready = threading.Event()
        self.load_error: str | None = None
        self.engine_error: str | None = None  # the engine broke while serving (a failed reset): it serves no more
        self.busy = 0
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="openjet-engine", daemon=True)

    # -------------------------------------------------------------------------------- control

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._jobs.put(None)
        self._thread.join(timeout)

    @property
    def queue_depth(self) -> int:
        """Jobs waiting for the engine whose clients are still there: one that left stays in the queue until the
        next submit drops it or the worker reaches it, but waits for nothing and must not fill the queue's limit."""
        with self._jobs.mutex:
            return sum(1 for job in self._jobs.queue if job is not None and not job.cancelled.is_set())

    def _drop_cancelled(self) -> int:
        """Jobs whose clients left while queued go now, not when the worker reaches them: else a client that sends
        and disconnects again and again grows the queue past max_queue (each job holding its prompt). Returns the
        jobs left waiting."""
        with self._jobs.mutex:
            live = [job for job in self._jobs.queue if job is None or not job.cancelled.is_set()]
            dropped = len(self._jobs.queue) - len(live)
            if dropped:
                self._jobs.queue.clear()
                self._jobs.queue.extend(live)
        if dropped:
            self.metrics.add(requests_cancelled_total=dropped)
        return sum(job is not None for job in live)

    def submit(self, job: Job) -> None:
        if self.load_error:
            raise APIError(503, f"the model failed to load: {self.load_error}")
        if self.engine_error:
            raise APIError(503, f"the engine failed and cannot serve: {self.engine_error}; restart the server")
        if not self.ready.is_set():
            raise APIError(503, "the model is still loading")
        if self._drop_cancelled() >= self.max_queue:
            raise APIError(503, f"{self.max_queue} requests are already waiting for the engine; retry later",
                           code="queue_full")
        self._jobs.put(job)

    # -------------------------------------------------------------------------------- thread

    def _run(self) -> None:
        try:
            engine = self._engine_or_loader
            self.engine = engine if isinstance(engine, Engine) else engine()
            self._warm_up()
            self.slots = [Slot(self.engine)]
        except Exception as e:  # reported by /health and every request
            self.load_error = str(e) if isinstance(e, OpenJetError) else f"{type(e).__name__}: {e}"
            log.error("model load failed: %s", escape_for_log(self.load_error))
            if self.on_load_failed:
                self.on_load_failed(self.load_error)
            return
        self.ready.set()
        while (job := self._jobs.get()) is not None:
            if self.engine_error:  # queued before the engine broke: refused as a later request is (503, rejected)
                gone = job.cancelled.is_set()  # (a client that left is counted as _serve counts it)
                self.metrics.add(**{"requests_cancelled_total" if gone else "requests_rejected_total": 1})
                job.channel.put(Failed(f"the engine failed and cannot serve: {self.engine_error}; restart the server",
                                       status=503), force=True)
                continue
            slot = self.slots[0]
            self.busy = 1
            try:
                self._serve(slot, job)
            except Exception as e:
                self.metrics.add(requests_failed_total=1)
                log.exception("generation failed")
                job.channel.put(Failed(f"generation failed: {type(e).__name__}: {e}"), force=True)
                self._reset_after_failure(slot)
            finally:
                self.busy = 0

    def _reset_after_failure(self, slot: Slot) -> None:
        """Never leave a half-updated cache to the next request; where even the reset fails (a CUDA error sticks to
        its context), the engine serves no more: later and queued requests get a 503 / an error event, /health says
        so, and `serve` exits (on_load_failed) so that whoever runs it can start it again."""
        try:
            slot.reset()
        except Exception as e:
            self.engine_error = f"{type(e).__name__}: {e}"
            log.error("the engine cannot be reset after a failed request, so it serves no more: %s",
                      escape_for_log(self.engine_error))
            if self.on_load_failed:
                self.on_load_failed(self.engine_error)

    def _warm_up(self) -> None:
        """One short prefill and decode on a scratch state: first-call setup happens before /health is 200."""
        assert self.engine is not None
        state = self.engine.new_state()
        first = self.tokenizer.encode("Hello")[:1] or [0]
        out = self.engine.prefill(state, first)
        self.engine.decode(state, [int(np.argmax(out.logits[-1][: self.n_valid]))])
        del state

    def _serve(self, slot: Slot, job: Job) -> None:
        assert self.engine is not None
        result = GenerationResult(prompt_tokens=len(job.prompt))
        if job.cancelled.is_set():                 # the client left while the job queued
            result.finish_reason = "cancelled"
            self.metrics.add(requests_cancelled_total=1)
            job.channel.put(Finished(result), force=True)
            return
        self.metrics.add(requests_total=1)
        t0 = time.perf_counter()
        logits, result.reused_tokens = slot.load_prompt(
            job.prompt, lambda reused: job.channel.put(Started(reused), force=True))
        sampler = Sampler(job.params, self.n_valid)
        first = sampler.sample(logits)
        result.prefill_seconds = time.perf_counter() - t0

        budget = max(0, min(job.max_tokens, self.n_ctx - len(job.prompt)))
        detok = StreamingDetokenizer(self.tokenizer, skip_special=True)
        stops = StopStringMatcher(job.stops)
        eog = self.tokenizer.eog_ids
        finish = "length"
        for token in self._tokens(slot.state, sampler, first, budget, result):
            if job.cancelled.is_set():
                finish = "cancelled"
                break
            result.completion_tokens += 1
            if token in eog:
                finish = "stop"
                break
            text = stops.push(detok.push(token))
            if text and not job.channel.put(TextDelta(text), job.cancelled):
                job.cancel(job.cancel_reason or STALLED)
                finish = "cancelled"
                break
            if stops.stopped:
                finish = "stop"
                break
            if result.completion_tokens >= budget:
                break
        if finish != "cancelled" and not stops.stopped:
            tail = stops.push(detok.flush(cut=finish == "length"))   # (half a character at the limit: dropped)
            tail += stops.flush()
            if tail:
                job.channel.put(TextDelta(tail), force=True)
        detok.flush()
        result.finish_reason = finish
        result.stop_string = stops.matched
        self._account(job, result)
        if finish == "cancelled" and job.cancel_reason == STALLED:
            # The reader may still be there (a slow one): an error event, not the end of a normal answer, which
            # would hand it a silently cut text.
            job.channel.put(Failed(f"the stream was cut after {result.completion_tokens} tokens: its reader took "
                                   f"nothing for {job.channel.stall_timeout_s:g} s", 408), force=True)
        else:
            job.channel.put(Finished(result), force=True)

    def _tokens(self, state: SequenceState, sampler: Sampler, token: int, budget: int,
                result: GenerationResult) -> Iterator[int]:
        """The chosen tokens one by one, starting with `token` (chosen from the prompt's logits). The engine
        runs the next step only when the caller asks for the next token. Requests without penalties use MTP
        speculation (`n_draft` > 0, speculative.py): greedy gives the same tokens, sampled the same
        distribution, in fewer engine steps; each cycle drafts as many tokens (at most `n_draft`) as
        DraftDepth expects to pay best from this request's acceptance so far."""
        engine = self.engine
        assert engine is not None
        speculate = can_speculate(engine, sampler, self.n_draft)
        depth = DraftDepth(self.n_draft) if speculate else None
        emitted = 0
        while True:
            yield token
            emitted += 1
            if emitted >= budget:
                return
            t0 = time.perf_counter()
            # (room: the positions after this cycle's first token; budget <= n_ctx - prompt keeps it >= 1)
            limit = draft_limit(sampler, budget - emitted, self.n_ctx - state.n_tokens - 1) if speculate else 0
            if limit is not None and limit < 1:  # no speculation, or a greedy request's last token: a plain step
                token = plain_step(engine, state, sampler, token)
                result.decode_seconds += time.perf_counter() - t0
                continue
            cycle = speculative_cycle(engine, state, sampler, token, depth.next(limit))
            depth.update(cycle.drafted, len(cycle.accepted))
            result.drafted += cycle.drafted
            result.decode_seconds += time.perf_counter() - t0
            for d in cycle.accepted:
                sampler.note(d)
                result.accepted += 1  # counted as emitted: not those a stop, a cancel or the budget leaves behind
                yield d
                emitted += 1
            token = cycle.next_token
            sampler.note(token)

    def _account(self, job: Job, r: GenerationResult) -> None:
        t = r.timings()
        self.metrics.add(prompt_tokens_total=r.prefilled_tokens, prompt_tokens_reused_total=r.reused_tokens,
                         generated_tokens_total=r.completion_tokens, draft_tokens_total=r.drafted,
                         draft_tokens_accepted_total=r.accepted, prompt_seconds_total=r.prefill_seconds,
                         decode_seconds_total=r.decode_seconds)
        self.metrics.set(last_prompt_tokens_per_second=t["prompt_per_second"],
                         last_predicted_tokens_per_second=t["predicted_per_second"])
        if r.finish_reason == "cancelled":
            self.metrics.add(requests_cancelled_total=1)
            if job.cancel_reason == STALLED:
                self.metrics.add(requests_stalled_total=1)
            log.info("request cancelled after %d tokens: %s", r.completion_tokens, escape_for_log(job.cancel_reason))
