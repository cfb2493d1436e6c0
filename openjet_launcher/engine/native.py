"""Finds the engine library (native/, built by CMake at install time) and declares its C API for ctypes.

Where the library is looked for, first hit wins:

1. ``$OPENJET_LIBRARY``: a path to the library (a build tree, a release wheel's copy, ...);
2. every directory of this package's ``__path__``: a regular install has the library next to this file;
   scikit-build-core's editable install (redirect mode) keeps the Python files in the source tree and
   installs the library into ``site-packages/openjet_launcher/engine/``, and lists both directories in
   ``__path__``.

The C API's conventions (status codes, snprintf-style buffers) are in native/include/openjet.h.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from pathlib import Path

from ..errors import OpenJetError

API_VERSION = 1  # must equal OPENJET_API_VERSION in native/include/openjet.h
ENV_LIBRARY = "OPENJET_LIBRARY"
LIBRARY_NAME = {"win32": "openjet.dll", "darwin": "libopenjet.dylib"}.get(sys.platform, "libopenjet.so")

# Negative return codes of the C API (enum openjet_status).
STATUS_NAMES = {-1: "invalid argument", -2: "out of host memory", -3: "internal error"}

_lock = threading.Lock()
_loaded: dict[Path, ctypes.CDLL] = {}


def search_dirs() -> list[Path]:
    """Directories where an installed library may lie (see the module docstring)."""
    package = sys.modules[__package__]
    return [Path(p) for p in getattr(package, "__path__", [])] or [Path(__file__).parent]


def not_built_message(looked_in: list[Path]) -> str:
    places = ", ".join(str(d) for d in looked_in)
    return (
        f"The OpenJet GPU engine was not built: no {LIBRARY_NAME} in {places}. "
        "The engine is compiled when openjet-launcher is installed from source on a machine with the "
        "CUDA toolkit 12.8 or newer (nvcc on PATH). Install the toolkit, then run "
        "`pip install --force-reinstall --no-deps .` in the source tree (add -e for an editable "
        "install), or install a release wheel (`pip install openjet-launcher`), which carries the engine. "
        f"A library built elsewhere can be named with {ENV_LIBRARY}=/path/to/{LIBRARY_NAME}."
    )


def library_path() -> Path:
    """The library that load_library() would load; OpenJetError when there is none."""
    override = os.environ.get(ENV_LIBRARY, "").strip()
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise OpenJetError(f"{ENV_LIBRARY}={override} does not name a file: build the engine "
                               f"(scripts/gpu_probe.sh builds one) or unset {ENV_LIBRARY}.")
        return path
    dirs = search_dirs()
    for d in dirs:
        candidate = d / LIBRARY_NAME
        if candidate.is_file():
            return candidate
    raise OpenJetError(not_built_message(dirs))


def _declare(lib: ctypes.CDLL) -> None:
    """argtypes/restype for every function of openjet.h, so ctypes checks and converts arguments."""
    lib.openjet_api_version.argtypes = []
    lib.openjet_api_version.restype = ctypes.c_int
    lib.openjet_version.argtypes = []
    lib.openjet_version.restype = ctypes.c_char_p
    lib.openjet_probe.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.openjet_probe.restype = ctypes.c_int


def load_library() -> ctypes.CDLL:
    """The engine library, loaded once per path, with its functions declared and its API version checked."""
    path = library_path().resolve()
    with _lock:
        if path in _loaded:
            return _loaded[path]
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise OpenJetError(f"The OpenJet GPU engine at {path} could not be loaded: {e}") from e
        try:
            _declare(lib)
        except AttributeError as e:
            raise OpenJetError(f"{path} is not an OpenJet engine library (missing {e}).") from e
        found = lib.openjet_api_version()
        if found != API_VERSION:
            raise OpenJetError(
                f"The OpenJet GPU engine at {path} has C API version {found}, this package needs "
                f"{API_VERSION}: rebuild it (`pip install --force-reinstall --no-deps .`)."
            )
        _loaded[path] = lib
        return lib


def library_version() -> str:
    """The package version the library was built from (openjet_version())."""
    return load_library().openjet_version().decode("utf-8")


def probe_json() -> str:
    """openjet_probe()'s JSON report as text: retries with the size the library asks for."""
    lib = load_library()
    size = 16 * 1024  # a report is about 0.5 KiB plus 0.6 KiB per GPU
    for _ in range(4):
        buf = ctypes.create_string_buffer(size)
        n = lib.openjet_probe(buf, size)
        if n < 0:
            raise OpenJetError(f"openjet_probe failed: {STATUS_NAMES.get(n, f'status {n}')}")
        if n < size:
            return buf.value.decode("utf-8", errors="replace")
        size = n + 4096  # slack: free-memory figures may grow a digit between calls
    raise OpenJetError("openjet_probe's report kept outgrowing its buffer")
