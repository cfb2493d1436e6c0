"""Draft vocabulary: the token ids the MTP head's lm_head computes while drafting (issue 7).

The MTP head shares the trunk's lm_head, 248,320 rows of 5,120; a draft step that computes every row reads
as many bytes as the trunk's own lm_head. Restricting the draft logits to the 32,768 most frequent tokens plus
the tokens of the current sequence reads about 7.5x fewer rows. Verification always runs over the full
vocabulary, so the subset can only change how many drafts are accepted, never the output.

A list is built with one vocabulary but stored by token STRING (as `tokenizer.ggml.tokens` spells them, e.g.
'Ġthe', '<|im_end|>'), so it serves any model whose vocabulary has those strings, whatever their ids:
`draft_ids_for` maps each string to the one id that carries exactly that string in the model's token list,
drops strings the model lacks (or holds at more than one id: never a guess), and says how many it found.
When fewer than `MIN_SHARE` of the list's tokens are found (a vocabulary of another family) it refuses:
ids None with the reason, and the caller drafts over the full vocabulary. Never a silent wrong mapping.

File format (`OJDV` version 2, little-endian):

    offset  size        field
    0       4           magic b"OJDV"
    4       2           format version (2)
    6       2           reserved, 0
    8       4           count of tokens
    12      4           n_vocab of the vocabulary the list was built with (information only)
    16      16          that vocabulary's fingerprint (`vocab_fingerprint`; information only)
    32      4           length L of the body
    36      L           the body: a zlib stream of the tokens' UTF-8 strings joined with NUL, in strictly
                        increasing byte order (so each token once; no token is empty or holds a NUL)
    36+L    4           crc32 (zlib) of every byte before it

Version 1 stored ids of the build vocabulary and only served a vocabulary with the same fingerprint.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
import zlib
from collections import OrderedDict
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
VERSION = 2
DEFAULT_SIZE = 32_768
# Rows an engine keeps beside the list for the current sequence's own tokens (a token the context holds is a likely
# next one): a fixed room, reserved with the list, so that serving never grows the buffer (launcher/memory.py counts
# list + room); a sequence with more new tokens than this drafts over the first ones (the rows then depend on the
# sequence alone, so a seeded request drafts the same q whatever came before it).
SEQUENCE_ROWS = 8_192
# A list maps onto a vocabulary when at least this share of its tokens are found there; below, the
# vocabulary is of another family and the list would draft over the wrong tokens' neighbourhood.
MIN_SHARE = 0.5
# The shipped list, built with `full_vocab()` (scripts/build_draft_vocab.py builds it; bench/results/ has its report).
SHIPPED = Path(__file__).resolve().parents[1] / "assets" / "draft-vocab-qwen35.bin"
FINGERPRINT_BYTES = 16
MAX_BODY = 64 << 20  # decompressed bytes a file may hold: a bound for corrupt or hostile input

# Tokens the chat template writes or the model emits around its turns: a draft must be able to propose them
# (ending a turn, opening a tool call) whatever their frequency in plain text.
CHAT_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
)  # fmt: skip

_HEADER = struct.Struct("<4sHHII16sI")  # magic, version, reserved, count, n_vocab, fingerprint, body length
_CRC = struct.Struct("<I")
_ENC = ("utf-8", "surrogatepass")  # as vocab_fingerprint: a lone surrogate round-trips instead of failing


class DraftVocabError(OpenJetError):
    """A draft-vocabulary file that cannot be read, or a list that does not fit its vocabulary."""


@dataclass(frozen=True)
class DraftVocab:
    """A draft list: its token strings (unique, sorted by UTF-8 bytes), and the size and fingerprint of the
    vocabulary it was built with (information: the list serves any vocabulary that has its strings)."""

    tokens: tuple[str, ...]
    n_vocab: int
    fingerprint: bytes


@dataclass(frozen=True, eq=False)  # ids is an array: compare fields yourself
class DraftMapping:
    """A list mapped onto one model's vocabulary. `ids`: sorted unique int32 (read-only) ids of the model whose
    string is one of the list's, or None when refused (`reason` says why). `found` of the list's `total`
    strings are in the vocabulary at exactly one id; `ambiguous` are there at several ids and left out."""

    ids: np.ndarray | None
    found: int
    total: int
    ambiguous: int
    reason: str | None
    source: str  # the list's file, for log lines

    @property
    def share(self) -> float:
        """Share of the list's tokens found in the vocabulary (0 for an empty list)."""
        return self.found / self.total if self.total else 0.0

    def describe(self) -> str:
        """One line for a log: what was found, and whether the list is used."""
        amb = f", {self.ambiguous:,} at several ids left out" if self.ambiguous else ""
        head = (f"draft vocabulary {self.source}: {self.found:,} of {self.total:,} tokens "
                f"({100 * self.share:.1f}%) found in the model's vocabulary{amb}")
        if self.ids is None:
            return f"{head}; not used ({self.reason}): drafting over the full vocabulary"
        return f"{head}; drafting over them and the sequence's tokens"


