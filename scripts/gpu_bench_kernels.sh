#!/usr/bin/env bash
# The kernel benchmarks a session runs beside gpu_bench_engine.sh, in ONE device call (~4 minutes with the machine's
# start): the engine built for this GPU, the GDN step (bench_gdn.py: decode rows, and prefill calls of 64 / 512 /
# 2,048 rows by the recurrence and by the chunked WY form), the decode GEMV mix with every shape forced
# (bench_gemv.py --decode-only: 16-row tiles, half tiles) with programmatic dependent launch
# off, since back-to-back copies of one small-grid call share SMs under it, which the engine's step does not
# (NOTES_gemv.md, 2026-12-02), then the server's API tests on the CUDA engine. Results in $OUT: gdn.json,
# gemv-decode-nopdl.json, their .err tables, pytest-server.log, build.log.
#   bash scripts/fetch_device_wheels.sh      # here first
#   run(carry=[".whl", ".whl-sdk"], command="bash scripts/gpu_bench_kernels.sh", timeout_s=420)
set -o pipefail
. scripts/device_common.sh
device_wheels || exit 2
build_engine /tmp/b "$OUT/build.log" -DOPENJET_PTXAS_VERBOSE=ON || exit 1
export OPENJET_LIBRARY=/tmp/b/native/libopenjet.so OPENJET_REQUIRE_GPU=1
echo "== bench_gdn.py"
timeout 100 python3 native/bench/bench_gdn.py > "$OUT/gdn.json" 2> "$OUT/gdn.err"; echo "rc=$?"; tail -14 "$OUT/gdn.err"
echo "== bench_gemv.py --decode-only, OPENJET_PDL=0"
OPENJET_PDL=0 timeout 150 python3 native/bench/bench_gemv.py --decode-only > "$OUT/gemv-decode-nopdl.json" \
  2> "$OUT/gemv-decode-nopdl.err"
echo "rc=$?"; grep -E "tiles forced|T1 default|step mix T=1" "$OUT/gemv-decode-nopdl.err" | head -16
echo "== server tests on the CUDA engine"
OPENJET_TEST_ENGINE=cuda timeout 90 python3 -m pytest -q -rs -p no:cacheprovider tests/server > "$OUT/pytest-server.log" 2>&1
tail -12 "$OUT/pytest-server.log" | grep -E "passed|failed|FAILED|SKIPPED|ERROR" | head -10
