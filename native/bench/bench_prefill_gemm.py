"""The prefill GEMM at 2,048 rows on the 27B's main projection shapes: "mma" (OPENJET_PREFILL_GEMM=fast: the
mma.sync kernel that dequantises inside its k loop, prefill_gemm.cu) and, on a 90a build with CUTLASS on an sm_90
GPU, "dense" (OPENJET_PREFILL_GEMM=dense, the default there: the weights written out as fp16, then CUTLASS's
GEMM, dense_gemm.cuh; its time includes the dequantisation, as in the engine). The hand-written wgmma kernels
that dequantised inside the k loop (OPENJET_PREFILL_WGMMA=1/2/3) were measured here and removed: each slower
than "mma" for Q4_K / Q5_K (bench/results/prefill-wgmma-h200-83ed0d8.json, prefill-gemm-h200-dense.json). Microseconds per call (3 runs, weight copies rotated)
and TFLOP/s of the best run: JSON on stdout, a table on stderr.

    OPENJET_LIBRARY=/path/libopenjet.so python native/bench/bench_prefill_gemm.py > out.json
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
from bench_gemv import Q, kt, random_weights

SHAPES = (("Q4_K", 17408, 5120), ("Q6_K", 5120, 17408), ("Q4_K", 10240, 5120), ("Q5_K", 5120, 6144))
ROWS = 2048
KERNELS = {"mma": "fast", "dense": "dense"}  # OPENJET_PREFILL_GEMM


def main() -> None:
    kernels = [name for name in KERNELS if name == "mma" or kt.dense_gemm_available()]
    rng = np.random.default_rng(0)
    out = {"rows": ROWS, "kernels": kernels, "results": []}
    for qtype, n, k in SHAPES:
        w = random_weights(rng, qtype, n, k)
        for name in kernels:
            os.environ["OPENJET_PREFILL_GEMM"] = KERNELS[name]
            us = kt.bench_gemv(Q[qtype], w, k, ROWS, 2, 4, 3)
            tflops = 2 * n * k * ROWS / (min(us) * 1e-6) / 1e12
            out["results"].append({"type": qtype, "n": n, "k": k, "kernel": name, "us": us,
                                   "tflops": round(tflops, 1)})
            print(f"{qtype} {n}x{k} t={ROWS} {name:>6}: {min(us):8.0f} us {tflops:6.0f} TFLOP/s", file=sys.stderr)
    json.dump(out, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
