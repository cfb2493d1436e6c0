"""Draft vocabulary: the token ids the MTP head's lm_head computes while drafting (issue 7).

The MTP head shares the trunk's lm_head, 248,320 rows of 5,120; a draft step that computes every row reads
as many bytes as the trunk's own lm_head. Restricting the draft logits to the 32,768 most frequent tokens plus
the tokens of the current sequence reads about 7.5x fewer rows. Verification always runs over the full
vocabulary, so the subset can only change how many drafts are accepted, never the output.

A list is built for one vocabulary (ids mean nothing under another), so its file carries that vocabulary's
size and fingerprint, and `draft_ids_for` gives it only to a model whose tokenizer matches: otherwise None,
and the caller drafts over the full vocabulary. Never a silent wrong mapping.

File format (`OJDV`, little-endian):

    offset  size        field
    0       4           magic b"OJDV"
    4       2           format version (1)
    6       2           reserved, 0
    8       4           n_vocab of the tokenizer the list was built for
    12      4           count of ids
    16      16          vocabulary fingerprint (`vocab_fingerprint`)
    32      4 * count   the ids, uint32, strictly increasing, each < n_vocab
    ...     4           crc32 (zlib) of every byte before it
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from gguf import TokenType

from openjet_launcher.errors import OpenJetError

if TYPE_CHECKING:
    from openjet_launcher.text.tokenizer import Tokenizer

MAGIC = b"OJDV"
VERSION = 1
DEFAULT_SIZE = 32_768
# The shipped list, for `full_vocab()` (scripts/build_draft_vocab.py builds it; bench/results/ has its report).
SHIPPED = Path(__file__).resolve().parents[1] / "assets" / "draft-vocab-qwen35.bin"
FINGERPRINT_BYTES = 16

# Tokens the chat template writes or the model emits around its turns: a draft must be able to propose them
# (ending a turn, opening a tool call) whatever their frequency in plain text.
CHAT_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
)  # fmt: skip

_HEADER = struct.Struct("<4sHHII16s")  # magic, version, reserved, n_vocab, count, fingerprint
_CRC = struct.Struct("<I")


class DraftVocabError(OpenJetError):
    """A draft-vocabulary file that cannot be read, or a list that does not fit its vocabulary."""


@dataclass(frozen=True, eq=False)  # ids is an array: compare fields yourself
class DraftVocab:
    """A draft list: sorted unique ids (int32) for the vocabulary of `n_vocab` rows with `fingerprint`."""

    ids: np.ndarray
    n_vocab: int
    fingerprint: bytes


def vocab_fingerprint(vocab: Tokenizer | Sequence[str]) -> bytes:
    """First 16 bytes of sha256 over the token strings (as the GGUF stores them), joined with NUL: equal
    fingerprints mean every id names the same token. Takes a Tokenizer or its token list."""
    if hasattr(vocab, "id_to_piece"):
        vocab = [vocab.id_to_piece(i) for i in range(vocab.n_vocab)]
    return hashlib.sha256("\x00".join(vocab).encode("utf-8", "surrogatepass")).digest()[:FINGERPRINT_BYTES]


# ------------------------------------------------------------------------------------------------ build


def held_out(relative_path: str) -> bool:
    """Corpus files a shipped list is not built from, so its coverage is measured on text it has not seen:
    those whose path relative to their source's root ('json/decoder.py') has a sha256 starting with a 0
    nibble, 1 in 16."""
    return hashlib.sha256(relative_path.encode("utf-8", "surrogatepass")).hexdigest()[0] == "0"


def count_tokens(tokenizer: Tokenizer, texts: Iterable[str], counts: np.ndarray | None = None) -> np.ndarray:
    """Occurrences of every id (int64, n_vocab long) in the encodings of `texts` (as text: special tokens
    are not parsed), added into `counts` when given."""
    if counts is None:
        counts = np.zeros(tokenizer.n_vocab, dtype=np.int64)
    for text in texts:
        ids = tokenizer.encode(text)
        if ids:
            counts += np.bincount(np.asarray(ids, dtype=np.int64), minlength=tokenizer.n_vocab)
    return counts


def required_ids(tokenizer: Tokenizer) -> list[int]:
    """Ids every list of this vocabulary holds: `CHAT_TOKENS` the tokenizer has, and its end-of-generation,
    BOS and EOS ids."""
    ids = {i for i in (tokenizer.token_to_id(t) for t in CHAT_TOKENS) if i is not None}
    ids |= set(tokenizer.eog_ids) | {i for i in (tokenizer.bos_id, tokenizer.eos_id) if i is not None}
    return sorted(ids)


def most_frequent(counts: np.ndarray, size: int, required: Iterable[int] = (), eligible: np.ndarray | None = None
                  ) -> np.ndarray:
    """`required` ids, then the most frequent other `eligible` ids (ties: smaller id first) up to `size`
    ids in all; sorted int32. Zero counts rank by id alone, so the result is defined for any corpus."""
    counts = np.asarray(counts)
    n = len(counts)
    must = np.unique(np.asarray(list(required), dtype=np.int64))
    if must.size and (must[0] < 0 or must[-1] >= n):
        raise DraftVocabError(f"required ids outside the vocabulary of {n} tokens")
    if must.size > size:
        raise DraftVocabError(f"{must.size} required ids do not fit in a list of {size}")
    pool = np.ones(n, dtype=bool) if eligible is None else np.asarray(eligible, dtype=bool).copy()
    pool[must] = False
    cand = np.flatnonzero(pool)
    order = cand[np.lexsort((cand, -counts[cand]))]  # count descending, then id ascending
    chosen = np.concatenate([must, order[: size - must.size]])
    return np.sort(chosen).astype(np.int32)


def build(tokenizer: Tokenizer, texts: Iterable[str], size: int = DEFAULT_SIZE) -> DraftVocab:
    """The draft list of `size` ids for `tokenizer` from the token frequencies of `texts`. Deterministic:
    same texts, same list. UNUSED rows (padding) are never chosen."""
    return from_counts(tokenizer, count_tokens(tokenizer, texts), size)


def from_counts(tokenizer: Tokenizer, counts: np.ndarray, size: int = DEFAULT_SIZE) -> DraftVocab:
    """`build` from counts already taken (`count_tokens` over several sources)."""
    eligible = np.array([tokenizer.token_type(i) != TokenType.UNUSED for i in range(tokenizer.n_vocab)])
    ids = most_frequent(counts, min(size, int(eligible.sum())), required_ids(tokenizer), eligible)
    return DraftVocab(ids, tokenizer.n_vocab, vocab_fingerprint(tokenizer))


# ------------------------------------------------------------------------------------------------- file


def write(path: str | Path, dv: DraftVocab) -> None:
    """Write `dv` in the OJDV format (checked first: the file must read back)."""
    ids = np.asarray(dv.ids, dtype=np.int64)
    _check_ids(ids, dv.n_vocab, str(path))
    if len(dv.fingerprint) != FINGERPRINT_BYTES:
        raise DraftVocabError(f"{path}: a fingerprint is {FINGERPRINT_BYTES} bytes, got {len(dv.fingerprint)}")
    body = _HEADER.pack(MAGIC, VERSION, 0, dv.n_vocab, len(ids), dv.fingerprint) + ids.astype("<u4").tobytes()
    Path(path).write_bytes(body + _CRC.pack(zlib.crc32(body)))


def read(path: str | Path) -> DraftVocab:
    """Read an OJDV file; DraftVocabError naming the file for anything but a well-formed list."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise DraftVocabError(f"cannot read the draft-vocabulary file {path}: {e.strerror or e}") from e
    if len(data) < 4 or data[:4] != MAGIC:
        raise DraftVocabError(f"{path} is not a draft-vocabulary file (magic {data[:4]!r}, expected {MAGIC!r})")
    if len(data) < _HEADER.size + _CRC.size:
        raise DraftVocabError(f"{path} is truncated: {len(data)} bytes, shorter than the header")
    _, version, _, n_vocab, count, fingerprint = _HEADER.unpack_from(data)
    if version != VERSION:
        raise DraftVocabError(f"{path} has draft-vocabulary format version {version}; this OpenJet reads {VERSION}")
    want = _HEADER.size + 4 * count + _CRC.size
    if len(data) != want:
        what = "truncated" if len(data) < want else "longer than its header says"
        raise DraftVocabError(f"{path} is {what}: {len(data)} bytes for {count} ids, expected {want}")
    (crc,) = _CRC.unpack_from(data, want - _CRC.size)
    if crc != zlib.crc32(data[: want - _CRC.size]):
        raise DraftVocabError(f"{path} is corrupt: its checksum does not match its contents")
    ids = np.frombuffer(data, dtype="<u4", count=count, offset=_HEADER.size).astype(np.int64)
    _check_ids(ids, n_vocab, str(path))
    out = ids.astype(np.int32)
    out.flags.writeable = False
    return DraftVocab(out, n_vocab, fingerprint)


