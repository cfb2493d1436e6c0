"""The generation loop over any ``Engine``: plain decoding, and MTP speculative decoding (speculative.py:
greedy output token-identical to plain greedy decoding, sampled output with plain sampling's distribution)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field


from .draft_depth import DraftDepth
from .engine.interface import Engine, SequenceState
from .sampling import Sampler
from .speculative import can_speculate, draft_limit, plain_step, speculative_cycle


@dataclass
class Generation:
    tokens: list[int] = field(default_factory=list)
    stop_reason: str = "length"            # "length" or "eos"
    prompt_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    steps: int = 0                         # engine decode calls
    drafted: int = 0
    accepted: int = 0

    def timings(self) -> dict[str, float]:
        n = len(self.tokens)
        return {
            "prompt_n": self.prompt_tokens,
            "prompt_per_second": self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else 0.0,
            "predicted_n": n,
            "predicted_per_second": n / self.decode_seconds if self.decode_seconds else 0.0,
            "draft_n": self.drafted,
            "draft_n_accepted": self.accepted,
        }


def generate(engine: Engine, state: SequenceState, prompt: list[int], sampler: Sampler, max_tokens: int,
             stop_ids: Iterable[int], n_draft: int = 0,
             on_token: Callable[[int], None] | None = None) -> Generation:
    """Prefill ``prompt`` into ``state`` and generate up to ``max_tokens`` tokens (stop ids included in
    the result but ending it). ``n_draft`` > 0 uses MTP speculation (requests without penalties) with at most
    ``n_draft`` drafts per cycle, as many as DraftDepth expects to pay best."""
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    stop = frozenset(stop_ids)
    gen = Generation(prompt_tokens=len(prompt))
    t0 = time.perf_counter()
    logits = engine.prefill(state, prompt).logits[-1]
    gen.prefill_seconds = time.perf_counter() - t0
    speculate = can_speculate(engine, sampler, n_draft)
    depth = DraftDepth(n_draft) if speculate else None

    t0 = time.perf_counter()
    token = sampler.sample(logits)
    while True:
        gen.tokens.append(token)
        if on_token:
            on_token(token)
        if token in stop:
            gen.stop_reason = "eos"
            break
        if len(gen.tokens) >= max_tokens:
            break
        n_ctx = getattr(engine, "n_ctx", None)  # (an engine without a context bound: none)
        room = None if n_ctx is None else n_ctx - state.n_tokens - 1
        limit = draft_limit(sampler, max_tokens - len(gen.tokens), room) if speculate else 0
        if limit is not None and limit < 1:  # no speculation, or no room left for a draft
            token = plain_step(engine, state, sampler, token)
            gen.steps += 1
            continue
        cycle = speculative_cycle(engine, state, sampler, token, depth.next(limit))
        depth.update(cycle.drafted, len(cycle.accepted))
        gen.steps += 1
        gen.drafted += cycle.drafted
        for d in cycle.accepted:
            sampler.note(d)
            gen.accepted += 1  # the drafts kept and emitted (those past max_tokens or a stop id are not)
            gen.tokens.append(d)
            if on_token:
                on_token(d)
            if d in stop or len(gen.tokens) >= max_tokens:
                gen.stop_reason = "eos" if d in stop else "length"
                gen.decode_seconds = time.perf_counter() - t0
                return gen
        token = cycle.next_token
        sampler.note(token)
    gen.decode_seconds = time.perf_counter() - t0
    return gen
