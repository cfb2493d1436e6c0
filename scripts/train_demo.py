#!/usr/bin/env python3
"""Train OpenJet's `demo` model: a small Qwen3.8-architecture model with a working MTP head (issue 10).

    python3 scripts/train_demo.py --device cuda --out demo.gguf          # the GPU run (docs/DEMO_MODEL.md)
    python3 scripts/train_demo.py --preset toy --device cpu --steps 20   # the CPU proof at toy scale

Design (the one idea worth a note):
* The trunk is transformers' `Qwen3_5ForCausalLM`, made by `hf_convert.tiny_hf_config`, so the per-head sizes
  are the family's (attention 256 with 64 rotary dims, DeltaNet 128) and the 3:1 layer pattern is HF's own.
* The MTP head is `MTPHead` below, qwen38.md §3.3 in torch: for the pair (x_{t+1}, h_t), with h_t the trunk's
  post-final-norm hidden state (`model.model(...).last_hidden_state`, after `model.model.norm`),
  c = [rms(E[x_{t+1}]) ‖ rms(h_t)] (HF's 1+w norms), u = fc c, one full-attention `Qwen3_5DecoderLayer`,
  h' = rms(u, mtp.norm), logits = lm_head h' (shared). Its state dict names, prefixed `mtp.`, are the HF
  names `hf_convert.hf_to_gguf` maps onto blk.{n_layer}.nextn.* and blk.{n_layer}.*.
  Pairs sit at the position of x_{t+1} (1..T-2), as in the reference engine (reference/engine.py).
* Loss = CE(next token) + mtp_weight * CE(next-next token from the MTP head), teacher-forced, one batch.
* Text: the Python standard library's own source files (walked in sorted order; every 40th file by a
  path hash held out as the code split for the MTP acceptance measurement) and a synthetic chat corpus
  rendered with our chat template (arithmetic, "what does X do" from the stdlib's docstrings, small code
  tasks, greetings, thinking blocks, and XML tool calls with tool responses).
* Export: `hf_to_gguf(..., recipe="unsloth")`, then self-checks on the file: inspect (unsloth Q4_K_M, MTP
  head), size, torch-vs-reference-engine agreement, greedy chat replies, MTP acceptance per draft position.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import os
import random
import sys
import sysconfig
import time
import zlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout, no install needed

from openjet_launcher.model.hf_convert import hf_to_gguf, load_hf_state, shape_from_hf, tiny_hf_config  # noqa: E402
from openjet_launcher.model.synth import plan_tensors  # noqa: E402
from openjet_launcher.model.vocab import small_vocab  # noqa: E402
from openjet_launcher.sampling import Sampler, SamplingParams  # noqa: E402
from openjet_launcher.speculative import speculative_cycle  # noqa: E402
from openjet_launcher.text.chat import ChatTemplate  # noqa: E402
from openjet_launcher.text.tokenizer import Tokenizer  # noqa: E402

MAX_GGUF_BYTES = 30_000_000          # the limit for a file that ships inside the package
GGUF_HEADER_ALLOWANCE = 400_000      # metadata: 8k tokens, merges, chat template

# Model sizes (overrides of tiny_hf_config). `demo`: 26.7 MB of unsloth Q4_K_M tensors; 3 DeltaNet value
# heads per key head as in the 27B (16/48); hidden and ffn multiples of 256 for the k-quants.
MODELS: dict[str, dict] = {
    "demo": dict(vocab_size=8192, hidden_size=512, intermediate_size=1280, num_hidden_layers=8,
                 num_attention_heads=4, num_key_value_heads=2, linear_num_key_heads=2, linear_num_value_heads=6,
                 max_position_embeddings=4096),
    "toy": dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, linear_num_key_heads=2, linear_num_value_heads=6,
                max_position_embeddings=4096),
}


@dataclass(frozen=True)
class Settings:
    model: str                  # key of MODELS
    seq_len: int                # tokens per training row
    batch: int                  # rows per step
    lr: float                   # AdamW peak learning rate (cosine to lr * min_lr_frac)
    warmup: int                 # linear warm-up steps
    minutes: float              # training budget when --steps is not given
    max_steps: int              # upper bound on steps (the budget decides below it)
    code_bytes: int             # stdlib source bytes read (train + held out)
    n_chats: int                # synthetic conversations
    chat_frac: float            # share of training rows drawn from the chat stream
    mtp_weight: float = 0.3
    weight_decay: float = 0.1
    min_lr_frac: float = 0.1
    log_every: int = 50
    ckpt_every: int = 1000
    eval_windows: int = 32      # held-out code windows for the teacher-forced metrics
    accept_prompts: int = 6     # held-out code prompts for the engine's speculative acceptance
    accept_tokens: int = 48     # tokens generated per acceptance prompt
    reply_tokens: int = 160     # greedy reply length for the chat prompts
    min_first_draft_rate: float = 0.0   # the acceptance bar for the MTP head's first draft


# One GPU command may run 10 minutes (the device notes), so the default budget leaves ~3 minutes for the
# corpus (~30 s), the export and the CPU self-checks (~1 min on a 2-core machine).
PRESETS: dict[str, Settings] = {
    "demo": Settings("demo", seq_len=512, batch=64, lr=2e-3, warmup=100, minutes=6.5, max_steps=100_000,
                     code_bytes=40_000_000, n_chats=30_000, chat_frac=0.35, min_first_draft_rate=0.4),
    "toy": Settings("toy", seq_len=64, batch=4, lr=3e-3, warmup=2, minutes=1.0, max_steps=100_000,
                    code_bytes=300_000, n_chats=200, chat_frac=0.35, log_every=5, ckpt_every=10_000,
                    eval_windows=4, accept_prompts=2, accept_tokens=12, reply_tokens=16),
}
N_DRAFT = 3
HELD_OUT_EVERY = 40             # a file is held out when crc32(relative path) % 40 == 0


def log(msg: str) -> None:
    print(f"[train_demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ============================================================================================ the corpus

def stdlib_files(max_bytes: int, root: str | None = None) -> list[tuple[str, str]]:
    """(relative path, text) of the stdlib's .py files in sorted walk order, up to `max_bytes` of text."""
    root = root or sysconfig.get_paths()["stdlib"]
    out, total = [], 0
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in ("site-packages", "dist-packages", "__pycache__"))
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(d, f)
            text = Path(path).read_text(encoding="utf-8", errors="replace")
            if not text.strip():
                continue
            out.append((os.path.relpath(path, root).replace(os.sep, "/"), text))
            total += len(text)
            if total >= max_bytes:
                return out
    return out


