#!/usr/bin/env bash
# The checks a session runs first, in ONE device call (one machine start instead of three): the GPU tests and
# the GEMV benchmark (gpu_tests.sh), the prefill mix of both prefill kernels (bench_gemv.py --prefill-only),
# the server's API tests on the CUDA engine (gpu_server_tests.sh). The device returns at most 8 files, so the
# parts' files come back packed in $OUT/results.tgz beside $OUT/summary.txt (each part's tail).
#   bash scripts/fetch_device_wheels.sh      # here first
#   run(carry=[".whl", ".whl-sdk"], command="bash scripts/gpu_session.sh", timeout_s=600)
# About 6-7 minutes on the H200: tests ~4, prefill bench ~1, server tests ~1.5 (the engine is built once).
set -o pipefail
FINAL=${OUT:-/tmp/out}; mkdir -p "$FINAL"
PARTS=/tmp/session-parts; rm -rf "$PARTS"; mkdir -p "$PARTS"
{
  echo "== gpu_tests.sh"
  OUT=$PARTS/tests timeout 330 bash scripts/gpu_tests.sh > "$PARTS/tests.log" 2>&1; echo "rc=$?"
  cat "$PARTS/tests/pytest-gemv.log" "$PARTS/tests/pytest-engine.log" 2>/dev/null | grep -E "passed|failed|ERROR|no tests ran"
  tail -12 "$PARTS/tests/gemv.err" 2>/dev/null
  echo "== bench_gemv.py --prefill-only"
  OPENJET_LIBRARY=/tmp/b/native/libopenjet.so PYTHONPATH=/tmp/site:$PWD timeout 100 \
    python3 native/bench/bench_gemv.py --prefill-only > "$PARTS/gemv-prefill.json" 2> "$PARTS/gemv-prefill.err"
  echo "rc=$?"; tail -5 "$PARTS/gemv-prefill.err"
  echo "== gpu_server_tests.sh"
  OUT=$PARTS/server timeout 170 bash scripts/gpu_server_tests.sh > "$PARTS/server.log" 2>&1; echo "rc=$?"
  grep -E "passed|failed|SKIPPED|FAILED|Error" "$PARTS/server.log" | tail -12
} 2>&1 | tee "$FINAL/summary.txt"
tar -C "$PARTS" -czf "$FINAL/results.tgz" . && ls -la "$FINAL"
