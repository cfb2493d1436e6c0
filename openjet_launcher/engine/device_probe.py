"""The engine's device probe: what CUDA sees, and whether the engine's code runs on each GPU.

``probe()`` returns openjet_probe()'s report as a dict (schema below). The launcher should call
``probe_in_child()``: a driver that crashes the process then costs a message, not the tray.
``python -m openjet_launcher.engine`` prints the report (``main()``, for the CLI).

Report (``api_version`` 1)::

    api_version          int, OPENJET_API_VERSION of the library
    library_version      str, package version the library was built from
    driver_version       "12.9" | null (no driver); driver_version_raw: int, 12090 (0 without a driver)
    runtime_version      "13.0"; runtime_version_raw: int (the statically linked CUDA runtime)
    build                {cuda_toolkit: "13.0", cuda_architectures: "86-real;90a-real;120",
                          sass: [86, 90, 120], ptx: [120],  compute capabilities as major*10+minor
                          dense_prefill_gemm: true}  the sm_90a CUTLASS prefill GEMM compiled in
    error                null | CUDA error (below): why there are no devices (no driver, no GPU, ...)
    device_count         int
    devices              [{index, name, uuid ("GPU-..." as nvidia-smi), pci_bus_id, compute_capability
                           ("9.0"), sm (90), sm_count, total_memory_bytes, free_memory_bytes (null if
                           the device could not be opened), kernel, error}]
    kernel               null (device not opened) | {ok: bool, arch: int|null (__CUDA_ARCH__/10 of the
                          code that ran), binary_version, ptx_version (cudaFuncAttributes), error}
    CUDA error           {code: int|null, name: "cudaErrorNoKernelImageForDevice", message: CUDA's text,
                          call: the failing call, hint: str|null, what the user can do}
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..errors import OpenJetError
from .native import ENV_LIBRARY, library_path, probe_json


def probe() -> dict[str, Any]:
    """The probe report of this process's view of CUDA (initialises CUDA here: see probe_in_child)."""
    return json.loads(probe_json())


def require_runnable_device(report: dict[str, Any], device: int) -> dict[str, Any]:
    """The report's entry of `device` when the engine's code runs on it; else an OpenJetError that says why
    (no driver or GPU, no such device, or no compiled code for its architecture) and what to do."""
    def advice(err: dict[str, Any] | None) -> str:
        if not err:
            return ""
        text = f"{err.get('name') or 'error'}: {err.get('message') or ''}".strip()
        return f" ({text}){' ' + err['hint'] if err.get('hint') else ''}"

    if report.get("error"):
        raise OpenJetError(f"No usable NVIDIA GPU{advice(report['error'])}")
    devices = report.get("devices") or []
    if not 0 <= device < len(devices):
        raise OpenJetError(f"GPU {device} does not exist: CUDA sees {len(devices)} device(s)")
    d = devices[device]
    name = f"GPU {device} ({d.get('name')}, compute capability {d.get('compute_capability')})"
    if d.get("error"):
        raise OpenJetError(f"{name} could not be opened{advice(d['error'])}")
    kernel = d.get("kernel") or {}
    if not kernel.get("ok"):
        build = report.get("build") or {}
        sm = d.get("sm")
        raise OpenJetError(
            f"{name}: this OpenJet engine has no code for it (built for SASS {build.get('sass')} and PTX "
            f"{build.get('ptx')}){advice(kernel.get('error'))}. Install a release wheel that includes sm_{sm}, "
            f"or rebuild: OPENJET_CUDA_ARCHITECTURES={sm}-real pip install --force-reinstall --no-deps .")
    return d


def probe_in_child(timeout_s: float = 120.0) -> dict[str, Any]:
    """probe() in a child Python process, so a crash or a hang in the driver stays there.

    The child imports this same copy of the package and loads the library found here (not whatever its
    working directory or PYTHONPATH would offer).
    """
    env = dict(os.environ, **{ENV_LIBRARY: str(library_path().resolve())})  # raises here when not built
    package_root = str(Path(__file__).resolve().parents[2])
    code = (f"import sys; sys.path.insert(0, {package_root!r}); "
            f"from {__name__} import main; sys.exit(main(['--compact']))")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as e:
        raise OpenJetError(f"The GPU probe did not finish within {timeout_s:g} s (driver hang?).") from e
    if done.returncode < 0:
        raise OpenJetError(f"The GPU probe crashed (signal {-done.returncode}): the NVIDIA driver or GPU "
                           "is in a bad state; `nvidia-smi` may tell more.")
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        raise OpenJetError(f"The GPU probe failed: {lines[-1].removeprefix('error: ')}")
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError as e:
        raise OpenJetError(f"The GPU probe printed something that is not its report: {e}") from e


def main(argv: list[str] | None = None) -> int:
    """Prints the report as JSON; the message of an OpenJetError (e.g. engine not built) on stderr."""
    args = sys.argv[1:] if argv is None else argv
    try:
        report = probe()
    except OpenJetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=None if "--compact" in args else 2))
    return 0
