"""The GGUF's byte-level BPE tokenizer, encoding and decoding exactly as llama.cpp does (spec §1.1, §1.2, §2.1).

Encoding runs in two steps, as in llama.cpp's `llama_vocab::impl::tokenize`:

1. Special-token partition (`tokenizer_st_partition`): the text is split on the texts of the CONTROL,
   UNKNOWN and USER_DEFINED tokens, longest first, each occurrence becoming that token's id. Without
   `allow_special` (llama.cpp's `parse_special=false`) CONTROL and UNKNOWN tokens are not matched, so a
   user who types `<|im_end|>` gets the BPE tokens of that text; USER_DEFINED tokens (`<think>`,
   `<tool_call>`, ...) are matched either way, as llama.cpp and HF's added tokens both do. UNUSED rows
   (`[PAD248077]`...) are never matched and never produced.
2. Byte-level BPE (`tokenizers`) on every remaining text fragment: the pre-tokenizer regex of
   `tokenizer.ggml.pre` (behaviour "isolated"), then ByteLevel without its own regex, then the merges.
   No normaliser: llama.cpp does not normalise (with NFC, 3 of llama.cpp's 51 qwen35 vectors differ).

Decoding follows llama.cpp's `token_to_piece`: NORMAL tokens map their GPT-2 byte alphabet back to bytes,
CONTROL tokens give their text (nothing with `skip_special`), USER_DEFINED tokens always give their text,
UNUSED rows give nothing. Text is UTF-8 decoded with U+FFFD for invalid bytes; `StreamingDetokenizer` holds
back an incomplete UTF-8 sequence until the token that completes it arrives.

Python strings may hold surrogate code points (U+D800..U+DFFF), which UTF-8 cannot encode: `encode` turns
each one into U+FFFD (one for one, so offsets into the text stay valid).
"""

from __future__ import annotations

import bisect
import codecs
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from gguf import TokenType

from openjet_launcher.errors import OpenJetError

if TYPE_CHECKING:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.pre_tokenizers import PreTokenizer

    from openjet_launcher.model.gguf_file import GGUFFile

