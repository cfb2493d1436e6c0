#!/usr/bin/env bash
# Issue 8's per-kernel profile of a prefill: every kernel of one ROWS-row chunk (default 4,096, one chunk) of the
# `full` synthetic model (the 27B's shapes), each timed by Nsight Compute (SpeedOfLight: duration, DRAM and SM
# throughput; kernels run one at a time, so the sum exceeds the chunk's time in the engine by the launch overlap),
# summed per kernel by native/bench/ncu_kernel_table.py. Results in $OUT: kernels.json (the table), ncu-chunk.csv
# (ncu's rows, ~0.7 MB), the table in the output's tail. The model is written first (~25 s, random codes), the
# library built beside it; ncu then takes ~1-2 minutes for the ~700 launches of a 4,096-row chunk.
#   run(carry=[".whl", ".cache/cutlass-min", ".cache/openjet/llama_cpp_python-0.3.36"], timeout_s=480,
#       command="bash scripts/gpu_profile_prefill.sh")
# ROWS=2048: the chunk the other cards' presets take (OPENJET_PREFILL_GEMM=fast for their GEMM); any OPENJET_*
# switch set in the environment applies to the profiled run. Written 2026-12-03 after the device time ran out: its
# pieces ran (ncu over one_prefill_kernel.py engine, filtered by kernel name, and this table). The script as a whole
# does NOT work yet: its first run (H200, a3220c0) ended with ncu's "Failed to profile add_norm_pack_kernel" (the
# range's first kernel) and no rows, then hung until the 400 s timeout. Since 2026-12-04 (twentieth session, NOT yet
# run: the device time was spent) it runs with OPENJET_PDL=0 unless the environment sets it: kernels launched as
# programmatic dependents are the first suspect (the failing kernel was the range's first, launched with the PDL
# attribute after the load's last kernel). If it still fails: ncu's --launch-skip past the load instead of the range.
# What did run (2026-12-04, twenty-second session, H200): with OPENJET_PDL=0 and without the range, ncu --kernel-name
# regex:"device_kernel|pack|norm|attn|gdn|gemv|f32|swiglu|embed" --launch-count 60 --section SpeedOfLight over
# one_prefill_kernel.py engine MODEL 4096: 60 launches (a GDN layer, an attention layer, their FFNs) in ~70 s with
# the load; their figures are in docs/ENGINE.md's prefill section.
set -o pipefail
. scripts/device_common.sh
device_wheels || exit 2
ROWS=${ROWS:-4096}
export OPENJET_PDL=${OPENJET_PDL:-0}  # see above: PDL launches under ncu (the bits do not depend on it)
MODEL=${MODEL:-/tmp/full-random.gguf}
if [ ! -s "$MODEL" ]; then
  python3 -m openjet_launcher synth --preset full --quiet --codes random "$MODEL" \
    > "$OUT/synth.json" 2> "$OUT/synth.err" &
  SYNTH_PID=$!
fi
ncu_engine  # device_common.sh: the build beside the synth, OPENJET_LIBRARY, NCU
if [ -n "${SYNTH_PID:-}" ] && ! wait "$SYNTH_PID"; then tail -20 "$OUT/synth.err"; exit 1; fi
timeout 400 "$NCU" --clock-control none --profile-from-start off --section SpeedOfLight --csv --page details \
  python3 native/bench/one_prefill_kernel.py engine "$MODEL" "$ROWS" > "$OUT/ncu-chunk.csv" 2> "$OUT/ncu-chunk.err"
echo "ncu rc $?"
python3 native/bench/ncu_kernel_table.py "$OUT/ncu-chunk.csv" > "$OUT/kernels.json"
