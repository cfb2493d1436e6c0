"""The model file: resolve a MODEL spec to verified local GGUF file(s), downloading only what is missing.

huggingface_hub answers the metadata (the commit `main` points at, each file's size and LFS sha256);
the bytes come over our own HTTP GET with `Range`, because huggingface_hub does not resume across runs.
Invariants:
* bytes land in `FILE.part` (its `FILE.part.json` names the sha256 it is heading for, so a .part of
  another version is never resumed); the sha256 runs over the .part as it grows, re-read once on resume;
* only a .part whose size and sha256 equal the Hub's is renamed to FILE: a partial or corrupt download
  never takes the final name; a mismatching .part is deleted;
* `FILE.openjet.json` records repo, commit, sha256, size and mtime: while size and mtime are unchanged
  a later run trusts the file without re-hashing 17 GB; otherwise it re-hashes;
* where the Hub cannot give the file now (unreachable, busy: HTTP 429 / 5xx, or an update that does not fit on the
  disk beside the old copy), the copy already here is used, with a warning.
Files go to `<models dir>/<owner>/<name>/<file path in the repo>`. Split GGUFs (`X-00001-of-0000M.gguf`)
are fetched part by part, each verified on its own.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import http.client
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from openjet_launcher import __version__
from openjet_launcher.errors import OpenJetError
from openjet_launcher.launcher import dirs

log = logging.getLogger(__name__)
# Where the models folder is chosen: the environment, for every command; `download` also takes --models-dir.
_FOLDER_SETTING = "OPENJET_MODELS_DIR (or `openjet-launch download --models-dir`)"

DEFAULT_REPO = "unsloth/Qwen3.8-27B-GGUF"
DEFAULT_FILE = "Qwen3.8-27B-Q4_K_M.gguf"
DEFAULT_QUANT = "Q4_K_M"  # what `REPO` alone picks when the repo has no DEFAULT_FILE
DISK_MARGIN_BYTES = 256 << 20  # kept free beyond the download: logs, sidecars, filesystem reserve
_CHUNK = 1 << 20
_TIMEOUT_S = 60  # per socket operation, not for the whole download
_ATTEMPTS = 5  # connections per file within one run before giving up (the .part stays for the next run)
_RETRY_SLEEP_S = 1.0  # first back-off between attempts, doubling up to 10x
_LOCK_POLL_S = 1.0  # while another process holds a file: how often its progress is shown and a cancel is seen
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")

ProgressFn = Callable[[int, int], None]  # (done_bytes, total_bytes) over all files of one model


class DownloadError(OpenJetError):
    """The model cannot be found, fetched, verified or stored; the message says what to do."""


@dataclass(frozen=True)
class ModelSpec:
    """What the user asked for: a Hub file (`repo`, `filename`; None = pick the default) or a local file."""

    repo: str | None = None
    filename: str | None = None
    local: Path | None = None

    @classmethod
    def parse(cls, spec: str | os.PathLike | None) -> ModelSpec:
        """`REPO/FILE` (FILE may have folders), `REPO`, or a path; None or "" is the default model."""
        if spec is None or str(spec) == "":
            return cls(DEFAULT_REPO, DEFAULT_FILE)
        text = os.fspath(spec)
        path = Path(text).expanduser()
        looks_local = text.startswith(("/", "./", "../", "~", "\\", ".\\", "..\\")) or re.match(r"^[A-Za-z]:", text)
        if looks_local or path.exists():
            if not path.is_file():
                raise DownloadError(f"{path}: no such model file (for a Hugging Face model give REPO/FILE)")
            return cls(local=path)
        parts = text.strip("/").split("/")
        repo = "/".join(parts[:2])
        if len(parts) < 2 or not _REPO_ID.match(repo):
            raise DownloadError(f"{text!r} is neither a file nor a Hugging Face model: give REPO/FILE.gguf "
                                f"(e.g. {DEFAULT_REPO}/{DEFAULT_FILE}), REPO, or a path to a GGUF file")
        filename = "/".join(parts[2:]) or None
        if filename is not None and ".." in PurePosixPath(filename).parts:
            raise DownloadError(f"{text!r}: a file name inside a repo cannot contain '..'")
        if filename is None and repo == DEFAULT_REPO:
            filename = DEFAULT_FILE
        return cls(repo, filename)


@dataclass(frozen=True)
class RemoteFile:
    """One file as the Hub describes it at a pinned commit."""

    name: str  # path inside the repo
    size: int
    sha256: str


@dataclass(frozen=True)
class LocalModel:
    """Verified model file(s) on this machine. `path` is the only file, or the first part of a split GGUF."""

    path: Path
    parts: tuple[Path, ...]
    repo: str | None = None  # None for a local path given by the user
    commit: str | None = None


def ensure_model(spec: str | os.PathLike | None = None, *, models_dir: str | os.PathLike | None = None,
                 revision: str = "main", progress: ProgressFn | None = None,
                 show_progress: bool = True) -> LocalModel:
    """The model file(s) for `spec`, downloaded and verified when not already here.

    Honours HF_TOKEN (private and gated repos), HF_ENDPOINT (mirrors) and HF_HUB_OFFLINE=1 (no network:
    only files already in the models folder). `progress(done_bytes, total_bytes)` is called as bytes
    arrive (the tray's bar); `show_progress` draws a tqdm bar on a terminal.
    """
    model = ModelSpec.parse(spec)
    if model.local is not None:
        return LocalModel(path=model.local, parts=(model.local,))
    root = dirs.ensure_dir(dirs.models_dir(models_dir), _FOLDER_SETTING)
    if _offline():
        return _resolve_offline(model, root, reason="HF_HUB_OFFLINE is set")
    try:
        commit, remote = _remote_files(model, revision)
    except _NetworkError as e:  # no connection, or the Hub busy (429, 5xx)
        return _copy_here(model, root, e)
    folder = root / model.repo
    targets = [(f, folder / f.name) for f in remote]
    todo = [(f, dest) for f, dest in targets if not _is_current(dest, f)]
    if todo:
        try:
            _check_free_space(folder, todo)
        except DownloadError as e:  # the Hub's file was updated and two copies do not fit: the older version will do
            if not all(_read_json(_sidecar(dest)).get("sha256") and dest.is_file() for _, dest in targets):
                raise  # (not a file that failed its check, or one never verified)
            return _copy_here(model, root, e)
        _download_all(model.repo, commit, todo, progress, show_progress)
    for f, dest in targets:
        if _read_json(_sidecar(dest)).get("sha256") != f.sha256:  # verified by re-hashing, never recorded
            _keep_record(dest, lambda: _write_record(dest, model.repo, commit, f))
    paths = tuple(dest for _, dest in targets)
    return LocalModel(path=paths[0], parts=paths, repo=model.repo, commit=commit)


def _copy_here(model: ModelSpec, root: Path, why: DownloadError) -> LocalModel:
    """The copy of the model already in the models folder (as offline), where the Hub cannot give a newer one
    now (`why`, raised when there is none)."""
    try:
        local = _resolve_offline(model, root, reason="")
    except DownloadError:
        raise DownloadError(str(why)) from None
    log.warning("%s; using the copy verified earlier: %s", why, local.path)
    return local


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem that holds `path` (or its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists() and path.parent != path:
        path = path.parent
    return shutil.disk_usage(path).free


# ---- metadata (huggingface_hub) ---------------------------------------------------------------------


class _NetworkError(DownloadError):
    """The Hub could not be reached (no connection, DNS, proxy, timeout) or is busy (HTTP 429, 5xx)."""


def _endpoint() -> str:
    # huggingface_hub reads HF_ENDPOINT once at import; read it at call time so URL and metadata agree
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def _offline() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE")
    if value is None:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    return value.strip().lower() in ("1", "true", "yes", "on")


def _headers() -> dict[str, str]:
    from huggingface_hub.utils import build_hf_headers

    return build_hf_headers(library_name="openjet-launcher", library_version=__version__)  # + HF_TOKEN


def _remote_files(model: ModelSpec, revision: str) -> tuple[str, list[RemoteFile]]:
    """(commit, files) for the spec: the commit `revision` points at now, and the file or all split parts."""
    from huggingface_hub import HfApi

    endpoint = _endpoint()
    try:
        info = HfApi(endpoint=endpoint, library_name="openjet-launcher", library_version=__version__) \
            .model_info(model.repo, revision=revision, files_metadata=True)
    except Exception as e:  # huggingface_hub's errors, or its HTTP library's (httpx, httpx2, requests)
        raise _metadata_error(e, model.repo, revision, endpoint) from None
    lfs = {s.rfilename: s for s in info.siblings or []}
    names = _select_files(model, list(lfs), endpoint)
    files = []
    for name in names:
        sib = lfs[name]
        if not sib.lfs:
            raise DownloadError(f"{model.repo}/{name} is not stored with Git LFS, so the Hub publishes no "
                                f"sha256 to verify it against; OpenJet only downloads LFS files")
        files.append(RemoteFile(name, int(sib.lfs["size"]), str(sib.lfs["sha256"]).lower()))
    return info.sha, files


def _select_files(model: ModelSpec, names: list[str], endpoint: str) -> list[str]:
    """The repo files the spec means: one file, or every part of a split GGUF."""
    ggufs = sorted(n for n in names if n.endswith(".gguf"))
    filename = model.filename
    if filename is None:
        picks = [n for n in ggufs if DEFAULT_QUANT.lower() in n.lower() and "mmproj" not in n.lower()
                 and (not _SPLIT.match(n) or _SPLIT.match(n)["index"] == "00001")]
        if len(picks) != 1:
            raise DownloadError(f"{model.repo}: say which file to use, as {model.repo}/FILE.gguf; "
                                f"its GGUF files: {_listing(ggufs)}")
        filename = picks[0]
    parts = _split_parts(filename)
    if parts is None and filename not in names:
        # `X.gguf` may be published as X-00001-of-0000M.gguf, ...
        firsts = [n for n in ggufs if (m := _SPLIT.match(n)) and m["index"] == "00001"
                  and m["stem"] == filename.removesuffix(".gguf")]
        parts = _split_parts(firsts[0]) if len(firsts) == 1 else None
    parts = parts or [filename]
    missing = [p for p in parts if p not in names]
    if missing:
        raise DownloadError(f"{endpoint}/{model.repo} has no file {missing[0]}: check the repo and file name "
                            f"(its GGUF files: {_listing(ggufs)})")
    return parts


def _split_parts(name: str) -> list[str] | None:
    m = _SPLIT.match(name)
    if not m:
        return None
    count = int(m["count"])
    return [f"{m['stem']}-{i:05d}-of-{m['count']}.gguf" for i in range(1, count + 1)]


def _listing(names: list[str], limit: int = 12) -> str:
    if not names:
        return "none"
    more = f", ... ({len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _metadata_error(e: Exception, repo: str, revision: str, endpoint: str) -> DownloadError:
    from huggingface_hub import errors as hf

    where = f"{endpoint}/{repo}"
    if isinstance(e, hf.GatedRepoError):
        return DownloadError(f"{where} is gated: accept its terms on that page, then set HF_TOKEN to an access "
                             f"token of that account (https://huggingface.co/settings/tokens)")
    if isinstance(e, hf.RevisionNotFoundError):
        return DownloadError(f"{where} has no revision {revision!r}")
    status = getattr(getattr(e, "response", None), "status_code", None)
    if isinstance(e, hf.RepositoryNotFoundError) or status in (401, 403, 404):
        return DownloadError(f"{where}: repository not found or not accessible (HTTP {status}). Check the repo "
                             f"name; for a private or gated repo set HF_TOKEN to a token with access")
    if isinstance(e, hf.HfHubHTTPError) and (status == 429 or (status or 0) >= 500):  # busy: a copy here will do
        return _NetworkError(f"{where}: Hugging Face answered HTTP {status}; try again later, or set "
                             f"HF_HUB_OFFLINE=1 to use a model already downloaded ({_first_line(e)})")
    if isinstance(e, hf.HfHubHTTPError):
        return DownloadError(f"{where}: Hugging Face answered HTTP {status}; try again later ({_first_line(e)})")
    if isinstance(e, hf.OfflineModeIsEnabled) or _is_transport_error(e):
        return _NetworkError(_network_hint(endpoint, e))
    return DownloadError(f"{where}: unexpected answer from Hugging Face ({type(e).__name__}: {_first_line(e)})")


def _is_transport_error(e: BaseException) -> bool:
    # httpx/httpx2 TransportError is no OSError; requests' ConnectionError is
    return isinstance(e, (OSError, TimeoutError)) or any(c.__name__ == "TransportError" for c in type(e).__mro__)


def _network_hint(endpoint: str, e: BaseException) -> str:
    return (f"cannot reach {endpoint} ({type(e).__name__}: {_first_line(e)}). Check the network connection "
            f"(and HTTPS_PROXY / HF_ENDPOINT); to use a model already downloaded, set HF_HUB_OFFLINE=1 "
            f"or pass the GGUF's path")


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0]


# ---- local files ------------------------------------------------------------------------------------


def _sidecar(dest: Path) -> Path:
    return dest.with_name(dest.name + ".openjet.json")


def _part(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


def _part_record(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part.json")


def _read_json(path: Path) -> dict:
    """The JSON object in `path`; {} where there is none (missing, unreadable, damaged, or not an object)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _fsync_folder(folder: Path) -> None:
    """A rename in `folder` made durable (POSIX; Windows has no folder handles to flush)."""
    if os.name != "posix":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: Path, data: dict) -> None:
    # a temporary name of its own: two launches recording one file at once each rename a whole record
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with contextlib.suppress(OSError, AttributeError):  # mkstemp's 0600 would hide it from a folder's other users
            os.fchmod(fd, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(data, indent=2) + "\n")
            fh.flush()
            os.fsync(fh.fileno())  # on disk before the rename: a power cut leaves the old record or the new, whole
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_folder(path.parent)


