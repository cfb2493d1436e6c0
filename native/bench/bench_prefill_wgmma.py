"""The fast prefill GEMM at 2,048 rows on the 27B's main projection shapes: the mma.sync kernel
(OPENJET_PREFILL_WGMMA=0) against the wgmma kernels (1: each step's MMA waited for; 2: left running across the next
barrier; 3: a producer warpgroup feeding two consumers; a 90a build on an sm_90 GPU, prefill_gemm.cu). Microseconds per call (3 runs, weight copies rotated) and
TFLOP/s of the best run: JSON on stdout, a table on stderr.

    OPENJET_LIBRARY=/path/libopenjet.so python native/bench/bench_prefill_wgmma.py > out.json
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
from bench_gemv import Q, kt, random_weights

SHAPES = (("Q4_K", 17408, 5120), ("Q6_K", 5120, 17408), ("Q4_K", 10240, 5120), ("Q5_K", 5120, 6144))
ROWS = 2048


def main() -> None:
    if not kt.prefill_wgmma_available():
        sys.exit("no wgmma kernel here: build with OPENJET_CUDA_ARCHITECTURES=90a-real and run on an sm_90 GPU")
    rng = np.random.default_rng(0)
    out = {"rows": ROWS, "results": []}
    for qtype, n, k in SHAPES:
        w = random_weights(rng, qtype, n, k)
        for mode in ("0", "1", "2", "3"):
            os.environ["OPENJET_PREFILL_WGMMA"] = mode
            us = kt.bench_gemv(Q[qtype], w, k, ROWS, 2, 4, 3)
            tflops = 2 * n * k * ROWS / (min(us) * 1e-6) / 1e12
            out["results"].append({"type": qtype, "n": n, "k": k, "wgmma": int(mode), "us": us,
                                   "tflops": round(tflops, 1)})
            print(f"{qtype} {n}x{k} t={ROWS} wgmma={mode}: {min(us):8.0f} us {tflops:6.0f} TFLOP/s", file=sys.stderr)
    json.dump(out, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
