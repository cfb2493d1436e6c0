"""Release packaging (issue 9): checksums file, notices, cibuildwheel config, wheel contents settings.

CPU only and fast: reads files, builds nothing. packaging/build-wheel.sh builds and checks real wheels.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
ARCHS = ["86-real", "89-real", "90a-real", "120-real", "120-virtual"]  # 90a: the dense prefill GEMM


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def sums() -> list[tuple[str, str]]:
    path = ROOT / "SHA256SUMS.txt"
    if not path.is_file():
        pytest.skip("no SHA256SUMS.txt (packaging/build-wheel.sh writes it)")
    return [tuple(line.split("  ", 1)) for line in path.read_text(encoding="utf-8").splitlines()]


def test_sha256sums_format():
    path = ROOT / "SHA256SUMS.txt"
    if not path.is_file():
        pytest.skip("no SHA256SUMS.txt (packaging/build-wheel.sh writes it)")
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines, "SHA256SUMS.txt is empty"
    for line in lines:
        assert re.fullmatch(r"[0-9a-f]{64}  \S+", line), f"not coreutils sha256sum format: {line!r}"
    names = [line.split("  ", 1)[1] for line in lines]
    assert len(names) == len(set(names)), f"duplicate names: {names}"
    assert len({Path(n).name for n in names}) == len(names), f"two artifacts share a file name: {names}"


def test_sha256sums_match_built_artifacts():
    checked = 0
    for digest, name in sums():
        candidates = [ROOT / name] + [ROOT / d / Path(name).name for d in ("wheelhouse", "dist")]
        found = next((p for p in candidates if p.is_file()), None)
        if found is None:
            continue
        assert hashlib.sha256(found.read_bytes()).hexdigest() == digest, f"{found} does not match SHA256SUMS.txt"
        checked += 1
    if not checked:
        pytest.skip("none of the artifacts named in SHA256SUMS.txt is under dist/ or wheelhouse/")


def _notice_names() -> str:
    text = (ROOT / "THIRD_PARTY_NOTICES.md").read_text(encoding="utf-8").lower()
    return " ".join(text.replace("*", "").split())


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_notices_name_every_runtime_and_tray_dependency():
    project = pyproject()["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    reqs += [Requirement(r) for r in project["optional-dependencies"].get("tray", [])]
    text = _normalize(_notice_names())
    missing = [r.name for r in reqs if not re.search(rf"(?<![a-z0-9-]){re.escape(_normalize(r.name))}(?![a-z0-9-])", text)]
    assert not missing, f"THIRD_PARTY_NOTICES.md has no entry for {missing}: add each with its license"


def test_notices_cover_cuda_runtime_and_model_weights():
    text = _notice_names()
    for phrase in ("cuda runtime", "end user license agreement", "attachment a", "statically",
                   "model weights", "the model's license as published by its authors"):
        assert phrase in text, f"THIRD_PARTY_NOTICES.md does not mention {phrase!r}"


def test_license_files_are_declared_and_exist():
    project = pyproject()["project"]
    assert project["license"] == "Apache-2.0"
    patterns = project["license-files"]
    for required in ("LICENSE", "THIRD_PARTY_NOTICES.md"):
        assert required in patterns
    for pattern in patterns:
        assert list(ROOT.glob(pattern)), f"license-files pattern {pattern!r} matches nothing"
    assert "Apache License" in (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Version 2.0, January 2004" in (ROOT / "LICENSE").read_text(encoding="utf-8")


def test_cibuildwheel_config():
    cfg = pyproject()["tool"]["cibuildwheel"]
    assert cfg["build"] == "cp312-*"  # py3-none wheels: one build per platform
    linux = cfg["linux"]
    assert linux["manylinux-x86_64-image"] == "manylinux_2_28"
    for env in (cfg["environment"], linux["environment"]):  # linux's table replaces the global one
        assert env["OPENJET_CUDA_ARCHITECTURES"].split(";") == ARCHS
        assert env["OPENJET_REQUIRE_ENGINE"] == "1"
        assert env["OPENJET_CUTLASS_FETCH"] == "1"  # sm_90a's dense GEMM must not be left out silently
        assert "compress" in env["CUDAFLAGS"]
    assert any("12-9" in step for step in linux["before-all"])
    repair = linux["repair-wheel-command"]
    assert "--exclude libcuda.so.1" in repair and "--exclude libnvidia-ml.so.1" in repair


def test_build_script_uses_the_release_architectures():
    script = (ROOT / "packaging" / "build-wheel.sh").read_text(encoding="utf-8")
    assert ";".join(ARCHS) in script
    for needle in ("--exclude libcuda.so.1", "--exclude libnvidia-ml.so.1", "check_wheel.py", "SHA256SUMS.txt",
                   "OPENJET_CUTLASS_FETCH=1"):
        assert needle in script


def test_wheel_holds_the_package_only():
    """The wheel's contents come from wheel.packages: the import package, never tests/ or scripts."""
    skb = pyproject()["tool"]["scikit-build"]
    wheel = skb["wheel"]  # dotted keys (wheel.packages = ...) parse as a table
    assert wheel["packages"] == ["openjet_launcher"]
    assert wheel["py-api"] == "py3"
    assert not wheel.get("install-dir"), "the package must install at the top of site-packages"
    assert not (ROOT / "openjet_launcher" / "tests").exists()
    # run-time data the launcher reads from the package
    assert (ROOT / "openjet_launcher" / "model" / "chat_template.jinja").is_file()


