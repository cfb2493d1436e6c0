"""GGUF reading, config checks, recipe classification, synthetic files and the inspect CLI.

Oracles: the numbers of qwen38.md (§2.1 keys, §2.2 unsloth census, §7 Q6_K rule) written here by
hand, and gguf-py's reader/writer for the bytes on disk.
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGUFReader, GGUFWriter
from gguf import GGMLQuantizationType as Q

from openjet_launcher.errors import ModelFileError, OpenJetError
from openjet_launcher.model import quants
from openjet_launcher.model.config import read_config
from openjet_launcher.model.gguf_file import GGUFFile
from openjet_launcher.model.inventory import expected_tensors
from openjet_launcher.model.recipe import MIXED, PLAIN_Q4_K_M, UNSLOTH_Q4_K_M, UNSUPPORTED, classify
from openjet_launcher.model.shape import PRESETS, QWEN38_27B
from openjet_launcher.model.synth import init_rows, plan_tensors, synthesize, vocab_for, write_gguf

TINY = PRESETS["tiny"]


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("synth") / "tiny.gguf"
    synthesize("tiny", path, show_progress=False)
    return path


def write_variant(path, types: dict[str, Q] | None = None, customize=None, drop: set[str] = frozenset()):
    """The tiny model with some tensors re-typed (random bytes of the right size) or dropped."""
    plans = [p for p in plan_tensors(TINY) if p.spec.name not in drop]
    typed = [(p.spec, (types or {}).get(p.spec.name, p.qtype)) for p in plans]
    rng = np.random.default_rng(1)

    def produce(i):
        spec, qtype = typed[i]
        rows = math.prod(spec.ne[1:]) if len(spec.ne) > 1 else 1
        if qtype in (Q.F32, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K):
            return quants.quantize(init_rows(spec, plans[i].seed, 0, rows), qtype)
        block, size = GGML_QUANT_SIZES[qtype]
        return rng.integers(0, 256, (rows, spec.ne[0] // block * size), dtype=np.uint8)

    write_gguf(path, TINY, vocab_for("tiny", TINY), typed, produce, name="variant", customize=customize)
    return path


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "openjet_launcher", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


# --- the 27B plan: census, placement, size -------------------------------------------------------

def test_full_plan_matches_unsloth_census():
    plans = plan_tensors(QWEN38_27B)
    census = Counter(p.qtype.name for p in plans)
    assert len(plans) == 866
    assert census == {"F32": 456, "Q4_K": 294, "Q5_K": 48, "Q6_K": 67, "Q8_0": 1}


def test_full_plan_q6k_placement_follows_use_more_bits_over_65_blocks():
    q6 = {p.spec.name for p in plan_tensors(QWEN38_27B) if p.qtype == Q.Q6_K}
    more_bits = [i for i in range(65) if i < 8 or i >= 56 or (i - 8) % 3 == 2]   # qwen38.md §2.2
    assert len(more_bits) == 33
    for i in range(65):
        assert (f"blk.{i}.ffn_down.weight" in q6) == (i in more_bits)
        v_like = f"blk.{i}.attn_v.weight" if (i + 1) % 4 == 0 or i == 64 else f"blk.{i}.attn_qkv.weight"
        assert (v_like in q6) == (i in more_bits)
    # Confirmed in the real file (qwen38.md §2.2)
    assert {"blk.0.attn_qkv.weight", "blk.0.ffn_down.weight", "blk.3.attn_v.weight", "output.weight"} <= q6


def test_full_plan_size_is_within_one_percent_of_unsloth_file():
    tensor_bytes = sum(p.n_bytes for p in plan_tensors(QWEN38_27B))
    assert abs(tensor_bytes - 17_106_775_008) / 17_106_775_008 < 0.01
    # every row is whole blocks of its type
    for p in plan_tensors(QWEN38_27B):
        assert p.spec.ne[0] % GGML_QUANT_SIZES[p.qtype][0] == 0


def test_full_preset_has_the_spec_shapes():
    names = {s.name: s.ne for s in expected_tensors(QWEN38_27B)}
    assert names["blk.0.attn_qkv.weight"] == (5120, 10240)
    assert names["blk.3.attn_q.weight"] == (5120, 12288)
    assert names["blk.0.ssm_out.weight"] == (6144, 5120)
    assert names["blk.64.nextn.eh_proj.weight"] == (10240, 5120)
    assert names["token_embd.weight"] == (5120, 248320)
    assert names["blk.0.ssm_conv1d.weight"] == (4, 10240)
    assert sum(n.endswith("ssm_out.weight") for n in names) == 48
    assert sum(n.endswith("attn_q.weight") for n in names) == 17      # 16 trunk + MTP


# --- a synthetic tiny file read back -------------------------------------------------------------

def test_tiny_file_reads_back_with_the_preset_config(tiny_path):
    cfg = read_config(GGUFFile(tiny_path))
    assert cfg.shape == TINY
    assert cfg.has_mtp
    assert cfg.warnings == ()
    reader = GGUFReader(tiny_path)                      # gguf-py as the independent reader
    assert reader.fields["general.architecture"].contents() == "qwen35"
    assert reader.fields["qwen35.block_count"].contents() == TINY.n_layer + 1
    assert list(reader.fields["qwen35.rope.dimension_sections"].contents()) == [11, 11, 10, 0]
    assert len(reader.fields["tokenizer.ggml.tokens"].contents()) == TINY.n_vocab


def test_tiny_file_is_unsloth_recipe_and_weights_decode_to_the_init(tiny_path):
    f = GGUFFile(tiny_path)
    verdict = classify(f, read_config(f))
    assert verdict.kind == UNSLOTH_Q4_K_M and verdict.runnable and verdict.has_mtp
    plans = {p.spec.name: p for p in plan_tensors(TINY)}
    reader = {t.name: t for t in GGUFReader(tiny_path).tensors}
    for name in ("blk.0.attn_qkv.weight", "blk.0.ssm_a", "blk.3.attn_q.weight", "output.weight"):
        p = plans[name]
        init = init_rows(p.spec, p.seed, 0, p.rows)
        from gguf.quants import dequantize as gguf_dequantize
        got = gguf_dequantize(np.asarray(reader[name].data), p.qtype).reshape(init.shape)
        rel = np.linalg.norm(got - init) / np.linalg.norm(init)
        assert rel < (1e-7 if p.qtype == Q.F32 else 0.1), (name, rel)


def test_synth_is_deterministic_across_worker_counts(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    synthesize("tiny", a, workers=1, show_progress=False)
    synthesize("tiny", b, workers=2, show_progress=False)
    assert a.read_bytes() == b.read_bytes()
    assert not list(tmp_path.glob("*.part"))


# --- recipes -------------------------------------------------------------------------------------

def test_plain_llama_quantize_recipe_lists_its_conversions(tmp_path):
    retype = {"blk.0.ssm_out.weight": Q.Q4_K, "blk.1.ssm_alpha.weight": Q.Q4_K,
              "blk.1.ssm_beta.weight": Q.Q4_K, "blk.4.nextn.eh_proj.weight": Q.Q4_K}
    f = GGUFFile(write_variant(tmp_path / "plain.gguf", retype))
    v = classify(f, read_config(f))
    assert v.kind == PLAIN_Q4_K_M and v.runnable
    assert sorted(v.conversions) == sorted([
        ("blk.0.ssm_out.weight", "Q4_K", "Q5_K"), ("blk.1.ssm_alpha.weight", "Q4_K", "F32"),
        ("blk.1.ssm_beta.weight", "Q4_K", "F32"), ("blk.4.nextn.eh_proj.weight", "Q4_K", "Q8_0")])


def test_mixed_recipe_lists_per_role_types(tmp_path):
    retype = {"blk.0.ffn_gate.weight": Q.IQ4_XS, "blk.1.ffn_up.weight": Q.Q3_K,
              "blk.2.ffn_up.weight": Q.IQ4_NL, "blk.0.ssm_out.weight": Q.Q8_0}
    f = GGUFFile(write_variant(tmp_path / "mixed.gguf", retype))
    v = classify(f, read_config(f))
    assert v.kind == MIXED and not v.runnable
    assert v.role_types["ffn_gate"]["IQ4_XS"] == 1
    assert v.role_types["ffn_up"] == {"IQ4_NL": 1, "Q3_K": 1, "Q4_K": TINY.n_block - 2}


def test_unsupported_type_names_the_tensor(tmp_path):
    f = GGUFFile(write_variant(tmp_path / "q2k.gguf", {"blk.2.ffn_down.weight": Q.Q2_K}))
    v = classify(f, read_config(f))
    assert v.kind == UNSUPPORTED and not v.runnable
    assert "blk.2.ffn_down.weight is Q2_K" in v.problem


def test_missing_mtp_tensors_is_a_warning_not_an_error(tmp_path):
    mtp = {s.name for s in expected_tensors(TINY) if s.block == TINY.n_layer}
    f = GGUFFile(write_variant(tmp_path / "nomtp.gguf", drop=mtp))
    cfg = read_config(f)
    assert not cfg.has_mtp
    assert any("MTP tensors" in w for w in cfg.warnings)
    v = classify(f, cfg)
    assert v.kind == UNSLOTH_Q4_K_M and not v.has_mtp


# --- config checks -------------------------------------------------------------------------------

@pytest.mark.parametrize("key,value,expected", [
    ("qwen35.rope.freq_base", 10000.0, "10000000.0"),
    ("qwen35.full_attention_interval", 3, "4"),
    ("qwen35.attention.layer_norm_rms_epsilon", 1e-5, "1e-06"),
    ("qwen35.rope.dimension_count", 128, "64"),
    ("qwen35.attention.key_length", 128, "256"),
])
def test_wrong_required_key_names_key_expected_and_found(tmp_path, key, value, expected):
    def customize(w: GGUFWriter):
        kv = w.kv_data[0][key]
        w.add_key_value(key, value, kv.type)
    f = GGUFFile(write_variant(tmp_path / "bad.gguf", customize=customize))
    with pytest.raises(ModelFileError) as e:
        read_config(f)
    msg = str(e.value)
    assert key in msg and f"expected {expected}" in msg and "found" in msg


def test_wrong_rope_sections_and_three_section_files(tmp_path):
    def three(w):
        w.add_rope_dimension_sections([11, 11, 10])
    cfg = read_config(GGUFFile(write_variant(tmp_path / "three.gguf", customize=three)))
    assert cfg.shape.rope_sections == (11, 11, 10, 0)

    def wrong(w):
        w.add_rope_dimension_sections([16, 16, 0, 0])
    with pytest.raises(ModelFileError, match=r"rope.dimension_sections: expected \(11, 11, 10, 0\)"):
        read_config(GGUFFile(write_variant(tmp_path / "wrong.gguf", customize=wrong)))


def test_missing_required_and_optional_keys(tmp_path):
    def no_ctx(w):
        del w.kv_data[0]["qwen35.context_length"]
    cfg = read_config(GGUFFile(write_variant(tmp_path / "noctx.gguf", customize=no_ctx)))
    assert cfg.shape.n_ctx_train == 262144
    assert any("qwen35.context_length" in w for w in cfg.warnings)

    def no_heads(w):
        del w.kv_data[0]["qwen35.attention.head_count"]
    with pytest.raises(ModelFileError, match="required key qwen35.attention.head_count is missing"):
        read_config(GGUFFile(write_variant(tmp_path / "noheads.gguf", customize=no_heads)))


def test_deviations_from_27b_are_reported_for_test_models(tiny_path):
    devs = dict((f, (w, g)) for f, w, g in read_config(GGUFFile(tiny_path)).deviations_from_27b())
    assert devs["n_embd"] == (5120, 256)
    assert "head_dim" not in devs and "n_rot" not in devs


# --- the inspect CLI -----------------------------------------------------------------------------

def test_inspect_tiny_exits_zero_and_reports(tiny_path):
    r = run_cli("inspect", tiny_path)
    assert r.returncode == 0, r.stderr
    assert "unsloth Q4_K_M: runs as is" in r.stdout
    assert "MTP head present" in r.stdout
    assert "F32 36" in r.stdout


def _assert_one_line_error(r, *needles):
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_inspect_truncated_file(tiny_path, tmp_path):
    cut = tmp_path / "cut.gguf"
    data = tiny_path.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    _assert_one_line_error(run_cli("inspect", cut), "truncated")
    head = tmp_path / "head.gguf"           # cut inside the metadata
    head.write_bytes(data[:5000])
    _assert_one_line_error(run_cli("inspect", head), "head.gguf")


def test_inspect_non_gguf_file(tmp_path):
    p = tmp_path / "notes.gguf"
    p.write_text("hello, not a model\n")
    _assert_one_line_error(run_cli("inspect", p), "not a GGUF file")


def test_inspect_other_architecture(tmp_path):
    p = tmp_path / "llama.gguf"
    w = GGUFWriter(p, "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    _assert_one_line_error(run_cli("inspect", p), "'llama'", "expected 'qwen35'")


def test_inspect_unsupported_tensor_type(tmp_path):
    p = write_variant(tmp_path / "q2k.gguf", {"blk.1.attn_gate.weight": Q.Q2_K})
    r = run_cli("inspect", p)
    _assert_one_line_error(r, "blk.1.attn_gate.weight is Q2_K, expected one of")
    assert "recipe    unsupported" in r.stdout


def test_inspect_missing_file():
    _assert_one_line_error(run_cli("inspect", "/nonexistent/model.gguf"), "no such file")


def test_synth_never_writes_through_a_planted_part_file_and_never_takes_a_name_that_appeared(tmp_path):
    """The part file had a fixed name (OUT.part) opened with "wb": a symlink planted there sent the model into the
    link's target (which was then renamed to OUT), and two runs to one OUT shared one .part and mixed their
    tensors. The part file is now created exclusively and uniquely; without --force a file that appears at OUT while
    the model is written is kept, and the run fails saying so."""
    from openjet_launcher.model import synth as synth_module

    victim = tmp_path / "victim.txt"
    victim.write_text("precious data")
    (tmp_path / "x.gguf.part").symlink_to(victim)
    synthesize("tiny", tmp_path / "x.gguf", show_progress=False)
    assert victim.read_text() == "precious data"
    assert (tmp_path / "x.gguf").is_file() and not (tmp_path / "x.gguf").is_symlink()
    assert GGUFFile(tmp_path / "x.gguf").tensors
    assert oct((tmp_path / "x.gguf").stat().st_mode & 0o777) != oct(0o600)        # not the temp file's 0600

    late = tmp_path / "late.gguf"
    real_finish = synth_module.finish_part

    def someone_writes_first(part, path, replace=True):
        path.write_text("someone else's")
        return real_finish(part, path, replace)
    synth_module.finish_part = someone_writes_first
    try:
        with pytest.raises(OpenJetError, match="appeared while the model was written"):
            synthesize("tiny", late, show_progress=False, replace=False)
    finally:
        synth_module.finish_part = real_finish
    assert late.read_text() == "someone else's"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part") and p.name != "x.gguf.part"]


def test_a_write_that_fails_before_its_data_leaves_no_part_file(tmp_path):
    """The part file exists from the start (created exclusively): a failure while the header is made (here a
    customize that raises; in life a vocabulary that does not fit, Ctrl-C) must remove it, as one during the data."""
    def broken(w):
        raise RuntimeError("boom")
    with pytest.raises(RuntimeError, match="boom"):
        write_variant(tmp_path / "a.gguf", customize=broken)
    assert list(tmp_path.iterdir()) == []
