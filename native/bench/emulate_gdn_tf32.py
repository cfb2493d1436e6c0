"""How much accuracy the chunked Gated DeltaNet loses to tf32 tensor-core products, emulated on the CPU: the
engine's prefill form (gdn_chunk.cu, chunks of 32 tokens) in numpy float32 with the operands of chosen products
rounded to tf32 (10-bit mantissa, round to nearest, ties away: cvt.rna.tf32.f32), against the float64 recurrence
(openjet_launcher/reference/gdn.py). To decide, before writing a kernel, whether a product may move to a single tf32
tensor-core pass. Forms:

    fp32          every product in float32 (the FMA form's class, OPENJET_GDN_STATE_TC=0)
    state_tf32    the state phase's products on tf32 operands: W S, q S, Aq V', k^T (e V') (today's default)
    local_tf32    state_tf32, and the local phase's A = K K^T and Aq = Q K^T on tf32 operands too (a candidate:
                  those two products are most of the local phase's instructions)

Metric per form: max |o - o64| / max |o64| and the same for the final state, over T tokens of n_v heads with the
inputs the GPU tests draw (tests/test_gpu_gdn.py: q, k L2-normalised, beta = sigmoid(2 N), g = ssm_a softplus(2 N +
dt_bias)). The GPU's default measured 2.3e-4 .. 6e-4 against float64 (test_gpu_gdn.py, TF32_TOL 5e-3).

    python native/bench/emulate_gdn_tf32.py [T] > bench/results/gdn-tf32-emulation-cpu.json
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from openjet_launcher.reference.gdn import delta_rule_recurrent  # noqa: E402

C, D = 32, 128


def tf32(x: np.ndarray) -> np.ndarray:
    """x (float32) rounded to tf32's 10-bit mantissa, to nearest with ties away from zero (finite values)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def chunked_f32(q, k, v, beta, g, state, *, state_tf32: bool, local_tf32: bool):
    """gdn_chunk.cu's two phases for [T, H, D] inputs in float32, chosen products on tf32 operands; state updated."""
    f = np.float32
    r = tf32 if state_tf32 else (lambda x: x)
    rl = tf32 if local_tf32 else (lambda x: x)
    n_tok, n_head, _ = v.shape
    o = np.zeros_like(v)
    for t0 in range(0, n_tok, C):
        sl = slice(t0, min(t0 + C, n_tok))
        qc, kc, vc = (np.moveaxis(x[sl], 0, 1) for x in (q, k, v))  # [H, n, D]
        bc, gc = beta[sl].T, g[sl].T                                 # [H, n]
        gamma = np.cumsum(gc, axis=-1, dtype=f)
        n = gamma.shape[-1]
        causal = np.tril(np.ones((n, n), dtype=bool))
        decay = np.exp(np.where(causal, gamma[..., :, None] - gamma[..., None, :], -np.inf)).astype(f)
        kk = rl(kc) @ np.swapaxes(rl(kc), -1, -2)
        a = np.tril(bc[..., :, None] * kk * decay, -1)
        aq = (rl(qc) @ np.swapaxes(rl(kc), -1, -2)) * decay
        rhs = np.concatenate([bc[..., None] * vc, (bc * np.exp(gamma))[..., None] * kc], axis=-1).astype(f)
        uw = np.linalg.solve(a + np.eye(n, dtype=f), rhs).astype(f)
        u, w = uw[..., :D], uw[..., D:]
        s_r = r(state)
        v_new = u - r(w) @ s_r
        o_c = np.exp(gamma)[..., None] * (r(qc) @ s_r) + r(aq) @ r(v_new)
        o[sl] = np.moveaxis(o_c, 0, 1)
        e_rest = np.exp(gamma[..., -1:] - gamma)
        state *= np.exp(gamma[..., -1])[:, None, None]
        state += np.swapaxes(r(kc), -1, -2) @ r(v_new * e_rest[..., None])
    return o


def main() -> None:
    n_tok = int(sys.argv[1]) if sys.argv[1:] else 2048
    n_head = 6
    rng = np.random.default_rng(2026)

    def unit(x):
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    q = (unit(rng.standard_normal((n_tok, n_head, D))) / math.sqrt(D)).astype(np.float32)
    k = unit(rng.standard_normal((n_tok, n_head, D))).astype(np.float32)
    v = rng.standard_normal((n_tok, n_head, D)).astype(np.float32)
    beta = (1 / (1 + np.exp(-2 * rng.standard_normal((n_tok, n_head))))).astype(np.float32)
    ssm_a = -np.exp(rng.uniform(-3.0, 1.0, n_head))
    g = (ssm_a * np.log1p(np.exp(2 * rng.standard_normal((n_tok, n_head)) + rng.uniform(-1, 1, n_head)))).astype(
        np.float32)
    s0 = (rng.standard_normal((n_head, D, D)) * 0.1).astype(np.float32)

    s64 = s0.astype(np.float64)
    o64 = delta_rule_recurrent(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                               beta.astype(np.float64), g.astype(np.float64), s64)
    rows = []
    for name, st, lo in (("fp32", False, False), ("state_tf32", True, False), ("local_tf32", True, True)):
        s = s0.copy()
        o = chunked_f32(q, k, v, beta, g, s, state_tf32=st, local_tf32=lo)
        rows.append({"form": name,
                     "err_o": float(np.abs(o - o64).max() / np.abs(o64).max()),
                     "err_state": float(np.abs(s - s64).max() / np.abs(s64).max())})
        print(f"{name:>11}: o {rows[-1]['err_o']:.2e}  state {rows[-1]['err_state']:.2e}", file=sys.stderr)
    print(json.dumps({"bench": "chunked GDN tf32 emulation (CPU)", "tokens": n_tok, "heads": n_head, "chunk": C,
                      "forms": rows}, indent=1))


if __name__ == "__main__":
    main()
