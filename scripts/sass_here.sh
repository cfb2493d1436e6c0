#!/usr/bin/env bash
# The SASS of a built object's kernels on this machine (nvcc, no GPU, no cuobjdump): to read where a fence, a wait or
# a load landed without spending device time. cuobjdump and nvdisasm come from NVIDIA's pip wheels
# (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm), unpacked once into .cache/sass-tools (git-ignored, never committed).
#
#   bash scripts/sass_here.sh OBJECT [NAME ...]
#     OBJECT  an object or cubin of a build, e.g. the prebuild's
#             /tmp/openjet-prebuild-90a-real/native/CMakeFiles/openjet.dir/src/gemv_tma.cu.o
#     NAME    print only the functions whose mangled name holds every NAME (e.g. gemv_tma_kernel ILi12ELi4ELi4ELb0ELi0)
# Prints each function's SASS with the encodings dropped. Used 2026-12-07 to place the ring fence's MEMBAR.ALL.CTA
# (NOTES_gemv.md, fifty-first session).
set -euo pipefail
cd "$(dirname "$0")/.."
obj=${1:?usage: bash scripts/sass_here.sh OBJECT [NAME ...]}
shift
[ -f "$obj" ] || { echo "error: no file $obj (build first: bash scripts/prebuild_device.sh)" >&2; exit 2; }
tools=$PWD/.cache/sass-tools
if [ ! -x "$tools/cuobjdump" ] || [ ! -x "$tools/nvdisasm" ]; then
  echo "fetching cuobjdump and nvdisasm from PyPI into $tools" >&2
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 -d "$tmp" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
  for w in "$tmp"/*.whl; do (cd "$tmp" && python3 -m zipfile -e "$w" unpacked); done
  mkdir -p "$tools.part"
  for tool in cuobjdump nvdisasm; do
    found=$(find "$tmp/unpacked" -type f -name "$tool" | head -1)
    [ -n "$found" ] || { echo "error: no $tool in the wheels" >&2; exit 1; }
    install -m 755 "$found" "$tools.part/$tool"
  done
  rm -rf "$tools" && mv "$tools.part" "$tools"  # complete or absent
fi
NVDISASM_PATH=$tools/nvdisasm "$tools/cuobjdump" -sass "$obj" | sed 's|  */\* 0x[0-9a-f]* \*/||' |
  awk -v names="$*" '
    BEGIN { n = split(names, want, " ") }
    /Function :/ { keep = 1; for (i = 1; i <= n; i++) if (index($0, want[i]) == 0) keep = 0 }
    keep && !/^[ \t]*$/'
