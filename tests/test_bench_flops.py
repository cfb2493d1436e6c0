"""native/bench/bench_decode.py's prefill FLOP count (issue 8's TFLOP/s) against a count taken from the tensors
a synthetic model's file holds (synth.plan_tensors): every projection matrix once per token, the causal
attention pairs, the MTP head's cache rows and the last token's lm_head."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from openjet_launcher.model.shape import PRESETS, QWEN38_27B
from openjet_launcher.model.synth import plan_tensors

BENCH = Path(__file__).resolve().parents[1] / "native" / "bench" / "bench_decode.py"
PROJECTIONS = {"attn_q", "attn_k", "attn_v", "attn_output", "attn_qkv", "attn_gate", "ssm_alpha", "ssm_beta",
               "ssm_out", "ffn_gate", "ffn_up", "ffn_down"}
# What filling the MTP head's cache row of a prompt token runs (engine.cu mtp_rows without `full` -> attn_store_kv):
# eh_proj, then the head's k and v projections; no q, no attention over its cache, no output projection.
MTP_ROW = {"nextn.eh_proj", "attn_k", "attn_v"}


def bench():
    if "bench_decode" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench_decode", BENCH)
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_decode"] = module
        spec.loader.exec_module(module)
    return sys.modules["bench_decode"]


def flops_from_tensors(shape, n: int) -> int:
    per_token = mtp_row = lm_head = attn_layers = 0
    q_dim = 0
    for p in plan_tensors(shape):
        name, ne = p.spec.name, p.spec.ne
        if name == "output.weight":
            lm_head = ne[0] * ne[1]
        if not name.startswith("blk.") or len(ne) != 2:
            continue
        il, kind = int(name.split(".")[1]), name.split(".", 2)[2].rsplit(".", 1)[0]
        if il < shape.n_layer and kind in PROJECTIONS:
            per_token += ne[0] * ne[1]
            if kind == "attn_q":
                attn_layers += 1
                q_dim = ne[1] // 2                                   # query and gate halves
        elif il == shape.n_layer and kind in MTP_ROW:
            mtp_row += ne[0] * ne[1]
    pairs = n * (n + 1) // 2
    return 2 * per_token * n + attn_layers * 4 * q_dim * pairs + 2 * lm_head + 2 * mtp_row * (n - 1)


@pytest.mark.parametrize("shape", [PRESETS["tiny"], PRESETS["small"], QWEN38_27B], ids=["tiny", "small", "27b"])
@pytest.mark.parametrize("n", [1, 512, 4096])
def test_prefill_flops_equal_the_tensor_count(shape, n):
    assert bench().prefill_flops(shape, n, mtp=True) == flops_from_tensors(shape, n)


def test_27b_prefill_is_about_50_gflop_per_token():
    per_token = bench().prefill_flops(QWEN38_27B, 4096, mtp=True) / 4096
    assert 45e9 < per_token < 55e9     # ~2 x 25B projection weights, plus attention and the MTP rows
