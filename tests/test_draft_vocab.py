"""Draft vocabulary of the MTP head (issue 7): builder, OJDV file (token strings), mapping onto a model's
vocabulary by string, the found-share refusal, union with the sequence.

CPU only. The builder and the file are tested on the small synthetic vocabulary; the shipped list against
`full_vocab()` and llama.cpp's test vocabularies, which need the llama-cpp-python sdist from PyPI (skipped
when it cannot be fetched).
"""

from __future__ import annotations

import importlib.util
import random
import struct
import sysconfig
import zlib
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter, TokenType

from openjet_launcher.errors import OpenJetError
from openjet_launcher.model import draft_vocab as dv
from openjet_launcher.model import vocab
from openjet_launcher.model.gguf_file import GGUFFile
from openjet_launcher.model.sdist import SdistError, llama_cpp_sdist
from openjet_launcher.text.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps.",
    "def f(x):\n    return x * 2\n\nprint(f(21))\n",
    "<think>Plan the answer.</think> Die Sonne scheint. 今天天气很好。",
] * 3
# Held-out stdlib text must keep at least this share of its token occurrences inside the shipped list.
# Measured 0.9909 on 0.8 MB of held-out standard-library code (Python 3.11, bench/results/draft-vocab-qwen35.json).
HELD_OUT_COVERAGE_BAR = 0.98


@pytest.fixture(scope="module")
def small() -> Tokenizer:
    a = vocab.small_vocab()
    return Tokenizer(a.tokens, a.token_types, a.merges, bos_id=a.bos_id, eos_id=a.eos_id)


def a_list(small: Tokenizer, size: int = 300) -> dv.DraftVocab:
    return dv.build(small, TEXTS, size)


# ---------------------------------------------------------------------------------------------------- build


def test_most_frequent_ranks_by_count_then_smaller_id_and_keeps_required_ids():
    counts = np.array([0, 5, 3, 3, 9, 3, 0, 1])
    assert dv.most_frequent(counts, 3).tolist() == [1, 2, 4]  # 9, 5, then the first of three 3s
    assert dv.most_frequent(counts, 4).tolist() == [1, 2, 3, 4]
    assert dv.most_frequent(counts, 4, required=[6]).tolist() == [1, 2, 4, 6]  # 6 has no count, still in
    assert dv.most_frequent(counts, 8).tolist() == list(range(8))  # zero counts rank by id
    eligible = np.array([True] * 7 + [False])
    assert dv.most_frequent(counts, 8, eligible=eligible).tolist() == list(range(7))
    assert dv.most_frequent(counts, 3).dtype == np.int32
    with pytest.raises(dv.DraftVocabError, match="do not fit"):
        dv.most_frequent(counts, 1, required=[0, 6])
    with pytest.raises(dv.DraftVocabError, match="outside"):
        dv.most_frequent(counts, 3, required=[8])


def ids_of(built: dv.DraftVocab, tok: Tokenizer) -> list[int]:
    """The list's ids in the vocabulary it was built with (every string there, exactly once)."""
    return sorted(tok.token_to_id(t) for t in built.tokens)


def test_build_is_deterministic_and_independent_of_text_order(small):
    first, second = a_list(small), a_list(small)
    assert first == second
    assert dv.build(small, list(reversed(TEXTS)), 300) == first
    assert len(first.tokens) == len(set(first.tokens)) == 300
    assert list(first.tokens) == sorted(first.tokens, key=lambda t: t.encode("utf-8"))
    assert (first.n_vocab, first.fingerprint) == (small.n_vocab, dv.vocab_fingerprint(small))


def test_build_takes_the_most_frequent_tokens_and_the_chat_tokens(small):
    counts = dv.count_tokens(small, TEXTS)
    built = a_list(small, 40)
    required = dv.required_ids(small)
    names = {small.id_to_piece(i) for i in required}
    assert {"<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
            "<|endoftext|>"} <= names
    ids = ids_of(built, small)
    assert set(required) <= set(ids)
    rest = [i for i in ids if i not in required]
    others = np.setdiff1d(np.arange(small.n_vocab), ids)
    assert counts[rest].min() >= counts[others].max()  # nothing left out is more frequent than what is in
    # encoding as text: "<think>" (USER_DEFINED) is matched as a token, as the tokenizer always does
    assert counts[small.token_to_id("<think>")] == 3 and counts[small.token_to_id("<|im_start|>")] == 0


