"""Decode-step time of the CUDA engine v1 (openjet_launcher/engine/cuda.py), printed as JSON.

    OPENJET_LIBRARY=/tmp/b/native/libopenjet.so python3 native/bench/bench_decode.py --preset small \
        [--model file.gguf] [--out result.json]

Per (T, context): a fresh sequence is filled to the context with decode steps, then `--steps` decode steps of T
tokens are timed one by one on the host clock around the C call (it synchronises: logits [T, n_vocab] are
back in host memory when it returns) and the median is kept. The roofline share is the time the step's bytes
(every trunk weight + the lm_head once, the KV rows the attention reads, the recurrent state read and written)
take at the measured device copy bandwidth, over the measured step time. v1 launches one kernel per op, so
small models measure launch overhead more than bandwidth.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from openjet_launcher.engine.cuda import CudaEngine  # noqa: E402
from openjet_launcher.engine.native import load_library  # noqa: E402
from openjet_launcher.model.gguf_file import GGUFFile  # noqa: E402
from openjet_launcher.model.synth import synthesize  # noqa: E402


def copy_bandwidth_gbps(lib, nbytes: int = 1 << 30, reps: int = 10, runs: int = 5) -> float:
    lib.openjet_test_bench_copy.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    lib.openjet_test_bench_copy.restype = ctypes.c_int
    out = np.empty(runs, np.float32)
    if lib.openjet_test_bench_copy(nbytes, reps, runs, out.ctypes.data) != 0:
        return float("nan")
    return float(np.median(out))


def step_bytes(engine: CudaEngine, gguf: GGUFFile, ctx: int, t: int) -> int:
    s = engine.config.shape
    embd = gguf.tensors["token_embd.weight"].n_bytes
    mtp = sum(i.n_bytes for n, i in gguf.tensors.items() if n.startswith(f"blk.{s.n_layer}."))
    weights = sum(i.n_bytes for i in gguf.tensors.values()) - embd - mtp
    n_attn = s.n_layer // s.full_attn_interval
    row = 512 if engine.kv_type == "f16" else 272
    kv = n_attn * 2 * s.n_head_kv * (ctx + t) * row
    n_gdn = s.n_layer - n_attn
    state = n_gdn * s.ssm_n_v_heads * s.ssm_head_dim ** 2 * 4 * 2
    return weights + kv + state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--model", help="a GGUF file (default: synthesize the preset into a temp folder)")
    ap.add_argument("--contexts", default="0,1024")
    ap.add_argument("--tokens", default="1,4")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--kv-type", default="f16")
    ap.add_argument("--out")
    args = ap.parse_args()

    path = args.model
    if not path:
        path = str(Path(tempfile.mkdtemp()) / f"{args.preset}.gguf")
        synthesize(args.preset, path, show_progress=False)
    contexts = [int(x) for x in args.contexts.split(",")]
    tokens = [int(x) for x in args.tokens.split(",")]
    n_ctx = max(contexts) + max(tokens) * (args.steps + 10) + 16
    engine = CudaEngine.load(path, n_ctx=n_ctx, kv_type=args.kv_type)
    gguf = GGUFFile(path)
    lib = load_library()
    bw = copy_bandwidth_gbps(lib)
    s = engine.config.shape
    rng = np.random.default_rng(0)
    logits = np.empty((8, s.n_vocab), np.float32)
    hidden = np.empty((8, s.n_embd), np.float32)
    f32 = ctypes.POINTER(ctypes.c_float)
    results = []
    for ctx in contexts:
        for t in tokens:
            state = engine.new_state()
            if ctx:
                engine.prefill(state, rng.integers(0, s.n_vocab, ctx))
            ids = rng.integers(0, s.n_vocab, (args.steps + 5, t)).astype(np.int32)
            times = []
            for i in range(args.steps + 5):
                t0 = time.perf_counter()
                rc = engine._lib.openjet_engine_decode(engine._handle, ids[i].ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                                                       t, logits.ctypes.data_as(f32), hidden.ctypes.data_as(f32))
                dt = time.perf_counter() - t0
                if rc != 0:
                    raise SystemExit(engine._lib.openjet_engine_last_error().decode())
                if i >= 5:                       # warm-up steps
                    times.append(dt)
            med = statistics.median(times)
            nbytes = step_bytes(engine, gguf, ctx + args.steps // 2 * t, t)
            results.append({"context": ctx, "t": t, "median_us": round(med * 1e6, 1),
                            "min_us": round(min(times) * 1e6, 1), "tok_s": round(t / med, 1),
                            "step_bytes": nbytes, "roofline_us": round(nbytes / (bw * 1e9) * 1e6, 1),
                            "roofline_share": round(nbytes / (bw * 1e9) / med, 4)})
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        commit = ""
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.mem", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip()
    except OSError:
        gpu = ""
    t1 = {r["context"]: r["median_us"] for r in results if r["t"] == 1}
    for r in results:
        r["cost_vs_t1"] = round(r["median_us"] / t1[r["context"]], 3) if r["context"] in t1 else None
    out = {"bench": "decode", "engine": "cuda-v1 (one launch per op)", "model": args.preset if not args.model else path,
           "kv_type": args.kv_type, "commit": commit, "gpu": gpu, "copy_gbps": round(bw, 1),
           "memory": engine.memory(), "steps": args.steps, "results": results}
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    engine.close()


if __name__ == "__main__":
    main()
