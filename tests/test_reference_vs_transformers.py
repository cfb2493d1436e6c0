"""The numpy reference engine against transformers' `Qwen3_5ForCausalLM` (design.md §4, link 2).

Tiny random HF models are written as GGUF files by our converter (hf_convert.py: 1+w norms, ssm_a =
-exp(A_log), tiled value heads), in the all-F32 recipe and the unsloth Q4_K_M recipe. transformers then
computes with exactly the weights the file holds (the effective state dict loaded back), eagerly in
float32 with its torch-only Gated DeltaNet (chunked, chunk 64) and conv paths. The engine reads only the
GGUF file, so every converter convention must be undone correctly for the logits to agree.
"""

from __future__ import annotations

import copy
import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from openjet_launcher.model import hf_convert as hc  # noqa: E402
from openjet_launcher.reference import ReferenceEngine  # noqa: E402

N_POSITIONS = 256
MAX_LOGIT_DIFF = 1e-3

# Three shapes of the family: depth 4 and 8, GQA group 2 / 4 / 2, value heads per key head 3 / 2 / 3,
# vocabularies 4096 / 1024 / 2048 (sizes stay multiples of 256 so the unsloth K-quants apply).
CONFIGS = {
    "4L-kv2-r3": dict(),
    "8L-kv1-r2": dict(num_hidden_layers=8, num_key_value_heads=1, linear_num_value_heads=4, vocab_size=1024),
    "4L-h512-kv4-r3": dict(hidden_size=512, intermediate_size=1024, num_attention_heads=8, num_key_value_heads=4,
                           linear_num_key_heads=4, linear_num_value_heads=12, vocab_size=2048),
}
CASES = [(name, recipe) for name in CONFIGS for recipe in hc.RECIPES]


@pytest.fixture(scope="module", autouse=True)
def torch_only_kernels():
    """The oracle is transformers' torch code. It would pick fla / causal-conv1d whenever they are installed.
    Hub kernels (the `kernels` package, a dependency of transformers since 5.25) replace code only in a
    kernelized model: USE_HUB_KERNELS=NO keeps them off, and `compared` checks its model is not kernelized."""
    for package in ("fla", "causal_conv1d"):
        assert importlib.util.find_spec(package) is None, f"{package} is installed: the oracle must be torch-only"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("USE_HUB_KERNELS", "NO")
        yield


@pytest.fixture(scope="module", params=CASES, ids=[f"{n}-{r}" for n, r in CASES])
def compared(request, tmp_path_factory):
    """One config in one recipe: transformers' logits and the engine's (chunked prefill, token-by-token
    decode) over the same random token ids."""
    name, recipe = request.param
    seed = list(CONFIGS).index(name)
    model, mtp = hc.random_tiny_model(seed=seed, config=hc.tiny_hf_config(**CONFIGS[name]))
    path = tmp_path_factory.mktemp("vs-hf") / f"{name}-{recipe}.gguf"
    effective = hc.hf_to_gguf(model, model.config, path, recipe=recipe, mtp_state=mtp)
    hf = copy.deepcopy(model)
    hc.load_hf_state(hf, effective)
    assert hf.config._attn_implementation == "eager" and hf.dtype == torch.float32
    assert not getattr(hf, "use_kernels", False), "the oracle model is kernelized: it must run transformers' torch code"

    ids = np.random.default_rng(100 + seed).integers(0, model.config.vocab_size, N_POSITIONS)
    with torch.no_grad():
        want = hf(torch.tensor(ids[None])).logits[0].numpy()

    engine = ReferenceEngine.load(path)
    prefill = engine.prefill(engine.new_state(), ids, chunk_size=64, all_logits=True).logits
    state = engine.new_state()
    decode = np.concatenate([engine.decode(state, [t]).logits for t in ids])
    return name, recipe, want, prefill, decode


def _check(want: np.ndarray, got: np.ndarray, what: str) -> float:
    diff = float(np.abs(got - want).max())
    flips = np.flatnonzero(got.argmax(-1) != want.argmax(-1))
    top2 = np.sort(want, axis=-1)[:, -2:]
    margins = (top2[:, 1] - top2[:, 0])[flips]
    print(f"{what}: max |logit diff| {diff:.2e}, logit std {want.std():.2f}, top-1 flips {len(flips)}")
    assert len(flips) == 0, f"{what}: top-1 differs at positions {flips.tolist()} (HF margins {margins})"
    assert diff <= MAX_LOGIT_DIFF, f"{what}: max |logit diff| {diff:.3g}"
    return diff


def test_chunked_prefill_logits_match_transformers(compared):
    """Chunk 64 over 256 positions (4 chunks). Measured max |logit diff| (logit std 2.0), f32 / unsloth:
    4L-kv2-r3 1.1e-5 / 8.8e-6, 8L-kv1-r2 1.2e-5 / 1.3e-5, 4L-h512-kv4-r3 7.6e-6 / 1.1e-5; top-1 identical
    at all 256 positions."""
    name, recipe, want, prefill, _ = compared
    assert prefill.shape == want.shape == (N_POSITIONS, want.shape[1])
    _check(want, prefill, f"{name} {recipe} chunked prefill")


def test_token_by_token_decode_logits_match_transformers(compared):
    """Measured max |logit diff|, f32 / unsloth: 4L-kv2-r3 8.1e-6 / 6.2e-6, 8L-kv1-r2 9.3e-6 / 7.9e-6,
    4L-h512-kv4-r3 9.1e-6 / 7.6e-6; top-1 identical at all 256 positions."""
    name, recipe, want, _, decode = compared
    _check(want, decode, f"{name} {recipe} recurrent decode")


def test_the_model_is_not_degenerate(compared):
    """Guards the comparison itself: logits spread, and greedy choices vary along the sequence."""
    _, _, want, _, _ = compared
    assert want.std() > 1.0
    assert len(set(want.argmax(-1).tolist())) > N_POSITIONS // 8
