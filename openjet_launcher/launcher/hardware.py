"""Which NVIDIA GPUs this machine has and whether the engine runs on them.

Two sources, joined by GPU uuid (CUDA's device order may differ from nvidia-smi's):

* NVML (``nvidia-ml-py``, imported lazily): driver version, the CUDA level the driver supports, and per
  GPU its name, compute capability, total and free memory, uuid. It needs only the driver.
* the engine's probe (``engine.probe_in_child``), run in a child process with a timeout: SM count, the
  architectures the library was compiled for, and a kernel launch on each GPU. It needs the engine.

Each fact that stops a GPU from serving becomes a ``Problem``: a stable ``code`` and a message that says
what to do. ``detect()`` never raises for a machine's state; ``HardwareReport.require_gpu()`` does.
GPU numbers (``--gpu N``) are nvidia-smi's (NVML's) indices; without NVML, CUDA's.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import OpenJetError
from ..model.shape import QWEN38_27B, ModelShape
from .presets import CPU_PATH, gib, model_words, smallest_plan

PROBE_TIMEOUT_S = 60.0

# The oldest driver branch each bundled CUDA runtime major version runs on (CUDA minor-version compatibility).
DRIVER_FLOOR = {12: "525", 13: "580"}
# Machine code in the release wheels (packaging/, pyproject's cibuildwheel settings); newer GPUs run the PTX.
RELEASE_SASS = (86, 89, 90, 120)


@dataclass(frozen=True)
class Problem:
    code: str        # stable: no_driver, driver_too_old, no_kernel_image, engine_not_built, ... (tests, JSON)
    message: str     # what happened and what to do


@dataclass
class GpuInfo:
    index: int | None               # nvidia-smi's index (NVML); None for a device only CUDA lists
    cuda_index: int | None          # the CUDA runtime's index (the engine's device number)
    name: str
    uuid: str
    compute_capability: str | None  # "8.6"
    total_memory_bytes: int | None
    free_memory_bytes: int | None
    sm_count: int | None = None     # from the probe (NVML has none)
    kernel_ok: bool | None = None   # the probe's test kernel ran (None: no probe)
    kernel_arch: int | None = None  # the compiled architecture that ran (86, 90, ...)
    problems: list[Problem] = field(default_factory=list)
    mig: bool = False               # NVML: MIG mode on (CUDA then lists its instances, not the GPU)

    @property
    def usable(self) -> bool:
        return self.kernel_ok is True and not self.problems

    @property
    def label(self) -> str:
        n = self.index if self.index is not None else f"cuda:{self.cuda_index}"
        return f"GPU {n} ({self.name})"


@dataclass
class HardwareReport:
    driver_version: str | None           # "570.124.06" (NVML)
    cuda_driver_version: str | None      # "12.8": the CUDA level the driver supports
    cuda_runtime_version: str | None     # "13.0": the runtime linked into the engine (probe)
    engine: dict[str, Any]               # built, path, version, sass, ptx, dense_prefill_gemm, message
    gpus: list[GpuInfo]
    chosen: GpuInfo | None
    problems: list[Problem]              # the machine's (driver, engine, probe, --gpu)

    @property
    def ok(self) -> bool:
        return self.chosen is not None

    def why_not(self) -> list[Problem]:
        """Why no GPU was chosen: the machine's problems, then each GPU's."""
        if self.ok:
            return []
        return self.problems + [Problem(p.code, f"{g.label}: {p.message}") for g in self.gpus for p in g.problems]

    def require_gpu(self) -> GpuInfo:
        if self.chosen is None:
            reasons = " ".join(p.message for p in self.why_not()) or "No usable NVIDIA GPU."
            raise OpenJetError(reasons)
        return self.chosen

    def to_dict(self) -> dict[str, Any]:
        def gpu(g: GpuInfo) -> dict[str, Any]:
            return {**asdict(g), "usable": g.usable}
        return {
            "ok": self.ok,
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "cuda_runtime_version": self.cuda_runtime_version,
            "engine": self.engine,
            "gpus": [gpu(g) for g in self.gpus],
            "chosen": None if self.chosen is None else {"index": self.chosen.index,
                                                         "cuda_index": self.chosen.cuda_index,
                                                         "uuid": self.chosen.uuid},
            "problems": [asdict(p) for p in self.problems],
            "why_not": [asdict(p) for p in self.why_not()],
        }


# --- NVML ----------------------------------------------------------------------------------------------


@dataclass
class NvmlInfo:
    driver_version: str
    cuda_driver_version: str | None
    gpus: list[GpuInfo]


NO_DRIVER_FIX = ("Install the NVIDIA driver (R580 or newer runs every OpenJet build: your distribution's "
                 "nvidia-driver package or https://www.nvidia.com/drivers; in a container, start it with GPU access, e.g. "
                 f"`docker run --gpus all`). Without an NVIDIA GPU, the CPU path runs: {CPU_PATH}")


def _import_pynvml():
    import pynvml  # nvidia-ml-py
    return pynvml


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _cuda_version_text(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"   # CUDA's encoding: 12080 -> "12.8"


def nvml_problem(nvml: Any, err: Exception) -> Problem:
    """An NVMLError as a Problem with its fix."""
    value = getattr(err, "value", None)
    if value == getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", 12):
        return Problem("no_driver", "No NVIDIA driver found: NVML (libnvidia-ml.so.1 / nvml.dll, part of the "
                                    f"driver) could not be loaded. {NO_DRIVER_FIX}")
    if value == getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", 9):
        return Problem("driver_not_loaded", "The NVIDIA driver is installed but not loaded (no kernel module): "
                                            "reboot after a driver or kernel update; `nvidia-smi` must list "
                                            "the GPU.")
    if value == getattr(nvml, "NVML_ERROR_LIB_RM_VERSION_MISMATCH", 18):
        return Problem("driver_mismatch", "The NVIDIA driver's library and kernel module have different "
                                          "versions (updated without a reboot): reboot.")
    if value == getattr(nvml, "NVML_ERROR_NO_PERMISSION", 4):
        return Problem("nvml_error", "No permission to open the NVIDIA devices (/dev/nvidia*): run as a user "
                                     "with GPU access (Linux: the video or render group).")
    return Problem("nvml_error", f"NVML failed: {err}. `nvidia-smi` should show the same problem.")


def read_nvml() -> NvmlInfo | Problem:
    """The driver's view through NVML, or the Problem that stopped it."""
    try:
        nvml = _import_pynvml()
    except ImportError:
        return Problem("nvml_missing", "The nvidia-ml-py package is missing (openjet-launcher depends on it): "
                                       "`pip install nvidia-ml-py`.")
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        return nvml_problem(nvml, e)
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        try:
            cuda = _cuda_version_text(nvml.nvmlSystemGetCudaDriverVersion())
        except nvml.NVMLError:
            cuda = None
        gpus = [g for i in range(nvml.nvmlDeviceGetCount()) if (g := _nvml_gpu(nvml, i)) is not None]
        return NvmlInfo(driver, cuda, gpus)
    except nvml.NVMLError as e:
        return nvml_problem(nvml, e)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


