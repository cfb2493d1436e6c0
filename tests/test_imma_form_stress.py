"""native/bench/imma_form_stress.py's verdicts (which form of the integer GEMV gave a wrong output), on made-up
calls whose right and wrong outputs are known: the oracle's tolerance, NaN, the forms' majority."""

from __future__ import annotations

import numpy as np
from script_module import BENCH, load_script


def stress():
    return load_script("imma_form_stress", BENCH)


def test_a_form_off_the_oracle_and_the_majority_is_the_one_counted():
    m = stress()
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((8, 64))
    scale = np.abs(ref) + 1.0
    good = ref.astype(np.float32)
    bad = good.copy()
    bad[3, 17:22] += 27.0  # five rows of one token, as the H100's failures looked
    stats = m.new_stats()
    m.judge({"cp_async_per_tile": good, "cp_async_resident": good.copy(), "producer_warp": bad}, ref, scale, stats)
    assert stats["producer_warp"]["beyond_oracle"] == 1 and stats["producer_warp"]["off_majority"] == 1
    first = stats["producer_warp"]["first_bad"][0]
    assert first["outputs"] == 5 and first["tokens"] == [3] and first["rows"] == [17, 18, 19, 20, 21]
    assert first["tiles"] == [1] and abs(first["max_abs_err"] - 27.0) < 1e-4
    for f in ("cp_async_per_tile", "cp_async_resident"):
        assert stats[f] == {"calls": 1, "beyond_oracle": 0, "off_majority": 0, "first_bad": []}


def test_within_the_tolerance_is_right_and_nan_is_not():
    m = stress()
    ref = np.ones((1, 4))
    scale = np.full((1, 4), 10.0)
    y = np.array([[1 + 0.5 * m.TOL * 10, 1 - 0.9 * m.TOL * 10, np.nan, 1 + 2 * m.TOL * 10]])
    assert [tuple(i) for i in m.bad_outputs(y, ref, scale)] == [(0, 2), (0, 3)]


def test_no_majority_when_every_form_differs():
    m = stress()
    ref = np.zeros((1, 2))
    scale = np.ones((1, 2))
    ys = {f: np.full((1, 2), 1e-7 * (i + 1), np.float32) for i, f in enumerate(m.FORMS)}
    stats = m.new_stats()
    m.judge(ys, ref, scale, stats)
    assert all(s["off_majority"] == 0 and s["beyond_oracle"] == 0 for s in stats.values())


def test_the_fp16_oracle_is_the_packs_values():
    """--family fp16's x is the fp16 GEMV's pack read back: within fp16's half ulp of x under the row's power-of-two
    scale, exactly fp16 values times 1/s."""
    m = stress()
    x = np.random.default_rng(3).standard_normal((2, 512)).astype(np.float32)
    xq = m.fp16_x(x)
    assert xq.shape == x.shape and np.abs(xq - x).max() <= np.abs(x).max() * 2.0 ** -11
    _, _, xinv = m.pack_act_numpy(x)
    scaled = xq / xinv.astype(np.float64)[:, None]
    np.testing.assert_array_equal(scaled, scaled.astype(np.float16).astype(np.float64))
