"""How much accuracy a prefill loses if its trunk projection GEMMs run in lower precision: an emulation on CPU
with the numpy reference engine, to decide whether FP8 tensor-core GEMMs could serve the prefill.

Every trunk projection of the reference is a plain ``a @ W`` with float32 ``W`` (attention q / kv / out, GDN
in / out, FFN gate_up / down). Each variant below replaces those products by ``act(a) @ weight(W)``, where
``act`` and ``weight`` round their operand the way a low-precision GEMM would and return it dequantised to
float32 (the products are then summed in float32, as an FP8 GEMM with per-token / per-channel scales does up
to the order of its sums). The lm_head ``output``, the embedding, the attention score / value products, the
GDN recurrence and the MTP head are left exact. Variants:

    exact             the reference as is: the oracle
    fp16_act          activations in fp16 after a per-row power-of-two scale s, max|x| s in [2^14, 2^15)
                      (what the CUDA engine does today)
    int8_act_block32  activations int8, one scale absmax/127 per 32 consecutive elements of a row
    fp8_w             weights E4M3, one scale absmax/448 per output channel
    fp8_act           activations E4M3, one scale absmax/448 per row (token)
    fp8_both          fp8_w and fp8_act together (an FP8 GEMM with per-channel / per-token scales)
    fp8_act_block128  activations E4M3, one scale absmax/448 per 128 elements of a row; weights as fp8_w
                      (DeepSeek-style fine-grained scaling)
    fp16_acc          fp16 operands (activations after a per-row power-of-two scale s, max|x| s in [1, 2),
                      weights rounded to fp16) and an fp16 accumulator: each 16-element slice's products summed
                      (as one mma.sync m16n8k16) and added to the accumulator, which is rounded to fp16 after each
                      slice: the GeForce cards' double-rate tensor-core path (RTX 3090: 142 TFLOP/s with fp16
                      accumulation, 71 with fp32)
    fp16_acc_512      the same, the fp16 accumulator added into an fp32 one (and cleared) every 512 elements of k
    fp16_acc_128      the same every 128 elements (fp16_acc_64, fp16_acc_32: every 64, 32)

E4M3 is torch.float8_e4m3fn with round-to-nearest-even, after scaling into |v| <= 448. Interception: the
weight arrays of the trunk layers are swapped, once after load, for ``Projection`` objects that hold the
(weight-rounded) matrix and the activation rounding; numpy defers ``a @ Projection`` to
``Projection.__rmatmul__`` (``__array_ufunc__ = None``, NEP 13), so the reference code runs unmodified.

Metric: one random prompt (np.random.default_rng(1234), 2,048 ids by default) prefilled with all_logits=True;
each variant's logits against ``exact``'s: top-1 agreement and KL(exact || variant) per position. Issue 6's
bar: top-1 >= 0.995 and mean KL <= 2e-3 nats. The models are the synthetic presets (random weights in the
unsloth Q4_K_M recipe, dequantised): they say how the rounding propagates through the real layer structure,
not how a trained model's activation outliers behave.

    python native/bench/bench_low_precision.py --out bench/results/low-precision-emulation-cpu.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from openjet_launcher.reference import ReferenceEngine
from openjet_launcher.reference.weights import AttentionWeights, FFNWeights, GDNWeights, ModelWeights

TOP1_MIN = 0.995
MEAN_KL_MAX = 2e-3
E4M3_MAX = 448.0
INT8_MAX = 127.0

Rounding = Callable[[np.ndarray], np.ndarray]

torch.set_num_threads(1)        # torch only rounds here; its thread pool spinning next to BLAS's stalls both


# ----------------------------------------------------------------------------------------- rounding helpers

def round_e4m3(v: np.ndarray) -> np.ndarray:
    """v (float32, |v| <= 448) rounded to the nearest E4M3 value (ties to even), back in float32."""
    out = torch.from_numpy(np.ascontiguousarray(v, np.float32)).to(torch.float8_e4m3fn).to(torch.float32).numpy()
    if np.isnan(out).any():
        raise AssertionError("E4M3 rounding produced NaN: a value was out of range")
    return out


def round_int8(v: np.ndarray) -> np.ndarray:
    """v (|v| <= 127) rounded to the nearest integer (ties to even), as float32."""
    return np.rint(v).astype(np.float32)


def fake_quant(x: np.ndarray, group: int, qmax: float, rnd: Rounding) -> np.ndarray:
    """x [rows, K] quantised and dequantised: each row cut into blocks of ``group`` consecutive elements (the
    last one zero-padded), each block scaled by its absmax / qmax, rounded by ``rnd``, scaled back."""
    rows, k = x.shape
    n_blocks = -(-k // group)
    padded = np.zeros((rows, n_blocks * group), np.float32)
    padded[:, :k] = x
    blocks = padded.reshape(rows, n_blocks, group)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    scale = np.where(amax > 0, amax / np.float32(qmax), np.float32(1.0)).astype(np.float32)
    q = rnd(np.clip(blocks / scale, -qmax, qmax))
    return (q * scale).reshape(rows, n_blocks * group)[:, :k]


# ------------------------------------------------------------------------- the variants' operand roundings

def row_scale(x: np.ndarray, top: int) -> np.ndarray:
    """Per row of x: the power of two s with max|x| s in [2^(top - 1), 2^top) (1 for a row of zeros)."""
    amax = np.abs(x).max(axis=-1, keepdims=True)
    _, e = np.frexp(np.where(amax > 0, amax, 1.0))                 # amax = f 2^e, f in [0.5, 1)
    return np.ldexp(np.float32(1.0), top - e).astype(np.float32)   # amax s = f 2^top


def fp16_scaled(x: np.ndarray, top: int) -> np.ndarray:
    """x s rounded to fp16 (ties to even), divided by s again (exact: s is a power of two)."""
    s = row_scale(x, top)
    return ((x * s).astype(np.float16).astype(np.float32) / s).astype(np.float32)


def fp16_act(x: np.ndarray) -> np.ndarray:
    """Per row: a power-of-two scale s with max|x| s in [2^14, 2^15), then fp16 (what the CUDA engine does)."""
    return fp16_scaled(x, 15)


def int8_act_block32(x: np.ndarray) -> np.ndarray:
    """Per row, blocks of 32: int8 with scale absmax / 127."""
    return fake_quant(x, 32, INT8_MAX, round_int8)


def fp8_act(x: np.ndarray) -> np.ndarray:
    """Per row (token): E4M3 with scale absmax / 448."""
    return fake_quant(x, x.shape[-1], E4M3_MAX, round_e4m3)


def fp8_act_block128(x: np.ndarray) -> np.ndarray:
    """Per row, blocks of 128: E4M3 with scale absmax / 448."""
    return fake_quant(x, 128, E4M3_MAX, round_e4m3)


def fp16_act_unit(x: np.ndarray) -> np.ndarray:
    """Per row: a power-of-two scale s with max|x| s in [1, 2), then fp16: the range an fp16 accumulator needs
    (fp16_act's [2^14, 2^15) would overflow it)."""
    return fp16_scaled(x, 1)


def fp16_w(w: np.ndarray) -> np.ndarray:
    """W rounded to fp16 (ties to even), back in float32."""
    return w.astype(np.float16).astype(np.float32)


def fp16_accumulate(promote: int | None) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """a [rows, K] @ w [K, N] with an fp16 accumulator: per 16-element slice of k the products' sum (float32, as
    the tensor core sums one mma's 16 products before rounding) added to the accumulator, rounded to fp16 (ties
    to even); every ``promote`` elements (None: never) the accumulator is added into a float32 total and cleared.
    The activations' per-row scale is undone on the result (the matmul sees a / s's rows as they were rounded)."""
    def matmul(a: np.ndarray, w: np.ndarray) -> np.ndarray:
        s = row_scale(a, 1)     # fp16_act_unit's scale (a power of two: the operands stay the fp16 values)
        a = a * s
        total = np.zeros((a.shape[0], w.shape[1]), np.float32)
        acc = np.zeros_like(total)
        for k0 in range(0, a.shape[1], 16):
            acc = (acc + a[:, k0:k0 + 16] @ w[k0:k0 + 16]).astype(np.float16).astype(np.float32)
            if not np.isfinite(acc).all():
                raise AssertionError("the fp16 accumulator overflowed")
            if promote and (k0 + 16) % promote == 0:
                total, acc = total + acc, np.zeros_like(acc)
        return (total + acc) / s
    return matmul


def fp8_w(w: np.ndarray) -> np.ndarray:
    """W [in, out]: E4M3 with one scale absmax / 448 per output channel (column)."""
    return np.ascontiguousarray(fake_quant(np.ascontiguousarray(w.T), w.shape[0], E4M3_MAX, round_e4m3).T)


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    weight: Rounding | None         # applied once to every trunk projection matrix
    act: Rounding | None            # applied to the activations of every trunk projection call
    description: str
    matmul: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None   # the product (default: float32 a @ w)


VARIANTS = (
    Variant("exact", None, None, "the float32 reference (the oracle)"),
    Variant("fp16_act", None, fp16_act, "activations fp16 after a per-row power-of-two scale; weights exact"),
    Variant("int8_act_block32", None, int8_act_block32, "activations int8, scale absmax/127 per 32-element "
            "block of a row; weights exact"),
    Variant("fp8_w", fp8_w, None, "weights E4M3, scale absmax/448 per output channel; activations exact"),
    Variant("fp8_act", None, fp8_act, "activations E4M3, scale absmax/448 per row (token); weights exact"),
    Variant("fp8_both", fp8_w, fp8_act, "weights E4M3 per output channel and activations E4M3 per token"),
    Variant("fp8_act_block128", fp8_w, fp8_act_block128, "activations E4M3, scale absmax/448 per 128-element "
            "block of a row; weights E4M3 per output channel"),
    Variant("fp16_acc", fp16_w, fp16_act_unit, "fp16 operands, an fp16 accumulator rounded after every 16 "
            "elements of k", fp16_accumulate(None)),
    Variant("fp16_acc_512", fp16_w, fp16_act_unit, "the same, into fp32 every 512 elements", fp16_accumulate(512)),
    Variant("fp16_acc_128", fp16_w, fp16_act_unit, "the same, into fp32 every 128 elements", fp16_accumulate(128)),
    Variant("fp16_acc_64", fp16_w, fp16_act_unit, "the same, into fp32 every 64 elements", fp16_accumulate(64)),
    Variant("fp16_acc_32", fp16_w, fp16_act_unit, "the same, into fp32 every 32 elements", fp16_accumulate(32)),
)


# -------------------------------------------------------------------------------------------- interception

class Projection:
    """Stands in for a trunk weight W in the reference's ``a @ W``: holds W (already weight-rounded) and
    rounds the activations on each call. numpy defers ``a @ self`` to ``__rmatmul__`` because of
    ``__array_ufunc__ = None`` (NEP 13)."""

    __array_ufunc__ = None

    def __init__(self, w: np.ndarray, act: Rounding | None, counter: list[int],
                 matmul: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None):
        self.w, self.act, self.counter, self.matmul = w, act, counter, matmul

    @property
    def shape(self) -> tuple[int, ...]:
        return self.w.shape

    def __rmatmul__(self, a: np.ndarray) -> np.ndarray:
        self.counter[0] += 1
        if self.act is not None:
            a = self.act(a.reshape(-1, a.shape[-1])).reshape(a.shape)
        if self.matmul is not None:
            return self.matmul(a.reshape(-1, a.shape[-1]), self.w).reshape(*a.shape[:-1], self.w.shape[-1])
        return a @ self.w


PROJECTIONS = {AttentionWeights: ("w_q", "w_kv", "w_out"), GDNWeights: ("w_in", "w_out"),
               FFNWeights: ("gate_up", "down")}


def emulated_weights(w: ModelWeights, v: Variant, counter: list[int]) -> ModelWeights:
    """A copy of ``w`` whose trunk projection matrices are ``Projection``s for variant ``v``."""
    def wrap(part):
        return dataclasses.replace(part, **{
            name: Projection(getattr(part, name) if v.weight is None else v.weight(getattr(part, name)),
                             v.act, counter, v.matmul)
            for name in PROJECTIONS[type(part)]})
    layers = tuple(dataclasses.replace(layer, mixer=wrap(layer.mixer), ffn=wrap(layer.ffn)) for layer in w.layers)
    return dataclasses.replace(w, layers=layers)


# ------------------------------------------------------------------------------------------------- metric

def compare(ref: np.ndarray, got: np.ndarray) -> dict:
    """Top-1 agreement and KL(ref || got) per position, as tests/test_gpu_engine.py's bar measures them."""
    def log_softmax(z: np.ndarray) -> np.ndarray:
        z = z.astype(np.float64) - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    lr, lg = log_softmax(ref), log_softmax(got)
    kl = (np.exp(lr) * (lr - lg)).sum(-1)
    top1 = ref.argmax(-1) == got.argmax(-1)
    return {"positions": len(ref), "top1": float(top1.mean()), "mean_kl": float(kl.mean()),
            "max_kl": float(kl.max()), "p99_kl": float(np.quantile(kl, 0.99))}


def logit_stats(logits: np.ndarray) -> dict:
    """How peaked the oracle's distributions are: what a given logit error does to top-1 and KL depends on it."""
    z = logits.astype(np.float64)
    top2 = np.sort(z, axis=-1)[:, -2:]
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return {"mean_row_std": float(z.std(-1).mean()), "median_top1_top2_gap": float(np.median(top2[:, 1] - top2[:, 0])),
            "frac_gap_below_0.1": float(np.mean(top2[:, 1] - top2[:, 0] < 0.1)),
            "mean_max_prob": float(p.max(-1).mean())}


# ------------------------------------------------------------------------------------------------ driver

def model_path(preset: str, directory: Path) -> Path:
    path = directory / f"{preset}.gguf"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "openjet_launcher", "synth", "--preset", preset, "--quiet",
                        str(path)], check=True, stdout=subprocess.DEVNULL)
    return path


