"""Gated DeltaNet decode step on the GPU (issue 6, native/src/gdn_decode.cuh) against the numpy reference.

Oracle: the reference's own functions (openjet_launcher/reference/gdn.py: causal_conv, delta_rule_recurrent;
reference/ops.py) composed exactly as gdn_mixer composes them after the projections, evaluated in float64;
at the tiny sizes also gdn_mixer itself (identity projections). The GPU computes in fp32, so the figure is
max |gpu - ref| / max |ref| per output, expected ~1e-6 (asserted < 1e-5).

T-invariance: the kernel computes each token with the same code in the same order wherever it sits in a
call, and the state round-trips memory as exact fp32, so T tokens in one call equal T one-token calls bit
for bit (asserted with array_equal).

OPENJET_GPU_REPORT=path appends the measured error figures as JSON lines.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from gpu_report import report

from openjet_launcher.engine import kernels_test as kt
from openjet_launcher.engine import kernels_test_gdn as kg
from openjet_launcher.errors import OpenJetError
from openjet_launcher.model.shape import PRESETS
from openjet_launcher.reference.gdn import causal_conv, delta_rule_recurrent, gdn_mixer
from openjet_launcher.reference.ops import l2_normalize, rms_norm, sigmoid, silu, softplus
from openjet_launcher.reference.weights import GDNWeights

pytestmark = pytest.mark.gpu

D = kg.HEAD_DIM
EPS = 1e-6
SIZES = {"27B": (16, 48), "tiny": (2, 6)}  # (n_k, n_v): 27B per-layer sizes (spec §1), the tiny preset's
TOL = 1e-5


@pytest.fixture(autouse=True)
def _recurrence_unless_a_test_asks(monkeypatch):
    """OPENJET_GDN_CHUNKED=0: the test API's calls are prefill calls, which take the two-phase chunked form by
    default (the engine's prefill default); the tests of the chunked forms set the switch themselves."""
    monkeypatch.setenv("OPENJET_GDN_CHUNKED", "0")


def random_params(rng, n_k: int, n_v: int) -> dict:
    conv_dim = (2 * n_k + n_v) * D
    return {
        "conv_w": rng.uniform(-0.6, 0.6, (conv_dim, 4)).astype(np.float32),
        "ssm_a": -np.exp(rng.uniform(-3.0, 1.0, n_v)).astype(np.float32),
        "dt_bias": rng.uniform(-1.0, 1.0, n_v).astype(np.float32),
        "norm_w": rng.uniform(0.5, 1.5, D).astype(np.float32),
    }


def random_tokens(rng, n_k: int, n_v: int, t: int) -> dict:
    conv_dim = (2 * n_k + n_v) * D
    return {
        "qkv": rng.standard_normal((t, conv_dim), dtype=np.float32),
        "z": rng.standard_normal((t, n_v * D), dtype=np.float32),
        "b": rng.standard_normal((t, n_v), dtype=np.float32) * np.float32(2),
        "alpha": rng.standard_normal((t, n_v), dtype=np.float32) * np.float32(2),
    }


def random_state(rng, n_k: int, n_v: int) -> tuple[np.ndarray, np.ndarray]:
    conv_dim = (2 * n_k + n_v) * D
    return (rng.standard_normal((3, conv_dim), dtype=np.float32),
            rng.standard_normal((n_v, D, D), dtype=np.float32) * np.float32(0.1))


def reference_step(n_k, n_v, tok, par, conv_state, state, *, dtype=np.float64, pairing="tiled"):
    """gdn_mixer's body after the projections, in ``dtype``. Returns (y [t, n_v*D], conv state, state)."""
    c = lambda a: np.asarray(a, dtype=dtype)  # noqa: E731
    t, kd = len(tok["qkv"]), n_k * D
    conv_out, cs = causal_conv(c(tok["qkv"]), c(conv_state), c(par["conv_w"]).T)
    x = silu(conv_out)
    q = l2_normalize(x[:, :kd].reshape(t, n_k, D), EPS) * dtype(1.0 / math.sqrt(D))
    k = l2_normalize(x[:, kd:2 * kd].reshape(t, n_k, D), EPS)
    v = x[:, 2 * kd:].reshape(t, n_v, D)
    r = n_v // n_k
    if pairing == "tiled":   # GGUF: value head h reads key head h mod n_k
        q, k = np.tile(q, (1, r, 1)), np.tile(k, (1, r, 1))
    else:                    # HF: h div r (what the kernel must NOT do with GGUF weights)
        q, k = np.repeat(q, r, axis=1), np.repeat(k, r, axis=1)
    beta = sigmoid(c(tok["b"]))
    g = c(par["ssm_a"]) * softplus(c(tok["alpha"]) + c(par["dt_bias"]))
    s = c(state).copy()
    o = delta_rule_recurrent(q, k, v, beta, g, s)
    y = rms_norm(o, c(par["norm_w"]), EPS) * silu(c(tok["z"]).reshape(t, n_v, D))
    return y.reshape(t, n_v * D), cs, s


def gpu_step(n_k, n_v, tok, par, conv_state, state):
    return kg.gdn_step(n_k, n_v, tok["qkv"], tok["z"], tok["b"], tok["alpha"], par["conv_w"], conv_state,
                       par["ssm_a"], par["dt_bias"], par["norm_w"], state, EPS)


def err(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(x.astype(np.float64) - ref).max() / np.abs(ref).max())


def check_close(label: str, got: tuple, ref: tuple, tol: float = TOL, **fields) -> dict:
    e = {name: err(g, r) for name, g, r in zip(("y", "conv_state", "state"), got, ref)}
    report(test="gdn_step", label=label, **fields, **{f"err_{k}": v for k, v in e.items()})
    for name, g in zip(("y", "conv_state", "state"), got):
        assert np.isfinite(g).all(), f"{label}: {name} has non-finite values"
    for name, v in e.items():
        assert v < tol, f"{label}: {name} max error / max |ref| = {v:.2e}"
    return e


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("t", [*range(1, 9), 20])  # 20: three sub-steps of the kernel, the last one ragged
def test_step_matches_reference(size, t):
    n_k, n_v = SIZES[size]
    rng = np.random.default_rng(100 * t + n_v)
    par, tok = random_params(rng, n_k, n_v), random_tokens(rng, n_k, n_v, t)
    cs, s = random_state(rng, n_k, n_v)
    got = gpu_step(n_k, n_v, tok, par, cs, s)
    check_close(f"{size} t={t}", got, reference_step(n_k, n_v, tok, par, cs, s), n_k=n_k, n_v=n_v, t=t)
    # the conv state is exactly the last three raw inputs of [state ‖ qkv]
    np.testing.assert_array_equal(got[1], np.concatenate([cs, tok["qkv"]])[-3:])


@pytest.mark.parametrize("size", SIZES)
def test_state_after_eight_steps_matches_reference(size):
    n_k, n_v = SIZES[size]
    rng = np.random.default_rng(7 + n_v)
    par = random_params(rng, n_k, n_v)
    cs, s = random_state(rng, n_k, n_v)
    ref_cs, ref_s = cs.astype(np.float64), s.astype(np.float64)
    ys, ref_ys = [], []
    for step in range(8):
        tok = random_tokens(rng, n_k, n_v, 1 + (3 * step) % 8)
        y, cs, s = gpu_step(n_k, n_v, tok, par, cs, s)
        ry, ref_cs, ref_s = reference_step(n_k, n_v, tok, par, ref_cs, ref_s)
        ys.append(y)
        ref_ys.append(ry)
    check_close(f"{size} after 8 steps", (np.concatenate(ys), cs, s), (np.concatenate(ref_ys), ref_cs, ref_s),
                n_k=n_k, n_v=n_v, steps=8)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("t", [2, 5, 8, 13, 37])  # 13, 37: a prefill chunk's rows, in sub-steps of 8 inside the call
def test_t_tokens_in_one_call_equal_t_single_calls_bitwise(size, t):
    n_k, n_v = SIZES[size]
    rng = np.random.default_rng(31 * t + n_v)
    par, tok = random_params(rng, n_k, n_v), random_tokens(rng, n_k, n_v, t)
    cs0, s0 = random_state(rng, n_k, n_v)
    y_all, cs_all, s_all = gpu_step(n_k, n_v, tok, par, cs0, s0)
    cs, s, ys = cs0, s0, []
    for i in range(t):
        y, cs, s = gpu_step(n_k, n_v, {key: a[i:i + 1] for key, a in tok.items()}, par, cs, s)
        ys.append(y)
    np.testing.assert_array_equal(y_all, np.concatenate(ys))
    np.testing.assert_array_equal(cs_all, cs)
    np.testing.assert_array_equal(s_all, s)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("replay", [0, 1, 3, 8])
@pytest.mark.parametrize("t", [1, 5, 8])
def test_a_fused_replay_gives_the_bits_of_one_row_calls(size, replay, t):
    """The engine's fused GDN replay (OPENJET_GDN_REPLAY=fused) at the kernel: `replay` rows from a ring before the
    call's own t, the state and conv window written after `commit` rows (all: a decode step; the replay rows only: a
    verify step, whose own rows wait for accept). Every output equals a chain of one-row calls bit for bit (the
    T-invariance test above anchors those to the reference): y of the own rows, the state and conv state after
    exactly `commit` rows, and nothing written where commit is 0. 8 + 1 and more rows take the kernel's second
    sub-step (a prefetch there once went by the own rows' count)."""
    n_k, n_v = SIZES[size]
    rng = np.random.default_rng(97 * replay + 13 * t + n_v)
    par, tok = random_params(rng, n_k, n_v), random_tokens(rng, n_k, n_v, replay + t)
    cs0, s0 = random_state(rng, n_k, n_v)
    chain = [(cs0, s0)]  # conv state and state after 0, 1, ... rows
    ys = []
    for i in range(replay + t):
        y, cs, s = gpu_step(n_k, n_v, {key: a[i:i + 1] for key, a in tok.items()}, par, *chain[-1])
        chain.append((cs, s))
        ys.append(y)
    poison = np.full_like(cs0, np.nan)
    for commit in (-1, replay):
        y, cs, s = kg.gdn_step_replay(n_k, n_v, replay, commit, tok["qkv"], tok["z"][replay:], tok["b"], tok["alpha"],
                                      par["conv_w"], cs0, par["ssm_a"], par["dt_bias"], par["norm_w"], s0, poison, EPS)
        rows = replay + t if commit < 0 else commit
        report(test="gdn_fused_replay", size=size, replay=replay, t=t, commit=rows)
        np.testing.assert_array_equal(y, np.concatenate(ys[replay:]), err_msg=f"y, commit {commit}")
        np.testing.assert_array_equal(s, chain[rows][1], err_msg=f"state, commit {commit}")
        if rows:
            np.testing.assert_array_equal(cs, chain[rows][0], err_msg=f"conv state, commit {commit}")
        else:
            assert np.isnan(cs).all(), "commit 0 wrote the conv state"


def test_the_fused_replay_refuses_what_it_cannot_take():
    n_k, n_v = SIZES["tiny"]
    rng = np.random.default_rng(5)
    par, tok = random_params(rng, n_k, n_v), random_tokens(rng, n_k, n_v, 10)
    cs0, s0 = random_state(rng, n_k, n_v)
    for replay, commit in ((9, -1), (1, 11), (2, -2)):  # replay past 8 rows, commit past the rows, commit < -1
        with pytest.raises(OpenJetError, match="gdn_step_replay"):
            kg.gdn_step_replay(n_k, n_v, replay, commit, tok["qkv"], tok["z"][replay:], tok["b"], tok["alpha"],
                               par["conv_w"], cs0, par["ssm_a"], par["dt_bias"], par["norm_w"], s0, cs0, EPS)


def default_and_switched(size: str, t: int, seed_mul: int, monkeypatch, name: str, value: str):
    """A random call of t rows at `size` (seed seed_mul * t + n_v) on the default kernels, then with the environment's
    `name` set to `value`: (reference_step's arguments, the default result, the switched result)."""
    n_k, n_v = SIZES[size]
    rng = np.random.default_rng(seed_mul * t + n_v)
    par, tok = random_params(rng, n_k, n_v), random_tokens(rng, n_k, n_v, t)
    args = (n_k, n_v, tok, par, *random_state(rng, n_k, n_v))
    default = gpu_step(*args)
    monkeypatch.setenv(name, value)
    return args, default, gpu_step(*args)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("t", [9, 100])
def test_column_split_equals_whole_head_blocks_bitwise(size, t, monkeypatch):
    """A call of more than 8 rows runs on blocks of 32 state columns (4 per head) and a second launch for the
    gated RMSNorm; OPENJET_GDN_SPLIT=0 keeps one block per head. Same operations per value: the same bits."""
    args, split, whole = default_and_switched(size, t, 57, monkeypatch, "OPENJET_GDN_SPLIT", "0")
    for name, x, y in zip(("y", "conv_state", "state"), split, whole):
        np.testing.assert_array_equal(x, y, err_msg=name)
    check_close(f"{size} t={t} split", split, reference_step(*args), n_k=args[0], n_v=args[1], t=t)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("t", [9, 32, 33, 100, 300])  # one partial chunk, one whole, a whole and one row, ...
def test_chunked_form_matches_reference(size, t, monkeypatch):
    """OPENJET_GDN_CHUNKED=1 (gdn_chunk.cuh): a prefill call's rows in chunks of 32 by the WY form (qwen38.md 3.4)
    against the float64 recurrence: y, the conv state and the state within the recurrent kernel's bound. Its sums
    run in another order, so it differs from the recurrent kernel in the last bits (which shows it ran)."""
    args, recurrent, chunked = default_and_switched(size, t, 91, monkeypatch, "OPENJET_GDN_CHUNKED", "1")
    np.testing.assert_array_equal(chunked[1], recurrent[1], err_msg="conv state: the same operations")
    assert not np.array_equal(chunked[0], recurrent[0]), "the chunked form did not run"
    check_close(f"{size} t={t} chunked", chunked, reference_step(*args), n_k=args[0], n_v=args[1], t=t)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("t", [9, 32, 33, 100, 300])
def test_two_phase_chunked_form_gives_the_one_kernel_forms_bits(size, t, monkeypatch):
    """OPENJET_GDN_CHUNKED=2 (gdn_chunk.cu: every chunk's local work in one launch, then the state steps per chunk
    in a second) runs gdn_chunk_kernel's arithmetic (the same device functions) split in two, so y, the conv state
    and the state equal OPENJET_GDN_CHUNKED=1's bit for bit; the two-phase launch counter shows form 2 ran (not a
    fallback to form 1). The FMA state phase (OPENJET_GDN_STATE_TC=0): the tensor-core one has numerics of its own."""
    monkeypatch.setenv("OPENJET_GDN_STATE_TC", "0")
    monkeypatch.setenv("OPENJET_GDN_CHUNKED", "1")
    before = kt.launch_count("gdn_two_phase")
    args, one, two = default_and_switched(size, t, 91, monkeypatch, "OPENJET_GDN_CHUNKED", "2")
    assert kt.launch_count("gdn_two_phase") == before + 1, "form 2 did not run (or form 1 counted)"
    for name, x, y in zip(("y", "conv_state", "state"), two, one):
        np.testing.assert_array_equal(x, y, err_msg=name)
    check_close(f"{size} t={t} chunked in two phases", two, reference_step(*args), n_k=args[0], n_v=args[1], t=t)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("t", [1, 9, 32, 33, 100, 300])
def test_two_phase_state_phase_in_3xtf32_matches_reference(size, t, monkeypatch):
    """OPENJET_GDN_STATE_TC=3xtf32: the state phase's products on tensor cores in 3xTF32 (gdn_chunk.cu,
    gdn_chunk_state_tc_kernel<3>): y and the state within the recurrent kernel's bound of the float64 recurrence, the
    conv state (the local phase's) equal to the FMA form's (=0); its launch counter shows it ran, and its sums run in
    another order than the FMA chains (its y differs in the last bits)."""
    monkeypatch.setenv("OPENJET_GDN_CHUNKED", "2")
    monkeypatch.setenv("OPENJET_GDN_STATE_TC", "0")
    a_form_of_its_own("state on tensor cores", size, t, 89, monkeypatch, "OPENJET_GDN_STATE_TC", "3xtf32",
                      "gdn_state_tensor_cores", TOL)


def a_form_of_its_own(label, size, t, seed_mul, monkeypatch, name, value, counted, tol):
    """default_and_switched with `name`=`value` for a form with numerics of its own: its path (`counted`) ran once,
    the conv state (the same conv) equals the form before the switch, y does not (t > 1: its sums ran), and the
    switched result is within `tol` of the float64 recurrence. Returns (reference_step's arguments, the switched result)."""
    before = kt.launch_count(counted)
    args, base, switched = default_and_switched(size, t, seed_mul, monkeypatch, name, value)
    assert kt.launch_count(counted) == before + 1, f"{name}={value}: {counted} did not run"
    np.testing.assert_array_equal(switched[1], base[1], err_msg="conv state: the same conv")
    if t > 1:
        assert not np.array_equal(switched[0], base[0]), f"y: {name}={value} gave the bits of the form before"
    check_close(f"{size} t={t} {label}", switched, reference_step(*args), tol=tol, n_k=args[0], n_v=args[1], t=t)
    return args, switched


TF32_TOL = 5e-3  # one tf32 rounding per operand (2^-11 relative) through 128-term sums and the chunks' state


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("t", [1, 9, 33, 300])
def test_the_state_phase_in_one_tf32_pass_stays_near_the_reference(size, t, monkeypatch):
    """The default state phase (OPENJET_GDN_STATE_TC unset, 1 or tf32; numerics of its own): each product one tf32
    mma instead of 3xTF32 (gdn_chunk_state_tc_kernel<1>). y and the state within TF32_TOL of the float64 recurrence
    (H200, 2026-12-03: 2.3e-4 .. 4.4e-4; 3xTF32 stays within 1e-5), the conv state (the local phase's) unchanged, the
    tensor-core kernel's launch counted, y not 3xTF32's bits (the single pass ran), and `tf32` the default's bits."""
    monkeypatch.setenv("OPENJET_GDN_CHUNKED", "2")
    monkeypatch.setenv("OPENJET_GDN_STATE_TC", "3xtf32")
    before = kt.launch_count("gdn_state_tensor_cores")
    args, tc3, tc1 = default_and_switched(size, t, 83, monkeypatch, "OPENJET_GDN_STATE_TC", "tf32")
    monkeypatch.delenv("OPENJET_GDN_STATE_TC")
    default = gpu_step(*args)
    assert kt.launch_count("gdn_state_tensor_cores") == before + 3
    for name, x, y in zip(("y", "conv_state", "state"), default, tc1):
        np.testing.assert_array_equal(x, y, err_msg=f"the default is tf32: {name}")
    np.testing.assert_array_equal(tc1[1], tc3[1], err_msg="conv state: the same local phase")
    if t > 1:
        assert not np.array_equal(tc1[0], tc3[0]), "y: 3xTF32's bits"
    check_close(f"{size} t={t} state phase in one tf32 pass", tc1, reference_step(*args), tol=TF32_TOL,
                n_k=args[0], n_v=args[1], t=t)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("t", [1, 9, 32, 33, 100, 300, 1000])
def test_the_state_phase_on_rounded_operands_keeps_every_bit(size, t, monkeypatch):
    """The default tf32 state phase (gdn_chunk_state_tf32_kernel: q, k, W and Aq rounded to tf32 once by the local
    phase, S and V' once per chunk, fragments by ldmatrix) issues OPENJET_GDN_STATE_TC=tf32-cvt's products
    (gdn_chunk_state_tc_kernel<1>, which rounds each fragment element as it loads it) in the same order on the same
    tf32 values, so y, the conv state and the state are equal bit for bit; the launch counters show that the rounded
    form ran for the default and not for tf32-cvt (whose products a warp takes in another tiling: 8 warps of one
    tile against 4 of two)."""
    monkeypatch.setenv("OPENJET_GDN_CHUNKED", "2")
    monkeypatch.delenv("OPENJET_GDN_STATE_TC", raising=False)
    monkeypatch.setenv("OPENJET_GDN_LOCAL_TC", "0")  # tf32-cvt's local phase: A and Aq by FMA
    rounded_before, tc_before = kt.launch_count("gdn_state_rounded"), kt.launch_count("gdn_state_tensor_cores")
    args, rounded, cvt = default_and_switched(size, t, 79, monkeypatch, "OPENJET_GDN_STATE_TC", "tf32-cvt")
    assert kt.launch_count("gdn_state_rounded") == rounded_before + 1, "the rounded form ran for the default only"
    assert kt.launch_count("gdn_state_tensor_cores") == tc_before + 2, "both calls' state phases on tensor cores"
    for name, x, y in zip(("y", "conv_state", "state"), rounded, cvt):
        np.testing.assert_array_equal(x, y, err_msg=name)
    check_close(f"{size} t={t} state phase on rounded operands", rounded, reference_step(*args), tol=TF32_TOL,
                n_k=args[0], n_v=args[1], t=t)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("t", [1, 9, 33, 300, 1000])
def test_the_local_phase_on_tensor_cores_stays_near_the_reference(size, t, monkeypatch):
    """The default local phase (OPENJET_GDN_LOCAL_TC unset or 1 since 2026-12-04; gdn_chunk.cu chunk_decays_tc): A =
    K K^T and Aq = Q K^T as single tf32 tensor-core passes, numerics of their own (emulate_gdn_tf32.py: 4.8e-4 of the
    float64 recurrence against the FMA products' 4.2e-4; the H200: 2.8e-4 .. 1.1e-3). Against OPENJET_GDN_LOCAL_TC=0
    (the FMA products): y and the state within TF32_TOL of the float64 recurrence, the conv state (the same conv)
    equal, its launch counted once, y not the FMA form's bits (the products changed); unset gives 1's bits."""
    monkeypatch.setenv("OPENJET_GDN_CHUNKED", "2")
    monkeypatch.delenv("OPENJET_GDN_STATE_TC", raising=False)
    monkeypatch.setenv("OPENJET_GDN_LOCAL_TC", "0")
    args, tc = a_form_of_its_own("local phase on tensor cores", size, t, 73, monkeypatch, "OPENJET_GDN_LOCAL_TC", "1",
                                 "gdn_local_tensor_cores", TF32_TOL)
    monkeypatch.delenv("OPENJET_GDN_LOCAL_TC")
    for name, x, y in zip(("y", "conv_state", "state"), gpu_step(*args), tc):
        np.testing.assert_array_equal(x, y, err_msg=f"{name}: the default is the tensor-core local phase")


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("t", [1, 9, 300])
def test_the_bounded_pack_is_the_gated_norms_values_under_the_row_scales(size, t, monkeypatch):
    """launch_gdn_step's bounded pack (OPENJET_GDN_PACK_BOUND's kernel, gdn_gated_pack_bounded_kernel: a warp a token
    and head): for row scales a bound would give (here the pack's own scale for the row's maximum divided by 2^0 ..
    2^12, powers of two), the pack is numpy's pack of the default step's y under those scales bit for bit: every fp16
    value (subnormals included) in the pack's element order, every 32-block's sum as two fp16, and 1 / s."""
    from test_gpu_gemv import pack_scaled_numpy

    monkeypatch.setenv("OPENJET_GDN_CHUNKED", "2")
    n_k, n_v = SIZES[size]
    rng = np.random.default_rng(101 * t + n_v)
    par, tok = random_params(rng, n_k, n_v), random_tokens(rng, n_k, n_v, t)
    conv_state, state = random_state(rng, n_k, n_v)
    y = gpu_step(n_k, n_v, tok, par, conv_state, state)[0]
    amax = np.abs(y).max(axis=1)
    s = np.ldexp(np.float32(1), 14 - np.frexp(amax)[1] - rng.integers(0, 13, t)).astype(np.float32)
    before = kt.launch_count("gdn_pack_bounded")
    h, sums, inv = kg.gdn_step_bounded_pack(n_k, n_v, tok["qkv"], tok["z"], tok["b"], tok["alpha"], par["conv_w"],
                                            conv_state, par["ssm_a"], par["dt_bias"], par["norm_w"], state, s, EPS)
    assert kt.launch_count("gdn_pack_bounded") == before + 1, "the bounded pack did not run"
    want_h, want_sums, want_inv = pack_scaled_numpy(y, s)
    np.testing.assert_array_equal(h, want_h)
    np.testing.assert_array_equal(sums, want_sums)
    np.testing.assert_array_equal(inv, want_inv)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("t", [1, 5])
def test_two_phase_form_takes_a_call_of_a_few_rows(size, t, monkeypatch):
    """Form 2 (the engine's prefill default) takes every prefill call, 8 rows or fewer too (a chunk's bits must not
    depend on its call's length; form 1 leaves such calls to the recurrence): its launch counted, within the
    recurrent kernel's bound of the float64 recurrence with the state phase in 3xTF32, and within TF32_TOL with the
    default's one tf32 pass."""
    monkeypatch.setenv("OPENJET_GDN_STATE_TC", "3xtf32")
    before = kt.launch_count("gdn_two_phase")
    args, recurrent, two = default_and_switched(size, t, 97, monkeypatch, "OPENJET_GDN_CHUNKED", "2")
    assert kt.launch_count("gdn_two_phase") == before + 1, "form 2 did not run"
    np.testing.assert_array_equal(two[1], recurrent[1], err_msg="conv state: the same operations")
    check_close(f"{size} t={t} two phases", two, reference_step(*args), n_k=args[0], n_v=args[1], t=t)
    monkeypatch.delenv("OPENJET_GDN_STATE_TC")
    check_close(f"{size} t={t} two phases, one tf32 pass", gpu_step(*args), reference_step(*args), tol=TF32_TOL,
                n_k=args[0], n_v=args[1], t=t)


def test_value_heads_read_key_heads_tiled_not_grouped():
    n_k, n_v = SIZES["tiny"]
    rng = np.random.default_rng(5)
    par, tok = random_params(rng, n_k, n_v), random_tokens(rng, n_k, n_v, 4)
    cs, s = random_state(rng, n_k, n_v)
    y, _, s_new = gpu_step(n_k, n_v, tok, par, cs, s)
    y_tiled, _, s_tiled = reference_step(n_k, n_v, tok, par, cs, s, pairing="tiled")
    y_grouped, _, s_grouped = reference_step(n_k, n_v, tok, par, cs, s, pairing="grouped")
    e_t, e_g = err(y, y_tiled), err(y, y_grouped)
    report(test="gdn_pairing", err_vs_tiled=e_t, err_vs_grouped=e_g)
    assert e_t < TOL and err(s_new, s_tiled) < TOL
    assert e_g > 1e-2 and err(s_new, s_grouped) > 1e-2, "the kernel pairs heads as HF (v div r), not GGUF (v mod n_k)"


@pytest.mark.parametrize("t", [1, 3, 8])
def test_tiny_step_matches_gdn_mixer_itself(t):
    """gdn_mixer with identity projections: a = [qkv ‖ z ‖ b ‖ alpha], w_in = I, w_out = I (exact in fp32)."""
    n_k, n_v = SIZES["tiny"]
    rng = np.random.default_rng(9 + t)
    par, tok = random_params(rng, n_k, n_v), random_tokens(rng, n_k, n_v, t)
    cs, s = random_state(rng, n_k, n_v)
    a = np.concatenate([tok["qkv"], tok["z"], tok["b"], tok["alpha"]], axis=1)
    d_inner = n_v * D
    w = GDNWeights(norm=np.ones(a.shape[1], np.float32), w_in=np.eye(a.shape[1], dtype=np.float32),
                   conv=np.ascontiguousarray(par["conv_w"].T), dt_bias=par["dt_bias"], ssm_a=par["ssm_a"],
                   ssm_norm=par["norm_w"], w_out=np.eye(d_inner, dtype=np.float32))
    shape = PRESETS["tiny"]
    assert (shape.ssm_n_k_heads, shape.ssm_n_v_heads, shape.ssm_head_dim) == (n_k, n_v, D)
    ref_cs, ref_s = cs.copy(), s.copy()
    ref_y = gdn_mixer(w, shape, a, ref_cs, ref_s, chunk_size=None)
    y, got_cs, got_s = gpu_step(n_k, n_v, tok, par, cs, s)
    e = {"y": err(y, ref_y), "conv_state": err(got_cs, ref_cs), "state": err(got_s, ref_s)}
    report(test="gdn_vs_gdn_mixer_fp32", t=t, **e)
    assert max(e.values()) < TOL, e


def test_edge_values_softplus_threshold_saturated_beta_zero_heads():
    n_k, n_v = SIZES["27B"]
    rng = np.random.default_rng(11)
    par, tok = random_params(rng, n_k, n_v), random_tokens(rng, n_k, n_v, 4)
    cs, s = random_state(rng, n_k, n_v)
    tok["alpha"][:, 0] = 30.0      # softplus above its threshold 20: the identity, decay e^(30 a) ~ 0
    tok["alpha"][:, 1] = 19.9      # just below it
    tok["b"][:, 2] = -100.0        # β = 0: S only decays
    tok["b"][:, 3] = 100.0         # β = 1
    tok["qkv"][:, 2 * D:3 * D] = 0.0   # key head 2's q all zero (conv state too): l2n(0) = 0, so o = 0, y = 0
    cs[:, 2 * D:3 * D] = 0.0
    got = gpu_step(n_k, n_v, tok, par, cs, s)
    check_close("27B edge values", got, reference_step(n_k, n_v, tok, par, cs, s), n_k=n_k, n_v=n_v, t=4)
    assert not got[0].reshape(4, n_v, D)[:, 2].any()


def test_invalid_shapes_raise():
    rng = np.random.default_rng(0)
    n_k, n_v = SIZES["tiny"]
    par, tok = random_params(rng, n_k, n_v), random_tokens(rng, n_k, n_v, 8193)
    cs, s = random_state(rng, n_k, n_v)
    with pytest.raises(OpenJetError, match="t = 8193"):
        gpu_step(n_k, n_v, tok, par, cs, s)
    with pytest.raises(OpenJetError, match="multiple of n_k"):
        kg.bench_gdn(4, 6, 1, 1, 1, 1)