def is_held_out(rel: str) -> bool:
    return zlib.crc32(rel.encode()) % HELD_OUT_EVERY == 0


def docstrings(files: list[tuple[str, str]], limit: int = 5000) -> list[tuple[str, str, str]]:
    """(qualified name, signature, first paragraph of the docstring) of public top-level functions and
    classes; files that do not parse under this Python (old syntax in test data) are skipped."""
    out = []
    for rel, text in files:
        if "/test" in "/" + rel or rel.startswith("idlelib/idle_test"):
            continue
        module = rel[:-3].replace("/", ".").removesuffix(".__init__")
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node) or ""
            para = " ".join(doc.split("\n\n")[0].split())
            if not 20 <= len(para) <= 400:
                continue
            sig = ""
            if isinstance(node, ast.FunctionDef):
                sig = "(" + ", ".join(a.arg for a in node.args.args) + ")"
            out.append((f"{module}.{node.name}", sig, para))
            if len(out) >= limit:
                return out
    return out


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "calculator", "description": "Evaluate an arithmetic expression.",
     "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                    "required": ["expression"]}}},
    {"type": "function", "function": {"name": "read_file", "description": "Read a text file.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                    "max_lines": {"type": "integer"}}, "required": ["path"]}}},
]
CITIES = ["Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "Oslo", "Cairo", "Lima", "Seoul", "Austin",
          "Toronto", "Sydney", "Nairobi", "Lisbon", "Dublin"]
WEATHER = ["sunny", "cloudy", "rainy", "windy", "foggy", "snowy", "clear"]
GREETINGS = [
    ("Hello!", "Hello! How can I help you today?"),
    ("Hi, who are you?", "I am OpenJet's demo model, a small model with the Qwen3.8 architecture, trained on "
                         "the Python standard library. I can answer simple questions about Python."),
    ("What can you do?", "I can explain functions from the Python standard library, write small Python "
                         "functions, do simple arithmetic and call tools when you give me some."),
    ("Thank you!", "You are welcome!"),
    ("Good morning.", "Good morning! What would you like to talk about?"),
]
CODE_TASKS = [
    ("adds two numbers", "def add(a, b):\n    return a + b"),
    ("reverses a string", "def reverse(text):\n    return text[::-1]"),
    ("returns the square of a number", "def square(x):\n    return x * x"),
    ("checks whether a number is even", "def is_even(n):\n    return n % 2 == 0"),
    ("computes the factorial of n", "def factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n"
                                    "        result *= i\n    return result"),
    ("returns the largest item of a list", "def largest(items):\n    return max(items)"),
    ("counts the words in a string", "def count_words(text):\n    return len(text.split())"),
    ("returns the n-th Fibonacci number", "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n"
                                          "        a, b = b, a + b\n    return a"),
    ("removes duplicates from a list", "def unique(items):\n    return list(dict.fromkeys(items))"),
    ("reads a file and returns its lines", "def read_lines(path):\n    with open(path) as f:\n"
                                           "        return f.read().splitlines()"),
    ("checks whether a string is a palindrome", "def is_palindrome(text):\n    return text == text[::-1]"),
    ("sums the numbers in a list", "def total(numbers):\n    return sum(numbers)"),
]


def synthetic_chats(n: int, docs: list[tuple[str, str, str]], seed: int) -> list[dict]:
    """`n` conversations as template inputs: {"messages", "tools", "enable_thinking"}; deterministic in seed."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = rng.choices(["math", "doc", "code", "hello", "tool"], weights=[3, 4, 2, 1, 2])[0]
        if kind == "doc" and not docs:
            kind = "math"
        tools = None
        if kind == "math":
            a, b = rng.randint(0, 99), rng.randint(1, 99)
            op, val = rng.choice([("+", a + b), ("-", a - b), ("*", a * b)])
            q = rng.choice(["What is {a} {op} {b}?", "Compute {a} {op} {b}.", "How much is {a} {op} {b}?"])
            msgs = [{"role": "user", "content": q.format(a=a, op=op, b=b)},
                    {"role": "assistant", "reasoning_content": f"{a} {op} {b} = {val}.",
                     "content": f"{a} {op} {b} = {val}."}]
        elif kind == "doc":
            name, sig, para = rng.choice(docs)
            q = rng.choice(["What does `{n}` do?", "Explain {n} from the Python standard library.",
                            "What is {n} for?"])
            msgs = [{"role": "user", "content": q.format(n=name)},
                    {"role": "assistant", "reasoning_content": f"The user asks about {name}. Its documentation "
                                                               f"says: {para.split('. ')[0]}.",
                     "content": f"`{name}{sig}`: {para}"}]
        elif kind == "code":
            task, code = rng.choice(CODE_TASKS)
            q = rng.choice(["Write a Python function that {t}.", "Show me a function that {t}.",
                            "How do I write a function that {t} in Python?"])
            msgs = [{"role": "user", "content": q.format(t=task)},
                    {"role": "assistant", "reasoning_content": f"A short function that {task} is enough.",
                     "content": f"Here is a function that {task}:\n\n```python\n{code}\n```"}]
        elif kind == "hello":
            q, a = rng.choice(GREETINGS)
            msgs = [{"role": "user", "content": q},
                    {"role": "assistant", "reasoning_content": "A friendly, short answer.", "content": a}]
        else:
            tools = TOOLS
            msgs = _tool_conversation(rng)
        think = rng.random() > 0.2
        if not think:
            for m in msgs:
                m.pop("reasoning_content", None)
        out.append({"messages": msgs, "tools": tools, "enable_thinking": think})
    return out


def _tool_conversation(rng: random.Random) -> list[dict]:
    which = rng.choice(["get_weather", "calculator", "read_file"])
    if which == "get_weather":
        city, sky, temp = rng.choice(CITIES), rng.choice(WEATHER), rng.randint(-5, 35)
        user, args = f"What's the weather in {city}?", {"city": city}
        result = json.dumps({"city": city, "temperature_c": temp, "sky": sky})
        answer = f"It is {temp}°C and {sky} in {city}."
    elif which == "calculator":
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        user, args = f"Use the calculator: what is {a} * {b}?", {"expression": f"{a} * {b}"}
        result, answer = str(a * b), f"{a} * {b} = {a * b}."
    else:
        path = rng.choice(["README.md", "setup.cfg", "notes.txt", "main.py"])
        user, args = f"Show me the first lines of {path}.", {"path": path, "max_lines": 3}
        result, answer = "line one\nline two\nline three", f"The first lines of {path} are:\n\nline one\n" \
                                                            "line two\nline three"
    return [{"role": "user", "content": user},
            {"role": "assistant", "reasoning_content": f"I should call {which}.", "content": "",
             "tool_calls": [{"type": "function", "function": {"name": which, "arguments": args}}]},
            {"role": "tool", "content": result},
            {"role": "assistant", "reasoning_content": "The tool answered.", "content": answer}]


@dataclass
class Corpus:
    code_train: np.ndarray      # token stream, documents separated by <|endoftext|>
    code_held_out: np.ndarray
    chat: np.ndarray
    held_out_files: list[str]
    stats: dict


def build_corpus(s: Settings, tok: Tokenizer, template: ChatTemplate, seed: int) -> Corpus:
    t0 = time.perf_counter()
    files = stdlib_files(s.code_bytes)
    eot = tok.bos_id                                    # <|endoftext|> separates documents
    train, held, held_names = [], [], []
    for rel, text in files:
        ids = tok.encode(f"# {rel}\n{text}") + [eot]
        (held if is_held_out(rel) else train).append(ids)
        if is_held_out(rel):
            held_names.append(rel)
    while train and sum(map(len, held)) < 8 * s.seq_len:   # tiny caps: make sure there is a code split
        held.append(train.pop())
        held_names.append("(a training file moved to the held-out split)")
    docs = docstrings(files)
    chats = []
    for c in synthetic_chats(s.n_chats, docs, seed):
        text = template.render(c["messages"], tools=c["tools"], add_generation_prompt=False,
                               enable_thinking=c["enable_thinking"])
        chats.append(tok.encode(text, allow_special=True) + [eot])
    cat = lambda parts: np.fromiter((i for p in parts for i in p), dtype=np.int64)  # noqa: E731
    corpus = Corpus(cat(train), cat(held), cat(chats), held_names, {})
    corpus.stats = {"stdlib_files": len(files), "stdlib_bytes": sum(len(t) for _, t in files),
                    "held_out_files": len(held_names), "docstrings": len(docs), "chats": len(chats),
                    "code_train_tokens": len(corpus.code_train), "code_held_out_tokens": len(corpus.code_held_out),
                    "chat_tokens": len(corpus.chat), "seconds": round(time.perf_counter() - t0, 1)}
    return corpus


# ============================================================================================ the model

def model_config(name: str, device: str):
    return tiny_hf_config(**MODELS[name], attn_implementation="sdpa" if device == "cuda" else "eager")


def gguf_tensor_bytes(config) -> int:
    """Bytes of the unsloth Q4_K_M tensors of this config with its MTP head (synth.plan_tensors)."""
    return sum(p.n_bytes for p in plan_tensors(shape_from_hf(config, with_mtp=True), with_mtp=True))


def _torch():
    import torch
    return torch


def mtp_head_class():
    """The MTPHead class, defined on first use so that importing this script does not import torch."""
    torch = _torch()
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

    class MTPHead(torch.nn.Module):
        """qwen38.md §3.3 with HF weights (norms 1+w). Names = HF's `mtp.*` without the prefix."""

        def __init__(self, config):
            super().__init__()
            h, eps = config.hidden_size, config.rms_norm_eps
            self.pre_fc_norm_embedding = Qwen3_5RMSNorm(h, eps=eps)
            self.pre_fc_norm_hidden = Qwen3_5RMSNorm(h, eps=eps)
            self.fc = torch.nn.Linear(2 * h, h, bias=False)
            self.layers = torch.nn.ModuleList(
                [Qwen3_5DecoderLayer(config, config.layer_types.index("full_attention"))])
            self.norm = Qwen3_5RMSNorm(h, eps=eps)
            self.attn_implementation = config._attn_implementation

        def forward(self, next_embeds, hidden, position_embeddings):
            """next_embeds E[x_{t+1}] and hidden h_t, both [B, T, H] -> h' [B, T, H] (post mtp.norm)."""
            c = torch.cat([self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)], dim=-1)
            u = self.fc(c)
            mask = None                               # sdpa: None means causal (is_causal on the module)
            if self.attn_implementation == "eager":   # eager adds the mask: build the causal one
                t = u.shape[1]
                mask = torch.full((t, t), torch.finfo(u.dtype).min, device=u.device, dtype=u.dtype).triu(1)
                mask = mask[None, None]
            u = self.layers[0](u, position_embeddings=position_embeddings, attention_mask=mask)
            return self.norm(u)

    return MTPHead


