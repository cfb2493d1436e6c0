"""Decode GEMV benchmark (issue 6): time per call of y = W x for the 27B model's shapes and weight types at
T = 1, 2, 4, 8 token rows, the achieved GB/s of weight bytes against the device-to-device copy bandwidth
measured in the same run, the T=4/T=1 cost ratio, and a whole decode step's GEMV mix (unsloth Q4_K_M
recipe) as % of roofline. Prefill: the same mix without the lm_head at T = 32, 128 and 512 rows (one call per
weight, rows in groups of 8 that share it through L2), as tokens/s and TFLOP/s of the projections alone.
Prints JSON.

    OPENJET_LIBRARY=/tmp/b/native/libopenjet.so PYTHONPATH=. python3 native/bench/bench_gemv.py > gemv.json
    ... bench_gemv.py --prefill-only    # only the prefill mix (about a minute on the H200)
    ... bench_gemv.py --decode-only     # only the decode mix's shapes, no prefill rows
    ... bench_gemv.py --decode-only --tiled  # and each of them with the weights in the tile layout

Timing: openjet_test_bench_gemv captures `reps` calls in a CUDA graph (weights rotated over copies that
together exceed L2 several times), each figure is the median of `runs` graph replays.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from openjet_launcher.engine import kernels_test as kt  # noqa: E402
from openjet_launcher.engine.device_probe import probe  # noqa: E402

Q = kt.QTYPES
TS = (1, 2, 4, 8)
# Prefill chunk rows (the engine's default: 512; the launcher's first choice: 2048; 16: a short last chunk) with
# the default numerics (the fast GEMM for Q4_K/Q5_K/Q6_K, prefill_gemm.cuh); "-exact" / "-grouped" / "-shared":
# OPENJET_PREFILL_GEMM (decode's numerics).
PREFILL_TS = (16, 32, 128, 512, 2048, "16-exact", "512-exact", "128-grouped", "128-shared", "512-shared")
# Decode with each shape forced ("-t16": 16-row tiles, "-t8": half tiles; plain T: OPENJET_GEMV_HALF's choice, by
# default "auto"). Under PDL the back-to-back copies of one small-grid call share SMs (H200: Q6_K 17408 -> 5120 at
# T = 1 56.6 us in 16-row tiles with OPENJET_PDL=1, 43.4 with 0), which the engine's step never does: compare such
# calls with PDL off.
TILE_TS = ("1-t16", "1-t8", "8-t16", "8-t8")
# --tiled: decode with the weights in the tile layout (weight_layout.cuh; k-quant W with n % 16 == 0, the rest keep
# the row layout's figure in the mix).
TILED_TS = ("1-tiled", "4-tiled", "8-tiled")
ROTATE_BYTES = 512 << 20  # weight copies per measurement span at least this (H200 L2: 50 MB)
TARGET_US = 4000.0        # each graph replay runs about this long
RUNS = 7

# (n, k) = (out, in) of the brief's shapes, each in every type
SHAPES = {"5120->10240": (10240, 5120), "5120->17408": (17408, 5120), "17408->5120": (5120, 17408),
          "6144->5120": (5120, 6144)}


def use_more_bits(i: int, n: int = 65) -> bool:  # llama.cpp's Q4_K_M rule for attn_v-like and ffn_down
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def decode_step_mix() -> dict[tuple[int, int, str], int]:
    """(n, k, type) -> count per decode step of the 64 main layers + lm_head (unsloth Q4_K_M, spec §2.2)."""
    mix: dict[tuple[int, int, str], int] = {}

    def add(n, k, t):
        mix[(n, k, t)] = mix.get((n, k, t), 0) + 1

    for il in range(64):
        hi = "Q6_K" if use_more_bits(il) else "Q4_K"
        if il % 4 == 3:  # full attention
            add(12288, 5120, "Q4_K"); add(1024, 5120, "Q4_K"); add(1024, 5120, hi); add(5120, 6144, "Q4_K")
        else:            # gated delta net
            add(10240, 5120, hi); add(6144, 5120, "Q4_K"); add(48, 5120, "F32"); add(48, 5120, "F32")
            add(5120, 6144, "Q5_K")
        add(17408, 5120, "Q4_K"); add(17408, 5120, "Q4_K"); add(5120, 17408, hi)
    add(248320, 5120, "Q6_K")
    return mix


def random_weights(rng, qtype: str, n: int, k: int) -> np.ndarray:
    """Random blocks with sane fp16 scales (never zeros: zeros can time faster than real data)."""
    if qtype == "F32":
        return rng.standard_normal((n, k), dtype=np.float32)
    epb, bpb = kt.BLOCK[Q[qtype]]
    raw = rng.integers(0, 256, size=(n, k // epb, bpb), dtype=np.uint8)
    at, count = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208, 1), "Q8_0": (0, 1)}[qtype]
    scales = rng.uniform(1e-3, 1e-2, size=raw.shape[:2] + (count,)).astype(np.float16)
    raw[:, :, at:at + 2 * count] = scales.view(np.uint8).reshape(raw.shape[:2] + (2 * count,))
    return raw.reshape(n, -1)


def weight_bytes(qtype: str, n: int, k: int) -> int:
    epb, bpb = kt.BLOCK[Q[qtype]]
    return n * (k // epb) * bpb


def measure(rng, qtype: str, n: int, k: int, ts=TS) -> dict:
    try:
        return measure_or_raise(rng, qtype, n, k, ts)
    except Exception as e:  # one failing configuration must not lose the others' figures
        print(f"{qtype} {n}x{k}: {e}", file=sys.stderr)
        nan = float("nan")
        return {"type": qtype, "n": n, "k": k, "weight_bytes": weight_bytes(qtype, n, k), "error": str(e),
                "us": {t: nan for t in ts}, "shape": {}}


def measure_or_raise(rng, qtype: str, n: int, k: int, ts=TS) -> dict:
    w = random_weights(rng, qtype, n, k)
    nbytes = weight_bytes(qtype, n, k)
    copies = max(1, math.ceil(ROTATE_BYTES / nbytes))
    out = {"type": qtype, "n": n, "k": k, "weight_bytes": nbytes, "copies": copies, "us": {}, "shape": {}}
    for key in ts:
        t, _, how = str(key).partition("-")
        t = int(t)
        tiled = how == "tiled"
        tiles = how[1:] if how.startswith("t") and not tiled else None  # "t16" / "t8"
        if tiles:
            kt.set_gemv_tiles(tiles)
        elif how and not tiled:
            os.environ["OPENJET_PREFILL_GEMM"] = how
        try:
            probe_us = kt.bench_gemv(Q[qtype], w, k, t, copies, max(copies, 8), 3, tiled)
            reps = max(copies, min(2000, int(TARGET_US / max(min(probe_us), 0.5))))
            us = float(np.median(kt.bench_gemv(Q[qtype], w, k, t, copies, reps, RUNS, tiled)))
        finally:
            os.environ.pop("OPENJET_PREFILL_GEMM", None)
            if tiles:
                kt.set_gemv_tiles("env")
        out["us"][key] = us
        out["shape"] = kt.gemv_shape(Q[qtype], n, k)
    return out


def prefill_mix(seen: dict, mix: dict, prefill_keys: set) -> tuple[dict, int]:
    """Per prefill row count: the projection mix's time per chunk, tok/s and TFLOP/s; and the FLOP per token."""
    prefill = {}
    flop_per_token = sum(2 * n * k * c for (n, k, q), c in mix.items() if (n, k, q) in prefill_keys)
    for tk in PREFILL_TS:
        t = int(str(tk).split("-")[0])
        us = sum(seen[key]["us"][tk] * c for key, c in mix.items() if key in prefill_keys)
        prefill[tk] = {"us": us, "tok_s": t / (us * 1e-6), "tflops": flop_per_token * t / (us * 1e-6) / 1e12}
    return prefill, flop_per_token


