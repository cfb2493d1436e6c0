#!/usr/bin/env bash
# Builds the engine with plain CMake (no pip) and prints its device probe as JSON on stdout (build log on
# stderr): the first thing to run on a GPU machine.
#   scripts/gpu_probe.sh > probe.json                       # the visible GPU's architecture (H200: 90)
#   OPENJET_CUDA_ARCHITECTURES="86-real;90-real" scripts/gpu_probe.sh
# Architectures: $OPENJET_CUDA_ARCHITECTURES, else the visible GPU (CMake's "native"), else 86.
# Build tree: $OPENJET_BUILD_DIR (default /tmp/openjet-build). Needs nvcc (CUDA 12.8+), CMake 3.24+, python3.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${OPENJET_BUILD_DIR:-/tmp/openjet-build}"

generator=()  # Ninja when available; an existing build tree keeps the generator it was made with
if command -v ninja >/dev/null 2>&1 && [ ! -f "$build/CMakeCache.txt" ]; then
  generator=(-G Ninja)
fi

cmake -S "$repo" -B "$build" ${generator[@]+"${generator[@]}"} -DCMAKE_BUILD_TYPE=Release \
  -DOPENJET_REQUIRE_ENGINE=ON "-DOPENJET_CUDA_ARCHITECTURES=${OPENJET_CUDA_ARCHITECTURES:-}" >&2
cmake --build "$build" --parallel >&2

export OPENJET_LIBRARY="$build/native/libopenjet.so"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m openjet_launcher.engine
