"""The GPU engine: a ctypes binding to the native library built from native/.

Importing this package never needs the library; load_library() (and everything that calls it) raises
OpenJetError with instructions when the engine was not built.
"""

from .device_probe import probe, probe_in_child
from .native import library_path, library_version, load_library

__all__ = ["library_path", "library_version", "load_library", "probe", "probe_in_child"]
