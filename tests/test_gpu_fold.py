"""The fold (native/src/gemv_fold.cuh, an experiment): the add-norm pack between two decode GEMVs made by the two GEMVs
themselves, on its declared numerics.

Oracles: launch_gemv's own output for A (gemv tiled: the fold keeps its arithmetic up to y), numpy for the residual
add, the norm weights' product, the tiles' partials and the scale rule, and the pack path: B must equal, bit for bit,
gemv_packed (the engine's GEMV on a given pack) over the pack built here in numpy from the fold's u and partials under
the rule's scale. Then against float64 math: B's output is W_B rmsnorm(h + W_A x) w to the fp16 pack's accuracy.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_report import report
from test_gpu_gemv import pack_layout_numpy

from openjet_launcher.engine import kernels_test as kt
from openjet_launcher.model.quants import dequantize, quantize

pytestmark = pytest.mark.gpu

KA, N, NB = 1024, 5120, 768  # A [N, KA] -> the fold over N (the 27B's hidden size) -> B [NB, N]


def fold_pack_numpy(u: np.ndarray, part: np.ndarray, c: np.ndarray, inv: np.ndarray):
    """The pack B reads in the fold (gemv_fold.cuh): values fp16(fl(u c)), 32-block sums fl(c fl(s_2b + s_2b+1)) as
    the pack's hi / lo halves of S / 32, inverse scale inv; (xh, xsum, xinv) as kernels_test.pack_act returns them."""
    c = c.astype(np.float32)[:, None]
    h = (u * c).astype(np.float32).astype(np.float16)
    s = part[..., 2]
    t32 = ((c * (s[:, 0::2] + s[:, 1::2]).astype(np.float32)).astype(np.float32) / np.float32(32)).astype(np.float32)
    xh, xsum = pack_layout_numpy(h, t32)
    return xh, xsum, inv.astype(np.float32)


@pytest.fixture(scope="module")
def weights():
    """A's and B's weights of each type the fold takes (the 27B's: Q4_K attn_output / gate / up, Q5_K ssm_out, Q6_K
    ffn_down and input projections), made once."""
    if not kt.gemv_tma_available():
        pytest.skip("the fold runs on the producer-warp GEMV: a 90a build on compute capability 9.0")
    made = {}

    def of(qtype: int):
        if qtype not in made:
            rng = np.random.default_rng(61 + qtype)
            made[qtype] = (quantize(rng.standard_normal((N, KA), dtype=np.float32), qtype),
                           quantize(rng.standard_normal((NB, N), dtype=np.float32), qtype))
        return made[qtype]
    return of


def fold_inputs(t: int, seed: int = 100):
    """A's input x [t, KA], the residual stream h [t, N] (rows of unlike scales, a few large channels, as a residual
    stream has) and the norm's weights."""
    rng = np.random.default_rng(seed + t)
    x = rng.standard_normal((t, KA), dtype=np.float32)
    h = (rng.standard_normal((t, N)) * rng.uniform(0.5, 30.0, (t, 1))).astype(np.float32)
    h[:, rng.integers(0, N, 3)] *= 40.0
    return x, h, rng.uniform(0.2, 2.0, N).astype(np.float32)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("t", [1, 5, 8])
