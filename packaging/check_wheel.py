"""Checks a built openjet-launcher wheel before it is released (packaging/build-wheel.sh runs it).

    python packaging/check_wheel.py WHEEL [--max-mb 95] [--archs "86-real;89-real;90a-real;120-real;120-virtual"]

Fails (exit 1, one line per problem) unless:
* the wheel is at most --max-mb megabytes (10**6 bytes);
* it holds the engine library, and the library, loaded from the unpacked wheel through OPENJET_LIBRARY,
  reports through openjet_launcher.engine.probe() exactly the SASS and PTX architectures asked for
  (the probe needs no GPU);
* on Linux, the library needs no CUDA runtime shared library: its NEEDED entries are glibc, libstdc++
  and libgcc_s only; and auditwheel grafted nothing (no *.libs folder, no other shared library);
* the package data the launcher needs at run time is there (the chat template) and nothing from tests/;
* the trained demo model is there with its recorded sha256 (`openjet_launcher/assets/openjet-demo.gguf` and
  `.sha256` beside it, equal to the repository's record when run from a checkout), and no other .gguf file;
* the draft vocabulary of the MTP head is there and well formed (`openjet_launcher/assets/draft-vocab-qwen35.bin`:
  OJDV magic and version 2, size, checksum, its token strings; equal to the checkout's file when run from a
  checkout);
* the license files are in .dist-info/licenses/.
Only the standard library is needed; the probe runs in a child Python (--python, default this one)
that imports the package from the unpacked wheel.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import zipfile
import zlib
from pathlib import Path

DEFAULT_ARCHS = "86-real;89-real;90a-real;120-real;120-virtual"
ENGINE = {"linux": "openjet_launcher/engine/libopenjet.so", "win": "openjet_launcher/engine/openjet.dll"}
RUNTIME_DATA = ["openjet_launcher/model/chat_template.jinja"]
DEMO_MODEL = "openjet_launcher/assets/openjet-demo.gguf"   # the trained demo model (docs/DEMO_MODEL.md)
DEMO_SHA256 = DEMO_MODEL + ".sha256"                         # its sha256, `sha256sum` format
REPO_DEMO_SHA256 = Path(__file__).resolve().parents[1] / DEMO_SHA256   # the record in a checkout, if any
DRAFT_VOCAB = "openjet_launcher/assets/draft-vocab-qwen35.bin"   # openjet_launcher/model/draft_vocab.py
REPO_DRAFT_VOCAB = Path(__file__).resolve().parents[1] / DRAFT_VOCAB
LICENSES = ["LICENSE", "THIRD_PARTY_NOTICES.md", "packaging/licenses/NVIDIA-CUDA-EULA.txt"]
# glibc's parts (libdl, libpthread, librt are separate files before glibc 2.34, as on manylinux_2_28),
# the C++ runtime and the dynamic loader: everything else (libcudart.so above all) is a failure.
ALLOWED_NEEDED = re.compile(r"^(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s)\.so\.\d+$"
                            r"|^ld-linux-x86-64\.so\.2$")


def expected_archs(spec: str) -> tuple[list[int], list[int]]:
    """CMake CUDA_ARCHITECTURES syntax -> (sass, ptx), as native/CMakeLists.txt splits it."""
    sass, ptx = set(), set()
    for item in filter(None, (s.strip() for s in spec.split(";"))):
        m = re.fullmatch(r"(\d+)[af]?(-real|-virtual)?", item)
        if not m:
            raise SystemExit(f"check_wheel: bad architecture {item!r} in {spec!r}")
        if m.group(2) != "-virtual":
            sass.add(int(m.group(1)))
        if m.group(2) != "-real":
            ptx.add(int(m.group(1)))
    return sorted(sass), sorted(ptx)


def needed_libraries(lib: Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(lib)], check=True, capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def probe_build(root: Path, lib: Path, python: str) -> dict:
    """openjet_launcher.engine.probe()['build'] from the unpacked wheel, in a child with no source tree."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import openjet_launcher.engine as e; "
            "p = e.probe(); assert e.library_path().resolve() == __import__('pathlib').Path(sys.argv[2]).resolve(); "
            "print(json.dumps({'build': p.get('build'), 'module': e.__file__}))")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["OPENJET_LIBRARY"] = str(lib)
    r = subprocess.run([python, "-I", "-c", code, str(root), str(lib)], cwd=root, env=env,
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"probe failed (exit {r.returncode}): {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def check_demo_model(z: zipfile.ZipFile, names: list[str]) -> list[str]:
    """The bundled demo model: present, hashing to the sha256 recorded beside it (and in the checkout), alone."""
    problems = []
    others = [n for n in names if n.lower().endswith(".gguf") and n != DEMO_MODEL]
    if others:
        problems.append(f".gguf files other than the demo model in the wheel: {others[:5]}")
    if DEMO_MODEL not in names or DEMO_SHA256 not in names:
        missing = [n for n in (DEMO_MODEL, DEMO_SHA256) if n not in names]
        return problems + [f"the demo model is incomplete in the wheel: {missing} missing"]
    m = re.fullmatch(r"([0-9a-f]{64}) [ *](\S+)\s*", z.read(DEMO_SHA256).decode("utf-8", "replace"))
    if not m or m.group(2) != Path(DEMO_MODEL).name:
        return problems + [f"{DEMO_SHA256} is not one sha256sum line for {Path(DEMO_MODEL).name}"]
    digest = hashlib.sha256()
    with z.open(DEMO_MODEL) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    size = z.getinfo(DEMO_MODEL).file_size
    print(f"demo model: {DEMO_MODEL} ({size / 1e6:.2f} MB unpacked), sha256 {digest.hexdigest()}")
    if digest.hexdigest() != m.group(1):
        problems.append(f"{DEMO_MODEL} has sha256 {digest.hexdigest()}, its record says {m.group(1)}")
    if REPO_DEMO_SHA256.is_file():
        recorded = REPO_DEMO_SHA256.read_text(encoding="utf-8").split()[0]
        if recorded != m.group(1):
            problems.append(f"the wheel's {DEMO_SHA256} ({m.group(1)}) differs from the checkout's ({recorded})")
    return problems


def check_draft_vocab(z: zipfile.ZipFile, names: list[str]) -> list[str]:
    """The MTP head's draft vocabulary: present, an OJDV version-2 file whose length and crc32 match its
    header and whose zlib body holds the count of token strings the header says, NUL-separated, UTF-8, in
    strictly increasing byte order (the format of openjet_launcher/model/draft_vocab.py), and the checkout's
    file when there is one."""
    if DRAFT_VOCAB not in names:
        return [f"the draft vocabulary {DRAFT_VOCAB} is missing from the wheel"]
    data = z.read(DRAFT_VOCAB)
    if len(data) < 6 or data[:4] != b"OJDV":
        return [f"{DRAFT_VOCAB} is not a draft-vocabulary file (magic {data[:4]!r})"]
    (version,) = struct.unpack_from("<H", data, 4)
    if version != 2:
        return [f"{DRAFT_VOCAB} has format version {version}, expected 2"]
    if len(data) < 40:
        return [f"{DRAFT_VOCAB} is truncated or corrupt ({len(data)} bytes, shorter than the header)"]
    count, n_vocab = struct.unpack_from("<II", data, 8)
    (body_len,) = struct.unpack_from("<I", data, 32)
    if len(data) != 40 + body_len or struct.unpack_from("<I", data, len(data) - 4)[0] != zlib.crc32(data[:-4]):
        return [f"{DRAFT_VOCAB} is truncated or corrupt ({len(data)} bytes for a body of {body_len})"]
    try:
        joined = zlib.decompress(data[36:-4])
        raw = joined.split(b"\x00") if joined else []
        for t in raw:
            t.decode("utf-8", "surrogatepass")
    except (zlib.error, UnicodeDecodeError) as e:
        return [f"{DRAFT_VOCAB} is malformed: its body does not decode ({e})"]
    if len(raw) != count or any(not t for t in raw) or any(a >= b for a, b in zip(raw, raw[1:])):
        return [f"{DRAFT_VOCAB} is malformed: {len(raw)} tokens for a header's {count}, or not non-empty "
                f"and in strictly increasing byte order"]
    print(f"draft vocabulary: {DRAFT_VOCAB} ({count} tokens, {len(data)} bytes; built with a vocabulary of "
          f"{n_vocab}, fingerprint {data[16:32].hex()})")
    if REPO_DRAFT_VOCAB.is_file() and REPO_DRAFT_VOCAB.read_bytes() != data:
        return [f"the wheel's {DRAFT_VOCAB} differs from the checkout's"]
    return []


def check(wheel: Path, max_mb: float, archs: str, python: str) -> list[str]:
    problems: list[str] = []
    size = wheel.stat().st_size
    print(f"wheel: {wheel.name}  {size / 1e6:.2f} MB (limit {max_mb:g} MB)")
    if size > max_mb * 1e6:
        problems.append(f"the wheel is {size / 1e6:.2f} MB, over the {max_mb:g} MB limit")

    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        platform = "win" if "win" in wheel.name.split("-")[-1] else "linux"
        engine = ENGINE[platform]
        if engine not in names:
            problems.append(f"no engine library {engine} in the wheel")
        for name in RUNTIME_DATA:
            if name not in names:
                problems.append(f"package data {name} missing")
        problems += check_demo_model(z, names)
        problems += check_draft_vocab(z, names)
        tests = [n for n in names if n.startswith("tests/") or "/tests/" in n or "conftest" in n]
        if tests:
            problems.append(f"files from tests/ in the wheel: {tests[:5]}")
        libs = [n for n in names if n != engine and re.search(r"\.(so(\.\d+)*|dll|pyd)$", n)]
        grafted = [n for n in names if re.match(r"[^/]+\.libs/", n)]
        if libs or grafted:
            problems.append(f"shared libraries other than the engine (grafted?): {sorted(set(libs + grafted))[:8]}")
        dist_info = next((n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")), None)
        for lic in LICENSES:
            if f"{dist_info}/licenses/{lic}" not in names:
                problems.append(f"license file {lic} missing from {dist_info}/licenses/")
        metadata = z.read(f"{dist_info}/METADATA").decode() if dist_info else ""
        for lic in LICENSES:
            if f"License-File: {lic}" not in metadata:
                problems.append(f"METADATA has no License-File: {lic}")
        print(f"files: {len(names)}; engine: {engine} "
              f"({next((i.file_size for i in z.infolist() if i.filename == engine), 0) / 1e6:.2f} MB unpacked)")

        if engine in names and platform == "linux" and sys.platform.startswith("linux"):
            with tempfile.TemporaryDirectory(prefix="openjet-wheel-") as tmp:
                root = Path(tmp)
                z.extractall(root)
                lib = root / engine
                needed = needed_libraries(lib)
                print(f"NEEDED: {', '.join(needed)}")
                bad = [n for n in needed if not ALLOWED_NEEDED.match(n)]
                if bad:
                    problems.append(f"the engine needs shared libraries beyond glibc/libstdc++: {bad}")
                try:
                    got = probe_build(root, lib, python)
                except Exception as e:  # noqa: BLE001 - reported as a problem
                    problems.append(str(e))
                else:
                    build = got["build"] or {}
                    print(f"probe build: {json.dumps(build)} (package from {got['module']})")
                    want_sass, want_ptx = expected_archs(archs)
                    if sorted(build.get("sass", [])) != want_sass or sorted(build.get("ptx", [])) != want_ptx:
                        problems.append(f"the engine reports SASS {build.get('sass')} and PTX {build.get('ptx')}, "
                                        f"expected SASS {want_sass} and PTX {want_ptx} ({archs})")
        elif engine in names:
            print("(library dependencies and probe: checked on Linux only)")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheel", type=Path)
    ap.add_argument("--max-mb", type=float, default=95.0)
    ap.add_argument("--archs", default=os.environ.get("OPENJET_CUDA_ARCHITECTURES") or DEFAULT_ARCHS)
    ap.add_argument("--python", default=sys.executable, help="the Python that runs the probe")
    args = ap.parse_args(argv)
    problems = check(args.wheel, args.max_mb, args.archs, args.python)
    for p in problems:
        print(f"FAIL: {p}", file=sys.stderr)
    print("check_wheel: OK" if not problems else f"check_wheel: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
