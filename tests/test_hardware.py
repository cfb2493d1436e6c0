"""GPU detection: NVML and the engine probe, faked, for every failure a user can meet; the choice among
several GPUs; and the real call on this machine (no NVIDIA driver here: the no-driver message and the
CPU path)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from openjet_launcher.engine import device_probe
from openjet_launcher.errors import OpenJetError
from openjet_launcher.launcher import doctor, hardware
from openjet_launcher.launcher.memory import GiB

# NVML's return codes (nvml.h), independent of the pynvml installed.
LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED, NO_PERMISSION = 12, 9, 4


class FakeNvml:
    """The slice of pynvml hardware.read_nvml uses."""
    NVML_ERROR_LIBRARY_NOT_FOUND = LIBRARY_NOT_FOUND
    NVML_ERROR_DRIVER_NOT_LOADED = DRIVER_NOT_LOADED
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
    NVML_ERROR_NO_PERMISSION = NO_PERMISSION

    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__(f"NVML error {value}")
            self.value = value

    def __init__(self, gpus=(), driver="580.65.06", cuda=13000, init_error=None):
        self.gpus, self.driver, self.cuda, self.init_error = list(gpus), driver, cuda, init_error

    def nvmlInit(self):
        if self.init_error is not None:
            raise self.NVMLError(self.init_error)

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self):
        return self.cuda

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.gpus[i]

    def nvmlDeviceGetName(self, h):
        return h["name"].encode()                      # older pynvml returns bytes

    def nvmlDeviceGetUUID(self, h):
        return h["uuid"]

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return h["cc"]

    def nvmlDeviceGetMemoryInfo(self, h):
        if h.get("memory_unsupported"):              # e.g. unified-memory parts (GB10)
            raise self.NVMLError(3)                  # NVML_ERROR_NOT_SUPPORTED
        return SimpleNamespace(total=h["total"], free=h["free"], used=h["total"] - h["free"])

    def nvmlDeviceGetMigMode(self, h):
        if "mig" not in h:
            raise self.NVMLError(3)                  # consumer GPUs: MIG not supported
        return (h["mig"], h["mig"])


def nvml_gpu(n, name="NVIDIA GeForce RTX 4090", cc=(8, 9), total=24 * GiB, free=23 * GiB):
    return {"name": name, "uuid": f"GPU-0000000{n}-aaaa-bbbb-cccc-dddddddddddd", "cc": cc, "total": total,
            "free": free}


def probe_device(cuda_index, nvml, sm_count=128, kernel_error=None, device_error=None):
    sm = nvml["cc"][0] * 10 + nvml["cc"][1]
    kernel = {"ok": kernel_error is None, "arch": sm if kernel_error is None else None, "binary_version": sm,
              "ptx_version": 120, "error": kernel_error}
    return {"index": cuda_index, "name": nvml["name"], "uuid": nvml["uuid"], "pci_bus_id": "0000:01:00.0",
            "compute_capability": f"{nvml['cc'][0]}.{nvml['cc'][1]}", "sm": sm, "sm_count": sm_count,
            "total_memory_bytes": nvml["total"], "free_memory_bytes": nvml["free"] - 300 * 2**20,
            "kernel": None if device_error else kernel, "error": device_error}


def cuda_error(name):
    return {"code": 35, "name": name, "message": "CUDA says so", "call": "cudaGetDeviceCount", "hint": None}


def probe_report(devices=(), error=None, driver_raw=13000, runtime="13.0", sass=(86, 89, 90, 120), dense=True):
    return {"api_version": 1, "library_version": "0.1.0",
            "driver_version": f"{driver_raw // 1000}.{driver_raw % 1000 // 10}" if driver_raw else None,
            "driver_version_raw": driver_raw, "runtime_version": runtime, "runtime_version_raw": 13000,
            "build": {"cuda_toolkit": "13.0", "cuda_architectures": ";".join(f"{a}-real" for a in sass) + ";120",
                      "sass": list(sass), "ptx": [120], "dense_prefill_gemm": dense},
            "error": error, "device_count": len(devices), "devices": list(devices)}


@pytest.fixture
def machine(monkeypatch):
    """Install a fake NVML and a fake engine: machine(nvml=FakeNvml(...) | ImportError, probe=dict | exc)."""
    calls = {"probe": 0}

    def setup(nvml=None, probe=None, built=True):
        def import_pynvml():
            if nvml is ImportError:
                raise ImportError("No module named 'pynvml'")
            return nvml

        def engine_library():
            if not built:
                raise OpenJetError("The OpenJet GPU engine was not built: no libopenjet.so in /x. Install the "
                                   "toolkit, then run `pip install --force-reinstall --no-deps .`")
            return "/x/libopenjet.so"

        def run_probe(timeout_s):
            calls["probe"] += 1
            if isinstance(probe, BaseException):
                raise probe
            return probe

        monkeypatch.setattr(hardware, "_import_pynvml", import_pynvml)
        monkeypatch.setattr(hardware, "_engine_library", engine_library)
        monkeypatch.setattr(hardware, "_run_probe", run_probe)
        return calls

    return setup


def codes(problems):
    return [p.code for p in problems]


# --- failures, each with its fix ------------------------------------------------------------------------------


def test_no_driver_says_install_the_driver_and_names_the_cpu_path(machine):
    machine(FakeNvml(init_error=LIBRARY_NOT_FOUND),
            probe_report(error=cuda_error("cudaErrorInsufficientDriver"), driver_raw=0))
    r = hardware.detect()
    assert not r.ok and codes(r.problems) == ["no_driver"]     # NVML and the probe say it once
    msg = r.problems[0].message
    assert "No NVIDIA driver found" in msg and "Install the NVIDIA driver" in msg
    assert "openjet-launch --engine reference --model demo" in msg
    with pytest.raises(OpenJetError, match="No NVIDIA driver found"):
        r.require_gpu()


def test_no_driver_seen_only_by_the_probe_is_the_same_problem(machine):
    machine(ImportError, probe_report(error=cuda_error("cudaErrorInsufficientDriver"), driver_raw=0))
    r = hardware.detect()
    assert codes(r.problems) == ["nvml_missing", "no_driver"]
    assert "pip install nvidia-ml-py" in r.problems[0].message


def test_a_driver_that_is_not_loaded_asks_for_a_reboot(machine):
    machine(FakeNvml(init_error=DRIVER_NOT_LOADED), probe_report(error=cuda_error("cudaErrorNoDevice")))
    r = hardware.detect()
    assert codes(r.problems)[0] == "driver_not_loaded" and "reboot" in r.problems[0].message


def test_a_driver_older_than_the_bundled_runtime_names_both_versions(machine):
    machine(FakeNvml([nvml_gpu(0)], driver="535.104.05", cuda=12020),
            probe_report(error=cuda_error("cudaErrorInsufficientDriver"), driver_raw=12020))
    r = hardware.detect()
    assert codes(r.problems) == ["driver_too_old"]
    msg = r.problems[0].message
    assert "535.104.05" in msg and "CUDA 12.2" in msg and "runtime is 13.0" in msg and "R580" in msg
    assert r.cuda_driver_version == "12.2" and not r.ok


def test_a_gpu_the_build_has_no_code_for_names_the_compiled_architectures(machine):
    t4 = nvml_gpu(0, "Tesla T4", cc=(7, 5), total=16 * GiB, free=15 * GiB)
    machine(FakeNvml([t4]),
            probe_report([probe_device(0, t4, 40, kernel_error=cuda_error("cudaErrorNoKernelImageForDevice"))]))
    r = hardware.detect()
    g = r.gpus[0]
    assert g.kernel_ok is False and not r.ok
    msg = g.problems[0].message
    assert g.problems[0].code == "no_kernel_image"
    assert "compute capability 7.5" in msg and "sm_86, sm_89, sm_90, sm_120" in msg and "compute_120" in msg
    assert "8.0 or newer" in msg and "--engine reference" in msg


def test_a_supported_gpu_without_code_in_this_build_is_told_to_get_a_wheel_that_has_it(machine):
    # Issue 9: a wheel built without sm_90 on an H200 says "no kernel image" and names the wheel to install.
    h200 = nvml_gpu(0, "NVIDIA H200", cc=(9, 0), total=140 * GiB, free=139 * GiB)
    machine(FakeNvml([h200]),
            probe_report([probe_device(0, h200, 132, kernel_error=cuda_error("cudaErrorNoKernelImageForDevice"))],
                         sass=[86, 89, 120]))
    r = hardware.detect()
    msg = r.gpus[0].problems[0].message
    assert r.gpus[0].problems[0].code == "no_kernel_image" and not r.ok
    assert msg.startswith("No kernel image for this GPU") and "compute capability 9.0" in msg
    assert "sm_86, sm_89, sm_120" in msg and "release wheel, which includes sm_90" in msg
    assert "OPENJET_CUDA_ARCHITECTURES=90-real" in msg


def test_an_engine_that_was_not_built_lists_the_gpus_without_probing(machine):
    calls = machine(FakeNvml([nvml_gpu(0)]), None, built=False)
    r = hardware.detect()
    assert calls["probe"] == 0
    assert codes(r.problems) == ["engine_not_built"] and "pip install" in r.problems[0].message
    assert r.engine["built"] is False
    assert r.gpus[0].name == "NVIDIA GeForce RTX 4090" and r.gpus[0].kernel_ok is None and not r.ok


def test_too_little_memory_and_memory_held_by_others_are_told_apart(machine):
    small = nvml_gpu(0, "NVIDIA GeForce RTX 4080", total=16 * GiB, free=15 * GiB)
    busy = nvml_gpu(1, total=24 * GiB, free=8 * GiB)
    machine(FakeNvml([small, busy]), probe_report([probe_device(0, small, 76), probe_device(1, busy)]))
    r = hardware.detect()
    assert [codes(g.problems) for g in r.gpus] == [["too_little_memory"], ["memory_in_use"]]
    assert "24 GB" in r.gpus[0].problems[0].message and "--engine reference" in r.gpus[0].problems[0].message
    assert "nvidia-smi" in r.gpus[1].problems[0].message
    assert r.chosen is None and len(r.why_not()) == 2


def test_a_context_asked_for_below_the_minimum_is_checked_as_asked(machine):
    """A 24 GB card with 18 GiB free cannot hold the smallest default setup (32,768 tokens), but 8,192 tokens,
    asked for, fit: that GPU is usable for them (the launcher passes --ctx here)."""
    busy = nvml_gpu(0, total=24 * GiB, free=18 * GiB)
    machine(FakeNvml([busy]), probe_report([probe_device(0, busy)]))
    assert codes(hardware.detect().gpus[0].problems) == ["memory_in_use"]
    r = hardware.detect(ctx=8192)
    assert r.gpus[0].problems == [] and r.chosen is r.gpus[0]


def test_one_gpus_unsupported_query_leaves_the_others_described_by_nvml(machine):
    """A query one GPU does not support (memory on a unified-memory part) used to fail NVML for every GPU (and the
    driver version with it): now that GPU's field comes from the probe and the rest stays NVML's."""
    good = nvml_gpu(0, "NVIDIA GeForce RTX 3090", cc=(8, 6))
    odd = {**nvml_gpu(1, "NVIDIA GB10", cc=(12, 1), total=120 * GiB, free=100 * GiB), "memory_unsupported": True}
    machine(FakeNvml([good, odd]), probe_report([probe_device(0, good, 82), probe_device(1, odd, 48)]))
    r = hardware.detect()
    assert r.driver_version == "580.65.06" and not any(p.code == "nvml_error" for p in r.problems)
    assert [g.index for g in r.gpus] == [0, 1] and r.gpus[0].free_memory_bytes == 23 * GiB
    assert r.gpus[1].total_memory_bytes == 120 * GiB                  # the probe's figure
    assert r.gpus[1].free_memory_bytes == 100 * GiB - 300 * 2**20


def test_a_gpu_in_mig_mode_and_its_instances_are_refused_with_how_to_turn_it_off(machine):
    """NVML lists the GPU, CUDA its MIG instance (another uuid): neither may be chosen (the plan would take the whole
    card's memory and SMs, and CUDA_VISIBLE_DEVICES would name the instance by a GPU- uuid)."""
    parent = {**nvml_gpu(0, "NVIDIA H100 80GB HBM3", cc=(9, 0), total=80 * GiB, free=79 * GiB), "mig": 1}
    instance = {**parent, "uuid": "MIG-11111111-2222-3333-4444-555555555555", "total": 20 * GiB, "free": 19 * GiB}
    machine(FakeNvml([parent]), probe_report([probe_device(0, instance, 32)]))
    r = hardware.detect()
    assert r.chosen is None and [codes(g.problems)[0] for g in r.gpus] == ["mig", "mig"]
    assert "nvidia-smi -i 0 -mig 0" in r.gpus[0].problems[0].message
    assert r.gpus[1].problems[0].message.startswith("a MIG instance: ")
    plain = {**nvml_gpu(0, "NVIDIA H100 80GB HBM3", cc=(9, 0), total=80 * GiB, free=79 * GiB), "mig": 0}
    machine(FakeNvml([plain]), probe_report([probe_device(0, plain, 132)]))
    assert hardware.detect().chosen is not None                         # MIG supported but off: a whole GPU


def test_a_probe_that_hangs_is_reported_with_its_timeout(machine, monkeypatch):
    # The real probe_in_child, with the child process replaced by one that times out.
    machine(FakeNvml([nvml_gpu(0)]), None)
    monkeypatch.setattr(hardware, "_run_probe", lambda t: device_probe.probe_in_child(t))
    monkeypatch.setattr(device_probe, "library_path", lambda: Path("/x/libopenjet.so"))

    def hang(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, kw["timeout"])

    monkeypatch.setattr(device_probe.subprocess, "run", hang)
    r = hardware.detect(probe_timeout_s=7)
    assert codes(r.problems) == ["probe_hung"]
    assert "within 7 s" in r.problems[0].message and "--probe-timeout" in r.problems[0].message


def test_a_probe_that_crashes_is_reported_as_a_crash(machine, monkeypatch):
    machine(FakeNvml([nvml_gpu(0)]), None)
    monkeypatch.setattr(hardware, "_run_probe", lambda t: device_probe.probe_in_child(t))
    monkeypatch.setattr(device_probe, "library_path", lambda: Path("/x/libopenjet.so"))
    monkeypatch.setattr(device_probe.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, -11, "", ""))
    r = hardware.detect()
    assert codes(r.problems) == ["probe_crashed"] and "signal 11" in r.problems[0].message
    assert not r.ok


