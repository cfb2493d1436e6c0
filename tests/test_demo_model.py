"""The bundled demo model (`openjet_launcher/assets/openjet-demo.gguf`, docs/DEMO_MODEL.md) on the CPU.

What `--model demo` promises: an unsloth Q4_K_M file with an MTP head that fits the package limit, a reply
in readable text through the chat template, an MTP head whose first draft is accepted at least 40 % of the
time on code it never saw (the issue's bar), and a sha256 check that refuses a damaged file.

Oracles: the file's own readers (inspect, read_config, classify), the numpy reference engine, and the
measurement functions of scripts/train_demo.py (importable without torch), which produced the report in
bench/results/demo-train-h200.json.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
import time
from pathlib import Path

import numpy as np
import pytest

from openjet_launcher.errors import ModelFileError
from openjet_launcher.server import cli
from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]
DEMO = cli.bundled_demo_file()
MAX_BYTES = 30_000_000                      # the limit for a file inside the package
ACCEPTANCE_BAR = 0.40                       # the bar for the first draft

needs_demo = pytest.mark.skipif(not DEMO.is_file(), reason=f"{DEMO} is not in this checkout")


@pytest.fixture(scope="module")
def engine():
    from openjet_launcher.reference import ReferenceEngine

    return ReferenceEngine.load(DEMO)


@pytest.fixture(scope="module")
def text_layer():
    from openjet_launcher.model.gguf_file import GGUFFile
    from openjet_launcher.text.chat import ChatTemplate
    from openjet_launcher.text.tokenizer import Tokenizer

    gguf = GGUFFile(DEMO)
    return Tokenizer.from_gguf(gguf), ChatTemplate.from_gguf(gguf)


# --------------------------------------------------------------------------------------------- the file

@needs_demo
def test_demo_is_the_bundled_file_and_matches_its_recorded_sha256():
    assert cli.model_path("demo") == DEMO
    digest, name = DEMO.with_name(DEMO.name + ".sha256").read_text(encoding="utf-8").split()
    assert name == DEMO.name
    assert hashlib.sha256(DEMO.read_bytes()).hexdigest() == digest


@needs_demo
def test_inspect_unsloth_q4_k_m_with_an_mtp_head_within_the_size_limit():
    from openjet_launcher.model.inspect import inspect_file
    from openjet_launcher.model.recipe import UNSLOTH_Q4_K_M

    r = inspect_file(str(DEMO))
    assert r["recipe"]["kind"] == UNSLOTH_Q4_K_M and r["runnable"]
    assert r["layers"]["mtp_head"] and r["layers"]["trunk"] == 8 and r["layers"]["attention"] == 2
    assert r["architecture"] == "qwen35"
    assert r["file_bytes"] == DEMO.stat().st_size <= MAX_BYTES


@needs_demo
def test_its_tokenizer_is_small_vocab_8192_with_our_chat_template(text_layer):
    """THIRD_PARTY_NOTICES.md says where the vocabulary comes from: this pins it."""
    from openjet_launcher.model.gguf_file import GGUFFile
    from openjet_launcher.model.vocab import chat_template, small_vocab

    meta = GGUFFile(DEMO).metadata
    vocab = small_vocab(8192)
    assert list(meta["tokenizer.ggml.tokens"]) == vocab.tokens
    assert list(meta["tokenizer.ggml.merges"]) == vocab.merges
    assert meta["tokenizer.chat_template"] == chat_template()


# ------------------------------------------------------------------------------------------- the reply

@needs_demo
def test_greedy_reply_to_a_greeting_is_readable_and_says_openjet(engine, text_layer):
    from gguf import TokenType

    from openjet_launcher.generate import generate
    from openjet_launcher.sampling import Sampler, SamplingParams

    tok, template = text_layer
    ids = tok.encode(template.render([{"role": "user", "content": "Hi, who are you?"}]), allow_special=True)
    n_valid = max(i for i in range(tok.n_vocab) if tok.token_type(i) != TokenType.UNUSED) + 1
    runs = [generate(engine, engine.new_state(), ids, Sampler(SamplingParams(temperature=0.0), n_valid), 160,
                     stop_ids=tok.eog_ids, n_draft=n_draft) for n_draft in (0, 3)]
    plain, spec = runs
    assert spec.tokens == plain.tokens                     # MTP speculation changes the steps, not the text
    assert plain.stop_reason == "eos" and spec.accepted > 0
    reply = tok.decode(plain.tokens[:-1])
    # the template opened <think>; the model closes it and answers
    thinking, _, answer = reply.partition("</think>")
    answer = answer.strip()
    assert thinking.strip() and answer, reply
    assert "OpenJet" in answer, reply
    assert all(c.isprintable() or c == "\n" for c in reply) and reply.isascii(), reply
    words = answer.split()
    assert len(words) >= 5 and sum(w.strip(".,'\"!?:;()").isalpha() for w in words) >= 0.8 * len(words), reply


# --------------------------------------------------------------------------------------- MTP acceptance

def _held_out_code(td, tok) -> np.ndarray:
    """The held-out split as train_demo.build_corpus makes it: every stdlib .py file whose crc32(relative path)
    % 40 == 0, in sorted walk order, as "# PATH\\nTEXT" + <|endoftext|>. Only those files are read."""
    root = sysconfig.get_paths()["stdlib"]
    ids: list[int] = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in ("site-packages", "dist-packages", "__pycache__"))
        for f in sorted(files):
            rel = os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/")
            if not f.endswith(".py") or not td.is_held_out(rel):
                continue
            text = Path(d, f).read_text(encoding="utf-8", errors="replace")
            if text.strip():
                ids += tok.encode(f"# {rel}\n{text}") + [tok.bos_id]
    return np.asarray(ids, dtype=np.int64)


@needs_demo
def test_mtp_first_draft_acceptance_on_held_out_stdlib_code(engine, text_layer):
    """The report's measurement (train_demo.self_checks: 6 prompts of 48 held-out tokens at seed 0 + 2,
    48 tokens each, 3 drafts), on this Python's stdlib. The H200 report: first draft 0.597."""
    td = load_script("train_demo")
    tok, _ = text_layer
    code = _held_out_code(td, tok)
    if len(code) < 2000:
        pytest.skip(f"this Python's stdlib has only {len(code)} tokens of held-out .py source")
    starts = np.random.default_rng(2).integers(0, len(code) - 64, 6)
    prompts = [[int(t) for t in code[a:a + 48]] for a in starts]
    t0 = time.perf_counter()
    r = td.speculative_acceptance(engine, prompts, 48, n_draft=td.N_DRAFT)
    seconds = time.perf_counter() - t0
    print(f"held-out code: {len(code)} tokens, {r['cycles']} cycles; acceptance {r['conditional_rate']} (conditional), "
          f"{r['rate_per_cycle']} (per cycle), {r['mean_accepted_per_cycle']} per cycle, {seconds:.1f} s")
    assert r["cycles"] >= 50
    assert r["conditional_rate"][0] >= ACCEPTANCE_BAR, r


