"""draft_depth.DraftDepth: its yield formula against the geometric closed form, its per-depth acceptance
estimates against the rates of a simulated drafter, and its choice against the best depth computed here from
the true rates and the same cost table."""

from __future__ import annotations

import numpy as np
import pytest

from openjet_launcher.draft_depth import DEFAULT_COST_MS, DraftDepth, expected_tokens


def simulate(depth: DraftDepth, true_rates: list[float], cycles: int, rng, n: int | None = None) -> list[int]:
    """Cycles of a drafter whose draft i is kept with true_rates[i - 1] given the ones before it; returns the
    chosen depths (n: propose that many every time instead of asking the policy)."""
    chosen = []
    for _ in range(cycles):
        m = depth.next() if n is None else n
        k = 0
        while k < m and rng.random() < true_rates[k]:
            k += 1
        depth.update(m, k)
        chosen.append(m)
    return chosen


def yield_per_ms(true_rates: list[float], n: int) -> float:
    reach, total = 1.0, 1.0
    for a in true_rates[:n]:
        reach *= a
        total += reach
    return total / DEFAULT_COST_MS[n]


def best_depth(true_rates: list[float], max_draft: int) -> int:
    return max(range(1, max_draft + 1), key=lambda n: yield_per_ms(true_rates, n))


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.75, 0.99])
def test_expected_tokens_is_the_geometric_sum(alpha):
    for n in range(8):
        want = n + 1 if alpha == 1 else (1 - alpha ** (n + 1)) / (1 - alpha)
        assert expected_tokens([alpha] * n) == pytest.approx(want, rel=1e-12)


def test_rates_converge_to_the_drafters_per_depth_rates():
    true = [0.8, 0.6, 0.5, 0.5, 0.4, 0.4, 0.3]
    depth = DraftDepth(7, memory=1e6)                       # no fading: a plain estimate
    simulate(depth, true, 20000, np.random.default_rng(0), n=7)
    got = depth.rates()
    # depth i is tried only when i - 1 drafts were kept: fewer trials deeper, wider tolerance
    for i, (g, t) in enumerate(zip(got, true)):
        assert abs(g - t) < (0.02 if i < 3 else 0.05), (i, g, t)


@pytest.mark.parametrize("true, want_deep", [([0.95] * 7, True), ([0.25] * 7, False),
                                             ([0.73, 0.47, 0.40, 0.5, 0.5, 0.4, 0.4], False)])
def test_choice_settles_on_the_best_depth_for_the_true_rates(true, want_deep):
    depth = DraftDepth(7)
    chosen = simulate(depth, true, 3000, np.random.default_rng(1))
    best = best_depth(true, 7)
    late = chosen[-500:]
    mode = max(set(late), key=late.count)
    # the best depth, or one within 1% of its yield (the demo rates make depths 2 and 3 a near-tie: on the default
    # costs, 499afb1's, 3 yields 98.8% of 2, the best; seeds 0-7 all settle on 2, this one's late choices 2 395 times,
    # 3 91, 4 14)
    assert yield_per_ms(true, mode) >= 0.99 * yield_per_ms(true, best), (mode, best)
    assert (best >= 5) == want_deep


def test_the_depth_follows_a_change_of_text():
    depth = DraftDepth(7, memory=32)
    rng = np.random.default_rng(2)
    simulate(depth, [0.95] * 7, 400, rng)                  # repetitive text: deep drafts pay
    deep = depth.next()
    simulate(depth, [0.2] * 7, 400, rng)                   # then prose
    assert deep >= 5 and depth.next() == best_depth([0.2] * 7, 7) == 1


def test_limits_and_errors():
    depth = DraftDepth(5)
    assert 1 <= depth.next() <= 5
    assert depth.next(limit=2) <= 2 and depth.next(limit=0) == 1     # never 0 drafts
    depth.update(0, 0)                                               # nothing drafted: nothing learnt
    with pytest.raises(ValueError):
        depth.update(3, 4)                                           # more kept than proposed
    with pytest.raises(ValueError):
        depth.update(6, 1)                                           # more than max_draft
    with pytest.raises(ValueError):
        DraftDepth(0)
    with pytest.raises(ValueError):
        DraftDepth(3, cost_ms=[1.0, 2.0])                            # too few costs
    with pytest.raises(ValueError):
        DraftDepth(3, prior=1.0)


def test_every_draft_count_the_commands_allow_has_a_cost_and_more_is_refused():
    from openjet_launcher.draft_depth import MAX_DRAFT, check_draft_count
    from openjet_launcher.engine.interface import MAX_GPU_DECODE_TOKENS
    from openjet_launcher.errors import OpenJetError

    assert MAX_DRAFT == MAX_GPU_DECODE_TOKENS - 1
    for n in range(1, MAX_DRAFT + 1):
        depth = DraftDepth(check_draft_count(n))
        depth.update(n, n)
        assert 1 <= depth.next() <= n
    for bad in (-1, MAX_DRAFT + 1):
        with pytest.raises(OpenJetError, match=f"--draft {bad}"):
            check_draft_count(bad)
