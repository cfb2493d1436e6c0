"""A prefill chunk's attention (issue 8): time per layer of launch_attn_prefill (the prep kernel and the flash
kernel, attn_prefill.cu) at the 27B's widths (24 q heads, 4 kv heads, head dim 256) for a 2,048-row chunk after
0 .. 30,720 cached rows, F16 and Q8_0 caches, 64- and 128-row blocks (the same bits), tiles of 32 and 64 keys, and
a Q8_0 cache read as fp16 rows converted once per call (OPENJET_ATTN_PREFILL_F16=1, the default, at the default
tiles; the other Q8_0 runs are its kernel, =0), and where it runs (a 90a build on an H100/H200) the F16 cache on the
warpgroup-MMA kernel (OPENJET_ATTN_PREFILL_WGMMA, the default there; 128 rows x 64 keys, the same bits; "wgmma": 1,
and 2 for its warp-specialised form; the other runs set it to 0). Prints JSON
with the achieved tensor-core TFLOP/s (S = Q K^T and P V over the keys each row sees).

    OPENJET_LIBRARY=/tmp/b/native/libopenjet.so PYTHONPATH=. python3 native/bench/bench_attn_prefill.py > attn.json
    ... bench_attn_prefill.py --forms [--t 4096] [--n-past 0,28672]   # only the F16 cache at the default shape on
        # every form of OPENJET_ATTN_PREFILL_WGMMA (0: mma.sync, 1, 2) this device runs, t rows after each n_past
        # (~30 s; the A/B to run first when the wgmma kernels change)

Why: at 32,768 tokens the attention of the later chunks is the largest growth of a chunk's time (a chunk at
~24K context costs ~130 ms more than one at ~2K; bench/results/engine-full-h200-7d31b7d-dense.json).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from openjet_launcher.engine import kernels_test_attn as ka  # noqa: E402

N_HEAD, N_KV, T = 24, 4, 2048
N_PAST = (0, 8192, 16384, 30720)
ROWS = (64, 128)
KEYS = (32, 64)  # OPENJET_ATTN_PREFILL_KEYS: keys per tile (numerics of their own)
REPS, RUNS = 5, 5


def forms(t: int, n_pasts: list[int]) -> None:
    """--forms: the F16 cache at the default tile shape on each OPENJET_ATTN_PREFILL_WGMMA form this device runs."""
    out = {"bench": "attn_prefill forms (issue 8)", "commit": os.environ.get("OPENJET_COMMIT", ""),
           "shape": {"n_head": N_HEAD, "n_kv": N_KV, "head_dim": ka.HEAD_DIM, "t": t},
           "method": f"median of {RUNS} CUDA-graph replays of {REPS} calls; a call = prep + flash kernel of one layer",
           "runs": []}
    for n_past in n_pasts:
        flop = ka.prefill_flop(N_HEAD, n_past, t)
        for form in ("0", "1", "2") if ka.attn_prefill_wgmma_available() else ("0",):
            os.environ["OPENJET_ATTN_PREFILL_WGMMA"] = form
            us = statistics.median(ka.bench_attn_prefill(ka.KV_TYPES["F16"], N_HEAD, N_KV, n_past, t, REPS, RUNS))
            out["runs"].append({"n_past": n_past, "t": t, "wgmma": int(form), "us": round(us, 1),
                                "tflops": round(flop / (us * 1e-6) / 1e12, 1)})
            print(json.dumps(out["runs"][-1]), file=sys.stderr)
    print(json.dumps(out, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description="the prefill attention's time per layer (module docstring)")
    p.add_argument("--forms", action="store_true", help="only the F16 cache on each OPENJET_ATTN_PREFILL_WGMMA form")
    p.add_argument("--t", type=int, default=4096, help="--forms: rows of the call (default 4096)")
    p.add_argument("--n-past", default="0,28672", help="--forms: cached rows before them, comma-separated")
    a = p.parse_args()
    if a.forms:
        forms(a.t, [int(x) for x in a.n_past.split(",")])
    else:
        full()


def full() -> None:
    os.environ["OPENJET_ATTN_PREFILL_F16"] = "0"  # the Q8_0 kernel, but in the f16_rows runs
    os.environ["OPENJET_ATTN_PREFILL_WGMMA"] = "0"  # the mma.sync kernel, but in the wgmma runs (the default there)
    out = {"bench": "attn_prefill (issue 8)", "commit": os.environ.get("OPENJET_COMMIT", ""),
           "shape": {"n_head": N_HEAD, "n_kv": N_KV, "head_dim": ka.HEAD_DIM, "t": T},
           "method": f"median of {RUNS} CUDA-graph replays of {REPS} calls; a call = prep + flash kernel of one layer",
           "runs": []}
    for fmt, kv_type in ka.KV_TYPES.items():
        for n_past in N_PAST:
            flop = ka.prefill_flop(N_HEAD, n_past, T)
            for rows, keys in itertools.product(ROWS, KEYS):
                os.environ["OPENJET_ATTN_PREFILL_KEYS"] = str(keys)  # read at each call
                run = {"kv": fmt, "n_past": n_past, "rows": rows, "keys": keys}
                try:
                    us = statistics.median(ka.bench_attn_prefill(kv_type, N_HEAD, N_KV, n_past, T, REPS, RUNS, rows))
                except Exception as e:  # a block size this device cannot hold: say so, go on
                    out["runs"].append({**run, "error": str(e)})
                    continue
                finally:
                    os.environ.pop("OPENJET_ATTN_PREFILL_KEYS")
                out["runs"].append({**run, "us": round(us, 1), "tflops": round(flop / (us * 1e-6) / 1e12, 1)})
                print(json.dumps(out["runs"][-1]), file=sys.stderr)
            # The same tiles on wgmma (the same bits): 1, and 2 warp-specialised (an experiment).
            for form in ("1", "2") if fmt == "F16" and ka.attn_prefill_wgmma_available() else ():
                os.environ["OPENJET_ATTN_PREFILL_WGMMA"] = form
                try:
                    us = statistics.median(ka.bench_attn_prefill(kv_type, N_HEAD, N_KV, n_past, T, REPS, RUNS, 128))
                finally:
                    os.environ["OPENJET_ATTN_PREFILL_WGMMA"] = "0"
                out["runs"].append({"kv": fmt, "n_past": n_past, "rows": 128, "keys": 64, "wgmma": int(form),
                                    "us": round(us, 1), "tflops": round(flop / (us * 1e-6) / 1e12, 1)})
                print(json.dumps(out["runs"][-1]), file=sys.stderr)
            if fmt == "Q8_0":  # OPENJET_ATTN_PREFILL_F16=1: the cache as fp16 rows once per call (the same bits)
                os.environ["OPENJET_ATTN_PREFILL_F16"] = "1"
                try:
                    us = statistics.median(ka.bench_attn_prefill(kv_type, N_HEAD, N_KV, n_past, T, REPS, RUNS))
                finally:
                    os.environ["OPENJET_ATTN_PREFILL_F16"] = "0"
                out["runs"].append({"kv": fmt, "n_past": n_past, "f16_rows": True, "us": round(us, 1),
                                    "tflops": round(flop / (us * 1e-6) / 1e12, 1)})
                print(json.dumps(out["runs"][-1]), file=sys.stderr)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
