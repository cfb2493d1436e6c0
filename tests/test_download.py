"""Model download against a fake Hugging Face Hub on 127.0.0.1 (HF_ENDPOINT points at it).

The fake answers what huggingface_hub's `model_info(files_metadata=True)` asks
(GET /api/models/{repo}[/revision/{rev}]) and serves file bytes on /{repo}/resolve/{rev}/{file}
(HEAD with ETag/X-Repo-Commit/X-Linked-Size, GET with Range -> 206), counting every byte it sends.
The oracle for every file is the bytes the fake holds and their hashlib sha256.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

import pytest

from openjet_launcher.errors import OpenJetError
from openjet_launcher.launcher import download
from openjet_launcher.launcher.download import DownloadError, ensure_model

REPO = "acme/Tiny-GGUF"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def blob(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


@dataclass
class FakeHub:
    """In-memory repos {repo: {file: bytes}} with failure knobs and byte counters."""

    repos: dict[str, dict[str, bytes]] = field(default_factory=dict)
    port: int = 0
    sent: dict[str, int] = field(default_factory=dict)  # file -> body bytes sent
    ranges: list[tuple[str, int]] = field(default_factory=list)  # (file, first byte) per GET
    drop_at: dict[str, int] = field(default_factory=dict)  # file -> close the connection at this offset (once)
    tamper: set[str] = field(default_factory=set)  # files served with one byte flipped
    token: str | None = None  # when set, only requests bearing it are answered
    auth_seen: list[str | None] = field(default_factory=list)
    cdn_auth_seen: list[str | None] = field(default_factory=list)
    redirect_to_cdn: bool = False  # resolve answers 302 to http://localhost:PORT/cdn/... (another host)
    ignore_range: bool = False  # answer 200 with the whole file even to a Range request
    api_calls: int = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def sha256(self, repo: str, name: str) -> str:
        return hashlib.sha256(self.repos[repo][name]).hexdigest()


def make_handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def _json(self, code: int, body, error_code: str | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if error_code:
                self.send_header("X-Error-Code", error_code)
            self.end_headers()
            self.wfile.write(data)

        def _authorised(self) -> bool:
            auth = self.headers.get("Authorization")
            hub.auth_seen.append(auth)
            if hub.token and auth != f"Bearer {hub.token}":
                self._json(401, {"error": "Invalid credentials"}, "RepoNotFound")
                return False
            return True

        def _model_info(self, repo: str, rev: str) -> None:
            hub.api_calls += 1
            if repo not in hub.repos:
                return self._json(401 if not hub.token else 404, {"error": "Repository not found"}, "RepoNotFound")
            if rev not in ("main", COMMIT):
                return self._json(404, {"error": "Invalid rev id"}, "RevisionNotFound")
            siblings = [{"rfilename": name, "size": len(data), "blobId": hashlib.sha1(data).hexdigest(),
                         "lfs": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "pointerSize": 134}}
                        for name, data in hub.repos[repo].items()]
            self._json(200, {"id": repo, "modelId": repo, "sha": COMMIT, "private": False, "siblings": siblings})

        def _file(self, head: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            m = re.match(r"^/cdn/([^/]+/[^/]+)/([^/]+)/(.+)$", path) or \
                re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
            if not m:
                return self._json(404, {"error": "no route"})
            repo, rev, name = m.groups()
            if path.startswith("/cdn/"):  # the signed CDN URL needs no token
                hub.cdn_auth_seen.append(self.headers.get("Authorization"))
            elif not self._authorised():
                return
            elif hub.redirect_to_cdn and not head:
                self.send_response(302)
                self.send_header("Location", f"http://localhost:{hub.port}/cdn/{repo}/{rev}/{name}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if repo not in hub.repos or name not in hub.repos[repo] or rev not in ("main", COMMIT):
                return self._json(404, {"error": "Entry not found"}, "EntryNotFound")
            data = hub.repos[repo][name]
            if name in hub.tamper:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            start = 0
            rng = None if hub.ignore_range else self.headers.get("Range")
            if rng:
                start = int(re.match(r"bytes=(\d+)-$", rng)[1])
            body = data[start:]
            self.send_response(206 if rng else 200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("X-Linked-Size", str(len(data)))
            if rng:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if head:
                return
            hub.ranges.append((name, start))
            stop = hub.drop_at.pop(name, None)
            if stop is not None and stop > start:
                body, self.close_connection = body[: stop - start], True
            hub.sent[name] = hub.sent.get(name, 0) + len(body)  # before write: the client may finish first
            self.wfile.write(body)

        def do_HEAD(self):
            self._file(head=True)

        def do_GET(self):
            path = urlsplit(self.path).path
            m = re.match(r"^/api/models/([^/]+/[^/]+?)(?:/revision/([^/]+))?$", path)
            if m:
                if self._authorised():
                    self._model_info(m[1], unquote(m[2] or "main"))
                return
            self._file(head=False)

    return Handler


@pytest.fixture
def hub(monkeypatch, tmp_path):
    from huggingface_hub import constants

    fake = FakeHub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(fake))
    server.daemon_threads = True
    fake.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", fake.endpoint)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setenv("OPENJET_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setattr(download, "_RETRY_SLEEP_S", 0.0)
    yield fake
    server.shutdown()
    server.server_close()


def get(spec=f"{REPO}/tiny-Q4_K_M.gguf", **kw):
    return ensure_model(spec, show_progress=False, **kw)


def interrupted(hub, monkeypatch, name: str, data: bytes, cut: int, match: str | None = None) -> None:
    """A run of `get` whose one connection drops after `cut` bytes of `data` (hub's file `name`): its .part stays."""
    hub.repos[REPO] = {name: data}
    hub.drop_at[name] = cut
    monkeypatch.setattr(download, "_ATTEMPTS", 1)
    with pytest.raises(DownloadError, match=match):
        get()


def test_fresh_download_equals_served_bytes_and_records_verification(hub, tmp_path):
    hub.repos[REPO] = {"tiny-Q4_K_M.gguf": blob(300_000, 1), "README.md": b"hi"}
    calls = []
    model = get(progress=lambda done, total: calls.append((done, total)))
    assert model.path == tmp_path / "models" / REPO / "tiny-Q4_K_M.gguf"
    assert model.path.read_bytes() == hub.repos[REPO]["tiny-Q4_K_M.gguf"]
    assert model.commit == COMMIT and model.parts == (model.path,)
    assert not model.path.with_name("tiny-Q4_K_M.gguf.part").exists()
    record = json.loads(model.path.with_name("tiny-Q4_K_M.gguf.openjet.json").read_text())
    assert record["sha256"] == hub.sha256(REPO, "tiny-Q4_K_M.gguf") and record["commit"] == COMMIT
    assert record["size"] == 300_000 and record["repo"] == REPO
    assert calls[-1] == (300_000, 300_000) and [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_repo_alone_picks_the_q4_k_m_file(hub):
    hub.repos[REPO] = {"tiny-Q8_0.gguf": blob(1000, 2), "tiny-Q4_K_M.gguf": blob(1000, 3),
                       "mmproj-tiny-Q4_K_M.gguf": blob(10, 4)}
    assert get(REPO).path.name == "tiny-Q4_K_M.gguf"


def test_second_run_trusts_the_record_without_fetching_or_rehashing(hub, monkeypatch):
    hub.repos[REPO] = {"tiny-Q4_K_M.gguf": blob(200_000, 5)}
    get()
    sent = dict(hub.sent)
    monkeypatch.setattr(download, "_sha256_file", lambda *a: pytest.fail("re-hashed an unchanged file"))
    assert get().path.read_bytes() == hub.repos[REPO]["tiny-Q4_K_M.gguf"]
    assert hub.sent == sent


def test_changed_file_is_rehashed_and_replaced_when_wrong(hub):
    hub.repos[REPO] = {"tiny-Q4_K_M.gguf": blob(200_000, 6)}
    path = get().path
    data = bytearray(path.read_bytes())
    data[1000] ^= 1
    path.write_bytes(bytes(data))  # same size, new mtime, wrong bytes
    assert get().path.read_bytes() == hub.repos[REPO]["tiny-Q4_K_M.gguf"]
    assert hub.sent["tiny-Q4_K_M.gguf"] == 2 * 200_000


def test_interrupted_download_resumes_within_the_run_without_refetching(hub):
    size, cut = 400_000, 150_000
    hub.repos[REPO] = {"tiny-Q4_K_M.gguf": blob(size, 7)}
    hub.drop_at["tiny-Q4_K_M.gguf"] = cut
    model = get()
    assert model.path.read_bytes() == hub.repos[REPO]["tiny-Q4_K_M.gguf"]
    assert hub.ranges == [("tiny-Q4_K_M.gguf", 0), ("tiny-Q4_K_M.gguf", cut)]
    assert hub.sent["tiny-Q4_K_M.gguf"] == size  # the first 150 KB crossed the wire once


def test_interrupted_download_resumes_in_a_later_run(hub, monkeypatch):
    size, cut = 400_000, 200_000
    name = "tiny-Q4_K_M.gguf"
    interrupted(hub, monkeypatch, name, blob(size, 8), cut, match="Run the same command again to resume")
    dest = download.dirs.models_dir() / REPO / name
    assert not dest.exists()
    assert dest.with_name(name + ".part").read_bytes() == hub.repos[REPO][name][:cut]
    model = get()  # a new run: re-hashes the .part, asks only for the rest
    assert model.path.read_bytes() == hub.repos[REPO][name]
    assert hub.ranges == [(name, 0), (name, cut)]
    assert hub.sent[name] == size
    assert not dest.with_name(name + ".part").exists() and not dest.with_name(name + ".part.json").exists()


def test_server_that_ignores_range_restarts_cleanly(hub):
    name = "tiny-Q4_K_M.gguf"
    hub.repos[REPO] = {name: blob(300_000, 15)}
    hub.drop_at[name] = 100_000
    hub.ignore_range = True
    assert get().path.read_bytes() == hub.repos[REPO][name]
    assert hub.sent[name] == 100_000 + 300_000


def test_redirect_to_another_host_keeps_range_and_drops_the_token(hub, monkeypatch):
    name = "tiny-Q4_K_M.gguf"
    hub.repos[REPO] = {name: blob(200_000, 16)}
    hub.token, hub.redirect_to_cdn = "hf_secret", True
    hub.drop_at[name] = 80_000
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    assert get().path.read_bytes() == hub.repos[REPO][name]
    assert hub.ranges == [(name, 0), (name, 80_000)] and hub.sent[name] == 200_000
    assert hub.cdn_auth_seen == [None, None]
    assert hub.auth_seen and set(hub.auth_seen) == {"Bearer hf_secret"}


def test_checksum_mismatch_is_refused_and_never_takes_the_final_name(hub):
    name = "tiny-Q4_K_M.gguf"
    hub.repos[REPO] = {name: blob(100_000, 9)}
    hub.tamper.add(name)
    with pytest.raises(DownloadError) as err:
        get()
    served = bytes([hub.repos[REPO][name][0] ^ 0xFF]) + hub.repos[REPO][name][1:]
    assert hub.sha256(REPO, name) in str(err.value)
    assert hashlib.sha256(served).hexdigest() in str(err.value)
    folder = download.dirs.models_dir() / REPO
    assert sorted(p.name for p in folder.iterdir()) == [".locks"]  # no final file, no .part, no record


def test_offline_uses_the_verified_file_without_network(hub, monkeypatch):
    hub.repos[REPO] = {"tiny-Q4_K_M.gguf": blob(50_000, 10)}
    online = get()
    calls = hub.api_calls
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = get()
    assert model.path == online.path and model.commit == COMMIT
    assert hub.api_calls == calls


def test_offline_without_the_file_is_a_clear_error(hub, monkeypatch):
    hub.repos[REPO] = {"tiny-Q4_K_M.gguf": blob(50_000, 11)}
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DownloadError, match=r"offline \(HF_HUB_OFFLINE is set\).*is not in"):
        get()
    assert hub.api_calls == 0 and hub.sent == {}


def test_offline_rechecks_a_file_changed_since_verification(hub, monkeypatch):
    hub.repos[REPO] = {"tiny-Q4_K_M.gguf": blob(50_000, 17)}
    path = get().path
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path.write_bytes(b"x" + path.read_bytes()[1:])
    with pytest.raises(DownloadError, match="changed since it was verified"):
        get()


def test_offline_uses_a_file_copied_in_by_hand(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    dest = download.dirs.models_dir() / REPO / "tiny-Q4_K_M.gguf"
    dest.parent.mkdir(parents=True)
    dest.write_bytes(b"GGUF")
    assert get().path == dest and get(REPO).path == dest


def test_unreachable_hub_falls_back_to_the_verified_copy_or_says_offline(hub, monkeypatch, tmp_path):
    hub.repos[REPO] = {"tiny-Q4_K_M.gguf": blob(50_000, 12)}
    path = get().path
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: connection refused
    assert get().path == path
    with pytest.raises(DownloadError, match="cannot reach.*HF_HUB_OFFLINE=1"):
        get(models_dir=tmp_path / "elsewhere")


def test_too_little_disk_is_refused_before_any_byte(hub, monkeypatch):
    hub.repos[REPO] = {"tiny-Q4_K_M.gguf": blob(300_000, 13)}
    monkeypatch.setattr(download, "free_bytes", lambda path: 1_000_000)
    with pytest.raises(DownloadError) as err:
        get()
    msg = str(err.value)
    assert "not enough disk space" in msg and "1.00 MB are free" in msg
    assert "300.00 KB still to fetch" in msg
    assert hub.sent == {} and hub.ranges == []


def test_disk_check_counts_only_what_the_part_lacks(hub, monkeypatch):
    name = "tiny-Q4_K_M.gguf"
    interrupted(hub, monkeypatch, name, blob(300_000, 14), 250_000)
    monkeypatch.setattr(download, "free_bytes", lambda path: download.DISK_MARGIN_BYTES + 50_000)
    assert get().path.read_bytes() == hub.repos[REPO][name]


def test_split_gguf_downloads_and_verifies_every_part(hub):
    parts = {f"Q8_0/tiny-Q8_0-0000{i}-of-00003.gguf": blob(70_000 + i, 20 + i) for i in (1, 2, 3)}
    hub.repos[REPO] = parts
    hub.drop_at["Q8_0/tiny-Q8_0-00002-of-00003.gguf"] = 30_000
    model = get(f"{REPO}/Q8_0/tiny-Q8_0.gguf")  # the unsplit name finds the parts
    assert [p.name for p in model.parts] == [n.split("/")[1] for n in parts]
    assert model.path == model.parts[0]
    for name, path in zip(parts, model.parts):
        assert path.read_bytes() == parts[name]
        assert json.loads(path.with_name(path.name + ".openjet.json").read_text())["sha256"] == \
            hashlib.sha256(parts[name]).hexdigest()
        assert hub.sent[name] == len(parts[name])
    assert get(f"{REPO}/Q8_0/tiny-Q8_0-00002-of-00003.gguf").parts == model.parts  # any part names them all


def test_split_gguf_with_one_part_corrupt_keeps_the_good_parts(hub):
    parts = {f"tiny-0000{i}-of-00002.gguf": blob(40_000, 30 + i) for i in (1, 2)}
    hub.repos[REPO] = parts
    hub.tamper.add("tiny-00002-of-00002.gguf")
    with pytest.raises(DownloadError, match="tiny-00002-of-00002.gguf.*do not match"):
        get(f"{REPO}/tiny-00001-of-00002.gguf")
    folder = download.dirs.models_dir() / REPO
    assert (folder / "tiny-00001-of-00002.gguf").read_bytes() == parts["tiny-00001-of-00002.gguf"]
    assert not (folder / "tiny-00002-of-00002.gguf").exists()


def test_hf_token_is_sent_and_its_absence_explained(hub, monkeypatch):
    hub.repos[REPO] = {"tiny-Q4_K_M.gguf": blob(10_000, 40)}
    hub.token = "hf_secret"
    with pytest.raises(DownloadError, match="HF_TOKEN"):
        get()
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    assert get().path.read_bytes() == hub.repos[REPO]["tiny-Q4_K_M.gguf"]


def test_unknown_repo_and_file_name_the_fix(hub):
    hub.repos[REPO] = {"tiny-Q4_K_M.gguf": blob(1000, 41)}
    with pytest.raises(DownloadError, match="repository not found.*Check the repo"):
        get("acme/Nope-GGUF/x.gguf")
    with pytest.raises(DownloadError, match="has no file nope.gguf.*tiny-Q4_K_M.gguf"):
        get(f"{REPO}/nope.gguf")


def test_local_path_is_used_as_is(tmp_path, hub):
    f = tmp_path / "mine.gguf"
    f.write_bytes(b"GGUF")
    assert get(str(f)).path == f and hub.api_calls == 0
    with pytest.raises(OpenJetError, match="no such model file"):
        get(str(tmp_path / "missing.gguf"))


def test_spec_parsing():
    parse = download.ModelSpec.parse
    assert parse(None) == parse("") == download.ModelSpec(download.DEFAULT_REPO, download.DEFAULT_FILE)
    assert parse(download.DEFAULT_REPO).filename == download.DEFAULT_FILE
    assert parse("a/b") == download.ModelSpec("a/b", None)
    assert parse("a/b/Q8_0/x.gguf") == download.ModelSpec("a/b", "Q8_0/x.gguf")
    with pytest.raises(DownloadError):
        parse("just-a-name")
    with pytest.raises(DownloadError):
        parse("a/b/../../etc/passwd")


def test_cli_download_prints_the_path(hub, capsys):
    import argparse

    hub.repos[REPO] = {"tiny-Q4_K_M.gguf": blob(5_000, 50)}
    parser = argparse.ArgumentParser()
    download.add_download_parser(parser.add_subparsers())
    args = parser.parse_args(["download", f"{REPO}/tiny-Q4_K_M.gguf"])
    assert args.func(args) == 0
    assert capsys.readouterr().out.strip().endswith("tiny-Q4_K_M.gguf")


def test_two_downloads_of_one_file_into_one_folder_never_hand_over_mixed_bytes(hub, monkeypatch):
    """`openjet-launch download` in one terminal and a launch in another (or two users of one OPENJET_MODELS_DIR):
    each used to append to the same FILE.part and check the hash of its own stream, so one was handed a file of
    mixed bytes as verified and the other crashed on its rename. Now the second waits on the file's lock, then finds
    the file done (threads here, each with its own lock and file handles, as two processes have)."""
    import time
    import traceback

    from openjet_launcher.launcher import download
    name = "tiny-Q4_K_M.gguf"
    data = blob(4 << 20, 99)
    hub.repos[REPO] = {name: data}
    monkeypatch.setattr(download, "_CHUNK", 64 << 10)
    real_open = download._open

    class Slow:  # 64 KiB every 5 ms: the second download starts while the first is under way
        def __init__(self, r):
            self.r, self.status, self.headers = r, r.status, r.headers

        def read(self, n):
            time.sleep(0.005)
            return self.r.read(n)

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.r.close()

    monkeypatch.setattr(download, "_open", lambda req: Slow(real_open(req)))
    results, errors = {}, {}

    def run(tag):
        try:
            results[tag] = ensure_model(f"{REPO}/{name}", show_progress=False).path
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors[tag] = "".join(traceback.format_exception_only(type(e), e)).strip()

    a = threading.Thread(target=run, args=("A",))
    a.start()
    part = download.dirs.models_dir() / REPO / (name + ".part")
    deadline = time.monotonic() + 20
    while not (part.exists() and part.stat().st_size > (1 << 20)) and time.monotonic() < deadline:
        time.sleep(0.01)
    b = threading.Thread(target=run, args=("B",))
    b.start()
    a.join(60)
    b.join(60)
    assert not errors and set(results) == {"A", "B"}, errors
    for tag, path in results.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest(), tag


def test_the_part_is_on_disk_before_it_takes_the_final_name(hub, monkeypatch):
    """A verified file's record is trusted later without re-hashing 17 GB: so the .part's bytes are fsynced before
    the rename that says they are complete (after a power cut the name could otherwise hold zeros of the right size)."""
    import os

    from openjet_launcher.launcher import download
    name = "tiny-Q4_K_M.gguf"
    hub.repos[REPO] = {name: blob(100_000, 3)}
    synced, order = set(), []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        synced.add(os.fstat(fd).st_ino)
        return real_fsync(fd)

    def replace(src, dst, *a, **k):
        if str(src).endswith(".part"):
            order.append(os.stat(src).st_ino in synced)
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(download.os, "fsync", fsync)
    monkeypatch.setattr(download.os, "replace", replace)
    ensure_model(f"{REPO}/{name}", show_progress=False)
    assert order == [True]


@pytest.fixture
def read_only_models(tmp_path, monkeypatch):
    """A models folder on a file system remounted read-only (needs mount rights: skipped without them)."""
    import subprocess
    mnt = tmp_path / "share"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1g", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    monkeypatch.setenv("OPENJET_MODELS_DIR", str(mnt))
    yield mnt
    subprocess.run(["umount", str(mnt)], capture_output=True)


def test_a_read_only_models_folder_is_a_clear_error_and_a_verified_file_there_is_used(hub, read_only_models, capsys):
    """Downloading into a read-only folder: one line naming the file and what to do (it was an OSError traceback);
    a file there that verifies (an admin's `cp -r` changed its mtime, so it is hashed again) is used, its record not
    rewritten (it crashed on that write)."""
    import json
    import subprocess

    from openjet_launcher import cli
    name = "tiny-Q4_K_M.gguf"
    hub.repos[REPO] = {name: blob(50_000, 2)}
    path = ensure_model(f"{REPO}/{name}", show_progress=False).path
    rec = path.with_name(name + ".openjet.json")
    r = json.loads(rec.read_text())
    r["mtime_ns"] += 1
    rec.write_text(json.dumps(r))
    hub.repos["org/other"] = {name: blob(50_000, 4)}
    subprocess.run(["mount", "-o", "remount,ro", str(read_only_models)], check=True)
    assert ensure_model(f"{REPO}/{name}", show_progress=False).path == path
    assert cli.main(["download", f"org/other/{name}"]) == 1
    err = capsys.readouterr().err
    assert str(read_only_models) in err and "OPENJET_MODELS_DIR" in err and "Traceback" not in err


def test_a_verified_file_copied_in_by_hand_is_used_where_its_record_cannot_be_written(hub, monkeypatch, capsys):
    """A correct GGUF placed in the models folder without its record, in a folder that refuses the record: the file is
    used and the download command succeeds (the OSError escaped as a traceback)."""
    import errno

    from openjet_launcher import cli
    name = "tiny-Q4_K_M.gguf"
    hub.repos[REPO] = {name: blob(50_000, 2)}
    dest = download.dirs.models_dir() / REPO / name
    dest.parent.mkdir(parents=True)
    dest.write_bytes(hub.repos[REPO][name])

    def refuse(path, data):
        raise OSError(errno.EROFS, "Read-only file system", str(path))
    monkeypatch.setattr(download, "_write_json", refuse)
    assert cli.main(["download", f"{REPO}/{name}"]) == 0
    assert capsys.readouterr().out.strip() == str(dest)
    assert hub.sent == {}  # hashed, not fetched


@pytest.mark.parametrize("record", ["null", "[]", '"x"'])
def test_a_record_that_is_not_an_object_is_checked_again(hub, record):
    """A damaged record (valid JSON, not an object) means "not verified": the file is hashed again, not a crash."""
    name = "tiny-Q4_K_M.gguf"
    hub.repos[REPO] = {name: blob(50_000, 3)}
    path = get().path
    path.with_name(name + ".openjet.json").write_text(record)
    assert get().path == path
    assert json.loads(path.with_name(name + ".openjet.json").read_text())["sha256"] == hub.sha256(REPO, name)
    assert hub.sent == {name: 50_000}


def test_a_busy_hub_falls_back_to_the_verified_copy(hub, monkeypatch, tmp_path):
    """HTTP 503 from the Hub's API: the copy verified earlier is used (it failed the launch until HF_HUB_OFFLINE=1);
    with no copy, one error that says to try later or go offline."""
    from http.server import BaseHTTPRequestHandler

    hub.repos[REPO] = {"tiny-Q4_K_M.gguf": blob(50_000, 5)}
    path = get().path

    class Busy(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
        assert get().path == path
        with pytest.raises(DownloadError, match="HTTP 503; try again later, or set HF_HUB_OFFLINE=1"):
            get(models_dir=tmp_path / "elsewhere")
    finally:
        server.shutdown()
        server.server_close()


def test_an_update_on_the_hub_that_does_not_fit_keeps_the_verified_copy(hub, monkeypatch):
    """The Hub's file changed (a re-upload) and the disk cannot hold a second copy: the verified one is used, with a
    warning, instead of failing the launch; with no copy the disk error stands (test_too_little_disk_...)."""
    name = "tiny-Q4_K_M.gguf"
    hub.repos[REPO] = {name: blob(50_000, 6)}
    old = get().path
    hub.repos[REPO] = {name: blob(60_000, 7)}
    monkeypatch.setattr(download, "free_bytes", lambda path: 1000)
    assert get().path == old and old.read_bytes() == blob(50_000, 6)


def test_an_update_that_does_not_fit_never_falls_back_to_a_file_that_failed_its_check(hub, monkeypatch):
    """Only a verified older version stands in when the update does not fit: a hand copy cut short (no record, its hash
    wrong) keeps the disk error (it was used, "verified earlier", and failed later as a broken GGUF)."""
    name = "tiny-Q4_K_M.gguf"
    hub.repos[REPO] = {name: blob(50_000, 6)}
    dest = download.dirs.models_dir() / REPO / name
    dest.parent.mkdir(parents=True)
    dest.write_bytes(hub.repos[REPO][name][:20_000])
    monkeypatch.setattr(download, "free_bytes", lambda path: 1000)
    with pytest.raises(DownloadError, match="not enough disk space"):
        get()


def test_records_are_readable_by_the_folders_other_users(hub):
    """A record written through a temporary file keeps the usual 0644 (mkstemp's 0600 would make every other user of a
    shared models folder re-hash the model and rewrite the record each launch)."""
    import os
    import stat
    name = "tiny-Q4_K_M.gguf"
    hub.repos[REPO] = {name: blob(50_000, 2)}
    path = get().path
    if os.name == "posix":
        assert stat.S_IMODE(path.with_name(name + ".openjet.json").stat().st_mode) == 0o644


def test_a_200_answer_to_a_range_request_that_is_not_the_file_keeps_the_part(hub, monkeypatch):
    """A resume answered 200 with a body other than the whole file (a proxy's error page): the .part is kept, not
    emptied; a 200 with the whole file restarts as before (test_server_that_ignores_range_restarts_cleanly)."""
    import io

    name = "tiny-Q4_K_M.gguf"
    interrupted(hub, monkeypatch, name, blob(100_000, 8), 60_000)
    part = download.dirs.models_dir() / REPO / (name + ".part")
    assert part.stat().st_size == 60_000

    class Page(io.BytesIO):
        status, headers = 200, {"Content-Length": "12"}

    monkeypatch.setattr(download, "_open", lambda req: Page(b"<html></html>"))
    with pytest.raises(DownloadError, match="HTTP 200 and 12 Content-Length"):
        get()
    assert part.read_bytes() == hub.repos[REPO][name][:60_000]


def test_http_416_is_one_clear_error_that_keeps_the_part(hub, monkeypatch):
    """A server holding fewer bytes than the Hub lists answers 416 to the resume: one error at once naming it (it was
    retried as a dropped connection and ended in "run again", which could never work), the .part kept."""
    import io
    import urllib.error

    name = "tiny-Q4_K_M.gguf"
    interrupted(hub, monkeypatch, name, blob(100_000, 9), 50_000)
    calls = []

    def short(req):
        calls.append(req.get_header("Range"))
        raise urllib.error.HTTPError(req.full_url, 416, "Range Not Satisfiable", {}, io.BytesIO(b""))
    monkeypatch.setattr(download, "_open", short)
    monkeypatch.setattr(download, "_ATTEMPTS", 5)
    with pytest.raises(DownloadError, match="HTTP 416.*HF_ENDPOINT.*kept"):
        get()
    assert calls == ["bytes=50000-"]
    assert (download.dirs.models_dir() / REPO / (name + ".part")).stat().st_size == 50_000


def test_connections_that_bring_bytes_do_not_use_up_the_attempts(hub, monkeypatch):
    """A flaky link that drops every connection after some progress still finishes: the attempts count failures in
    a row (all five were spent on the first five drops before)."""
    name = "tiny-Q4_K_M.gguf"
    data = blob(200_000, 10)
    hub.repos[REPO] = {name: data}
    real = download._fetch_once
    drops = iter(range(20_000, 200_000, 20_000))  # nine drops, each after 20 KB more

    def flaky(url, headers, part, advance):
        stop = next(drops, None)
        if stop is not None:
            hub.drop_at[name] = stop
        real(url, headers, part, advance)
    monkeypatch.setattr(download, "_fetch_once", flaky)
    assert get().path.read_bytes() == data
    assert len(hub.ranges) == 10


def test_progress_counts_what_another_process_left_in_the_part(hub, monkeypatch):
    """A second download that waited on the first (which stopped part way) resumes the .part the first left and
    reports its progress from there, ending at the total (it counted from the size it saw before the wait: 37%)."""
    from filelock import FileLock

    name = "tiny-Q4_K_M.gguf"
    data = blob(400_000, 11)
    hub.repos[REPO] = {name: data}
    monkeypatch.setattr(download, "_LOCK_POLL_S", 0.05)
    folder = download.dirs.models_dir() / REPO
    (folder / ".locks").mkdir(parents=True)
    other = FileLock(str(folder / ".locks" / (name + ".lock")))
    other.acquire()  # another process holds the file: the download below waits
    seen = []
    result = {}
    waiter = threading.Thread(target=lambda: result.update(path=get(progress=lambda d, t: seen.append((d, t)))))
    waiter.start()
    try:
        from test_supervisor import _until
        assert _until(lambda: seen)
        part = folder / (name + ".part")  # meanwhile "the other process" writes 300 KB and stops
        part.write_bytes(data[:300_000])
        download._write_json(folder / (name + ".part.json"), {"sha256": hub.sha256(REPO, name), "size": len(data)})
        assert _until(lambda: seen[-1][0] == 300_000)  # its growth is shown while waiting
    finally:
        other.release()
    waiter.join(30)
    assert result["path"].path.read_bytes() == data
    assert seen[-1] == (len(data), len(data)) and hub.ranges == [(name, 300_000)]

