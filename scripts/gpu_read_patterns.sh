#!/usr/bin/env bash
# The decode GEMV's weight-read patterns with no arithmetic (native/bench/read_patterns.cu): one JSON line per
# (shape, pattern) in $OUT/read-patterns.jsonl. About 1 minute.
#   run(command="bash scripts/gpu_read_patterns.sh", timeout_s=300)
set -o pipefail
. scripts/device_common.sh
arch=$(gpu_arch)
nvcc -O3 -std=c++17 -arch=sm_$arch -o /tmp/read_patterns native/bench/read_patterns.cu || exit 1
timeout 240 /tmp/read_patterns | tee "$OUT/read-patterns.jsonl"