def _write_record(dest: Path, repo: str, commit: str | None, f: RemoteFile) -> None:
    st = dest.stat()
    _write_json(_sidecar(dest), {"repo": repo, "file": f.name, "commit": commit, "sha256": f.sha256,
                                 "size": f.size, "mtime_ns": st.st_mtime_ns})


def _bar_off(wanted: bool) -> bool | None:
    """tqdm's `disable`: None (a bar where stderr is a terminal) when one is wanted and there is a stderr at all; a
    desktop launch on Windows (pythonw) has none, and tqdm would write to None."""
    return None if wanted and sys.stderr is not None else True


def _sha256_file(path: Path, hasher=None, what: str | None = None):
    """The sha256 of `path`'s bytes (into `hasher`); `what`: a progress bar in a terminal so named (a 17 GB model
    takes a minute or more to read back)."""
    from tqdm.auto import tqdm

    hasher = hasher or hashlib.sha256()
    with open(path, "rb") as fh, tqdm(total=os.fstat(fh.fileno()).st_size, unit="B", unit_scale=True,
                                      unit_divisor=1024, desc=what, disable=_bar_off(bool(what))) as bar:
        while chunk := fh.read(_CHUNK):
            hasher.update(chunk)
            bar.update(len(chunk))
    return hasher


