#!/usr/bin/env bash
# One device call: build the engine for this GPU once per variant and run the GEMV benchmark with each.
# A variant is "WARPS-STAGES[-MINBLOCKS[-MINBLOCKS_Q6K]]" (gemv_mma.cuh's build-time knobs; one left out keeps
# gemv_mma.cuh's default for the architecture: 4-3 is the default build), or "base": the tree carried in .base/ (scripts/gpu_same_bits.sh says how to make it). Results in $OUT/gemv-<variant>.json.
#   bash scripts/gpu_bench_gemv.sh base 4-4 4-3-5-6
# BENCH_ARGS (e.g. --decode-only) go to native/bench/bench_gemv.py.
set -o pipefail
. scripts/device_common.sh
device_wheels || exit 2
for v in "${@:-4-3}"; do  # the builds side by side (16 cores), then the benchmarks one at a time
  if [ "$v" = base ]; then
    (cd .base && build_engine /tmp/b-base "$OUT/build-base.log") &
  else
    IFS=- read -r w st mb mb6 <<< "$v"
    build_engine "/tmp/b-$v" "$OUT/build-$v.log" -DCMAKE_CUDA_FLAGS="-DOPENJET_GEMV_WARPS=$w -DOPENJET_GEMV_STAGES=$st\
${mb:+ -DOPENJET_GEMV_MIN_BLOCKS=$mb}${mb6:+ -DOPENJET_GEMV_MIN_BLOCKS_Q6K=$mb6}" &
  fi
done
wait
for v in "${@:-4-3}"; do
  b=/tmp/b-$v
  [ -f $b/native/libopenjet.so ] || { echo "$v: build failed"; tail -5 "$OUT/build-$v.log"; continue; }
  grep -o "spill stores[^;]*" "$OUT/build-$v.log" 2>/dev/null | sort | uniq -c | grep -v " 0 bytes" | head -3
  OPENJET_LIBRARY=$b/native/libopenjet.so timeout 150 python3 native/bench/bench_gemv.py ${BENCH_ARGS:-} \
    > "$OUT/gemv-$v.json" 2> "$OUT/gemv-$v.err"
  python3 - "$OUT/gemv-$v.json" "$v" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); m = d["decode_step_gemv_mix"]
print(sys.argv[2], "mix us", {t: round(v["us"]) for t, v in m["by_t"].items()}, "T1 roofline %",
      round(m["by_t"]["1"]["pct_roofline"], 1), "T4/T1", round(m["t4_over_t1"], 3))
print("   T1 us:", [(r["type"], r["name"], round(r["us"]["1"], 1)) for r in d["results"]])
PY
done
