"""Sampling semantics, checked against distributions computed by hand with math.exp."""

import math

import numpy as np
import pytest

from openjet_launcher.errors import OpenJetError
from openjet_launcher.sampling import GPU_MAX_TOP_K, Sampler, SamplingError, SamplingParams

LOGITS = np.array([2.0, 1.0, 0.5, 0.0, -1.0, 9.0], np.float32)   # id 5 is a padding row
N_VALID = 5


def softmax(xs):
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    return [v / sum(e) for v in e]


def test_greedy_is_argmax_and_never_a_padding_row():
    s = Sampler(SamplingParams(temperature=0.0), N_VALID)
    assert [s.sample(LOGITS) for _ in range(3)] == [0, 0, 0]


def test_penalties_follow_openai_formula():
    s = Sampler(SamplingParams(temperature=0.0, presence_penalty=0.6, frequency_penalty=0.3), N_VALID)
    assert s.sample(LOGITS) == 0            # 2.0
    assert s.sample(LOGITS) == 0            # 2.0 - 0.6 - 0.3 = 1.1 > 1.0
    assert s.sample(LOGITS) == 1            # 2.0 - 0.6 - 0.6 = 0.8 < 1.0


def test_temperature_top_k_top_p_min_p_distribution():
    t = 0.7
    p = softmax([float(x) / t for x in LOGITS[:N_VALID]])           # ids sorted by logit already
    # top_k=4 keeps ids 0..3; top_p=0.9 over those keeps the smallest prefix with mass >= 0.9
    top4 = [v / sum(p[:4]) for v in p[:4]]
    cum, keep = 0.0, 0
    while cum < 0.9:
        cum += top4[keep]
        keep += 1
    kept = top4[:keep]
    kept = [v for v in kept if v >= 0.05 * kept[0]]                  # min_p = 0.05
    want = [v / sum(kept) for v in kept] + [0.0] * (N_VALID - len(kept))
    s = Sampler(SamplingParams(temperature=t, top_k=4, top_p=0.9, min_p=0.05), N_VALID)
    np.testing.assert_allclose(s.probabilities(LOGITS), want, rtol=1e-12, atol=1e-15)


def test_samples_follow_the_distribution_and_repeat_with_the_seed():
    params = SamplingParams(temperature=1.0, seed=1234)
    want = np.array(softmax([float(x) for x in LOGITS[:N_VALID]]))
    n = 20000
    s = Sampler(params, N_VALID)
    draws = [s.sample(LOGITS) for _ in range(n)]
    counts = np.bincount(draws, minlength=len(LOGITS))
    assert counts[N_VALID:].sum() == 0                          # padding rows never drawn
    sigma = np.sqrt(n * want * (1 - want))
    assert np.all(np.abs(counts[:N_VALID] - n * want) < 5 * sigma)
    again = Sampler(params, N_VALID)
    assert [again.sample(LOGITS) for _ in range(50)] == draws[:50]
    other = Sampler(SamplingParams(temperature=1.0, seed=99), N_VALID)
    assert [other.sample(LOGITS) for _ in range(50)] != draws[:50]


@pytest.mark.parametrize("kwargs,needle", [
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": float("nan")}, "finite"),
    ({"top_p": 0.0}, "top_p"),
    ({"min_p": 1.5}, "min_p"),
    ({"top_k": -1}, "top_k"),
    ({"presence_penalty": 3.0}, "presence_penalty"),
    ({"seed": "x"}, "seed"),
    ({"seed": -1}, "seed must be a non-negative integer"),     # (numpy's generator refused it later, unnamed)
    ({"top_k": np.bool_(True)}, "top_k"),
])
def test_invalid_parameters_are_named(kwargs, needle):
    with pytest.raises(SamplingError, match=needle):
        SamplingParams(**kwargs).validate()


def test_numpy_numbers_are_numbers():
    """A caller's numpy scalars are taken as the numbers they are (they were refused as 'not finite')."""
    p = SamplingParams(temperature=np.float32(0.5), top_p=np.float64(0.9), top_k=np.int64(5), seed=np.uint32(7))
    assert p.validate() is p
    Sampler(p, N_VALID).sample(LOGITS)


def test_a_nan_logit_is_a_clear_error_on_every_path():
    """A NaN logit (a broken model or engine) has no rank: the host's argmax took it, its top-k partition dropped it
    (fewer than k ids, and with k NaNs an IndexError), the device's top-k ranks it first. Every path now refuses it
    with the reason."""
    bad = LOGITS.copy()
    bad[[3, 4]] = np.nan
    for params in (SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_k=2),
                   SamplingParams(temperature=0.7, top_p=0.9)):
        with pytest.raises(OpenJetError, match="NaN logit .*token id 3"):
            Sampler(params, N_VALID).sample(bad)
    values, ids = np.array([np.nan, 2.0, 1.0], np.float32), np.array([3, 4, 5])
    for params in (SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_k=3)):
        with pytest.raises(OpenJetError, match="NaN logit"):
            Sampler(params, N_VALID).sample_top(values, ids)


