"""The reference engine's own invariants (engine/interface.py) and its MTP head (qwen38.md §3.3).

Oracles: the engine against itself through a different algorithm or call pattern (chunked WY vs the
per-token recurrence, one call vs several, truncate + replay vs a fresh run), and for the MTP head an
independent PyTorch implementation of §3.3 built on transformers' own gated-attention decoder layer.
Most tests use the `tiny` synthetic file (unsloth Q4_K_M recipe: every quant type of the real file).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from openjet_launcher.engine.interface import DraftOutput, StepOutput
from openjet_launcher.errors import ModelFileError, OpenJetError
from openjet_launcher.model import quants
from openjet_launcher.model.shape import PRESETS
from openjet_launcher.model.synth import init_rows, plan_tensors, synthesize, vocab_for, write_gguf
from openjet_launcher.reference import ReferenceEngine, ReferenceState

TINY = PRESETS["tiny"]
CROSS_ALGORITHM_TOL = 1e-4      # |logit| differences between two float32 evaluation orders (measured <= 1.9e-5)


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> ReferenceEngine:
    path = tmp_path_factory.mktemp("ref") / "tiny.gguf"
    synthesize("tiny", path, show_progress=False)
    return ReferenceEngine.load(path)


@pytest.fixture(scope="module")
def ids() -> np.ndarray:
    return np.random.default_rng(7).integers(0, TINY.n_vocab, 100)


def state_arrays(state: ReferenceState) -> dict[str, np.ndarray]:
    """Everything a state holds, as named arrays at their used length."""
    out = {f"conv{i}": a for i, a in enumerate(state.conv)} | {f"ssm{i}": a for i, a in enumerate(state.ssm)}
    for i, c in enumerate(state.kv):
        out[f"k{i}"], out[f"v{i}"] = c.keys(), c.values()
    out["mtp_k"], out["mtp_v"] = state.mtp_kv.keys(), state.mtp_kv.values()
    out["last_hidden"] = state.last_hidden
    return out


def state_diff(a: ReferenceState, b: ReferenceState) -> float:
    """Largest difference over all state arrays, each relative to its largest magnitude."""
    assert a.tokens == b.tokens
    sa, sb = state_arrays(a), state_arrays(b)
    assert {k: v.shape for k, v in sa.items()} == {k: v.shape for k, v in sb.items()}
    return max(float(np.abs(sa[k] - sb[k]).max() / np.abs(sb[k]).max()) for k in sa)


def states_equal(a: ReferenceState, b: ReferenceState) -> bool:
    sa, sb = state_arrays(a), state_arrays(b)
    return (a.tokens == b.tokens and a.checkpoint_positions == b.checkpoint_positions
            and all(np.array_equal(sa[k], sb[k]) for k in sa))


def decode_each(engine: ReferenceEngine, state: ReferenceState, tokens) -> np.ndarray:
    return np.concatenate([engine.decode(state, [t]).logits for t in tokens])


# ------------------------------------------------------------------------- prefill and decode agree

@pytest.mark.parametrize("chunk_size", [16, 64])
def test_chunked_prefill_equals_token_by_token_decode(engine, ids, chunk_size):
    """100 tokens (not a multiple of the chunk). Measured: max |logit diff| 1.8e-5 (chunk 16) and 1.9e-5
    (chunk 64) at logit std 4.0; every state array within 1.2e-6 of its largest magnitude."""
    a, b = engine.new_state(), engine.new_state()
    chunked = engine.prefill(a, ids, chunk_size=chunk_size, all_logits=True)
    recurrent = decode_each(engine, b, ids)
    assert chunked.logits.shape == (len(ids), TINY.n_vocab) and chunked.logits.dtype == np.float32
    assert np.abs(chunked.logits - recurrent).max() < CROSS_ALGORITHM_TOL
    assert state_diff(a, b) < 1e-5
    assert np.array_equal(chunked.logits.argmax(-1), recurrent.argmax(-1))


def test_prefill_returns_the_last_row_unless_all_logits(engine, ids):
    last = engine.prefill(engine.new_state(), ids[:10])
    every = engine.prefill(engine.new_state(), ids[:10], all_logits=True)
    assert isinstance(last, StepOutput) and last.logits.shape == (1, TINY.n_vocab)
    assert last.hidden.shape == (1, TINY.n_embd) and every.hidden.shape == (10, TINY.n_embd)
    # 1 row vs 10 rows: BLAS rounding only (~1e-6 relative; OpenBLAS 0.3.31's kernels reach 1.1e-5 on logits near 4)
    for one, many in ((last.logits[0], every.logits[-1]), (last.hidden[0], every.hidden[-1])):
        assert np.abs(one - many).max() < 1e-5 * max(1.0, float(np.abs(many).max()))


def test_prefill_in_two_pieces_equals_one_piece(engine, ids):
    """A split at 37 (inside a chunk of 16) and the join of the MTP pairs across calls.
    Measured: max |logit diff| 1.3e-5, state within 8e-7 relative."""
    one, two = engine.new_state(), engine.new_state()
    whole = engine.prefill(one, ids, chunk_size=16, all_logits=True).logits
    first = engine.prefill(two, ids[:37], chunk_size=16, all_logits=True).logits
    second = engine.prefill(two, ids[37:], chunk_size=16, all_logits=True).logits
    assert np.abs(np.concatenate([first, second]) - whole).max() < CROSS_ALGORITHM_TOL
    assert state_diff(two, one) < 1e-5
    assert two.mtp_kv.length == one.mtp_kv.length == len(ids) - 1


def test_decode_of_four_tokens_equals_four_single_steps(engine, ids):
    """Measured: max |logit diff| 1.5e-5 (matmuls over 4 rows vs 1 round differently), state 9e-7 relative."""
    one, four = engine.new_state(), engine.new_state()
    engine.prefill(one, ids[:20])
    engine.prefill(four, ids[:20])
    singles = decode_each(engine, one, ids[20:24])
    batch = engine.decode(four, ids[20:24])
    assert batch.logits.shape == (4, TINY.n_vocab) and batch.hidden.shape == (4, TINY.n_embd)
    assert np.abs(batch.logits - singles).max() < CROSS_ALGORITHM_TOL
    assert state_diff(four, one) < 1e-5


# ------------------------------------------------------------------------------- rollback and copies

@pytest.mark.parametrize("with_checkpoint", [True, False])
def test_truncate_then_decode_matches_a_fresh_run(engine, ids, with_checkpoint):
    """A speculative step: checkpoint at 34, verify [x34, three wrong drafts], accept one token
    (truncate to 35), decode on. Logits, state and MTP drafts equal a run that never saw the drafts.
    Measured: max |logit diff| 7e-6 (checkpoint) / 9e-6 (replay from 0), state 7e-7 relative."""
    fresh = engine.new_state()
    engine.prefill(fresh, ids[:30])
    want = decode_each(engine, fresh, ids[30:50])

    state = engine.new_state()
    engine.prefill(state, ids[:30])
    engine.decode(state, ids[30:34])
    if with_checkpoint:
        engine.checkpoint(state)
    engine.decode(state, [ids[34], 1, 2, 3])
    if with_checkpoint:
        engine.checkpoint(state)                          # at 38: past the truncation, must be dropped
        assert state.checkpoint_positions == (34, 38)
    engine.reset_stats()
    engine.truncate(state, 35)
    assert state.n_tokens == 35 and state.tokens == tuple(ids[:35].tolist())
    assert state.checkpoint_positions == ((34,) if with_checkpoint else ())
    assert engine.stats().replay_tokens == (1 if with_checkpoint else 35)
    got = decode_each(engine, state, ids[35:50])

    assert np.abs(got - want[5:]).max() < CROSS_ALGORITHM_TOL
    assert state_diff(state, fresh) < 1e-5
    d_got, d_want = engine.mtp_draft(state, 11, 3), engine.mtp_draft(fresh, 11, 3)
    assert d_got.tokens == d_want.tokens and np.abs(d_got.logits - d_want.logits).max() < CROSS_ALGORITHM_TOL


def test_truncate_to_a_checkpoint_restores_it_without_replay(engine, ids):
    state = engine.new_state()
    engine.prefill(state, ids[:12])
    engine.checkpoint(state)
    at_checkpoint = state.copy()
    engine.decode(state, ids[12:16])
    engine.reset_stats()
    engine.truncate(state, 12)
    assert engine.stats().replay_tokens == 0 and states_equal(state, at_checkpoint)
    engine.truncate(state, 0)
    assert state.n_tokens == 0 and state.last_hidden is None and state.checkpoint_positions == ()
    assert all(not a.any() for a in state.conv + state.ssm) and state.mtp_kv.length == 0
    assert all(c.length == 0 for c in state.kv)


def test_state_copy_is_independent(engine, ids):
    state = engine.new_state()
    engine.prefill(state, ids[:20])
    engine.checkpoint(state)
    twin = state.copy()
    assert states_equal(twin, state) and twin.nbytes == state.nbytes
    after_original = engine.decode(state, ids[20:23]).logits
    assert twin.n_tokens == 20 and not states_equal(twin, state)
    after_twin = engine.decode(twin, ids[20:23]).logits
    assert np.array_equal(after_twin, after_original) and states_equal(twin, state)
    engine.truncate(twin, 5)                               # shared checkpoints are read-only, never changed
    assert state.n_tokens == 23 and state.checkpoint_positions == (20,)
    engine.truncate(state, 20)
    assert state.n_tokens == 20


def test_memory_and_stats_are_reported(engine, ids):
    engine.reset_stats()
    state = engine.new_state()
    engine.prefill(state, ids[:16])
    engine.decode(state, ids[16:18])
    mem, stats = engine.memory(), engine.stats().as_dict()
    assert mem["weights_bytes"] == 4 * sum(np.prod(s.ne) for s in (p.spec for p in plan_tensors(TINY)))
    assert mem["states_bytes"] >= state.nbytes > 0 and mem["n_states"] >= 1
    assert (stats["prefill_tokens"], stats["decode_tokens"], stats["decode_steps"]) == (16, 2, 1)
    assert stats["prefill_seconds"] > 0 and stats["decode_tok_s"] > 0


# ------------------------------------------------------------------------------------------ MTP head

def test_mtp_draft_leaves_the_state_unchanged(engine, ids):
    state = engine.new_state()
    engine.prefill(state, ids[:30])
    before = state.copy()
    draft = engine.mtp_draft(state, int(ids[30]), n_draft=4)
    assert isinstance(draft, DraftOutput) and len(draft.tokens) == 4
    assert draft.logits.shape == (4, TINY.n_vocab) and draft.hidden.shape == (4, TINY.n_embd)
    assert draft.tokens == draft.logits.argmax(-1).tolist()
    assert states_equal(state, before)
    assert np.array_equal(engine.decode(state, ids[30:32]).logits, engine.decode(before, ids[30:32]).logits)
    again = engine.mtp_draft(before.copy(), 5, n_draft=2, choose=lambda logits: 17)
    assert again.tokens == [17, 17]


def test_mtp_head_matches_an_independent_pytorch_implementation(tmp_path):
    """§3.3 in torch from the HF weights (zero-centred norms as 1+w), with transformers' own
    `Qwen3_5DecoderLayer` as the gated-attention layer and trunk hidden states from transformers.
    The prompt (24 tokens) reaches the engine as prefill(20) + decode(3) + decode(1), so the MTP cache is
    built across calls; the oracle recomputes the head over all pairs (x_{t+1}, h_t) causally.
    Measured: 3 chained drafts identical, max |draft logit diff| 5.1e-6 (logit std 2)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer

    from openjet_launcher.model import hf_convert as hc

    model, mtp = hc.random_tiny_model(seed=3)
    path = tmp_path / "tiny-hf.gguf"
    effective = {k: torch.from_numpy(v) for k, v in hc.hf_to_gguf(model, model.config, path, mtp_state=mtp).items()}
    cfg = model.config
    layer = Qwen3_5DecoderLayer(cfg, cfg.layer_types.index("full_attention")).eval()
    prefix = "mtp.layers.0."
    layer.load_state_dict({k[len(prefix):]: v for k, v in effective.items() if k.startswith(prefix)})

    prompt = np.random.default_rng(5).integers(0, cfg.vocab_size, 24)
    with torch.no_grad():
        hidden = model.model(torch.tensor(prompt[None])).last_hidden_state[0]     # post-output_norm
    ref = ReferenceEngine.load(path)
    state = ref.new_state()
    ref.prefill(state, prompt[:20], chunk_size=16)
    ref.decode(state, prompt[20:23])
    token = int(ref.decode(state, prompt[23:]).logits[0].argmax())
    draft = ref.mtp_draft(state, token, n_draft=3)

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * (1 + w)

    tokens, hs, want_tokens, want_logits = list(prompt[1:]) + [token], list(hidden), [], []
    with torch.no_grad():
        for _ in range(3):                     # pair i = (tokens[i], hs[i]) at position i + 1
            c = torch.cat([rms(model.model.embed_tokens.weight[torch.tensor(tokens)],
                               effective["mtp.pre_fc_norm_embedding.weight"]),
                           rms(torch.stack(hs), effective["mtp.pre_fc_norm_hidden.weight"])], -1)
            u = (c @ effective["mtp.fc.weight"].T)[None]
            n = len(tokens)
            rope = model.model.rotary_emb(u, torch.arange(1, n + 1)[None])
            u = layer(u, position_embeddings=rope, attention_mask=torch.full((n, n), -torch.inf).triu(1)[None, None])
            h = rms(u[0, -1], effective["mtp.norm.weight"])
            logits = h @ model.lm_head.weight.T
            want_tokens.append(int(logits.argmax()))
            want_logits.append(logits.numpy())
            tokens.append(want_tokens[-1])
            hs.append(h)
    diff = float(np.abs(draft.logits - np.stack(want_logits)).max())
    print(f"MTP drafts {draft.tokens} (oracle {want_tokens}), max |logit diff| {diff:.2e}")
    assert draft.tokens == want_tokens
    assert diff < 1e-4
    assert np.stack(want_logits).std() > 1.0


