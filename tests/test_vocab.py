"""Tokenizer assets of synthetic qwen35 models: the small and full vocabularies and the chat template.

Oracles: the spec (§1.1 ids, §1.2 regex and chat format, hand-written expected prompts), `tokenizers` as an
independent byte-level BPE, and, when the llama-cpp-python sdist can be fetched (spec §8), llama.cpp's
qwen35 tokenizer test vectors and the real Qwen3.5-4B chat template. Those tests skip when offline.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys

import jinja2
import pytest
from gguf import TokenType
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from openjet_launcher.model import vocab
from openjet_launcher.model.sdist import SdistError, llama_cpp_sdist, sdist_member

# spec §1.2, the qwen35 pre-tokenizer regex.
QWEN35_REGEX = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# spec §1.1: the added tokens in id order (248044.. in the real vocabulary).
ADDED = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    "<tool_call>", "</tool_call>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
    "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>",
    "<|audio_pad|>",
]  # fmt: skip
# Not special in Qwen3.5's tokenizer_config and not <|...|>: llama.cpp's converter writes them USER_DEFINED.
USER_DEFINED = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"}

# Pinned so that a change of corpus, trainer settings or `tokenizers` behaviour, on any machine, shows up.
SMALL_FINGERPRINTS = {
    4096: "2b222dfca984c2218cc7747375796b10704c89ad39fb1294dcd66629cdc43e2b",  # tiny preset
    8192: "a71a5087a530d39f96c87c53fddaccfff25c47853458ce0ee0cc9308a1fa501c",  # small preset
}

TEXTS = [
    "Hello world",
    " Hello, World! It's 12:30 and we've 3 apples.",
    "Äpfel, Straße, naïve café, señor, Ελληνικά, Русский",
    "Vie\u0323\u0302t Nam e\u0301",  # decomposed accents (\p{M} joins the letter run)
    "今天天气很好。日本語のテキスト。한국어 텍스트",
    "emoji 🦙🚀 👩‍💻 ❤️ and 🇩🇪",
    "def f(x):\n\treturn {'a': [1, 2.5, -3e-6]}  # comment\r\n\n\n   trailing   ",
    "\x00\x01\x7f control bytes \u200b zero width \ufeff bom",
    "",
    " ",
    "\n\n\n",
]


def hf_tokenizer(assets: vocab.VocabAssets) -> Tokenizer:
    """Independent byte-level BPE from the assets (spec §8): Split(qwen35, isolated) + ByteLevel, no normaliser."""
    n_bpe = assets.first_added_id
    bpe = models.BPE(
        vocab={t: i for i, t in enumerate(assets.tokens[:n_bpe])},
        merges=[tuple(m.split(" ")) for m in assets.merges],
    )
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN35_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens([AddedToken(t, normalized=False, special=t not in USER_DEFINED) for t in ADDED])
    return tok


def render(template: str, **kwargs) -> str:
    """Render like spec §8: immutable sandbox, trim/lstrip blocks, loopcontrols, raise_exception, tojson."""

    def raise_exception(message: str):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = tojson
    return env.from_string(template).render(**kwargs)


@pytest.fixture(scope="session")
def sdist():
    try:
        return llama_cpp_sdist()
    except SdistError as e:
        pytest.skip(f"llama-cpp-python sdist unavailable: {e}")


# ----------------------------------------------------------------------------------------- small vocab


def test_small_vocab_is_identical_when_built_twice_and_in_another_process():
    first = vocab.small_vocab.__wrapped__()
    second = vocab.small_vocab.__wrapped__()
    assert first == second
    code = "from openjet_launcher.model import vocab as v; print(v.small_vocab_fingerprint(v.small_vocab()))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert other == vocab.small_vocab_fingerprint(first)


@pytest.mark.parametrize("n_vocab", SMALL_FINGERPRINTS)
def test_small_vocab_matches_the_pinned_fingerprint(n_vocab):
    got = vocab.small_vocab_fingerprint(vocab.small_vocab(n_vocab))
    assert got == SMALL_FINGERPRINTS[n_vocab], (
        "the small vocabulary changed: if the corpus or the trainer settings changed on purpose, update "
        "SMALL_FINGERPRINTS; otherwise this `tokenizers` release trains differently and synthetic "
        "models would differ between machines"
    )


@pytest.mark.parametrize("n_vocab", [8192, 4096, 1024])
def test_small_vocab_layout(n_vocab):
    a = vocab.small_vocab(n_vocab)
    n_bpe = n_vocab - 33 - 16
    assert len(a.tokens) == len(a.token_types) == a.n_vocab == n_vocab
    assert len(set(a.tokens)) == n_vocab
    # all 256 bytes first, in GPT-2 byte-to-unicode order
    assert a.tokens[:256] == sorted(pre_tokenizers.ByteLevel.alphabet(), key=ord)
    assert a.tokens[n_bpe : n_bpe + 33] == ADDED
    assert (a.bos_id, a.eos_id, a.pad_id) == (n_bpe, n_bpe + 2, n_bpe + 11)
    assert a.tokens[a.pad_id] == "<|vision_pad|>"
    assert set(a.eot_ids) == {a.tokens.index("<|im_end|>"), a.tokens.index("<|endoftext|>")}
    assert a.tokens[n_bpe + 33 :] == [f"[PAD{i}]" for i in range(n_bpe + 33, n_vocab)]
    assert a.token_types[:n_bpe] == [TokenType.NORMAL] * n_bpe
    assert a.token_types[n_bpe : n_bpe + 33] == [
        TokenType.USER_DEFINED if t in USER_DEFINED else TokenType.CONTROL for t in ADDED
    ]
    assert a.token_types[n_bpe + 33 :] == [TokenType.UNUSED] * 16
    assert (a.pre, a.model) == ("qwen35", "gpt2")
    assert a.chat_template == vocab.chat_template()
    assert a.added_id("<think>") == n_bpe + 24


def test_small_vocab_merges_join_existing_tokens_into_existing_tokens():
    a = vocab.small_vocab()
    bpe = set(a.tokens[: a.first_added_id])
    assert len(a.merges) == len(set(a.merges)) >= 3000
    for m in a.merges:
        left, right = m.split(" ")
        assert left in bpe and right in bpe and left + right in bpe


def test_small_vocab_rejects_a_size_without_room_for_bytes_and_added_tokens():
    with pytest.raises(vocab.VocabError):
        vocab.small_vocab(256)


def test_small_vocab_round_trips_arbitrary_text():
    tok = hf_tokenizer(vocab.small_vocab())
    rng = random.Random(1234)
    ranges = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x4FF), (0x300, 0x36F), (0x4E00, 0x9FFF), (0x1F300, 0x1FAFF)]
    fuzz = ["".join(chr(rng.randint(*rng.choice(ranges))) for _ in range(rng.randint(1, 40))) for _ in range(200)]
    for text in TEXTS + fuzz:
        ids = tok.encode(text).ids
        assert all(i < vocab.small_vocab().first_added_id for i in ids)
        assert tok.decode(ids, skip_special_tokens=False) == text


def test_small_vocab_encodes_common_words_in_few_tokens():
    tok = hf_tokenizer(vocab.small_vocab())
    assert len(tok.encode(" the model reads the text and predicts the next token").ids) <= 12


def test_added_tokens_encode_as_single_ids():
    a = vocab.small_vocab()
    tok = hf_tokenizer(a)
    for i, text in enumerate(ADDED):
        assert tok.encode(text).ids == [a.first_added_id + i]
    ids = tok.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n").ids
    assert ids[0] == a.added_id("<|im_start|>") and ids[-2] == a.added_id("<think>")
    assert ids.count(a.added_id("<|im_end|>")) == 1


# --------------------------------------------------------------------------------------- chat template

XHIGH = (
    "Reasoning effort is set to xhigh. Please think carefully through the task, validate key assumptions, "
    "consider plausible alternatives, and prioritize correctness, consistency, and clarity in the final answer."
)
LOW = (
    "Reasoning effort is set to low. Keep your thinking brief and focused, moving directly to the conclusion "
    "without unnecessary elaboration."
)
TOOLS_FORMAT = (
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested "
    "within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function call, "
    "but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current knowledge and "
    "do not tell the user about function calls\n</IMPORTANT>"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city, in °C",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
WEATHER_JSON = (
    '{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city, in °C", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}'
)
TIME = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
TIME_JSON = '{"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}'

SYSTEM_USER = [{"role": "system", "content": "  You are terse.\n"}, {"role": "user", "content": "\nHi there  "}]
TOOL_TURNS = [
    {"role": "user", "content": "Weather in Berlin and Paris for 3 days?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "\nI need the weather tool twice.\n",
        "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Berlin", "days": 3}}},
            {"function": {"name": "get_weather", "arguments": {"city": "Paris", "opts": {"unit": "C"}}}},
        ],
    },
    {"role": "tool", "content": '{"temp": 11}'},
    {"role": "tool", "content": ' {"temp": 14} '},
]  # fmt: skip
TOOL_TURNS_TEXT = (
    "<|im_start|>user\nWeather in Berlin and Paris for 3 days?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nI need the weather tool twice.\n</think>\n\n"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nBerlin\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
    "</function>\n</tool_call>\n"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    '<parameter=opts>\n{"unit": "C"}\n</parameter>\n</function>\n</tool_call><|im_end|>\n'
    '<|im_start|>user\n<tool_response>\n{"temp": 11}\n</tool_response>\n'
    '<tool_response>\n{"temp": 14}\n</tool_response><|im_end|>\n'
)
HISTORY = [
    {"role": "user", "content": "First question"},
    {"role": "assistant", "content": "First answer", "reasoning_content": "first thoughts"},
    {"role": "user", "content": "Second question"},
    {"role": "assistant", "content": "Second answer", "reasoning_content": "second thoughts"},
    {"role": "user", "content": "Third question"},
]


def template(**kwargs) -> str:
    return render(vocab.chat_template(), **kwargs)


def test_template_system_and_user_with_default_effort_xhigh():
    assert template(messages=SYSTEM_USER, add_generation_prompt=True) == (
        f"<|im_start|>system\n{XHIGH}\n\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )


def test_template_effort_medium_injects_nothing_and_low_its_sentence():
    user = SYSTEM_USER[1:]
    assert template(messages=user, add_generation_prompt=True, reasoning_effort="medium") == (
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    assert template(messages=user, add_generation_prompt=True, reasoning_effort="low") == (
        f"<|im_start|>system\n{LOW}<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )


def test_template_thinking_off_closes_an_empty_think_block_and_drops_the_effort_sentence():
    assert template(messages=SYSTEM_USER, add_generation_prompt=True, enable_thinking=False) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_template_rejects_an_unknown_effort():
    with pytest.raises(jinja2.exceptions.TemplateError, match="Unexpected reasoning effort high"):
        template(messages=SYSTEM_USER, reasoning_effort="high")


def test_template_renders_developer_as_system_and_text_parts_as_text():
    messages = [
        {"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief. "}]},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
    ]
    assert template(messages=messages, reasoning_effort="medium") == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    )


def test_template_tools_block_lists_one_json_object_per_line_then_the_system_text():
    assert template(messages=SYSTEM_USER, tools=[WEATHER, TIME], add_generation_prompt=True, enable_thinking=False) == (
        "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
        f"{WEATHER_JSON}\n{TIME_JSON}{TOOLS_FORMAT}\n\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert template(messages=SYSTEM_USER[1:], tools=[TIME], reasoning_effort="low").startswith(
        f"<|im_start|>system\n{LOW}\n\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n{TIME_JSON}"
        f"{TOOLS_FORMAT}<|im_end|>\n<|im_start|>user\n"
    )


def test_template_tool_calls_in_xml_and_tool_responses_merged_into_one_user_turn():
    got = template(messages=TOOL_TURNS, add_generation_prompt=True, reasoning_effort="medium")
    assert got == TOOL_TURNS_TEXT + "<|im_start|>assistant\n<think>\n"


def test_template_tool_call_after_content_is_separated_by_a_blank_line():
    messages = [
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [{"function": {"name": "now", "arguments": {}}}]},
    ]
    assert template(messages=messages, reasoning_effort="medium") == (
        "<|im_start|>user\nTime?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        "Checking.\n\n<tool_call>\n<function=now>\n</function>\n</tool_call><|im_end|>\n"
    )


def test_template_keeps_past_thinking_by_default_and_only_after_the_last_query_when_asked():
    kept = template(messages=HISTORY[:4], reasoning_effort="medium")
    assert kept == (
        "<|im_start|>user\nFirst question<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nfirst thoughts\n</think>\n\nFirst answer<|im_end|>\n"
        "<|im_start|>user\nSecond question<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nsecond thoughts\n</think>\n\nSecond answer<|im_end|>\n"
    )
    dropped = template(messages=HISTORY[:4], reasoning_effort="medium", preserve_thinking=False)
    assert dropped == (
        "<|im_start|>user\nFirst question<|im_end|>\n<|im_start|>assistant\nFirst answer<|im_end|>\n"
        "<|im_start|>user\nSecond question<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nsecond thoughts\n</think>\n\nSecond answer<|im_end|>\n"
    )


def test_template_tool_response_turns_do_not_count_as_the_last_query():
    messages = [*TOOL_TURNS, {"role": "assistant", "content": "Berlin 11, Paris 14.", "reasoning_content": "done"}]
    got = template(messages=messages, reasoning_effort="medium", preserve_thinking=False)
    assert got == TOOL_TURNS_TEXT + "<|im_start|>assistant\n<think>\ndone\n</think>\n\nBerlin 11, Paris 14.<|im_end|>\n"


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([], "No messages provided"),
        ([{"role": "system", "content": "s"}], "No user query found"),
        ([{"role": "user", "content": "a"}, {"role": "system", "content": "s"}], "must be at the beginning"),
        ([{"role": "user", "content": "a"}, {"role": "critic", "content": "b"}], "Unexpected message role"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "text only"),
    ],
)
def test_template_rejects_malformed_conversations(messages, message):
    with pytest.raises(jinja2.exceptions.TemplateError, match=message):
        template(messages=messages)


# ------------------------------------------------------------------------------- against the real assets


REAL_TEMPLATE_CASES = {
    "system_user": dict(messages=SYSTEM_USER, add_generation_prompt=True),
    "thinking_off": dict(messages=SYSTEM_USER, add_generation_prompt=True, enable_thinking=False),
    "tools": dict(messages=SYSTEM_USER, tools=[WEATHER, TIME], add_generation_prompt=True),
    "tool_calls": dict(messages=TOOL_TURNS, tools=[WEATHER], add_generation_prompt=True),
    "history": dict(messages=HISTORY, add_generation_prompt=True),
    "content_then_call": dict(
        messages=[
            {"role": "user", "content": "Time?"},
            {"role": "assistant", "content": "Checking.", "tool_calls": [{"name": "now", "arguments": {}}]},
            {"role": "tool", "content": "12:30"},
        ],
        add_generation_prompt=True,
    ),
}


@pytest.mark.parametrize("case", REAL_TEMPLATE_CASES)
def test_template_renders_like_the_real_qwen35_template(sdist, case):
    # Qwen3.5 has no effort sentence and keeps past thinking only after the last query: Qwen3.8's
    # reasoning_effort="medium" and preserve_thinking=False.
    real = sdist_member("models/templates/Qwen3.5-4B.jinja").decode("utf-8")
    kwargs = REAL_TEMPLATE_CASES[case]
    assert template(**kwargs, reasoning_effort="medium", preserve_thinking=False) == render(real, **kwargs)


def read_test_vectors() -> list[tuple[str, list[int]]]:
    """llama.cpp's tests/test-tokenizer-0 format: inputs split on the marker line, one id list per line."""
    raw = sdist_member("models/ggml-vocab-qwen35.gguf.inp").decode("utf-8")
    out = sdist_member("models/ggml-vocab-qwen35.gguf.out").decode("utf-8").splitlines()
    inputs, pos, sep = [], 0, "\n__ggml_vocab_test__\n"
    while pos < len(raw):
        nxt = raw.find(sep, pos)
        inputs.append(raw[pos:] if nxt < 0 else raw[pos:nxt])
        pos = len(raw) if nxt < 0 else nxt + len(sep)
    assert len(inputs) == len(out)
    return [(s, [int(t) for t in o.split()]) for s, o in zip(inputs, out)]


