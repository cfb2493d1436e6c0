#!/usr/bin/env bash
# CUTLASS's C++ headers (the dense prefill GEMM of a 90a build, native/src/dense_gemm.cu) into .cache/cutlass/include,
# from NVIDIA's nvidia-cutlass wheel on PyPI (BSD-3-Clause; its headers only, nothing of it is committed). The
# build finds them there (native/CMakeLists.txt, OPENJET_CUTLASS_DIR); carry .cache/cutlass to the GPU machine,
# which is offline (27 MB). Usage: bash scripts/fetch_cutlass.sh [version]
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${1:-4.2.0.0}
DEST=.cache/cutlass
if [ -f "$DEST/VERSION" ] && [ "$(cat "$DEST/VERSION")" = "$VERSION" ]; then
  echo "CUTLASS $VERSION already in $DEST/include"; exit 0
fi
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$TMP" "nvidia-cutlass==$VERSION"
rm -rf "$DEST.part" && mkdir -p "$DEST.part"
python3 - "$TMP"/nvidia_cutlass-*.whl "$DEST.part" <<'PY'
import os, sys, zipfile
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if n.startswith(prefix) and not n.endswith("/")]
    if not names:
        sys.exit(f"{sys.argv[1]}: no {prefix} in the wheel")
    for n in names:
        target = f"{sys.argv[2]}/include/{n[len(prefix):]}"
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(n) as src, open(target, "wb") as dst:
            dst.write(src.read())
    lic = [n for n in z.namelist() if n.endswith("LICENSE.txt")]
    if lic:
        with z.open(lic[0]) as src, open(f"{sys.argv[2]}/LICENSE.txt", "wb") as dst:
            dst.write(src.read())
PY
echo "$VERSION" > "$DEST.part/VERSION"
rm -rf "$DEST" && mv "$DEST.part" "$DEST"   # complete or absent, never half
echo "CUTLASS $VERSION headers in $DEST/include ($(du -sh "$DEST" | cut -f1))"