def test_build_never_chooses_padding_rows(small):
    built = dv.build(small, TEXTS, small.n_vocab)
    pad = [i for i in range(small.n_vocab) if small.token_type(i) == TokenType.UNUSED]
    assert pad and not set(pad) & set(ids_of(built, small))
    assert len(built.tokens) == small.n_vocab - len(pad)


class _Renamed:
    """A Tokenizer with some ids' strings changed (what from_counts reads of it: no encoding)."""

    def __init__(self, tok: Tokenizer, renamed: dict[int, str]):
        self._tok, self._renamed = tok, renamed
        self.n_vocab, self.eog_ids, self.bos_id, self.eos_id = tok.n_vocab, tok.eog_ids, tok.bos_id, tok.eos_id
        self.token_type = tok.token_type

    def id_to_piece(self, i: int) -> str:
        return self._renamed.get(i, self._tok.id_to_piece(i))

    def token_to_id(self, t: str) -> int | None:
        return next((i for i in range(self.n_vocab) if self.id_to_piece(i) == t), None)


def test_build_takes_a_repeated_string_once_and_skips_strings_the_file_cannot_hold(small, tmp_path):
    counts = dv.count_tokens(small, TEXTS)
    top = np.argsort(-counts, kind="stable")[:3].tolist()
    first, repeat = sorted(top[:2])
    tok = _Renamed(small, {repeat: small.id_to_piece(first), top[2]: "x\x00y"})  # a repeated string; a NUL
    ok = dv.storable(tok)
    assert ok[first] and not ok[repeat] and not ok[top[2]]  # a repeated string counts at its first id
    built = dv.from_counts(tok, counts, 300)
    assert len(built.tokens) == len(set(built.tokens)) == 300
    assert small.id_to_piece(first) in built.tokens and "x\x00y" not in built.tokens
    dv.write(tmp_path / "dv.bin", built)  # and the file can hold it
    assert dv.read(tmp_path / "dv.bin") == built


# --------------------------------------------------------------------------------------------- fingerprint


def test_fingerprint_is_the_same_from_a_tokenizer_a_token_list_and_a_gguf_file(small, tmp_path):
    a = vocab.small_vocab()
    path = tmp_path / "vocab.gguf"
    w = GGUFWriter(str(path), "qwen35")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(a.pre)
    w.add_token_list(a.tokens)
    w.add_token_types(a.token_types)
    w.add_token_merges(a.merges)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    fp = dv.vocab_fingerprint(a.tokens)
    assert len(fp) == 16
    assert dv.vocab_fingerprint(small) == fp == dv.vocab_fingerprint(Tokenizer.from_gguf(GGUFFile(path)))
    changed = list(a.tokens)
    changed[300], changed[301] = changed[301], changed[300]
    assert dv.vocab_fingerprint(changed) != fp
    assert dv.vocab_fingerprint(a.tokens[:-1]) != fp


# ---------------------------------------------------------------------------------------------------- file


def test_file_round_trip(small, tmp_path):
    built = a_list(small)
    path = tmp_path / "dv.bin"
    dv.write(path, built)
    data = path.read_bytes()
    assert data[:4] == b"OJDV" and struct.unpack_from("<HHII", data, 4) == (2, 0, 300, small.n_vocab)
    body = zlib.decompress(data[36:-4])
    assert len(data) == 36 + struct.unpack_from("<I", data, 32)[0] + 4
    assert body.split(b"\x00") == [t.encode("utf-8") for t in built.tokens]  # sorted by bytes, NUL-joined
    back = dv.read(path)
    assert back == built and isinstance(back.tokens, tuple)
    # any order in, byte order out
    dv.write(path, dv.DraftVocab(tuple(reversed(built.tokens)), built.n_vocab, built.fingerprint))
    assert dv.read(path) == built and path.read_bytes() == data
    empty = dv.DraftVocab((), 10, b"\x01" * 16)
    dv.write(path, empty)
    assert dv.read(path) == empty


def test_file_round_trip_of_non_ascii_and_special_tokens(tmp_path):
    tokens = ("<|im_end|>", "ĠçļĦ", "Ġthe", "a", "日本", "\udcff", "é", "[PAD248077]")  # a lone surrogate too
    built = dv.DraftVocab(tokens, 7, b"\x02" * 16)
    dv.write(tmp_path / "dv.bin", built)
    back = dv.read(tmp_path / "dv.bin")
    assert set(back.tokens) == set(tokens) and len(back.tokens) == len(tokens)
    assert list(back.tokens) == sorted(tokens, key=lambda t: t.encode("utf-8", "surrogatepass"))


