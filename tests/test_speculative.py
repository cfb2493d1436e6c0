"""Exact speculative sampling (openjet_launcher/speculative.py): the tokens a sampled MTP cycle emits must have
plain sampling's distribution. Oracle: the target distribution itself (Sampler.probabilities of the target's
logits), by a chi-square goodness-of-fit test, on hand-made distributions and on the reference engine."""

import numpy as np
import pytest

from openjet_launcher.model.synth import synthesize
from openjet_launcher.reference import ReferenceEngine
from openjet_launcher.sampling import Sampler, SamplingParams
from openjet_launcher.speculative import accept_sampled, sparse, speculative_cycle

# chi-square critical values at significance 1e-3 by degrees of freedom (scipy.stats.chi2.ppf(0.999, df))
CHI2_999 = {3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12, 9: 27.88, 10: 29.59, 11: 31.26}


def chi2(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic of observed counts against probabilities (cells with expectation < 5 pooled)."""
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    return float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()), int(keep.sum()) - 1


def test_accept_sampled_keeps_the_target_distribution():
    """Two positions over 6 tokens with a draft distribution far from the target: the first emitted token
    ~ p_0, and, when the first draft is kept, the second ~ p_1 (both the accept and the residual paths)."""
    rng = np.random.default_rng(0)
    p0, p1, p2 = (rng.dirichlet(np.ones(6)) for _ in range(3))
    q0, q1 = rng.dirichlet(np.ones(6) * 0.5), rng.dirichlet(np.ones(6) * 0.5)
    sampler = Sampler(SamplingParams(temperature=1.0, seed=1), 6)
    first, second = np.zeros(6), np.zeros(6)
    for _ in range(20000):
        drafts = [sampler.draw(q0), sampler.draw(q1)]
        k, nxt = accept_sampled([sparse(p) for p in (p0, p1, p2)], [sparse(q0), sparse(q1)], drafts, sampler)
        emitted = drafts[:k] + [nxt]
        first[emitted[0]] += 1
        if k >= 1:
            second[emitted[1]] += 1
    for counts, p in ((first, p0), (second, p1)):
        stat, df = chi2(counts, p)
        assert stat < CHI2_999[df], (stat, df, counts / counts.sum(), p)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("spec") / "tiny.gguf"
    synthesize("tiny", path, show_progress=False)
    return ReferenceEngine.load(path)


def first_token_counts(engine, sampler: Sampler, prompt: list[int], token: int, n_draft: int, n: int):
    """(target distribution after `prompt` + `token`, counts of the first token n cycles emit there, drafts
    kept in all): the sequence is rolled back to the prompt + nothing after every cycle."""
    state = engine.new_state()
    engine.prefill(state, prompt)
    base = state.n_tokens
    engine.checkpoint(state)
    target = sampler.probabilities(engine.decode(state, [token]).logits[0])
    engine.truncate(state, base)
    counts, kept = np.zeros(len(target)), 0
    for _ in range(n):
        cycle = speculative_cycle(engine, state, sampler, token, n_draft)
        counts[(cycle.accepted + [cycle.next_token])[0]] += 1
        kept += len(cycle.accepted)
        engine.truncate(state, base)
    return target, counts, kept


def test_a_sampled_cycle_on_the_engine_emits_the_plain_distribution(tiny):
    """After a prompt and a chosen token, the first token a cycle emits (a kept draft or the target's own)
    must follow the target's distribution at that position; the random synthetic model's drafts are often
    rejected, so the residual path carries most of the mass. The state is rolled back between samples."""
    params = SamplingParams(temperature=1.0, top_k=8, seed=3)
    sampler = Sampler(params, tiny.config.shape.n_vocab)
    target, counts, kept = first_token_counts(tiny, sampler, [11, 402, 7, 1999, 3, 250, 96], 1234, 2, 400)
    support = np.flatnonzero(target)
    assert counts[np.setdiff1d(np.arange(len(target)), support)].sum() == 0     # never outside top-k
    stat, df = chi2(counts[support], target[support])
    assert stat < CHI2_999[df], (stat, df, kept)


def test_drafts_from_any_q_keep_the_target_distribution_when_the_test_uses_that_q(tiny, monkeypatch):
    """Exact speculative sampling needs only that the acceptance test use the distribution each draft was drawn
    from, whatever it is: the CUDA engine's device-drawn drafts hand back their own q (Engine.mtp_draft_sampled).
    Here the first draft comes from the uniform distribution over the target's top 8 and one id outside them (far
    from the target's shape, and often kept), later ones uniformly from the head's top 8; the first emitted token
    still follows the target's distribution."""
    from openjet_launcher.engine.interface import SampledDrafts
    prompt, token = [11, 402, 7, 1999, 3, 250, 96], 1234
    params = SamplingParams(temperature=1.0, top_k=8, seed=5)
    state = tiny.new_state()
    tiny.prefill(state, prompt)
    support = np.flatnonzero(Sampler(params, tiny.config.shape.n_vocab).probabilities(
        tiny.decode(state, [token]).logits[0]))
    first_q = np.union1d(support, [int(np.setdiff1d(np.arange(100), support)[0])])

    def uniform_drafts(state, token, n_draft, sampler, *, k):
        q = []
        def choose(values, ids):
            q.append(first_q if not q else np.sort(ids).astype(np.int64))
            q[-1] = (q[-1], np.full(len(q[-1]), 1.0 / len(q[-1])))
            return int(q[-1][0][sampler.draw(q[-1][1])])
        out = tiny.mtp_draft_top(state, token, n_draft, k=k, n_valid=sampler.n_valid, choose=choose)
        return SampledDrafts(list(out.tokens), q)
    monkeypatch.setattr(tiny, "mtp_draft_sampled", uniform_drafts)
    sampler = Sampler(params, tiny.config.shape.n_vocab)
    # 1,200 cycles (~11 s): enough to fail when the test is handed another q than the drafts came from (a q skewed
    # 1:3 across the same ids gave chi-square 68.6 against the 24.3 bar at 7 degrees of freedom; 23.2 at 400).
    target, counts, kept = first_token_counts(tiny, sampler, prompt, token, 2, 1200)
    assert np.array_equal(np.flatnonzero(target), support)
    assert counts[np.setdiff1d(np.arange(len(target)), support)].sum() == 0
    stat, df = chi2(counts[support], target[support])
    assert kept > 300 and stat < CHI2_999[df], (stat, df, kept)


def test_verify_then_accept_keeps_the_first_rows_as_decode_would(tiny):
    """Engine.verify / accept (the interface's default: checkpoint, decode, truncate): accept(n) leaves the
    state a decode of the first n rows leaves; misuse is an error that says what is wrong."""
    from openjet_launcher.errors import OpenJetError

    engine = tiny
    ids = [int(x) for x in np.random.default_rng(4).integers(0, engine.config.shape.n_vocab, 16)]
    plain = engine.new_state()
    engine.prefill(plain, ids[:10])
    engine.decode(plain, ids[10:12])
    expected = engine.decode(plain, ids[12:13]).logits

    state = engine.new_state()
    engine.prefill(state, ids[:10])
    with pytest.raises(OpenJetError, match="no verify step is pending"):
        engine.accept(state, 1)
    out = engine.verify(state, ids[10:14])
    assert out.logits.shape[0] == 4
    with pytest.raises(OpenJetError, match="still waiting for accept"):
        engine.verify(state, ids[10:12])
    with pytest.raises(OpenJetError, match="has 4 rows"):
        engine.accept(state, 5)
    engine.accept(state, 2)
    assert state.tokens == tuple(ids[:12])
    np.testing.assert_array_equal(engine.decode(state, ids[12:13]).logits, expected)


def dense_cycle(engine, state, sampler: Sampler, token: int, n_draft: int) -> tuple[list[int], int]:
    """The textbook cycle over whole-vocabulary distributions (Sampler.probabilities of every row), the oracle
    of the sparse one: (kept drafts, next token)."""
    draft = engine.mtp_draft(state, token, n_draft, choose=lambda lg: sampler.draw(sampler.probabilities(lg)))
    drafts = list(draft.tokens)
    out = engine.verify(state, [token, *drafts])
    p = [sampler.probabilities(row) for row in out.logits]
    q = [sampler.probabilities(row) for row in draft.logits]
    for k, d in enumerate(drafts):
        if sampler.rng.random() * q[k][d] < p[k][d]:
            continue
        engine.accept(state, 1 + k)
        return drafts[:k], sampler.draw(np.maximum(p[k] - q[k], 0.0))
    engine.accept(state, 1 + len(drafts))
    return drafts, sampler.draw(p[len(drafts)])


@pytest.mark.parametrize("top_k", [8, 0])
def test_the_sparse_cycle_emits_the_dense_cycles_tokens(tiny, top_k):
    """speculative_cycle keeps distributions as their survivors and, with top_k <= 32, reads only each verify
    row's top k (Engine.verify_top): the same numbers and random draws as the whole-vocabulary computation,
    hence the same tokens for the same seed, cycle after cycle (top_k = 0: the whole rows, sparse after)."""
    params = SamplingParams(temperature=0.8, top_k=top_k, top_p=0.9, min_p=0.02, seed=11)
    prompt = [11, 402, 7, 1999, 3, 250, 96]
    emitted = {}
    for name in ("dense", "sparse"):
        sampler = Sampler(params, tiny.config.shape.n_vocab)
        state = tiny.new_state()
        tiny.prefill(state, prompt)
        token, out = 1234, []
        for _ in range(12):
            if name == "dense":
                kept, token = dense_cycle(tiny, state, sampler, token, 3)
            else:
                cycle = speculative_cycle(tiny, state, sampler, token, 3)
                kept, token = cycle.accepted, cycle.next_token
            out += kept + [token]
        emitted[name] = out
    assert emitted["sparse"] == emitted["dense"]
    assert len(emitted["dense"]) >= 12


def test_verify_top_ranks_the_rows_verify_gives(tiny):
    """The interface's verify_top: each row's top k of verify's logits (oracle: numpy's stable sort, ties to
    the lower id), and the sequence waits for accept as after verify."""
    ids = [5, 17, 300, 41, 9, 2000]
    state = tiny.new_state()
    tiny.prefill(state, ids[:3])
    tiny.checkpoint(state)
    full = tiny.verify(state, ids[3:]).logits
    tiny.accept(state, 1)
    tiny.truncate(state, 3)
    top = tiny.verify_top(state, ids[3:], k=5, n_valid=4000)
    for r, row in enumerate(full):
        order = np.argsort(-row[:4000], kind="stable")[:5]
        np.testing.assert_array_equal(top.ids[r], order)
        np.testing.assert_array_equal(top.values[r], row[order])
    tiny.accept(state, 2)
    assert state.tokens == tuple(ids[:5])
