"""Tokenizer assets for synthetic qwen35 GGUF files: tokens, token types, merges, special ids, chat template.

Two vocabularies, both byte-level BPE with the qwen35 pre-tokenizer (spec §1.2) and Qwen's 33 added tokens
(spec §1.1) placed right after the BPE tokens, then `[PAD{id}]` rows up to the padded embedding size:

* `small_vocab(n_vocab)`: for the tiny and small presets. Trained here, offline, in well under a second,
  with `tokenizers`' BpeTrainer on `_CORPUS`, a fixed text this module carries (prose, code, JSON and a
  dozen languages). Trained on our own constant text rather than on the Python standard library, so the
  vocabulary does not change with the Python version (3.11 here, 3.12 on the GPU machine).
  `small_vocab_fingerprint` pins it in the tests.
* `full_vocab()`: the real shape, 248,320 rows with the added tokens at their real ids 248044..248076.
  Its first 151,643 tokens and 151,387 merges are llama.cpp's qwen35 test vocabulary (the Qwen2 BPE,
  from the llama-cpp-python sdist, spec §8); ids 151,643..248,043 are filled with byte-level tokens
  "a" + "b" made from a real token ending in an ASCII letter and a real token starting with a space
  ("the" + " of" -> "the of"), each with its merge. The qwen35 pre-tokenizer never yields a piece with a
  letter followed by a space, so these merges never fire: the BPE stays valid (every merge names tokens
  that exist) and encodes exactly like the test vocabulary, which lets llama.cpp's test vectors check it,
  while every id below 248,044 decodes to real text, as in the real file. The real file's own
  tokens above 151,642 are not public in our sources, so they are not reproduced.

Token types follow llama.cpp's converter (`get_vocab_base`): BPE tokens NORMAL; added tokens CONTROL when
`special` in Qwen3.5's tokenizer_config or when they look like `<|...|>`, else USER_DEFINED (the six
`<tool_call>`, `</tool_call>`, `<tool_response>`, `</tool_response>`, `<think>`, `</think>`); padding
rows `[PAD{id}]` UNUSED.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from gguf import TokenType

from openjet_launcher.errors import OpenJetError
from openjet_launcher.text.tokenizer import bytes_to_unicode, pre_tokenizer

_C, _U = TokenType.CONTROL, TokenType.USER_DEFINED
# Qwen3.5/3.8 added tokens in id order (248044..248076 in the real vocabulary) and their GGUF types.
ADDED_TOKENS: tuple[tuple[str, TokenType], ...] = (
    ("<|endoftext|>", _C),
    ("<|im_start|>", _C),
    ("<|im_end|>", _C),
    ("<|object_ref_start|>", _C),
    ("<|object_ref_end|>", _C),
    ("<|box_start|>", _C),
    ("<|box_end|>", _C),
    ("<|quad_start|>", _C),
    ("<|quad_end|>", _C),
    ("<|vision_start|>", _C),
    ("<|vision_end|>", _C),
    ("<|vision_pad|>", _C),
    ("<|image_pad|>", _C),
    ("<|video_pad|>", _C),
    ("<tool_call>", _U),
    ("</tool_call>", _U),
    ("<|fim_prefix|>", _C),  # special=false in tokenizer_config, but <|...|> looks special to the converter
    ("<|fim_middle|>", _C),
    ("<|fim_suffix|>", _C),
    ("<|fim_pad|>", _C),
    ("<|repo_name|>", _C),
    ("<|file_sep|>", _C),
    ("<tool_response>", _U),
    ("</tool_response>", _U),
    ("<think>", _U),
    ("</think>", _U),
    ("<|audio_start|>", _C),
    ("<|audio_end|>", _C),
    ("<tts_pad>", _C),
    ("<tts_text_bos>", _C),
    ("<tts_text_eod>", _C),
    ("<tts_text_bos_single>", _C),
    ("<|audio_pad|>", _C),
)
N_ADDED = len(ADDED_TOKENS)  # 33

FULL_N_VOCAB = 248_320  # padded embedding / lm_head rows
FULL_FIRST_ADDED_ID = 248_044  # <|endoftext|>
SMALL_N_VOCAB = 4096
_MIN_PAD_ROWS = 16  # small vocabularies keep some [PAD] rows, as the real file keeps 243

_TEST_VOCAB = "vendor/llama.cpp/models/ggml-vocab-qwen35.gguf"  # member of the llama-cpp-python sdist
_TEST_VOCAB_BPE = 151_643  # NORMAL tokens in it (ids 0..151642), followed by 3 CONTROL and [PAD] rows


class VocabError(OpenJetError):
    """A vocabulary that cannot be built as asked."""


@dataclass(frozen=True)
class VocabAssets:
    """What a GGUF writer needs for the `tokenizer.*` keys. Shared by callers (cached): do not mutate."""

    tokens: list[str]  # tokenizer.ggml.tokens, len == n_vocab (padded embedding rows)
    token_types: list[int]  # tokenizer.ggml.token_type, gguf.TokenType values
    merges: list[str]  # tokenizer.ggml.merges, "a b" in byte-level (GPT-2) alphabet, rank order
    bos_id: int  # <|endoftext|>
    eos_id: int  # <|im_end|>
    pad_id: int  # <|vision_pad|>
    eot_ids: tuple[int, ...]  # generation stops on these: <|im_end|>, <|endoftext|>
    chat_template: str  # tokenizer.chat_template
    pre: str = "qwen35"  # tokenizer.ggml.pre
    model: str = "gpt2"  # tokenizer.ggml.model

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    @property
    def first_added_id(self) -> int:
        """Id of <|endoftext|>; the 33 added tokens follow it and the BPE tokens precede it."""
        return self.bos_id

    def added_id(self, token: str) -> int:
        """Id of one of the 33 added tokens, e.g. added_id("<think>")."""
        for i, (text, _) in enumerate(ADDED_TOKENS):
            if text == token:
                return self.first_added_id + i
        raise KeyError(f"{token!r} is not one of Qwen's added tokens")


def chat_template() -> str:
    """OpenJet's Jinja chat template for synthetic Qwen3.8 models (package data, spec §1.2)."""
    return resources.files(__package__).joinpath("chat_template.jinja").read_text(encoding="utf-8")


