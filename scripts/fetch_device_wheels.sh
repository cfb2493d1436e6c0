#!/usr/bin/env bash
# Downloads (here, where PyPI is reachable) the wheels the offline GPU image lacks, into two ignored folders:
#   .whl/      what the package needs at run time: every device script carries it (run(carry=[".whl", ...]));
#   .whl-sdk/  the SDKs tests/server drives the live server with (openai, anthropic) and what they need beyond
#              .whl/, pinned to versions the tests pass with (httpcore2 must equal httpx2's version): only
#              gpu_server_tests.sh needs them (carry=[".whl", ".whl-sdk"]). Apart, so gpu_wheel_check.sh's
#              carry (tree 28 MB + wheelhouse 28 MB) stays under the device's 64 MiB.
# The image has Python 3.12 with numpy, torch, transformers, tokenizers, jinja2, huggingface_hub, tqdm, and
# httpx, httpcore, certifi, pytest, hypothesis (not schemathesis: tests/server/test_fuzz.py skips there).
set -euo pipefail
cd "$(dirname "$0")/.."
# Afresh (an older version beside a newer one made the device's pip install fail), into new folders swapped in
# only when every download worked: a failed run leaves the previous wheels.
rm -rf .whl.new .whl-sdk.new
get() {
  local dest=$1; shift
  pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any -d "$dest" "$@"
}
get .whl.new gguf platformdirs nvidia-ml-py fastapi starlette uvicorn pydantic pydantic-core annotated-types \
  typing-inspection annotated-doc opentelemetry-api anyio idna sniffio h11 click typing-extensions
get .whl-sdk.new openai==3.57.0 anthropic==2.14.0 httpx2==2.16.2 httpcore2==2.16.2 truststore jiter docstring-parser
rm -rf .whl .whl-sdk
mv .whl.new .whl
mv .whl-sdk.new .whl-sdk
ls .whl .whl-sdk