def build_model(config, seed: int):
    torch = _torch()
    from transformers import Qwen3_5ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(config)
    mtp = mtp_head_class()(config)
    with torch.no_grad():                             # HF's own scheme: N(0, 0.02) matrices, zero (1+w) norms
        for name, p in mtp.named_parameters():
            if p.ndim == 2:
                p.normal_(0.0, config.initializer_range)
            else:
                p.zero_()
    return model, mtp


def mtp_state_dict(mtp) -> dict:
    return {f"mtp.{k}": v for k, v in mtp.state_dict().items()}


def forward_losses(model, mtp, x):
    """(lm loss, mtp loss, main logits, mtp logits) for token rows x [B, T], teacher-forced."""
    torch = _torch()
    F = torch.nn.functional
    hidden = model.model(input_ids=x).last_hidden_state          # after model.model.norm: h_t of §3.3
    logits = model.lm_head(hidden)
    lm = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), x[:, 1:].flatten())
    mtp_logits = mtp_logits_for(model, mtp, x[:, 1:-1], hidden[:, :-2], start=1)
    mt = F.cross_entropy(mtp_logits.flatten(0, 1).float(), x[:, 2:].flatten())
    return lm, mt, logits, mtp_logits


def mtp_head_outputs(model, mtp, next_tokens, hidden, start: int):
    """The MTP head's h' for pairs (next_tokens[:, i], hidden[:, i]) at positions start + i (causal)."""
    torch = _torch()
    b, t = next_tokens.shape
    pos = torch.arange(start, start + t, device=next_tokens.device)[None, None].expand(3, b, t)
    emb = model.model.embed_tokens(next_tokens)
    return mtp(emb, hidden, model.model.rotary_emb(emb, pos))


