"""native/bench/trace_step.py's arithmetic (the per-kernel marginal costs of a traced decode step) against intervals
worked out by hand, and its reading of a torch.profiler chrome trace (the kernel events only)."""

from __future__ import annotations

import json

import pytest
from script_module import BENCH, load_script


def tool():
    return load_script("trace_step", BENCH)


def test_marginals_and_idle_add_up_to_the_span():
    t = tool()
    # A [0, 10]; B starts under A (PDL) and ends at 15: adds 5; C after 5 us with nothing running: idle 5, adds 5;
    # D inside C: adds nothing; A again [26, 30] after 1 us idle: adds 4. Given out of order on purpose.
    ks = [("C", 20.0, 5.0), ("A", 0.0, 10.0), ("D", 21.0, 2.0), ("B", 8.0, 7.0), ("A", 26.0, 4.0)]
    r = t.step_costs(ks)
    assert r["span_us"] == 30.0 and r["idle_us"] == 6.0 and r["kernels"] == 5
    assert r["by_name"]["A"] == {"count": 2, "dur_us": 14.0, "marginal_us": 14.0}
    assert r["by_name"]["B"] == {"count": 1, "dur_us": 7.0, "marginal_us": 5.0}
    assert r["by_name"]["C"]["marginal_us"] == 5.0 and r["by_name"]["D"]["marginal_us"] == 0.0
    assert sum(c["marginal_us"] for c in r["by_name"].values()) + r["idle_us"] == r["span_us"]


def test_a_kernel_started_before_an_earlier_one_ended_counts_only_what_it_adds():
    t = tool()
    # B starts at 2 inside A [0, 10] and ends at 12; C starts at 11 (inside B) and ends at 11.5: nothing added.
    r = t.step_costs([("A", 0.0, 10.0), ("B", 2.0, 10.0), ("C", 11.0, 0.5)])
    assert r["by_name"]["B"]["marginal_us"] == 2.0 and r["by_name"]["C"]["marginal_us"] == 0.0
    assert r["idle_us"] == 0.0 and r["span_us"] == 12.0


def test_bad_steps_are_refused_with_a_reason():
    t = tool()
    with pytest.raises(ValueError, match="no kernels"):
        t.step_costs([])
    with pytest.raises(ValueError, match="negative duration"):
        t.step_costs([("A", 0.0, -1.0)])


def test_medians_over_steps_count_a_missing_kernel_as_zero():
    t = tool()
    steps = [t.step_costs(ks) for ks in ([("A", 0.0, 4.0), ("B", 4.0, 2.0)],
                                         [("A", 0.0, 6.0), ("B", 7.0, 2.0)],
                                         [("A", 0.0, 5.0)])]
    m = t.median_costs(steps)
    assert m["span_us"] == 6.0 and m["idle_us"] == 0.0
    assert m["by_name"]["A"] == {"count": 1, "dur_us": 5.0, "marginal_us": 5.0}
    assert m["by_name"]["B"] == {"count": 1, "dur_us": 2.0, "marginal_us": 2.0}  # (medians of 1, 1, 0 and 2, 2, 0)
    assert list(m["by_name"]) == ["A", "B"]  # largest marginal first


def test_the_chrome_trace_gives_its_kernels_with_short_names(tmp_path):
    t = tool()
    trace = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "void openjet::(anonymous namespace)::gemv_tma_kernel<12, 4, 3, false>"
         "(unsigned char const*, int, int)", "ts": 100.5, "dur": 7.25},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "ts": 110.0, "dur": 1.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 90.0, "dur": 2.0},
        {"ph": "X", "cat": "kernel", "name": "openjet::add_norm_pack_cluster_kernel", "ts": 106.0, "dur": 3.0},
    ]}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    assert t.chrome_kernels(str(path)) == [("gemv_tma_kernel<12, 4, 3, false>", 100.5, 7.25),
                                           ("add_norm_pack_cluster_kernel", 106.0, 3.0)]


@pytest.mark.parametrize("argv, says", [
    (["m.gguf", "--drafts", "2"], "needs --ctx 1 or more"),              # a draft reads the token before's hidden row
    (["m.gguf", "--drafts", "8", "--ctx", "4"], "a chain has 0 to 7 drafts"),
    (["m.gguf", "--drafts", "-1", "--ctx", "4"], "a chain has 0 to 7 drafts"),
    (["m.gguf", "--top-k", "33"], "the device's top-k takes 1 to 32"),      # (sampling.GPU_MAX_TOP_K)
    (["m.gguf", "--top-k", "-1"], "the device's top-k takes 1 to 32"),
])
def test_a_run_it_cannot_trace_is_refused_before_any_gpu_work(argv, says, monkeypatch, capsys):
    t = tool()
    monkeypatch.setattr("sys.argv", ["trace_step.py", *argv])
    with pytest.raises(SystemExit) as e:
        t.main()  # (refused before torch is imported or a model is read: neither exists here)
    assert e.value.code == 2 and says in capsys.readouterr().err