def print_prefill(prefill: dict) -> None:
    for t, p in prefill.items():
        print(f"prefill projections T={t}: {p['us']:.0f} us per chunk, {p['tok_s']:.0f} tok/s, "
              f"{p['tflops']:.1f} TFLOP/s", file=sys.stderr)


def main() -> None:
    rng = np.random.default_rng(0)
    dev = probe()
    mix = decode_step_mix()
    prefill_keys = {key for key in mix if key[0] != 248320}  # prefill runs the lm_head on the last row only
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    gpu = (dev.get("devices") or [{}])[0] if isinstance(dev, dict) else {}
    if "--prefill-only" in sys.argv[1:]:
        seen = {key: measure(rng, key[2], key[0], key[1], PREFILL_TS) for key in sorted(prefill_keys)}
        prefill, flop_per_token = prefill_mix(seen, mix, prefill_keys)
        json.dump({"bench": "gemv-prefill", "commit": commit, "host": platform.node(), "gpu": gpu,
                   "prefill_gemm_mix": {"by_t": prefill, "flop_per_token": flop_per_token},
                   "results": list(seen.values())}, sys.stdout, indent=1, default=str)
        print()
        print_prefill(prefill)
        return
    copy = kt.bench_copy(1 << 30, 10, RUNS)
    copy_gbs = float(np.median(copy))
    results = []
    seen = {}
    decode_only = "--decode-only" in sys.argv[1:]  # the decode mix's shapes alone, no prefill (variant sweeps)
    for name, (n, k) in ({} if decode_only else SHAPES).items():
        for qtype in ("Q4_K", "Q5_K", "Q6_K", "Q8_0"):
            r = measure(rng, qtype, n, k, TS + TILE_TS + (PREFILL_TS if (n, k, qtype) in prefill_keys else ()))
            r["name"] = name
            seen[(n, k, qtype)] = r
            results.append(r)
    for key in mix:
        if key not in seen:
            n, k, qtype = key
            decode_ts = TS + (TILE_TS if qtype != "F32" else ())
            if "--tiled" in sys.argv[1:] and qtype != "F32" and n % 16 == 0:
                decode_ts += TILED_TS
            r = measure(rng, qtype, n, k, decode_ts + (PREFILL_TS if key in prefill_keys and not decode_only else ()))
            r["name"] = f"{k}->{n}"
            seen[key] = r
            results.append(r)
    for r in results:
        r["gbs"] = {t: r["weight_bytes"] / (us * 1e-6) / 1e9 for t, us in r["us"].items()}
        r["pct_copy_bw"] = {t: 100.0 * g / copy_gbs for t, g in r["gbs"].items()}
        r["t4_over_t1"] = r["us"][4] / r["us"][1]
        r["t8_over_t1"] = r["us"][8] / r["us"][1]
    step = {}
    total_bytes = sum(weight_bytes(q, n, k) * c for (n, k, q), c in mix.items())
    for t in TS:
        us = sum(seen[key]["us"][t] * c for key, c in mix.items())
        step[t] = {"us": us, "gbs": total_bytes / (us * 1e-6) / 1e9,
                   "pct_roofline": 100.0 * total_bytes / (us * 1e-6) / 1e9 / copy_gbs}
    tiles = {}  # the mix with each tile shape forced (F32 calls as they are), or the weights in the tile layout
    for key in TILE_TS + (TILED_TS if "--tiled" in sys.argv[1:] else ()):
        t = int(key.split("-")[0])
        us = sum(seen[mk]["us"].get(key, seen[mk]["us"][t]) * c for mk, c in mix.items())
        tiles[key] = {"us": us, "pct_roofline": 100.0 * total_bytes / (us * 1e-6) / 1e9 / copy_gbs}
    prefill, flop_per_token = ({}, 0) if decode_only else prefill_mix(seen, mix, prefill_keys)
    report = {
        "bench": "gemv", "commit": commit, "host": platform.node(), "gpu": gpu,
        "copy_gbs_d2d_read_plus_write": copy_gbs, "copy_gbs_runs": copy,
        "decode_step_gemv_mix": {"weight_bytes": total_bytes, "calls": sum(mix.values()),
                                 "by_t": step, "t4_over_t1": step[4]["us"] / step[1]["us"], "tiles_forced": tiles,
                                 "note": "sum of isolated per-call times (each with its launch), Q4_K_M recipe"},
        "prefill_gemm_mix": {"by_t": prefill, "flop_per_token": flop_per_token,
                             "note": "trunk projections only (no lm_head, GDN, attention): a ceiling on prefill tok/s"},
        "results": results,
    }
    json.dump(report, sys.stdout, indent=1, default=str)
    print()
    # a short table last (the device tool returns the output's tail)
    print(f"copy {copy_gbs:.0f} GB/s", file=sys.stderr)
    print("decode mix, tiles forced: " + ", ".join(f"{k} {v['us']:.0f} us ({v['pct_roofline']:.1f}%)"
                                                   for k, v in tiles.items()), file=sys.stderr)
    for r in results:
        if "1-t8" in r["us"]:
            print(f"  {r['name']:>14} {r['type']:>5} T1 default/16/8 " + " / ".join(
                f"{r['us'][key]:.1f}" for key in (1, "1-t16", "1-t8")) + "  T8 default/16/8 " + " / ".join(
                f"{r['us'][key]:.1f}" for key in (8, "8-t16", "8-t8")), file=sys.stderr)
    print(f"{'shape':>14} {'type':>5} {'MB':>7} " + " ".join(f"T{t}:us  GB/s   %" .rjust(22) for t in TS)
          + "  T4/T1", file=sys.stderr)
    for r in results:
        cells = " ".join(f"{r['us'][t]:8.1f} {r['gbs'][t]:6.0f} {r['pct_copy_bw'][t]:5.1f}".rjust(22) for t in TS)
        print(f"{r['name']:>14} {r['type']:>5} {r['weight_bytes'] / 1e6:7.1f} {cells}  {r['t4_over_t1']:.2f}",
              file=sys.stderr)
    for t in TS:
        print(f"decode step mix T={t}: {step[t]['us']:.0f} us, {step[t]['gbs']:.0f} GB/s, "
              f"{step[t]['pct_roofline']:.1f}% of copy bw", file=sys.stderr)
    print(f"step T4/T1 = {step[4]['us'] / step[1]['us']:.3f}", file=sys.stderr)
    for t, p in prefill.items():
        print(f"prefill projections T={t}: {p['us']:.0f} us per chunk, {p['tok_s']:.0f} tok/s, "
              f"{p['tflops']:.1f} TFLOP/s", file=sys.stderr)


if __name__ == "__main__":
    main()