# Pre-tokenizer regexes by `tokenizer.ggml.pre`, as in llama.cpp's llama-vocab.cpp (LLAMA_VOCAB_PRE_TYPE_*).
# qwen35 differs from qwen2 only in that letter runs also take combining marks (\p{M}).
PRE_TOKENIZER_REGEX: dict[str, str] = {
    "qwen35": (
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
        r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
    "qwen2": (
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
        r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
}

# End-of-generation tokens recognised by their text, llama.cpp's list (llama-vocab.cpp, `special_eog_ids`)
# restricted to the Qwen family: the turn and document ends, and the FIM pad / repo / file separators.
_EOG_TEXTS = frozenset({"<|im_end|>", "<|endoftext|>", "<|fim_pad|>", "<|repo_name|>", "<|fim_repo|>", "<|file_sep|>"})
_EOG_ID_KEYS = ("eos", "eot", "eom", "fim_pad", "fim_rep", "fim_sep")  # tokenizer.ggml.{key}_token_id

_SURROGATE = re.compile("[\ud800-\udfff]")
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # llama.cpp BYTE-type token text


class TokenizerError(OpenJetError):
    """A vocabulary we cannot tokenize with, or a token id outside it."""


class TokenizerWarning(UserWarning):
    """A vocabulary that works but will not tokenize exactly like the model was trained."""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, the alphabet of byte-level BPE token strings."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


# str.translate table: byte-alphabet character -> the latin-1 character of its byte.
_UNICODE_TO_BYTE = {ord(ch): chr(b) for b, ch in bytes_to_unicode().items()}


def pre_tokenizer(pre: str = "qwen35") -> PreTokenizer:
    """`tokenizers` pre-tokenizer for a `tokenizer.ggml.pre` value: Split(regex, isolated) + ByteLevel."""
    from tokenizers import Regex, pre_tokenizers

    if pre not in PRE_TOKENIZER_REGEX:
        raise TokenizerError(f"unsupported pre-tokenizer {pre!r}: expected one of {', '.join(PRE_TOKENIZER_REGEX)}")
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRE_TOKENIZER_REGEX[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _bpe(tokens: Sequence[str], token_types: Sequence[int], merges: Sequence[str], pre: str) -> HFTokenizer:
    """Byte-level BPE over every token that is not UNUSED (ids as in the GGUF), no normaliser, no added
    tokens (the special-token partition is ours, see the module docstring)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models

    vocab = {t: i for i, (t, k) in enumerate(zip(tokens, token_types)) if k != TokenType.UNUSED}
    pairs = []
    for rank, m in enumerate(merges):
        cut = m.find(" ", 1)  # as llama.cpp: the first space after the first character
        if cut < 0:
            raise TokenizerError(f"tokenizer.ggml.merges[{rank}] = {m!r} is not two tokens separated by a space")
        pairs.append((m[:cut], m[cut + 1 :]))
    try:
        bpe = HFTokenizer(models.BPE(vocab=vocab, merges=pairs))
    except Exception as e:  # tokenizers raises a bare Exception for a merge naming an unknown token
        raise TokenizerError(f"the BPE merges do not match the vocabulary: {e}") from e
    bpe.pre_tokenizer = pre_tokenizer(pre)
    bpe.decoder = decoders.ByteLevel()
    return bpe


class Tokenizer:
    """The GGUF vocabulary's tokenizer: `encode`/`decode` as llama.cpp, ids as in the model's embedding."""

    def __init__(
        self,
        tokens: Sequence[str],
        token_types: Sequence[int] | None,
        merges: Sequence[str],
        *,
        pre: str = "qwen35",
        bos_id: int | None = None,
        eos_id: int | None = None,
        eog_ids: Iterable[int] = (),
        add_bos: bool = False,
    ):
        """`tokens`, `token_types` (gguf.TokenType; None means all NORMAL) and `merges` as the GGUF stores
        them. `eog_ids` are extra end-of-generation ids; eos and the tokens named in `_EOG_TEXTS` are added."""
        if pre not in PRE_TOKENIZER_REGEX:
            raise TokenizerError(
                f"tokenizer.ggml.pre = {pre!r} is not a Qwen pre-tokenizer: this launcher runs qwen35 models "
                f"(expected 'qwen35')"
            )
        if pre == "qwen2":
            warnings.warn(
                "tokenizer.ggml.pre = 'qwen2': text with combining marks (\\p{M}) will not tokenize as the "
                "model was trained ('qwen35'); re-convert the model with a current llama.cpp",
                TokenizerWarning,
                stacklevel=3,
            )
        self._tokens = list(tokens)
        n = len(self._tokens)
        types = [int(TokenType.NORMAL)] * n if token_types is None else [int(t) for t in token_types]
        if len(types) != n:
            raise TokenizerError(f"{len(types)} token types for {n} tokens")
        self._types = types
        self.pre = pre
        for name, i in (("bos", bos_id), ("eos", eos_id)):
            if i is not None and not 0 <= i < n:
                raise TokenizerError(f"{name} token id {i} is outside the vocabulary of {n} tokens")
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.add_bos = add_bos

        self._token_to_id = {t: i for i, t in enumerate(self._tokens)}  # a repeated string: its last id
        missing = [b for b, ch in bytes_to_unicode().items() if ch not in self._token_to_id]
        if missing:
            raise TokenizerError(f"the vocabulary lacks byte-level tokens for {len(missing)} of the 256 bytes")

        eog = {i for i in eog_ids if 0 <= i < n}
        eog |= {i for i in (eos_id,) if i is not None}
        eog |= {i for i, t in enumerate(self._tokens) if t in _EOG_TEXTS}
        self.eog_ids: frozenset[int] = frozenset(eog)

        # Special-token partition order: longest UTF-8 text first (ties by id), as llama.cpp.
        matched = {TokenType.CONTROL, TokenType.UNKNOWN, TokenType.USER_DEFINED}
        special = sorted(
            ((i, t) for i, (t, k) in enumerate(zip(self._tokens, types)) if k in matched and t),
            key=lambda it: (-len(it[1].encode("utf-8")), it[0]),
        )
        self._always = [(i, t) for i, t in special if types[i] == TokenType.USER_DEFINED]
        self._all_special = special
        self.control_tokens: tuple[str, ...] = tuple(t for i, t in special if types[i] != TokenType.USER_DEFINED)
        self._bpe = _bpe(self._tokens, types, merges, pre)
        # token_bytes tables, built on first decode: every token's bytes, and with CONTROL tokens as b""
        self._tables: tuple[list[bytes], list[bytes]] | None = None

    # ------------------------------------------------------------------------------------------ loading

    @classmethod
    def from_gguf(cls, source: GGUFFile | Mapping[str, object]) -> Tokenizer:
        """From a `GGUFFile` or its `.metadata` dict (the `tokenizer.ggml.*` keys, spec §2.1)."""
        meta: Mapping[str, object] = getattr(source, "metadata", source)
        where = f"{source.path}: " if hasattr(source, "path") else ""
        model = meta.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise TokenizerError(
                f"{where}tokenizer.ggml.model = {model!r}: only byte-level BPE ('gpt2') vocabularies are supported"
            )
        pre = meta.get("tokenizer.ggml.pre", "default")
        tokens, merges = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.merges")
        if not isinstance(tokens, list) or not tokens:
            raise TokenizerError(f"{where}no tokenizer.ggml.tokens: the file has no vocabulary")
        if not isinstance(merges, list):
            raise TokenizerError(f"{where}no tokenizer.ggml.merges: a BPE vocabulary needs its merges")

        def token_id(key: str) -> int | None:
            value = meta.get(f"tokenizer.ggml.{key}_token_id")
            return value if isinstance(value, int) and 0 <= value < len(tokens) else None

        try:
            return cls(
                tokens,
                meta.get("tokenizer.ggml.token_type"),  # type: ignore[arg-type]
                merges,
                pre=pre,  # type: ignore[arg-type]
                bos_id=token_id("bos"),
                eos_id=token_id("eos"),
                eog_ids=[i for i in map(token_id, _EOG_ID_KEYS) if i is not None],
                add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
            )
        except TokenizerError as e:
            raise TokenizerError(f"{where}{e}") from None

    # ------------------------------------------------------------------------------------------ lookups

    @property
    def n_vocab(self) -> int:
        """Number of token rows (the padded embedding size: UNUSED rows included)."""
        return len(self._tokens)

    def token_to_id(self, token: str) -> int | None:
        """Id of a vocabulary string (as stored: byte alphabet for BPE tokens, e.g. 'Ġthe'), or None."""
        return self._token_to_id.get(token)

    def id_to_piece(self, token_id: int) -> str:
        """The vocabulary string of an id, as stored in the GGUF ('Ġthe', '<|im_end|>', '[PAD248077]')."""
        self._check(token_id)
        return self._tokens[token_id]

    def token_type(self, token_id: int) -> TokenType:
        self._check(token_id)
        return TokenType(self._types[token_id])

    def _check(self, token_id: int) -> None:
        if not 0 <= token_id < len(self._tokens):
            raise TokenizerError(f"token id {token_id} is outside the vocabulary of {len(self._tokens)} tokens")

    # ------------------------------------------------------------------------------------------- encode

    def encode(
        self, text: str, allow_special: bool = False, *, literal_spans: Iterable[tuple[int, int]] = ()
    ) -> list[int]:
        """Token ids of `text`, without BOS. `allow_special` lets CONTROL token texts become their ids (a
        rendered chat prompt); without it they are tokenized as text (user content). `literal_spans`
        ([start, end) offsets into `text`) are kept as text even with `allow_special`: see
        `ChatTemplate.render_prompt`, which marks the caller's own strings this way."""
        if not text:
            return []
        if _SURROGATE.search(text):
            text = _SURROGATE.sub("\ufffd", text)
        specials = self._all_special if allow_special else self._always
        ids: list[int] = []
        for part in _partition(text, specials, _merge_spans(literal_spans)):
            if isinstance(part, int):
                ids.append(part)
            else:
                ids.extend(self._bpe.encode(text[part[0] : part[1]], add_special_tokens=False).ids)
        return ids

    # ------------------------------------------------------------------------------------------- decode

    def token_bytes(self, token_id: int, skip_special: bool = False) -> bytes:
        """The bytes a token stands for (llama.cpp's token_to_piece): b'' for UNUSED rows, and for CONTROL
        tokens when `skip_special`. A BPE token may be part of a UTF-8 sequence."""
        self._check(token_id)
        return self._table(skip_special)[token_id]

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of a token sequence; invalid UTF-8 (a sequence cut short) becomes U+FFFD."""
        table, pieces = self._table(skip_special), []
        for i in ids:
            if not 0 <= i < len(table):
                self._check(i)
            pieces.append(table[i])
        return b"".join(pieces).decode("utf-8", errors="replace")

    def _table(self, skip_special: bool) -> list[bytes]:
        tables = self._tables
        if tables is None:  # built once, published in one assignment: another thread sees both tables or none
            pieces = [_piece_bytes(t, k) for t, k in zip(self._tokens, self._types)]
            plain = [b"" if k in (TokenType.CONTROL, TokenType.UNKNOWN) else p for p, k in zip(pieces, self._types)]
            tables = self._tables = (pieces, plain)
        return tables[1] if skip_special else tables[0]


def _piece_bytes(token: str, token_type: int) -> bytes:
    if token_type == TokenType.NORMAL:
        latin = token.translate(_UNICODE_TO_BYTE)
        try:
            return latin.encode("latin-1")
        except UnicodeEncodeError:  # a character outside the byte alphabet: keep it as UTF-8
            return b"".join(c.encode("latin-1") if ord(c) < 256 else c.encode("utf-8") for c in latin)
    if token_type in (TokenType.CONTROL, TokenType.UNKNOWN, TokenType.USER_DEFINED):
        return token.encode("utf-8")
    if token_type == TokenType.BYTE and (m := _BYTE_TOKEN.fullmatch(token)):
        return bytes([int(m.group(1), 16)])
    return b""  # UNUSED


def _merge_spans(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted((s, e) for s, e in spans if e > s):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _partition(text: str, specials: Sequence[tuple[int, str]], literal: list[tuple[int, int]]) -> list:
    """llama.cpp's tokenizer_st_partition: fragments of `text`, each a token id or a (start, end) text
    range, splitting on every special text in the given order. Occurrences overlapping a literal span stay
    text."""
    starts = [s for s, _ in literal]

    def is_literal(start: int, end: int) -> bool:
        k = bisect.bisect_left(starts, end) - 1  # last span starting before `end`
        return k >= 0 and literal[k][1] > start

    parts: list = [(0, len(text))]
    for token_id, special in specials:
        out: list = []
        for part in parts:
            if isinstance(part, int) or text.find(special, part[0], part[1]) < 0:
                out.append(part)
                continue
            begin, end = part
            seg = pos = begin
            while (m := text.find(special, pos, end)) >= 0:
                if literal and is_literal(m, m + len(special)):
                    pos = m + 1
                    continue
                if m > seg:
                    out.append((seg, m))
                out.append(token_id)
                seg = pos = m + len(special)
            if seg < end:
                out.append((seg, end))
        parts = out
    return parts


class StreamingDetokenizer:
    """Text of a token stream, piece by piece: `push` returns the text that became complete, holding back
    an incomplete UTF-8 sequence (an emoji split over two tokens) until the rest arrives; `flush` ends the
    stream (U+FFFD for a sequence that never completed). The concatenation equals `decode` of all ids."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self._tokenizer.token_bytes(token_id, self._skip_special), final=False)

    def flush(self, cut: bool = False) -> str:
        """The held-back rest; the detokenizer is then ready for a new stream. `cut`: the stream was cut short (a
        token limit), so an incomplete sequence is dropped, not a U+FFFD: the next tokens would have completed it."""
        rest = "" if cut else self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return rest
