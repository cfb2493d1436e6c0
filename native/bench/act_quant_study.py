"""How much each way of quantising a decode GEMV's activations moves a model's next-token distribution: the numpy
reference engine with every weight matmul's input (x in x @ W) rounded as a GEMV form would round it, against the
same engine in float32, teacher-forced over a text. A CPU study for the integer GEMV's numerics (NOTES_gemv.md,
forty-seventh session): whether one int8 digit per element passes issue 6's bars (mean KL <= 2e-3 nats, top-1
agreement >= 99.5%) where the two-digit form measured 4-5x closer to x than the fp16 pack.

    python3 native/bench/act_quant_study.py [--model openjet-demo.gguf] [--text FILE] [--tokens 512] [--out F]

Schemes (the weights stay the reference's float32 dequantisation in every one, so only x's rounding differs):
  fp16       the engine's pack today: x times a power of two c (max |x c| just under 2^15), rounded to fp16
  i16x256    gemv_imma.cuh's two digits: per 256-block b, rint(x 32639 / max|x_b|)
  i16x32     the same two digits with a scale per 32-block (a Q4_K / Q5_K sub-block: local to two 16-row tiles)
  i16row     the same two digits with one scale per row, 32639 / max|x| (the meeting the fp16 pack has already)
  i16row2    one power-of-two scale per row as the fp16 pack's, max |x c| in [2^13, 2^14) (the digits' range)
  i8x32      one int8 per element, a float scale per 32-block (llama.cpp's q8_1 activations)
  i8x256     one int8 per element, a scale per 256-block (a k-quant super-block)
  i8row      one int8 per element, a scale per row (a token's whole input)
JSON: per scheme mean / max KL(float32 || scheme) in nats, top-1 agreement, and the relative rms error of the
rounded inputs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

DEMO = Path(__file__).resolve().parents[2] / "openjet_launcher" / "assets" / "openjet-demo.gguf"


def blockwise(x: np.ndarray, block: int, levels: int) -> np.ndarray:
    """x [.., k] rounded to rint(x levels / max|x_b|) steps per block of `block` along k (block 0: the whole row)."""
    k = x.shape[-1]
    b = k if block == 0 else block
    if k % b:
        raise ValueError(f"k = {k} is not a multiple of the block {b}")
    xb = x.reshape(*x.shape[:-1], k // b, b).astype(np.float64)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    scale = np.where(amax > 0, levels / np.where(amax > 0, amax, 1.0), 0.0)
    q = np.rint(xb * scale)
    out = np.where(scale > 0, q / np.where(scale > 0, scale, 1.0), 0.0)
    return out.reshape(x.shape).astype(np.float32)


def fp16_pack(x: np.ndarray) -> np.ndarray:
    """The fp16 pack's values: x c in fp16, c a power of two with max |x c| in [2^14, 2^15) per row; back to x."""
    amax = np.abs(x).max(axis=-1, keepdims=True).astype(np.float64)
    shift = np.where(amax > 0, 14 - np.floor(np.log2(np.where(amax > 0, amax, 1.0))), 0.0)
    c = np.exp2(shift)
    return ((x * c).astype(np.float16).astype(np.float64) / c).astype(np.float32)


def int16_row_pow2(x: np.ndarray) -> np.ndarray:
    """Two digits with the fp16 pack's kind of scale: rint(x c), c a power of two with max |x c| in [2^13, 2^14)."""
    amax = np.abs(x).max(axis=-1, keepdims=True).astype(np.float64)
    shift = np.where(amax > 0, 13 - np.floor(np.log2(np.where(amax > 0, amax, 1.0))), 0.0)
    c = np.exp2(shift)
    return (np.rint(x * c) / c).astype(np.float32)


SCHEMES = {
    "fp16": fp16_pack,
    "i16x256": lambda x: blockwise(x, 256, 32639),
    "i16x32": lambda x: blockwise(x, 32, 32639),
    "i16row": lambda x: blockwise(x, 0, 32639),
    "i16row2": int16_row_pow2,
    "i8x32": lambda x: blockwise(x, 32, 127),
    "i8x256": lambda x: blockwise(x, 256, 127),
    "i8row": lambda x: blockwise(x, 0, 127),
}