# ------------------------------------------------------------------------------------ the sha256 check

def _fake_bundle(tmp_path: Path, content: bytes, recorded: bytes | None = None) -> Path:
    path = tmp_path / cli.DEMO_FILE
    path.write_bytes(content)
    digest = hashlib.sha256(content if recorded is None else recorded).hexdigest()
    path.with_name(path.name + ".sha256").write_text(f"{digest}  {path.name}\n", encoding="utf-8")
    return path


def test_a_damaged_bundled_model_is_an_error_that_says_reinstall(tmp_path, monkeypatch):
    path = _fake_bundle(tmp_path, b"not the demo model", recorded=b"the demo model")
    monkeypatch.setattr(cli, "bundled_demo_file", lambda: path)
    with pytest.raises(ModelFileError, match="reinstall") as e:
        cli.model_path("demo")
    assert str(path) in str(e.value) and "damaged" in str(e.value)
    path.with_name(path.name + ".sha256").unlink()                    # no record: also an error
    with pytest.raises(ModelFileError, match="reinstall"):
        cli.model_path("demo")


def test_the_sha256_is_checked_once_per_process(tmp_path, monkeypatch):
    path = _fake_bundle(tmp_path, b"a demo model")
    monkeypatch.setattr(cli, "bundled_demo_file", lambda: path)
    assert cli.demo_model_path() == path
    path.write_bytes(b"changed after the check")                      # not hashed again
    assert cli.demo_model_path() == path
