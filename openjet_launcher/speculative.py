"""One MTP speculative cycle over any Engine, greedy or sampled (qwen38.md §3.3; issue 7 fuses it on the device).

A cycle after the last chosen token: draft n tokens with the MTP head, verify [token, d_1..d_n] in one decode
step (Engine.verify), keep a prefix of the drafts, take the target's next token, drop the rest (Engine.accept).

* Greedy: the drafts are the head's argmax; the kept prefix is the longest one equal to the target's argmax,
  and the next token is the target's argmax after it. Token-identical to plain greedy decoding.
* Sampled (exact speculative sampling, Leviathan et al. 2023 / Chen et al. 2023): the drafts are drawn from q_i,
  the request's own transform (temperature, top-k, top-p, min-p) of the head's logits; draft i is kept with
  probability min(1, p_i(d_i) / q_i(d_i)), p_i being the same transform of the target's logits; at the first
  rejection the next token is drawn from max(p_i - q_i, 0) renormalised, and when every draft is kept, from
  p_{n+1}. Every emitted token then has exactly the distribution of plain sampling; only the random stream
  differs, so a seed gives other (equally distributed) tokens than without drafts.
Penalties depend on the tokens before each row, drafts included, so requests with penalties do not speculate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .engine.interface import Engine, SequenceState
from .sampling import GPU_MAX_TOP_K, Sampler


def can_speculate(engine: Engine, sampler: Sampler, n_draft: int) -> bool:
    p = sampler.params
    return n_draft > 0 and engine.config.has_mtp and not p.presence_penalty and not p.frequency_penalty


@dataclass
class Cycle:
    accepted: list[int]      # the kept drafts, in order
    next_token: int          # the target's token after them
    drafted: int


def accept_sampled(p_rows: list[np.ndarray], q_rows: list[np.ndarray], drafts: list[int],
                   sampler: Sampler) -> tuple[int, int]:
    """(number of kept drafts, next token) by exact speculative sampling: p_rows [n + 1] target distributions,
    q_rows [n] draft distributions the drafts were drawn from."""
    for k, d in enumerate(drafts):
        if sampler.rng.random() * q_rows[k][d] < p_rows[k][d]:      # u < p/q (q(d) > 0: d was drawn from q)
            continue
        return k, sampler.draw(np.maximum(p_rows[k] - q_rows[k], 0.0))
    return len(drafts), sampler.draw(p_rows[len(drafts)])


def plain_step(engine: Engine, state: SequenceState, sampler: Sampler, token: int) -> int:
    """The cycle without drafts: decode `token`, sample the next one (noted in the sampler). Through
    Engine.decode_top when the request needs only the top logits (greedy, or top_k <= GPU_MAX_TOP_K), so an
    engine that ranks on the device hands over k values instead of the vocabulary; the same token either way."""
    k = sampler.top_request(GPU_MAX_TOP_K)
    if k is None:
        return sampler.sample(engine.decode(state, [token]).logits[0])
    top = engine.decode_top(state, [token], k=k, n_valid=sampler.n_valid, penalties=sampler.penalty_deltas())
    return sampler.sample_top(top.values[0], top.ids[0])


def speculative_cycle(engine: Engine, state: SequenceState, sampler: Sampler, token: int, n_draft: int) -> Cycle:
    """One cycle after `token` (chosen, not yet processed): on return `state` holds token and the kept drafts."""
    greedy = sampler.params.greedy
    if greedy:
        draft = engine.mtp_draft(state, token, n_draft)
    else:
        draft = engine.mtp_draft(state, token, n_draft, choose=lambda lg: sampler.draw(sampler.probabilities(lg)))
    drafts = list(draft.tokens)
    out = engine.verify(state, [token, *drafts])
    if greedy:
        targets = [int(np.argmax(row[: sampler.n_valid])) for row in out.logits]
        k = 0
        while k < len(drafts) and drafts[k] == targets[k]:
            k += 1
        next_token = targets[k]
    else:
        k, next_token = accept_sampled([sampler.probabilities(row) for row in out.logits],
                                       [sampler.probabilities(row) for row in draft.logits], drafts, sampler)
    engine.accept(state, 1 + k)                             # keep token and the k kept drafts
    return Cycle(drafts[:k], next_token, len(drafts))