def test_gpu_top_k_limit_is_stated():
    with pytest.raises(SamplingError, match=f"between 1 and {GPU_MAX_TOP_K}"):
        SamplingParams(top_k=40).validate(max_top_k=GPU_MAX_TOP_K)
    SamplingParams(temperature=0.0).validate(max_top_k=GPU_MAX_TOP_K)      # greedy needs no top_k


def test_top_k_selection_equals_a_full_stable_sort_with_ties():
    """top_k_order (engine/interface.py), the ranking of the sampler and of every engine's decode_top: the
    first k of a stable descending sort; k = 1 takes argmax, k = 0 the whole sort."""
    from openjet_launcher.engine.interface import top_k_order

    rng = np.random.default_rng(1)
    for i in range(200):
        z = rng.integers(-3, 3, size=500).astype(np.float32)      # many ties at the k-th value
        k = (1, 0)[i] if i < 2 else int(rng.integers(1, 40))
        full = np.argsort(-z, kind="stable")
        np.testing.assert_array_equal(top_k_order(z, k), full[:k] if k else full)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.0, presence_penalty=1.0, frequency_penalty=0.5),
    SamplingParams(temperature=0.8, top_k=GPU_MAX_TOP_K, seed=3),
    SamplingParams(temperature=1.3, top_k=7, top_p=0.8, seed=4),
    SamplingParams(temperature=0.6, top_k=20, min_p=0.05, presence_penalty=0.7, frequency_penalty=-0.3, seed=5),
])
def test_sampling_from_decode_top_picks_the_tokens_sampling_from_the_whole_row_picks(params):
    """The GPU path (speculative.plain_step): the engine hands over each row's top k after the penalties
    (Engine.decode_top, here its host ranking) and sample_top draws from them. Same seed, same tokens as
    sample() on the whole row, over a run where the penalties change with every token and ties occur."""
    from openjet_launcher.engine.interface import top_k_order

    rng = np.random.default_rng(11)
    n, n_valid = 3000, 2990
    whole, top = Sampler(params, n_valid), Sampler(params, n_valid)
    for step in range(300):
        row = np.round(rng.standard_normal(n) * 3, 1).astype(np.float32)   # rounded: many ties
        k = top.top_request(GPU_MAX_TOP_K)
        assert k == (1 if params.greedy else params.top_k)
        z = row[:n_valid].copy()
        for i, d in top.penalty_deltas().items():
            z[i] = np.float32(z[i] - d)
        np.testing.assert_array_equal(z, whole._penalised(row))           # the same float32 subtraction
        order = top_k_order(z, k)
        a = whole.sample(row)
        b = top.sample_top(z[order], order.astype(np.int32))
        assert a == b, f"step {step}"
    assert whole.counts == top.counts


def test_top_request_says_when_the_whole_row_is_needed():
    assert Sampler(SamplingParams(temperature=1.0, top_k=0), 100).top_request(GPU_MAX_TOP_K) is None
    assert Sampler(SamplingParams(temperature=1.0, top_k=40), 100).top_request(GPU_MAX_TOP_K) is None
    assert Sampler(SamplingParams(temperature=1.0, top_k=40), 30).top_request(64) is None   # past the vocabulary
    assert Sampler(SamplingParams(temperature=0.0, top_k=0), 100).top_request(GPU_MAX_TOP_K) == 1



@pytest.mark.parametrize("temperature", [5e-324, 1e-310])
def test_a_temperature_too_small_for_float64_gives_the_greedy_limit(temperature):
    """logits / t overflowing float64 (a fuzzer's 5e-324) gave NaN probabilities and the id one past the vocabulary;
    now the limit: the maxima share the mass (ties: each 1/2), every other id 0, and a draw is one of the maxima.
    Ordinary temperatures keep the very numbers of logits / t - max / t (the formula is only replaced on overflow)."""
    logits = np.array([1.0, 3.0, 2.0, 3.0, -1.0], np.float32)
    s = Sampler(SamplingParams(temperature=temperature, seed=1), 5)
    probs = s.probabilities(logits)
    np.testing.assert_array_equal(probs, [0.0, 0.5, 0.0, 0.5, 0.0])
    assert all(s.sample(logits) in (1, 3) for _ in range(20))
    rng = np.random.default_rng(5)
    for t in (0.3, 1.0, 1.7):
        row = (rng.standard_normal(50) * 5).astype(np.float32)
        order = np.argsort(-row, kind="stable")
        zs = row[order].astype(np.float64) / t
        want = np.exp(zs - zs[0])
        want /= want.sum()
        want = want / want.sum()  # _survivors' final renormalisation (after top-p / min-p), as before
        got = Sampler(SamplingParams(temperature=t), 50).probabilities(row)[order]
        np.testing.assert_array_equal(got, want)
