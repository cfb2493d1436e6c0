"""scripts/train_demo.py at toy scale on the CPU: the demo model's training run, proven end to end.

Oracles: the file's own readers (read_config, classify, inspect), our numpy reference engine (written from
qwen38.md §3.3, independently of the torch MTP head the script trains), and the tokenizer rebuilt from the
GGUF (the engine's view of the text).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from openjet_launcher.model.config import read_config  # noqa: E402
from openjet_launcher.model.gguf_file import GGUFFile  # noqa: E402
from openjet_launcher.model.hf_convert import hf_to_gguf, shape_from_hf  # noqa: E402
from openjet_launcher.model.recipe import UNSLOTH_Q4_K_M, classify  # noqa: E402
from openjet_launcher.reference import ReferenceEngine  # noqa: E402
from openjet_launcher.text.chat import ChatTemplate  # noqa: E402
from openjet_launcher.text.tokenizer import Tokenizer  # noqa: E402
from script_module import load_script  # noqa: E402

TOY_STEPS = 20


@pytest.fixture(scope="module")
def td():
    return load_script("train_demo")


@pytest.fixture(scope="module")
def toy(td, tmp_path_factory):
    """One toy run through the script's command line: train, export (unsloth), self-check, report."""
    out = tmp_path_factory.mktemp("demo") / "toy.gguf"
    report = td.main(["--preset", "toy", "--device", "cpu", "--steps", str(TOY_STEPS), "--out", str(out)])
    return out, report


def test_demo_model_fits_the_package_limit_and_the_family(td):
    config = td.model_config("demo", "cpu")
    shape = shape_from_hf(config, with_mtp=True)                 # raises outside the Qwen3.8 family
    assert shape.n_layer % 4 == 0 and shape.ssm_n_v_heads > shape.ssm_n_k_heads
    assert (shape.head_dim, shape.n_rot, shape.ssm_head_dim) == (256, 64, 128)
    assert shape.n_embd % 256 == 0 and shape.n_ff % 256 == 0     # k-quant rows
    assert not config.tie_word_embeddings
    assert td.gguf_tensor_bytes(config) + td.GGUF_HEADER_ALLOWANCE <= td.MAX_GGUF_BYTES


def test_toy_run_lowers_both_losses_and_passes_its_self_checks(toy):
    _, report = toy
    history = report["training"]["history"]
    assert report["training"]["steps"] == TOY_STEPS
    assert history[-1]["loss"] < history[0]["loss"] - 1.0
    assert history[-1]["mtp_loss"] < history[0]["mtp_loss"] - 1.0
    assert report["problems"] == []
    checks = report["checks"]
    assert len(checks["replies"]) == 5 and all(r["tokens"] > 0 for r in checks["replies"])
    spec = checks["speculative_held_out_code"]
    assert spec["cycles"] > 0 and spec["reached"][0] == spec["cycles"]


def test_exported_file_is_an_unsloth_q4_k_m_qwen35_with_an_mtp_head(toy, td):
    out, report = toy
    gguf = GGUFFile(out)
    config = read_config(gguf)
    verdict = classify(gguf, config)
    assert verdict.kind == UNSLOTH_Q4_K_M and verdict.runnable and config.has_mtp
    assert config.shape == shape_from_hf(td.model_config("toy", "cpu"), with_mtp=True)
    assert out.stat().st_size == report["checks"]["file_bytes"] <= td.MAX_GGUF_BYTES
    ReferenceEngine.load(out)


def test_training_text_tokenizes_as_the_engine_will(toy, td):
    """The script's tokenizer and template (from small_vocab) equal those the server builds from the file."""
    out, _ = toy
    gguf = GGUFFile(out)
    ours = td.small_vocab(len(gguf.metadata["tokenizer.ggml.tokens"]))
    tok = Tokenizer(ours.tokens, ours.token_types, ours.merges, bos_id=ours.bos_id, eos_id=ours.eos_id)
    theirs = Tokenizer.from_gguf(gguf)
    chat = td.synthetic_chats(40, [("os.path.join", "(a)", "Join two or more pathname components.")], seed=1)
    tool_chat = next(c for c in chat if c["tools"])
    text = ChatTemplate.from_gguf(gguf).render(tool_chat["messages"], tools=tool_chat["tools"],
                                               add_generation_prompt=False)
    assert "<tool_call>\n<function=" in text and "<tool_response>" in text and "<think>" in text
    assert tok.encode(text, allow_special=True) == theirs.encode(text, allow_special=True)
    code = Path(td.__file__).read_text()
    assert tok.encode(code) == theirs.encode(code)


def test_the_code_split_is_a_fixed_few_percent_of_the_stdlib(td):
    files = td.stdlib_files(2_000_000)
    held = [rel for rel, _ in files if td.is_held_out(rel)]
    assert 0 < len(held) < len(files) / 10
    assert [rel for rel, _ in td.stdlib_files(2_000_000)] == [rel for rel, _ in files]     # deterministic order


def test_torch_mtp_head_matches_the_reference_engines_mtp_draft(toy, td, tmp_path):
    """The trained torch head (§3.3 wiring: embedding half first, post-norm h_t, pairs at the position of
    x_{t+1}, h' fed back for the second draft) against ReferenceEngine.mtp_draft on an F32 file."""
    out, _ = toy
    saved = torch.load(out.with_suffix(".pt"), map_location="cpu")
    config = td.model_config("toy", "cpu")
    model, mtp = td.build_model(config, seed=0)
    model.load_state_dict(saved["model"]), mtp.load_state_dict(saved["mtp"])
    model.eval(), mtp.eval()
    f32 = tmp_path / "toy-f32.gguf"
    hf_to_gguf(model, config, f32, recipe="f32", mtp_state=td.mtp_state_dict(mtp))
    engine = ReferenceEngine.load(f32)

    ids = [int(t) for t in np.random.default_rng(3).integers(0, 4000, 14)]
    prefix, nxt = ids[:-1], ids[-1]
    state = engine.new_state()
    engine.prefill(state, prefix)
    draft = engine.mtp_draft(state, nxt, n_draft=2)

    with torch.no_grad():
        x = torch.tensor([ids])
        hidden = model.model(input_ids=x).last_hidden_state               # post-final-norm h_0..h_n
        n = len(prefix)
        h1 = td.mtp_head_outputs(model, mtp, x[:, 1:], hidden[:, :n], start=1)      # pairs (x_i+1, h_i)
        first = model.lm_head(h1[0, -1]).numpy()
        toks = torch.cat([x[:, 1:], torch.tensor([[draft.tokens[0]]])], dim=1)
        hid = torch.cat([hidden[:, :n], h1[:, -1:]], dim=1)                  # chained: (d_1, h'_n)
        second = model.lm_head(td.mtp_head_outputs(model, mtp, toks, hid, start=1)[0, -1]).numpy()

    for ref, ours in ((draft.logits[0], first), (draft.logits[1], second)):
        assert np.abs(ref - ours).max() <= 1e-4 * np.abs(ref).max()
    assert draft.tokens == [int(first.argmax()), int(second.argmax())]
    # A wrong concat order is not a near miss: swapping the halves changes the logits.
    with torch.no_grad():
        fc = mtp.fc.weight
        h = config.hidden_size
        mtp.fc.weight.copy_(torch.cat([fc[:, h:], fc[:, :h]], dim=1))
        swapped = model.lm_head(td.mtp_head_outputs(model, mtp, x[:, 1:], hidden[:, :n], start=1)[0, -1]).numpy()
    assert np.abs(draft.logits[0] - swapped).max() > 1e-2 * np.abs(draft.logits[0]).max()
