"""Damaged or wrongly written model files give a ModelFileError naming the key or tensor, never a hang, a traceback
or garbage weights (found in review: each test failed before its fix).

The files are the tiny synthetic model written with one fault (synth.write_gguf, or its bytes patched through
gguf-py's reader), or a few header bytes written by hand.
"""

from __future__ import annotations

import math
import multiprocessing
import shutil
import struct

import numpy as np
import pytest
from gguf import GGUFEndian, GGUFReader, GGUFValueType, GGUFWriter
from gguf import GGMLQuantizationType as Q

from openjet_launcher.errors import ModelFileError, OpenJetError
from openjet_launcher.model import quants
from openjet_launcher.model.config import read_config
from openjet_launcher.model.gguf_file import GGUFFile
from openjet_launcher.model.recipe import PLAIN_Q4_K_M, classify
from openjet_launcher.model.reencode import reencode
from openjet_launcher.model.shape import PRESETS
from openjet_launcher.model.synth import init_rows, plan_tensors, vocab_for, write_gguf

TINY = PRESETS["tiny"]


def write_tiny(path, customize=None, types: dict[str, Q] | None = None, drop: frozenset[str] = frozenset()):
    """The tiny model, with extra metadata written by ``customize(writer)``, some tensors re-typed, some dropped."""
    plans = [p for p in plan_tensors(TINY) if p.spec.name not in drop]
    typed = [(p.spec, (types or {}).get(p.spec.name, p.qtype)) for p in plans]

    def produce(i):
        spec, qtype = typed[i]
        rows = math.prod(spec.ne[1:]) if len(spec.ne) > 1 else 1
        return quants.quantize(init_rows(spec, plans[i].seed, 0, rows), qtype)

    write_gguf(path, TINY, vocab_for("tiny", TINY), typed, produce, name="broken", customize=customize)
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


def refused_in_time(load, timeout: float = 5.0) -> str:
    """The OpenJetError message of ``load()``, run in a forked child: a hang (the bug) is killed there instead of
    spinning on, growing its memory, in a thread of the test run."""
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)

    def child():
        try:
            load()
            send.send(("accepted", ""))
        except OpenJetError as e:
            send.send(("refused", str(e)))
        except BaseException as e:      # noqa: BLE001 - reported to the parent as the failure
            send.send(("crashed", f"{type(e).__name__}: {e}"))

    proc = ctx.Process(target=child, daemon=True)
    proc.start()
    try:
        if not recv.poll(timeout):
            pytest.fail(f"still running after {timeout} s (a hang)")
        outcome, message = recv.recv()
    finally:
        proc.kill()
        proc.join()
    assert outcome == "refused", f"{outcome}: {message}"
    return message


def load_and_classify(path):
    gguf = GGUFFile(path)
    classify(gguf, read_config(gguf))


# --- hangs ------------------------------------------------------------------------------------------------------

def test_array_length_beyond_the_file_is_refused_not_a_hang(tmp_path):
    p = tmp_path / "huge_array.gguf"
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 8) + b"qwen35.x"
    header += struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.UINT8, 1 << 40)
    p.write_bytes(header + bytes(16))                 # 2^40 bytes promised, 16 present
    message = refused_in_time(lambda: GGUFFile(p))
    assert "qwen35.x" in message and "fetch it again" in message


@pytest.mark.parametrize("keys", [{"qwen35.block_count": 0xFFFFFFFD},
                                  {"qwen35.block_count": (1 << 40) + 4, "qwen35.nextn_predict_layers": 1 << 40}],
                         ids=["block_count", "nextn_predict_layers"])
def test_huge_block_count_is_refused_not_a_hang(tmp_path, keys):
    def customize(w: GGUFWriter):
        for k, v in keys.items():
            w.add_key_value(k, v, GGUFValueType.UINT64 if v >= 1 << 32 else GGUFValueType.UINT32)
    p = write_tiny(tmp_path / "blocks.gguf", customize)
    message = refused_in_time(lambda: load_and_classify(p))
    assert list(keys)[-1] in message
    # A file without its MTP block (block_count still counts it) still reads, with a warning.
    mtp = frozenset(plan.spec.name for plan in plan_tensors(TINY) if plan.spec.block == TINY.n_layer)
    no_mtp = write_tiny(tmp_path / "no_mtp.gguf", drop=mtp)
    assert not read_config(GGUFFile(no_mtp)).has_mtp