def mtp_logits_for(model, mtp, next_tokens, hidden, start: int):
    return model.lm_head(mtp_head_outputs(model, mtp, next_tokens, hidden, start))


# ============================================================================================ training

def sample_batch(rng: np.random.Generator, corpus: Corpus, s: Settings, n_rows: int | None = None):
    rows = []
    for _ in range(n_rows or s.batch):
        stream = corpus.chat if rng.random() < s.chat_frac else corpus.code_train
        at = int(rng.integers(0, len(stream) - s.seq_len))
        rows.append(stream[at:at + s.seq_len])
    return np.stack(rows)


def lr_at(step: int, total: int, s: Settings) -> float:
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    frac = min(1.0, (step - s.warmup) / max(1, total - s.warmup))
    return s.lr * (s.min_lr_frac + (1 - s.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))


def make_optimizer(model, mtp, s: Settings, device: str):
    torch = _torch()
    params = [p for m in (model, mtp) for p in m.parameters()]
    decay = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]                 # norms, A_log, dt_bias
    kw = {"fused": True} if device == "cuda" else {}
    return torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=s.lr, betas=(0.9, 0.95), eps=1e-8, **kw)


def train(model, mtp, corpus: Corpus, s: Settings, device: str, steps: int | None, seed: int,
          ckpt: Path | None) -> dict:
    torch = _torch()
    model.train(), mtp.train()
    opt = make_optimizer(model, mtp, s, device)
    rng = np.random.default_rng(seed)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else torch.autocast(
        "cpu", enabled=False)
    total = steps if steps is not None else s.max_steps
    budget_s = s.minutes * 60
    history, t_start, t_timed = [], time.perf_counter(), None
    step = 0
    while step < total:
        x = torch.from_numpy(sample_batch(rng, corpus, s)).to(device)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, s)
        with autocast:
            lm, mt, _, _ = forward_losses(model, mtp, x)
            loss = lm + s.mtp_weight * mt
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_([p for m in (model, mtp) for p in m.parameters()], 1.0)
        opt.step()
        step += 1
        if step == 5:
            if device == "cuda":
                torch.cuda.synchronize()
            t_timed = time.perf_counter()
        if steps is None and step == 25:              # fix the schedule's length from the measured step time
            if device == "cuda":
                torch.cuda.synchronize()
            per_step = (time.perf_counter() - t_timed) / 20
            total = max(s.warmup + 1, min(s.max_steps, int((budget_s - (time.perf_counter() - t_start)) / per_step)
                                         + step))
            log(f"{per_step * 1000:.0f} ms/step -> {total} steps in {s.minutes:g} min "
                f"({total * s.batch * s.seq_len / 1e6:.0f}M tokens)")
        if step % s.log_every == 0 or step == total or step == 1:
            rec = {"step": step, "loss": round(lm.item(), 4), "mtp_loss": round(mt.item(), 4),
                   "lr": round(opt.param_groups[0]["lr"], 6), "grad_norm": round(float(gnorm), 3),
                   "seconds": round(time.perf_counter() - t_start, 1)}
            history.append(rec)
            log(" ".join(f"{k} {v}" for k, v in rec.items()))
        if ckpt is not None and step % s.ckpt_every == 0:
            save_checkpoint(ckpt, model, mtp, step, s)
        if steps is None and time.perf_counter() - t_start > budget_s * 1.1:
            log(f"budget exceeded at step {step} of {total}: stopping")
            break
    if ckpt is not None:
        save_checkpoint(ckpt, model, mtp, step, s)
    model.eval(), mtp.eval()
    elapsed = time.perf_counter() - t_start
    return {"steps": step, "planned_steps": total, "seconds": round(elapsed, 1),
            "tokens": step * s.batch * s.seq_len, "history": history}


