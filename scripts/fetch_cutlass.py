"""CUTLASS's C++ headers for the dense prefill GEMM of a 90a build (native/src/dense_gemm.cu), from NVIDIA's
nvidia-cutlass wheel on PyPI (BSD-3-Clause; its include/ folder only, never committed).

    python scripts/fetch_cutlass.py                       # -> .cache/cutlass/include, where CMake looks
    python scripts/fetch_cutlass.py --dest build/cutlass  # elsewhere (native/CMakeLists.txt does this itself
                                                          #   under OPENJET_CUTLASS_FETCH=ON: release wheels)
    python scripts/fetch_cutlass.py --trim-to .cache/cutlass-min --build /tmp/b
        # only the headers a finished build's dense_gemm.cu read (ninja's dependency log), ~16 MB instead of 27:
        # what fits the GPU machine's 64 MiB carry beside the tree (OPENJET_CUTLASS_DIR=$PWD/.cache/cutlass-min/include)

A folder is complete or absent: the headers go to DEST.part first and are renamed into place at the end.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VERSION = "4.2.0.0"
PREFIX = "cutlass_library/source/include/"
ROOT = Path(__file__).resolve().parent.parent


def fetch(version: str, dest: Path) -> None:
    if (dest / "VERSION").is_file() and (dest / "VERSION").read_text().strip() == version:
        print(f"CUTLASS {version} already in {dest}/include")
        return
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", tmp,
               f"nvidia-cutlass=={version}"]
        if subprocess.run(cmd).returncode != 0:
            sys.exit(f"fetch_cutlass: `{' '.join(cmd)}` failed (PyPI unreachable?); or name existing headers with "
                     f"OPENJET_CUTLASS_DIR")
        wheel = next(Path(tmp).glob("nvidia_cutlass-*.whl"))
        part = dest.with_name(dest.name + ".part")
        shutil.rmtree(part, ignore_errors=True)
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if n.startswith(PREFIX) and not n.endswith("/")]
            if not names:
                sys.exit(f"fetch_cutlass: {wheel.name} has no {PREFIX}")
            for name in names:
                target = part / "include" / name[len(PREFIX):]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(z.read(name))
            for name in z.namelist():
                if name.endswith("LICENSE.txt"):
                    (part / "LICENSE.txt").write_bytes(z.read(name))
                    break
    (part / "VERSION").write_text(version + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    part.rename(dest)
    print(f"CUTLASS {version} headers in {dest}/include ({len(names)} files)")


def trim(src: Path, dest: Path, build: Path) -> None:
    """Copy the headers under src/include that the build's dense_gemm.cu object read into dest/include."""
    deps = subprocess.run(["ninja", "-C", str(build), "-t", "deps"], check=True, capture_output=True,
                          text=True).stdout
    inc = (src / "include").resolve()
    used = sorted({Path(line.strip()).resolve() for line in deps.splitlines()
                   if line.startswith(" ") and str(inc) in line})
    if not used:
        sys.exit(f"fetch_cutlass: the build in {build} read no header under {inc} (built with CUTLASS?)")
    part = dest.with_name(dest.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    for path in used:
        target = part / "include" / path.relative_to(inc)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    for name in ("LICENSE.txt", "VERSION"):
        if (src / name).is_file():
            shutil.copy2(src / name, part / name)
    shutil.rmtree(dest, ignore_errors=True)
    part.rename(dest)
    print(f"{len(used)} CUTLASS headers in {dest}/include")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", default=VERSION)
    ap.add_argument("--dest", type=Path, default=ROOT / ".cache" / "cutlass")
    ap.add_argument("--trim-to", type=Path, help="copy the headers a build used (--build) to this folder")
    ap.add_argument("--build", type=Path, help="a Ninja build folder of the engine made with CUTLASS")
    a = ap.parse_args()
    if a.trim_to:
        if not a.build:
            ap.error("--trim-to needs --build")
        trim(a.dest, a.trim_to, a.build)
    else:
        fetch(a.version, a.dest)


if __name__ == "__main__":
    main()
