#!/usr/bin/env bash
# The checks a session runs first, in ONE device call (one machine start instead of three): the engine built
# for this GPU, the GPU tests, the prefill mix of both prefill kernels (bench_gemv.py --prefill-only), the
# server's API tests on the CUDA engine. The device returns at most 8 files, so the parts' files come back
# packed in $OUT/results.tgz beside $OUT/summary.txt (each part's result lines).
#   bash scripts/fetch_device_wheels.sh      # here first
#   run(carry=[".whl", ".whl-sdk"], command="bash scripts/gpu_session.sh", timeout_s=600)
# Each part has its own limit, together under 560 s: build 60, GEMV tests 110, engine tests 200 (131 used on
# 2026-12-01), prefill bench 120 (grouped and shared kernels), server tests 70 (the decode GEMV mix is
# gpu_tests.sh's, not run here). SESSION_BENCH=0 leaves the prefill bench out.
set -o pipefail
FINAL=${OUT:-/tmp/out}; mkdir -p "$FINAL"
PARTS=/tmp/session-parts; rm -rf "$PARTS"; mkdir -p "$PARTS"
export OUT=$PARTS
. scripts/device_common.sh
device_wheels || exit 2
{
  echo "== build"
  if ! timeout 60 bash -c ". scripts/device_common.sh; build_engine /tmp/b '$PARTS/build.log' -DOPENJET_PTXAS_VERBOSE=ON"; then
    echo "build failed"; tail -30 "$PARTS/build.log"
  else
    grep -c "0 bytes spill stores" "$PARTS/build.log" | sed 's/^/kernels without spills: /'
    grep "spill stores" "$PARTS/build.log" | grep -v " 0 bytes spill" | head -5
    export OPENJET_LIBRARY=/tmp/b/native/libopenjet.so OPENJET_REQUIRE_GPU=1 OPENJET_GPU_REPORT=$PARTS/gpu.jsonl
    echo "== GEMV and top-k tests"
    timeout 150 python3 -m pytest -q -m gpu tests/test_gpu_gemv.py tests/test_gpu_topk.py > "$PARTS/pytest-kernels.log" 2>&1
    tail -15 "$PARTS/pytest-kernels.log" | grep -E "passed|failed|FAILED|ERROR|Error" | head -12
    echo "== engine, GDN, attention, probe tests"
    timeout 240 python3 -m pytest -q -m gpu tests/test_gpu_engine.py tests/test_gpu_gdn.py tests/test_gpu_attn.py \
      tests/test_probe.py > "$PARTS/pytest-engine.log" 2>&1
    tail -25 "$PARTS/pytest-engine.log" | grep -E "passed|failed|FAILED|ERROR|Error" | head -15
    if [ "${SESSION_BENCH:-1}" != 0 ]; then  # SESSION_BENCH=0: tests only
      echo "== bench_gemv.py --prefill-only"
      timeout 180 python3 native/bench/bench_gemv.py --prefill-only > "$PARTS/gemv-prefill.json" 2> "$PARTS/gemv-prefill.err"
      echo "rc=$?"; tail -4 "$PARTS/gemv-prefill.err"
    fi
    echo "== server tests on the CUDA engine"
    OPENJET_TEST_ENGINE=cuda timeout 70 python3 -m pytest -q -rs -p no:cacheprovider tests/server > "$PARTS/pytest-server.log" 2>&1
    tail -12 "$PARTS/pytest-server.log" | grep -E "passed|failed|FAILED|SKIPPED|ERROR" | head -10
  fi
} 2>&1 | tee "$FINAL/summary.txt"
tar -C "$PARTS" -czf "$FINAL/results.tgz" . && ls -la "$FINAL"