def _assemble(bpe_tokens: list[str], merges: list[str], n_vocab: int) -> VocabAssets:
    """BPE tokens (NORMAL), then the 33 added tokens, then [PAD{id}] rows (UNUSED) up to n_vocab."""
    first = len(bpe_tokens)
    if first + N_ADDED > n_vocab:
        raise VocabError(f"{first} BPE tokens and {N_ADDED} added tokens do not fit in n_vocab={n_vocab}")
    tokens = bpe_tokens + [t for t, _ in ADDED_TOKENS] + [f"[PAD{i}]" for i in range(first + N_ADDED, n_vocab)]
    types = [int(TokenType.NORMAL)] * first + [int(k) for _, k in ADDED_TOKENS]
    types += [int(TokenType.UNUSED)] * (n_vocab - len(types))
    at = {t: first + i for i, (t, _) in enumerate(ADDED_TOKENS)}
    return VocabAssets(
        tokens=tokens,
        token_types=types,
        merges=merges,
        bos_id=at["<|endoftext|>"],
        eos_id=at["<|im_end|>"],
        pad_id=at["<|vision_pad|>"],
        eot_ids=(at["<|im_end|>"], at["<|endoftext|>"]),
        chat_template=chat_template(),
    )


# ---------------------------------------------------------------------------------------------- small