# --- the trained demo model: the one GGUF in git, the sdist and the wheel (docs/DEMO_MODEL.md) ----------

DEMO = "openjet_launcher/assets/openjet-demo.gguf"


def test_the_demo_model_is_the_only_gguf_the_sdist_lets_through():
    sdist = pyproject()["tool"]["scikit-build"]["sdist"]
    assert "*.gguf" in sdist["exclude"]
    assert [p.lstrip("/") for p in sdist["include"]] == [DEMO]


def test_the_demo_model_and_its_sha256_record_are_in_the_package_tree():
    path = ROOT / DEMO
    if not path.is_file():
        pytest.skip(f"{DEMO} is not in this checkout (serve falls back to the synthetic tiny model)")
    digest, name = (ROOT / (DEMO + ".sha256")).read_text(encoding="utf-8").split()
    assert name == path.name and re.fullmatch(r"[0-9a-f]{64}", digest)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    # check_wheel.py looks for it at the same place in the wheel
    check_wheel = (ROOT / "packaging" / "check_wheel.py").read_text(encoding="utf-8")
    assert f'DEMO_MODEL = "{DEMO}"' in check_wheel


def test_git_tracks_the_demo_model_and_ignores_other_gguf_files():
    import shutil
    import subprocess

    if not shutil.which("git") or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")

    def ignored(rel: str) -> bool:
        r = subprocess.run(["git", "check-ignore", "-q", "--no-index", rel], cwd=ROOT)
        assert r.returncode in (0, 1), f"git check-ignore failed for {rel}"
        return r.returncode == 0
    assert not ignored(DEMO)
    assert ignored("openjet_launcher/assets/other.gguf") and ignored("model.gguf")


def test_scikit_build_core_selects_the_demo_model_for_sdist_and_wheel(monkeypatch):
    """scikit-build-core's own file walk (what build_sdist and the wheel's package copy run) with our settings:
    the demo model and its record are in, no other .gguf."""
    import inspect

    fp = pytest.importorskip("scikit_build_core.build._file_processor")
    skb = pyproject()["tool"]["scikit-build"]
    kw = {"mode": "default"} if "mode" in inspect.signature(fp.each_unignored_file).parameters else {}
    monkeypatch.chdir(ROOT)  # the walk runs from the project root
    for start in (".", "openjet_launcher"):   # the sdist; the package files copied into the wheel
        files = {p.as_posix() for p in fp.each_unignored_file(
            Path(start), include=skb["sdist"]["include"], exclude=skb["sdist"]["exclude"],
            build_dir=skb["build-dir"], **kw)}
        gguf = sorted(f for f in files if f.endswith(".gguf"))
        if (ROOT / DEMO).is_file():
            assert gguf == [DEMO] and DEMO + ".sha256" in files, (start, gguf)
        else:
            assert gguf == [], (start, gguf)


