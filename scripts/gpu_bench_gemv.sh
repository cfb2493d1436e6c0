#!/usr/bin/env bash
# One device call: build the engine for this GPU once per variant and run the GEMV benchmark with each.
# A variant is "WARPS-STAGES" (gemv_mma.cuh's build-time knobs); results in $OUT/gemv-<variant>.json.
#   bash scripts/gpu_bench_gemv.sh 4-4 8-4 4-6
set -o pipefail
. scripts/device_common.sh
device_wheels
for v in "${@:-4-4}"; do
  w=${v%-*}; st=${v#*-}; b=/tmp/b-$v
  build_engine "$b" "$OUT/build-$v.log" -DCMAKE_CUDA_FLAGS="-DOPENJET_GEMV_WARPS=$w -DOPENJET_GEMV_STAGES=$st" || exit 1
  OPENJET_LIBRARY=$b/native/libopenjet.so timeout 120 python3 native/bench/bench_gemv.py > "$OUT/gemv-$v.json" 2> "$OUT/gemv-$v.err"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); m=d['decode_step_gemv_mix']; print(sys.argv[2], {t: round(v['us']) for t, v in m['by_t'].items()}, round(m['by_t']['1']['pct_roofline'],1), round(m['t4_over_t1'],3) if 't4_over_t1' in m else round(d.get('t4_over_t1',0),3), [(r['type'], r['name'], round(r['us']['1'],1)) for r in d['results'] if r['name'] in ('17408->5120','5120->248320','5120->1024')])" "$OUT/gemv-$v.json" "$v"
done