MIG_ON = 1  # NVML_DEVICE_MIG_ENABLE


def _nvml_gpu(nvml: Any, i: int) -> GpuInfo | None:
    """GPU i as NVML describes it; a query this GPU does not support (memory on unified-memory parts, say) leaves its
    field to the probe instead of failing every GPU's. None when NVML cannot open it at all (the probe may list it)."""
    def ask(query, *args):
        try:
            return query(*args)
        except (nvml.NVMLError, AttributeError):  # AttributeError: a pynvml without this query
            return None
    h = ask(nvml.nvmlDeviceGetHandleByIndex, i)
    uuid = ask(nvml.nvmlDeviceGetUUID, h) if h is not None else None
    if uuid is None:
        return None
    cc = ask(nvml.nvmlDeviceGetCudaComputeCapability, h)
    mem = ask(nvml.nvmlDeviceGetMemoryInfo, h)
    name = ask(nvml.nvmlDeviceGetName, h)
    mig = ask(nvml.nvmlDeviceGetMigMode, h) if hasattr(nvml, "nvmlDeviceGetMigMode") else None  # (current, pending)
    g = GpuInfo(index=i, cuda_index=None, name=_text(name) if name is not None else "unknown", uuid=_text(uuid),
                compute_capability=f"{cc[0]}.{cc[1]}" if cc is not None else None,
                total_memory_bytes=int(mem.total) if mem is not None else None,
                free_memory_bytes=int(mem.free) if mem is not None else None)
    if mig is not None and mig[0] == MIG_ON:
        g.mig = True
        g.problems.append(Problem("mig", MIG_TEXT.format(i=i)))
    return g