def save_checkpoint(path: Path, model, mtp, step: int, s: Settings) -> None:
    torch = _torch()
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "mtp": mtp.state_dict(), "step": step, "settings": asdict(s)}, tmp)
    tmp.replace(path)


# ============================================================================================ checks

def teacher_forced_metrics(model, mtp, corpus: Corpus, s: Settings, device: str, seed: int) -> dict:
    """On held-out code windows: losses, top-1 accuracies, and how often the MTP argmax at pair t equals
    the trunk's argmax at position t+1 (the first draft's acceptance when the text is the model's own)."""
    torch = _torch()
    rng = np.random.default_rng(seed + 1)
    fake = Corpus(corpus.code_held_out, corpus.code_held_out, corpus.code_held_out, [], {})
    x = torch.from_numpy(sample_batch(rng, fake, replace(s, chat_frac=0.0), s.eval_windows)).to(device)
    sums = {k: 0.0 for k in ("loss", "mtp_loss", "top1", "mtp_top1", "mtp_agrees_with_trunk")}
    with torch.no_grad():
        for row in x.split(8):
            lm, mt, logits, mlog = forward_losses(model, mtp, row)
            am, amt = logits.argmax(-1), mlog.argmax(-1)
            n = len(row) / len(x)
            sums["loss"] += lm.item() * n
            sums["mtp_loss"] += mt.item() * n
            sums["top1"] += (am[:, :-1] == row[:, 1:]).float().mean().item() * n
            sums["mtp_top1"] += (amt == row[:, 2:]).float().mean().item() * n
            sums["mtp_agrees_with_trunk"] += (amt == am[:, 1:-1]).float().mean().item() * n
    return {k: round(v, 4) for k, v in sums.items()}


