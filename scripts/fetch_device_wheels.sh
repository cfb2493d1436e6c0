#!/usr/bin/env bash
# Downloads (here, where PyPI is reachable) the wheels the offline GPU image lacks into .whl/ (ignored by git),
# for scripts/gpu_tests.sh, gpu_wheel_check.sh and gpu_synth_full.sh: run(carry=[".whl", ...]).
# The image has Python 3.12 with numpy, torch, transformers, tokenizers, jinja2, huggingface_hub, tqdm.
set -euo pipefail
cd "$(dirname "$0")/.."
pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any -d .whl \
  gguf platformdirs nvidia-ml-py fastapi starlette uvicorn pydantic pydantic-core annotated-types \
  typing-inspection annotated-doc opentelemetry-api anyio idna sniffio h11 click
ls .whl