def _check_ids(ids: np.ndarray, n_vocab: int, where: str) -> None:
    if ids.size and (ids[0] < 0 or ids[-1] >= n_vocab):
        raise DraftVocabError(f"{where}: ids outside the vocabulary of {n_vocab} tokens")
    if ids.size > 1 and not np.all(np.diff(ids) > 0):
        raise DraftVocabError(f"{where}: ids are not strictly increasing")


# -------------------------------------------------------------------------------------------------- use


@lru_cache(maxsize=4)
def _read_cached(path: Path) -> DraftVocab:
    return read(path)


def draft_ids_for(fingerprint: bytes, n_vocab: int, path: str | Path | None = None) -> np.ndarray | None:
    """The list's ids (sorted int32, read-only) when the list at `path` (default: the shipped one) was built
    for this vocabulary (same fingerprint and n_vocab), else None: draft over the full vocabulary."""
    dv = _read_cached(Path(path) if path is not None else SHIPPED)
    if dv.fingerprint != fingerprint or dv.n_vocab != n_vocab:
        return None
    return dv.ids


def draft_subset(draft_ids: np.ndarray, sequence_ids: Iterable[int] | np.ndarray, n_vocab: int) -> np.ndarray:
    """Sorted unique int32 union of the list and the current sequence's ids: the rows the MTP lm_head computes.
    A token the context already holds is a likely next token, whatever its frequency in the list's corpus."""
    seq = np.asarray(sequence_ids if isinstance(sequence_ids, np.ndarray) else list(sequence_ids), dtype=np.int64)
    if seq.size and (seq.min() < 0 or seq.max() >= n_vocab):
        raise DraftVocabError(f"sequence ids outside the vocabulary of {n_vocab} tokens")
    return np.union1d(np.asarray(draft_ids, dtype=np.int64), seq).astype(np.int32)
