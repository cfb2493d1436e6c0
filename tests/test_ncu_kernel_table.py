"""native/bench/ncu_kernel_table.py, the per-kernel table of an Nsight Compute run (issue 8's per-kernel profile),
against a sample of its real input: the first 7 launches of a 4,096-row prefill chunk of the 27B as ncu printed them
on the H200 (tests/data/ncu_prefill_chunk_sample.csv: its Duration and throughput rows)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from script_module import BENCH, load_script

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "native" / "bench" / "ncu_kernel_table.py"
SAMPLE = ROOT / "tests" / "data" / "ncu_prefill_chunk_sample.csv"


def tool():
    return load_script("ncu_kernel_table", BENCH)


def test_the_sample_chunks_launches_sum_per_kernel():
    t = tool()
    runs = t.launches(SAMPLE.read_text().splitlines())
    # the sample's Duration rows, in ns: embed, add-norm pack, dequant (Q6_K), GEMM, dequant (Q4_K), GEMM, GDN local
    assert [r["duration_ns"] for r in runs] == [61536, 88160, 67584, 588640, 45184, 354784, 531200]
    assert runs[3]["grid"] == "(132, 1, 1)" and runs[6]["dram_pct"] == 22.79 and runs[6]["sm_pct"] == 50.73
    out = t.table(runs)
    assert out["launches"] == 7 and out["total_us"] == pytest.approx(1737.088, abs=0.05)
    rows = {r["kernel"]: r for r in out["kernels"]}
    assert set(rows) == {"cutlass GEMM", "gdn_chunk_local_kernel", "add_norm_pack_kernel<1, 256, 20>",
                         "dequant_f16_kernel<14>", "embed_q4_k_kernel", "dequant_f16_kernel<12>"}
    gemm = rows["cutlass GEMM"]
    assert gemm["launches"] == 2 and gemm["total_us"] == pytest.approx(943.4, abs=0.05)
    assert gemm["mean_us"] == pytest.approx(471.7, abs=0.05)
    assert out["kernels"][0]["kernel"] == "cutlass GEMM"  # longest total first
    assert sum(r["share"] for r in out["kernels"]) == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("name, short", [
    ("void openjet::<unnamed>::dequant_f16_kernel<12>(const unsigned char *, long long, int, int, __half *, bool)",
     "dequant_f16_kernel<12>"),
    ("void unnamed>::swiglu_values_kernel(float *, float *, int, long long)", "swiglu_values_kernel"),
    ("void openjet::<unnamed>::attn_prefill_kernel<openjet::KvF16, 8, 64>(openjet::AttnDecodeArgs)",
     "attn_prefill_kernel<KvF16, 8, 64>"),
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<int>>(T1::Params)", "cutlass GEMM"),
])
def test_kernel_names_lose_their_parameters_and_namespaces(name, short):
    assert tool().short_name(name) == short


def test_input_that_is_not_an_ncu_details_csv_is_a_clear_error(tmp_path):
    bad = tmp_path / "ncu.csv"
    bad.write_text("==PROF== Disconnected from process 1\n")
    run = subprocess.run([sys.executable, str(TOOL), str(bad)], capture_output=True, text=True)
    assert run.returncode != 0 and "no ncu CSV rows" in run.stderr
    rows = [line for line in SAMPLE.read_text().splitlines() if '"Duration"' not in line]
    with pytest.raises(ValueError, match="without a Duration"):
        tool().launches(rows)
