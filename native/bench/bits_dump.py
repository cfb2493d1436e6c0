"""Outputs of the library in OPENJET_LIBRARY, kept bit for bit, to compare two builds (scripts/gpu_same_bits.sh).

    python3 native/bench/bits_dump.py OUT.npz --models tiny.gguf,small.gguf

Kernel level (random GGUF blocks, seed fixed): every GEMV type over the 27B's shapes for T = 1..8 and T = 40
and 128 (the exact prefill's two kernels and the fast GEMM), the activation pack, add-norm and swiglu packs
through the engine. Engine level, per model and KV type (f16, q8_0), with each prefill numerics
(OPENJET_PREFILL_GEMM=exact: keys engine/<model>/<kv>/...; =fast: engine/<model>/<kv>/fast/...): a 300-token
prefill in chunks of 128 (the last row's logits), then decode steps of T = 1..8 tokens (all their logits), then
(with an MTP head) a verify step of 5, accept of 3, a decode step of 2 and 3 MTP drafts. (A library older than
the fast GEMM, 17e727b, reads "fast" as its default: its fast arrays differ from a newer one's.)
Every array is saved as it came back; compare two dumps with --compare A.npz B.npz (exit 1 on any difference).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GEMV_SHAPES = [(10240, 5120), (17408, 5120), (5120, 17408), (5120, 6144), (33, 1280), (130, 2304)]


@contextlib.contextmanager
def prefill_gemm(kind: str):
    """OPENJET_PREFILL_GEMM=kind for the block ("" leaves it as it is), the caller's value back after it."""
    before = os.environ.get("OPENJET_PREFILL_GEMM")
    if kind:
        os.environ["OPENJET_PREFILL_GEMM"] = kind
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("OPENJET_PREFILL_GEMM", None)
        else:
            os.environ["OPENJET_PREFILL_GEMM"] = before


def kernel_outputs(out: dict) -> None:
    from openjet_launcher.engine import kernels_test as kt
    rng = np.random.default_rng(1)
    for name in ("Q4_K", "Q5_K", "Q6_K", "Q8_0"):
        qtype = kt.QTYPES[name]
        elems, nbytes = kt.BLOCK[qtype]
        for n, k in GEMV_SHAPES:
            w = rng.integers(0, 256, (n, k // elems * nbytes), dtype=np.uint8)
            # finite scales: Q6_K's d is its last two bytes, the others' the first
            d16 = w.reshape(n, k // elems, nbytes)
            if name == "Q6_K":
                d16[:, :, 208:210] = np.frombuffer(np.float16(2 ** -12).tobytes(), np.uint8)
            else:
                d16[:, :, 0:2] = np.frombuffer(np.float16(2 ** -12).tobytes(), np.uint8)
                if name != "Q8_0":
                    d16[:, :, 2:4] = np.frombuffer(np.float16(2 ** -14).tobytes(), np.uint8)
            for t in (1, 2, 3, 4, 5, 6, 7, 8, 40, 128):
                x = rng.standard_normal((t, k), dtype=np.float32)
                for kind in ("grouped", "shared", "fast") if t > 8 else ("",):
                    with prefill_gemm(kind):
                        out[f"gemv/{name}/{n}x{k}/t{t}{kind}"] = kt.gemv(qtype, w, x)
    for k in (5120, 6144, 17408, 10240, 24576):
        x = rng.standard_normal((3, k), dtype=np.float32) * 3
        for i, a in enumerate(kt.pack_act(x)):
            out[f"pack/{k}/{i}"] = a
        for i, a in enumerate(kt.pack_act(x, norm_w=rng.standard_normal(k, dtype=np.float32))):
            out[f"normpack/{k}/{i}"] = a


def engine_outputs(out: dict, model: str) -> None:
    for numerics, suffix in (("exact", ""), ("fast", "/fast")):
        with prefill_gemm(numerics):
            for kv in ("f16", "q8_0"):
                engine_run(out, model, kv, f"engine/{Path(model).stem}/{kv}{suffix}")


def engine_run(out: dict, model: str, kv: str, key: str) -> None:
    from openjet_launcher.engine.cuda import CudaEngine
    eng = CudaEngine.load(model, n_ctx=1024, kv_type=kv)
    try:
        rng = np.random.default_rng(2)
        V = eng.config.shape.n_vocab
        st = eng.new_state()
        o = eng.prefill(st, rng.integers(0, V, 300).tolist(), chunk_size=128)
        out[f"{key}/prefill"] = np.asarray(o.logits)
        for t in range(1, 9):
            o = eng.decode(st, rng.integers(0, V, t).tolist())
            out[f"{key}/decode{t}"] = np.asarray(o.logits)
        if eng.config.has_mtp:  # the speculative path: verify 5 rows, keep 3, decode on, draft 3
            out[f"{key}/verify5"] = np.asarray(eng.verify(st, rng.integers(0, V, 5).tolist()).logits)
            eng.accept(st, 3)
            out[f"{key}/after_accept"] = np.asarray(eng.decode(st, rng.integers(0, V, 2).tolist()).logits)
            out[f"{key}/draft3"] = np.asarray(eng.mtp_draft(st, int(rng.integers(0, V)), 3).logits)
    finally:
        eng.close()


def compare(a_path: str, b_path: str) -> int:
    a, b = np.load(a_path), np.load(b_path)
    keys = sorted(set(a.files) | set(b.files))
    bad = 0
    for key in keys:
        if key not in a.files or key not in b.files:
            print(f"only in one dump: {key}")
            bad += 1
            continue
        x, y = a[key], b[key]
        if x.shape != y.shape or x.tobytes() != y.tobytes():
            diff = np.abs(x.astype(np.float64) - y.astype(np.float64)) if x.shape == y.shape else None
            print(f"DIFFERS {key}: " + (f"max |d| {np.nanmax(diff):.3g}, {int((x != y).sum())} of {x.size}"
                                        if diff is not None else f"shapes {x.shape} {y.shape}"))
            bad += 1
    print(f"{len(keys) - bad} of {len(keys)} arrays bit-identical")
    return 1 if bad else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--models", default="")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"))
    a = ap.parse_args()
    if a.compare:
        raise SystemExit(compare(*a.compare))
    out: dict = {}
    kernel_outputs(out)
    for m in filter(None, a.models.split(",")):
        engine_outputs(out, m)
    np.savez(a.out, **out)
    print(f"{len(out)} arrays -> {a.out}")


if __name__ == "__main__":
    main()