def _token_list(vocab: Tokenizer | Sequence[str]) -> Sequence[str]:
    if hasattr(vocab, "id_to_piece"):
        return [vocab.id_to_piece(i) for i in range(vocab.n_vocab)]
    return vocab


def vocab_fingerprint(vocab: Tokenizer | Sequence[str]) -> bytes:
    """First 16 bytes of sha256 over the token strings (as the GGUF stores them), joined with NUL: equal
    fingerprints mean every id names the same token. Takes a Tokenizer or its token list."""
    return hashlib.sha256("\x00".join(_token_list(vocab)).encode(*_ENC)).digest()[:FINGERPRINT_BYTES]


def _key(token: str) -> bytes:
    return token.encode(*_ENC)


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


def storable(tokenizer: Tokenizer) -> np.ndarray:
    """Ids a list may hold (bool, n_vocab long): not UNUSED (padding), a string the file can store (non-empty,
    no NUL), and the first id of its string (a repeated string is one token of the list)."""
    seen: set[str] = set()
    out = np.zeros(tokenizer.n_vocab, dtype=bool)
    for i in range(tokenizer.n_vocab):
        s = tokenizer.id_to_piece(i)
        if s in seen:
            continue
        seen.add(s)
        out[i] = bool(s) and "\x00" not in s and tokenizer.token_type(i) != TokenType.UNUSED
    return out


def build(tokenizer: Tokenizer, texts: Iterable[str], size: int = DEFAULT_SIZE) -> DraftVocab:
    """The draft list of `size` tokens for `tokenizer` from the token frequencies of `texts`. Deterministic:
    same texts, same list. UNUSED rows (padding) are never chosen."""
    return from_counts(tokenizer, count_tokens(tokenizer, texts), size)


def from_counts(tokenizer: Tokenizer, counts: np.ndarray, size: int = DEFAULT_SIZE) -> DraftVocab:
    """`build` from counts already taken (`count_tokens` over several sources)."""
    eligible = storable(tokenizer)
    required = [i for i in required_ids(tokenizer) if eligible[i]]
    ids = most_frequent(counts, min(size, int(eligible.sum())), required, eligible)
    tokens = tuple(sorted((tokenizer.id_to_piece(int(i)) for i in ids), key=_key))
    return DraftVocab(tokens, tokenizer.n_vocab, vocab_fingerprint(tokenizer))


# ------------------------------------------------------------------------------------------------- file


