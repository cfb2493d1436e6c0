"""One decode step's kernels on the GPU's own clock, as they ran (overlapping under PDL), through CUPTI's activity
records (torch.profiler): what each kind of kernel adds to the step, where the event profile (an event between
phases) serialises the launches PDL overlaps and Nsight Compute runs them one at a time.

    python3 native/bench/trace_step.py MODEL.gguf [--t 1,5] [--ctx 0] [--kv q8_0] [--steps 5] [--top-k 0]
        [--out trace.json]

Per T: steps decoded from the same checkpoint (a few untimed first), then `--steps` more, each alone in a profiler
session. For each traced step the kernels sorted by start, and per kernel name (templates kept: they name the quant
type and the form) its count, its summed duration, and its summed marginal cost: how far the kernel moved the
step's end (its end minus the latest end before its start order, or 0), so the marginals add up to the step's span
on the device less the time no kernel ran (idle_us). Medians over the traced steps; the first traced step's kernel
list in full (name, start and duration in us from the step's first kernel). JSON on stdout or --out.

With --drafts N (N > 0) it also traces a chain of N greedy MTP drafts (openjet_engine_mtp_draft_greedy, the cycle's
drafting) over a draft vocabulary of --draft-rows rows, after --ctx tokens (at least 1: a draft needs the hidden row
of the token before), under runs["drafts-N"].

The steps return every row's logits by default (openjet_engine_decode): the copy of t rows of logits to pageable host
memory, between the lm_head and the MTP head's rows, is counted as idle (~475 us at T=5 on the 27B). --top-k K takes
the server's path instead (openjet_engine_decode_top: each row's top K logits come back, after the step's kernels).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def short_name(name: str) -> str:
    """A kernel's name without its arguments, `void` and the namespaces (its template arguments kept)."""
    name = re.sub(r"^void ", "", name).replace("(anonymous namespace)::", "").replace("openjet::", "")
    return name.split("(", 1)[0]


def step_costs(kernels: list[tuple[str, float, float]]) -> dict:
    """kernels: (name, start, duration) of one step, in us, any order. Sorted by start, each kernel's marginal cost
    is max(0, its end - the latest end of the kernels started before it); the time before a kernel's start that no
    earlier kernel covers is idle. Returns the span (first start to last end), idle, and per name the count, the
    summed duration and the summed marginal (marginals + idle = span)."""
    if not kernels:
        raise ValueError("no kernels in the step")
    ks = sorted(kernels, key=lambda k: k[1])
    t0 = ks[0][1]
    frontier, idle, by = t0, 0.0, {}
    for name, start, dur in ks:
        if dur < 0:
            raise ValueError(f"kernel {name} has a negative duration {dur}")
        end = start + dur
        idle += max(0.0, start - frontier)
        marginal = max(0.0, end - max(frontier, start))
        frontier = max(frontier, end)
        c = by.setdefault(name, {"count": 0, "dur_us": 0.0, "marginal_us": 0.0})
        c["count"] += 1
        c["dur_us"] += dur
        c["marginal_us"] += marginal
    return {"span_us": frontier - t0, "idle_us": idle, "kernels": len(ks), "by_name": by}


