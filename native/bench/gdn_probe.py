"""Where a decode GDN step's time goes, phase by phase, on the GPU's own clocks, as it runs inside the step
(OPENJET_BENCH_GDN_PROBE=1: each block of the default GDN step writes clock64 at the end of each of its phases,
gdn_decode.cuh GdnProbe; openjet_test_gdn_probe reads the last launch's record).

    python3 native/bench/gdn_probe.py MODEL.gguf [--t 1,5] [--steps 20] [--out probe.json]

Per T: a short prefill, a few untimed steps, then `--steps` decode steps of T rows, each followed by a read of the
record its last GDN launch left (48 blocks at 27B). Per block each phase's cycles (from the end of the phase before;
"waited" counts from the kernel's entry), as us at the SM clock the record itself gives (its global timer's span
against its clocks' span). Per phase the median and the largest over the blocks, then their medians over the steps.
Also when the blocks came: the spread of their entries, of the moments they passed the PDL wait and of their ends
(last minus first, us). JSON on stdout or --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def step_phases(rec: dict) -> dict:
    """One record (kernels_test_gdn.gdn_probe's dict) as per-phase us: for each phase after the entry the median and
    the largest over the blocks; the SM clock in GHz; the blocks' spread at entry, past the wait and at the end (us)."""
    from openjet_launcher.engine.kernels_test_gdn import GDN_PROBE_POINTS
    clock = rec["clock"].astype(np.float64)
    ns = rec["ns"].astype(np.float64)
    cycles = clock[:, -1] - clock[:, 0]
    if (cycles <= 0).any() or (ns[:, 1] <= ns[:, 0]).any():
        raise ValueError("a block of the record has no span: was the probed form launched?")
    ghz = float(np.median(cycles / (ns[:, 1] - ns[:, 0])))
    us = np.diff(clock, axis=1) / ghz / 1e3  # [blocks, points - 1]
    phases = {name: {"median_us": float(np.median(us[:, i])), "max_us": float(us[:, i].max())}
              for i, name in enumerate(GDN_PROBE_POINTS[1:])}
    waited = ns[:, 0] + (clock[:, 1] - clock[:, 0]) / ghz
    spread = {"entry_us": float(np.ptp(ns[:, 0]) / 1e3), "waited_us": float(np.ptp(waited) / 1e3),
              "end_us": float(np.ptp(ns[:, 1]) / 1e3),
              "waited_to_last_end_us": float((ns[:, 1].max() - waited.min()) / 1e3)}
    return {"sm_ghz": ghz, "phases": phases, "spread": spread}


def median_of(steps: list[dict]) -> dict:
    """Each number of step_phases' dicts, as its median over the steps."""
    first = steps[0]
    return {"sm_ghz": statistics.median(s["sm_ghz"] for s in steps),
            "phases": {p: {k: statistics.median(s["phases"][p][k] for s in steps) for k in v}
                       for p, v in first["phases"].items()},
            "spread": {k: statistics.median(s["spread"][k] for s in steps) for k in first["spread"]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--t", default="1,5", help="token rows a step, comma-separated (1..8)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    ts = [int(x) for x in a.t.split(",")]
    if a.steps < 1 or any(not 1 <= t <= 8 for t in ts):
        raise SystemExit("--steps must be at least 1 and each --t 1..8")
    os.environ["OPENJET_BENCH_GDN_PROBE"] = "1"  # (read at load)
    from openjet_launcher.engine import kernels_test_gdn as ktg
    from openjet_launcher.engine.cuda import CudaEngine
    eng = CudaEngine.load(a.model, n_ctx=4096, kv_type="q8_0")
    try:
        shape = eng.config.shape
        rng = np.random.default_rng(0)
        runs = {}
        for t in ts:
            state = eng.new_state()
            eng.prefill(state, rng.integers(0, shape.n_vocab, 16))
            steps = []
            for i in range(a.warmup + a.steps):
                eng.decode(state, rng.integers(0, shape.n_vocab, t))
                if i >= a.warmup:
                    steps.append(step_phases(ktg.gdn_probe(shape.ssm_n_v_heads)))
            runs[str(t)] = median_of(steps)
            print(f"T={t}: " + ", ".join(f"{p} {v['median_us']:.2f}/{v['max_us']:.2f}"
                                         for p, v in runs[str(t)]["phases"].items()) +
                  f" us (median / max over blocks); spread {runs[str(t)]['spread']}", file=sys.stderr)
    finally:
        eng.close()
    text = json.dumps({"bench": "gdn_probe", "model": Path(a.model).name, "steps": a.steps, "runs": runs}, indent=1)
    if a.out:
        Path(a.out).write_text(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
