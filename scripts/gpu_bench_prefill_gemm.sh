#!/usr/bin/env bash
# The Hopper prefill GEMM in ONE device call (~3 minutes with the machine's start): the engine built for sm_90a
# with CUTLASS (the dense GEMM, dense_gemm.cu, exists only in such a build), the prefill GEMM's tests for both
# kernels (dense must give the mma kernel's bits), the GEMM benchmark at 2,048 rows on the 27B's shapes
# (bench_prefill_gemm.py), then the engine's prefill tests (long-prompt KL, chunk sizes, the Slot's resumed
# conversation, the dense prefill's own test) with ENGINE_ENV (default OPENJET_PREFILL_GEMM=dense) in force. Results in $OUT: gemm-tests.log, bench-prefill-gemm.json, engine-tests.log,
# gpu-tests.jsonl, build.log.
# Here, once (the device is offline, and the tree plus carry must stay under 64 MiB): python scripts/fetch_cutlass.py,
# a local 90a build into /tmp/b90a, then python scripts/fetch_cutlass.py --trim-to .cache/cutlass-min --build /tmp/b90a.
#   run(carry=[".whl", ".cache/cutlass-min"], command="bash scripts/gpu_bench_prefill_gemm.sh", timeout_s=420)
# (without .cache/cutlass here, CMake finds .cache/cutlass-min by itself)
set -o pipefail
. scripts/device_common.sh
device_wheels || exit 2
OPENJET_DEVICE_ARCH=90a-real build_engine /tmp/b "$OUT/build.log" -DOPENJET_PTXAS_VERBOSE=ON || exit 1
grep -E "CUTLASS" "$OUT/build.log" | head -2
export OPENJET_LIBRARY=/tmp/b/native/libopenjet.so OPENJET_REQUIRE_GPU=1 OPENJET_GPU_REPORT="$OUT/gpu-tests.jsonl"
echo "== the prefill GEMM's tests, both kernels"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_gemv.py -k fast_prefill_gemm \
  > "$OUT/gemm-tests.log" 2>&1
echo "rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/gemm-tests.log" | tail -8
echo "== bench_prefill_gemm.py (2,048 rows)"
timeout 90 python3 native/bench/bench_prefill_gemm.py > "$OUT/bench-prefill-gemm.json"
echo "rc=$?"
ENGINE_ENV=${ENGINE_ENV:-OPENJET_PREFILL_GEMM=dense}
echo "== the engine's prefill tests with $ENGINE_ENV"
# shellcheck disable=SC2086  # ENGINE_ENV is a list of NAME=value words
env $ENGINE_ENV timeout 180 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_engine.py \
  -k "long_prompt or chunk_invariant or servers_slot or prefill_forms or dense_prefill" \
  > "$OUT/engine-tests.log" 2>&1
echo "rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/engine-tests.log" | tail -8
