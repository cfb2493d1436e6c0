#!/usr/bin/env bash
# Where the fast prefill GEMM's time goes (prefill_gemm.cu, the default prefill numerics), from the hardware
# counters: one launch each of a 2,048-row chunk's FFN up/gate shape (Q4_K 17408x5120) and its down shape (Q6_K
# 5120x17408). Speed of light, compute workload (tensor-pipe use), memory workload (shared-memory conflicts),
# occupancy, warp stall reasons and scheduler statistics in $OUT/ncu-prefill.csv; the headline numbers in the
# output's tail. About 2 minutes with the machine's start.
#   run(carry=[".whl"], command="bash scripts/gpu_ncu_prefill.sh", timeout_s=300)
set -o pipefail
. scripts/device_common.sh
ncu_setup
# the mma.sync kernel it profiles: on a Hopper build the default prefill is the dense GEMM (dense_gemm.cuh)
export OPENJET_PREFILL_GEMM=fast
sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
  --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats"
: > "$OUT/ncu-prefill.csv"
for shape in "Q4_K 17408 5120 2048" "Q6_K 5120 17408 2048"; do
  echo "== $shape" | tee -a "$OUT/ncu-prefill.csv"
  # shellcheck disable=SC2086  # sections and shape are word lists
  timeout 120 "$NCU" --clock-control none --kernel-name regex:"prefill_gemm_kernel" --launch-count 1 $sections \
    --csv --page details python3 native/bench/one_gemv.py $shape --bench > /tmp/ncu-one.csv 2> "$OUT/ncu-${shape// /-}.err"
  cat /tmp/ncu-one.csv >> "$OUT/ncu-prefill.csv"
  grep -E '"(Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per Thread|Block Limit (Registers|Shared Mem)|Achieved Occupancy|Issue Slots Busy|No Eligible|Eligible Warps Per Scheduler|Active Warps Per Scheduler|Warp Cycles Per Issued Instruction|Shared Memory Bandwidth|Executed Ipc Active)"' \
    /tmp/ncu-one.csv | awk -F'","' '{print "  " $(NF-2) " = " $NF " " $(NF-1)}'
  # the warp stall reasons, per issued instruction (a second pass: raw metrics)
  timeout 100 "$NCU" --clock-control none --kernel-name regex:"prefill_gemm_kernel" --launch-count 1 --csv \
    --page raw --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    python3 native/bench/one_gemv.py $shape --bench > /tmp/ncu-stalls.csv 2>> "$OUT/ncu-${shape// /-}.err"
  cat /tmp/ncu-stalls.csv >> "$OUT/ncu-prefill.csv"
  python3 - /tmp/ncu-stalls.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
head = next((i for i, r in enumerate(rows) if any("stalled" in c for c in r)), None)
if head is None:
    sys.exit("  no stall metrics")
names, vals = rows[head], rows[-1]
pairs = sorted(((float(v), n.replace("smsp__average_warps_issue_stalled_", "").replace("_per_issue_active.ratio", ""))
                for n, v in zip(names, vals) if "stalled" in n and v.replace(".", "", 1).isdigit()), reverse=True)
print("  stalls per issued instruction:", ", ".join(f"{n} {v:.2f}" for v, n in pairs[:8]))
PY
done