def run_model(preset: str, directory: Path, n_tokens: int, variants: list[Variant]) -> dict:
    path = model_path(preset, directory)
    base = ReferenceEngine.load(path)
    shape = base.config.shape
    ids = np.random.default_rng(1234).integers(0, shape.n_vocab, n_tokens)
    out = {"preset": preset, "path": str(path), "n_tokens": n_tokens,
           "shape": {k: getattr(shape, k) for k in ("n_embd", "n_ff", "n_layer", "n_head", "n_head_kv",
                                                    "head_dim", "ssm_n_v_heads", "ssm_head_dim", "n_vocab")},
           "results": []}
    base.prefill(base.new_state(), ids[:64], all_logits=True)     # warm-up: the first call pays one-off costs
    reference = None
    for v in variants:
        counter = [0]
        t0 = time.perf_counter()
        engine = base if v.name == "exact" else ReferenceEngine(base.config, emulated_weights(base.weights, v, counter))
        t1 = time.perf_counter()
        logits = engine.prefill(engine.new_state(), ids, all_logits=True).logits
        seconds = time.perf_counter() - t1
        if not np.isfinite(logits).all():
            raise AssertionError(f"{preset} {v.name}: non-finite logits")
        if reference is None:
            assert v.name == "exact", "the first variant must be exact"
            reference = logits
            out["exact_logits"] = logit_stats(logits)
        row = {"variant": v.name, "description": v.description, **compare(reference, logits)}
        row["passes_bar"] = row["top1"] >= TOP1_MIN and row["mean_kl"] <= MEAN_KL_MAX
        row["logits_rel_rms_err"] = float(np.sqrt(np.mean((logits.astype(np.float64) - reference) ** 2))
                                          / np.std(reference.astype(np.float64), axis=-1).mean())
        row["setup_seconds"] = round(t1 - t0, 2)
        row["prefill_seconds"] = round(seconds, 2)
        row["matmuls_intercepted"] = counter[0]
        out["results"].append(row)
        print(f"{preset:>6} {v.name:>17}: top1 {row['top1']:.4f}  mean KL {row['mean_kl']:.3e}  "
              f"p99 {row['p99_kl']:.3e}  max {row['max_kl']:.3e}  {'pass' if row['passes_bar'] else 'FAIL'}"
              f"  {t1 - t0:.1f} + {seconds:.1f} s", file=sys.stderr, flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["tiny", "small"], help="synth presets (default: tiny small)")
    p.add_argument("--tokens", type=int, default=2048, help="prompt length (default 2048)")
    p.add_argument("--dir", type=Path, default=Path("/tmp/lp"), help="where the synthetic GGUFs live / are written")
    p.add_argument("--variants", nargs="+", default=[v.name for v in VARIANTS],
                   choices=[v.name for v in VARIANTS], help="exact is always run first")
    p.add_argument("--out", type=Path, help="also write the JSON here")
    args = p.parse_args()
    variants = [v for v in VARIANTS if v.name == "exact" or v.name in args.variants]

    t0 = time.perf_counter()
    doc = {
        "what": "logits of a prefill whose trunk projection matmuls are rounded to low precision (emulated on CPU "
                "with the numpy reference engine), against the float32 reference",
        "bar": {"top1_min": TOP1_MIN, "mean_kl_max": MEAN_KL_MAX, "source": "issue 6"},
        "prompt": {"rng": "np.random.default_rng(1234).integers(0, n_vocab, n_tokens)", "n_tokens": args.tokens},
        "emulated": "attention q / kv / out, GDN in / out, FFN gate_up / down of every trunk layer; lm_head, "
                    "embedding, attention scores / values, GDN recurrence and MTP head exact",
        "machine": {"numpy": np.__version__, "torch": torch.__version__, "python": platform.python_version(),
                    "platform": platform.platform(), "cpu_count": os.cpu_count()},
        "models": [run_model(m, args.dir, args.tokens, variants) for m in args.models],
    }
    doc["total_seconds"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(doc, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
