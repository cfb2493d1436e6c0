"""llama.cpp as a peer: it accepts our synthetic `tiny` qwen35 file, runs it and tokenizes like we do.

Runs only where llama-cpp-python (>= 0.3.36, which has `qwen35` and MTP) is importable; CI does not build it,
so there the whole module is skipped. `scripts/llama_cpp_peer.sh` builds it from the PyPI sdist on a CPU
machine (about 6-14 minutes on 2 cores) into a venv outside the repository; run this module with that venv's
python and PYTHONPATH pointing at the repository.

What is checked, with llama.cpp as the oracle:
* the file loads with no warning or error from llama.cpp other than "unused tensor blk.4.*" (the MTP block,
  which llama.cpp skips unless asked to load it), and its load log reports the arch, layer counts, IMROPE
  sections, tensor type census, vocabulary type and special tokens that the file is meant to carry;
* asked to load the MTP block too (and to validate every tensor's data), it does so without any warning,
  and an MTP context (the draft-mtp graph) can be built on it;
* per-position logits over a prompt are finite and varied; greedy generation of 8 tokens follows them;
* the embedded chat template renders in llama-cpp-python like it does with jinja2 here;
* llama.cpp's tokenizer gives the same ids as a `tokenizers` byte-level BPE built from the file's own
  tokens and merges with the qwen35 split regex (qwen38.md §1.2, §8), and decodes back to the input;
* the same holds for the full preset's 248,320-token vocabulary (metadata only, no weights; needs the
  llama-cpp-python sdist, skipped when it cannot be fetched).
"""

from __future__ import annotations

import ctypes
import json
import re
import unicodedata
from collections import Counter

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from gguf import GGUFReader  # noqa: E402
from jinja2.ext import loopcontrols  # noqa: E402
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers  # noqa: E402

from openjet_launcher.model.sdist import SdistError  # noqa: E402
from openjet_launcher.model.shape import ARCH, PRESETS, QWEN38_27B  # noqa: E402
from openjet_launcher.model.synth import add_metadata, plan_tensors, synthesize, vocab_for  # noqa: E402

if tuple(int(x) for x in re.findall(r"\d+", llama_cpp.__version__)[:3]) < (0, 3, 36):
    pytest.skip(f"llama-cpp-python {llama_cpp.__version__} predates 0.3.36 (qwen35 with MTP)", allow_module_level=True)

TINY = PRESETS["tiny"]
VOCAB = vocab_for("tiny", TINY)

# ggml_log_level in the vendored llama.cpp: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5.
_WARN, _ERROR, _CONT = 3, 4, 5

# spec §1.2, written out here rather than imported, so the comparison does not share our vocab module's copy.
QWEN35_REGEX = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

TEXTS = [
    "def attention(query, key, value):\n    return softmax(query @ key.T / 16.0) @ value\n",
    "naïve café 日本語 🙂",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>assistant\n<think>\n\n</think>\n\nOK<|im_end|>\n",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nBerlin\n</parameter>\n</function>\n</tool_call>",
    "Vie\u0323\u0302t Nam e\u0301 cafe\u0301",  # decomposed accents: \p{M} joins the letter run
    unicodedata.normalize("NFD", "Hôm nay trời đẹp quá. Cảm ơn bạn"),  # tokenizes differently under qwen2
    "It's 12:30, we've 3,141 apples; THEY'LL pay $4.50!",
    "  two spaces\n\n\ttab\r\n   trailing   ",
    "emoji 🦙🚀 👩‍💻 ❤️ 🇩🇪 and Привет, Ελληνικά, 한국어, العربية",
    "今天天气很好，我们一起去公园散步吧。",  # one BPE token longer than 32 bytes
    "[PAD4090] <|not_a_token|> </think",
    "",
]


