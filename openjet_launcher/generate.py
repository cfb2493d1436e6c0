"""The generation loop over any ``Engine``: plain decoding, and greedy MTP speculative decoding.

Speculative (greedy) in a few lines, as the GPU megakernel will do it in one launch per cycle:
  draft n tokens with the MTP head after the last chosen token, verify [last, d_1..d_n] in one decode
  step, keep the longest prefix of drafts equal to the target's argmax plus the target's own next token,
  and roll back the rest (truncate to the accepted length). The output is token-identical to plain
  greedy decoding; only the number of engine steps changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from .engine.interface import Engine, SequenceState
from .sampling import Sampler


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
    the result but ending it). ``n_draft`` > 0 uses MTP speculation (greedy sampling only)."""
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    stop = frozenset(stop_ids)
    gen = Generation(prompt_tokens=len(prompt))
    t0 = time.perf_counter()
    logits = engine.prefill(state, prompt).logits[-1]
    gen.prefill_seconds = time.perf_counter() - t0
    p = sampler.params
    # Exact only for greedy choice without penalties (a penalty would depend on the drafts before a row).
    speculate = (n_draft > 0 and p.greedy and not p.presence_penalty and not p.frequency_penalty
                 and engine.config.has_mtp)

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
        if not speculate:
            token = sampler.sample(engine.decode(state, [token]).logits[0])
            gen.steps += 1
            continue
        # One speculative cycle: verify [token, d_1..d_n]; emit the accepted drafts, keep the bonus token.
        n = min(n_draft, max_tokens - len(gen.tokens))
        drafts = engine.mtp_draft(state, token, n).tokens
        base = state.n_tokens
        engine.checkpoint(state)
        out = engine.decode(state, [token, *drafts])
        gen.steps += 1
        gen.drafted += len(drafts)
        targets = [int(np.argmax(row[: sampler.n_valid])) for row in out.logits]
        k = 0
        while k < len(drafts) and drafts[k] == targets[k]:
            k += 1
        gen.accepted += k
        engine.truncate(state, base + 1 + k)                    # keep token and the k accepted drafts
        for d in drafts[:k]:
            gen.tokens.append(d)
            if on_token:
                on_token(d)
            if d in stop or len(gen.tokens) >= max_tokens:
                gen.stop_reason = "eos" if d in stop else "length"
                gen.decode_seconds = time.perf_counter() - t0
                return gen
        token = targets[k]
    gen.decode_seconds = time.perf_counter() - t0
    return gen