def write(path: str | Path, dv: DraftVocab) -> None:
    """Write `dv` in the OJDV format, its tokens in byte order (checked first: the file must read back)."""
    if len(dv.fingerprint) != FINGERPRINT_BYTES:
        raise DraftVocabError(f"{path}: a fingerprint is {FINGERPRINT_BYTES} bytes, got {len(dv.fingerprint)}")
    raw = sorted(_key(t) for t in dv.tokens)
    for a, b in zip(raw, raw[1:]):
        if a == b:
            raise DraftVocabError(f"{path}: the token {a.decode(*_ENC)!r} appears twice in the list")
    bad = next((t for t in raw if not t or b"\x00" in t), None)
    if bad is not None:
        raise DraftVocabError(f"{path}: a token string cannot be empty or hold a NUL, got {bad.decode(*_ENC)!r}")
    body = zlib.compress(b"\x00".join(raw), 9)
    head = _HEADER.pack(MAGIC, VERSION, 0, len(raw), dv.n_vocab, dv.fingerprint, len(body)) + body
    Path(path).write_bytes(head + _CRC.pack(zlib.crc32(head)))


def read(path: str | Path) -> DraftVocab:
    """Read an OJDV file; DraftVocabError naming the file for anything but a well-formed list."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise DraftVocabError(f"cannot read the draft-vocabulary file {path}: {e.strerror or e}") from e
    if len(data) < 4 or data[:4] != MAGIC:
        raise DraftVocabError(f"{path} is not a draft-vocabulary file (magic {data[:4]!r}, expected {MAGIC!r})")
    if len(data) < 6:
        raise DraftVocabError(f"{path} is truncated: {len(data)} bytes, shorter than the header")
    (version,) = struct.unpack_from("<H", data, 4)
    if version != VERSION:
        raise DraftVocabError(f"{path} has draft-vocabulary format version {version}; this OpenJet reads "
                              f"{VERSION} (rebuild it with scripts/build_draft_vocab.py)")
    if len(data) < _HEADER.size + _CRC.size:
        raise DraftVocabError(f"{path} is truncated: {len(data)} bytes, shorter than the header")
    _, _, _, count, n_vocab, fingerprint, body_len = _HEADER.unpack_from(data)
    want = _HEADER.size + body_len + _CRC.size
    if len(data) != want:
        what = "truncated" if len(data) < want else "longer than its header says"
        raise DraftVocabError(f"{path} is {what}: {len(data)} bytes for a body of {body_len}, expected {want}")
    (crc,) = _CRC.unpack_from(data, want - _CRC.size)
    if crc != zlib.crc32(data[: want - _CRC.size]):
        raise DraftVocabError(f"{path} is corrupt: its checksum does not match its contents")
    tokens = _parse_body(data[_HEADER.size: _HEADER.size + body_len], count)
    if isinstance(tokens, str):  # the checksum holds, so a writer other than `write` made it
        raise DraftVocabError(f"{path} is malformed: {tokens}")
    return DraftVocab(tokens, n_vocab, fingerprint)


def _parse_body(body: bytes, count: int) -> tuple[str, ...] | str:
    """The tokens of a body, or what is wrong with it."""
    try:
        d = zlib.decompressobj()
        joined = d.decompress(body, MAX_BODY)
        if not d.eof or d.unconsumed_tail or d.unused_data:
            return f"its body is not one zlib stream of at most {MAX_BODY} bytes"
    except zlib.error as e:
        return f"its body does not decompress ({e})"
    raw = joined.split(b"\x00") if joined else []
    if len(raw) != count:
        return f"it holds {len(raw)} tokens, its header says {count}"
    if any(not t for t in raw) or any(a >= b for a, b in zip(raw, raw[1:])):
        return "its tokens are not non-empty and in strictly increasing byte order"
    try:
        return tuple(t.decode(*_ENC) for t in raw)
    except UnicodeDecodeError as e:
        return f"a token is not UTF-8 ({e})"


# -------------------------------------------------------------------------------------------------- use


@lru_cache(maxsize=4)
def _read_cached(path: Path, mtime_ns: int, size: int) -> DraftVocab:  # keyed on the file's state: no stale list
    return read(path)


def load(path: str | Path | None = None) -> DraftVocab:
    """`read`, cached while the file is unchanged. The shipped list when `path` is None."""
    p = Path(path) if path is not None else SHIPPED
    try:
        st = os.stat(p)
    except OSError as e:
        raise DraftVocabError(f"cannot read the draft-vocabulary file {p}: {e.strerror or e}") from e
    return _read_cached(p, st.st_mtime_ns, st.st_size)


@dataclass(frozen=True)
class _Index:
    ids: dict[str, int]  # strings at exactly one id
    repeated: frozenset[str]  # strings at several ids


_INDEXES: OrderedDict[bytes, _Index] = OrderedDict()  # by vocabulary fingerprint, the last few
_INDEX_LOCK = threading.Lock()
_INDEX_KEEP = 4


def _index(tokens: Sequence[str], fingerprint: bytes) -> _Index:
    with _INDEX_LOCK:
        if fingerprint in _INDEXES:
            _INDEXES.move_to_end(fingerprint)
            return _INDEXES[fingerprint]
    ids: dict[str, int] = {}
    repeated = set()
    for i, t in enumerate(tokens):
        if ids.setdefault(t, i) != i:
            repeated.add(t)
    for t in repeated:
        del ids[t]
    index = _Index(ids, frozenset(repeated))
    with _INDEX_LOCK:
        _INDEXES[fingerprint] = index
        while len(_INDEXES) > _INDEX_KEEP:
            _INDEXES.popitem(last=False)
    return index


def map_onto(dv: DraftVocab, vocab: Tokenizer | Sequence[str], *, min_share: float = MIN_SHARE,
             source: str = "(in memory)") -> DraftMapping:
    """The list's tokens as ids of `vocab` (a Tokenizer or its token list, as `tokenizer.ggml.tokens`): each
    string to the one id whose string it exactly is; strings the vocabulary lacks, or holds at several ids,
    are dropped. Refused (ids None, with the reason) when fewer than `min_share` of the list are found."""
    if not 0.0 <= min_share <= 1.0:
        raise ValueError(f"min_share must be within [0, 1], got {min_share}")
    tokens = _token_list(vocab)
    index = _index(tokens, vocab_fingerprint(tokens))
    got = [index.ids.get(t, -1) for t in dv.tokens]
    ids = np.unique(np.asarray([i for i in got if i >= 0], dtype=np.int64)).astype(np.int32)
    ids.flags.writeable = False
    found, total = int(ids.size), len(dv.tokens)
    ambiguous = sum(t in index.repeated for t in dv.tokens)
    reason = None
    if not total:
        reason = "the list is empty"
    elif found < min_share * total:
        reason = (f"only {100 * found / total:.1f}% of its tokens are in this vocabulary, under "
                  f"{100 * min_share:g}%: a vocabulary of another family?")
    return DraftMapping(None if reason else ids, found, total, ambiguous, reason, source)


def draft_ids_for(vocab: Tokenizer | Sequence[str], path: str | Path | None = None, *,
                  min_share: float = MIN_SHARE) -> DraftMapping:
    """The list at `path` (default: the shipped one) mapped onto the model's vocabulary (`map_onto`):
    `.ids` the sorted int32 ids to draft over, or None (`.reason`) to draft over the full vocabulary;
    `.describe()` is the line to log. DraftVocabError for a file that cannot be read."""
    p = Path(path) if path is not None else SHIPPED
    return map_onto(load(p), vocab, min_share=min_share, source=str(p))


def draft_subset(draft_ids: np.ndarray, sequence_ids: Iterable[int] | np.ndarray, n_vocab: int) -> np.ndarray:
    """Sorted unique int32 union of the list and the current sequence's ids: the rows the MTP lm_head computes.
    A token the context already holds is a likely next token, whatever its frequency in the list's corpus."""
    seq = np.asarray(sequence_ids if isinstance(sequence_ids, np.ndarray) else list(sequence_ids), dtype=np.int64)
    if seq.size and (seq.min() < 0 or seq.max() >= n_vocab):
        raise DraftVocabError(f"sequence ids outside the vocabulary of {n_vocab} tokens")
    return np.union1d(np.asarray(draft_ids, dtype=np.int64), seq).astype(np.int32)