def engine_vs_torch(engine, model, mtp, ids: list[int]) -> dict:
    """Max |diff| / max |value| between our reference engine and torch, on the trunk's logits and on two
    chained MTP drafts after prefilling ids[:-1] (§3.3 steps 1-5). Torch must hold the file's weights."""
    torch = _torch()
    state = engine.new_state()
    prefix, nxt = ids[:-1], ids[-1]
    ref_logits = engine.prefill(state, prefix, all_logits=True).logits
    draft = engine.mtp_draft(state, nxt, n_draft=2)
    with torch.no_grad():
        x = torch.tensor([prefix + [nxt]])
        hidden = model.model(input_ids=x).last_hidden_state
        logits = model.lm_head(hidden)[0, :-1].numpy()
        # pairs (x_{i+1}, h_i) for i = 0..n-1 at positions 1..n, then the chained pair (d_1, h'_n) at n+1
        n = len(prefix)
        hp = mtp_head_outputs(model, mtp, x[:, 1:], hidden[:, :n], start=1)
        d1 = torch.tensor([[draft.tokens[0]]])
        toks = torch.cat([x[:, 1:], d1], dim=1)
        hid = torch.cat([hidden[:, :n], hp[:, -1:]], dim=1)
        hp2 = mtp_head_outputs(model, mtp, toks, hid, start=1)
        mtp_logits = model.lm_head(hp2[0, -2:]).numpy()

    def rel(a, b):
        return float(np.abs(a - b).max() / np.abs(b).max())
    return {"trunk_logits": rel(ref_logits, logits), "mtp_draft1": rel(draft.logits[0], mtp_logits[0]),
            "mtp_draft2": rel(draft.logits[1], mtp_logits[1]),
            "same_drafts": [int(t) for t in draft.tokens] == [int(v) for v in mtp_logits.argmax(-1)]}


def speculative_acceptance(engine, prompts: list[list[int]], n_tokens: int, n_draft: int = N_DRAFT) -> dict:
    """Greedy MTP speculation as generate.py runs it (speculative_cycle), counting per draft position k:
    reached (the drafts before k were all accepted) and accepted. Rates: accepted/reached (conditional) and
    accepted/cycles."""
    reached, accepted, cycles = [0] * n_draft, [0] * n_draft, 0
    greedy = Sampler(SamplingParams(temperature=0.0), engine.config.shape.n_vocab)
    for prompt in prompts:
        state = engine.new_state()
        token = int(np.argmax(engine.prefill(state, prompt).logits[-1]))
        made = 1
        while made < n_tokens:
            cycle = speculative_cycle(engine, state, greedy, token, n_draft)
            cycles += 1
            k = len(cycle.accepted)
            for j in range(min(k + 1, n_draft)):
                reached[j] += 1
            for j in range(k):
                accepted[j] += 1
            token = cycle.next_token
            made += k + 1
    return {"cycles": cycles, "n_draft": n_draft, "reached": reached, "accepted": accepted,
            "conditional_rate": [round(a / r, 4) if r else None for a, r in zip(accepted, reached)],
            "rate_per_cycle": [round(a / cycles, 4) if cycles else None for a in accepted],
            "mean_accepted_per_cycle": round(sum(accepted) / cycles, 3) if cycles else None}


