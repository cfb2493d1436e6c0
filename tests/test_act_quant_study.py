"""native/bench/act_quant_study.py's roundings of a GEMV's activations, against their definitions worked out
independently: the fp16 pack as numpy's float16 where no scaling is needed, block scales' steps and bounds, and
the matrix wrapper that rounds x in x @ W."""

from __future__ import annotations

import numpy as np
import pytest
from script_module import BENCH, load_script


def tool():
    return load_script("act_quant_study", BENCH)


def test_the_fp16_pack_is_float16_rounding_where_the_row_needs_no_scaling():
    rng = np.random.default_rng(0)
    x = rng.uniform(-2.0**15, 2.0**15, (3, 512)).astype(np.float32)
    x[:, 0] = 2.0**14 + 3.0  # max |x| in [2^14, 2^15): c = 1
    assert np.array_equal(tool().fp16_pack(x), x.astype(np.float16).astype(np.float32))


def test_the_fp16_pack_scales_by_a_power_of_two_so_small_rows_keep_their_relative_precision():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((2, 256)) * 1e-3).astype(np.float32)
    got = tool().fp16_pack(x)
    assert np.max(np.abs(got - x) / np.abs(x).max(axis=1, keepdims=True)) <= 2.0**-11
    assert not np.array_equal(got, x.astype(np.float16).astype(np.float32))  # float16 alone: its smallest subnormal


@pytest.mark.parametrize("block, levels", [(256, 32639), (32, 32639), (0, 32639), (32, 127), (0, 127)])
def test_a_block_scale_keeps_each_block_max_and_errs_by_at_most_half_a_step(block, levels):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 1024)).astype(np.float32) * np.array([1.0, 1e-3, 50.0, 1.0], np.float32)[:, None]
    x[3, 256:512] = 0.0  # an all-zero block stays zero
    got = tool().blockwise(x, block, levels)
    b = x.shape[1] if block == 0 else block
    xb, gb = x.reshape(4, -1, b).astype(np.float64), got.reshape(4, -1, b).astype(np.float64)
    amax = np.abs(xb).max(axis=-1)
    step = amax / levels
    # half a step, and the float32 the result is returned in (its rounding matters at 32639 levels)
    assert np.all(np.abs(gb - xb) <= step[..., None] / 2 * (1 + 1e-6) + np.abs(xb) * 2.0**-23 + 1e-30)
    assert np.allclose(np.abs(gb).max(axis=-1), amax, rtol=1e-6)
    if block == 256:
        assert np.all(got[3, 256:512] == 0.0)


def test_the_power_of_two_row_scale_keeps_the_digits_range_and_integer_steps():
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((3, 512)) * np.array([1.0, 3e-4, 700.0])[:, None]).astype(np.float32)
    got = tool().int16_row_pow2(x).astype(np.float64)
    amax = np.abs(x).max(axis=1, keepdims=True).astype(np.float64)
    c = 2.0 ** (13 - np.floor(np.log2(amax)))  # max |x c| in [2^13, 2^14), worked out here
    assert np.all((amax * c >= 2.0**13) & (amax * c < 2.0**14))
    q = got * c
    assert np.array_equal(q, np.rint(q)) and np.abs(q).max() <= 32639  # integers the two int8 digits hold
    assert np.all(np.abs(got - x) <= 0.5 / c + 1e-30)


def test_a_block_that_does_not_divide_k_is_refused():
    with pytest.raises(ValueError, match="multiple"):
        tool().blockwise(np.ones((1, 100), np.float32), 32, 127)


def test_a_wrapped_matrix_rounds_its_input_and_records_the_error():
    t = tool()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    w = rng.standard_normal((64, 7)).astype(np.float32)
    matrix_type = t.rounding_matrix(lambda v: t.blockwise(v, 32, 127))
    got = x @ w.view(matrix_type)
    assert type(got) is np.ndarray
    assert np.array_equal(got, t.blockwise(x, 32, 127) @ w)
    assert len(matrix_type.errors) == 1 and 0.0 < matrix_type.errors[0] < 0.01
    assert t.rounding_matrix(lambda v: v).errors == []  # each scheme's errors its own
