#!/usr/bin/env bash
# One device call: build the engine for this GPU, run GPU tests (and the GEMV benchmark if asked), results in $OUT.
#   run(carry=[".whl", ".cache/cutlass-min"], command="bash scripts/gpu_tests.sh")
# or, with the library built here by scripts/prebuild_device.sh (no build on the device; its ptxas report comes back
# as build.log all the same), run(carry=[".whl", ".prebuilt"], ...).
# (.cache/cutlass-min: CUTLASS's trimmed headers, so that the Hopper build has the dense prefill GEMM it ships with and
# its tests run instead of skipping: `python scripts/fetch_cutlass.py`, a 90a build, then `python scripts/fetch_cutlass.py
# --trim-to .cache/cutlass-min --build <that build>`, 16 MB; see device_common.sh build_engine.)
# The suite outgrew one call's 600 s (2026-12-05: 405 engine tests, past 300 s at 3e2051f), so its parts are chosen:
#   GPU_TESTS_GEMV=0   no GEMV tests (tests/test_gpu_gemv.py, ~150 s)
#   GPU_TESTS_ENGINE=0 no engine / top-k / GDN / attention tests
#   GPU_TESTS_BENCH=1  the GEMV benchmark too (~170 s; off by default)
# The engine tests get what the other parts leave of the call's first ~575 s after the build and the wheels (~490 s
# with a build, ~560 with .prebuilt):
# the whole suite is two calls, GPU_TESTS_GEMV=0 first, then the GEMV tests (or gpu_bench_engine.sh with them as
# its WHILE_SYNTH). Each part's whole log comes back ($OUT/pytest-*.full.log: every failure's traceback, the slowest
# tests), its last lines are printed.
# .whl/ holds the wheels the bare GPU image lacks: scripts/fetch_device_wheels.sh downloads them.
set -o pipefail
. scripts/device_common.sh
device_wheels || exit 2
build_engine /tmp/b "$OUT/build.log" -DOPENJET_PTXAS_VERBOSE=ON || exit 1
export OPENJET_LIBRARY=/tmp/b/native/libopenjet.so OPENJET_REQUIRE_GPU=1 OPENJET_GPU_REPORT=$OUT/gpu.jsonl
GEMV=${GPU_TESTS_GEMV:-1} BENCH=${GPU_TESTS_BENCH:-0} ENGINE=${GPU_TESTS_ENGINE:-1}
ENGINE_S=$((575 - SECONDS - (GEMV != 0) * 150 - (BENCH != 0) * 170))
[ "$ENGINE_S" -ge 60 ] || ENGINE_S=60  # (a slow build with every part on: timeout 0 would mean no limit)
# A part's tests under a time limit: the whole log to $OUT/pytest-NAME.full.log, its tail to the output.
part() {
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 -m pytest -q -rfE --durations=25 -m gpu "$@" > "$OUT/pytest-$name.full.log" 2>&1
  local rc=$?
  [ $rc = 124 ] && echo "pytest-$name: stopped at its ${limit} s limit" >> "$OUT/pytest-$name.full.log"
  tail -30 "$OUT/pytest-$name.full.log"
  return $rc
}
[ "$GEMV" = 0 ] || part gemv 150 tests/test_gpu_gemv.py -x
[ "$ENGINE" = 0 ] || part engine "$ENGINE_S" tests/test_gpu_engine.py tests/test_gpu_topk.py tests/test_gpu_gdn.py \
  tests/test_gpu_attn.py tests/test_probe.py
if [ "$BENCH" != 0 ]; then
  timeout 170 python3 native/bench/bench_gemv.py > "$OUT/gemv.json" 2> "$OUT/gemv.err"; tail -c 1500 "$OUT/gemv.json"
fi