@lru_cache(maxsize=None)
def small_vocab(n_vocab: int = SMALL_N_VOCAB) -> VocabAssets:
    """A byte-level BPE of up to n_vocab - 33 - 16 tokens trained on `_CORPUS`, then the added tokens at
    n_bpe + 0..32, then [PAD] rows to n_vocab. Deterministic: same result on every run, machine and
    Python version (given the same `tokenizers` BpeTrainer; pinned by the tests' fingerprint)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    if n_vocab < 256 + N_ADDED + _MIN_PAD_ROWS:
        raise VocabError(f"n_vocab={n_vocab} is too small: 256 byte tokens + {N_ADDED} added tokens + padding")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer("qwen35")  # the text layer's: Split(regex, isolated) + ByteLevel
    trainer = trainers.BpeTrainer(
        vocab_size=n_vocab - N_ADDED - _MIN_PAD_ROWS,
        min_frequency=0,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, whatever the corpus holds
        special_tokens=[],
    )
    tok.train_from_iterator(_training_text(), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    by_id = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise VocabError("trained BPE vocabulary ids are not contiguous")
    bpe_tokens = [t for t, _ in by_id]
    # 0.20+ stores merges as pairs, older releases as "a b"; byte-level symbols never contain a space.
    merges = [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in model["merges"]]
    return _assemble(bpe_tokens, merges, n_vocab)


def _training_text() -> list[str]:
    """Paragraphs to train on: `_CORPUS` eight times, so natural text leads the merge ranks; then once its
    ASCII words in three cases (lower, Capitalised, UPPER) after four prefixes (" ", a new line, ".", "_"),
    as code and prose put them, for more distinct pieces: without them the trainer runs out of pairs near
    3.4k tokens, with them it fills 8k; then the paragraphs that carry accents, decomposed (NFD), so
    combining marks (\\p{M}) are seen. Only stable operations (ASCII case mapping, NFD of existing
    characters, fixed by Unicode's stability policy), so every Python version gets the same text."""
    paragraphs = _CORPUS.split("\n\n")
    words = sorted(set(re.findall(r"[A-Za-z]+", _CORPUS)))
    variants = ["".join(prefix + case(w) for w in words) for case in (str.lower, str.capitalize, str.upper)
                for prefix in (" ", "\n", ".", "_")]
    decomposed = [unicodedata.normalize("NFD", p) for p in paragraphs if unicodedata.normalize("NFD", p) != p]
    return paragraphs * 8 + variants + decomposed


def small_vocab_fingerprint(assets: VocabAssets) -> str:
    """sha256 over tokens, types and merges: equal fingerprints mean byte-identical tokenizer keys."""
    h = hashlib.sha256()
    for part in (assets.tokens, [str(t) for t in assets.token_types], assets.merges):
        h.update("\x00".join(part).encode("utf-8"))
        h.update(b"\x01")
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------- full


def _read_test_vocab() -> tuple[list[str], list[int], list[str]]:
    """tokens, token types and merges of llama.cpp's qwen35 test vocabulary (fetched with the sdist)."""
    from gguf import GGUFReader

    from openjet_launcher.model.sdist import sdist_member_path

    reader = GGUFReader(sdist_member_path(_TEST_VOCAB))

    def strings(key: str) -> list[str]:
        f = reader.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tt = reader.fields["tokenizer.ggml.token_type"]
    types = [int(tt.parts[i][0]) for i in tt.data]
    return strings("tokenizer.ggml.tokens"), types, strings("tokenizer.ggml.merges")


def _filler_tokens(bpe_tokens: list[str], count: int) -> tuple[list[str], list[str]]:
    """`count` new tokens a+b (a ends with an ASCII letter, b is a space then an ASCII letter), with their
    merges, taken along the anti-diagonals of (rank of a, rank of b) so frequent pairs come first."""
    letters = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    space = bytes_to_unicode()[ord(" ")]  # "Ġ"
    left = [t for t in bpe_tokens if t[-1] in letters and all(c in letters for c in t.lstrip(space))]
    right = [t for t in bpe_tokens if len(t) > 1 and t[0] == space and t[1] in letters]
    known = set(bpe_tokens)
    tokens: list[str] = []
    merges: list[str] = []
    diagonal = 0
    while len(tokens) < count:
        if diagonal > len(left) + len(right):
            raise VocabError(f"cannot derive {count} filler tokens from the test vocabulary")
        for i in range(max(0, diagonal - len(right) + 1), min(diagonal + 1, len(left))):
            a, b = left[i], right[diagonal - i]
            if a + b in known:
                continue
            known.add(a + b)
            tokens.append(a + b)
            merges.append(f"{a} {b}")
            if len(tokens) == count:
                break
        diagonal += 1
    return tokens, merges


@lru_cache(maxsize=1)
def full_vocab() -> VocabAssets:
    """248,320 rows: the test vocabulary's 151,643 BPE tokens, 96,401 filler tokens, the 33 added tokens
    at 248044..248076, then [PAD248077]..[PAD248319]. Needs the llama-cpp-python sdist (downloaded once)."""
    tokens, types, merges = _read_test_vocab()
    normal = [i for i, t in enumerate(types) if t == TokenType.NORMAL]
    if normal != list(range(_TEST_VOCAB_BPE)):
        raise VocabError(f"{_TEST_VOCAB}: expected NORMAL tokens at ids 0..{_TEST_VOCAB_BPE - 1}")
    bpe = tokens[:_TEST_VOCAB_BPE]
    extra_tokens, extra_merges = _filler_tokens(bpe, FULL_FIRST_ADDED_ID - len(bpe))
    return _assemble(bpe + extra_tokens, merges + extra_merges, FULL_N_VOCAB)


# --------------------------------------------------------------------------------------------- corpus

# Training text for small_vocab, written for OpenJet. Changing one character changes the vocabulary
# (and the pinned fingerprint in tests/test_vocab.py). Paragraphs are separated by blank lines.
_CORPUS = r"""OpenJet runs one large language model on one graphics card, and it tries to do that well. The model reads a prompt, turns the text into tokens, and then predicts the next token again and again until it reaches a stop token or the limit that the user asked for. Every step reads all of the weights from memory once, so the speed of decoding is set by memory bandwidth far more than by arithmetic.

A tokenizer splits text into pieces before the model sees it. First a regular expression cuts the text into words, numbers, punctuation and runs of spaces; then byte pair encoding joins the bytes of each piece into longer tokens, following a ranked list of merges that was learned from a large corpus. Because every byte has a token of its own, any text can be encoded, even text the tokenizer has never seen before.

The weather was cold and clear this morning. Children walked to school in thick coats, and the baker on the corner opened his shop before sunrise. By noon the market square was full: farmers sold apples, pears, potatoes, carrots, cabbages, honey, cheese and fresh bread, while a street musician played an old song on his violin.

History is written by people who remember, and memory is a strange, selective thing. The oldest libraries kept clay tablets, scrolls and, later, bound books; scholars copied them by hand, and every copy carried small mistakes that later readers tried to correct. Printing changed that, and computers changed it again.

To bake a simple loaf, mix five hundred grams of flour with ten grams of salt, seven grams of yeast and three hundred and fifty millilitres of warm water. Knead the dough for ten minutes, let it rise for an hour, shape it, let it rise again, and bake it at two hundred and twenty degrees for about thirty five minutes.

Scientists measure things carefully and report their uncertainty. A result that cannot be reproduced is not yet a result. Good experiments change one variable at a time, keep a control group, write down every setting, and compare the outcome with an independent reference rather than with the expectation of the person who ran them.

The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How vexingly quick daft zebras jump! Sphinx of black quartz, judge my vow. The five boxing wizards jump quickly. Jackdaws love my big sphinx of quartz.

Mountains, rivers, forests and deserts shape where people live. Cities grow along coasts and rivers because water carries trade; villages in the hills keep older languages and older customs. Travellers notice the differences first in food, then in music, and only later in the way people think about time, family and work.

Questions and answers. What is the capital of France? Paris. How many days are there in a leap year? Three hundred and sixty six. Who wrote the novel about the white whale? Herman Melville. Why is the sky blue? Because air scatters short wavelengths of sunlight more strongly than long ones.

Please summarize the following document in three sentences. Translate this paragraph into German. Write a short poem about the sea. Explain the difference between a process and a thread. List the steps needed to install the package, then run the tests and report any failures.

The assistant should answer helpfully, honestly and concisely. When it is not sure, it says so. When a question needs a tool, it calls the tool with the right arguments, reads the result, and then answers the user in plain language without repeating the raw output.

def attention(query, key, value, scale):
    scores = query @ key.transpose(-1, -2) * scale
    weights = softmax(scores, dim=-1)
    return weights @ value


class Tokenizer:
    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]]) -> None:
        self.vocab = vocab
        self.ranks = {pair: rank for rank, pair in enumerate(merges)}

    def encode(self, text: str) -> list[int]:
        ids = []
        for word in split_words(text):
            ids.extend(self.vocab[piece] for piece in self.merge(word))
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(self.inverse[i] for i in ids)


import json
import os
import sys
from pathlib import Path

def main(argv=None):
    parser = argparse.ArgumentParser(description="Run a model and print the result.")
    parser.add_argument("--model", required=True, help="path to the GGUF file")
    parser.add_argument("--ctx-size", type=int, default=8192)
    parser.add_argument("--temperature", type=float, default=0.7)
    args = parser.parse_args(argv)
    if not os.path.exists(args.model):
        print(f"error: {args.model} does not exist", file=sys.stderr)
        return 1
    config = json.loads(Path(args.model).with_suffix(".json").read_text(encoding="utf-8"))
    for key, value in sorted(config.items()):
        print(f"{key:>24} = {value!r}")
    return 0

if __name__ == "__main__":
    raise SystemExit(main())


__global__ void rms_norm_f32(const float * x, float * dst, const int ncols, const float eps) {
    const int row = blockIdx.x;
    const int tid = threadIdx.x;
    float sum = 0.0f;
    for (int col = tid; col < ncols; col += blockDim.x) {
        const float xi = x[row*ncols + col];
        sum += xi * xi;
    }
    sum = warp_reduce_sum(sum);
    const float scale = rsqrtf(sum / ncols + eps);
    for (int col = tid; col < ncols; col += blockDim.x) {
        dst[row*ncols + col] = scale * x[row*ncols + col];
    }
}

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s <file>\n", argv[0]);
        return EXIT_FAILURE;
    }
    FILE * fp = fopen(argv[1], "rb");
    if (fp == NULL) {
        perror("fopen");
        return EXIT_FAILURE;
    }
    size_t total = 0;
    char buffer[4096];
    while (!feof(fp)) {
        total += fread(buffer, 1, sizeof(buffer), fp);
    }
    fclose(fp);
    printf("%zu bytes\n", total);
    return EXIT_SUCCESS;
}

{"model": "qwen3.8-27b", "messages": [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is the weather like in Berlin today?"}], "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather for a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}], "temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 1024, "stream": true}

{"id": "chatcmpl-7", "object": "chat.completion", "created": 1764547200, "choices": [{"index": 0, "message": {"role": "assistant", "content": "It is sunny and eleven degrees in Berlin.", "reasoning_content": "The user wants the weather; I called the tool and got the answer."}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 312, "completion_tokens": 48, "total_tokens": 360}}

$ pip install --upgrade openjet-launcher
$ openjet-launch --model ~/models/Qwen3.8-27B-Q4_K_M.gguf --port 8080 --ctx-size 65536
$ curl -s http://localhost:8080/v1/chat/completions -H "Content-Type: application/json" -d @request.json | jq .
$ nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
$ git log --oneline -n 5 && git status --short && make -j8 && ctest --output-on-failure

| quant | bits per weight | file size | tokens per second |
|-------|-----------------|-----------|-------------------|
| Q4_K_M | 4.85 | 16.5 GiB | 61.2 |
| Q5_K_M | 5.69 | 19.3 GiB | 53.8 |
| Q8_0 | 8.50 | 28.7 GiB | 37.4 |

server:
  host: 127.0.0.1
  port: 8080
  max_batch: 4
  timeout_seconds: 600
logging:
  level: info
  file: /var/log/openjet/server.log

# Release notes
## Added
- Speculative decoding with the multi-token prediction head.
- A tray icon that shows the model state and the memory in use.
## Fixed
- The server no longer crashes when a client disconnects in the middle of a stream.
- Long prompts are prefilled in chunks, so the first token arrives sooner.

Die Sonne scheint heute über der Stadt, und die Straßen sind voller Menschen. Können Sie mir bitte sagen, wie ich zum Bahnhof komme? Gehen Sie geradeaus, dann an der zweiten Kreuzung links. Vielen Dank für Ihre Hilfe und einen schönen Tag noch!

Le modèle lit le texte, le découpe en jetons et prédit le suivant. Où se trouve la gare, s'il vous plaît ? Elle est à côté de l'hôtel de ville, après le marché. Les enfants jouent dans le jardin pendant que leurs parents préparent le déjeuner.

El niño corre por la playa mientras su madre lee un libro bajo la sombrilla. ¿Cuánto cuesta este café? ¡Qué día tan bonito! Mañana iremos a la montaña con nuestros amigos y volveremos el domingo por la noche.

La pizza napoletana è semplice: farina, acqua, sale, lievito, pomodoro e mozzarella. Il forno deve essere molto caldo. Perché non proviamo a cucinarla insieme questa sera? Così impariamo qualcosa di nuovo.

A cidade acordou devagar, com o cheiro de pão e café. As crianças correram para a escola e os pescadores voltaram do mar com redes cheias. Não há nada melhor do que uma manhã tranquila à beira do rio.

Модель читает текст, делит его на токены и предсказывает следующий. Сегодня в городе тепло и солнечно. Где находится ближайшая станция метро? Спасибо большое, вы мне очень помогли. Привет, как дела?

Η γλώσσα είναι ζωντανή και αλλάζει με τον χρόνο. Καλημέρα σας, τι κάνετε σήμερα; Ο καιρός είναι όμορφος και η θάλασσα είναι ήρεμη.

今天天气很好，我们一起去公园散步吧。模型读取文本，把它切分成词元，然后预测下一个词元。请问火车站怎么走？谢谢你的帮助。我喜欢学习新的语言和编程。

今日はとても良い天気ですね。モデルは文章を読み、トークンに分けて、次のトークンを予測します。駅はどこですか？ありがとうございます。日本語を勉強しています。

오늘은 날씨가 정말 좋네요. 모델은 텍스트를 읽고 토큰으로 나눈 다음 다음 토큰을 예측합니다. 기차역이 어디에 있나요? 감사합니다.

الطقس جميل اليوم في المدينة. يقرأ النموذج النص ويقسمه إلى رموز ثم يتنبأ بالرمز التالي. شكرا جزيلا على مساعدتك.

आज मौसम बहुत अच्छा है। मॉडल पाठ को पढ़ता है, उसे टोकन में बाँटता है और अगले टोकन का अनुमान लगाता है। धन्यवाद।

Hôm nay trời đẹp quá. Mô hình đọc văn bản, chia nó thành các token và dự đoán token tiếp theo. Cảm ơn bạn rất nhiều. Việt Nam là một đất nước xinh đẹp.

ภาษาไทยไม่มีช่องว่างระหว่างคำ วันนี้อากาศดีมาก ขอบคุณครับ

Emoji and symbols: 🙂 😀 🚀 🦙 ✅ ❌ ⭐ 🎉 👍 ❤️ 👩‍💻 🇩🇪 → ← ↑ ↓ ± × ÷ ≤ ≥ ≠ ≈ ∞ √ ∑ ∫ π λ μ σ Ω € £ ¥ © ® ™ § ¶ … — – « » „ “ ” ‘ ’ • · °

Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 256 1024 4096 65536 3.14159 2.71828 1e-6 -0.5 +1 1,000,000 12:30 2026-11-30 v0.3.36 #12 50% 0x7f 0b1010
"""
