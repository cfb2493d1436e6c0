#!/usr/bin/env bash
# Where the GEMV's time goes, from the hardware counters (Nsight Compute; it reads them on the Firecracker
# machines, KINDS.md): one launch each of the decode kernel at T=1 and T=8 (Q4_K 17408x5120, the FFN up/gate
# shape; Q6_K the lm_head, 248320x5120) and of both prefill kernels at T=128 and the shared one at T=512, the engine's chunk (Q4_K). Speed of light, memory
# workload, occupancy, warp stall reasons and scheduler statistics per launch, in $OUT/ncu-gemv.csv; the
# headline numbers in the output's tail. About 2 minutes.
#   run(carry=[".whl"], command="bash scripts/gpu_ncu_gemv.sh", timeout_s=400)
set -o pipefail
. scripts/device_common.sh
ncu_setup
sections="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section SchedulerStats"
: > "$OUT/ncu-gemv.csv"
run_one() {  # label env... -- args
  local label=$1; shift
  echo "== $label" | tee -a "$OUT/ncu-gemv.csv"
  env "$@" timeout 120 "$NCU" --clock-control none --kernel-name regex:"gemv_mma_kernel|prefill_mma_kernel" \
    --launch-count 1 $sections --csv --page details python3 native/bench/one_gemv.py $ARGS >> "$OUT/ncu-gemv.csv" 2> "$OUT/ncu-$label.err"
  grep -E '"(Duration|Memory Throughput|DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per Thread|Issue Slots Busy|No Eligible)"' \
    "$OUT/ncu-gemv.csv" | tail -9 | awk -F'","' '{print "  " $(NF-2) " = " $NF " " $(NF-1)}'
}
ARGS="Q4_K 17408 5120 1" run_one decode-q4k-t1 A=1
ARGS="Q4_K 17408 5120 8" run_one decode-q4k-t8 A=1
ARGS="Q6_K 248320 5120 1" run_one lmhead-q6k-t1 A=1
ARGS="Q4_K 17408 5120 128" run_one prefill-grouped-t128 OPENJET_PREFILL_GEMM=grouped
ARGS="Q4_K 17408 5120 128" run_one prefill-shared-t128 OPENJET_PREFILL_GEMM=shared
ARGS="Q4_K 17408 5120 512" run_one prefill-shared-t512 OPENJET_PREFILL_GEMM=shared