def _is_current(dest: Path, f: RemoteFile) -> bool:
    """Whether `dest` holds exactly `f`: trusted from its record while size and mtime are unchanged,
    re-hashed otherwise (and the record rewritten when the bytes are right)."""
    try:
        st = dest.stat()
    except FileNotFoundError:
        return False
    if st.st_size != f.size:
        return False
    rec = _read_json(_sidecar(dest))
    if rec.get("sha256") == f.sha256 and rec.get("size") == st.st_size and rec.get("mtime_ns") == st.st_mtime_ns:
        return True
    log.info("checking %s (%s) against sha256 %s", dest, _size(st.st_size), f.sha256)
    if _sha256_file(dest, what=f"checking {dest.name}").hexdigest() != f.sha256:
        return False
    if rec.get("sha256") == f.sha256:
        _keep_record(dest, lambda: _write_json(_sidecar(dest), {**rec, "size": st.st_size, "mtime_ns": st.st_mtime_ns}))
    return True


def _keep_record(dest: Path, write: Callable[[], None]) -> None:
    """write() the verification record of dest, which the caller just verified; a read-only models folder only warns:
    the bytes are right, and the next run checks them again."""
    try:
        write()
    except OSError as e:
        log.warning("%s is verified, but its record could not be written (%s): it will be checked again next time",
                    dest, e.strerror or e)