def test_the_fold_equals_the_pack_path_on_its_declared_numerics(weights, qtype, t):
    qtype = kt.QTYPES[qtype]
    wa, wb = weights(qtype)
    n = N
    x, h, norm_w = fold_inputs(t)
    eps = 1e-6
    out = kt.gemv_fold(qtype, wa, wb, x, h, norm_w, eps)

    # A's side: launch_gemv's y, then the add, the product and the partials
    ya = kt.gemv(qtype, wa, x, tiled=True)
    hn = (h + ya).astype(np.float32)
    np.testing.assert_array_equal(out["h_out"], hn)
    u = (hn * norm_w).astype(np.float32)
    np.testing.assert_array_equal(out["u"], u)
    part = out["part"]
    np.testing.assert_array_equal(part[..., 1], np.abs(u).reshape(t, n // 16, 16).max(-1))
    np.testing.assert_allclose(part[..., 0], (hn.astype(np.float64) ** 2).reshape(t, n // 16, 16).sum(-1), rtol=2e-6)
    s64 = u.astype(np.float64).reshape(t, n // 16, 16)
    np.testing.assert_allclose(part[..., 2], s64.sum(-1), rtol=0, atol=4e-7 * np.abs(s64).sum(-1).max())

    # B's scales: r within rsqrtf's error of the row's rms scale, the shift the rule's, no value at 2^15
    c, inv = out["scales"][:, 0], out["scales"][:, 1]
    r = (c * inv).astype(np.float32)  # inv is a power of two: exact
    r_ref = 1.0 / np.sqrt((hn.astype(np.float64) ** 2).mean(1) + eps)
    np.testing.assert_allclose(r, r_ref, rtol=2e-6)
    p_max = np.abs(u).max(1)
    bound = ((r * p_max).astype(np.float32) * np.float32(1 + 2.0 ** -10)).astype(np.float32)
    shift = 15 - np.frexp(bound)[1]
    np.testing.assert_array_equal(inv, np.ldexp(np.float32(1), -shift).astype(np.float32))
    vmax = np.abs((u * c[:, None]).astype(np.float32)).max(1)
    assert (vmax < 2.0 ** 15).all() and (vmax >= 2.0 ** 13).all(), vmax

    # B's output: the pack path's GEMV on the pack built here, bit for bit
    xh, xsum, xinv = fold_pack_numpy(u, part, c, inv)
    np.testing.assert_array_equal(out["y"], kt.gemv_packed(qtype, wb, xh, xsum, xinv))

    # ... and what B leaves for the kernels after it: that pack, and the normed rows fl(u r)
    for name, want in (("xh", xh), ("xsum", xsum), ("xinv", xinv)):
        np.testing.assert_array_equal(out[name], want, err_msg=name)
    np.testing.assert_array_equal(out["a"], (u * r[:, None]).astype(np.float32))

    # ... a row's bits the same alone (B's blocks make its pack) as among t rows (launch_fold_pack makes it)
    if t > 1:
        one = kt.gemv_fold(qtype, wa, wb, x[t - 1:], h[t - 1:], norm_w, eps)
        np.testing.assert_array_equal(one["y"][0], out["y"][t - 1])

    # ... and the math it stands for, to the fp16 pack's accuracy
    a = hn.astype(np.float64) * r_ref[:, None] * norm_w
    ref = a @ dequantize(wb, qtype).astype(np.float64).T
    scale = np.abs(a) @ np.abs(dequantize(wb, qtype).astype(np.float64)).T
    err = float(np.abs(out["y"] - ref).max() / np.abs(scale).max())
    report(test="gemv_fold", qtype=int(qtype), t=t, err_vs_f64=err)
    assert err < 2e-4, err



@pytest.mark.parametrize("t", [1, 5])
def test_a_prefills_fold_add_norm_gives_the_bits_the_gemvs_fold_leaves(weights, t):
    """launch_fold_add_norm_pack (a prefill's add-norm where a decode step's is the fold, so that prefill leaves the
    bits decode does) against the fold itself: given A's y as the delta, or the sum already in h, the same h_out, u,
    partials, normed rows and pack as A's epilogue and B leave, bit for bit; and many rows in one call give each row's
    bits alone."""
    qtype = kt.QTYPES["Q4_K"]
    wa, wb = weights(qtype)
    x, h, norm_w = fold_inputs(t)
    eps = 1e-6
    want = kt.gemv_fold(qtype, wa, wb, x, h, norm_w, eps)
    ya = kt.gemv(qtype, wa, x, tiled=True)  # (A's y: the fold's h_out is h + this, test above)
    for delta, h_in in ((ya, h), (None, want["h_out"])):
        got = kt.fold_add_norm_pack(h_in, delta, norm_w, eps)
        for name in ("h_out", "u", "part", "a", "xh", "xsum", "xinv"):
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{name}, delta {delta is not None}")

    rows = 40  # (a prefill chunk's rows: one block a row)
    _, h_many, _ = fold_inputs(rows, seed=7)
    d_many = np.random.default_rng(8).standard_normal((rows, N), dtype=np.float32)
    many = kt.fold_add_norm_pack(h_many, d_many, norm_w, eps)
    for r in (0, 17, rows - 1):
        one = kt.fold_add_norm_pack(h_many[r:r + 1], d_many[r:r + 1], norm_w, eps)
        for name in ("h_out", "u", "part", "a", "xh", "xsum", "xinv"):
            np.testing.assert_array_equal(many[name][r], one[name][0], err_msg=f"{name}, row {r}")


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("t, grid_sms", [(5, 0), (8, 0), (8, 1), (2, 1)])
def test_the_folds_rows_made_by_b_give_the_pack_launchs_bits(weights, qtype, t, grid_sms):
    """OPENJET_FOLD_ROWS (gemv_fold_device.cuh fold_rows_make): at t > 1 B's first t blocks make its rows' pack, the
    others waiting for their count, instead of the fold's pack launch before B. On every type the fold takes, on the
    whole GPU and on one SM's grid (3 or 4 blocks: fewer than 8 rows, so a block makes rows b, b + grid, ...), B's
    output, its rows' scales and what it leaves (the normed rows, the pack) equal the pack launch's, bit for bit, and
    the path ran (launch_count fold_rows)."""
    qtype = kt.QTYPES[qtype]
    wa, wb = weights(qtype)
    x, h, norm_w = fold_inputs(t)
    want = kt.gemv_fold(qtype, wa, wb, x, h, norm_w)
    before = kt.launch_count("fold_rows")
    got = kt.gemv_fold(qtype, wa, wb, x, h, norm_w, rows=True, grid_sms=grid_sms)
    assert kt.launch_count("fold_rows") == before + 1
    assert np.isfinite(want["y"]).all()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    report(test="fold_rows", qtype=int(qtype), t=t, grid_sms=grid_sms)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
@pytest.mark.parametrize("t, grid_sms", [(5, 0), (8, 0), (3, 1)])
def test_a_down_projections_own_swiglu_pack_gives_the_pack_launchs_bits(qtype, t, grid_sms):
    """OPENJET_SWIGLU_ROWS (gemv_fold_device.cuh swiglu_rows_make): at t > 1 the down projection as the fold's A makes
    its input, the swiglu pack of silu(g) u, itself: its first 64 blocks (3 or 4 on one SM's grid, so many 32-blocks a
    warp) meet for the rows' maxima and pack. The pack it read and its fold epilogue's outputs equal those with the
    swiglu pack launch before it, bit for bit (the Q4_K_M's down projections: Q4_K and Q6_K), and the path ran."""
    if not kt.gemv_tma_available():
        pytest.skip("the fold runs on the producer-warp GEMV: a 90a build on compute capability 9.0")
    qtype = kt.QTYPES[qtype]
    n, ka = 1024, 8704  # (half the 27B's 17,408: 272 32-blocks a row)
    rng = np.random.default_rng(71 + t)
    wa = quantize(rng.standard_normal((n, ka), dtype=np.float32), qtype)
    g = (rng.standard_normal((t, ka)) * rng.uniform(0.5, 4.0, (t, 1))).astype(np.float32)
    up = rng.standard_normal((t, ka), dtype=np.float32)
    up[:, rng.integers(0, ka, 3)] *= 50.0  # (a few large channels: the row max lies in one packer's 32-blocks)
    h = rng.standard_normal((t, n), dtype=np.float32)
    norm_w = rng.uniform(0.2, 2.0, n).astype(np.float32)
    want = kt.gemv_swiglu_rows(qtype, wa, g, up, h, norm_w, rows=False)
    before = kt.launch_count("swiglu_rows")
    got = kt.gemv_swiglu_rows(qtype, wa, g, up, h, norm_w, rows=True, grid_sms=grid_sms)
    assert kt.launch_count("swiglu_rows") == before + 1
    assert np.isfinite(want["u"]).all() and np.isfinite(want["part"]).all()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    report(test="swiglu_rows", qtype=int(qtype), t=t, grid_sms=grid_sms)
