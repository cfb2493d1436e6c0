"""The llama-cpp-python source distribution from PyPI, as a store of real test assets (spec §8).

Its `vendor/llama.cpp/` tree carries the qwen35 test vocabulary (`models/ggml-vocab-qwen35.gguf` with
its `.inp`/`.out` test vectors), the real Qwen3.5 chat template and llama.cpp's quant snapshots. We fetch
the sdist once, check it against the size and sha256 that PyPI's simple index (PEP 691 JSON) publishes,
cache it, and read single members out of the tar.gz. Nothing taken from it is ever committed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import urllib.error
import urllib.request
from functools import lru_cache
from pathlib import Path

from openjet_launcher.errors import OpenJetError

PACKAGE = "llama-cpp-python"
DEFAULT_VERSION = "0.3.36"
SIMPLE_INDEX = "https://pypi.org/simple"
VENDOR = "vendor/llama.cpp/"  # prefix of the vendored llama.cpp tree inside the sdist's top folder
_TIMEOUT_S = 60
_CHUNK = 1 << 20


class SdistError(OpenJetError):
    """The llama-cpp-python sdist cannot be fetched or read (offline, PyPI down, corrupt download)."""


def cache_dir() -> Path:
    """`$OPENJET_CACHE`, else the platform's user cache dir for "openjet" (~/.cache/openjet on Linux)."""
    env = os.environ.get("OPENJET_CACHE")
    if env:
        return Path(env).expanduser()
    try:
        import platformdirs

        return Path(platformdirs.user_cache_dir("openjet"))
    except ImportError:  # platformdirs is optional; XDG layout otherwise
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        return Path(base) / "openjet"


def _sdist_record(version: str) -> dict:
    """PyPI's record of the sdist file: {filename, url, size, hashes: {sha256}}."""
    url = f"{SIMPLE_INDEX}/{PACKAGE}/"
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=_TIMEOUT_S) as resp:
            index = json.load(resp)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise SdistError(
            f"cannot reach PyPI ({url}) to fetch {PACKAGE} {version}: {e}. "
            f"Connect to the internet, or copy {PACKAGE.replace('-', '_')}-{version}.tar.gz into {cache_dir()}."
        ) from e
    name = f"{PACKAGE.replace('-', '_')}-{version}.tar.gz"
    for f in index.get("files", []):
        if f.get("filename") == name:
            return f
    raise SdistError(f"PyPI lists no source distribution {name} for {PACKAGE}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def llama_cpp_sdist(version: str = DEFAULT_VERSION) -> Path:
    """Path of the cached `llama_cpp_python-{version}.tar.gz`, downloading and verifying it on first use.

    A cached file is trusted (it was verified when it was renamed into place). The download goes to a
    `.part` file that is renamed only once its size and sha256 match PyPI's record.
    """
    name = f"{PACKAGE.replace('-', '_')}-{version}.tar.gz"
    dest = cache_dir() / name
    if dest.is_file():
        return dest
    rec = _sdist_record(version)
    size, sha = rec.get("size"), rec.get("hashes", {}).get("sha256")
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f"{name}.{os.getpid()}.part")  # per-process, so parallel test runs don't collide
    try:
        with urllib.request.urlopen(rec["url"], timeout=_TIMEOUT_S) as resp, open(part, "wb") as out:
            while chunk := resp.read(_CHUNK):
                out.write(chunk)
        got_size = part.stat().st_size
        if size is not None and got_size != size:
            raise SdistError(f"download of {name} is incomplete: {got_size} of {size} bytes; try again")
        if sha is not None and (got := _sha256(part)) != sha:
            raise SdistError(f"download of {name} is corrupt: sha256 {got}, PyPI says {sha}; try again")
        os.replace(part, dest)
    except (urllib.error.URLError, OSError) as e:
        raise SdistError(f"cannot download {name} from {rec['url']}: {e}") from e
    finally:
        part.unlink(missing_ok=True)
    return dest


@lru_cache(maxsize=None)
def _member_names(path: Path) -> dict[str, str]:
    """Member path relative to the sdist's top folder -> full member name, for lookups by short name."""
    with tarfile.open(path, "r:gz") as tar:
        return {m.name.split("/", 1)[1]: m.name for m in tar.getmembers() if m.isfile() and "/" in m.name}


def _find(name: str, version: str) -> tuple[Path, str]:
    """(sdist path, full member name) for `name`, relative to the sdist's top folder or to VENDOR."""
    path = llama_cpp_sdist(version)
    names = _member_names(path)
    full = names.get(name) or names.get(VENDOR + name)
    if full is None:
        raise SdistError(f"{path.name} has no member {name!r}")
    return path, full


def sdist_member(name: str, version: str = DEFAULT_VERSION) -> bytes:
    """Bytes of one file of the sdist (extracted once into the cache, see `sdist_member_path`).

    `name` is relative to the sdist's top folder (`vendor/llama.cpp/models/ggml-vocab-qwen35.gguf`) or to
    the vendored llama.cpp tree (`models/ggml-vocab-qwen35.gguf`).
    """
    return sdist_member_path(name, version).read_bytes()


def sdist_member_path(name: str, version: str = DEFAULT_VERSION) -> Path:
    """One member extracted once into the cache (`<cache>/llama_cpp_python-<version>/<member>`), read out
    of the tar.gz without unpacking the rest; later calls need neither the network nor the archive."""
    top = cache_dir() / f"{PACKAGE.replace('-', '_')}-{version}"
    for cached in (top / name, top / (VENDOR + name)):
        if cached.is_file():
            return cached
    path, full = _find(name, version)
    dest = cache_dir() / full
    part = dest.with_name(f"{dest.name}.{os.getpid()}.part")
    try:
        with tarfile.open(path, "r:gz") as tar:
            fh = tar.extractfile(full)
            assert fh is not None  # regular file, checked in _member_names
            dest.parent.mkdir(parents=True, exist_ok=True)
            with open(part, "wb") as out:
                shutil.copyfileobj(fh, out, _CHUNK)
        os.replace(part, dest)
    except (tarfile.TarError, OSError, EOFError) as e:
        raise SdistError(f"cannot read {full} from {path}: {e}; delete the file to download it again") from e
    finally:
        part.unlink(missing_ok=True)
    return dest