def _resolve_offline(model: ModelSpec, root: Path, reason: str) -> LocalModel:
    """The model from the models folder alone: files with a record are re-checked if they changed;
    a file without one (copied in by hand) is used as it is, with a warning."""
    folder = root / model.repo
    why = f" ({reason})" if reason else ""
    filename = model.filename
    if filename is None:
        found = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.gguf")) if folder.is_dir() else []
        picks = [n for n in found if DEFAULT_QUANT.lower() in n.lower() and "mmproj" not in n.lower()
                 and (not _SPLIT.match(n) or _SPLIT.match(n)["index"] == "00001")]
        if len(picks) != 1:
            raise DownloadError(f"offline{why}: say which file of {model.repo} to use; in {folder}: {_listing(found)}")
        filename = picks[0]
    names = _split_parts(filename)
    if names is None and not (folder / filename).is_file():
        stem = filename.removesuffix(".gguf")
        firsts = sorted(folder.glob(f"{glob.escape(stem)}-00001-of-*.gguf")) if folder.is_dir() else []
        names = _split_parts(firsts[0].relative_to(folder).as_posix()) if len(firsts) == 1 else None
    names = names or [filename]
    paths, commit = [], None
    for name in names:
        dest = folder / name
        if not dest.is_file():
            partial = " (only a partial download is there: go online to finish it)" if _part(dest).exists() else ""
            raise DownloadError(f"offline{why} and {model.repo}/{name} is not in {folder}{partial}. Connect and "
                                f"run `openjet-launch download`, unset HF_HUB_OFFLINE, or pass the GGUF's path")
        rec = _read_json(_sidecar(dest))
        if not rec:
            log.warning("%s has no download record; using it unverified", dest)
        elif not _is_current(dest, RemoteFile(name, int(rec.get("size", -1)), str(rec.get("sha256")))):
            raise DownloadError(f"{dest} changed since it was verified (sha256 {rec.get('sha256')}, "
                                f"{_size(int(rec.get('size', 0)))}): delete it and download it again")
        commit = commit or rec.get("commit")
        paths.append(dest)
    return LocalModel(path=paths[0], parts=tuple(paths), repo=model.repo, commit=commit)


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"


