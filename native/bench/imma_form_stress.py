"""Run a decode GEMV's forms many times on the same inputs and say which one ever gives a wrong output.

Why: test_the_producer_warp_form_gives_the_integer_gemvs_bits[Q6_K] failed once on an H200 (2026-12-06: at T=4, 20
outputs of one tile off by up to 27, five rows of one unit) and passed on a rerun. That test compares two forms, so it
cannot say which one was wrong. Here every call of every form is checked against an independent oracle and against
the other forms' bits. --family imma (the default): the integer GEMV's three forms against numpy's emulation of the
integer numerics (tests/test_gpu_gemv_imma.py's quantise_x_numpy: exact integer sums, so the only rounding left is
~1e-7 relative):

  cp.async, one block per tile      (persistent=0)
  cp.async, a grid of resident blocks (persistent=1)
  the producer-warp form            (persistent=2, launch_gemv_tma_imma, OPENJET_GEMV_INT=3's)

--family fp16: the fp16 decode GEMV, the cp.async kernel and the producer-warp kernel (the engine's default on a 9.0
GPU: its default choice and forms 1 and 2), against dequantize(W) @ the fp16 pack of x (tests/test_gpu_gemv.py's
pack_act_numpy: only the fp32 sum order left, ~1e-6 relative).

Prints JSON: per (qtype, t, form) the calls made, the calls with an output beyond the oracle's tolerance, the calls
whose bits differ from the majority of the forms, and the first few bad calls' rows, tokens and errors.

    python native/bench/imma_form_stress.py --reps 40 --out stress.json
    python native/bench/imma_form_stress.py --family fp16 --types Q6_K --t 8 --reps 100 --out fp16.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from test_gpu_gemv import pack_act_numpy, unpack_act  # noqa: E402  (the tests' oracles, one copy)
from test_gpu_gemv_imma import quantise_x_numpy, random_x  # noqa: E402

from openjet_launcher.engine import kernels_test as kt  # noqa: E402
from openjet_launcher.model.quants import dequantize, quantize  # noqa: E402

FORMS = {"cp_async_per_tile": 0, "cp_async_resident": 1, "producer_warp": 2}  # the integer GEMV's (persistent=)
FP16_FORMS = {"cp_async": 0, "producer_warp_default": -1, "producer_warp_1": 1, "producer_warp_2": 2}
TOL = 1e-5  # of sum |w| |x| per output: 10-100x either family's fp32 rounding


def bad_outputs(y: np.ndarray, ref: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Indices (token, row) of the outputs beyond the tolerance (NaN counts as beyond)."""
    return np.argwhere(~(np.abs(y - ref) <= TOL * scale))


def judge(ys: dict[str, np.ndarray], ref: np.ndarray, scale: np.ndarray, stats: dict[str, dict]) -> None:
    """One call of every form: each form's outputs against the oracle, and its bits against the forms' majority (the
    bits two or more forms share; none where all differ), counted into stats[form]."""
    votes = Counter(y.tobytes() for y in ys.values())
    top, count = votes.most_common(1)[0]
    majority = top if count >= 2 else None
    for f, y in ys.items():
        s = stats[f]
        s["calls"] += 1
        bad = bad_outputs(y, ref, scale)
        if len(bad):
            s["beyond_oracle"] += 1
            if len(s["first_bad"]) < 3:
                err = np.abs(y - ref)[tuple(bad.T)]
                s["first_bad"].append({"outputs": int(len(bad)),
                                       "tokens": sorted({int(i) for i in bad[:, 0]}),
                                       "rows": sorted({int(i) for i in bad[:, 1]})[:32],
                                       "tiles": sorted({int(i) // 16 for i in bad[:, 1]})[:16],
                                       "max_abs_err": float(np.nanmax(err))})
        if majority is not None and y.tobytes() != majority:
            s["off_majority"] += 1


def new_stats(forms=FORMS) -> dict[str, dict]:
    return {f: {"calls": 0, "beyond_oracle": 0, "off_majority": 0, "first_bad": []} for f in forms}


def imma_call(qtype: int, raw: np.ndarray, x: np.ndarray, form: int) -> np.ndarray:
    return kt.gemv_imma(qtype, raw, x, persistent=form, tiled=True)


def fp16_call(qtype: int, raw: np.ndarray, x: np.ndarray, form: int) -> np.ndarray:
    return kt.gemv(qtype, raw, x, tiled=True) if form == 0 else kt.gemv_tma(qtype, raw, x, form)


def fp16_x(x: np.ndarray) -> np.ndarray:
    """x as the fp16 GEMV sees it (float64): its pack's fp16 values times the row's 1/s."""
    xh, _, xinv = pack_act_numpy(x)
    return unpack_act(xh, xinv)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=40, help="calls of each form per (qtype, t)")
    ap.add_argument("--family", choices=("imma", "fp16"), default="imma")
    ap.add_argument("--types", default=None, help="default: Q4_K,Q5_K,Q6_K (imma), and Q8_0 too (fp16)")
    ap.add_argument("--t", default="1,2,4,5,8")
    ap.add_argument("--budget-s", type=float, default=240, help="stop starting new cases after this")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if not kt.gemv_tma_available():
        args.out.write_text(json.dumps({"bench": "imma_form_stress", "skipped": "no 90a build on a 9.0 GPU"}))
        print("skipped: the producer-warp form needs a 90a build on a 9.0 GPU", file=sys.stderr)
        return 0
    fp16 = args.family == "fp16"
    forms, call = (FP16_FORMS, fp16_call) if fp16 else (FORMS, imma_call)
    types = args.types or ("Q4_K,Q5_K,Q6_K,Q8_0" if fp16 else "Q4_K,Q5_K,Q6_K")
    start = time.monotonic()
    n, k = 8992, 2304  # the failing test's shape: 562 tiles, quarters of 2 and 3 units
    rows = []
    for qname in types.split(","):
        rng = np.random.default_rng(7)
        raw = quantize(rng.standard_normal((n, k), dtype=np.float32), kt.QTYPES[qname])
        w = dequantize(raw, kt.QTYPES[qname]).astype(np.float64)
        x8 = random_x(rng, 8, k)
        for t in (int(v) for v in args.t.split(",")):
            if time.monotonic() - start > args.budget_s:
                rows.append({"qtype": qname, "t": t, "skipped": "budget"})
                continue
            x = x8[:t]
            xq = fp16_x(x) if fp16 else quantise_x_numpy(x)
            ref, scale = (w @ xq.T).T, (np.abs(w) @ np.abs(xq).T).T
            stats = new_stats(forms)
            for _ in range(args.reps):
                judge({f: call(kt.QTYPES[qname], raw, x, p) for f, p in forms.items()}, ref, scale, stats)
            for f, s in stats.items():
                rows.append({"qtype": qname, "t": t, "form": f, **s})
                if s["beyond_oracle"] or s["off_majority"]:
                    print(f"{qname} T={t} {f}: {s['beyond_oracle']} / {s['calls']} calls beyond the oracle, "
                          f"{s['off_majority']} off the majority {s['first_bad'][:1]}", file=sys.stderr)
            print(f"{qname} T={t}: {args.reps} calls a form ({time.monotonic() - start:.0f} s)", file=sys.stderr)
    bad = sum(r.get("beyond_oracle", 0) + r.get("off_majority", 0) for r in rows)
    args.out.write_text(json.dumps({"bench": "imma_form_stress", "family": args.family, "n": n, "k": k,
                                    "reps": args.reps, "tolerance_of_abs_sum": TOL, "bad_calls": bad, "rows": rows},
                                   indent=1))
    print(f"bad calls: {bad}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
