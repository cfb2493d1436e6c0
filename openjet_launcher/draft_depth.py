"""How many tokens to draft in the next speculative cycle (issue 7): the n that maximises the expected tokens
per millisecond, from a running estimate of how often each draft depth is accepted and the cost of a cycle with
n drafts.

A cycle that drafts n tokens emits 1 + k tokens, k the length of the accepted prefix: in expectation
1 + a_1 + a_1 a_2 + ... + a_1...a_n, with a_i the rate at which draft i is kept when the ones before it were.
The rates fall with depth (the MTP head drafts from its own guesses: on the demo model 0.73, 0.47, 0.40...),
so each depth has its own estimate: a cycle that kept k of n drafts counts a success at depths 1..k and a
failure at depth k + 1 (when k < n); a depth seen rarely leans on the one above it. Old observations fade
with a memory of ~``memory`` cycles, so the depth follows the text (code repeats, prose does not). The cost of
n drafts is a verify step of 1 + n rows, n draft steps and the accept: the H200 figures below (only their
ratios matter). They are not measured as the request runs on purpose: the depth then depends only on what
was accepted, so a seeded request drafts, draws and answers the same every time (its drafts consume random
numbers); the ratios (a verify of 8 rows ~1.3x one of 1) are the GEMV's, similar on the 24 GB cards.

The choice changes only how many drafts are proposed, never which tokens come out: greedy output is the plain
greedy output for every n, sampled output keeps its distribution (speculative.py), and n is fixed before the
cycle's drafts are drawn.
"""

from __future__ import annotations

from collections.abc import Sequence

from .engine.interface import MAX_GPU_DECODE_TOKENS
from .errors import OpenJetError

MAX_DRAFT = MAX_GPU_DECODE_TOKENS - 1  # one GPU step verifies the token and its drafts; every engine keeps to it

# Cycle cost in ms for n = 0..7 drafts on the 27B model, H200, context 1,024, with the defaults since 2026-12-05 (the
# fused GDN replay, drafts chained on the device): whole greedy cycles in one call (openjet_engine_cycle_greedy: the
# n draft steps over the 32,768-row draft vocabulary, the verify of n + 1 rows through the device top-k, the verdict
# and the accept; bench/results/engine-full-h200-499afb1-gdn-replay-fused.json, cycle_greedy_ms). A sampled cycle
# (verify_top, the device's sampled draft chain, accept) costs the same to within 1% in ratio (9.599 ms at one draft
# against 8.860 at none; 11.343 at four). Only the ratios matter: 4 drafts cost 1.29x none, 7 drafts 1.56x (3e2051f's
# cycles, drafted and accepted by separate calls: 1.34x and 1.59x).
DEFAULT_COST_MS = (8.513, 9.224, 9.666, 10.428, 10.964, 11.865, 12.327, 13.238)
assert len(DEFAULT_COST_MS) == MAX_DRAFT + 1  # a cost for every allowed draft count


def check_draft_count(n_draft: int) -> int:
    """`--draft N` as every command takes it: 0 (no speculation) to MAX_DRAFT; else an OpenJetError."""
    if n_draft < 0:
        raise OpenJetError(f"--draft {n_draft}: the number of drafts per step cannot be negative (0 turns "
                           "speculation off)")
    if n_draft > MAX_DRAFT:
        raise OpenJetError(f"--draft {n_draft}: at most {MAX_DRAFT} drafts per step (one step verifies at most "
                           f"{MAX_GPU_DECODE_TOKENS} tokens); 0 turns speculation off")
    return n_draft


def expected_tokens(rates: Sequence[float]) -> float:
    """Expected tokens a cycle emits with len(rates) drafts, rates[i] the acceptance of draft i + 1 given the
    drafts before it were accepted."""
    total, reach = 1.0, 1.0
    for a in rates:
        reach *= a
        total += reach
    return total


class DraftDepth:
    """Chooses each cycle's draft count in 1..max_draft (never 0: a cycle without drafts would teach nothing,
    and one draft pays for itself from an acceptance of ~0.08 on the default costs)."""

    PRIOR_WEIGHT = 2.0  # observations a depth's estimate leans on the depth above it (depth 1: on the prior)

    def __init__(self, max_draft: int, *, prior: float = 0.7, memory: float = 32.0,
                 cost_ms: Sequence[float] = DEFAULT_COST_MS) -> None:
        if max_draft < 1:
            raise ValueError(f"max_draft must be at least 1, got {max_draft}")
        if not 0.0 < prior < 1.0 or memory < 1.0:
            raise ValueError("prior must be in (0, 1) and memory at least 1")
        if len(cost_ms) < max_draft + 1 or min(cost_ms) <= 0:
            raise ValueError(f"cost_ms needs {max_draft + 1} positive entries (n = 0..{max_draft})")
        self.max_draft = max_draft
        self._prior = prior
        self._keep = 1.0 - 1.0 / memory
        self._successes = [0.0] * max_draft                    # per depth 1..max_draft (index depth - 1)
        self._trials = [0.0] * max_draft
        self._cost = [float(c) for c in cost_ms[:max_draft + 1]]

    def rates(self) -> list[float]:
        """Estimated acceptance of drafts 1..max_draft, each given the ones before it were accepted."""
        out, above = [], self._prior
        for s, t in zip(self._successes, self._trials):
            above = (s + self.PRIOR_WEIGHT * above) / (t + self.PRIOR_WEIGHT)
            out.append(above)
        return out

    def next(self, limit: int | None = None) -> int:
        """The draft count for the next cycle, at most ``limit`` (the tokens still wanted, say)."""
        top = self.max_draft if limit is None else max(1, min(self.max_draft, limit))
        rates = self.rates()
        return max(range(1, top + 1), key=lambda n: expected_tokens(rates[:n]) / self._cost[n])

    def update(self, proposed: int, accepted: int) -> None:
        """What a cycle did: ``proposed`` drafts, the first ``accepted`` of them kept."""
        if not 0 <= accepted <= proposed <= self.max_draft:
            raise ValueError(f"accepted {accepted} and proposed {proposed} must satisfy 0 <= accepted <= "
                             f"proposed <= {self.max_draft}")
        if proposed == 0:
            return
        for i in range(self.max_draft):
            self._successes[i] *= self._keep
            self._trials[i] *= self._keep
        for i in range(min(accepted + 1, proposed)):        # depths 1..k kept, depth k + 1 (if drafted) not
            self._trials[i] += 1.0
            self._successes[i] += 1.0 if i < accepted else 0.0
