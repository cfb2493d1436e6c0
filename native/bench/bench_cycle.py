"""Whole greedy speculative cycles (openjet_engine_cycle_greedy: drafts, verify, verdict, accept in one call) of 0..7
drafts, timed with their launches streamed and with OPENJET_BENCH_GRAPH=1 (each cycle replayed as one CUDA graph):
issue 7's cycle ratio (4 drafts against none) both ways, and what the launches cost.

    python3 native/bench/bench_cycle.py MODEL.gguf [--ctx 1024] [--steps 15] [--drafts 0,4] [--graph 0]
                                        [--out cycle.json]

Each timed cycle follows an untimed one from the same checkpoint, as bench_decode's cycle_greedy_ms (so a fused
replay of the kept rows is inside it). The draft vocabulary is the first 32,768 ids (bench_decode takes its shipped
list; on random codes the acceptance is ~0 either way); a cycle whose token lies outside it adds that row first (the
binding's draft rows follow the sequence), in both modes, as when serving. JSON on stdout, with each draft count's
graph captures and replays (with the graph on, the warmup rounds capture and every timed cycle replays) and, for the
streamed launches, each draft count's device time per phase of a cycle (profile_ms_per_cycle).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench_decode import run_switches  # noqa: E402  (this folder: the script's own, first on sys.path)
from openjet_launcher.engine import kernels_test  # noqa: E402
from openjet_launcher.engine.cuda import CudaEngine  # noqa: E402

COUNTERS = ("cycle_graph_capture", "cycle_graph_replay")


def cycles_ms(path: str, graph: str, ctx: int, steps: int, warmup: int, drafts: list[int],
              profile: dict | None = None) -> tuple[dict[int, float], dict[int, list]]:
    """Median ms of the timed cycles per draft count, and the graph captures / replays each count made (with the
    graph on, every timed cycle must be a replay: the keys repeat after two rounds). profile (streamed launches only):
    filled with each draft count's device ms per phase of a cycle (the engine's profile: an event between phases, so a
    little slower than the timed cycles), from `steps` more cycles after the timed ones."""
    os.environ["OPENJET_BENCH_GRAPH"] = graph  # read at load
    engine = CudaEngine.load(path, n_ctx=ctx + 64, kv_type="q8_0", n_checkpoints=2)
    try:
        engine.native_verify = engine.native_draft = True
        n_vocab = engine.config.shape.n_vocab
        prompt = [int(x) for x in np.random.default_rng(7).integers(0, n_vocab, ctx)]
        engine.set_draft_vocabulary(np.arange(min(32768, n_vocab)))
        state = engine.new_state()
        token = int(np.argmax(engine.prefill(state, prompt).logits[-1]))
        engine.checkpoint(state)
        out, graphs = {}, {}
        for n in drafts:
            before = [kernels_test.launch_count(c) for c in COUNTERS]
            times = []
            for i in range(warmup + steps):
                engine.truncate(state, ctx)
                _, nxt = engine.greedy_cycle(state, token, n, n_valid=n_vocab)
                t0 = time.perf_counter()
                engine.greedy_cycle(state, nxt, n, n_valid=n_vocab)
                if i >= warmup:
                    times.append(time.perf_counter() - t0)
            out[n] = round(statistics.median(times) * 1e3, 3)
            graphs[n] = [kernels_test.launch_count(c) - b for c, b in zip(COUNTERS, before)]
            if profile is not None:
                profile[n] = cycle_phases_ms(engine, state, ctx, token, n, n_vocab, steps)
        return out, graphs
    finally:
        engine.close()


def cycle_phases_ms(engine, state, ctx: int, token: int, n: int, n_vocab: int, cycles: int) -> dict[str, float]:
    """Device ms per phase (embed, norm, gdn.*, attn.*, ffn, lm_head, topk, mtp.*, accept) of a greedy cycle of n
    drafts, averaged over `cycles` profiled cycles, each after an unprofiled one from the same checkpoint."""
    totals: dict[str, float] = {}
    for _ in range(cycles):
        engine.truncate(state, ctx)
        _, nxt = engine.greedy_cycle(state, token, n, n_valid=n_vocab)
        engine.profile(reset=True)
        engine.set_profile(True)
        try:
            engine.greedy_cycle(state, nxt, n, n_valid=n_vocab)
        finally:
            engine.set_profile(False)
        for name, phase in engine.profile(reset=True)["phases"].items():
            totals[name] = totals.get(name, 0.0) + phase["ms"]
    return {name: round(ms / cycles, 4) for name, ms in sorted(totals.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--ctx", type=int, default=1024, help="context before the cycles (default 1024, bench_decode's)")
    ap.add_argument("--steps", type=int, default=15, help="timed cycles per draft count (default 15)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed rounds per draft count (default 3, at least 2)")
    ap.add_argument("--drafts", default="0,1,2,3,4,5,6,7",
                    help="the draft counts to time, comma-separated, each 0..7 (default all; the ratio needs 0 and 4)")
    ap.add_argument("--graph", choices=("0", "1", "both"), default="both",
                    help="streamed launches (0), CUDA graphs (1) or both (default)")
    ap.add_argument("--out", help="write the JSON here too")
    a = ap.parse_args()
    if a.ctx < 1 or a.steps < 1 or a.warmup < 2:
        ap.error("--ctx and --steps must be at least 1, --warmup at least 2 (the rounds that capture the graphs)")
    try:
        drafts = sorted({int(x) for x in a.drafts.split(",")})
    except ValueError:
        ap.error(f"--drafts {a.drafts!r}: comma-separated whole numbers, e.g. 0,4")
    if not drafts or not all(0 <= n <= 7 for n in drafts):
        ap.error(f"--drafts {a.drafts!r}: each count must be 0..7")
    result: dict = {"model": a.model, "context": a.ctx, "steps": a.steps,
                    "switches": run_switches()}
    for graph in ("0", "1") if a.graph == "both" else (a.graph,):
        phases: dict | None = {} if graph == "0" else None
        ms, graphs = cycles_ms(a.model, graph, a.ctx, a.steps, a.warmup, drafts, phases)
        ratio = round(ms[4] / ms[0], 3) if 0 in ms and 4 in ms else None
        result[f"graph_{graph}"] = {"cycle_greedy_ms": ms, "ratio_4_over_0": ratio, "graph_captures_replays": graphs}
        if phases:
            result[f"graph_{graph}"]["profile_ms_per_cycle"] = phases  # issue 7's per-phase profile, streamed
        print(f"OPENJET_BENCH_GRAPH={graph}: {ms} (4 / 0: {ratio})", file=sys.stderr)
    text = json.dumps(result, indent=1)
    if a.out:
        Path(a.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
