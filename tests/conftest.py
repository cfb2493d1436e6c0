"""Shared test setup.

`gpu`-marked tests run only where the engine library is built and sees at least one NVIDIA GPU; elsewhere
they are skipped with the reason. OPENJET_REQUIRE_GPU=1 (the GPU machine) turns that skip into an error,
so a broken GPU setup cannot pass as "all skipped".
"""

from __future__ import annotations

import functools
import os

import pytest


@functools.lru_cache(maxsize=1)
def gpu_unavailable_reason() -> str | None:
    """None when a GPU can run the engine, else why not. The probe runs in a child process, once."""
    from openjet_launcher.engine import probe_in_child
    from openjet_launcher.errors import OpenJetError

    try:
        report = probe_in_child()
    except OpenJetError as e:
        return str(e)
    if report["device_count"] == 0:
        error = report["error"] or {}
        return f"no NVIDIA GPU visible: {error.get('name')}: {error.get('hint') or error.get('message')}"
    return None


@pytest.fixture(scope="module")
def engine_library():
    """The built engine library's path, for tests of its host arithmetic (no GPU needed); where it was not built,
    the module's tests are skipped with the reason. Use: pytestmark = pytest.mark.usefixtures("engine_library")."""
    from openjet_launcher.engine import native
    from openjet_launcher.errors import OpenJetError

    try:
        return native.library_path()
    except OpenJetError as e:
        pytest.skip(str(e).split(": ")[0])  # "The OpenJet GPU engine was not built", or the env var's fault


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    if os.environ.get("OPENJET_REQUIRE_GPU", "") not in ("", "0"):
        raise pytest.UsageError(f"OPENJET_REQUIRE_GPU is set but gpu tests cannot run: {reason}")
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason=reason))
