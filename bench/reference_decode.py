"""Speed of the numpy reference engine (a benchmark, not a test): prints one JSON object.

    python bench/reference_decode.py                      # tiny synthetic model, generated in a temp dir
    python bench/reference_decode.py --preset small
    python bench/reference_decode.py --model some.gguf --runs 7 --steps 128

decode: median over --runs of --steps single-token decode steps, each run from a copy of the same
64-token prefilled state. prefill: median over --runs of one --prefill-tokens prefill (chunk 64).
draft: median over --runs of one 3-token chained MTP draft. weights_gb_s: float32 weight bytes a decode
step reads (trunk, lm_head, the MTP head's eh_proj and k/v for its cache) over its time; a rough figure:
the tiny model's 34 MB nearly fit in the CPU caches, and numpy's per-call overhead is a good part of a step.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from openjet_launcher.model.synth import synthesize  # noqa: E402
from openjet_launcher.reference import ReferenceEngine  # noqa: E402


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        blas = f"{blas.get('name')} {blas.get('version')}"
    except Exception:       # noqa: BLE001 - informational only
        blas = "unknown"
    threads = {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                          "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__, "blas": blas, "blas_env": threads}


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(engine: ReferenceEngine, runs: int, steps: int, prefill_tokens: int) -> dict:
    s = engine.config.shape
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, s.n_vocab, 64)
    steps_ids = rng.integers(0, s.n_vocab, steps)
    long_prompt = rng.integers(0, s.n_vocab, prefill_tokens)
    base = engine.new_state()
    engine.prefill(base, prompt)
    decode_one = lambda st: [engine.decode(st, [t]) for t in steps_ids]   # noqa: E731
    decode_one(base.copy())                                                 # warm-up

    decode_s = [timed(lambda: decode_one(base.copy())) for _ in range(runs)]
    prefill_s = [timed(lambda: engine.prefill(engine.new_state(), long_prompt)) for _ in range(runs)]
    draft_s = ([timed(lambda: engine.mtp_draft(base, int(prompt[0]), n_draft=3)) for _ in range(runs)]
               if engine.weights.mtp is not None else [])

    w = engine.weights
    step_bytes = w.nbytes - w.token_embd.nbytes                     # trunk, lm_head and the MTP head ...
    if w.mtp is not None:                                           # ... of which a step reads only eh_proj, k/v
        step_bytes -= w.mtp.attn.w_q.nbytes + w.mtp.attn.w_out.nbytes + w.mtp.ffn.gate_up.nbytes + w.mtp.ffn.down.nbytes
    decode_step = statistics.median(decode_s) / steps
    return {
        "decode_tok_s": round(1 / decode_step, 1),
        "decode_ms_per_token": round(1e3 * decode_step, 3),
        "decode_runs_tok_s": [round(steps / t, 1) for t in decode_s],
        "prefill_tok_s": round(prefill_tokens / statistics.median(prefill_s), 1),
        "draft_tok_s": round(3 / statistics.median(draft_s), 1) if draft_s else None,
        "weights_gb_s": round(step_bytes / decode_step / 1e9, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny", help="synthetic preset generated when --model is not given")
    ap.add_argument("--model", help="a qwen35 GGUF file")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=64, help="single-token decode steps per run")
    ap.add_argument("--prefill-tokens", type=int, default=256)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.model) if args.model else Path(tmp) / f"{args.preset}.gguf"
        if not args.model:
            synthesize(args.preset, path, show_progress=False)
        t0 = time.perf_counter()
        engine = ReferenceEngine.load(path)
        load_s = time.perf_counter() - t0
        s = engine.config.shape
        result = {
            "benchmark": "reference_decode",
            "model": {"file": path.name, "preset": None if args.model else args.preset, "n_layer": s.n_layer,
                      "n_embd": s.n_embd, "n_vocab": s.n_vocab, "has_mtp": engine.config.has_mtp,
                      "weights_bytes": engine.memory()["weights_bytes"], "load_seconds": round(load_s, 2)},
            "settings": {"runs": args.runs, "steps": args.steps, "prefill_tokens": args.prefill_tokens},
            **run(engine, args.runs, args.steps, args.prefill_tokens),
            "machine": machine(),
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