# --- tracebacks -------------------------------------------------------------------------------------------------

def test_nonfinite_weights_of_a_plain_file_name_the_tensor_being_converted(tmp_path):
    p = write_tiny(tmp_path / "plain.gguf", types={"blk.0.ssm_out.weight": Q.Q4_K})     # as llama-quantize writes
    info = GGUFFile(p).tensors["blk.0.ssm_out.weight"]
    data = bytearray(p.read_bytes())
    data[info.offset:info.offset + 2] = np.float16(np.inf).tobytes()                  # block 0's scale d = +inf
    p.write_bytes(bytes(data))
    gguf = GGUFFile(p)
    verdict = classify(gguf, read_config(gguf))
    assert verdict.kind == PLAIN_Q4_K_M
    with pytest.raises(ModelFileError, match=r"tensor blk\.0\.ssm_out\.weight: cannot convert Q4_K to Q5_K"):
        reencode(gguf, verdict.conversions)           # was a bare ValueError from quants.quantize


def test_metadata_value_of_the_wrong_type_names_the_key(tmp_path):
    def customize(w: GGUFWriter):
        w.add_key_value("qwen35.attention.scale", [0.0625], GGUFValueType.ARRAY, sub_type=GGUFValueType.FLOAT32)
    gguf = GGUFFile(write_tiny(tmp_path / "scale.gguf", customize))
    with pytest.raises(ModelFileError, match=r"qwen35\.attention\.scale: .*found \[0\.0625\]"):
        read_config(gguf)                             # was a TypeError from float([0.0625])


def test_nested_metadata_arrays_are_refused(tmp_path):
    p = tmp_path / "deep.gguf"
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"k" + struct.pack("<I", 9)
    p.write_bytes(header + struct.pack("<IQ", 9, 1) * 5000 + struct.pack("<IQ", 4, 0))
    with pytest.raises(ModelFileError, match="key k: arrays of arrays"):
        GGUFFile(p)                                   # was a RecursionError in gguf-py


# --- wrong answers and unhelpful messages -----------------------------------------------------------------------

def test_truncated_tensor_data_names_the_tensor_and_says_fetch_again(tiny, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny.read_bytes()[:-1000])
    with pytest.raises(ModelFileError) as e:
        GGUFFile(cut)                                 # was "damaged or truncated GGUF header (cannot reshape ...)"
    assert "output.weight" in str(e.value) and "truncated" in str(e.value) and "fetch it again" in str(e.value)
    assert "header" not in str(e.value)


def test_big_endian_file_is_refused(tmp_path):
    p = tmp_path / "be.gguf"
    w = GGUFWriter(p, "qwen35", endianess=GGUFEndian.BIG)
    w.add_tensor("output_norm.weight", np.ones(32, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert GGUFReader(p).byte_order == "S"
    with pytest.raises(ModelFileError, match="big-endian GGUF files are not supported; convert"):
        GGUFFile(p)                                   # was read byte-swapped: garbage weights


@pytest.mark.parametrize("fault", ["overlapping", "misaligned"])
def test_overlapping_or_misaligned_tensor_data_is_refused(tiny, tmp_path, fault):
    p = tmp_path / f"{fault}.gguf"
    shutil.copy(tiny, p)
    r = GGUFReader(p, "r+")
    t = {x.name: x for x in r.tensors}
    name = "blk.0.post_attention_norm.weight" if fault == "overlapping" else "blk.1.attn_norm.weight"
    offset = t[name].field.parts[5]                   # relative to the data section
    offset[0] = t["blk.0.attn_norm.weight"].field.parts[5][0] if fault == "overlapping" else offset[0] + 4
    r.data.flush()
    del r, t, offset
    with pytest.raises(ModelFileError, match=f"tensor {name}: data .*(overlaps|not a multiple of general.alignment)"):
        load_and_classify(p)                          # was accepted as an unsloth Q4_K_M file