# --- the MTP head's draft vocabulary (issue 7): package data in git, the sdist and the wheel -------------

DRAFT_VOCAB = "openjet_launcher/assets/draft-vocab-qwen35.bin"


def _check_wheel_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_wheel", ROOT / "packaging" / "check_wheel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_draft_vocabulary_is_package_data_that_git_and_scikit_build_core_keep(monkeypatch):
    import inspect
    import shutil
    import subprocess

    assert (ROOT / DRAFT_VOCAB).is_file(), f"{DRAFT_VOCAB} is missing: run scripts/build_draft_vocab.py"
    assert _check_wheel_module().DRAFT_VOCAB == DRAFT_VOCAB
    if shutil.which("git") and (ROOT / ".git").exists():
        r = subprocess.run(["git", "check-ignore", "-q", "--no-index", DRAFT_VOCAB], cwd=ROOT)
        assert r.returncode == 1, f"{DRAFT_VOCAB} is ignored by git"
    fp = pytest.importorskip("scikit_build_core.build._file_processor")
    skb = pyproject()["tool"]["scikit-build"]
    kw = {"mode": "default"} if "mode" in inspect.signature(fp.each_unignored_file).parameters else {}
    monkeypatch.chdir(ROOT)
    for start in (".", "openjet_launcher"):   # the sdist; the package files copied into the wheel
        files = {p.as_posix() for p in fp.each_unignored_file(
            Path(start), include=skb["sdist"]["include"], exclude=skb["sdist"]["exclude"],
            build_dir=skb["build-dir"], **kw)}
        assert DRAFT_VOCAB in files, start


def test_check_wheel_finds_a_missing_truncated_or_corrupt_draft_vocabulary(tmp_path, monkeypatch):
    import struct
    import zipfile
    import zlib

    cw = _check_wheel_module()
    good = (ROOT / DRAFT_VOCAB).read_bytes()

    def problems(data: bytes | None) -> list[str]:
        path = tmp_path / "w.whl"
        with zipfile.ZipFile(path, "w") as z:
            if data is not None:
                z.writestr(DRAFT_VOCAB, data)
        with zipfile.ZipFile(path) as z:
            return cw.check_draft_vocab(z, z.namelist())

    def with_body(body: bytes, count: int | None = None) -> bytes:  # checksum and lengths made right
        head = bytearray(good[:36])
        if count is not None:
            struct.pack_into("<I", head, 8, count)
        struct.pack_into("<I", head, 32, len(body))
        return bytes(head) + body + struct.pack("<I", zlib.crc32(bytes(head) + body))

    assert problems(good) == []
    assert "missing" in problems(None)[0]
    assert "truncated or corrupt" in problems(good[:-8])[0]
    assert "truncated or corrupt" in problems(good[:30])[0]
    flipped = bytearray(good)
    flipped[100] ^= 1
    assert "truncated or corrupt" in problems(bytes(flipped))[0]
    assert "not a draft-vocabulary file" in problems(b"GGUF" + good[4:])[0]
    assert "version 1, expected 2" in problems(good[:4] + b"\x01\x00" + good[6:])[0]
    tokens = zlib.decompress(good[36:-4]).split(b"\x00")
    assert "malformed" in problems(with_body(b"not zlib"))[0]
    assert "malformed" in problems(with_body(zlib.compress(b"\x00".join(tokens)), len(tokens) - 1))[0]
    assert "malformed" in problems(with_body(zlib.compress(b"\x00".join(tokens[::-1]))))[0]
    assert "malformed" in problems(with_body(zlib.compress(b"\x00".join(tokens[:-1] + [b"\xff"]))))[0]
    assert problems(with_body(zlib.compress(b"\x00".join(tokens), 1))) == [  # well formed, other bytes
        f"the wheel's {DRAFT_VOCAB} differs from the checkout's"]
    monkeypatch.setattr(cw, "REPO_DRAFT_VOCAB", tmp_path / "other.bin")
    (tmp_path / "other.bin").write_bytes(good[:-4] + b"\x00\x00\x00\x00")
    assert "differs from the checkout's" in problems(good)[0]
