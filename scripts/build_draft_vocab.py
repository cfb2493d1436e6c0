#!/usr/bin/env python3
"""Build the shipped draft vocabulary (issue 7) from text found on this machine, and report what it covers.

    python scripts/build_draft_vocab.py                       # -> openjet_launcher/assets/draft-vocab-qwen35.bin
    python scripts/build_draft_vocab.py --out /tmp/dv.bin --size 16384 --doc-mb 0 --man-mb 0

The list is built with `full_vocab()` (openjet_launcher/model/vocab.py): the 248,320 rows of Qwen3.5/3.8 with
the real added tokens at their real ids, whose BPE part is llama.cpp's qwen35 test vocabulary (the Qwen2 BPE,
ids 0..151642) followed by filler tokens that never encode; so the list holds real tokens only. It is stored
by token string (format 2), so it maps onto any vocabulary that has those strings, a real Qwen3.8 GGUF's
included, whose ids above 151,642 differ; the report records how much of it maps onto llama.cpp's test
vocabularies of other models (--map-onto).

Text, each source walked in sorted order, files cut at a per-file cap, and under a source's total cap the
files taken in the order of the sha256 of their names (a spread over the whole tree, not its first letters):
* stdlib: the Python standard library's .py files (no site-packages, no test suites), as code;
* docstrings: the module, class and function docstrings of the same files, as prose (counted again);
* doc: README, NEWS, changelog, .md, .rst and .txt files under /usr/share/doc (gzip read), deduplicated;
* man: English man pages (/usr/share/man/man1..8), troff requests and escapes stripped;
* locale: translated program messages (.mo msgstr; not the iso-codes and keyboard-name catalogs) of nine
  widely used languages, so the list has their common tokens.
Files that draft_vocab.held_out names (by relative path) are left out and used to measure the list's
coverage: the share of token occurrences inside the list, and inside the list or earlier in the same file
(the union the engine drafts over). The JSON report records sources, sizes, digests, timings and those figures.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import json
import os
import platform
import re
import struct
import sys
import sysconfig
import time
import warnings
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from openjet_launcher.model import draft_vocab as dv  # noqa: E402
from openjet_launcher.model import vocab  # noqa: E402
from openjet_launcher.text.tokenizer import Tokenizer  # noqa: E402

STDLIB_SKIP = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
DOC_NAMES = re.compile(r"(README|NEWS|changelog|CHANGES|HISTORY|TODO|FAQ)[^/]*$|\.(md|rst|txt)(\.gz)?$", re.I)
LOCALES = ("zh_CN", "ja", "ko", "ru", "de", "fr", "es", "pt_BR", "it")

Source = Iterator[tuple[str, Callable[[], str | None]]]  # (name, reader) in sorted order


# ----------------------------------------------------------------------------------------------- sources


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py")
                  if not STDLIB_SKIP.intersection(p.relative_to(root).parts[:-1]))


def stdlib_source() -> Source:
    root = Path(sysconfig.get_paths()["stdlib"])
    for p in stdlib_files():
        yield f"stdlib/{p.relative_to(root).as_posix()}", lambda p=p: _read_text(p.read_bytes())


def docstring_source() -> Source:
    root = Path(sysconfig.get_paths()["stdlib"])
    for p in stdlib_files():
        yield f"docstrings/{p.relative_to(root).as_posix()}", lambda p=p: docstrings(p.read_bytes())


def docstrings(source: bytes) -> str | None:
    """The module, class and function docstrings of a Python file, blank-line separated."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # invalid escape sequences in old code
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            return None
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docs = [d for n in ast.walk(tree) if isinstance(n, kinds) and (d := ast.get_docstring(n))]
    return "\n\n".join(docs) or None


def doc_source() -> Source:
    root = Path("/usr/share/doc")
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and DOC_NAMES.search(p.name))
    for p in files:
        yield f"doc/{p.relative_to(root).as_posix()}", lambda p=p: _read_text(_maybe_gunzip(p))


def man_source() -> Source:
    root = Path("/usr/share/man")
    files = sorted(p for d in sorted(root.glob("man[1-8]")) for p in d.iterdir()
                   if p.is_file() and not p.is_symlink())
    for p in files:
        yield f"man/{p.relative_to(root).as_posix()}", lambda p=p: man_text(_read_text(_maybe_gunzip(p)))


def locale_source() -> Source:
    root = Path("/usr/share/locale")
    files = sorted(p for lang in LOCALES for p in (root / lang / "LC_MESSAGES").glob("*.mo")
                   if p.is_file() and not p.is_symlink() and not p.name.startswith(("iso", "xkeyboard")))
    for p in files:
        yield f"locale/{p.relative_to(root).as_posix()}", lambda p=p: mo_messages(p.read_bytes())