MIG_TEXT = ("MIG mode is on: this GPU is split into instances, and OpenJet runs on a whole GPU (its memory plan and "
            "kernels take the whole card's memory and SMs). Turn MIG off (`sudo nvidia-smi -i {i} -mig 0`, then "
            "reset the GPU or reboot), or choose another GPU with --gpu.")


# --- the engine's probe --------------------------------------------------------------------------------


def _engine_library() -> str:
    """The engine library's path; OpenJetError (not built, with the fix) when there is none."""
    from ..engine import library_path
    return str(library_path())


def _run_probe(timeout_s: float) -> dict[str, Any]:
    from ..engine import probe_in_child
    return probe_in_child(timeout_s)


def probe_failure(e: OpenJetError, timeout_s: float) -> Problem:
    if isinstance(e.__cause__, subprocess.TimeoutExpired):
        return Problem("probe_hung", f"{e} The driver or GPU is stuck: check `nvidia-smi`; a hung GPU needs "
                                     "the driver reloaded or a reboot. A slow first start (PTX compiled by the "
                                     f"driver) may need a longer --probe-timeout than {timeout_s:g} s.")
    if "crashed" in str(e):
        return Problem("probe_crashed", f"{e} Update the NVIDIA driver if this repeats.")
    return Problem("probe_failed", str(e))


def _archs(probe: dict[str, Any]) -> str:
    build = probe.get("build") or {}
    sass = ", ".join(f"sm_{a}" for a in build.get("sass", [])) or "none"
    ptx = ", ".join(f"compute_{a}" for a in build.get("ptx", [])) or "none"
    return f"machine code for {sass}; PTX for {ptx}"


