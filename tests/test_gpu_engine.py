"""The CUDA decode engine v1 (openjet_launcher/engine/cuda.py) against the numpy reference engine.

On the `tiny` and `small` synthetic models, teacher-forced over a random prompt: every position's logits from
GPU decode steps (T = 1 and T = 4) against the reference's (its prefill with all_logits, float32), as top-1
agreement and mean KL(p_ref || p_gpu) in nats; the T = 4 rows must equal the T = 1 rows bit for bit
(T-invariance). Checkpoint and truncate must give back the logits of the uninterrupted run.

Why top-1 is reported but not held to 99.5% here: the GEMVs read int8-rounded activations (dp4a), which moves
logits by ~1.2-1.6% (relative L2) from the float32 reference; the synthetic models' logits are near-Gaussian
(std ~4 over 4K-8K tokens), so 2-3% of positions have a top-2 gap below that noise. The reference with the
same int8 rounding emulated (with_int8_activations) lands at the same top-1 and KL against the float32
reference (H200, 2048 positions each: tiny 97.9% / 8.5e-4 nats, small 96.8% / 1.76e-3), which is what
test_the_gap_to_the_reference_is_the_int8_activation_rounding checks: the GPU adds nothing measurable to the
rounding's own error. The same noise decides where greedy generation first departs (GREEDY_TIE).
OPENJET_GPU_REPORT=path appends the measured figures as JSON lines (written before the asserts).
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from gpu_report import report as write_report

from openjet_launcher.engine.cuda import CudaEngine
from openjet_launcher.errors import OpenJetError
from openjet_launcher.model.synth import synthesize
from openjet_launcher.reference.engine import ReferenceEngine
from openjet_launcher.reference.weights import GDNWeights

pytestmark = pytest.mark.gpu

N_POS = 2048                 # teacher-forced positions per model and T (two models: >= 4,096 per T)
TOP1_BAR, KL_BAR = 0.995, 2e-3
GREEDY_TIE = 0.25            # top-2 logit gap (logits ~N(0, 4)) within the int8-activation noise; measured
                             # misses on H200 had gaps up to 0.25 (the near-tie is 1e-3: see above)
N_GREEDY = 64


def report(**fields) -> None:
    write_report(**fields)
    print(json.dumps(fields))


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("synth")
    out = {}
    for preset in ("tiny", "small"):
        path = folder / f"{preset}.gguf"
        synthesize(preset, path, show_progress=False)
        out[preset] = path
    return out


_ref_cache: dict = {}


def reference_run(path, preset: str):
    """(engine, prompt ids, logits [N_POS, n_vocab], hidden [N_POS, n_embd]) of one random prompt."""
    if preset not in _ref_cache:
        ref = ReferenceEngine.load(path)
        rng = np.random.default_rng(1234)
        ids = rng.integers(0, ref.config.shape.n_vocab, N_POS)
        out = ref.prefill(ref.new_state(), ids, all_logits=True)
        _ref_cache[preset] = (ref, ids, out.logits, out.hidden)
    return _ref_cache[preset]


def gpu_logits(engine: CudaEngine, ids: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
    state = engine.new_state()
    outs = [engine.decode(state, ids[i:i + t]) for i in range(0, len(ids), t)]
    return np.concatenate([o.logits for o in outs]), np.concatenate([o.hidden for o in outs])


def compare(ref: np.ndarray, got: np.ndarray) -> dict:
    r = ref.astype(np.float64)
    g = got.astype(np.float64)
    lr = r - r.max(-1, keepdims=True)
    lr -= np.log(np.exp(lr).sum(-1, keepdims=True))
    lg = g - g.max(-1, keepdims=True)
    lg -= np.log(np.exp(lg).sum(-1, keepdims=True))
    kl = (np.exp(lr) * (lr - lg)).sum(-1)
    top1 = (r.argmax(-1) == g.argmax(-1))
    srt = np.sort(r, -1)
    gap = srt[:, -1] - srt[:, -2]
    miss = ~top1
    return {"positions": int(len(r)), "top1": float(top1.mean()), "mean_kl": float(kl.mean()),
            "max_kl": float(kl.max()), "p99_kl": float(np.quantile(kl, 0.99)),
            "misses": int(miss.sum()), "max_ref_gap_at_miss": float(gap[miss].max()) if miss.any() else 0.0,
            "rel_l2": float(np.linalg.norm(g - r) / np.linalg.norm(r)),
            "ref_logit_std": float(r.std())}


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_teacher_forced_logits_match_the_reference_and_t4_equals_t1(models, preset, kv_type):
    ref, ids, ref_logits, ref_hidden = reference_run(models[preset], preset)
    engine = CudaEngine.load(models[preset], n_ctx=N_POS + 64, kv_type=kv_type)
    try:
        got1, hid1 = gpu_logits(engine, ids, 1)
        got4, hid4 = gpu_logits(engine, ids, 4)
        hidden_rel = float(np.linalg.norm(hid1 - ref_hidden) / np.linalg.norm(ref_hidden))
        first_rel = float(np.linalg.norm(got1[0] - ref_logits[0]) / np.linalg.norm(ref_logits[0]))
        m1, m4 = compare(ref_logits, got1), compare(ref_logits, got4)
        same = np.array_equal(got1, got4)
        diff = float(np.abs(got1 - got4).max())
        rows_differing = int((got1 != got4).any(-1).sum())
        report(test="teacher_forced", preset=preset, kv_type=kv_type, t1=m1, t4=m4, hidden_rel_l2=hidden_rel,
               pos0_logits_rel_l2=first_rel, hidden_t4_bit_identical=bool(np.array_equal(hid1, hid4)),
               t4_bit_identical=same,
               t4_max_abs_diff=diff, t4_rows_differing=rows_differing, memory=engine.memory())
    finally:
        engine.close()
    assert np.isfinite(got1).all() and np.isfinite(got4).all()
    assert same, f"T=4 rows differ from T=1 rows at {rows_differing} positions (max |diff| {diff})"
    assert m1["mean_kl"] <= KL_BAR, m1         # top-1 (bar TOP1_BAR) is reported: see the module docstring


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_greedy_generation_follows_the_reference(models, preset):
    ref = ReferenceEngine.load(models[preset])
    engine = CudaEngine.load(models[preset], n_ctx=512)
    prompt = np.random.default_rng(7).integers(0, ref.config.shape.n_vocab, 32)
    try:
        rs, gs = ref.new_state(), engine.new_state()
        rl = ref.prefill(rs, prompt).logits[-1]
        gl = engine.prefill(gs, prompt).logits[-1]
        ref_tokens, gpu_tokens, gaps = [], [], []
        for _ in range(N_GREEDY):
            top2 = np.sort(rl)[-2:]
            gaps.append(float(top2[1] - top2[0]))
            rt, gt = int(np.argmax(rl)), int(np.argmax(gl))
            ref_tokens.append(rt)
            gpu_tokens.append(gt)
            if rt != gt:
                break
            rl = ref.decode(rs, [rt]).logits[-1]
            gl = engine.decode(gs, [gt]).logits[-1]
        first = next((i for i, (a, b) in enumerate(zip(ref_tokens, gpu_tokens)) if a != b), None)
        report(test="greedy", preset=preset, tokens=len(gpu_tokens), first_divergence=first,
               gap_at_divergence=None if first is None else gaps[first], min_gap=min(gaps))
    finally:
        engine.close()
    assert first is None or gaps[first] < GREEDY_TIE, (first, gaps[first])


def test_truncate_replays_to_the_logits_of_the_uninterrupted_run(models):
    engine = CudaEngine.load(models["tiny"], n_ctx=256, n_checkpoints=2)
    ids = np.random.default_rng(3).integers(0, engine.config.shape.n_vocab, 60)
    try:
        state = engine.new_state()
        engine.prefill(state, ids[:40])
        engine.checkpoint(state)
        straight = [engine.decode(state, ids[i:i + 1]).logits for i in range(40, 50)]
        assert state.checkpoint_positions == (40,)
        engine.truncate(state, 43)                  # restore the checkpoint at 40, replay 3
        assert state.n_tokens == 43
        again = [engine.decode(state, ids[i:i + 1]).logits for i in range(43, 50)]
        engine.truncate(state, 12)                  # before the checkpoint: from the start
        assert state.checkpoint_positions == ()
        engine.prefill(state, ids[12:45])
        after = engine.decode(state, ids[45:46]).logits
        same = all(np.array_equal(a, b) for a, b in zip(straight[3:], again)) and np.array_equal(after, straight[5])
        report(test="truncate", bit_identical=bool(same))
        assert same
        with pytest.raises(OpenJetError, match="outside the vocabulary"):
            engine.decode(state, [engine.config.shape.n_vocab])
        with pytest.raises(NotImplementedError):
            engine.mtp_draft(state, 1)
        old = state
        engine.new_state()
        with pytest.raises(OpenJetError, match="retired"):
            engine.decode(old, [1])
    finally:
        engine.close()


def test_context_overflow_is_an_error_not_a_crash(models):
    engine = CudaEngine.load(models["tiny"], n_ctx=16)
    try:
        state = engine.new_state()
        engine.prefill(state, list(range(16)))
        with pytest.raises(OpenJetError, match="context"):
            engine.decode(state, [1])
    finally:
        engine.close()


# ------------------------------------------------------------- the reference with the GEMVs' int8 activations


def q8(x: np.ndarray) -> np.ndarray:
    """x rounded as quantize_act.cuh does (per 32-block: d = max|x| / 127, q = round half away from 0), dequantised."""
    x = np.asarray(x, np.float32)
    b = x.reshape(-1, x.shape[-1] // 32, 32)
    d = np.abs(b).max(-1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(d > 0, b / d, np.float32(0)).astype(np.float32)
    return (np.trunc(v + np.copysign(np.float32(0.5), v)) * d).astype(np.float32).reshape(x.shape)


class Q8Input(np.ndarray):
    """A weight [in, out] whose ``x @ W`` first rounds x to int8 blocks (the GPU's dp4a GEMV input); the last
    ``float_tail`` columns (the F32 ssm_beta/ssm_alpha projections) see x unrounded, as on the GPU."""
    float_tail = 0

    def __rmatmul__(self, x):
        w = self.view(np.ndarray)
        n = w.shape[1] - self.float_tail
        y = q8(x) @ w[:, :n]
        return np.concatenate([y, x @ w[:, n:]], axis=-1) if self.float_tail else y


def with_int8_activations(ref: ReferenceEngine) -> ReferenceEngine:
    """The reference engine whose every quantised-weight matmul reads int8-rounded activations."""
    s, w = ref.config.shape, ref.weights

    def qv(a: np.ndarray, tail: int = 0) -> np.ndarray:
        v = a.view(Q8Input)
        v.float_tail = tail
        return v

    layers = []
    for layer in w.layers:
        m = layer.mixer
        if isinstance(m, GDNWeights):
            m = replace(m, w_in=qv(m.w_in, 2 * s.ssm_n_v_heads), w_out=qv(m.w_out))
        else:
            m = replace(m, w_q=qv(m.w_q), w_kv=qv(m.w_kv), w_out=qv(m.w_out))
        ffn = replace(layer.ffn, gate_up=qv(layer.ffn.gate_up), down=qv(layer.ffn.down))
        layers.append(replace(layer, mixer=m, ffn=ffn))
    return ReferenceEngine(ref.config, replace(w, layers=tuple(layers), output=qv(w.output)))


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_the_gap_to_the_reference_is_the_int8_activation_rounding(models, preset):
    """The GPU's distance to the float32 reference must be the int8 rounding's own: the reference with the
    rounding emulated is as far from the float32 one (KL within 25%, top-1 within 0.5 points). GPU and
    emulation do not agree with each other more closely: a last-bit difference flips a few int8 codes, and
    the flips compound through the ~4 roundings per layer, so their rounding errors decorrelate."""
    ref, ids, ref_logits, _ = reference_run(models[preset], preset)
    emu = with_int8_activations(ref)
    emu_logits = emu.prefill(emu.new_state(), ids, all_logits=True).logits
    engine = CudaEngine.load(models[preset], n_ctx=N_POS + 64)
    try:
        got, _ = gpu_logits(engine, ids, 1)
    finally:
        engine.close()
    vs_emu, emu_vs_ref = compare(emu_logits, got), compare(ref_logits, emu_logits)
    report(test="vs_int8_activation_reference", preset=preset, gpu_vs_emulated=vs_emu,
           emulated_vs_fp32_reference=emu_vs_ref)
    vs_ref = compare(ref_logits, got)
    assert vs_ref["mean_kl"] <= 1.25 * emu_vs_ref["mean_kl"], (vs_ref, emu_vs_ref)
    assert vs_ref["top1"] >= emu_vs_ref["top1"] - 0.005, (vs_ref, emu_vs_ref)
