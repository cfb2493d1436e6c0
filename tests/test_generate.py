"""The generation loop: MTP speculation must give exactly the plain greedy tokens (the oracle)."""

from dataclasses import replace

import numpy as np
import pytest

from openjet_launcher.engine.interface import DraftOutput, DraftTopOutput, Engine
from openjet_launcher.generate import generate
from openjet_launcher.model.synth import synthesize
from openjet_launcher.reference import ReferenceEngine
from openjet_launcher.sampling import Sampler, SamplingParams

GREEDY = SamplingParams(temperature=0.0)
PROMPT = [11, 402, 7, 1999, 3, 250, 96]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = tmp_path_factory.mktemp("gen") / "tiny.gguf"
    synthesize("tiny", path, show_progress=False)
    return ReferenceEngine.load(path)


def plain(engine, n, stop=()):
    return generate(engine, engine.new_state(), PROMPT, Sampler(GREEDY, 4000), n, stop)


class OracleDrafter:
    """Wraps an engine; drafts the known greedy continuation, wrong at every third draft position."""

    def __init__(self, engine, continuation):
        self.engine, self.continuation = engine, continuation

    def __getattr__(self, name):
        return getattr(self.engine, name)

    greedy_cycle = Engine.greedy_cycle  # the interface's cycle over this double's drafts (not the wrapped engine's)

    def mtp_draft(self, state, token, n_draft=1, choose=None):
        real = self.engine.mtp_draft(state, token, n_draft)
        start = state.n_tokens - len(PROMPT) + 1          # index in the continuation of the first draft
        tokens = list(self.continuation[start:start + n_draft])
        tokens += real.tokens[len(tokens):]
        tokens = [t if (start + i) % 3 else (t + 1) % 4000 for i, t in enumerate(tokens)]
        return DraftOutput(tokens, real.logits, real.hidden)

    def mtp_draft_top(self, state, token, n_draft, *, k, n_valid=None, choose=None):
        assert k == 1                                      # greedy drafting: the drafted ids are the top 1
        d = self.mtp_draft(state, token, n_draft)
        ids = np.array(d.tokens, np.int32)[:, None]
        return DraftTopOutput(d.tokens, d.logits[np.arange(n_draft), d.tokens][:, None], ids, d.hidden)


def test_speculation_with_the_real_mtp_head_keeps_the_greedy_tokens(engine):
    want = plain(engine, 24)
    got = generate(engine, engine.new_state(), PROMPT, Sampler(GREEDY, 4000), 24, (), n_draft=3)
    assert got.tokens == want.tokens
    assert got.drafted > 0


@pytest.mark.parametrize("n_draft", [1, 2, 4])
def test_accepted_drafts_give_the_same_tokens_in_fewer_steps(engine, n_draft):
    want = plain(engine, 30)
    spec = OracleDrafter(engine, want.tokens)
    got = generate(spec, engine.new_state(), PROMPT, Sampler(GREEDY, 4000), 30, (), n_draft=n_draft)
    assert got.tokens == want.tokens
    assert got.accepted > 0
    assert got.steps < want.steps


def test_stops_on_a_stop_token_and_at_max_tokens(engine):
    want = plain(engine, 12)
    stop_at = want.tokens[4]
    first = want.tokens.index(stop_at)
    got = plain(engine, 12, stop=[stop_at])
    assert got.tokens == want.tokens[: first + 1] and got.stop_reason == "eos"
    spec = OracleDrafter(engine, want.tokens)
    got = generate(spec, engine.new_state(), PROMPT, Sampler(GREEDY, 4000), 12, [stop_at], n_draft=4)
    assert got.tokens == want.tokens[: first + 1] and got.stop_reason == "eos"
    assert len(plain(engine, 5).tokens) == 5