class LogCapture:
    """Routes llama.cpp's log into a list of (level, text) while active; restores llama-cpp-python's logger."""

    def __init__(self):
        self.records: list[tuple[int, str]] = []

        @llama_cpp.llama_log_callback
        def callback(level, text, user_data):
            self.records.append((int(level), text.decode("utf-8", "replace")))

        self._callback = callback  # keep a reference while llama.cpp may call it

    def __enter__(self):
        llama_cpp.llama_log_set(self._callback, ctypes.c_void_p(0))
        return self

    def __exit__(self, *exc):
        from llama_cpp import _logger

        llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))

    def text(self) -> str:
        return "".join(t for _, t in self.records)

    def problems(self) -> list[str]:
        """WARN and ERROR messages (with their CONT continuations), one string each."""
        out, current = [], None
        for level, text in self.records:
            if level in (_WARN, _ERROR):
                current = len(out)
                out.append(text)
            elif level == _CONT and current is not None:
                out[current] += text
            else:
                current = None
        return [m.strip() for m in out]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("peer") / "tiny.gguf"
    synthesize("tiny", path, show_progress=False)
    return path


@pytest.fixture(scope="module")
def loaded(tiny_path):
    with LogCapture() as log:
        llm = llama_cpp.Llama(str(tiny_path), logits_all=True, n_ctx=256, n_threads=2, seed=0, verbose=False)
    yield llm, log
    llm.close()


@pytest.fixture(scope="module")
def llm(loaded):
    return loaded[0]


def detokenize(llm, ids: list[int]) -> bytes:
    """llama.cpp's own llama_detokenize with a large buffer (llama-cpp-python's detokenize drops any token
    whose piece is longer than its fixed 32-byte buffer), special tokens rendered."""
    size = 64 + 256 * len(ids)
    buf = ctypes.create_string_buffer(size)
    arr = (llama_cpp.llama_token * len(ids))(*ids)
    n = llama_cpp.llama_detokenize(llm._model.vocab, arr, len(ids), buf, size, False, True)
    assert 0 <= n <= size
    return buf.raw[:n]


