"""The engine library and its probe: how it is found, what it reports, what it was compiled for.

Independent oracles: the architectures are read back from the library's own fatbin (ELF section
.nv_fatbin, and cuobjdump where installed); the JSON writer is compared with Python's json on
hostile strings; the CUDA loader's choice of SASS or PTX is predicted from the compatibility rules.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import openjet_launcher
from openjet_launcher.engine import device_probe, native
from openjet_launcher.errors import OpenJetError

REPO = Path(__file__).resolve().parents[1]


def built_library() -> Path:
    try:
        return native.library_path()
    except OpenJetError as e:
        pytest.skip(str(e).split(": ")[0])  # "The OpenJet GPU engine was not built", or the env var's fault


@pytest.fixture(scope="module")
def report() -> dict:
    built_library()
    return device_probe.probe()


# --- CMake's CUDA_ARCHITECTURES syntax and the fatbin, read independently of the library -------------


def parse_cuda_architectures(text: str) -> tuple[set[int], set[int]]:
    """'86-real;90a-real;120' -> SASS {86, 90, 120}, PTX {120} (CMake: -real = SASS, -virtual = PTX)."""
    sass, ptx = set(), set()
    for entry in filter(None, text.split(";")):
        m = re.fullmatch(r"(\d+)[af]?(-real|-virtual)?", entry)
        assert m, entry
        if m[2] != "-virtual":
            sass.add(int(m[1]))
        if m[2] != "-real":
            ptx.add(int(m[1]))
    return sass, ptx


def elf_section(data: bytes, wanted: str) -> bytes:
    """One section of a little-endian ELF64 file."""
    assert data[:6] == b"\x7fELF\x02\x01", "not a little-endian ELF64 file"
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab_off = headers[shstrndx][4]
    for name_off, _type, _flags, _addr, offset, size in headers:
        start = strtab_off + name_off
        if data[start:data.index(b"\0", start)].decode() == wanted:
            return data[offset:offset + size]
    raise AssertionError(f"no {wanted} section")


def fatbin_architectures(library: Path) -> tuple[set[int], set[int]]:
    """(SASS, PTX) compute capabilities embedded in the library's .nv_fatbin section.

    Layout (as cuobjdump reads it): containers {u32 magic 0xBA55ED50, u16 version, u16 header_size,
    u64 entries_size}, each holding entries {u16 kind (1 PTX, 2 ELF/SASS), u16 version,
    u32 header_size, u64 payload_size, ..., u32 sm_arch at offset 28}.
    """
    blob = elf_section(library.read_bytes(), ".nv_fatbin")
    sass, ptx = set(), set()
    pos = 0
    while pos + 16 <= len(blob):
        magic, _version, header_size, entries_size = struct.unpack_from("<IHHQ", blob, pos)
        if magic != 0xBA55ED50:
            break  # padding after the last container
        entry, end = pos + header_size, pos + header_size + entries_size
        while entry < end:
            kind, _v, entry_header_size, payload_size = struct.unpack_from("<HHIQ", blob, entry)
            (arch,) = struct.unpack_from("<I", blob, entry + 28)
            {1: ptx, 2: sass}[kind].add(arch)
            entry += entry_header_size + payload_size
        pos = (end + 7) & ~7
    return sass, ptx


# --- finding the library ------------------------------------------------------------------------------


def test_without_the_library_loading_says_not_built_and_how_to_build(monkeypatch, tmp_path):
    monkeypatch.delenv(native.ENV_LIBRARY, raising=False)
    monkeypatch.setattr(native, "search_dirs", lambda: [tmp_path])
    with pytest.raises(OpenJetError) as caught:
        native.load_library()
    message = str(caught.value)
    assert "GPU engine was not built" in message
    assert "nvcc" in message and "12.8" in message
    assert "pip install --force-reinstall --no-deps ." in message
    assert native.ENV_LIBRARY in message


def test_openjet_library_naming_a_missing_file_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv(native.ENV_LIBRARY, str(tmp_path / "missing" / native.LIBRARY_NAME))
    with pytest.raises(OpenJetError, match="OPENJET_LIBRARY=.* does not name a file"):
        native.load_library()


def test_a_file_that_is_not_a_library_is_an_error_in_process_and_in_the_child(monkeypatch, tmp_path):
    fake = tmp_path / native.LIBRARY_NAME
    fake.write_bytes(b"not a shared library")
    monkeypatch.setenv(native.ENV_LIBRARY, str(fake))
    with pytest.raises(OpenJetError, match="could not be loaded"):
        native.load_library()
    with pytest.raises(OpenJetError, match="The GPU probe failed: .*could not be loaded"):
        device_probe.probe_in_child()


def test_this_install_either_has_the_engine_or_says_it_was_not_built():
    try:
        lib = native.load_library()
    except OpenJetError as e:
        assert "not built" in str(e) or native.ENV_LIBRARY in str(e)
    else:
        assert lib.openjet_api_version() == native.API_VERSION


# --- the report ---------------------------------------------------------------------------------------


def test_probe_report_has_the_documented_fields(report):
    assert report["api_version"] == native.API_VERSION
    assert report["library_version"] == openjet_launcher.__version__
    for which in ("driver", "runtime"):
        raw = report[f"{which}_version_raw"]
        assert isinstance(raw, int)
        text = report[f"{which}_version"]
        assert text == (f"{raw // 1000}.{raw % 1000 // 10}" if raw else None)
    assert report["runtime_version_raw"] >= 12080  # CUDA 12.8+: sm_120
    build = report["build"]
    assert set(build) == {"cuda_toolkit", "cuda_architectures", "sass", "ptx", "dense_prefill_gemm"}
    # the dense GEMM is sm_90a code: never in a build without 90a (a CPU machine's default build is sm_86)
    assert isinstance(build["dense_prefill_gemm"], bool)
    assert not build["dense_prefill_gemm"] or "90a" in build["cuda_architectures"]
    assert build["sass"] or build["ptx"]
    assert report["device_count"] == len(report["devices"])
    error = report["error"]
    assert error is None or set(error) == {"code", "name", "message", "call", "hint"}
    for device in report["devices"]:
        assert {"index", "name", "uuid", "pci_bus_id", "compute_capability", "sm", "sm_count",
                "total_memory_bytes", "free_memory_bytes", "kernel", "error"} <= set(device)


def test_without_a_gpu_the_probe_reports_no_devices_and_the_cuda_error(report):
    if report["device_count"] > 0:
        pytest.skip("a GPU is visible here")
    assert report["devices"] == []
    error = report["error"]
    assert error["name"].startswith("cudaError") and error["code"] > 0
    assert error["message"] and error["call"] == "cudaGetDeviceCount"
    if report["driver_version_raw"] == 0:  # no driver at all: say so, not only "insufficient"
        assert "No NVIDIA driver" in error["hint"]


def test_library_reports_the_package_version():
    built_library()
    assert native.library_version() == openjet_launcher.__version__


def test_probe_buffer_follows_the_snprintf_convention():
    built_library()
    lib = native.load_library()
    n = lib.openjet_probe(None, 0)  # size query
    assert n > 0
    small = ctypes.create_string_buffer(b"x" * 15)  # 16 bytes, not NUL-initialised
    assert lib.openjet_probe(small, 16) >= 16
    assert small.value == b""  # no truncated JSON left behind
    big = ctypes.create_string_buffer(n + 4096)
    m = lib.openjet_probe(big, len(big))
    assert m == len(big.value)
    json.loads(big.value)
    assert lib.openjet_probe(None, 10) == -1  # OPENJET_ERR_INVALID_ARGUMENT


def test_probe_in_child_process_gives_the_same_build_and_devices(report):
    child = device_probe.probe_in_child()
    assert child["build"] == report["build"]
    assert [d.get("uuid") for d in child["devices"]] == [d.get("uuid") for d in report["devices"]]


# --- what was compiled --------------------------------------------------------------------------------


def test_reported_architectures_match_the_fatbin_in_the_library(report):
    library = built_library()
    if not sys.platform.startswith("linux"):
        pytest.skip("reads the ELF file")
    sass, ptx = fatbin_architectures(library)
    assert (set(report["build"]["sass"]), set(report["build"]["ptx"])) == (sass, ptx)
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:  # NVIDIA's reader agrees with ours
        listed = {}
        for kind in ("elf", "ptx"):
            out = subprocess.run([cuobjdump, f"--list-{kind}", str(library)], capture_output=True,
                                 text=True, check=True).stdout
            listed[kind] = {int(a) for a in re.findall(r"sm_(\d+)", out)}
        assert (listed["elf"], listed["ptx"]) == (sass, ptx)


def test_reported_architectures_are_what_cmake_was_asked_for(report):
    requested = os.environ.get("OPENJET_CUDA_ARCHITECTURES", "")
    if requested in ("", "native"):  # resolved by CMake from the GPU: compare with what it resolved to
        requested = report["build"]["cuda_architectures"]
    sass, ptx = parse_cuda_architectures(requested)
    assert (set(report["build"]["sass"]), set(report["build"]["ptx"])) == (sass, ptx)


def test_library_needs_no_cuda_shared_library_and_exports_only_the_c_api():
    library = built_library()
    readelf, nm = shutil.which("readelf"), shutil.which("nm")
    if not sys.platform.startswith("linux") or not (readelf and nm):
        pytest.skip("needs Linux binutils")
    dynamic = subprocess.run([readelf, "-d", str(library)], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dynamic)
    assert needed and not [n for n in needed if n.startswith("libcuda")], needed  # cudart is static
    symbols = subprocess.run([nm, "-D", "--defined-only", str(library)], capture_output=True, text=True,
                             check=True).stdout.split()[2::3]
    assert "openjet_probe" in symbols
    assert all(s.startswith("openjet_") for s in symbols), symbols


# --- the JSON writer behind every report ---------------------------------------------------------------

JSON_DRIVER = r"""
#include "json.h"
#include <iostream>
#include <iterator>
#include <string>
// stdin: strings separated by NUL bytes -> a JSON object exercising every writer call.
int main() {
    std::string in((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    openjet::JsonWriter w;
    w.begin_object().key("strings").begin_array();
    size_t start = 0;
    for (size_t i = 0; i <= in.size(); ++i)
        if (i == in.size() || in[i] == '\0') { w.str(in.substr(start, i - start)); start = i + 1; }
    w.end_array().key("ints").begin_array().integer(0).integer(-7).integer(INT64_MAX).integer(INT64_MIN)
        .end_array().key("t").boolean(true).key("f").boolean(false).key("n").null()
        .key("nullptr").str(static_cast<const char*>(nullptr)).key("raw").raw("[86,90]")
        .key("empty").begin_object().end_object().end_object();
    std::cout << w.text();
}
"""

HOSTILE_STRINGS = [
    b"", b"NVIDIA H200", b'quote " backslash \\ slash /', b"\n\r\t\b\f\x01\x1f\x7f",
    "Grafikkarte \u00e9\u20ac \U0001f680 \u4e2d".encode(),
    b"\xff\xfe lone \x80 continuation \xc0\xaf overlong \xed\xa0\x80 surrogate",
    b"\xf4\x90\x80\x80 too big, truncated \xe2\x82", b"\xf0\x9f\x9a", b"end \xc3",
]


def test_json_writer_output_parses_like_python_decodes_the_same_bytes(tmp_path):
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not compiler:
        pytest.skip("no C++ compiler")
    source = tmp_path / "json_driver.cpp"
    source.write_text(JSON_DRIVER)
    exe = tmp_path / "json_driver"
    subprocess.run([compiler, "-std=c++17", "-Wall", "-Werror", f"-I{REPO / 'native' / 'src'}", str(source),
                    "-o", str(exe)], check=True)
    stdin = b"\0".join(HOSTILE_STRINGS)
    out = subprocess.run([str(exe)], input=stdin, capture_output=True, check=True).stdout
    parsed = json.loads(out)
    assert parsed["strings"] == [s.decode("utf-8", errors="replace") for s in HOSTILE_STRINGS]
    assert parsed["ints"] == [0, -7, 2**63 - 1, -(2**63)]
    assert (parsed["t"], parsed["f"], parsed["n"], parsed["nullptr"]) == (True, False, None, None)
    assert parsed["raw"] == [86, 90] and parsed["empty"] == {}


# --- on a GPU -----------------------------------------------------------------------------------------


def expected_kernel_arch(sm: int, sass: set[int], ptx: set[int]) -> int | None:
    """The code CUDA runs on compute capability sm: the newest SASS of the same major version that is
    not newer than the device, else the newest PTX not newer than the device (JIT), else none."""
    same_major = [s for s in sass if s // 10 == sm // 10 and s <= sm]
    if same_major:
        return max(same_major)
    older_ptx = [p for p in ptx if p <= sm]
    return max(older_ptx) if older_ptx else None


@pytest.mark.gpu
def test_every_visible_gpu_runs_the_probe_kernel(report):
    assert report["error"] is None
    assert report["device_count"] >= 1
    sass, ptx = set(report["build"]["sass"]), set(report["build"]["ptx"])
    for device in report["devices"]:
        assert device["error"] is None, device["error"]
        assert device["sm_count"] > 0
        assert 0 < device["free_memory_bytes"] <= device["total_memory_bytes"]
        major, minor = map(int, device["compute_capability"].split("."))
        assert device["sm"] == 10 * major + minor
        arch = expected_kernel_arch(device["sm"], sass, ptx)
        assert arch is not None, f"sm_{device['sm']} is not covered by SASS {sass} or PTX {ptx}"
        kernel = device["kernel"]
        assert kernel["ok"] and kernel["error"] is None, kernel
        assert kernel["arch"] == arch


# ------------------------------------------------------------------- refusing a GPU the engine cannot run on

def _report(**device) -> dict:
    d = {"index": 0, "name": "NVIDIA H200", "compute_capability": "9.0", "sm": 90, "error": None,
         "kernel": {"ok": True, "arch": 90, "error": None}}
    d.update(device)
    return {"error": None, "device_count": 1, "devices": [d],
            "build": {"cuda_architectures": "86-real;89-real;120-real;120-virtual", "sass": [86, 89, 120], "ptx": [120]}}


def test_a_device_whose_kernel_ran_is_accepted():
    assert device_probe.require_runnable_device(_report(), 0)["name"] == "NVIDIA H200"


def test_no_compiled_code_for_the_gpu_is_refused_with_what_to_install():
    err = {"code": 209, "name": "cudaErrorNoKernelImageForDevice",
           "message": "no kernel image is available for execution on the device", "call": "kernel launch",
           "hint": None}
    with pytest.raises(OpenJetError) as e:
        device_probe.require_runnable_device(_report(kernel={"ok": False, "arch": None, "error": err}), 0)
    msg = str(e.value)
    assert "NVIDIA H200" in msg and "9.0" in msg and "no code for it" in msg
    assert "cudaErrorNoKernelImageForDevice" in msg and "sm_90" in msg and "OPENJET_CUDA_ARCHITECTURES=90-real" in msg
    assert "[86, 89, 120]" in msg


def test_no_gpu_or_a_missing_device_index_is_refused():
    none = {"error": {"name": "cudaErrorInsufficientDriver", "message": "CUDA driver version is insufficient",
                      "hint": "Install an NVIDIA driver."}, "device_count": 0, "devices": []}
    with pytest.raises(OpenJetError, match="No usable NVIDIA GPU.*cudaErrorInsufficientDriver.*Install"):
        device_probe.require_runnable_device(none, 0)
    with pytest.raises(OpenJetError, match="GPU 1 does not exist: CUDA sees 1 device"):
        device_probe.require_runnable_device(_report(), 1)
    broken = _report(error={"name": "cudaErrorDevicesUnavailable", "message": "busy", "hint": None}, kernel=None)
    with pytest.raises(OpenJetError, match="could not be opened.*cudaErrorDevicesUnavailable"):
        device_probe.require_runnable_device(broken, 0)