def test_sampling_with_a_seed_repeats(engine):
    params = SamplingParams(temperature=0.8, top_k=20, seed=7)
    a = generate(engine, engine.new_state(), PROMPT, Sampler(params, 4000), 10, ())
    b = generate(engine, engine.new_state(), PROMPT, Sampler(params, 4000), 10, ())
    c = generate(engine, engine.new_state(), PROMPT, Sampler(replace(params, seed=8), 4000), 10, ())
    assert a.tokens == b.tokens and a.tokens != c.tokens


@pytest.mark.parametrize("n_draft", [0, 4])
def test_a_seeded_answer_cut_by_max_tokens_is_the_longer_answers_start(engine, n_draft):
    """Sampled with a seed, speculation on or off: the answer of max_tokens = N is the first N tokens of the answer
    of a larger max_tokens (the draft count of a sampled request is not clamped by the tokens still wanted: its drafts
    draw from the seeded generator, so a clamp near the end would shift the acceptance draws)."""
    for seed in range(4):
        params = SamplingParams(temperature=0.7, top_k=3, seed=seed)
        whole = generate(engine, engine.new_state(), PROMPT, Sampler(params, 4000), 24, (), n_draft=n_draft)
        for n in (3, 5, 9, 13):
            cut = generate(engine, engine.new_state(), PROMPT, Sampler(params, 4000), n, (), n_draft=n_draft)
            assert cut.tokens == whole.tokens[:n], (seed, n)


def test_accepted_drafts_count_only_the_tokens_emitted(engine):
    """A cycle that keeps drafts past max_tokens or a stop id: the drafts reported accepted are the kept drafts the
    answer holds, no more (timings' draft_n_accepted, /metrics)."""
    want = plain(engine, 30)
    spec = OracleDrafter(engine, want.tokens)
    for i in range(1, 12):  # a stop id at each position: some end a cycle inside its kept drafts
        stop = want.tokens[i]
        got = generate(spec, engine.new_state(), PROMPT, Sampler(GREEDY, 4000), 30, [stop], n_draft=4)
        assert got.tokens == want.tokens[:want.tokens.index(stop) + 1]
        # the first token, then per cycle its kept drafts and (but for a last cycle cut short) its own token
        assert got.accepted <= len(got.tokens) - got.steps, (i, got.accepted, got.steps, len(got.tokens))


def test_a_greedy_request_drafts_no_more_than_its_remaining_tokens_need(engine):
    """A cycle emits its kept drafts and one token of its own, so with L tokens still wanted L - 1 drafts suffice and
    one token left is a plain step: every draft proposed can be emitted (the drafts past that were pure cost)."""
    want = plain(engine, 12)
    continuation = want.tokens
    for max_tokens in (2, 3, 5):
        drafted = []
        oracle = OracleDrafter(engine, continuation)
        real_draft = oracle.mtp_draft

        def spy(state, token, n_draft=1, choose=None, _real=real_draft, _seen=drafted, _max=max_tokens):
            emitted = state.n_tokens - len(PROMPT) + 1                # tokens out so far, the cycle's own included
            _seen.append((n_draft, _max - emitted))
            return _real(state, token, n_draft, choose)
        oracle.mtp_draft = spy
        got = generate(oracle, engine.new_state(), PROMPT, Sampler(GREEDY, 4000), max_tokens, (), n_draft=7)
        assert got.tokens == continuation[:max_tokens]
        assert drafted and all(n <= left - 1 for n, left in drafted) or max_tokens == 2, (max_tokens, drafted)
        assert max_tokens > 2 or drafted == []                        # one token left after the first: a plain step


def test_run_cli_generates_and_reports(engine, tmp_path):
    import subprocess
    import sys
    path = tmp_path / "tiny.gguf"
    synthesize("tiny", path, show_progress=False)
    r = subprocess.run([sys.executable, "-m", "openjet_launcher", "run", str(path), "-p", "Hello", "-n", "6",
                        "--chat", "--draft", "2"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "6 generated" in r.stderr or "stop: eos" in r.stderr
    bad = subprocess.run([sys.executable, "-m", "openjet_launcher", "run", str(tmp_path / "missing.gguf"),
                          "-p", "x"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "no such file" in bad.stderr and "Traceback" not in bad.stderr