# ------------------------------------------------------------------------------ synthetic files, errors

@pytest.mark.parametrize("n_layer", [4, 64])
def test_synthetic_model_gives_finite_spread_logits(n_layer, engine, tmp_path):
    """64 tokens through the synthetic init (unsloth Q4_K_M): activations finite, logits spread, greedy
    choices varied, MTP drafts finite. The `tiny` preset, and the same width 64 layers deep (the 27B depth)."""
    if n_layer == TINY.n_layer:
        ref = engine
    else:
        path = tmp_path / f"tiny-{n_layer}L.gguf"
        _write_tiny(path, TINY.with_(n_layer=n_layer))
        ref = ReferenceEngine.load(path)
    s = ref.config.shape
    assert s.n_layer == n_layer
    state = ref.new_state()
    out = ref.prefill(state, np.random.default_rng(1).integers(0, s.n_vocab, 64), all_logits=True)
    assert np.isfinite(out.logits).all() and np.isfinite(out.hidden).all()
    assert out.logits.std() > 1.0 and len(set(out.logits.argmax(-1).tolist())) > 16
    draft = ref.mtp_draft(state, int(out.logits[-1].argmax()), n_draft=2)
    assert np.isfinite(draft.logits).all() and draft.logits.std() > 1.0


def _write_tiny(path, shape=TINY, retype: dict[str, Q] | None = None) -> None:
    plans = plan_tensors(shape, with_mtp=shape.n_nextn > 0)
    typed = [(p.spec, (retype or {}).get(p.spec.name, p.qtype)) for p in plans]

    def produce(i: int) -> np.ndarray:
        spec, qtype = typed[i]
        rows = int(np.prod(spec.ne[1:])) if len(spec.ne) > 1 else 1
        return quants.quantize(init_rows(spec, plans[i].seed, 0, rows), qtype)

    write_gguf(path, shape, vocab_for("tiny", shape), typed, produce, name="test variant")