def test_a_gpu_hidden_from_cuda_is_not_chosen(machine, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    a, b = nvml_gpu(0, free=23 * GiB), nvml_gpu(1, free=20 * GiB)
    machine(FakeNvml([a, b]), probe_report([probe_device(0, b)]))
    r = hardware.detect()
    assert codes(r.gpus[0].problems) == ["not_visible"] and "CUDA_VISIBLE_DEVICES='1'" in r.gpus[0].problems[0].message
    assert r.chosen is r.gpus[1] and r.chosen.cuda_index == 0


# --- choosing among several ------------------------------------------------------------------------------------


def three_gpus(machine):
    """nvidia-smi order 0, 1, 2; CUDA enumerates them 2, 0, 1 (its order differs); GPU 2 lacks a kernel."""
    g = [nvml_gpu(0, free=20 * GiB), nvml_gpu(1, "NVIDIA H100 80GB HBM3", (9, 0), 80 * GiB, 70 * GiB),
         nvml_gpu(2, "NVIDIA A100", (8, 0), 80 * GiB, 79 * GiB)]
    machine(FakeNvml(g), probe_report([
        probe_device(0, g[2], 108, kernel_error=cuda_error("cudaErrorNoKernelImageForDevice")),
        probe_device(1, g[0], 128), probe_device(2, g[1], 132)]))


def test_several_gpus_the_usable_one_with_the_most_free_memory_is_chosen(machine):
    three_gpus(machine)
    r = hardware.detect()
    assert r.chosen.index == 1 and r.chosen.cuda_index == 2 and r.chosen.sm_count == 132
    assert [g.cuda_index for g in r.gpus] == [1, 2, 0]       # joined by uuid, not by position
    assert r.to_dict()["chosen"] == {"index": 1, "cuda_index": 2, "uuid": r.gpus[1].uuid}


def test_gpu_n_picks_that_gpu_or_says_why_it_cannot(machine):
    three_gpus(machine)
    assert hardware.detect(gpu=0).chosen.index == 0
    r = hardware.detect(gpu=2)
    assert r.chosen is None and codes(r.why_not()) == ["no_kernel_image"]
    msg = r.why_not()[0].message
    assert msg.startswith("GPU 2 (NVIDIA A100): No kernel image for this GPU")
    assert "Release wheels do not carry sm_80" in msg and "OPENJET_CUDA_ARCHITECTURES=80-real" in msg
    r = hardware.detect(gpu=5)
    assert r.chosen is None and codes(r.problems) == ["no_such_gpu"] and "GPU 1 (NVIDIA H100" in r.problems[0].message


def test_without_nvml_the_probe_alone_describes_the_gpu(machine):
    g = nvml_gpu(0)
    machine(ImportError, probe_report([probe_device(0, g)]))
    r = hardware.detect()
    assert r.ok and r.chosen.index is None and r.chosen.cuda_index == 0
    assert r.chosen.total_memory_bytes == 24 * GiB and r.chosen.compute_capability == "8.9"


def test_doctor_on_a_ready_machine_prints_the_settings_and_exits_0(machine, capsys):
    three_gpus(machine)
    report = doctor.doctor_report()
    assert report["verdict"]["ready"] and report["settings"]["kv_format"] == "fp16"
    text = doctor.format_report(report)
    assert "<- chosen" in text and "Ready" in text and "KV fp16" in text
    json.dumps(report)


def test_doctor_tells_a_usable_gpu_from_settings_that_do_not_fit_and_checks_ctx_as_serve_does(machine):
    """A usable RTX 4090 asked for 262,144 tokens: the GPU is fine, the request is not (it used to say 'no usable
    NVIDIA GPU' and point to the CPU path); `--ctx 8` is refused as `serve` refuses it (it used to say Ready); one
    agent is explained by the engine's own reason, not 'fewer than 80 SMs' on a 128-SM card."""
    gpu = nvml_gpu(0)
    machine(FakeNvml([gpu]), probe_report([probe_device(0, gpu, 128)]))
    r = doctor.doctor_report(ctx=262144, kv="q8_0")
    text = doctor.format_report(r)
    assert not r["verdict"]["ready"] and r["verdict"]["path"] == "gpu"
    assert "GPU 0 (NVIDIA GeForce RTX 4090) is usable, but not with the settings asked for" in text
    assert "no usable NVIDIA GPU" not in text and "CPU path" not in text
    with pytest.raises(OpenJetError, match="--ctx 8 is too small"):
        doctor.doctor_report(ctx=8)
    text = doctor.format_report(doctor.doctor_report())
    assert "1 agent (the CUDA engine v1 holds one sequence)" in text and "fewer than 80" not in text


@pytest.mark.parametrize("dense", [True, False])
def test_doctor_says_whether_an_h100_gets_the_dense_prefill_gemm(machine, dense):
    """The probe's build report says whether the sm_90a dense prefill GEMM (CUTLASS) is compiled in; on a machine
    with a Hopper GPU the doctor names it, or says how a source build gets it."""
    g = [nvml_gpu(0, "NVIDIA H100 80GB HBM3", (9, 0), 80 * GiB, 79 * GiB)]
    machine(FakeNvml(g), probe_report([probe_device(0, g[0], 132)], dense=dense))
    report = doctor.doctor_report()
    assert report["hardware"]["engine"]["dense_prefill_gemm"] is dense
    text = doctor.format_report(report)
    assert ("dense GEMM for H100 / H200 (sm_90a, CUTLASS) compiled in" in text) is dense
    assert ("scripts/fetch_cutlass.py" in text) is not dense


# --- the real call on this machine -------------------------------------------------------------------------------


def _has_driver() -> bool:
    try:
        import pynvml
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


@pytest.mark.skipif(_has_driver(), reason="this machine has an NVIDIA driver")
def test_on_this_machine_without_a_driver_detect_says_so_and_doctor_points_to_the_cpu_path(capsys):
    r = hardware.detect(probe_timeout_s=60)
    assert not r.ok and r.gpus == []
    assert "no_driver" in codes(r.problems) or "nvml_missing" in codes(r.problems)
    assert any("No NVIDIA driver found" in p.message for p in r.problems)
    json.dumps(r.to_dict())

    import argparse
    parser = argparse.ArgumentParser()
    doctor.add_doctor_parser(parser.add_subparsers())
    args = parser.parse_args(["doctor"])
    assert args.func(args) == 1                               # documented: 1 = no GPU path here
    out = capsys.readouterr().out
    assert "No NVIDIA driver found" in out and "openjet-launch --engine reference --model demo" in out
    args = parser.parse_args(["doctor", "--json"])
    assert args.func(args) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"]["path"] == "cpu" and report["verdict"]["command"].startswith("openjet-launch --engine")


def test_the_release_architectures_the_advice_names_are_those_the_release_builds_compile():
    import re
    import tomllib
    from pathlib import Path

    text = (Path(__file__).parent.parent / "pyproject.toml").read_text()
    archs = {m for m in re.findall(r'OPENJET_CUDA_ARCHITECTURES = "([^"]+)"', text)}
    assert len(archs) == 1, archs  # Linux and Windows release builds agree
    tomllib.loads(text)  # and the file still parses
    # "90a-real": SASS for compute capability 9.0 with its arch-specific features (the dense prefill GEMM)
    sass = {int(re.match(r"\d+", a).group()) for a in archs.pop().split(";") if a.endswith("-real")}
    assert sass == set(hardware.RELEASE_SASS)
