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

Distributions are kept sparse, as (ids in increasing order, probabilities): the survivors of the request's
transform. When the request needs only the top logits (greedy, or top_k <= GPU_MAX_TOP_K) the verify step
hands over each row's top k (Engine.verify_top: on the CUDA engine ranked on the device) and nothing touches
the whole vocabulary; the numbers, the random draws and hence the tokens are those of the dense computation
(tests/test_speculative.py checks this against a dense implementation).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .engine.interface import Engine, SequenceState
from .sampling import GPU_MAX_TOP_K, Sampler

Dist = tuple[np.ndarray, np.ndarray]  # (token ids, increasing; their probabilities, float64)


def sparse(probs: np.ndarray) -> Dist:
    """A dense distribution over the vocabulary as (its non-zero ids, their probabilities)."""
    ids = np.flatnonzero(probs)
    return ids, probs[ids]


def prob_at(dist: Dist, ids: np.ndarray) -> np.ndarray:
    """The distribution's probabilities of `ids` (0 where it has none)."""
    have, probs = dist
    at = np.minimum(np.searchsorted(have, ids), len(have) - 1)
    return np.where(have[at] == ids, probs[at], 0.0)


def can_speculate(engine: Engine, sampler: Sampler, n_draft: int) -> bool:
    p = sampler.params
    return n_draft > 0 and engine.config.has_mtp and not p.presence_penalty and not p.frequency_penalty


def draft_limit(sampler: Sampler, tokens_left: int, room: int | None) -> int | None:
    """The most drafts the next cycle may propose (DraftDepth.next's limit). A greedy request's output does not depend
    on how many drafts it proposes, so it drafts no more than the ``tokens_left`` it still wants need (a cycle emits its
    kept drafts and one token of its own: tokens_left - 1; one token left is a plain step); a sampled request's
    drafts consume its random numbers, so that clamp would make a seeded answer depend on max_tokens (the answer of
    max_tokens = N would not be the first N tokens of a longer one's): only the context's ``room`` (positions left
    after the cycle's first token; None: unbounded) limits it, and drafts past the tokens wanted are dropped."""
    if sampler.params.greedy:
        return tokens_left - 1 if room is None else min(tokens_left - 1, room)
    return room


@dataclass
class Cycle:
    accepted: list[int]      # the kept drafts, in order
    next_token: int          # the target's token after them
    drafted: int


def accept_sampled(p_rows: list[Dist], q_rows: list[Dist], drafts: list[int], sampler: Sampler) -> tuple[int, int]:
    """(number of kept drafts, next token) by exact speculative sampling: p_rows [n + 1] target distributions,
    q_rows [n] draft distributions the drafts were drawn from."""
    for k, d in enumerate(drafts):
        p_d, q_d = prob_at(p_rows[k], np.array([d]))[0], prob_at(q_rows[k], np.array([d]))[0]
        if sampler.rng.random() * q_d < p_d:                        # u < p/q (q(d) > 0: d was drawn from q)
            continue
        ids, p = p_rows[k]                                          # max(p - q, 0) is 0 outside p's support
        return k, int(ids[sampler.draw(np.maximum(p - prob_at(q_rows[k], ids), 0.0))])
    ids, p = p_rows[len(drafts)]
    return len(drafts), int(ids[sampler.draw(p)])


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
    k_top = sampler.top_request(GPU_MAX_TOP_K)                 # 1 when greedy; None: the whole rows
    if sampler.params.greedy:                       # drafts, verify, verdict and accept: Engine.greedy_cycle
        kept, next_token = engine.greedy_cycle(state, token, n_draft, n_valid=sampler.n_valid)
        return Cycle(kept, next_token, n_draft)
    if k_top is not None:                           # drafts from their rows' top k, verify_top, verdict and accept
        kept, next_token = engine.sampled_cycle(state, token, n_draft, sampler, k=k_top)
        return Cycle(kept, next_token, n_draft)
    q_rows: list[Dist] = []

    def draw(dist: Dist) -> int:                           # a draft from q, noted for the acceptance test
        q_rows.append(dist)
        return int(dist[0][sampler.draw(dist[1])])

    drafts = list(engine.mtp_draft(state, token, n_draft,
                                   choose=lambda lg: draw(sparse(sampler.probabilities(lg)))).tokens)
    out = engine.verify(state, [token, *drafts])
    p_rows = [sparse(sampler.probabilities(row)) for row in out.logits]
    k, next_token = accept_sampled(p_rows, q_rows, drafts, sampler)
    engine.accept(state, 1 + k)                             # keep token and the k kept drafts
    return Cycle(drafts[:k], next_token, len(drafts))
