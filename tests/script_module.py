"""scripts/NAME.py (or NAME.py in another folder: native/bench's tools) imported as the module NAME (once per test
session), for tests of the scripts' functions."""

import importlib.util
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
BENCH = Path(__file__).resolve().parents[1] / "native" / "bench"


def load_script(name: str, folder: Path = SCRIPTS):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