def token_bytes(token: str) -> bytes:
    """The bytes a byte-level (GPT-2 alphabet) token string stands for (added tokens are printable ASCII,
    which the alphabet maps to itself)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return bytes(table[c] for c in token)


def bpe_from_file(path) -> Tokenizer:
    """Byte-level BPE from the file's tokenizer keys (spec §8): Split(qwen35, isolated), ByteLevel without its
    own regex, no normaliser; CONTROL and USER_DEFINED tokens added as AddedTokens at their file ids."""
    reader = GGUFReader(path)

    def strings(key):
        f = reader.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tokens, merges = strings("tokenizer.ggml.tokens"), strings("tokenizer.ggml.merges")
    field = reader.fields["tokenizer.ggml.token_type"]
    types = [int(field.parts[i][0]) for i in field.data]
    n_bpe = types.index(3)  # NORMAL tokens first, then the added ones
    assert set(types[:n_bpe]) == {1}
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens[:n_bpe])},
                               merges=[tuple(m.split(" ")) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    added = [(i, t, ty) for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (3, 4)]  # CONTROL, USER_DEFINED
    tok.add_tokens([AddedToken(t, normalized=False, special=ty == 3) for _, t, ty in added])
    assert all(tok.token_to_id(t) == i for i, t, _ in added)
    return tok


# ------------------------------------------------------------------------------------------------ loading


def test_load_log_reports_the_file_as_written(loaded, tiny_path):
    llm, log = loaded
    n_layer = TINY.n_layer
    # The only warnings: the MTP block's tensors, which llama.cpp skips unless load_mtp is set.
    others = [m for m in log.problems() if not m.startswith(f"model has unused tensor blk.{n_layer}.")]
    assert others == []
    assert sum(m.startswith("model has unused tensor") for m in log.problems()) == 15

    text = log.text()
    expected_lines = [
        r"print_info: arch\s+= qwen35",
        rf"print_info: n_layer\s+= {n_layer}",
        rf"print_info: n_layer_all\s+= {TINY.n_block}",
        rf"print_info: n_embd\s+= {TINY.n_embd}",
        rf"print_info: n_rot\s+= {TINY.n_rot}",
        r"print_info: rope type\s+= 40",  # LLAMA_ROPE_TYPE_IMROPE
        r"print_info: mrope sections\s+= \[11, 11, 10, 0\]",
        rf"print_info: ssm_dt_rank\s+= {TINY.ssm_n_v_heads}",
        rf"print_info: ssm_n_group\s+= {TINY.ssm_n_k_heads}",
        r"print_info: vocab type\s+= BPE",
        rf"print_info: n_vocab\s+= {TINY.n_vocab}",
        rf"print_info: n_merges\s+= {len(VOCAB.merges)}",
        rf"print_info: BOS token\s+= {VOCAB.bos_id} '<\|endoftext\|>'",
        rf"print_info: EOS token\s+= {VOCAB.eos_id} '<\|im_end\|>'",
        rf"print_info: EOT token\s+= {VOCAB.eos_id} '<\|im_end\|>'",
        rf"print_info: PAD token\s+= {VOCAB.pad_id} '<\|vision_pad\|>'",
        rf"print_info: EOG token\s+= {VOCAB.bos_id} '<\|endoftext\|>'",
        rf"print_info: EOG token\s+= {VOCAB.eos_id} '<\|im_end\|>'",
        r"load: special tokens cache size = 33",
    ]
    for pattern in expected_lines:
        assert re.search(pattern, text), pattern
    census = Counter(p.qtype.name for p in plan_tensors(TINY))  # ggml spells them f32, q4_K, q8_0
    for name, count in census.items():
        assert re.search(rf"- type\s+{name}:\s+{count} tensors", text, re.IGNORECASE), (name, count)
    assert "pre-tokenizer" not in text  # no "missing pre-tokenizer type" warning
    assert llm.n_vocab() == TINY.n_vocab
    assert (llm.token_bos(), llm.token_eos()) == (VOCAB.bos_id, VOCAB.eos_id)
    assert llm.metadata["tokenizer.ggml.pre"] == "qwen35"
    assert llm.metadata["tokenizer.ggml.add_bos_token"] == "false"


def test_mtp_block_loads_and_validates(tiny_path):
    """load_mtp plus check_tensors: llama.cpp loads blk.4 (nextn) and validates every tensor's data, with no
    warning at all; a context of type MTP (the draft-mtp graph over blk.4) can be built on the model."""
    mp = llama_cpp.llama_model_default_params()
    mp.load_mtp = True
    mp.check_tensors = True
    with LogCapture() as log:
        model = llama_cpp.llama_model_load_from_file(str(tiny_path).encode(), mp)
        assert model
        try:
            assert llama_cpp.llama_model_n_layer_nextn(model) == TINY.n_nextn
            cp = llama_cpp.llama_context_default_params()
            cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads = 256, 64, 64, 2
            cp.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
            ctx = llama_cpp.llama_init_from_model(model, cp)
            assert ctx
            llama_cpp.llama_free(ctx)
        finally:
            llama_cpp.llama_model_free(model)
    assert log.problems() == []
    for name in ("eh_proj", "enorm", "hnorm", "shared_head_norm"):
        assert f"loading tensor blk.{TINY.n_layer}.nextn.{name}.weight" in log.text()


# -------------------------------------------------------------------------------------------- running

PROMPT = "<|im_start|>user\nWrite a short poem about the sea.<|im_end|>\n<|im_start|>assistant\n"


def test_per_position_logits_are_finite_and_varied(llm):
    ids = llm.tokenize(PROMPT.encode(), add_bos=False, special=True)
    assert ids[0] == VOCAB.added_id("<|im_start|>") and VOCAB.eos_id in ids
    llm.reset()
    llm.eval(ids)
    scores = np.array(llm.scores[: llm.n_tokens], dtype=np.float64)
    assert scores.shape == (len(ids), TINY.n_vocab)
    assert np.isfinite(scores).all()
    std = scores.std(axis=1)
    assert (std > 0.5).all(), std
    assert len({row.tobytes() for row in scores}) == len(ids)  # every position differs
    assert len(set(scores.argmax(axis=1).tolist())) > len(ids) // 2


def test_greedy_generation_follows_the_logits(llm):
    ids = llm.tokenize(PROMPT.encode(), add_bos=False, special=True)

    def greedy(n):
        out = []
        for token in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            out.append(token)
            if len(out) == n:
                break
        return out

    out = greedy(8)
    assert len(out) == 8 and all(0 <= t < TINY.n_vocab for t in out)
    # With logits_all, row n_prompt-1+i holds the logits that chose token i (the 8th is sampled, not evaluated).
    scores = np.array(llm.scores[: len(ids) + 7], dtype=np.float64)
    assert np.isfinite(scores).all()
    assert [int(scores[len(ids) - 1 + i].argmax()) for i in range(8)] == out
    assert greedy(8) == out  # deterministic
    assert len(set(out)) > 1
    # random weights: the bytes need not be valid UTF-8, but they are the tokens' bytes
    assert detokenize(llm, out) == b"".join(token_bytes(VOCAB.tokens[t]) for t in out)


def test_embedded_chat_template_renders_and_completes(llm):
    messages = [{"role": "user", "content": "hi"}]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)

    def raise_exception(message):
        raise ValueError(message)

    env.globals["raise_exception"] = raise_exception
    template = llm.metadata["tokenizer.chat_template"]
    assert template == VOCAB.chat_template
    prompt = env.from_string(template).render(messages=messages, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n")
    n_prompt = len(llm.tokenize(prompt.encode(), add_bos=False, special=True))

    assert llm.chat_format == "chat_template.default"  # llama-cpp-python took the file's template
    llm.reset()
    reply = llm.create_chat_completion(messages=messages, max_tokens=8, temperature=0.0, top_k=1)
    assert reply["usage"]["prompt_tokens"] == n_prompt
    assert reply["choices"][0]["finish_reason"] in ("length", "stop")
    assert 1 <= reply["usage"]["completion_tokens"] <= 8


# ----------------------------------------------------------------------------------------- tokenizer


@pytest.fixture(scope="module")
def bpe(tiny_path):
    return bpe_from_file(tiny_path)


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_tokenization_matches_tokenizers_bpe(llm, bpe, text):
    ours = bpe.encode(text, add_special_tokens=False).ids
    theirs = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
    assert theirs == ours
    assert detokenize(llm, theirs) == text.encode("utf-8")


def test_special_tokens_resolve_to_the_spec_ids(llm):
    ids = llm.tokenize(b"<|im_start|>user\nhi<|im_end|>", add_bos=False, special=True)
    assert ids[0] == VOCAB.added_id("<|im_start|>") and ids[-1] == VOCAB.added_id("<|im_end|>")
    for token in ("<think>", "</think>", "<tool_call>", "</tool_response>", "<|endoftext|>", "<|vision_pad|>"):
        assert llm.tokenize(token.encode(), add_bos=False, special=True) == [VOCAB.added_id(token)], token
    # special=False: CONTROL tokens are plain text to llama.cpp
    assert VOCAB.added_id("<|im_start|>") not in llm.tokenize(b"<|im_start|>", add_bos=False, special=False)


@pytest.mark.slow
def test_full_vocabulary_is_accepted_and_tokenizes_alike(tmp_path):
    """The full preset's tokenizer keys (the real ids: BOS 248044, EOS 248046, PAD 248055) in a weightless
    qwen35 file: llama.cpp's only complaint is the one it makes about every Qwen2-based vocabulary, the NORMAL
    token 128247 '</s>' that it promotes to an end-of-generation token."""
    try:
        vocab = vocab_for("full", QWEN38_27B)
    except SdistError as e:
        pytest.skip(f"llama-cpp-python sdist not available: {e}")
    from gguf import GGUFWriter

    path = tmp_path / "full-vocab.gguf"
    w = GGUFWriter(path, ARCH)
    add_metadata(w, QWEN38_27B, vocab, "vocabulary only")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()

    with LogCapture() as log:
        model = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    problems = [m for m in log.problems() if "n_ctx_train (0)" not in m]  # vocab_only has no context length
    assert problems == ["load: control-looking token: 128247 '</s>' was not control-type; "
                        "this is probably a bug in the model. its type will be overridden"]
    text = log.text()
    for pattern in (r"n_vocab\s+= 248320", rf"n_merges\s+= {len(vocab.merges)}",
                    r"BOS token\s+= 248044 '<\|endoftext\|>'", r"EOS token\s+= 248046 '<\|im_end\|>'",
                    r"PAD token\s+= 248055 '<\|vision_pad\|>'", r"EOG token\s+= 248046 '<\|im_end\|>'"):
        assert re.search(pattern, text), pattern

    bpe = bpe_from_file(path)
    for text in TEXTS:
        ids = model.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        assert ids == bpe.encode(text, add_special_tokens=False).ids, text
        assert detokenize(model, ids) == text.encode("utf-8")
    assert model.tokenize(b"<|im_start|>user\nhi<|im_end|>", add_bos=False, special=True)[::4] == [248045, 248046]
    model.close()
