#!/usr/bin/env bash
# One device call: build the engine for this GPU, then run the server's API tests (tests/server) with the
# model-backed servers on the CUDA engine (OPENJET_TEST_ENGINE=cuda: tests/server/conftest.py says what that
# changes and what it skips). Results in $OUT: build.log, pytest-server.log, server-junit.xml.
#   bash scripts/fetch_device_wheels.sh        # here first: .whl/ (fastapi, uvicorn, openai, anthropic, ...)
#   run(carry=[".whl", ".whl-sdk"], command="bash scripts/gpu_server_tests.sh", timeout_s=600)
# OPENJET_REQUIRE_GPU=1: a GPU or engine that cannot run fails the tests instead of skipping them.
set -o pipefail
. scripts/device_common.sh
if ! ls .whl/*.whl .whl-sdk/*.whl >/dev/null 2>&1; then
  echo "no .whl/*.whl or .whl-sdk/*.whl: run scripts/fetch_device_wheels.sh on the developer machine and carry both"
  exit 2
fi
device_wheels || exit 2
export PYTHONUNBUFFERED=1
# Everything tests/server needs but schemathesis (test_fuzz.py skips without it): fail here, not as skips.
python3 -c "import httpx, openai, anthropic, fastapi, uvicorn, gguf, platformdirs, pytest
print('python', __import__('sys').version.split()[0], 'openai', openai.__version__, 'anthropic', anthropic.__version__,
      'fastapi', fastapi.__version__, 'httpx', httpx.__version__)" || exit 1
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.used,memory.total --format=csv,noheader
t0=$SECONDS
build_engine /tmp/b "$OUT/build.log" || exit 1
echo "engine built for sm_$(gpu_arch) in $((SECONDS - t0)) s"
export OPENJET_LIBRARY=/tmp/b/native/libopenjet.so OPENJET_REQUIRE_GPU=1 OPENJET_TEST_ENGINE=cuda
per_test=()
python3 -c "import pytest_timeout" 2>/dev/null && per_test=(--timeout=180)   # one hung test cannot eat the call
timeout 480 python3 -m pytest -q -rs -p no:cacheprovider "${per_test[@]}" --junitxml="$OUT/server-junit.xml" \
  tests/server 2>&1 | tee "$OUT/pytest-server.log" | tail -60
rc=$?
echo "pytest exit status: $rc (124: the 480 s limit)"
exit $rc