def rounding_matrix(rounder):
    """The ndarray subclass whose `x @ W` rounds x with `rounder` first (Python tries a subclass's reflected operator
    before the left operand's), recording each rounding's relative rms error in the class's own `errors`."""

    class RoundedInput(np.ndarray):
        errors: list[float] = []

        def __rmatmul__(self, x):
            x = np.asarray(x, np.float32)
            xr = rounder(x)
            den = float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))
            if den > 0:
                RoundedInput.errors.append(float(np.sqrt(np.mean(np.square(xr - x, dtype=np.float64)))) / den)
            return np.asarray(xr) @ self.view(np.ndarray)

    return RoundedInput


def with_rounded_inputs(weights, matrix_type):
    """A copy of the reference's weights whose matrices (the fields read as x @ W) are views of matrix_type."""
    matrices = {"w_in", "w_out", "w_q", "w_kv", "gate_up", "down", "eh_proj"}

    def wrap(obj):
        changes = {}
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if f.name in matrices and isinstance(v, np.ndarray) and v.ndim == 2:
                changes[f.name] = v.view(matrix_type)
            elif dataclasses.is_dataclass(v):
                changes[f.name] = wrap(v)
        return dataclasses.replace(obj, **changes)

    layers = tuple(dataclasses.replace(layer, mixer=wrap(layer.mixer), ffn=wrap(layer.ffn)) for layer in weights.layers)
    mtp = wrap(weights.mtp) if weights.mtp is not None else None
    return dataclasses.replace(weights, layers=layers, output=weights.output.view(matrix_type), mtp=mtp)


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def compare(base: np.ndarray, other: np.ndarray) -> dict:
    """KL(base || other) per row in nats, and whether the rows' argmax agree."""
    lp, lq = log_softmax(base), log_softmax(other)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=-1)
    return {"kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
            "top1_agreement": float((base.argmax(-1) == other.argmax(-1)).mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(DEMO))
    ap.add_argument("--text", help="a UTF-8 text to teacher-force (default: this file's docstring, repeated)")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--out", help="the JSON's file (default: stdout)")
    a = ap.parse_args()

    from openjet_launcher.model.gguf_file import GGUFFile
    from openjet_launcher.reference.engine import ReferenceEngine
    from openjet_launcher.text.tokenizer import Tokenizer

    eng = ReferenceEngine.load(a.model)
    text = Path(a.text).read_text(encoding="utf-8") if a.text else __doc__ * 8
    ids = Tokenizer.from_gguf(GGUFFile(a.model)).encode(text)[: a.tokens]
    if len(ids) < 2:
        raise SystemExit("act_quant_study: the text gives fewer than 2 tokens")

    def logits(engine) -> np.ndarray:
        return engine.prefill(engine.new_state(), ids, chunk_size=64, all_logits=True).logits

    base = logits(eng)
    out = {"bench": "act_quant_study", "model": Path(a.model).name, "tokens": len(ids), "schemes": {}}
    for name in a.schemes.split(","):
        matrix_type = rounding_matrix(SCHEMES[name])
        row = compare(base, logits(ReferenceEngine(eng.config, with_rounded_inputs(eng.weights, matrix_type))))
        row["input_rel_rms_error"] = float(np.mean(matrix_type.errors))
        out["schemes"][name] = row
        print(f"{name:8s} KL mean {row['kl_mean']:.3e} max {row['kl_max']:.3e} top-1 {row['top1_agreement']:.4f} "
              f"x error {row['input_rel_rms_error']:.2e}", file=sys.stderr)
    text_out = json.dumps(out, indent=1)
    if a.out:
        Path(a.out).write_text(text_out + "\n")
    else:
        print(text_out)


if __name__ == "__main__":
    main()
