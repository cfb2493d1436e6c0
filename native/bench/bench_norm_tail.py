"""OPENJET_NORM_TAIL's boundary in isolation (issue 6): one-row decode GEMVs of a 27B-width matrix (5,120 x 5,120) chained
as the engine chains a projection and the add-norm after it, each GEMV reading the pack the add-norm before it wrote:
mode 0 the GEMV and the add-norm launch (the default), 1 the add-norm made by the GEMV's last block, 2 that block's
arrival count alone (a probe, wrong outputs), 3 the GEMV alone. Prints JSON: microseconds per boundary (median of the
runs) by type and mode, and where the tail's last block spends its time (clock64 at its phases).

    python native/bench/bench_norm_tail.py [--types Q4_K,Q5_K,Q6_K] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from openjet_launcher.engine import kernels_test as kt  # noqa: E402
from openjet_launcher.model.quants import quantize  # noqa: E402

MODES = {0: "gemv+add_norm", 1: "tail", 2: "tail_count_only", 3: "gemv_only"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q4_K,Q5_K,Q6_K")
    ap.add_argument("--n", type=int, default=5120)
    ap.add_argument("--out")
    args = ap.parse_args()
    rng = np.random.default_rng(5)
    result = {"n": args.n, "us": {}}
    for name in args.types.split(","):
        raw = quantize(rng.standard_normal((args.n, args.n), dtype=np.float32) * np.float32(0.02), kt.QTYPES[name])
        result["us"][name] = {MODES[m]: round(statistics.median(kt.bench_gemv_norm_tail(kt.QTYPES[name], raw, m)), 2)
                              for m in MODES}
        result.setdefault("tail_phases_us", {})[name] = kt.gemv_norm_tail_clocks(kt.QTYPES[name], raw)
        print(name, result["us"][name], result["tail_phases_us"][name], file=sys.stderr)
    text = json.dumps(result)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
