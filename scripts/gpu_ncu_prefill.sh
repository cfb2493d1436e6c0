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
: > "$OUT/ncu-prefill.csv"
for shape in "Q4_K 17408 5120 2048" "Q6_K 5120 17408 2048"; do
  # shellcheck disable=SC2086  # shape is a word list
  ncu_kernel "${shape// /-}" prefill_gemm_kernel 1 "$OUT/ncu-prefill.csv" -- python3 native/bench/one_gemv.py $shape --bench
done
