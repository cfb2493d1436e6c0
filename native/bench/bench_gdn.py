"""GDN decode step benchmark (issue 6): time per layer step (launch_gdn_step, all value heads) at the 27B
per-layer sizes for T = 1, 2, 4, 8 token rows (decode) and 64, 512 (a prefill chunk's rows in one call),
against the bytes the step must move at the device-to-device copy bandwidth measured in the same run.
Prints JSON.

    OPENJET_LIBRARY=/tmp/b/native/libopenjet.so PYTHONPATH=. python3 native/bench/bench_gdn.py > gdn.json
    ... bench_gdn.py chunked2 chunked2-fma   # only those forms
    ... bench_gdn.py chunked2 2048 4096      # only that form, prefill calls of those rows

Prefill calls (64 .. 2048 rows) are timed in three forms: the recurrence and the chunked WY form (gdn_chunk.cuh) in
one kernel (OPENJET_GDN_CHUNKED=1) and in two phases (=2, the same bits).

Bytes per step: the recurrent state read + written (2 x n_v x 64 KiB = 6 MiB), the conv state read +
written, the conv weights, and per token qkv, z (read) and y (written). Timing: openjet_test_bench_gdn
rotates `copies` state sets (together several times L2) through `reps` graph-captured calls; each figure
is the median of RUNS replays.

Measured (H200, 1980 MHz, copy 4239 GB/s; 1024-thread blocks, R = 16 state rows per thread, 56 registers,
no spills), us per layer step: rotated states (L2-resident states)
    T=1 6.46 (5.53)   T=2 7.54 (6.60)   T=4 9.43 (8.52)   T=8 13.43 (12.52)
against a byte floor of 1.60 (T=1) .. 1.75 (T=8) us: 25 % .. 13 % of copy bandwidth; T=8 costs 2.08x T=1.
Not bandwidth-bound: L2-resident states save only ~0.9 us. Each extra token adds ~1 us, which fits
shared-memory instruction issue on the 48 SMs in use (per token and thread ~16 broadcast loads of k and
q plus 16 partial-sum loads; 32 warps x ~48 LDS ~ 1500 cycles per SM). Staging every input in shared
memory at the start (v2) moved T=1 from 6.63 to 6.46 us only. Next: float4 loads of k/q, float2
{k·S', q·S'} partials, R = 32 (half the partials). Splitting each head over a 2-4 CTA cluster (DSMEM for the
gated norm's sum, all 132 SMs) was tried on 2026-12-03 and was slower in the engine (NOTES_gemv.md).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from openjet_launcher.engine import kernels_test as kt  # noqa: E402
from openjet_launcher.engine import kernels_test_gdn as kg  # noqa: E402
from openjet_launcher.errors import OpenJetError  # noqa: E402

N_K, N_V, D = 16, 48, 128
TS = (1, 2, 4, 8, 64, 512, 2048)  # 64 .. 2048: prefill chunks (one call, sub-steps of 8 inside)
CHUNKED_TS = (64, 512, 2048)        # the same calls in the chunked WY form (OPENJET_GDN_CHUNKED=1, gdn_chunk.cuh)
# OPENJET_GDN_CHUNKED (2, the default: two phases, the state phase on tensor cores in one tf32 pass); "chunked2-fma":
# the state phase as fp32 FMA chains (OPENJET_GDN_STATE_TC=0, 1's bits); "chunked2-3xtf32": its products in 3xTF32;
# "chunked2-tf32cvt": the default's bits by the state kernel that rounds each fragment as it loads it (=tf32-cvt);
# "chunked2-localfma": the local phase's A and Aq as FMA sums (OPENJET_GDN_LOCAL_TC=0: the default's until 2026-12-04,
# tf32-cvt's local phase; 4,096 rows on the H200 989 us against the default's 960)
FORMS = {"recurrent": {"OPENJET_GDN_CHUNKED": "0"}, "chunked": {"OPENJET_GDN_CHUNKED": "1"},
         "chunked2": {"OPENJET_GDN_CHUNKED": "2"},
         "chunked2-fma": {"OPENJET_GDN_CHUNKED": "2", "OPENJET_GDN_STATE_TC": "0"},
         "chunked2-3xtf32": {"OPENJET_GDN_CHUNKED": "2", "OPENJET_GDN_STATE_TC": "3xtf32"},
         "chunked2-tf32cvt": {"OPENJET_GDN_CHUNKED": "2", "OPENJET_GDN_STATE_TC": "tf32-cvt"},
         "chunked2-localfma": {"OPENJET_GDN_CHUNKED": "2", "OPENJET_GDN_LOCAL_TC": "0"}}
COPIES = 64      # x ~3.3 MiB of state per copy = ~210 MiB rotated (H200 L2: 50 MB)
REPS = 512
RUNS = 7


def step_bytes(t: int) -> dict:
    conv_dim, vd = (2 * N_K + N_V) * D, N_V * D
    b = {"state": 2 * N_V * D * D * 4, "conv_state": 2 * 3 * conv_dim * 4, "conv_w": 4 * conv_dim * 4,
         "tokens": t * (conv_dim + vd + vd + 2 * N_V) * 4}
    b["total"] = sum(b.values())
    return b


def main() -> None:
    copy_gbs = float(np.median(kt.bench_copy(1 << 30, 10, RUNS)))
    rows = []
    forms = [a for a in sys.argv[1:] if not a.isdigit()]
    chunked_ts = tuple(int(a) for a in sys.argv[1:] if a.isdigit()) or CHUNKED_TS
    runs = [(t, "recurrent") for t in TS] + [(t, f) for f in FORMS if f != "recurrent" for t in chunked_ts]
    if forms:  # only these forms (e.g. `chunked2 chunked2-fma`)
        runs = [(t, f) for t, f in runs if f in forms]
    for t, form in runs:
        reps = max(8, REPS * 8 // max(8, t))  # about the same time per run for the chunk sizes
        os.environ.update(FORMS[form])  # read at each launch (captured into the graphs)
        try:
            us = float(np.median(kg.bench_gdn(N_K, N_V, t, COPIES, reps, RUNS)))
            us_l2 = float(np.median(kg.bench_gdn(N_K, N_V, t, 1, reps, RUNS)))  # one state set: L2-resident
        except OpenJetError as e:  # a library from before one call took a chunk's rows
            print(f"t={t} {form}: {e}", file=sys.stderr)
            continue
        finally:
            for name in FORMS[form]:
                os.environ.pop(name, None)
        b = step_bytes(t)
        floor_us = b["total"] / (copy_gbs * 1e3)
        rows.append({"t": t, "form": form, "us": us, "us_l2_resident": us_l2, "bytes": b,
                     "gbs": b["total"] / (us * 1e3), "floor_us": floor_us, "pct_of_copy_bw": 100.0 * floor_us / us,
                     "us_per_token": us / t})
    base = rows[0]["us"] if rows[0]["t"] == 1 else float("nan")
    for r in rows:
        r["cost_vs_t1"] = r["us"] / base
    print(json.dumps({"n_k": N_K, "n_v": N_V, "copy_gbs": copy_gbs, "steps": rows}, indent=1))
    print("t   form       us/step  L2-res   GB/s   floor_us  %copyBW  vs_t1", file=sys.stderr)
    for r in rows:
        print(f"{r['t']}  {r['form']:>9} {r['us']:8.2f} {r['us_l2_resident']:7.2f} {r['gbs']:7.0f} {r['floor_us']:8.2f} "
              f"{r['pct_of_copy_bw']:7.1f} {r['cost_vs_t1']:6.2f}", file=sys.stderr)
    print(f"copy bandwidth {copy_gbs:.0f} GB/s", file=sys.stderr)


if __name__ == "__main__":
    main()
