"""`synth --codes random` (model/synth_codes.py): random k-quant / Q8_0 codes with the init's mean and std.

Oracles: quants.dequantize (equal to gguf-py bit for bit, test_quants.py) for the blocks' statistics,
init_rows for the std each tensor should have, write_gguf (the default mode's writer) for the bytes
write_random puts at each offset, the default-mode file for every tensor the random mode keeps, and the
reference engine for a random-code model that stays finite with spread logits.
"""

from __future__ import annotations

import hashlib
import math
import subprocess
import sys

import gguf
import numpy as np
import pytest
import tokenizers
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader

from openjet_launcher.model import quants
from openjet_launcher.model import synth as S
from openjet_launcher.model import synth_codes as sc
from openjet_launcher.model.shape import PRESETS
from openjet_launcher.reference import ReferenceEngine

TINY = PRESETS["tiny"]

# sha256 of `synth --preset tiny` (default mode, seed 0) written by the tree before synth_codes.py existed
# (f923b6f), with the libraries below: the default mode must keep writing exactly this file.
TINY_DEFAULT_SHA256 = "760e586db101cc482b10993f06bff4ef5b7b1e3ecb3a33ab1b3a7e82ddf67964"
TINY_DEFAULT_LIBS = {"numpy": "2.4.6", "gguf": "0.19.0", "tokenizers": "0.23.3"}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, object]:
    d = tmp_path_factory.mktemp("codes")
    out = {}
    for codes in ("quantised", "random"):
        out[codes] = d / f"tiny-{codes}.gguf"
        summary = S.synthesize("tiny", out[codes], show_progress=False, codes=codes)
        assert summary["codes"] == codes
    return out


def tensors(path) -> dict[str, object]:
    return {t.name: t for t in GGUFReader(path).tensors}


# ------------------------------------------------------------------------------------------ blocks