def cuda_problem(err: dict[str, Any], probe: dict[str, Any], gpu: GpuInfo | None = None,
                 nvml_driver: str | None = None) -> Problem:
    """A CUDA error from the probe report as a Problem with its fix."""
    name = err.get("name") or "cudaError"
    runtime = probe.get("runtime_version")
    if name == "cudaErrorInsufficientDriver":
        if not probe.get("driver_version_raw"):
            return Problem("no_driver", f"No NVIDIA driver found: CUDA could not load libcuda. {NO_DRIVER_FIX}")
        major = int(str(runtime or "13").split(".")[0])
        driver = f"{nvml_driver} " if nvml_driver else ""
        return Problem("driver_too_old", f"The NVIDIA driver {driver}supports CUDA {probe.get('driver_version')}, "
                                         f"but this engine's bundled CUDA runtime is {runtime}: update the driver "
                                         f"to R{DRIVER_FLOOR.get(major, '580')} or newer "
                                         "(https://www.nvidia.com/drivers).")
    if name == "cudaErrorNoDevice":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        env = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        return Problem("no_gpu", f"No CUDA GPU is visible to this process{env}. Check CUDA_VISIBLE_DEVICES and, "
                                 f"in a container, that it has GPU access. Without a GPU: {CPU_PATH}")
    if name == "cudaErrorNoKernelImageForDevice":
        cc = gpu.compute_capability if gpu and gpu.compute_capability else None
        head = (f"No kernel image for this GPU: this OpenJet build has no code for "
                f"{f'compute capability {cc}' if cc else 'this GPU'}; it carries {_archs(probe)}.")
        if cc and int(cc.split(".")[0]) < 8:
            return Problem("no_kernel_image", f"{head} OpenJet needs compute capability 8.0 or newer "
                                              f"(RTX 30-series and later). Without such a GPU: {CPU_PATH}")
        sm = cc.replace(".", "") if cc else "<major><minor>"
        build = f"build from source with OPENJET_CUDA_ARCHITECTURES={sm}-real"
        if cc and int(sm) not in RELEASE_SASS and int(sm) < RELEASE_SASS[-1]:
            return Problem("no_kernel_image", f"{head} Release wheels do not carry sm_{sm} either: {build}.")
        return Problem("no_kernel_image", f"{head} Install a release wheel, which includes sm_{sm} "
                                          f"(pip install --force-reinstall openjet-launcher), or {build}.")
    if name == "cudaErrorUnsupportedPtxVersion":
        return Problem("unsupported_ptx", f"The driver is too old to compile this build's PTX (CUDA {runtime}) for "
                                          f"this GPU ({_archs(probe)}): update the NVIDIA driver.")
    hint = err.get("hint") or "`nvidia-smi` may tell more; a reboot clears most GPU faults."
    return Problem("cuda_error", f"{name} in {err.get('call')}: {err.get('message')}. {hint}")


# --- joining and choosing ------------------------------------------------------------------------------


def _from_probe_device(d: dict[str, Any]) -> GpuInfo:
    return GpuInfo(index=None, cuda_index=d.get("index"), name=d.get("name") or "unknown", uuid=d.get("uuid") or "",
                   compute_capability=d.get("compute_capability"), total_memory_bytes=d.get("total_memory_bytes"),
                   free_memory_bytes=d.get("free_memory_bytes"))


def _apply_probe_device(g: GpuInfo, d: dict[str, Any], probe: dict[str, Any], nvml_driver: str | None) -> None:
    g.cuda_index = d.get("index")
    g.sm_count = d.get("sm_count")
    kernel = d.get("kernel")
    if kernel is not None:
        g.kernel_ok = bool(kernel.get("ok"))
        g.kernel_arch = kernel.get("arch")
    if g.free_memory_bytes is None:  # NVML could not say (no NVML, or a query this GPU does not support)
        g.free_memory_bytes = d.get("free_memory_bytes")
    if g.total_memory_bytes is None:
        g.total_memory_bytes = d.get("total_memory_bytes")
    if g.compute_capability is None:
        g.compute_capability = d.get("compute_capability")
    err = d.get("error") or (kernel or {}).get("error")
    if err:
        g.problems.append(cuda_problem(err, probe, g, nvml_driver))
    elif kernel is None:
        g.problems.append(Problem("cuda_error", "The probe could not open this GPU."))


def _memory_problem(g: GpuInfo, model: ModelShape, ctx: int | None = None) -> Problem | None:
    if g.total_memory_bytes is None:
        return None
    need = smallest_plan(g.total_memory_bytes, model, requested_ctx=ctx).total
    if g.total_memory_bytes < need:
        return Problem("too_little_memory", f"{gib(g.total_memory_bytes)} of memory; {model_words(model)} needs at least "
                                            f"{gib(need)} (GPUs with 24 GB or more). CPU path: {CPU_PATH}")
    if g.free_memory_bytes is not None and g.free_memory_bytes < need:
        return Problem("memory_in_use", f"only {gib(g.free_memory_bytes)} of {gib(g.total_memory_bytes)} is free; "
                                        f"OpenJet needs {gib(need)}: close the programs `nvidia-smi` lists "
                                        "on this GPU.")
    return None


