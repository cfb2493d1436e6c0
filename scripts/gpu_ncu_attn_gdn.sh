#!/usr/bin/env bash
# Where a prefill chunk's mixers spend their time (issue 8), from the hardware counters, for the default kernels:
# the flash attention of a 2,048-row chunk (one_prefill_kernel.py attn: the first two launches of the kernels named
# attn_prefill*, the warpgroup-MMA flash kernel on the H200) on a Q8_0 cache after N_PAST (0) cached rows, and both kernels of the two-phase chunked GDN of a ROWS-row call
# (4,096; gdn_chunk.cu: the local phase, then the tf32 state phase on rounded operands). Durations, occupancy, warp
# stall reasons per launch in $OUT/ncu-attn-gdn.csv; the headline figures in the output's tail. About 2-3 minutes
# with the build.
#   run(carry=[".whl", ".cache/cutlass-min"], command="bash scripts/gpu_ncu_attn_gdn.sh", timeout_s=420)
set -o pipefail
. scripts/device_common.sh
ncu_setup
csv="$OUT/ncu-attn-gdn.csv"
: > "$csv"
ncu_kernel "attn-Q8_0-${N_PAST:-0}" "attn_prefill" 2 "$csv" -- \
  python3 native/bench/one_prefill_kernel.py attn Q8_0 "${N_PAST:-0}"
ncu_kernel gdn-two-phase "gdn_chunk_local_kernel|gdn_chunk_state" 2 "$csv" -- \
  python3 native/bench/one_prefill_kernel.py gdn "${ROWS:-4096}"