@pytest.fixture(scope="module")
def full(sdist):
    return vocab.full_vocab()


@pytest.mark.slow
def test_full_vocab_has_the_real_size_and_special_ids(full):
    assert len(full.tokens) == len(full.token_types) == 248_320
    assert len(set(full.tokens)) == 248_320
    assert full.tokens[248_044:248_077] == ADDED
    assert (full.bos_id, full.eos_id, full.pad_id) == (248_044, 248_046, 248_055)
    assert set(full.eot_ids) == {248_046, 248_044}
    assert full.added_id("<|image_pad|>") == 248_056 and full.added_id("<think>") == 248_068
    assert full.token_types[:248_044] == [TokenType.NORMAL] * 248_044
    assert full.token_types[248_044:248_077] == [
        TokenType.USER_DEFINED if t in USER_DEFINED else TokenType.CONTROL for t in ADDED
    ]
    assert full.tokens[248_077:] == [f"[PAD{i}]" for i in range(248_077, 248_320)]
    assert full.token_types[248_077:] == [TokenType.UNUSED] * 243


@pytest.mark.slow
def test_full_vocab_merges_join_existing_tokens_into_existing_tokens(full):
    bpe = set(full.tokens[:248_044])
    assert len(full.merges) == len(set(full.merges)) == 151_387 + (248_044 - 151_643)
    for m in full.merges:
        left, right = m.split(" ")
        assert left in bpe and right in bpe and left + right in bpe


@pytest.mark.slow
def test_full_vocab_reproduces_llama_cpp_qwen35_test_vectors(full):
    tok = hf_tokenizer(full)
    vectors = read_test_vectors()
    assert len(vectors) >= 50
    for text, ids in vectors:
        assert tok.encode(text).ids == ids, text
        assert tok.decode(ids) == text
