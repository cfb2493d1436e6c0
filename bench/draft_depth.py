"""Draft-depth policies compared on a real model's acceptance (issue 7: "depth reduced after a rejection if that
measures better"). Prints JSON.

    python bench/draft_depth.py [--model openjet_launcher/assets/openjet-demo.gguf] [--prompts 4] [--tokens 160]
                                [--kind random|repeat|code]

Greedy speculation accepts, at a cycle that starts at position p, the longest prefix of the MTP head's chain
of drafts that equals the trunk's greedy tokens; drafting n accepts min(n, r_p), r_p the length of that run
with the deepest draft (7). Both chains depend only on the sequence up to p, so one pass that drafts 7 at
every position of the greedy output records every r_p, and any policy can then be replayed exactly: it picks
n at p, moves to p + 1 + min(n, r_p) and pays the cycle cost of n drafts. Costs: the 27B's measured cycle
times on the H200 (draft_depth.DEFAULT_COST_MS; the reference engine on the CPU says nothing about GPU
costs). Reported per policy: tokens per cycle and modelled tok/s; fixed depths 1..7, the adaptive policy
(draft_depth.DraftDepth, allowed 3 or 7) and the best fixed depth chosen afterwards per prompt.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from openjet_launcher.draft_depth import DEFAULT_COST_MS, MAX_DRAFT, DraftDepth  # noqa: E402
from openjet_launcher.reference.engine import ReferenceEngine  # noqa: E402


def run_lengths(engine: ReferenceEngine, prompt: list[int], n_tokens: int) -> list[int]:
    """r_p for p = 0..n_tokens - 1 of the greedy continuation of prompt (drafting MAX_DRAFT at every p)."""
    state = engine.new_state()
    token = int(np.argmax(engine.prefill(state, prompt).logits[-1]))
    runs = []
    for _ in range(n_tokens):
        drafts = engine.mtp_draft(state, token, MAX_DRAFT).tokens
        out = engine.verify(state, [token, *drafts])
        targets = [int(np.argmax(row)) for row in out.logits]
        r = 0
        while r < len(drafts) and drafts[r] == targets[r]:
            r += 1
        runs.append(r)
        engine.accept(state, 1)                 # advance by the one verified token: r at every position
        token = targets[0]
    return runs


def code_windows(model: str, n: int, rng) -> list[list[int]]:
    """n windows of 64 tokens, each from a random Python file of this interpreter's standard library."""
    import sysconfig

    from openjet_launcher.model.gguf_file import GGUFFile
    from openjet_launcher.text.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(GGUFFile(model))
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    out: list[list[int]] = []
    while len(out) < n:
        ids = tok.encode(files[int(rng.integers(len(files)))].read_text(errors="replace")[:20000])
        if len(ids) >= 128:
            start = int(rng.integers(0, len(ids) - 64))
            out.append(ids[start:start + 64])
    return out


def replay(runs: list[int], choose, observe=None) -> dict:
    """A policy over one prompt's runs: choose(limit) -> n; observe(n, accepted, ms) after each cycle."""
    p = cycles = 0
    ms = 0.0
    while p < len(runs):
        n = choose(len(runs) - p)
        k = min(n, runs[p])
        cost = DEFAULT_COST_MS[n]
        if observe:
            observe(n, k, cost)
        ms += cost
        cycles += 1
        p += 1 + k
    tokens = p
    return {"tokens": tokens, "cycles": cycles, "tokens_per_cycle": tokens / cycles, "tok_s": tokens / ms * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "openjet_launcher" / "assets" / "openjet-demo.gguf"))
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kind", choices=("random", "repeat", "code"), default="random",
                    help="prompts of 24 random ids; a random 8-id phrase said 3 times (the drafts of text "
                         "that repeats); or 64-token windows of Python files of the standard library (the "
                         "demo model was trained on code)")
    a = ap.parse_args()

    t0 = time.perf_counter()
    engine = ReferenceEngine.load(a.model)
    if not engine.config.has_mtp:
        raise SystemExit(f"{a.model} has no MTP head: nothing to draft with")
    rng = np.random.default_rng(a.seed)
    vocab = engine.config.shape.n_vocab

    code = code_windows(a.model, a.prompts, rng) if a.kind == "code" else []

    def prompt() -> list[int]:
        if a.kind == "code":
            return code.pop()
        return rng.integers(0, vocab, 24).tolist() if a.kind == "random" else rng.integers(0, vocab, 8).tolist() * 3

    all_runs = [run_lengths(engine, prompt(), a.tokens) for _ in range(a.prompts)]

    policies: dict[str, list[dict]] = {f"fixed {n}": [] for n in range(1, MAX_DRAFT + 1)}
    for m in (3, MAX_DRAFT):
        policies[f"adaptive, at most {m}"] = []
    for runs in all_runs:
        for n in range(1, MAX_DRAFT + 1):
            policies[f"fixed {n}"].append(replay(runs, lambda limit, n=n: min(n, limit)))
        for m in (3, MAX_DRAFT):
            depth = DraftDepth(m)
            policies[f"adaptive, at most {m}"].append(replay(runs, depth.next,
                                                             lambda n, k, ms, d=depth: d.update(n, k)))
    summary = {}
    for name, rows in policies.items():
        tokens, ms = sum(r["tokens"] for r in rows), sum(r["tokens"] / r["tok_s"] * 1e3 for r in rows)
        summary[name] = {"tok_s": round(tokens / ms * 1e3, 2),
                         "tokens_per_cycle": round(tokens / sum(r["cycles"] for r in rows), 3),
                         "per_prompt_tok_s": [round(r["tok_s"], 2) for r in rows]}
    best_after = [max(policies[f"fixed {n}"][i]["tok_s"] for n in range(1, MAX_DRAFT + 1)) for i in range(a.prompts)]
    runs_hist = np.bincount(np.concatenate([np.asarray(r) for r in all_runs]), minlength=MAX_DRAFT + 1)
    json.dump({
        "bench": "draft-depth policies, exact greedy replay", "model": Path(a.model).name,
        "prompts": a.prompts, "prompt_kind": a.kind, "tokens_per_prompt": a.tokens,
        "run_length_histogram": runs_hist.tolist(),
        "first_draft_acceptance": round(float((np.concatenate(all_runs) > 0).mean()), 3),
        "cost_ms_by_n": [round(c, 3) for c in DEFAULT_COST_MS],
        "policies": summary,
        "best_fixed_per_prompt_tok_s (hindsight bound)": [round(v, 2) for v in best_after],
        "seconds": round(time.perf_counter() - t0, 1),
    }, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
