"""The device top-k (native/src/topk.cu) against the host sampler's order (sampling.py): the first k of a
stable sort by decreasing logit, ties by lower id, after the penalties, never a padding id. Bit-equal:
the values are the logits themselves (float32), the ids exactly the sampler's.
"""

from __future__ import annotations

import numpy as np
import pytest

from openjet_launcher.engine import kernels_test as kt
from openjet_launcher.engine.interface import top_k_order
from openjet_launcher.errors import OpenJetError
from openjet_launcher.sampling import GPU_MAX_TOP_K, Sampler, SamplingParams

pytestmark = pytest.mark.gpu


def host_top(z: np.ndarray, k: int, n_valid: int, penalties: dict[int, float] | None = None):
    """The sampler's own ranking (top_k_order over the penalised valid logits)."""
    z = z[:n_valid].astype(np.float32).copy()
    for i, d in (penalties or {}).items():
        z[i] = np.float32(z[i] - np.float32(d))
    order = top_k_order(z, k)
    return z[order], order.astype(np.int32)


@pytest.fixture(params=["sort", "least", "warp"])
def topk_form(request, monkeypatch):
    """launch_topk's three forms for k > 1 (OPENJET_TOPK, read at each call): the full bitonic sorts, the bitonic
    top-k that keeps only the least 32 keys of each pair of runs (least_keys), and the networks on shuffles over each
    warp's candidates (warp_least_keys): the same output."""
    monkeypatch.setenv("OPENJET_TOPK", request.param)
    return request.param


@pytest.mark.parametrize("rows, n, n_valid", [(1, 248320, 248077), (8, 248320, 248320), (3, 4096, 4000),
                                              (2, 100, 100), (5, 262144, 262144)])
@pytest.mark.parametrize("k", [1, 7, GPU_MAX_TOP_K])
def test_topk_equals_the_samplers_order(rows, n, n_valid, k, topk_form):
    rng = np.random.default_rng(rows * 1000 + k)
    x = (rng.standard_normal((rows, n)) * 4).astype(np.float32)
    x[:, n_valid:] = 1e30                                      # padding rows must never win
    v, ids = kt.topk(x, k, n_valid)
    for r in range(rows):
        hv, hi = host_top(x[r], k, n_valid)
        np.testing.assert_array_equal(ids[r], hi, err_msg=f"row {r}")
        np.testing.assert_array_equal(v[r], hv, err_msg=f"row {r}")


def test_ties_go_to_the_lower_id_across_chunks_and_signed_zeros_tie(topk_form):
    n = 3 * 4096 + 5
    x = np.full((2, n), -1.0, np.float32)
    tied = [9000, 5, 4096, 12000, 4100, 8191]                  # spread over three pass-1 chunks
    x[0, tied] = 2.5
    x[0, 77] = 3.0
    x[1, [40, 6000, 10]] = 0.0
    x[1, [7, 9001]] = -0.0
    x[1, 3] = np.float32(np.inf)
    v, ids = kt.topk(x, 8)
    for r in range(2):
        hv, hi = host_top(x[r], 8, n)
        np.testing.assert_array_equal(ids[r], hi)
        assert np.array_equal(v[r], hv)                         # -0.0 == 0.0
    assert list(ids[0][:7]) == [77, 5, 4096, 4100, 8191, 9000, 12000]
    assert list(ids[1][:6]) == [3, 7, 10, 40, 6000, 9001]