@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_0])
@pytest.mark.parametrize("std", [1.0, 0.0559, 0.01398, 0.00638, 0.00379])   # token_embd, output, ... ffn_down
def test_random_blocks_have_mean_zero_and_the_intended_std(qtype, std):
    d, s = sc.pick_scales(qtype, std)
    if qtype != Q.Q8_0 or std > 0.005:                    # Q8_0 (no sub-block scale): eh_proj, std 0.0099
        assert d >= np.float16(2.0 ** -14)                 # a normal fp16 scale for every std the 27B needs
    epb, _ = quants.block_size(qtype)
    w = quants.dequantize(sc.random_blocks(qtype, (1 << 20) // epb, d, s, np.random.default_rng(3)), qtype)
    assert np.isfinite(w).all()
    assert abs(w.mean()) < 0.005 * std                     # 1M samples: the mean's own noise is 0.001 std
    assert abs(w.std() / std - 1) < 0.01
    assert abs(float(d) * s * math.sqrt(sc._CODE_VAR[qtype]) / std - 1) < 2.0 ** -10   # the expected std


def test_random_blocks_layouts_decode_as_intended():
    """Each format's fields where ggml reads them: the sub-block scales and mins, Q6_K's alternating signs."""
    rng = np.random.default_rng(0)
    b = sc.random_blocks(Q.Q4_K, 64, np.float16(0.5), 8, rng)
    scales, mins = quants._k4_scales(b[:, 4:16])
    assert (scales == 8).all() and (mins == 60).all()
    assert (b[:, 0:2].view(np.float16) == 0.5).all() and (b[:, 2:4].view(np.float16) == 0.5).all()
    w = quants.dequantize(b, Q.Q4_K)
    assert set(np.unique(w / 4).tolist()) <= {q - 7.5 for q in range(16)}      # d sc (q - 7.5)
    b = sc.random_blocks(Q.Q5_K, 64, np.float16(0.25), 4, rng)
    w = quants.dequantize(b, Q.Q5_K)
    assert len(np.unique(w)) == 32 and np.unique(w).max() == 15.5               # all 32 codes, fifth bit too
    b = sc.random_blocks(Q.Q6_K, 64, np.float16(1), 3, rng)
    assert (b[:, 192:208].view(np.int8) == [3, -3] * 8).all()
    w = quants.dequantize(b, Q.Q6_K).reshape(64, 16, 16)
    assert set(np.unique(w[:, 0::2] / 3).tolist()) == set(range(-32, 32))       # +3 (q - 32)
    assert set(np.unique(w[:, 1::2] / -3).tolist()) == set(range(-32, 32))      # -3 (q - 32)
    b = sc.random_blocks(Q.Q8_0, 4096, np.float16(1), 1, rng)
    w = quants.dequantize(b, Q.Q8_0)
    assert w.min() == -127 and w.max() == 127                                   # -128 read as 0


def test_init_std_is_what_init_rows_draws():
    """Every (role, fan-in) of the 27B that gets random codes: the std init_rows draws, within 1% (64 rows)."""
    seen = set()
    for p in S.plan_tensors(PRESETS["full"]):
        key = (p.spec.role, p.spec.ne[0])
        if p.qtype not in sc.RANDOM_TYPES or key in seen:
            continue
        seen.add(key)
        want = sc.init_std(p.spec)
        assert want is not None, key
        got = S.init_rows(p.spec, p.seed, 0, 64)
        assert abs(got.std() / want - 1) < 0.01, (key, got.std(), want)
    assert {r for r, _ in seen} >= {"token_embd", "output", "attn_qkv", "ffn_down", "ssm_out", "eh_proj"}
    for p in S.plan_tensors(TINY):
        if p.spec.role in ("norm", "ssm_norm", "ssm_conv1d", "ssm_a", "ssm_dt"):
            assert sc.init_std(p.spec) is None and p.qtype == Q.F32


# -------------------------------------------------------------------------------------------- files

def test_random_file_keeps_the_default_files_header_and_float_tensors(files):
    q, r = files["quantised"], files["random"]
    qb, rb = q.read_bytes(), r.read_bytes()
    assert len(qb) == len(rb)
    tq, tr = tensors(q), tensors(r)
    start = min(int(t.data_offset) for t in tq.values())
    assert qb[:start] == rb[:start]                       # metadata, tokenizer, tensor infos
    assert tq.keys() == tr.keys()
    for name, t in tq.items():
        assert (t.tensor_type, int(t.data_offset)) == (tr[name].tensor_type, int(tr[name].data_offset))
        same = np.array_equal(np.asarray(t.data), np.asarray(tr[name].data))
        assert same == (t.tensor_type not in sc.RANDOM_TYPES), name


def test_random_file_tensors_have_the_init_mean_and_std(files):
    plans = {p.spec.name: p for p in S.plan_tensors(TINY)}
    n = 0
    for name, t in tensors(files["random"]).items():
        p = plans[name]
        if p.qtype not in sc.RANDOM_TYPES:
            continue
        w = quants.dequantize(np.asarray(t.data), p.qtype)
        std = sc.init_std(p.spec)
        assert np.isfinite(w).all()
        tol = 6 / math.sqrt(w.size)                       # 6 sigma of the sample mean / std's noise
        assert abs(w.mean()) < tol * std * 2 + 1e-3 * std, name
        assert abs(w.std() / std - 1) < 0.02 + tol, name
        n += 1
    assert n == sum(p.qtype in sc.RANDOM_TYPES for p in plans.values())


def test_default_mode_writes_the_same_file_as_before(files):
    libs = {"numpy": np.__version__, "gguf": _version("gguf", gguf), "tokenizers": tokenizers.__version__}
    if libs != TINY_DEFAULT_LIBS:
        pytest.skip(f"pinned with {TINY_DEFAULT_LIBS}, running {libs}")
    assert hashlib.sha256(files["quantised"].read_bytes()).hexdigest() == TINY_DEFAULT_SHA256


def _version(name, module) -> str:
    from importlib.metadata import version
    return getattr(module, "__version__", None) or version(name)


def test_random_codes_are_the_same_for_any_worker_count_and_at_the_right_offsets(tmp_path, monkeypatch):
    """Small chunks (many per tensor, last one short): workers 1 and 2 write the same file, and it is the
    file write_gguf (the default writer) makes from the same chunks' bytes."""
    monkeypatch.setattr(S, "CHUNK_ELEMENTS", 3 * 256 * 11)
    plans = S.plan_tensors(TINY)
    assert max(len(list(S._chunks(p))) for p in plans) > 100
    a, b, c = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    S.synthesize("tiny", a, workers=1, show_progress=False, codes="random")
    S.synthesize("tiny", b, workers=2, show_progress=False, codes="random")

    def produce(i):
        return np.concatenate([sc.encode_chunk(ch) for ch in S._chunks(plans[i])], axis=0)

    S.write_gguf(c, TINY, S.vocab_for("tiny", TINY), [(p.spec, p.qtype) for p in plans], produce,
                 name="OpenJet synthetic Qwen3.8 (tiny)")
    assert a.read_bytes() == b.read_bytes() == c.read_bytes()
    assert not list(tmp_path.glob("*.part"))


@pytest.mark.parametrize("n_layer", [4, 64])
def test_random_code_model_runs_in_the_reference_engine(n_layer, files, tmp_path):
    """Finite activations and spread logits, as with the quantised init (test_reference_engine): the tiny
    file, and the same width 64 layers deep (the 27B's depth)."""
    if n_layer == TINY.n_layer:
        path = files["random"]
    else:
        shape = TINY.with_(n_layer=n_layer)
        path = tmp_path / "tiny-64L.gguf"
        sc.write_random(path, shape, S.vocab_for("tiny", shape), S.plan_tensors(shape), name="64 layers")
    ref = ReferenceEngine.load(path)
    n_tok = 64 if n_layer == TINY.n_layer else 16
    out = ref.prefill(ref.new_state(), np.random.default_rng(1).integers(0, TINY.n_vocab, n_tok), all_logits=True)
    assert np.isfinite(out.logits).all() and np.isfinite(out.hidden).all()
    assert out.logits.std() > 1.0 and len(set(out.logits.argmax(-1).tolist())) > n_tok // 4


def test_synth_cli_offers_codes(tmp_path):
    help_text = subprocess.run([sys.executable, "-m", "openjet_launcher", "synth", "--help"],
                               capture_output=True, text=True, check=True).stdout
    assert "--codes" in help_text and "random" in help_text
    with pytest.raises(Exception, match="unknown codes"):
        S.synthesize("tiny", tmp_path / "x.gguf", show_progress=False, codes="zeros")
