"""Where one decode step's time goes, kernel by kernel (run under Nsight Compute on the GPU machine).

A full-width model with few layers (``--layers``, default 4: three Gated DeltaNet layers and one attention
layer, the 27B's widths and quant recipe, its MTP head and lm_head) is written to ``--model`` unless it is
there; the engine loads it, decodes ``--warmup`` steps, then times ``--steps`` decode steps of T tokens on the
host clock (median printed as JSON), then runs ONE more step between cuProfilerStart and cuProfilerStop: under
``ncu --profile-from-start off`` that step's kernels alone are measured. scripts/gpu_step_kernels.sh runs it
and sums the kernel times against the step's wall time: the difference is what launches and gaps cost.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from openjet_launcher.model import synth  # noqa: E402
from openjet_launcher.model.shape import PRESETS, QWEN38_27B  # noqa: E402


def check(lib, rc: int, what: str) -> None:
    """Exit naming the failed engine call and the library's message."""
    if rc:
        raise SystemExit(f"{what}: {lib.openjet_engine_last_error().decode(errors='replace')}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="/tmp/full4.gguf")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--t", default="1", help="token rows per step, or a list: 1,4,8 (one JSON line each)")
    ap.add_argument("--ctx", type=int, default=0,
                    help="tokens prefilled before the timed steps (with --prefill: before the timed prefill, which "
                         "then extends that sequence: a long context's prefill without profiling all of it)")
    ap.add_argument("--kv", default="q8_0")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--prefill", type=int, default=0,
                    help="instead of decode steps: time a prefill of this many tokens (the engine's chunk), then "
                         "one more with the per-phase profile on (JSON lines; the 27B's layers in the same 3:1 mix), "
                         "then one more between cuProfilerStart and cuProfilerStop (for ncu --profile-from-start off)")
    a = ap.parse_args()

    if not Path(a.model).exists():
        name = f"full{a.layers}"
        PRESETS[name] = QWEN38_27B.with_(n_layer=a.layers)
        synth.vocab_for = lambda preset, shape: synth.full_vocab()   # the 27B's vocabulary, as `full`
        print(json.dumps(synth.synthesize(name, a.model, show_progress=False, codes="random")), file=sys.stderr)

    from openjet_launcher.engine.cuda import CudaEngine
    eng = CudaEngine.load(a.model, n_ctx=max(4096, a.ctx + a.prefill + 64), kv_type=a.kv)
    if a.prefill:
        prefill_profile(eng, a)
        return
    lib, h = eng._lib, eng._handle
    n_vocab = eng.config.shape.n_vocab
    rng = np.random.default_rng(0)
    logits = np.empty((8, n_vocab), np.float32)
    f32, i32 = ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_int32)

    def step(ids: np.ndarray) -> float:
        t0 = time.perf_counter()
        rc = lib.openjet_engine_decode(h, ids.ctypes.data_as(i32), len(ids), logits.ctypes.data_as(f32), None)
        dt = time.perf_counter() - t0
        check(lib, rc, "decode")
        return dt

    if a.ctx:
        ids = rng.integers(0, n_vocab, a.ctx).astype(np.int32)
        check(lib, lib.openjet_engine_prefill(h, ids.ctypes.data_as(i32), a.ctx, 128, None, None), "ctx prefill")
    lib.openjet_engine_checkpoint(h, 0)
    ts = [int(v) for v in a.t.split(",")]
    for t in ts:
        times = []
        for i in range(a.warmup + a.steps):
            lib.openjet_engine_restore(h, 0)
            dt = step(rng.integers(0, n_vocab, t).astype(np.int32))
            if i >= a.warmup:
                times.append(dt)
        print(json.dumps({"layers": a.layers, "t": t, "ctx": a.ctx, "kv": a.kv,
                          "pdl": os.environ.get("OPENJET_PDL", "") != "0",
                          "step_ms_median": round(statistics.median(times) * 1e3, 4),
                          "step_ms_min": round(min(times) * 1e3, 4)}), flush=True)
    lib.openjet_engine_restore(h, 0)
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuProfilerStart()
    step(rng.integers(0, n_vocab, ts[0]).astype(np.int32))
    cuda.cuProfilerStop()


def prefill_profile(eng, a) -> None:
    """Prefill wall time (median of 3 after one warm-up), in one more run the device ms per phase, and one more
    run inside the profiler range (its kernels are what ncu --profile-from-start off lists). With --ctx, each run
    extends a sequence of --ctx tokens (prefilled once, restored from a checkpoint before each run)."""
    lib, h = eng._lib, eng._handle
    i32 = ctypes.POINTER(ctypes.c_int32)
    ids = np.random.default_rng(1).integers(0, eng.config.shape.n_vocab, a.ctx + a.prefill).astype(np.int32)
    new = ids[a.ctx:]

    if a.ctx:
        eng.new_state()
        rc = lib.openjet_engine_prefill(h, ids.ctypes.data_as(i32), a.ctx, eng.prefill_rows, None, None)
        check(lib, rc, "ctx prefill")
        check(lib, lib.openjet_engine_checkpoint(h, 0), "checkpoint")

    def once() -> float:
        if a.ctx:
            check(lib, lib.openjet_engine_restore(h, 0), "restore")
            t0 = time.perf_counter()
            check(lib, lib.openjet_engine_prefill(h, new.ctypes.data_as(i32), a.prefill, eng.prefill_rows, None,
                                                  None), "prefill")
            return time.perf_counter() - t0
        state = eng.new_state()
        t0 = time.perf_counter()
        eng.prefill(state, new)
        return time.perf_counter() - t0

    wall = statistics.median([once() for _ in range(4)][1:])
    eng.set_profile(True)
    eng.profile(reset=True)
    once()
    prof = eng.profile(reset=True)
    eng.set_profile(False)
    print(json.dumps({"layers": a.layers, "prefill": a.prefill, "ctx": a.ctx, "chunk": eng.prefill_rows,
                      "kv": a.kv, "wall_ms": round(wall * 1e3, 3), "tok_s": round(a.prefill / wall, 1),
                      "profile_ms": {k: round(v["ms"], 3) for k, v in prof["phases"].items()}}), flush=True)
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuProfilerStart()
    once()
    cuda.cuProfilerStop()


if __name__ == "__main__":
    main()