@pytest.mark.parametrize("order", ["rising", "falling", "saw"])
def test_every_arrival_order_gives_the_samplers_order(topk_form, order):
    """The warp form gathers only keys below a warp's current 32nd least: logits rising along the row make every
    key a candidate (each batch beats the ones before), falling ones none after the first batch, a saw (falling
    within each 32-key batch, the batches rising) every key too, each batch arriving in its keys' order. Then 40
    ties at the row's largest logit (the lowest ids win), a row shorter than its last chunk, and a row of 40 keys with
    33 valid ids."""
    n = 3 * 4096 + 37
    base = np.arange(n, dtype=np.float32)
    x = np.stack([{"rising": base, "falling": -base, "saw": 32 * (base // 32) - base % 32}[order]] * 2)
    x[0, 1000:1040] = x[0].max()                                 # ties in the top 32, across a warp's batches
    v, ids = kt.topk(x, GPU_MAX_TOP_K, n)
    for r in range(2):
        hv, hi = host_top(x[r], GPU_MAX_TOP_K, n)
        np.testing.assert_array_equal(ids[r], hi, err_msg=f"row {r}")
        np.testing.assert_array_equal(v[r], hv, err_msg=f"row {r}")
    short = x[:, :40].copy()                                     # one chunk, 40 keys, 33 valid: k = 32 of 33
    v, ids = kt.topk(short, GPU_MAX_TOP_K, 33)
    for r in range(2):
        hv, hi = host_top(short[r], GPU_MAX_TOP_K, 33)
        np.testing.assert_array_equal(ids[r], hi, err_msg=f"short row {r}")
        np.testing.assert_array_equal(v[r], hv, err_msg=f"short row {r}")


def test_the_argmax_takes_the_lowest_of_tied_ids_across_chunks():
    """k = 1 (greedy's argmax, a reduction instead of the sorts): ties across pass-1 chunks go to the lower id,
    -0.0 ties with 0.0, and ids at or above n_valid never win."""
    n = 3 * 4096 + 5
    x = np.full((3, n), -1.0, np.float32)
    x[0, [9000, 4100, 8191, 4096]] = 2.5                       # the lowest of them (4096) opens the second chunk
    x[1, [9001, 7]] = 0.0
    x[1, 6] = -0.0                                             # ties with 0.0: the lower id
    x[2, [n - 1, 12000]] = 5.0                                 # n - 1 is padding below
    v, ids = kt.topk(x, 1, n - 1)
    assert [int(i) for i in ids[:, 0]] == [4096, 6, 12000]
    for r in range(3):
        hv, hi = host_top(x[r], 1, n - 1)
        np.testing.assert_array_equal(ids[r], hi)
        assert np.array_equal(v[r], hv)


def test_penalties_apply_before_ranking_as_the_sampler_applies_them(topk_form):
    rng = np.random.default_rng(3)
    n = 50000
    x = rng.standard_normal((2, n)).astype(np.float32)
    top = np.argsort(-x[0], kind="stable")[:10]
    params = SamplingParams(temperature=0.7, top_k=32, presence_penalty=1.5, frequency_penalty=0.3)
    sampler = Sampler(params, n)
    for i, t in enumerate(top):
        for _ in range(i % 3 + 1):
            sampler.note(int(t))
    sampler.note(int(np.argmin(x[0])))
    deltas = {t: np.float32(params.presence_penalty) + np.float32(params.frequency_penalty) * np.float32(c)
              for t, c in sampler.counts.items()}
    v, ids = kt.topk(x, GPU_MAX_TOP_K, n, deltas)
    for r in range(2):
        z = sampler._penalised(x[r])                           # the host sampler's own penalised logits
        order = top_k_order(z, GPU_MAX_TOP_K)
        np.testing.assert_array_equal(ids[r], order)
        np.testing.assert_array_equal(v[r], z[order])


def test_bad_arguments_are_errors_with_messages():
    x = np.zeros((1, 100), np.float32)
    with pytest.raises(OpenJetError, match="k = 33"):
        kt.topk(x, 33)
    with pytest.raises(OpenJetError, match="penalised twice|outside the vocabulary"):
        kt.topk(x, 4, 100, {100: 1.0})
    with pytest.raises(OpenJetError, match="n_valid"):
        kt.topk(x, 4, 3)
    v, ids = kt.topk(x, 4)                                       # still works after errors
    assert list(ids[0]) == [0, 1, 2, 3]


@pytest.mark.parametrize("temperature, top_p, min_p", [(1.0, 1.0, 0.0), (0.7, 0.9, 0.0), (1.3, 1.0, 0.05),
                                                        (0.6, 0.95, 0.1), (1e-310, 1.0, 0.0)])
def test_a_sampled_draft_step_draws_from_the_samplers_distribution(temperature, top_p, min_p, topk_form):
    """sample_top.cuh after launch_topk (openjet_engine_mtp_draft_sampled's step): q is the host sampler's
    distribution_top of the row's top 20 (the same ids, increasing; probabilities to 1e-12: double precision, not
    numpy's operations), and the pick is its inverse CDF at u; also over a draft vocabulary's rows (row_ids: a row of
    the subset's logits, ranked by their token ids, n_valid applied to those); and a temperature so small that logits /
    t overflow gives the same limit as the host (the maxima only)."""
    from openjet_launcher.engine.interface import rank_subset
    rng = np.random.default_rng(int(temperature * 100 + top_p * 10 + min_p * 1000))
    n, n_valid, k = 5000, 4990, 20
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    sampler = Sampler(SamplingParams(temperature=temperature, top_k=k, top_p=top_p, min_p=min_p), n_valid)
    rows = rng.permutation(n)[:3000].astype(np.int32)
    for row_ids in (None, rows):
        if row_ids is None:
            logits, ranked = x, host_top(x, k, n_valid)
        else:
            logits = x[row_ids]
            ranked = rank_subset(logits, row_ids.astype(np.int64), k, n_valid)
        want_ids, want_probs = sampler.distribution_top(*ranked)
        cdf = np.cumsum(want_probs)
        for u in (0.0, 0.13, 0.5, 0.77, 0.999):
            pick, q_ids, q_probs = kt.sample_top(logits, k, temperature, top_p, min_p, u, n_valid, row_ids)
            np.testing.assert_array_equal(q_ids, want_ids)
            np.testing.assert_allclose(q_probs, want_probs, rtol=1e-12, atol=0)
            x_u = u * cdf[-1]
            if np.min(np.abs(cdf - x_u)) > 1e-9:                   # not at a boundary, where rounding may differ
                assert pick == int(want_ids[np.searchsorted(cdf, x_u, side="right")])
            assert pick in set(q_ids.tolist())