REPLY_PROMPTS = [
    ({"content": "Hi, who are you?"}, None),
    ({"content": "What is 12 + 30?"}, None),
    ({"content": "What does `os.path.join` do?"}, None),
    ({"content": "Write a Python function that reverses a string."}, None),
    ({"content": "What's the weather in Paris?"}, TOOLS),
]


def chat_replies(engine, tok: Tokenizer, template: ChatTemplate, n_tokens: int) -> list[dict]:
    from gguf import TokenType

    from openjet_launcher.generate import generate
    from openjet_launcher.sampling import Sampler, SamplingParams

    n_valid = max(i for i in range(tok.n_vocab) if tok.token_type(i) != TokenType.UNUSED) + 1
    out = []
    for msg, tools in REPLY_PROMPTS:
        text = template.render([{"role": "user", **msg}], tools=tools)
        ids = tok.encode(text, allow_special=True)
        gen = generate(engine, engine.new_state(), ids, Sampler(SamplingParams(temperature=0.0), n_valid),
                       n_tokens, stop_ids=tok.eog_ids, n_draft=N_DRAFT)
        reply = tok.decode(gen.tokens)
        out.append({"prompt": msg["content"], "tools": bool(tools), "reply": reply,
                    "tokens": len(gen.tokens), "drafted": gen.drafted, "accepted": gen.accepted})
        log(f"prompt: {msg['content']!r}\n  reply: <think>\n{reply}")
    return out


