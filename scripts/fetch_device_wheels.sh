#!/usr/bin/env bash
# Downloads (here, where PyPI is reachable) the wheels the offline GPU image lacks into .whl/ (ignored by git),
# for scripts/gpu_tests.sh, gpu_server_tests.sh, gpu_wheel_check.sh and gpu_synth_full.sh: run(carry=[".whl", ...]).
# The image has Python 3.12 with numpy, torch, transformers, tokenizers, jinja2, huggingface_hub, tqdm, and
# httpx, httpcore, certifi, pytest, hypothesis (not schemathesis: tests/server/test_fuzz.py skips there).
# The second list: the SDKs tests/server drives the live server with (openai, anthropic) and what they need
# beyond the first list, pinned to versions the tests pass with (httpcore2 must equal httpx2's version).
set -euo pipefail
cd "$(dirname "$0")/.."
pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any -d .whl \
  gguf platformdirs nvidia-ml-py fastapi starlette uvicorn pydantic pydantic-core annotated-types \
  typing-inspection annotated-doc opentelemetry-api anyio idna sniffio h11 click \
  openai==3.57.0 anthropic==2.14.0 httpx2==2.16.2 httpcore2==2.16.2 truststore jiter docstring-parser \
  typing-extensions
ls .whl
