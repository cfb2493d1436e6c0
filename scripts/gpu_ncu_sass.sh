#!/usr/bin/env bash
# Where a kernel's warps wait, instruction by instruction: Nsight Compute's warp-state sampling (SourceCounters) of
# the decode GEMVs of one T=1 step of the 4-layer model of the 27B's widths (native/bench/step_kernels.py), joined to
# their SASS. Per launch: the stall samples summed by opcode and by reason, and the instructions that hold 90% of them
# (scripts/ncu_sass_summary.py), in $OUT/ncu-sass.txt; the raw source pages in $OUT/ncu-sass.csv.gz. About 3 minutes.
#   run(carry=[".whl", ".cache/cutlass-min", ".cache/openjet/llama_cpp_python-0.3.36"], timeout_s=500,
#       command="REGEX=gemv_tma_kernel SKIP=0 COUNT=4 bash scripts/gpu_ncu_sass.sh")
# REGEX: the kernels' name pattern; SKIP / COUNT: which of its launches in the step (a GDN layer's are in_proj pair,
# ssm_out, gate + up, down); T: token rows of the step; ENV: environment for the step (e.g. OPENJET_GEMV_TMA=0);
# NCU_CACHE (as in gpu_step_kernels.sh): Nsight Compute's --cache-control, `all` (the default: caches flushed before
# each launch, so every read of the activations misses L2) or `none` (they stay warm from the launch before, as in the
# step); SECTIONS: more of Nsight Compute's sections (e.g. MemoryWorkloadAnalysis: the caches' hit rates and
# throughputs, printed with each launch's line).
set -o pipefail
. scripts/device_common.sh
ncu_setup
REGEX=${REGEX:-gemv_tma_kernel} SKIP=${SKIP:-0} COUNT=${COUNT:-4} T=${T:-1}
python3 native/bench/step_kernels.py --t "$T" --warmup 1 --steps 1 > "$OUT/step.json" 2> "$OUT/step.err" ||
  { tail -5 "$OUT/step.err"; exit 1; }  # writes the model once, outside the profiler
env ${ENV:-} timeout 300 "$NCU" --clock-control none --cache-control "${NCU_CACHE:-all}" --profile-from-start off --kernel-name regex:"$REGEX" \
  --launch-skip "$SKIP" --launch-count "$COUNT" --section SourceCounters --section WarpStateStats \
  --section SpeedOfLight ${SECTIONS:+$(printf -- '--section %s ' $SECTIONS)} -o /tmp/sass -f python3 native/bench/step_kernels.py --t "$T" --warmup 1 --steps 1 \
  > "$OUT/ncu-sass.log" 2>&1 || { tail -20 "$OUT/ncu-sass.log"; exit 1; }
"$NCU" --import /tmp/sass.ncu-rep --page source --print-source sass --csv > /tmp/ncu-sass.csv 2> "$OUT/ncu-import.err"
"$NCU" --import /tmp/sass.ncu-rep --page details --csv > /tmp/ncu-details.csv 2>> "$OUT/ncu-import.err"
gzip -c /tmp/ncu-sass.csv > "$OUT/ncu-sass.csv.gz"; gzip -c /tmp/ncu-details.csv > "$OUT/ncu-details.csv.gz"
python3 scripts/ncu_sass_summary.py /tmp/ncu-sass.csv /tmp/ncu-details.csv > "$OUT/ncu-sass.txt"
grep -E "^(launch|==|  [0-9]+ instructions|  by )" "$OUT/ncu-sass.txt"
