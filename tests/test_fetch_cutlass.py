"""scripts/fetch_cutlass.py: CUTLASS's headers from the nvidia-cutlass wheel (the dense prefill GEMM of a 90a build).
pip is replaced by a fake that writes a small wheel of the same layout, so no network is used: what comes out,
that a finished folder is not fetched again, that a failed download leaves nothing that looks complete, and the
trimmed copy of what a build read (ninja's dependency log, faked)."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest
from script_module import load_script

fc = load_script("fetch_cutlass")

HEADERS = {"cute/tensor.hpp": b"// cute\n", "cutlass/gemm/collective/collective_builder.hpp": b"// builder\n",
           "cutlass/unused.h": b"// not read by the build\n"}


def fake_pip(calls: list, *, fail: bool = False):
    """A subprocess.run stand-in for `pip download`: writes the wheel into the -d folder (or fails)."""
    def run(cmd, *args, **kwargs):
        calls.append(cmd)
        if fail:
            return subprocess.CompletedProcess(cmd, 1)
        dest = Path(cmd[cmd.index("-d") + 1])
        with zipfile.ZipFile(dest / "nvidia_cutlass-9.9.9.9-py3-none-any.whl", "w") as z:
            for name, data in HEADERS.items():
                z.writestr(fc.PREFIX + name, data)
            z.writestr("nvidia_cutlass-9.9.9.9.dist-info/licenses/LICENSE.txt", b"BSD-3-Clause\n")
        return subprocess.CompletedProcess(cmd, 0)
    return run


def test_fetch_unpacks_the_include_folder_and_the_license_once(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(fc.subprocess, "run", fake_pip(calls))
    dest = tmp_path / "cutlass"
    fc.fetch("9.9.9.9", dest)
    for name, data in HEADERS.items():
        assert (dest / "include" / name).read_bytes() == data
    assert (dest / "LICENSE.txt").read_text() == "BSD-3-Clause\n"
    assert (dest / "VERSION").read_text().strip() == "9.9.9.9"
    assert "nvidia-cutlass==9.9.9.9" in calls[0] and "--no-deps" in calls[0]
    assert not (tmp_path / "cutlass.part").exists()
    fc.fetch("9.9.9.9", dest)                      # already there: no second download
    assert len(calls) == 1


def test_a_failed_download_leaves_no_folder_that_looks_complete(tmp_path, monkeypatch):
    monkeypatch.setattr(fc.subprocess, "run", fake_pip([], fail=True))
    dest = tmp_path / "cutlass"
    with pytest.raises(SystemExit, match="OPENJET_CUTLASS_DIR"):
        fc.fetch("9.9.9.9", dest)
    assert not dest.exists()


def test_trim_copies_only_the_headers_the_build_read(tmp_path, monkeypatch):
    monkeypatch.setattr(fc.subprocess, "run", fake_pip([]))
    src = tmp_path / "cutlass"
    fc.fetch("9.9.9.9", src)
    inc = (src / "include").resolve()
    deps = ("native/CMakeLists.txt: #deps 3, deps mtime 1 (VALID)\n"
            f"    {inc / 'cute/tensor.hpp'}\n    {inc / 'cutlass/gemm/collective/collective_builder.hpp'}\n"
            "    /usr/include/stdio.h\n")
    monkeypatch.setattr(fc.subprocess, "run",
                        lambda cmd, *a, **k: subprocess.CompletedProcess(cmd, 0, stdout=deps))
    out = tmp_path / "cutlass-min"
    fc.trim(src, out, tmp_path / "build")
    got = sorted(str(p.relative_to(out / "include")) for p in (out / "include").rglob("*") if p.is_file())
    assert got == ["cute/tensor.hpp", "cutlass/gemm/collective/collective_builder.hpp"]
    assert (out / "VERSION").is_file() and (out / "LICENSE.txt").is_file()