def chrome_kernels(path: str) -> list[tuple[str, float, float]]:
    """The GPU kernels of a torch.profiler chrome trace: (short name, start us, duration us)."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    return [(short_name(e["name"]), float(e["ts"]), float(e["dur"])) for e in events
            if e.get("cat") == "kernel" and e.get("ph") == "X"]


def median_costs(steps: list[dict]) -> dict:
    """Per-name medians over the traced steps (a name missing from a step counts as 0 there)."""
    names = sorted({n for s in steps for n in s["by_name"]})
    by = {}
    for n in names:
        got = [s["by_name"].get(n, {"count": 0, "dur_us": 0.0, "marginal_us": 0.0}) for s in steps]
        by[n] = {k: round(statistics.median(g[k] for g in got), 2) for k in ("count", "dur_us", "marginal_us")}
    order = sorted(by, key=lambda n: -by[n]["marginal_us"])
    return {"span_us": round(statistics.median(s["span_us"] for s in steps), 2),
            "idle_us": round(statistics.median(s["idle_us"] for s in steps), 2),
            "kernels": statistics.median(s["kernels"] for s in steps),
            "by_name": {n: by[n] for n in order}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--t", default="1,5", help="token rows per step, a list")
    ap.add_argument("--ctx", type=int, default=0, help="tokens prefilled before the steps")
    ap.add_argument("--kv", default="q8_0")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5, help="traced steps per T, each in its own profiler session")
    ap.add_argument("--drafts", type=int, default=0, help="also trace a chain of this many greedy drafts (0: none)")
    ap.add_argument("--draft-rows", type=int, default=32768, help="the draft vocabulary's size for --drafts")
    ap.add_argument("--top-k", type=int, default=0,
                    help="steps through openjet_engine_decode_top with this k (the server's path: no rows of logits "
                         "copied to the host between the lm_head and the MTP rows); 0 (default): openjet_engine_decode")
    ap.add_argument("--out", help="the JSON's file (default: stdout)")
    a = ap.parse_args()
    if not 0 <= a.drafts <= 7:
        ap.error(f"--drafts {a.drafts}: a chain has 0 to 7 drafts")
    from openjet_launcher.sampling import GPU_MAX_TOP_K
    if not 0 <= a.top_k <= GPU_MAX_TOP_K:
        ap.error(f"--top-k {a.top_k}: the device's top-k takes 1 to {GPU_MAX_TOP_K} (0: the logits path)")
    if a.drafts and a.ctx < 1:
        ap.error("--drafts needs --ctx 1 or more: a draft reads the hidden row of the token before it")

    import torch
    from torch.profiler import ProfilerActivity, profile

    from openjet_launcher.engine.cuda import CudaEngine
    if not torch.cuda.is_available():
        raise SystemExit("trace_step: no GPU that torch can see")
    eng = CudaEngine.load(a.model, n_ctx=max(4096, a.ctx + 64), kv_type=a.kv)
    lib, h = eng._lib, eng._handle
    n_vocab = eng.config.shape.n_vocab
    rng = np.random.default_rng(0)
    logits = np.empty((8, n_vocab), np.float32)
    top_vals, top_ids = np.empty((8, max(a.top_k, 1)), np.float32), np.empty((8, max(a.top_k, 1)), np.int32)
    f32, i32 = ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_int32)

    def check(rc: int, what: str) -> None:
        if rc:
            raise SystemExit(f"{what}: {lib.openjet_engine_last_error().decode(errors='replace')}")

    def restore() -> None:  # (before a traced step, outside its profiler session)
        check(lib.openjet_engine_restore(h, 0), "restore")
        torch.cuda.synchronize()

    def step(t: int) -> float:
        ids = rng.integers(0, n_vocab, t).astype(np.int32)
        t0 = time.perf_counter()
        if a.top_k:
            rc = lib.openjet_engine_decode_top(h, ids.ctypes.data_as(i32), t, a.top_k, n_vocab, None, None, 0,
                                               top_vals.ctypes.data_as(f32), top_ids.ctypes.data_as(i32), None)
        else:
            rc = lib.openjet_engine_decode(h, ids.ctypes.data_as(i32), t, logits.ctypes.data_as(f32), None)
        dt = time.perf_counter() - t0
        check(rc, "decode")
        return dt * 1e3

    if a.ctx:
        ids = rng.integers(0, n_vocab, a.ctx).astype(np.int32)
        check(lib.openjet_engine_prefill(h, ids.ctypes.data_as(i32), a.ctx, 128, None, None), "prefill")
    lib.openjet_engine_checkpoint(h, 0)
    out = {"bench": "trace_step", "model": os.path.basename(a.model), "ctx": a.ctx, "kv": a.kv, "top_k": a.top_k,
           "gpu": torch.cuda.get_device_name(0), "pdl": os.environ.get("OPENJET_PDL", "") != "0",
           "commit": os.environ.get("OPENJET_COMMIT", ""), "runs": {}}

    def chain(n: int) -> float:
        drafted = np.empty(n, np.int32)
        t0 = time.perf_counter()
        rc = lib.openjet_engine_mtp_draft_greedy(h, int(rng.integers(0, n_vocab)), n, n_vocab,
                                                 drafted.ctypes.data_as(i32), None, None)
        dt = time.perf_counter() - t0
        check(rc, "mtp_draft_greedy")
        return dt * 1e3

    work = [(str(t), lambda t=t: step(t)) for t in [int(v) for v in a.t.split(",")]]
    if a.drafts:
        rows = rng.choice(n_vocab, min(a.draft_rows, n_vocab), replace=False)
        eng.set_draft_vocabulary(rows)  # (the server's call; the sequence's tokens join only through eng's own calls)
        out["draft_rows"] = len(rows)
        work.append((f"drafts-{a.drafts}", lambda: chain(a.drafts)))
    for key, run in work:
        wall = []
        for _ in range(a.warmup + a.steps):
            restore()
            wall.append(run())
        wall = wall[a.warmup:]  # (untraced: the traced steps' reference)
        traced, first = [], None
        for _ in range(a.steps):
            restore()
            with tempfile.TemporaryDirectory() as d:
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    run()
                    torch.cuda.synchronize()
                path = os.path.join(d, "trace.json")
                prof.export_chrome_trace(path)
                ks = chrome_kernels(path)
            traced.append(step_costs(ks))
            if first is None:
                t0 = min(k[1] for k in ks)
                first = [[n, round(s - t0, 3), round(d_, 3)] for n, s, d_ in sorted(ks, key=lambda k: k[1])]
        out["runs"][key] = {"wall_ms_untraced": round(statistics.median(wall), 4), **median_costs(traced),
                            "first_step": first}
        r = out["runs"][key]
        label = f"T={key}" if key.isdigit() else key
        print(f"{label}: untraced {r['wall_ms_untraced']} ms; traced span {r['span_us']} us, idle {r['idle_us']} us, "
              f"{r['kernels']} kernels", file=sys.stderr)
        for n, c in list(r["by_name"].items())[:12]:
            print(f"  {c['marginal_us']:9.1f} us marginal {c['dur_us']:9.1f} us run {c['count']:4} x {n}",
                  file=sys.stderr)
    text = json.dumps(out, indent=1)
    if a.out:
        Path(a.out).write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