SOURCES: dict[str, Callable[[], Source]] = {
    "stdlib": stdlib_source, "docstrings": docstring_source, "doc": doc_source, "man": man_source,
    "locale": locale_source,
}


def _maybe_gunzip(p: Path) -> bytes:
    data = p.read_bytes()
    if data[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(data)
        except (OSError, EOFError):
            return b""
    return data


def _read_text(data: bytes) -> str | None:
    """UTF-8 text, or None for binary or other encodings (no NUL bytes, strict decoding)."""
    if b"\x00" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


_TROFF_SPECIAL = {"em": "—", "en": "–", "lq": "“", "rq": "”", "oq": "‘", "cq": "’", "aq": "'", "dq": '"',
                  "bu": "•", "co": "©", "rg": "®", "mu": "×", "di": "÷", "+-": "±", "<=": "≤", ">=": "≥",
                  "->": "→", "<-": "←", "ti": "~", "ha": "^", "dg": "†", "de": "°", "Fo": "«", "Fc": "»"}
_TEXT_REQUESTS = {"SH", "SS", "B", "I", "BR", "RB", "IR", "RI", "BI", "IB", "SM", "SB", "Nd", "Sh", "Ss"}


def man_text(src: str | None) -> str | None:
    """Readable text of a troff man page: text lines and the arguments of font/heading requests, escapes
    mapped or dropped. Approximate, and enough for token statistics."""
    if not src:
        return None
    out = []
    for line in src.splitlines():
        if line.startswith('\\"'):  # a comment line
            continue
        if line[:1] in (".", "'"):
            m = re.match(r"[.']\s*(\S+)\s*(.*)", line)
            if not m or m.group(1) not in _TEXT_REQUESTS:
                continue
            line = m.group(2).replace('"', "")
        line = re.sub(r"\\f(\[[^\]]*\]|\(..|.)", "", line)
        line = re.sub(r"\\\((..)", lambda m: _TROFF_SPECIAL.get(m.group(1), ""), line)
        line = re.sub(r"\\\[(\w+)\]", lambda m: _TROFF_SPECIAL.get(m.group(1), ""), line)
        line = re.sub(r"\\\*(\(..|\[[^\]]*\]|.)", "", line)
        line = re.sub(r"\\[sn][-+]?(\(..|\[[^\]]*\]|\d)", "", line)
        line = re.sub(r"\\[mu]\[[^\]]*\]|\\[ud]", "", line)  # colour, superscript (docbook's link marks)
        line = line.replace("\\-", "-").replace("\\e", "\\").replace("\\ ", " ").replace("\\~", " ")
        line = re.sub(r"\\[&,/|^%:)c]", "", re.sub(r'\\".*$', "", line))
        out.append(line)
    text = "\n".join(out).strip()
    return text or None


def mo_messages(data: bytes) -> str | None:
    """The translated strings (msgstr, plural forms too) of a GNU .mo catalog, one per line; None unless UTF-8."""
    if len(data) < 20:
        return None
    magic = struct.unpack_from("<I", data)[0]
    order = "<" if magic == 0x950412DE else ">" if magic == 0xDE120495 else None
    if order is None:
        return None
    try:
        n, _, trans = struct.unpack_from(order + "III", data, 8)
        texts = []
        for i in range(n):
            length, offset = struct.unpack_from(order + "II", data, trans + 8 * i)
            texts.extend(s for s in data[offset:offset + length].split(b"\x00") if s)
    except struct.error:
        return None
    if texts and texts[0].lower().startswith(b"project-id-version"):  # the header entry (msgid "")
        texts = texts[1:]
    try:
        return "\n".join(t.decode("utf-8") for t in texts) or None
    except UnicodeDecodeError:
        return None


# ------------------------------------------------------------------------------------------------- build


def select(source: Source, cap_bytes: int, file_cap: int, held_cap: int
           ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(build texts, held-out texts) of one source, each in name order: files cut at `file_cap` characters,
    duplicates dropped, read in sha256-of-name order until `cap_bytes` of UTF-8 to build from and `held_cap`
    characters held out (the file that crosses a cap is kept whole)."""
    build, held, seen = [], [], set()
    build_bytes = held_chars = 0
    for name, reader in sorted(source, key=lambda nr: hashlib.sha256(nr[0].encode("utf-8", "surrogatepass")).digest()):
        if build_bytes >= cap_bytes and held_chars >= held_cap:
            break
        is_held = dv.held_out(name.split("/", 1)[1])  # by relative path: a file and its docstrings together
        if (held_chars >= held_cap) if is_held else (build_bytes >= cap_bytes):
            continue
        text = reader()
        if not text:
            continue
        text = text[:file_cap]
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
        if digest in seen:
            continue
        seen.add(digest)
        if is_held:
            held.append((name, text))
            held_chars += len(text)
        else:
            build.append((name, text))
            build_bytes += len(text.encode("utf-8", "surrogatepass"))
    return sorted(build), sorted(held)


def corpus_digest(items: list[tuple[str, str]]) -> str:
    h = hashlib.sha256()
    for name, text in items:
        h.update(name.encode("utf-8", "surrogatepass") + b"\x00")
        h.update(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest())
    return h.hexdigest()


def coverage(tok: Tokenizer, ids: np.ndarray, texts: list[tuple[str, str]]) -> dict:
    """Share of token occurrences of `texts` inside the list; and inside the list or earlier in the same text."""
    in_list = np.zeros(tok.n_vocab, dtype=bool)
    in_list[ids] = True
    total = hit = hit_seq = chars = 0
    for _, text in texts:
        chars += len(text)
        seq = np.asarray(tok.encode(text), dtype=np.int64)
        if not seq.size:
            continue
        first = np.zeros(seq.size, dtype=bool)
        first[np.unique(seq, return_index=True)[1]] = True  # first occurrence of each id in this text
        total += seq.size
        hit += int(in_list[seq].sum())
        hit_seq += int((in_list[seq] | ~first).sum())
    return {"files": len(texts), "chars": chars, "tokens": total,
            "in_list": round(hit / total, 5) if total else None,
            "in_list_or_sequence": round(hit_seq / total, 5) if total else None}


def llama_cpp_vocab_tokens(name: str) -> list[str]:
    """tokenizer.ggml.tokens of llama.cpp's test vocabulary ggml-vocab-NAME.gguf (from the llama-cpp-python
    sdist), read as the launcher reads a model's (GGUFFile: UTF-8, invalid bytes replaced)."""
    from openjet_launcher.model.gguf_file import GGUFFile
    from openjet_launcher.model.sdist import sdist_member_path

    return GGUFFile(sdist_member_path(f"vendor/llama.cpp/models/ggml-vocab-{name}.gguf")).metadata[
        "tokenizer.ggml.tokens"]


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: give at least 1")
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=dv.SHIPPED)
    ap.add_argument("--report", type=Path, default=ROOT / "bench" / "results" / "draft-vocab-qwen35.json")
    ap.add_argument("--size", type=_positive, default=dv.DEFAULT_SIZE)
    ap.add_argument("--stdlib-mb", type=float, default=16.0, help="cap on standard-library code")
    ap.add_argument("--docstrings-mb", type=float, default=8.0, help="cap on standard-library docstrings")
    ap.add_argument("--doc-mb", type=float, default=12.0, help="cap on /usr/share/doc text")
    ap.add_argument("--man-mb", type=float, default=12.0, help="cap on English man pages")
    ap.add_argument("--locale-mb", type=float, default=2.0, help="cap on translated messages")
    ap.add_argument("--file-kb", type=float, default=256.0, help="characters kept per file, in thousands")
    ap.add_argument("--map-onto", nargs="*", default=["qwen35", "llama-bpe", "gpt-2", "gemma-4"],
                    help="llama.cpp test vocabularies (ggml-vocab-NAME.gguf) to map the list onto, for the report")
    ap.add_argument("--held-out-mb", type=float, default=2.0, help="held-out characters measured per source")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    assets = vocab.full_vocab()
    tok = Tokenizer(assets.tokens, assets.token_types, assets.merges)
    t_vocab = time.perf_counter() - t0

    counts = np.zeros(tok.n_vocab, dtype=np.int64)
    report_sources, held_by_source, t_read = {}, {}, 0.0
    for key, make in SOURCES.items():
        cap = getattr(args, f"{key}_mb") * 1e6
        t1 = time.perf_counter()
        build, held = select(make(), int(cap), int(args.file_kb * 1000), int(args.held_out_mb * 1e6))
        t2 = time.perf_counter()
        before = int(counts.sum())
        dv.count_tokens(tok, (text for _, text in build), counts)
        t3 = time.perf_counter()
        t_read += t2 - t1
        held_by_source[key] = held
        report_sources[key] = {
            "files": len(build), "held_out_files": len(held),
            "chars": sum(len(t) for _, t in build),
            "bytes": sum(len(t.encode("utf-8", "surrogatepass")) for _, t in build),
            "tokens": int(counts.sum()) - before, "cap_mb": cap / 1e6,
            "digest": corpus_digest(build), "read_s": round(t2 - t1, 2), "encode_s": round(t3 - t2, 2),
        }
        print(f"{key}: {len(build)} files, {report_sources[key]['bytes'] / 1e6:.2f} MB, "
              f"{report_sources[key]['tokens']} tokens ({t2 - t1:.1f} s read, {t3 - t2:.1f} s encode)", flush=True)

    t4 = time.perf_counter()
    try:
        built = dv.from_counts(tok, counts, args.size)
    except dv.DraftVocabError as e:
        raise SystemExit(f"build_draft_vocab: {e}") from None
    own = dv.map_onto(built, tok, min_share=1.0)  # every string at its one id of the build vocabulary
    assert own.ids is not None and own.found == len(built.tokens) == len(own.ids), own.describe()
    ids = own.ids
    real_bpe = int(np.sum(ids < 151_643))
    fillers = int(np.sum((ids >= 151_643) & (ids < vocab.FULL_FIRST_ADDED_ID)))
    if fillers:  # checked before anything is written: --out is the shipped list by default
        raise SystemExit(f"build_draft_vocab: {fillers} filler tokens in the list: they never encode; "
                         f"{args.out} left as it was")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    dv.write(tmp, built)
    back = dv.read(tmp)
    assert back == built, "the list does not read back"
    os.replace(tmp, args.out)
    t_select = time.perf_counter() - t4
    t_build = time.perf_counter() - t0
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, {len(built.tokens)} tokens) in {t_build:.1f} s",
          flush=True)
    cov = {key: coverage(tok, ids, held) for key, held in held_by_source.items() if held}
    t_total = time.perf_counter() - t0
    for key, c in cov.items():
        print(f"held-out {key}: {c['tokens']} tokens, in list {c['in_list']}, "
              f"in list or sequence {c['in_list_or_sequence']}")
    mapped = {}
    for name in args.map_onto:
        t5 = time.perf_counter()
        tokens = llama_cpp_vocab_tokens(name)
        m = dv.draft_ids_for(tokens, args.out)
        mapped[name] = {"n_vocab": len(tokens), "found": m.found, "ambiguous": m.ambiguous,
                        "share": round(m.share, 5), "used": m.ids is not None,
                        "seconds": round(time.perf_counter() - t5, 2)}
        print(f"onto ggml-vocab-{name}.gguf ({len(tokens)} tokens): {m.describe()}", flush=True)

    seen = int(np.count_nonzero(counts))
    report = {
        "file": str(args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out),
        "sha256": hashlib.sha256(args.out.read_bytes()).hexdigest(),
        "bytes": args.out.stat().st_size,
        "format_version": dv.VERSION,
        "size": len(built.tokens),
        "body_bytes_uncompressed": sum(len(t.encode("utf-8", "surrogatepass")) + 1 for t in built.tokens) - 1,
        "vocabulary": {
            "what": "openjet_launcher.model.vocab.full_vocab(): llama.cpp's qwen35 test vocabulary (Qwen2 BPE, ids "
                    "0..151642) + filler ids 151643..248043 that never encode + the 33 real added tokens + [PAD] rows",
            "n_vocab": built.n_vocab, "fingerprint": built.fingerprint.hex(),
        },
        "stored_as": "token strings (tokenizer.ggml.tokens), mapped onto a model's ids at load",
        "ids_real_bpe": real_bpe, "ids_added": int(np.sum(ids >= vocab.FULL_FIRST_ADDED_ID)), "ids_filler": fillers,
        "required_ids": dv.required_ids(tok),
        "distinct_tokens_seen": seen, "tokens_counted": int(counts.sum()),
        "share_of_counted_tokens_in_list": round(float(counts[ids].sum() / max(1, counts.sum())), 5),
        "least_count_in_list": int(counts[np.setdiff1d(ids, dv.required_ids(tok))].min()),  # the frequency cut
        "held_out_rule": "sha256(path relative to the source root) starts with hex 0 (draft_vocab.held_out)",
        "held_out_coverage": cov,
        "mapped_onto": {"what": "llama.cpp's test vocabularies (vendor/llama.cpp/models/ggml-vocab-NAME.gguf of "
                                "the llama-cpp-python sdist): the share of the list's tokens found, used when >= "
                                f"{dv.MIN_SHARE}", **mapped},
        "sources": report_sources,
        "caps": {k: v for k, v in vars(args).items() if k.endswith("_mb") or k == "file_kb"},
        "python": platform.python_version(), "zlib": zlib.ZLIB_RUNTIME_VERSION,
        "stdlib": sysconfig.get_paths()["stdlib"],
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "seconds": {"vocabulary": round(t_vocab, 1), "read_text": round(t_read, 1),
                    "build_total": round(t_build, 1), "with_coverage": round(t_total, 1),
                    "select_and_write": round(t_select, 1),
                    "map_onto": round(sum(m["seconds"] for m in mapped.values()), 1)},
    }
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"report: {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
