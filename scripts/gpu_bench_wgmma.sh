#!/usr/bin/env bash
# The Hopper prefill GEMM (prefill_gemm.cu, OPENJET_PREFILL_WGMMA=1/2/3) in ONE device call (~2-3 minutes with the
# machine's start): the engine built for sm_90a (the wgmma kernels exist only in a 90a build), the fast GEMM's
# tests for every kernel (bits of modes 2 and 3 against mode 1 included), the GEMM benchmark at 2,048 rows on the
# 27B's shapes (bench_prefill_wgmma.py), then the engine's prefill tests (long-prompt KL, chunk sizes, the Slot's
# resumed conversation) with ENGINE_MODE (default 1) in force. Results in $OUT: gemm-tests.log, bench-wgmma.json,
# engine-tests.log, gpu-tests.jsonl, build.log.
#   run(carry=[".whl"], command="ENGINE_MODE=3 bash scripts/gpu_bench_wgmma.sh", timeout_s=360)
set -o pipefail
. scripts/device_common.sh
device_wheels
OPENJET_DEVICE_ARCH=90a-real build_engine /tmp/b "$OUT/build.log" || exit 1
export OPENJET_LIBRARY=/tmp/b/native/libopenjet.so OPENJET_REQUIRE_GPU=1 OPENJET_GPU_REPORT="$OUT/gpu-tests.jsonl"
echo "== the fast prefill GEMM's tests, every kernel"
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_gemv.py -k fast_prefill_gemm \
  > "$OUT/gemm-tests.log" 2>&1
echo "rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/gemm-tests.log" | tail -8
echo "== bench_prefill_wgmma.py (2,048 rows)"
timeout 60 python3 native/bench/bench_prefill_wgmma.py > "$OUT/bench-wgmma.json"
echo "rc=$?"
echo "== the engine's prefill tests with OPENJET_PREFILL_WGMMA=${ENGINE_MODE:-1}"
OPENJET_PREFILL_WGMMA=${ENGINE_MODE:-1} timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_gpu_engine.py -k "(long_prompt and default) or chunk_invariant or servers_slot or prefill_forms" \
  > "$OUT/engine-tests.log" 2>&1
echo "rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/engine-tests.log" | tail -8