def test_write_refuses_a_list_that_would_not_read_back(tmp_path):
    fp = b"\x00" * 16
    with pytest.raises(dv.DraftVocabError, match="appears twice"):
        dv.write(tmp_path / "a.bin", dv.DraftVocab(("a", "b", "a"), 10, fp))
    with pytest.raises(dv.DraftVocabError, match="empty or hold a NUL"):
        dv.write(tmp_path / "a.bin", dv.DraftVocab(("a", ""), 10, fp))
    with pytest.raises(dv.DraftVocabError, match="empty or hold a NUL"):
        dv.write(tmp_path / "a.bin", dv.DraftVocab(("a", "b\x00c"), 10, fp))
    with pytest.raises(dv.DraftVocabError, match="16 bytes"):
        dv.write(tmp_path / "a.bin", dv.DraftVocab(("a",), 10, b"short"))
    assert not (tmp_path / "a.bin").exists()


def _with_body(data: bytes, body: bytes, count: int | None = None) -> bytes:
    """`data` (a good file) with another compressed body (and count), its length and checksum made right."""
    head = bytearray(data[:36])
    if count is not None:
        struct.pack_into("<I", head, 8, count)
    struct.pack_into("<I", head, 32, len(body))
    out = bytes(head) + body
    return out + struct.pack("<I", zlib.crc32(out))


