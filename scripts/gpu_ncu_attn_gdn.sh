#!/usr/bin/env bash
# Where a prefill chunk's mixers spend their time (issue 8), from the hardware counters: the flash attention
# kernel of a 2,048-row chunk after 30,720 cached rows (Q8_0 and F16 caches; attn_prefill.cu) and both kernels of
# the two-phase chunked GDN of a 2,048-row call (gdn_chunk.cu: the local phase, then the state phase as FMA chains,
# OPENJET_GDN_STATE_TC=0, and on tensor cores, the default). Durations, occupancy, warp
# stall reasons per launch in $OUT/ncu-attn-gdn.csv; the headline figures in the output's tail. About 3 minutes with
# the build.
#   run(carry=[".whl", ".cache/cutlass-min"], command="bash scripts/gpu_ncu_attn_gdn.sh", timeout_s=420)
set -o pipefail
. scripts/device_common.sh
ncu_setup
csv="$OUT/ncu-attn-gdn.csv"
: > "$csv"
for kv in Q8_0 F16; do
  ncu_kernel "attn-$kv-30720" attn_prefill_kernel 1 "$csv" -- python3 native/bench/one_prefill_kernel.py attn $kv 30720
done
OPENJET_GDN_STATE_TC=0 ncu_kernel gdn-two-phase "gdn_chunk_local_kernel|gdn_chunk_state_kernel" 2 "$csv" -- \
  python3 native/bench/one_prefill_kernel.py gdn
ncu_kernel gdn-state-tc gdn_chunk_state_tc_kernel 1 "$csv" -- \
  python3 native/bench/one_prefill_kernel.py gdn