def test_file_without_mtp_head_runs_but_cannot_draft(tmp_path, ids):
    path = tmp_path / "no-mtp.gguf"
    _write_tiny(path, TINY.with_(n_nextn=0))
    ref = ReferenceEngine.load(path)
    state = ref.new_state()
    assert np.isfinite(ref.prefill(state, ids[:8]).logits).all() and state.mtp_kv is None
    ref.checkpoint(state)
    ref.decode(state, ids[8:10])
    ref.truncate(state, 9)
    with pytest.raises(OpenJetError, match="no MTP head"):
        ref.mtp_draft(state, 1)


def test_unsupported_recipe_is_refused(tmp_path):
    path = tmp_path / "f16-norm.gguf"
    _write_tiny(path, retype={"blk.0.attn_norm.weight": Q.F16})
    with pytest.raises(ModelFileError, match="blk.0.attn_norm.weight is F16, expected F32"):
        ReferenceEngine.load(path)


def test_too_large_for_the_reference_is_refused(tmp_path):
    path = tmp_path / "tiny.gguf"
    synthesize("tiny", path, show_progress=False)
    with pytest.raises(OpenJetError, match="meant for test-size models"):
        ReferenceEngine.load(path, max_weight_bytes=1 << 20)


def test_bad_calls_raise_errors_a_user_can_act_on(engine, ids):
    state = engine.new_state()
    with pytest.raises(OpenJetError, match="prefill first"):
        engine.mtp_draft(state, 1)
    with pytest.raises(OpenJetError, match="outside the vocabulary"):
        engine.decode(state, [TINY.n_vocab])
    with pytest.raises(OpenJetError, match="non-empty"):
        engine.prefill(state, [])
    with pytest.raises(OpenJetError, match="chunk_size"):
        engine.prefill(state, [1], chunk_size=0)
    engine.prefill(state, ids[:4])
    with pytest.raises(OpenJetError, match="cannot truncate a sequence of 4 tokens to 5"):
        engine.truncate(state, 5)
    with pytest.raises(OpenJetError, match="not made by this engine"):
        engine.decode(object(), [1])
    assert state.n_tokens == 4
