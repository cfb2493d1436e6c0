#!/usr/bin/env bash
# llama.cpp as a peer oracle: build llama-cpp-python from its PyPI sdist (CPU only) into a venv OUTSIDE this
# repository, then run tests/test_llama_cpp_peer.py with it (our synthetic `tiny` qwen35 file loads, runs,
# loads its MTP block, and tokenizes like our `tokenizers` BPE). CI does not build it: there the test module
# skips itself. Nothing from llama.cpp is ever copied into or committed to this repository.
#
# Usage: scripts/llama_cpp_peer.sh [VENV_DIR] [PYTEST_ARGS...]
#   VENV_DIR defaults to $LLAMA_CPP_PEER_VENV, else /opt/llamacpp-venv; the version to
#   $LLAMA_CPP_PYTHON_VERSION, else 0.3.36 (the first with qwen35 and MTP that we checked).
# The build compiles llama.cpp with all cores: about 6-14 minutes on a 2-core machine. It runs once; later
# calls reuse the venv while it holds that version.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
VENV=${1:-${LLAMA_CPP_PEER_VENV:-/opt/llamacpp-venv}}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
shift $(( $# > 0 ? 1 : 0 ))

VENV=$(realpath -m "$VENV")
case "$VENV/" in
    "$REPO"/*) echo "llama_cpp_peer.sh: put the venv outside the repository (got $VENV)" >&2; exit 2 ;;
esac

if ! "$VENV/bin/python" -c "import sys, llama_cpp; sys.exit(llama_cpp.__version__ != '$VERSION')" 2>/dev/null; then
    python3 -m venv "$VENV"
    echo "building llama-cpp-python $VERSION from its sdist into $VENV (CPU only; takes minutes)" >&2
    start=$(date +%s)
    # --no-binary: always the PyPI source distribution, compiled here for this CPU; no CUDA.
    CMAKE_ARGS="-DGGML_CUDA=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
        "$VENV/bin/pip" install --no-cache-dir --no-binary llama-cpp-python "llama-cpp-python==$VERSION"
    echo "built in $(( $(date +%s) - start )) s" >&2
fi

# Our package's runtime and test dependencies. The package itself is imported from the source tree
# (PYTHONPATH), so its CUDA library is not built into this venv.
"$VENV/bin/pip" install -q numpy gguf tokenizers tqdm jinja2 pytest

cd "$REPO"
PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
    tests/test_llama_cpp_peer.py "$@"