def test_damaged_files_give_clear_errors_naming_the_file(small, tmp_path):
    good = tmp_path / "good.bin"
    dv.write(good, a_list(small))
    data = good.read_bytes()

    def error(content: bytes | None) -> str:
        path = tmp_path / "bad.bin"
        path.unlink(missing_ok=True)
        if content is not None:
            path.write_bytes(content)
        with pytest.raises(dv.DraftVocabError) as info:
            dv.read(path)
        assert isinstance(info.value, OpenJetError)
        assert str(path) in str(info.value)
        return str(info.value)

    assert "cannot read" in error(None)
    assert "not a draft-vocabulary file" in error(b"")
    assert "not a draft-vocabulary file" in error(b"GGUF" + data[4:])
    assert "version 1; this OpenJet reads 2" in error(data[:4] + b"\x01\x00" + data[6:])
    assert "version 3" in error(data[:4] + b"\x03\x00" + data[6:])
    for cut in (5, 31, 35, 39, len(data) - 4, len(data) - 1):
        assert "truncated" in error(data[:cut]), cut
    assert "longer than its header says" in error(data + b"\x00")
    assert "truncated" in error(data[:32] + struct.pack("<I", len(data)) + data[36:])  # the body's length
    for at in (10, 20, 40, len(data) // 2, len(data) - 6, len(data) - 2):  # header, body, the checksum
        flipped = bytearray(data)
        flipped[at] ^= 0x10
        assert "corrupt" in error(bytes(flipped)), at
    # the checksum holds but the body is wrong: another writer's file
    tokens = zlib.decompress(data[36:-4]).split(b"\x00")
    assert "malformed" in error(_with_body(data, b"not zlib"))
    assert "malformed" in error(_with_body(data, zlib.compress(b"\x00".join(tokens)) + b"extra"))
    assert "header says 299" in error(_with_body(data, zlib.compress(b"\x00".join(tokens)), 299))
    assert "strictly increasing" in error(_with_body(data, zlib.compress(b"\x00".join(tokens[::-1]))))
    assert "strictly increasing" in error(_with_body(data, zlib.compress(b"\x00".join(tokens[:1] + tokens[:-1]))))
    assert "not UTF-8" in error(_with_body(data, zlib.compress(b"\x00".join(tokens[:-1] + [b"\xff\xfe"]))))
    bomb = zlib.compress(b"a" * (dv.MAX_BODY + 1))
    assert "at most" in error(_with_body(data, bomb, 1))


# ----------------------------------------------------------------------------------------------------- use


def test_draft_ids_for_maps_the_list_onto_its_own_vocabulary(small, tmp_path):
    built = a_list(small)
    path = tmp_path / "dv.bin"
    dv.write(path, built)
    m = dv.draft_ids_for(small, path)
    assert m.ids is not None and m.ids.tolist() == ids_of(built, small)
    assert m.ids.dtype == np.int32 and not m.ids.flags.writeable
    assert (m.found, m.total, m.ambiguous, m.reason, m.share) == (300, 300, 0, None, 1.0)
    assert m.source == str(path) and "300 of 300 tokens (100.0%)" in m.describe()
    same = dv.draft_ids_for(vocab.small_vocab().tokens, path)  # a token list works as well as a Tokenizer
    assert np.array_equal(same.ids, m.ids)
    with pytest.raises(dv.DraftVocabError, match="cannot read"):
        dv.draft_ids_for(small, tmp_path / "absent.bin")


def test_a_shuffled_vocabulary_gets_the_ids_of_the_same_strings(small, tmp_path):
    built = a_list(small)
    path = tmp_path / "dv.bin"
    dv.write(path, built)
    tokens = list(vocab.small_vocab().tokens)
    random.Random(7).shuffle(tokens)
    m = dv.draft_ids_for(tokens, path)
    assert m.ids is not None and m.found == 300
    assert sorted(tokens[i] for i in m.ids) == sorted(built.tokens)  # every id carries one of the list's strings
    assert np.all(np.diff(m.ids) > 0)
    assert m.ids.tolist() != ids_of(built, small)  # other ids: nothing kept from the build vocabulary


def test_a_different_vocabulary_gets_the_strings_it_has_and_no_others(small, tmp_path):
    built = a_list(small, 1000)
    path = tmp_path / "dv.bin"
    dv.write(path, built)
    other = vocab.small_vocab(2048).tokens  # trained on the same text to another size: ids and strings differ
    m = dv.draft_ids_for(other, path)
    shared = set(built.tokens) & set(other)
    assert m.found == len(shared) == len(m.ids) and 500 <= m.found < 1000
    assert {other[i] for i in m.ids} == shared
    assert all(other.index(other[i]) == i for i in m.ids)


def test_a_string_at_several_ids_is_left_out_not_guessed(small, tmp_path):
    built = a_list(small)
    path = tmp_path / "dv.bin"
    dv.write(path, built)
    tokens = list(vocab.small_vocab().tokens)
    twice = built.tokens[5]
    tokens[-1] = twice  # a [PAD] row renamed to a string of the list
    m = dv.draft_ids_for(tokens, path)
    assert (m.found, m.ambiguous) == (299, 1) and "1 at several ids left out" in m.describe()
    assert twice not in {tokens[i] for i in m.ids}


def test_a_vocabulary_with_few_of_the_tokens_is_refused_with_the_reason(tmp_path):
    fp = b"\x00" * 16
    path = tmp_path / "dv.bin"
    dv.write(path, dv.DraftVocab(("a", "b", "c", "d"), 4, fp))
    half = dv.draft_ids_for(["x", "b", "a", "y"], path)
    assert half.ids is not None and half.ids.tolist() == [1, 2] and half.share == 0.5
    few = dv.draft_ids_for(["x", "b", "y", "z"], path)
    assert few.ids is None and (few.found, few.total) == (1, 4)
    assert "25.0%" in few.reason and "under 50%" in few.reason
    assert "not used" in few.describe() and "full vocabulary" in few.describe()
    assert dv.draft_ids_for(["x", "b", "y", "z"], path, min_share=0.25).ids.tolist() == [1]
    assert dv.draft_ids_for(["a", "b", "c", "z"], path, min_share=1.0).ids is None
    with pytest.raises(ValueError):
        dv.draft_ids_for(["a"], path, min_share=1.5)
    dv.write(path, dv.DraftVocab((), 4, fp))
    empty = dv.draft_ids_for(["a", "b"], path)
    assert empty.ids is None and empty.reason == "the list is empty"


def test_the_file_is_read_again_when_it_changes(tmp_path):
    import os

    fp = b"\x00" * 16
    path = tmp_path / "dv.bin"
    dv.write(path, dv.DraftVocab(("a", "b"), 4, fp))
    assert dv.draft_ids_for(["a", "b", "c"], path).ids.tolist() == [0, 1]
    dv.write(path, dv.DraftVocab(("b", "c", "d"), 4, fp))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # a new mtime even on a coarse clock
    assert dv.draft_ids_for(["a", "b", "c"], path).ids.tolist() == [1, 2]


def test_draft_subset_is_the_sorted_union_with_the_sequence():
    ids = np.array([2, 5, 9], dtype=np.int32)
    got = dv.draft_subset(ids, [9, 1, 1, 12, 5], n_vocab=16)
    assert got.tolist() == [1, 2, 5, 9, 12] and got.dtype == np.int32
    assert dv.draft_subset(ids, [], 16).tolist() == [2, 5, 9]
    assert dv.draft_subset(ids, np.array([15], dtype=np.int64), 16).tolist() == [2, 5, 9, 15]
    with pytest.raises(dv.DraftVocabError, match="outside"):
        dv.draft_subset(ids, [16], 16)
    with pytest.raises(dv.DraftVocabError, match="outside"):
        dv.draft_subset(ids, [-1], 16)


# ------------------------------------------------------------------------------------------ the shipped list


@pytest.fixture(scope="module")
def full() -> Tokenizer:
    try:
        llama_cpp_sdist()
    except SdistError as e:
        pytest.skip(f"llama-cpp-python sdist unavailable: {e}")
    a = vocab.full_vocab()
    return Tokenizer(a.tokens, a.token_types, a.merges, bos_id=a.bos_id, eos_id=a.eos_id)


def test_the_shipped_list_reads_and_has_the_default_size():
    shipped = dv.read(dv.SHIPPED)
    assert len(shipped.tokens) == dv.DEFAULT_SIZE and shipped.n_vocab == vocab.FULL_N_VOCAB
    assert {"<|im_end|>", "<|im_start|>", "<think>", "</think>", "<tool_call>", "Ġthe"} <= set(shipped.tokens)
    assert dv.SHIPPED.stat().st_size < 131_108  # smaller than the ids of format 1


@pytest.mark.slow
def test_the_shipped_list_maps_onto_the_full_vocabulary_real_tokens_only(full):
    shipped = dv.read(dv.SHIPPED)
    assert shipped.fingerprint == dv.vocab_fingerprint(full)
    m = dv.draft_ids_for(full)
    assert m.ids is not None and (m.found, m.total, m.ambiguous) == (dv.DEFAULT_SIZE, dv.DEFAULT_SIZE, 0)
    assert [full.id_to_piece(int(i)) for i in m.ids] == sorted(shipped.tokens, key=full.token_to_id)
    assert set(dv.required_ids(full)) <= set(m.ids.tolist())
    fillers = (m.ids >= 151_643) & (m.ids < vocab.FULL_FIRST_ADDED_ID)  # full_vocab's tokens that never encode
    assert not fillers.any() and m.ids.max() < 248_077  # and no [PAD] row


def _test_vocab_tokens(name: str) -> list[str]:
    try:
        from openjet_launcher.model.sdist import sdist_member_path

        path = sdist_member_path(f"vendor/llama.cpp/models/ggml-vocab-{name}.gguf")
    except SdistError as e:
        pytest.skip(f"llama-cpp-python sdist unavailable: {e}")
    return GGUFFile(path).metadata["tokenizer.ggml.tokens"]


@pytest.mark.slow
def test_the_shipped_list_maps_onto_a_vocabulary_with_other_ids_and_refuses_another_family(full):
    """llama.cpp's qwen35 test vocabulary: the Qwen2 BPE at the same ids, but its 3 CONTROL tokens at
    151643..151645 where full_vocab (and a real Qwen3.8) has them at 248044.. and no <think> etc."""
    qwen = _test_vocab_tokens("qwen35")
    assert len(qwen) != full.n_vocab and qwen[151_645] == "<|im_end|>" != full.id_to_piece(151_645)
    m = dv.draft_ids_for(qwen)
    assert m.ids is not None and m.found >= dv.DEFAULT_SIZE - 12 and m.share > 0.99
    assert {qwen[i] for i in m.ids} <= set(dv.read(dv.SHIPPED).tokens)
    assert qwen.index("<|im_end|>") in m.ids and full.token_to_id("<|im_end|>") not in m.ids
    small = dv.draft_ids_for(vocab.small_vocab().tokens)  # a 4,096-token BPE: few of the list's strings
    assert small.ids is None and small.share < 0.1 and "another family" in small.reason


def _held_out_stdlib(max_chars: int) -> list[str]:
    spec = importlib.util.spec_from_file_location("build_draft_vocab", ROOT / "scripts" / "build_draft_vocab.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    root = Path(sysconfig.get_paths()["stdlib"])
    texts, chars = [], 0
    for path in script.stdlib_files():
        if chars < max_chars and dv.held_out(path.relative_to(root).as_posix()):
            text = path.read_text(encoding="utf-8", errors="replace")
            texts.append(text)
            chars += len(text)
    return texts


@pytest.mark.slow
def test_held_out_standard_library_text_is_mostly_inside_the_shipped_list(full):
    texts = _held_out_stdlib(400_000)
    assert sum(map(len, texts)) > 100_000
    in_list = np.zeros(full.n_vocab, dtype=bool)
    in_list[dv.draft_ids_for(full).ids] = True
    seq = np.concatenate([np.asarray(full.encode(t), dtype=np.int64) for t in texts])
    share = float(in_list[seq].mean())
    print(f"held-out stdlib: {seq.size} tokens, {share:.4f} inside the shipped list")
    assert share >= HELD_OUT_COVERAGE_BAR
