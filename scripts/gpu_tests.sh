#!/usr/bin/env bash
# One device call: build the engine for this GPU, run the GPU tests and the GEMV benchmark, results in $OUT.
#   run(carry=[".whl"], command="bash scripts/gpu_tests.sh")      # GPU_TESTS_BENCH=0 bash ...: the tests alone
# .whl/ holds the wheels the bare GPU image lacks: scripts/fetch_device_wheels.sh downloads them.
set -o pipefail
. scripts/device_common.sh
device_wheels
build_engine /tmp/b "$OUT/build.log" -DOPENJET_PTXAS_VERBOSE=ON || exit 1
export OPENJET_LIBRARY=/tmp/b/native/libopenjet.so OPENJET_REQUIRE_GPU=1 OPENJET_GPU_REPORT=$OUT/gpu.jsonl
timeout 150 python3 -m pytest -q -m gpu tests/test_gpu_gemv.py -x 2>&1 | tail -25 | tee "$OUT/pytest-gemv.log"
# GPU_TESTS_BENCH=0: no GEMV benchmark, its time to the engine tests (the suite grew past 300 s on 2026-12-04)
ENGINE_S=$([ "${GPU_TESTS_BENCH:-1}" = 0 ] && echo 360 || echo 300)  # with the build and the GEMV tests: < 600 s
timeout "$ENGINE_S" python3 -m pytest -q -m gpu tests/test_gpu_engine.py tests/test_gpu_topk.py tests/test_gpu_gdn.py \
  tests/test_gpu_attn.py tests/test_probe.py 2>&1 | tail -30 | tee "$OUT/pytest-engine.log"
if [ "${GPU_TESTS_BENCH:-1}" != 0 ]; then
  timeout 170 python3 native/bench/bench_gemv.py > "$OUT/gemv.json" 2> "$OUT/gemv.err"; tail -c 1500 "$OUT/gemv.json"
fi