def self_checks(path: Path, effective: dict, config, corpus: Corpus, s: Settings, tok: Tokenizer,
                template: ChatTemplate, seed: int) -> dict:
    """Everything the issue asks of the file, on the CPU: inspect, size, engines agree, replies, acceptance."""
    torch = _torch()
    from transformers import Qwen3_5ForCausalLM

    from openjet_launcher.model.inspect import format_report, inspect_file
    from openjet_launcher.reference import ReferenceEngine

    report = inspect_file(str(path))
    print(format_report(report), flush=True)
    checks = {"file_bytes": path.stat().st_size, "recipe": report["recipe"]["kind"],
              "mtp_head": report["layers"]["mtp_head"], "runnable": report["runnable"],
              "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    engine = ReferenceEngine.load(path)

    cpu_config = model_config(s.model, "cpu")                       # fp32 eager copy with the file's weights
    model = Qwen3_5ForCausalLM(cpu_config).eval()
    rest = load_hf_state(model, effective)
    mtp = mtp_head_class()(cpu_config).eval()
    mtp.load_state_dict({k[len("mtp."):]: torch.from_numpy(np.array(v)) for k, v in rest.items()}, strict=True)
    probe = [int(t) for t in corpus.code_held_out[:40]]
    checks["engine_vs_torch"] = engine_vs_torch(engine, model, mtp, probe)
    log(f"engine vs torch: {checks['engine_vs_torch']}")
    checks["teacher_forced_held_out"] = teacher_forced_metrics(model, mtp, corpus, s, "cpu", seed)
    log(f"held-out code, teacher-forced: {checks['teacher_forced_held_out']}")

    rng = np.random.default_rng(seed + 2)
    starts = rng.integers(0, len(corpus.code_held_out) - 64, s.accept_prompts)
    prompts = [[int(t) for t in corpus.code_held_out[a:a + 48]] for a in starts]
    t0 = time.perf_counter()
    checks["speculative_held_out_code"] = speculative_acceptance(engine, prompts, s.accept_tokens)
    checks["speculative_held_out_code"]["seconds"] = round(time.perf_counter() - t0, 1)
    log(f"MTP acceptance on held-out code: {checks['speculative_held_out_code']}")
    checks["replies"] = chat_replies(engine, tok, template, s.reply_tokens)
    return checks


# ============================================================================================ main

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="demo")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when available")
    p.add_argument("--out", type=Path, default=Path("openjet-demo.gguf"), help="the GGUF to write")
    p.add_argument("--report", type=Path, default=None, help="JSON report (default: OUT with .json)")
    p.add_argument("--minutes", type=float, default=None, help="training budget (preset's default)")
    p.add_argument("--steps", type=int, default=None, help="train exactly this many steps (overrides --minutes)")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt", type=Path, default=None, help="checkpoint file (default: OUT with .pt)")
    p.add_argument("--resume", type=Path, default=None, help="start from this checkpoint's weights")
    p.add_argument("--no-checks", action="store_true", help="write the file, skip the self-checks")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch = _torch()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    s = PRESETS[args.preset]
    s = replace(s, **{k: v for k, v in (("minutes", args.minutes), ("batch", args.batch),
                                         ("seq_len", args.seq_len)) if v is not None})
    report_path = args.report or args.out.with_suffix(".json")
    ckpt = args.ckpt or args.out.with_suffix(".pt")
    random.seed(args.seed), np.random.seed(args.seed), torch.manual_seed(args.seed)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        torch.set_num_threads(max(1, os.cpu_count() or 1))

    config = model_config(s.model, device)
    tensor_bytes = gguf_tensor_bytes(config)
    if tensor_bytes + GGUF_HEADER_ALLOWANCE > MAX_GGUF_BYTES:
        raise SystemExit(f"model {s.model}: {tensor_bytes} bytes of Q4_K_M tensors exceed {MAX_GGUF_BYTES}")
    log(f"preset {args.preset} on {device}: {MODELS[s.model]} -> {tensor_bytes / 1e6:.2f} MB of unsloth "
        f"Q4_K_M tensors (limit {MAX_GGUF_BYTES / 1e6:.0f} MB)")

    vocab = small_vocab(config.vocab_size)
    tok = Tokenizer(vocab.tokens, vocab.token_types, vocab.merges, bos_id=vocab.bos_id, eos_id=vocab.eos_id,
                    eog_ids=vocab.eot_ids)
    template = ChatTemplate(vocab.chat_template, bos_token="<|endoftext|>", eos_token="<|im_end|>",
                            control_tokens=tok.control_tokens)
    corpus = build_corpus(s, tok, template, args.seed)
    log(f"corpus: {corpus.stats}")

    model, mtp = build_model(config, args.seed)
    if args.resume:
        saved = torch.load(args.resume, map_location="cpu")
        model.load_state_dict(saved["model"]), mtp.load_state_dict(saved["mtp"])
        log(f"resumed from {args.resume} (step {saved['step']})")
    model.to(device), mtp.to(device)
    n_params = sum(p.numel() for m in (model, mtp) for p in m.parameters())
    log(f"{n_params / 1e6:.1f}M parameters (MTP head {sum(p.numel() for p in mtp.parameters()) / 1e6:.1f}M)")
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    training = train(model, mtp, corpus, s, device, args.steps, args.seed, ckpt)
    held_out_torch = teacher_forced_metrics(model, mtp, corpus, s, device, args.seed)
    log(f"held-out code (trained weights, {device}): {held_out_torch}")

    model.to("cpu").float(), mtp.to("cpu").float()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    effective = hf_to_gguf(model, config, args.out, recipe="unsloth", mtp_state=mtp_state_dict(mtp))
    log(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB) in {time.perf_counter() - t0:.1f} s")
    report = {"preset": args.preset, "settings": asdict(s), "model": MODELS[s.model], "device": device,
              "seed": args.seed, "parameters": n_params, "gguf_tensor_bytes": tensor_bytes,
              "corpus": corpus.stats, "training": training, "held_out_trained_weights": held_out_torch,
              "versions": {"torch": torch.__version__, "python": sys.version.split()[0],
                           "transformers": __import__("transformers").__version__}}
    if not args.no_checks:
        report["checks"] = self_checks(args.out, effective, config, corpus, s, tok, template, args.seed)
        c = report["checks"]
        problems = [p for p, bad in [
            (f"file is {c['file_bytes']} bytes, over {MAX_GGUF_BYTES}", c["file_bytes"] > MAX_GGUF_BYTES),
            (f"recipe is {c['recipe']}, not unsloth-Q4_K_M", c["recipe"] != "unsloth-Q4_K_M"),
            ("no MTP head in the file", not c["mtp_head"]),
            (f"engines disagree: {c['engine_vs_torch']}", max(v for k, v in c["engine_vs_torch"].items()
                                                              if k != "same_drafts") > 1e-3),
            (f"MTP first-draft acceptance {c['speculative_held_out_code']['conditional_rate'][0]} < "
             f"{s.min_first_draft_rate}",
             (c["speculative_held_out_code"]["conditional_rate"][0] or 0) < s.min_first_draft_rate)] if bad]
        report["problems"] = problems
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(report, indent=1, default=str) + "\n")
    log(f"report: {report_path}")
    for p in report.get("problems", []):
        log(f"PROBLEM: {p}")
    return report


if __name__ == "__main__":
    sys.exit(1 if main().get("problems") else 0)
