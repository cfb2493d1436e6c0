"""The integer-tensor-core GEMV (native/src/gemv_imma.cuh, an experiment for issue 6) against the fp16 GEMV on the
27B's decode shapes of its types (Q4_K, Q6_K): microseconds per call at T = 1, 4, 8 for a few cp.async depths, the
GB/s of weight bytes against the copy bandwidth of the same run, and the decode-step mix of these types. Prints JSON.

    OPENJET_PDL=0 OPENJET_LIBRARY=/tmp/b/native/libopenjet.so python3 native/bench/bench_gemv_imma.py > imma.json
    ... bench_gemv_imma.py --tiled  # and every variant again with the weights in the tile layout (weight_layout.cuh)
    ... bench_gemv_imma.py --tiled --tma  # and the integer GEMV's producer-warp form ("imma-tma-tiled", sm_90a)

(OPENJET_PDL=0: the integer kernel launches without programmatic dependent launch; under PDL the fp16 GEMV's
back-to-back copies of one small-grid call overlap, which the engine's step never does: NOTES_gemv.md.)
Timing as bench_gemv.py: calls captured in a CUDA graph, weights rotated over copies exceeding L2, medians.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gemv import ROTATE_BYTES, RUNS, TARGET_US, decode_step_mix, random_weights, weight_bytes  # noqa: E402

from openjet_launcher.engine import kernels_test as kt  # noqa: E402

TS = (1, 4, 8)
STAGES = (3, 4)
PERSISTENT_STAGES = (3, 4, 6)  # "p": a grid of the blocks the GPU holds, each streaming tiles
# "-tiled": the same call on the weights in the tile layout (every decode shape of these types has n % 16 == 0)
LAYOUTS = (("", False),) + ((("-tiled", True),) if "--tiled" in sys.argv[1:] else ())
# "imma-tma-tiled": the producer-warp form (launch_gemv_tma_imma), with --tiled --tma
TMA = "--tiled" in sys.argv[1:] and "--tma" in sys.argv[1:]


def timed(fn, copies: int) -> float:
    probe_us = fn(copies, max(copies, 8), 3)
    reps = max(copies, min(2000, int(TARGET_US / max(min(probe_us), 0.5))))
    return float(np.median(fn(copies, reps, RUNS)))


def main() -> None:
    rng = np.random.default_rng(0)
    mix = {key: c for key, c in decode_step_mix().items() if key[2] in ("Q4_K", "Q6_K")}
    copy_gbs = float(np.median(kt.bench_copy(1 << 30, 10, RUNS)))
    rows = []
    for (n, k, qtype), count in sorted(mix.items()):
        qt = kt.QTYPES[qtype]
        w = random_weights(rng, qtype, n, k)
        nbytes = weight_bytes(qtype, n, k)
        copies = max(1, math.ceil(ROTATE_BYTES / nbytes))
        r = {"n": n, "k": k, "type": qtype, "count": count, "weight_bytes": nbytes, "us": {}}
        for t in TS:
            for lay, tiled in LAYOUTS:
                r["us"][f"fp16{lay}-t{t}"] = timed(
                    lambda c, reps, runs: kt.bench_gemv(qt, w, k, t, c, reps, runs, tiled), copies)
                for st in STAGES:
                    r["us"][f"imma{st}{lay}-t{t}"] = timed(
                        lambda c, reps, runs: kt.bench_gemv_imma(qt, w, k, t, c, reps, runs, st, False, tiled), copies)
                for st in PERSISTENT_STAGES:
                    r["us"][f"imma{st}p{lay}-t{t}"] = timed(
                        lambda c, reps, runs: kt.bench_gemv_imma(qt, w, k, t, c, reps, runs, st, True, tiled), copies)
                if TMA and tiled:
                    r["us"][f"imma-tma{lay}-t{t}"] = timed(
                        lambda c, reps, runs: kt.bench_gemv_imma(qt, w, k, t, c, reps, runs, 0, 2, True), copies)
        r["pct_copy"] = {key: 100.0 * nbytes / (us * 1e-6) / 1e9 / copy_gbs for key, us in r["us"].items()}
        rows.append(r)
        print(f"{qtype} {k:>6}->{n:<6} x{count:<3} " + " ".join(
            f"{key} {us:7.1f} ({r['pct_copy'][key]:4.1f}%)" for key, us in r["us"].items() if key.endswith("t1")),
            file=sys.stderr)
    total = sum(r["weight_bytes"] * r["count"] for r in rows)
    step = {}
    for key in rows[0]["us"]:
        us = sum(r["us"][key] * r["count"] for r in rows)
        step[key] = {"us": us, "pct_copy": 100.0 * total / (us * 1e-6) / 1e9 / copy_gbs}
    best = {}
    for t in TS:  # per shape the best depth
        for lay, _ in LAYOUTS:
            us = sum(min(r["us"][f"imma{st}{lay}-t{t}"] for st in STAGES) * r["count"] for r in rows)
            usp = sum(min(r["us"][f"imma{st}p{lay}-t{t}"] for st in PERSISTENT_STAGES) * r["count"] for r in rows)
            best[f"{t}{lay}"] = {"us": us, "pct_copy": 100.0 * total / (us * 1e-6) / 1e9 / copy_gbs,
                                 "persistent_us": usp,
                                 "persistent_pct_copy": 100.0 * total / (usp * 1e-6) / 1e9 / copy_gbs}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    json.dump({"bench": "gemv-imma", "commit": commit, "copy_gbs": copy_gbs, "mix_weight_bytes": total,
               "step_mix": step, "imma_best_depth_per_shape": best, "rows": rows}, sys.stdout, indent=1)
    print()
    print(f"copy {copy_gbs:.0f} GB/s; Q4_K+Q6_K decode mix {total / 1e9:.2f} GB", file=sys.stderr)
    for key, v in step.items():
        print(f"  {key:>10}: {v['us']:8.0f} us {v['pct_copy']:5.1f}%", file=sys.stderr)
    for t, v in best.items():
        print(f"  imma best-t{t}: {v['us']:8.0f} us {v['pct_copy']:5.1f}%; persistent {v['persistent_us']:8.0f} us "
              f"{v['persistent_pct_copy']:5.1f}%", file=sys.stderr)


if __name__ == "__main__":
    main()