def _part_bytes(dest: Path, f: RemoteFile) -> int:
    """Bytes of a .part that can be resumed toward `f` (0 when it belongs to another version)."""
    part = _part(dest)
    if not part.exists() or _read_json(_part_record(dest)).get("sha256") != f.sha256:
        return 0
    n = part.stat().st_size
    return n if n <= f.size else 0


def _check_free_space(folder: Path, todo: list[tuple[RemoteFile, Path]]) -> None:
    still = sum(f.size - _part_bytes(dest, f) for f, dest in todo)
    need = still + DISK_MARGIN_BYTES
    free = free_bytes(folder)
    if free < need:
        raise DownloadError(f"not enough disk space in {folder}: the download needs {_size(need)} "
                            f"({_size(still)} still to fetch + {_size(DISK_MARGIN_BYTES)} margin) but only "
                            f"{_size(free)} are free. Free some space, or choose another folder with "
                            f"{_FOLDER_SETTING}")


# ---- bytes (our HTTP) -------------------------------------------------------------------------------


class _Interrupted(Exception):
    """The transfer stopped early for a reason worth a retry (connection dropped, timeout, 5xx)."""


class _RedirectHandler(urllib.request.HTTPRedirectHandler):
    """Follow the Hub's redirect to its CDN without sending the token to another host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urlsplit(newurl).netloc != urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


def _open(req: urllib.request.Request):
    # built per request so proxy settings (HTTPS_PROXY, NO_PROXY) are read when we connect
    return urllib.request.build_opener(_RedirectHandler).open(req, timeout=_TIMEOUT_S)


class _PartFile:
    """FILE.part with the running sha256 of its bytes."""

    def __init__(self, dest: Path, f: RemoteFile):
        self.path, self.record, self.file = _part(dest), _part_record(dest), f
        self.have = _part_bytes(dest, f)
        if self.have == 0:
            self.path.unlink(missing_ok=True)
        _write_json(self.record, {"sha256": f.sha256, "size": f.size})
        self.hasher = hashlib.sha256()
        if self.have:
            log.info("resuming %s at %s of %s", dest.name, _size(self.have), _size(f.size))
            _sha256_file(self.path, self.hasher, what=f"reading back {self.path.name}")

    def restart(self) -> int:
        """Drop everything fetched so far (the server ignored Range); returns the bytes dropped."""
        dropped, self.have, self.hasher = self.have, 0, hashlib.sha256()
        self.path.write_bytes(b"")
        return dropped

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)
        self.record.unlink(missing_ok=True)


def _download_all(repo: str, commit: str, todo: list[tuple[RemoteFile, Path]], progress: ProgressFn | None,
                  show_progress: bool) -> None:
    from huggingface_hub import hf_hub_url
    from tqdm.auto import tqdm

    endpoint, headers = _endpoint(), _headers()
    total = sum(f.size for f, _ in todo)
    done = sum(_part_bytes(dest, f) for f, dest in todo)
    bar = tqdm(total=total, initial=done, unit="B", unit_scale=True, unit_divisor=1024,
               desc=todo[0][1].name if len(todo) == 1 else f"{repo} ({len(todo)} files)",
               disable=_bar_off(show_progress))

    def advance(n: int) -> None:
        nonlocal done
        done += n
        bar.update(n)
        if progress is not None:
            progress(done, total)

    if progress is not None:
        progress(done, total)
    started = {dest: _part_bytes(dest, f) for f, dest in todo}  # what `done` counted of each

    def counted(f: RemoteFile, dest: Path, now: int) -> None:
        """`done` moved to `now` bytes of this file (another process may have grown or dropped its .part)."""
        advance(now - started[dest])
        started[dest] = now

    try:
        for f, dest in todo:
            try:
                dest.parent.mkdir(parents=True, exist_ok=True)
                # While another process holds the file, its .part's growth is shown, and a cancel (the progress
                # callback raising) ends the wait.
                with _file_lock(dest, waiting=lambda f=f, dest=dest: counted(f, dest, _part_bytes(dest, f))):
                    if _is_current(dest, f):  # another process finished it while this one waited
                        counted(f, dest, f.size)
                        continue
                    counted(f, dest, _part_bytes(dest, f))  # where this process resumes
                    url = hf_hub_url(repo, f.name, revision=commit, endpoint=endpoint)  # pinned: parts of one commit
                    _download_one(url, headers, repo, commit, f, dest, advance)
            except OSError as e:  # the models folder: read-only, full, or not ours (network errors are not OSErrors
                # here: _fetch turns them into retries or a DownloadError)
                raise DownloadError(f"cannot write {e.filename or dest}: {e.strerror or e}. Free some space or fix "
                                    f"the folder's permissions, or choose another folder with {_FOLDER_SETTING}"
                                    ) from None
    finally:
        bar.close()


@contextlib.contextmanager
def _file_lock(dest: Path, waiting: Callable[[], None] = lambda: None):
    """.locks/FILE.lock held while FILE is fetched, checked and renamed: two processes sharing a models folder (a download in
    one terminal, a launch in another) would otherwise both append to one FILE.part, each checking the hash of its own
    stream, and hand over a file of mixed bytes as verified. The second waits, then finds the file done; `waiting` is
    called about once a second meanwhile (an exception from it ends the wait)."""
    from filelock import FileLock, Timeout

    locks = dest.parent / ".locks"  # (as huggingface_hub's cache keeps them: beside the files, out of sight)
    locks.mkdir(exist_ok=True)
    lock = FileLock(str(locks / (dest.name + ".lock")))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.warning("another process is downloading %s into %s; waiting for it to finish", dest.name, dest.parent)
        while True:
            waiting()
            try:
                lock.acquire(timeout=_LOCK_POLL_S)
                break
            except Timeout:
                pass
    try:
        yield
    finally:
        lock.release()


def _download_one(url: str, headers: dict[str, str], repo: str, commit: str, f: RemoteFile, dest: Path,
                  advance: Callable[[int], None]) -> None:
    """FILE.part brought to its full size, checked against the Hub's sha256 (of the stream, and the size on disk),
    made durable, renamed to FILE and recorded."""
    part = _PartFile(dest, f)
    _fetch(url, headers, part, advance)
    digest, on_disk = part.hasher.hexdigest(), part.path.stat().st_size
    if digest != f.sha256 or on_disk != f.size:
        part.discard()
        raise DownloadError(f"{repo}/{f.name}: downloaded bytes do not match the Hub's checksum (expected sha256 "
                            f"{f.sha256} over {f.size} bytes, got {digest} over {on_disk}). The partial file was "
                            f"deleted; run again to download it afresh")
    with open(part.path, "rb+") as fh:
        os.fsync(fh.fileno())  # the bytes on disk before the name says they are complete
    os.replace(part.path, dest)
    _fsync_folder(dest.parent)
    part.record.unlink(missing_ok=True)
    _write_record(dest, repo, commit, f)


def _fetch(url: str, headers: dict[str, str], part: _PartFile, advance: Callable[[int], None]) -> None:
    """Bring `part` to its full size, resuming with Range; retries a dropped connection a few times in a row (a
    connection that brought bytes starts the count again)."""
    size = part.file.size
    failures = 0
    while part.have < size:
        before = part.have
        try:
            _fetch_once(url, headers, part, advance)
            return
        except _Interrupted as e:
            failures = 1 if part.have > before else failures + 1
            if failures == _ATTEMPTS:
                raise DownloadError(f"download of {urlsplit(url).path} stopped at {_size(part.have)} of "
                                    f"{_size(size)}: {e}. Run the same command again to resume") from None
            log.warning("download interrupted at %s (%s); resuming", _size(part.have), e)
            time.sleep(min(2 ** (failures - 1), 10) * _RETRY_SLEEP_S)


def _fetch_once(url: str, headers: dict[str, str], part: _PartFile, advance: Callable[[int], None]) -> None:
    size = part.file.size
    req = urllib.request.Request(url, headers=dict(headers))
    if part.have:
        req.add_header("Range", f"bytes={part.have}-")
    try:
        resp = _open(req)
    except urllib.error.HTTPError as e:
        raise _http_error(e, url) from None
    except (OSError, http.client.HTTPException) as e:  # URLError, refused, reset, timeout
        if isinstance(e, urllib.error.URLError) and not isinstance(e.reason, (OSError, TimeoutError)):
            raise DownloadError(f"cannot download {url}: {e}") from None
        raise _Interrupted(f"{type(e).__name__}: {e}") from None
    with resp:
        if part.have and resp.status == 200:
            # Only a body that is the whole file replaces the bytes kept (not, say, a proxy's error page).
            length = resp.headers.get("Content-Length")
            if length is None or not length.isdigit() or int(length) != size:
                raise _Interrupted(f"the server answered a range request with HTTP 200 and {length or 'no'} "
                                   f"Content-Length, not the file's {size} bytes")
            log.warning("server ignored Range; downloading %s from the start", part.path.name)
            advance(-part.restart())
        elif part.have and resp.status == 206:
            start = re.match(r"bytes (\d+)-", resp.headers.get("Content-Range", ""))
            if not start or int(start[1]) != part.have:
                raise _Interrupted(f"server answered range {resp.headers.get('Content-Range')!r} "
                                   f"for bytes={part.have}-")
        with open(part.path, "ab") as fh:
            while True:
                try:
                    chunk = resp.read(_CHUNK)
                except (OSError, http.client.HTTPException) as e:  # IncompleteRead, reset, timeout mid-body
                    raise _Interrupted(f"{type(e).__name__}: {e}") from None
                if not chunk:
                    break
                if part.have + len(chunk) > size:
                    raise DownloadError(f"{url} sent more than the {size} bytes the Hub lists; "
                                        f"the file changed on the server: run again")
                try:
                    fh.write(chunk)
                except OSError as e:  # our disk, not the network
                    raise DownloadError(f"cannot write {part.path}: {e.strerror or e}") from None
                part.hasher.update(chunk)
                part.have += len(chunk)
                advance(len(chunk))
    if part.have < size:
        raise _Interrupted(f"connection closed at {part.have} of {size} bytes")


def _http_error(e: urllib.error.HTTPError, url: str) -> Exception:
    if e.code in (401, 403):
        return DownloadError(f"{url}: HTTP {e.code}, access denied. Set HF_TOKEN to a Hugging Face token with "
                             f"access to this repo (and accept its terms on the Hub if it is gated)")
    if e.code == 404:
        return DownloadError(f"{url}: HTTP 404, not found. Check the repo and file name")
    if e.code == 416:  # the server has fewer bytes than the Hub lists: retrying cannot help
        return DownloadError(f"{url}: HTTP 416, the server holds fewer bytes than Hugging Face lists for this "
                             f"file (a mirror out of step? check HF_ENDPOINT); the partial download is kept: run "
                             f"again later to resume it")
    if e.code == 429 or e.code >= 500:
        return _Interrupted(f"HTTP {e.code}")
    return DownloadError(f"{url}: HTTP {e.code} {e.reason}")


# ---- CLI --------------------------------------------------------------------------------------------


def add_download_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `openjet-launch download [MODEL] [--models-dir DIR]`."""
    d = subparsers.add_parser(
        "download", help="download the model GGUF from Hugging Face (resumes, verifies sha256)",
        description=f"Download a GGUF into the models folder, resuming an interrupted download and checking "
                    f"the Hub's sha256 before the file takes its name. MODEL is REPO/FILE.gguf, REPO, or a "
                    f"local path (default {DEFAULT_REPO}/{DEFAULT_FILE}). Honours HF_TOKEN, HF_ENDPOINT "
                    f"and HF_HUB_OFFLINE=1. Prints the path of each file.")
    d.add_argument("model", nargs="?", default=None, metavar="MODEL",
                   help=f"REPO/FILE.gguf, REPO or a path (default {DEFAULT_REPO}/{DEFAULT_FILE})")
    d.add_argument("--models-dir", metavar="DIR", default=None,
                   help="where models are kept (default $OPENJET_MODELS_DIR, else the user data folder: "
                        f"{dirs.models_dir()})")
    d.set_defaults(func=_cmd_download)
    return d


def _cmd_download(args: argparse.Namespace) -> int:
    model = ensure_model(args.model, models_dir=args.models_dir)
    for path in model.parts:
        print(path)
    return 0
