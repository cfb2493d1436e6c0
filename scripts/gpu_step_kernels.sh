#!/usr/bin/env bash
# Where a decode step's time goes, kernel by kernel, and what the GEMV's hardware counters say (Nsight
# Compute), in ONE device call of ~4 minutes:
#   run(carry=[".whl", ".cache/openjet/llama_cpp_python-0.3.36"], timeout_s=600, command="bash scripts/gpu_step_kernels.sh")
# 1. writes a 4-layer model of the 27B's widths (native/bench/step_kernels.py; ~1.7 GB, random k-quant codes), times decode steps
#    (T = 1 and 4, contexts 0 and 8K; STEP_CFGS) and lists one step's kernels with their durations under ncu:
#    $OUT/step-*.csv, summed per kernel name in the output (the step's wall time minus the kernels' sum is
#    what launches and gaps cost);
# 2. scripts/gpu_ncu_gemv.sh's counters (speed of light, stalls, issue) for the decode GEMV shapes (NCU_GEMV=0:
#    not). E.g. STEP_CFGS="1:0 1:32768 8:32768" PREFILL_KERNELS=512 PREFILL_CTX=16384 NCU_GEMV=0 (a
#    512-token prefill is ~100 kernels; ncu times each once). NCU_CACHE=none: caches kept warm between the
#    kernels as in the step (default all: flushed, so the small kernels' times are upper bounds).
set -o pipefail
. scripts/device_common.sh
device_wheels || exit 2
build_engine /tmp/b "$OUT/build.log" || exit 1
export OPENJET_LIBRARY=/tmp/b/native/libopenjet.so PYTHONUNBUFFERED=1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
python3 native/bench/step_kernels.py --steps 5 --warmup 1 2> "$OUT/synth4.err" || { tail "$OUT/synth4.err"; exit 1; }
# STEP_CFGS: "T:context" decode steps to list (default 1:0 4:0 1:8192); PREFILL_KERNELS=N: also the kernels of
# a prefill of N tokens (label prefill-N-ctxC), after PREFILL_CTX=C tokens already in the sequence (default 0).
for cfg in ${STEP_CFGS:-1:0 4:0 1:8192} ${PREFILL_KERNELS:+prefill:$PREFILL_KERNELS}; do
  IFS=: read -r t ctx <<< "$cfg"
  if [ "$t" = prefill ]; then
    label=prefill-$ctx-ctx${PREFILL_CTX:-0}; args=(--prefill "$ctx" --ctx "${PREFILL_CTX:-0}")
  else
    label=step-t$t-ctx$ctx; args=(--t "$t" --ctx "$ctx")
  fi
  python3 native/bench/step_kernels.py "${args[@]}" > "$OUT/$label.json" 2>> "$OUT/synth4.err"
  echo "== $label $(cat "$OUT/$label.json")"
  [ -n "$NCU" ] || continue
  [ "$t" = prefill ] || args+=(--warmup 2 --steps 3)
  timeout 200 "$NCU" --clock-control none --cache-control "${NCU_CACHE:-all}" --profile-from-start off --metrics gpu__time_duration.sum,launch__grid_size \
    --csv python3 native/bench/step_kernels.py "${args[@]}" > "$OUT/$label.csv" 2> "$OUT/$label.err"
  python3 - "$OUT/$label.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))]
tot = collections.defaultdict(lambda: [0.0, 0]); n = 0; s = 0.0
for r in rows:
    if r.get("Metric Name") != "gpu__time_duration.sum": continue
    v = float(r["Metric Value"].replace(",", "")); unit = r["Metric Unit"]
    us = v / 1000 if unit in ("ns", "nsecond") else v if unit in ("us", "usecond") else v * 1000  # ms
    name = r["Kernel Name"].split("(")[0].split("<")[0].replace("void ", "")
    tot[name][0] += us; tot[name][1] += 1; n += 1; s += us
print(f"  {n} kernels, sum {s/1000:.3f} ms")
for k, (us, c) in sorted(tot.items(), key=lambda x: -x[1][0]):
    print(f"  {us:9.1f} us {c:4d} x  {k}")
PY
done
[ -n "$NCU" ] && [ "${NCU_GEMV:-1}" = 1 ] && bash scripts/gpu_ncu_gemv.sh
