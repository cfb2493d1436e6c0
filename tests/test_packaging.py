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
ARCHS = ["86-real", "89-real", "90-real", "120-real", "120-virtual"]


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
        assert "compress" in env["CUDAFLAGS"]
    assert any("12-9" in step for step in linux["before-all"])
    repair = linux["repair-wheel-command"]
    assert "--exclude libcuda.so.1" in repair and "--exclude libnvidia-ml.so.1" in repair


def test_build_script_uses_the_release_architectures():
    script = (ROOT / "packaging" / "build-wheel.sh").read_text(encoding="utf-8")
    assert ";".join(ARCHS) in script
    for needle in ("--exclude libcuda.so.1", "--exclude libnvidia-ml.so.1", "check_wheel.py", "SHA256SUMS.txt"):
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
