"""native/bench/gdn_probe.py's arithmetic (a probed GDN step's record as per-phase times and the blocks' spread)
against records worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest
from script_module import BENCH, load_script


def tool():
    return load_script("gdn_probe", BENCH)


def record(clocks, ns):
    return {"clock": np.array(clocks, np.int64), "ns": np.array(ns, np.uint64), "sm": np.arange(len(clocks))}


def test_phases_are_the_cycles_between_points_at_the_records_own_clock():
    # Two blocks at 2 GHz: each phase of block 0 takes 2,000 cycles (1 us); block 1's "waited" takes 6,000 (3 us)
    # and its other phases 1,000 (0.5 us). Entry at 10,000 and 11,000 ns; the ends follow from the spans.
    c0 = [2000 * i for i in range(12)]
    c1 = [0, 6000] + [6000 + 1000 * i for i in range(1, 11)]
    ns = [[10_000, 10_000 + c0[-1] // 2], [11_000, 11_000 + c1[-1] // 2]]
    r = tool().step_phases(record([c0, c1], ns))
    assert r["sm_ghz"] == pytest.approx(2.0)
    assert list(r["phases"]) == ["waited", "projected", "loaded", "conv", "normed", "kq", "delta", "gated_norm",
                                 "published", "met", "end"]
    assert r["phases"]["waited"] == {"median_us": pytest.approx(2.0), "max_us": pytest.approx(3.0)}
    assert r["phases"]["met"] == {"median_us": pytest.approx(0.75), "max_us": pytest.approx(1.0)}
    # past the wait: block 0 at 10,000 + 1,000 ns, block 1 at 11,000 + 3,000; ends at 21,000 and 19,000 ns
    assert r["spread"] == pytest.approx({"entry_us": 1.0, "waited_us": 3.0, "end_us": 2.0,
                                         "waited_to_last_end_us": 10.0})
    steps = [r, tool().step_phases(record([c0, c0], [ns[0], ns[0]]))]
    m = tool().median_of(steps)
    assert m["phases"]["waited"]["median_us"] == pytest.approx((2.0 + 1.0) / 2)
    assert m["spread"]["entry_us"] == pytest.approx(0.5)


def test_a_record_without_a_probed_launch_is_refused():
    zeros = record([[0] * 12, [0] * 12], [[0, 0], [0, 0]])
    with pytest.raises(ValueError, match="no span"):
        tool().step_phases(zeros)