def detect(gpu: int | None = None, probe_timeout_s: float = PROBE_TIMEOUT_S,
           model: ModelShape = QWEN38_27B, ctx: int | None = None) -> HardwareReport:
    """NVML and the engine probe joined by uuid; ``gpu``: nvidia-smi's index of the GPU to use; ``model`` and
    ``ctx`` (the context asked for, if any): what a GPU's memory is checked against."""
    problems: list[Problem] = []
    nvml = read_nvml()
    if isinstance(nvml, Problem):
        problems.append(nvml)
        nvml = None

    engine: dict[str, Any] = {"built": False, "path": None, "version": None, "sass": None, "ptx": None,
                              "dense_prefill_gemm": None, "message": None}
    probe = None
    try:
        engine["path"] = _engine_library()
        engine["built"] = True
    except OpenJetError as e:
        engine["message"] = str(e)
        problems.append(Problem("engine_not_built", str(e)))
    if engine["built"]:
        try:
            probe = _run_probe(probe_timeout_s)
        except OpenJetError as e:
            problems.append(probe_failure(e, probe_timeout_s))
    if probe is not None:
        build = probe.get("build") or {}
        engine.update(version=probe.get("library_version"), sass=build.get("sass"), ptx=build.get("ptx"),
                      dense_prefill_gemm=build.get("dense_prefill_gemm"))

    nvml_driver = nvml.driver_version if nvml else None
    gpus = list(nvml.gpus) if nvml else []
    if probe is not None:
        top = probe.get("error")
        if top:
            p = cuda_problem(top, probe, None, nvml_driver)
            if not any(q.code == p.code for q in problems):   # NVML may have said "no driver" already
                problems.append(p)
        by_uuid = {g.uuid: g for g in gpus}
        mig = next((g for g in gpus if g.mig), None)
        for d in probe.get("devices", []):
            g = by_uuid.get(d.get("uuid"))
            if g is None:
                g = _from_probe_device(d)
                gpus.append(g)
                if mig is not None:  # a device CUDA lists and NVML does not, beside a GPU in MIG mode: an instance
                    g.mig = True
                    g.problems.append(Problem("mig", "a MIG instance: " + MIG_TEXT.format(i=mig.index)))
            _apply_probe_device(g, d, probe, nvml_driver)
        if not top:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            for g in gpus:
                if g.cuda_index is None and not g.mig:
                    env = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
                    g.problems.append(Problem("not_visible", f"not visible to CUDA in this process{env}."))
    if nvml is not None and not nvml.gpus and not any(p.code == "no_gpu" for p in problems):
        problems.append(Problem("no_gpu", f"The NVIDIA driver {nvml.driver_version} sees no GPU. Without one: "
                                          f"{CPU_PATH}"))
    for g in gpus:
        mp = _memory_problem(g, model, ctx)
        if mp:
            g.problems.append(mp)

    chosen = choose_gpu(gpus, gpu, problems)
    return HardwareReport(
        driver_version=nvml_driver,
        cuda_driver_version=(nvml.cuda_driver_version if nvml else None) or (probe or {}).get("driver_version"),
        cuda_runtime_version=(probe or {}).get("runtime_version"),
        engine=engine, gpus=gpus, chosen=chosen, problems=problems)


def choose_gpu(gpus: list[GpuInfo], wanted: int | None, problems: list[Problem]) -> GpuInfo | None:
    """``wanted`` (nvidia-smi index; CUDA's for GPUs NVML does not list) if usable, else the usable GPU with
    the most free memory. Appends a Problem when ``wanted`` does not exist."""
    if wanted is not None:
        match = [g for g in gpus if (g.index if g.index is not None else g.cuda_index) == wanted]
        if not match:
            have = ", ".join(g.label for g in gpus) or "none"
            problems.append(Problem("no_such_gpu", f"--gpu {wanted}: no such GPU (this machine's: {have})."))
            return None
        return match[0] if match[0].usable else None
    usable = [g for g in gpus if g.usable]
    if not usable:
        return None
    return max(usable, key=lambda g: (g.free_memory_bytes or 0, -(g.index or 0)))
