#!/usr/bin/env bash
# Here, before a device session: the engine for the device's architecture built on this machine into .prebuilt/
# (the library gzipped, its build log with ptxas's register and spill report, and the stamp of the sources it came
# from).
# A device call that carries .prebuilt then skips its build (device_common.sh build_engine) and need not carry
# .cache/cutlass-min: the library holds the dense prefill GEMM. Build again after changing the engine's sources: with
# a stale stamp the device builds, and without CUTLASS's headers (not carried then) it warns that its library lacks
# the dense prefill GEMM.
#   bash scripts/prebuild_device.sh [ARCH]      (90a-real: the H100 / H200 as the release wheels build them)
#   PREBUILD_OPTS="-DNAME=VALUE ..." bash scripts/prebuild_device.sh   (CMake options, for a measurement's build: the
#   device's build_engine must be given the same ones, e.g. gpu_bench_engine.sh's ENGINE_OPTS; a folder of their own)
#   PREBUILD_SRC=.base bash scripts/prebuild_device.sh   (the baseline tree of an A/B call, gpu_pending.sh PLAN=libab:
#   its library into .base/.prebuilt, built with this tree's CUTLASS headers in a folder of its own)
set -eo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. scripts/device_common.sh
if [ -n "${PREBUILD_SRC:-}" ]; then
  cd "$PREBUILD_SRC"
  [ -d "$root/.cache/cutlass/include" ] && export OPENJET_CUTLASS_DIR=${OPENJET_CUTLASS_DIR:-$root/.cache/cutlass/include}
fi
arch=${1:-90a-real}
read -r -a opts <<< "${PREBUILD_OPTS:-}"
build=${PREBUILD_DIR:-/tmp/openjet-prebuild-$arch${PREBUILD_OPTS:+-opts}${PREBUILD_SRC:+-$(basename "$PREBUILD_SRC")}}
stamp=$(engine_stamp "$arch" "${opts[@]}")
echo "building the engine for $arch in $build (stamp $stamp)"
cmake -S . -B "$build" -G Ninja -DOPENJET_CUDA_ARCHITECTURES="$arch" -DOPENJET_PTXAS_VERBOSE=ON "${opts[@]}" > "$build.log" 2>&1 &&
  cmake --build "$build" >> "$build.log" 2>&1 || { tail -30 "$build.log"; exit 1; }
if [ "$arch" = 90a-real ] && ! grep -q "CUTLASS from" "$build.log"; then
  echo "error: no CUTLASS headers for the dense prefill GEMM (run: python3 scripts/fetch_cutlass.py); the device's own"
  echo "build with .cache/cutlass-min would have it, so this library would not stand in for that build"
  exit 1
fi
if [ "$(engine_stamp "$arch" "${opts[@]}")" != "$stamp" ]; then
  echo "error: the engine's sources changed during the build; run it again"; exit 1
fi
rm -rf .prebuilt.new && mkdir .prebuilt.new
gzip -c "$build/native/libopenjet.so" > .prebuilt.new/libopenjet.so.gz  # (~3 MB against ~11: the carry's 64 MiB)
cp "$build.log" .prebuilt.new/build.log
echo "$stamp" > .prebuilt.new/stamp
rm -rf .prebuilt && mv .prebuilt.new .prebuilt
echo "ok: $PWD/.prebuilt ($(du -sh .prebuilt | cut -f1)); carry it with the device call"
