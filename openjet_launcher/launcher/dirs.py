"""Where OpenJet keeps things on this machine: per-OS conventions from platformdirs, each overridable.

models  `--models-dir` > `$OPENJET_MODELS_DIR` > user_data_dir("openjet")/models  (~/.local/share/openjet/models)
logs    `$OPENJET_LOG_DIR` > user_log_dir("openjet")                            (~/.local/state/openjet/log)
config  `$OPENJET_CONFIG_DIR` > user_config_dir("openjet")                      (~/.config/openjet)
cache   `$OPENJET_CACHE` > user_cache_dir("openjet")                            (~/.cache/openjet; model/sdist.py's)
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from openjet_launcher.errors import OpenJetError
from openjet_launcher.model.sdist import cache_dir

__all__ = ["models_dir", "log_dir", "config_dir", "cache_dir", "ensure_dir"]

APP = "openjet"


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value).expanduser() if value else None


def models_dir(override: str | os.PathLike | None = None) -> Path:
    """The folder GGUF downloads go to: the option, else `$OPENJET_MODELS_DIR`, else the user data dir."""
    if override:
        return Path(override).expanduser()
    return _env_path("OPENJET_MODELS_DIR") or Path(platformdirs.user_data_dir(APP)) / "models"


def log_dir() -> Path:
    """Server and supervisor logs."""
    return _env_path("OPENJET_LOG_DIR") or Path(platformdirs.user_log_dir(APP))


def config_dir() -> Path:
    """User settings (API key file, chosen preset)."""
    return _env_path("OPENJET_CONFIG_DIR") or Path(platformdirs.user_config_dir(APP))


def ensure_dir(path: Path, setting: str) -> Path:
    """`path`, created when missing; an OpenJetError naming `setting` when it cannot be a folder (a file is
    there, no permission)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OpenJetError(f"{path}: cannot be used as a folder ({e.strerror or e}); point {setting} at a "
                           "folder") from None
    if not path.is_dir():
        raise OpenJetError(f"{path}: not a folder; point {setting} at a folder")
    return path
