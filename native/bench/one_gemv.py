"""One GEMV call on random weights, for a profiler to catch (scripts/gpu_ncu_gemv.sh, gpu_ncu_prefill.sh):

    python native/bench/one_gemv.py QTYPE N K T          # kernels_test.gemv: decode (T <= 8) or OPENJET_PREFILL_GEMM's
    python native/bench/one_gemv.py QTYPE N K T --bench  # one bench_gemv call: rows > 8 take the fast prefill GEMM
"""

from __future__ import annotations

import sys

import numpy as np
from bench_gemv import Q, kt, random_weights


def main() -> None:
    qtype, n, k, t = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rng = np.random.default_rng(0)
    w = random_weights(rng, qtype, n, k)
    if "--bench" in sys.argv[5:]:
        kt.bench_gemv(Q[qtype], w, k, t, 1, 1, 1)
    else:
        kt.gemv(Q[qtype], w, rng.standard_normal((t, k), dtype=np.float32))


if __name__ == "__main__":
    main()
