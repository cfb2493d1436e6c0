"""A prefill's F32 projections (a GDN layer's ssm_beta and ssm_alpha, [48, 5120] at 27B), both matrices in one
launch_gemv_pair as the engine calls them, with each OPENJET_PREFILL_F32 form (tf32x3, the default: prefill_f32.cu's
tensor-core GEMM; tf32x3-rna: the same with both split parts rounded by cvt.rna; rows: decode's kernels) at chunk
sizes from a short turn to the H200's 4,096-row chunk. Prints JSON: microseconds per call (median of the runs, each a
CUDA-graph replay of --reps calls).

    OPENJET_LIBRARY=/tmp/b/native/libopenjet.so PYTHONPATH=. python3 native/bench/bench_prefill_f32.py [--t 8,50,...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from openjet_launcher.engine import kernels_test as kt  # noqa: E402

FORMS = ("rows", "tf32x3-rna", "tf32x3")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--t", default="8,50,512,2048,4096", help="token rows per call (comma-separated)")
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--k", type=int, default=5120)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    out = {"bench": "prefill F32 projections, beta and alpha in one call (issue 8)",
           "commit": os.environ.get("OPENJET_COMMIT", ""), "n": a.n, "k": a.k, "runs": []}
    for form in FORMS:
        os.environ["OPENJET_PREFILL_F32"] = form  # read at each call
        for t in (int(v) for v in a.t.split(",")):
            us = statistics.median(kt.bench_gemv_f32_pair(a.n, a.k, t, a.reps, a.runs))
            out["runs"].append({"form": form, "t": t, "us": round(us, 1)})
            print(json.dumps(out["runs"][-1]), file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
