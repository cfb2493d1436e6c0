"""The launch before its server (launcher/preparation.py): the tray icon comes first and shows the download's
percent; Stop cancels the download (the .part resumes on Start); a failed preparation is shown, not lost.

Oracles: the fake Hub's bytes and byte counters (test_download), the fake server's /health (test_supervisor), and
the states and words a tray would show, read from the same TrayController the real tray draws from.
"""

from __future__ import annotations

import sys
import threading
import time

import pytest
from test_download import REPO, hub  # noqa: F401  (the fake Hub fixture)
from test_supervisor import FAKE, _default_args, _signal_handlers_restored, _until, free_port  # noqa: F401  (an autouse fixture)

from openjet_launcher.errors import OpenJetError
from openjet_launcher.launcher import main, tray
from openjet_launcher.launcher.download import ensure_model
from openjet_launcher.launcher.menu import STOP, TrayController
from openjet_launcher.launcher.preparation import PREPARING, LaunchSession, PreparationCancelled, progress_message
from openjet_launcher.launcher.supervisor import FAILED, LOADING, READY, STOPPED
from openjet_launcher.server.cli import demo_model_path

NAME = "tiny-Q4_K_M.gguf"


class FakeSupervisor:
    def __init__(self, plan):
        self.plan, self.state, self.message, self.proc = plan, STOPPED, "", None
        self._cbs = []

    def on_state(self, fn):
        self._cbs.append(fn)

    def start(self):
        self.state, self.message = LOADING, "starting the server"
        for fn in self._cbs:
            fn(self.state, self.message)

    def stop(self):
        self.state = STOPPED


def _session(prepare, tmp_path) -> tuple[LaunchSession, list[tuple[str, str]]]:
    session = LaunchSession(prepare, FakeSupervisor, log_dir=tmp_path / "logs")
    seen: list[tuple[str, str]] = []
    session.on_state(lambda s, m: seen.append((s, m)))
    return session, seen


def test_the_session_shows_whole_percents_then_hands_over_to_the_server(tmp_path):
    def prepare(progress):
        for done in range(0, 1001):  # a thousand chunks of one 1 GB file: 101 distinct percents
            progress(done * 1_000_000, 1_000_000_000)
        return "the plan"
    session, seen = _session(prepare, tmp_path)
    session.start()
    assert _until(lambda: session.supervisor is not None and session.state == LOADING)
    messages = [m for s, m in seen if s == LOADING]
    assert messages[0] == PREPARING
    assert messages[1:-1] == [progress_message(p * 10_000_000, 1_000_000_000) for p in range(101)]
    assert messages[-1] == "starting the server"  # the server's own states now come through
    assert messages[2] == "downloading the model: 1% (10 MB of 1.0 GB)"
    assert messages[-2] == "downloading the model: 100% (1.0 GB of 1.0 GB)"
    assert session.supervisor.plan == "the plan" and session.failure_title == "OpenJet server failed"


def test_stop_cancels_the_download_which_resumes_on_start(hub, tmp_path):  # noqa: F811
    size = 3_000_000
    hub.repos[REPO] = {NAME: bytes(range(256)) * (size // 256) + b"x" * (size % 256)}
    first_chunk = threading.Event()

    def prepare(progress):
        def slow_after_the_first_chunk(done, total):
            progress(done, total)
            if done > 0 and not first_chunk.is_set():
                first_chunk.set()
                time.sleep(0.5)  # the stop lands here; the next chunk's progress raises
        return ensure_model(f"{REPO}/{NAME}", progress=slow_after_the_first_chunk, show_progress=False)

    session, seen = _session(prepare, tmp_path)
    session.start()
    assert first_chunk.wait(20)
    session.stop()
    assert session.state == STOPPED and session.supervisor is None and not session.preparing
    dest = tmp_path / "models" / REPO / NAME
    part = dest.with_name(NAME + ".part")
    assert not dest.exists() and 0 < part.stat().st_size < size
    have = part.stat().st_size
    assert hub.repos[REPO][NAME][:have] == part.read_bytes()

    session.start()  # again: the .part is resumed, not fetched afresh
    assert _until(lambda: session.supervisor is not None)
    model = session.supervisor.plan
    assert model.path == dest and dest.read_bytes() == hub.repos[REPO][NAME]
    assert hub.ranges[-1] == (NAME, have)


def test_a_failed_preparation_is_shown_and_start_tries_again(tmp_path):
    attempts = []

    def prepare(progress):
        attempts.append(1)
        if len(attempts) == 1:
            raise OpenJetError("not enough disk space in /models: the download needs 17.2 GB\nmore detail")
        return "the plan"
    session, seen = _session(prepare, tmp_path)
    controller = TrayController(session, model="m.gguf", gpu="GPU 0", host="127.0.0.1", port=8080,
                                log_dir=tmp_path / "logs")
    session.start()
    assert _until(lambda: session.state == FAILED)
    assert controller.notification() == ("OpenJet could not start: not enough disk space in /models: the download "
                                         f"needs 17.2 GB Logs: {tmp_path / 'logs'}")
    assert controller.entries()[2].label == "Start server"
    session.stop()  # Quit after a failure: the failure stays what the session says
    assert session.state == FAILED
    controller.activate("start")
    assert _until(lambda: session.supervisor is not None) and len(attempts) == 2


def test_a_bug_in_the_preparation_fails_the_session_instead_of_leaving_it_amber(tmp_path):
    session, seen = _session(lambda progress: {}["missing"], tmp_path)
    session.start()
    assert _until(lambda: session.state == FAILED)
    assert seen[-1] == (FAILED, "KeyError: 'missing'")


def test_the_progress_callback_raises_once_stopped(tmp_path):
    """The cancel reaches the download as an exception from its progress callback, which the download code does
    not catch (it catches OSError and its own errors only)."""
    assert not issubclass(PreparationCancelled, OSError)
    raised = []

    def prepare(progress):
        progress(0, 10)
        session.stop_requested.wait(10)
        try:
            progress(1, 10)
        except PreparationCancelled:
            raised.append(1)
            raise
        return "the plan"
    session, _ = _session(prepare, tmp_path)
    session.stop_requested = threading.Event()
    session.start()
    assert _until(lambda: session.message.startswith("downloading"))
    stopper = threading.Thread(target=session.stop)
    stopper.start()
    assert _until(lambda: session.state != LOADING)
    session.stop_requested.set()
    stopper.join(10)
    assert raised == [1] and session.supervisor is None and session.state == STOPPED


# --- the launcher, tray first ------------------------------------------------------------------------------


class FakeTray:
    """Stands in for tray.Tray: records what the icon would show at each change; quits when `until` says so."""

    made: list[FakeTray] = []

    def __init__(self, controller: TrayController):
        self.controller = controller
        self.shown: list[tuple[str, str, str]] = []
        self.lock = threading.Lock()
        controller.on_change(self.refresh)
        FakeTray.made.append(self)

    def refresh(self) -> None:
        c = self.controller
        with self.lock:
            self.shown.append((c.state, c.status_line(), c.entries()[2].label))
            if FakeTray.until(c):
                c.quit_requested.set()

    def run(self) -> None:
        self.refresh()
        self.controller.quit_requested.wait(60)


@pytest.fixture
def fake_desktop(monkeypatch, tmp_path):
    FakeTray.made = []
    FakeTray.until = staticmethod(lambda c: c.state == READY)
    monkeypatch.setattr(tray, "tray_unavailable_reason", lambda: None)
    monkeypatch.setattr(tray, "Tray", FakeTray)
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE)
    monkeypatch.setattr(main, "SERVE_PREFIX", [sys.executable, str(script)])
    monkeypatch.setenv("OPENJET_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("OPENJET_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setattr(main, "_stderr_is_terminal", lambda: False)  # launched from the desktop
    return FakeTray


def test_a_first_launch_shows_the_icon_and_the_downloads_percent_before_the_server(hub, fake_desktop):  # noqa: F811
    hub.repos[REPO] = {NAME: demo_model_path().read_bytes()}  # a real GGUF the reference engine's checks accept
    code = main.run_default(_default_args("--model", f"{REPO}/{NAME}", "--engine", "reference", "--port", str(free_port())))
    assert code == 0
    [t] = fake_desktop.made
    states = [s for s, _, _ in t.shown]
    lines = [line for _, line, _ in t.shown]
    assert lines[0].startswith(f"{NAME} · CPU (reference engine) · port ") and lines[0].endswith(PREPARING)
    downloading = [i for i, line in enumerate(lines) if "downloading the model: " in line]
    size = len(hub.repos[REPO][NAME])
    assert downloading and lines[downloading[-1]].endswith(progress_message(size, size))
    assert all(t.shown[i][2] == "Cancel download" for i in downloading)
    assert READY in states and states.index(READY) > downloading[-1]
    assert t.shown[states.index(READY)][2] == "Stop server" and states[-1] == STOPPED  # Quit stopped the server
    assert (main.dirs.models_dir() / REPO / NAME).read_bytes() == hub.repos[REPO][NAME]


def test_a_preparation_failure_from_the_desktop_stays_red_until_quit(fake_desktop, monkeypatch, capsys):
    def no_gpu(args, progress=None):
        raise OpenJetError("no NVIDIA GPU found")
    monkeypatch.setattr(main, "plan_launch", no_gpu)
    notices = []
    fake_desktop.until = staticmethod(lambda c: c.state == FAILED and not notices.append(c.notification()))
    assert main.run_default(_default_args("--port", str(free_port()))) == 1
    assert notices and notices[0].startswith("OpenJet could not start: no NVIDIA GPU found Logs: ")
    assert "error: no NVIDIA GPU found" in capsys.readouterr().err


def test_a_preparation_failure_on_a_terminal_ends_the_launcher(fake_desktop, monkeypatch, capsys):
    def no_gpu(args, progress=None):
        raise OpenJetError("no NVIDIA GPU found")
    monkeypatch.setattr(main, "plan_launch", no_gpu)
    monkeypatch.setattr(main, "_stderr_is_terminal", lambda: True)
    fake_desktop.until = staticmethod(lambda c: False)  # nobody clicks Quit
    t0 = time.monotonic()
    assert main.run_default(_default_args("--port", str(free_port()))) == 1
    assert time.monotonic() - t0 < 30
    assert "error: no NVIDIA GPU found" in capsys.readouterr().err


def test_quit_during_the_download_cancels_it_and_keeps_the_part(hub, fake_desktop, monkeypatch):  # noqa: F811
    hub.repos[REPO] = {NAME: demo_model_path().read_bytes()}
    real = main.plan_launch

    def slow_plan(args, progress=None):
        def slow(done, total):
            progress(done, total)
            time.sleep(0.05)  # ~20 chunks a second: the quit lands mid-download
        return real(args, slow)
    monkeypatch.setattr(main, "plan_launch", slow_plan)
    # Quit as soon as the download is under way (past its first percent)
    fake_desktop.until = staticmethod(lambda c: c.supervisor.message.startswith("downloading the model: ") and
                                      not c.supervisor.message.startswith("downloading the model: 0%"))
    code = main.run_default(_default_args("--model", f"{REPO}/{NAME}", "--engine", "reference", "--port", str(free_port())))
    assert code == 0
    dest = main.dirs.models_dir() / REPO / NAME
    part = dest.with_name(NAME + ".part")
    assert not dest.exists() and part.exists() and part.stat().st_size < len(hub.repos[REPO][NAME])
    assert part.read_bytes() == hub.repos[REPO][NAME][:part.stat().st_size]


def test_a_cancel_that_outlasts_its_wait_stays_stopping_and_a_later_failure_is_not_shown(tmp_path):
    """A preparation blocked where it cannot see the cancel (a network read, re-hashing a file) outlives stop()'s
    wait: the session stays STOPPING (its Start disabled, not silently ignored) until the thread ends, and what the
    thread then raises is not a failure the user is told of: they cancelled."""
    release = threading.Event()

    def prepare(progress):
        progress(0, 10)
        release.wait(10)                      # blocked: the cancel is not seen here
        raise OpenJetError("connection reset")
    session, seen = _session(prepare, tmp_path)
    session.cancel_wait_s = 0.1
    session.start()
    assert _until(lambda: session.message.startswith("downloading"))
    session.stop()
    assert session.state == "stopping" and session.preparing
    controller = TrayController(session, model="m", gpu="g", host="127.0.0.1", port=8080, log_dir=tmp_path)
    assert not controller.entries()[2].enabled           # Start waits for the thread
    release.set()
    assert _until(lambda: not session.preparing)
    assert session.state == STOPPED and FAILED not in [s for s, _ in seen]
    session.start()                                      # and a new start prepares again
    assert _until(lambda: session.state == FAILED)       # (this prepare fails at once: not cancelled now)


def test_a_server_log_it_cannot_open_fails_the_session_instead_of_leaving_it_amber(tmp_path):
    """make_supervisor opens the server log; a root-owned one (an earlier sudo run) raises PermissionError, which used
    to end the preparation thread silently with the icon amber and a terminal launcher waiting for ever."""
    def make_supervisor(plan):
        raise PermissionError(13, "Permission denied", str(tmp_path / "server.log"))
    session = LaunchSession(lambda progress: "plan", make_supervisor, log_dir=tmp_path)
    session.start()
    assert _until(lambda: session.state == FAILED)
    assert "PermissionError" in session.message and "server.log" in session.message


def test_a_download_without_a_stderr_works(hub, monkeypatch):  # noqa: F811
    """A desktop launch on Windows (pythonw) has sys.stderr None: tqdm's bar would write to it and fail the download."""
    hub.repos[REPO] = {NAME: b"x" * 300_000}
    monkeypatch.setattr(sys, "stderr", None)
    model = ensure_model(f"{REPO}/{NAME}", progress=lambda done, total: None)   # show_progress left at its default
    assert model.path.read_bytes() == hub.repos[REPO][NAME]


class StubIcon:
    """pystray's Icon as its platform backends (win32, gtk, appindicator, darwin) behave: stop() does nothing until
    the loop runs, and the loop runs until stop()."""
    HAS_MENU = True

    def __init__(self, name, icon, title, menu=None):
        self.icon, self.title, self.visible = icon, title, False
        self._running, self._stopped = False, threading.Event()

    def update_menu(self):
        pass

    def stop(self):
        if self._running:
            self._stopped.set()

    def run(self, setup=None):
        time.sleep(0.3)                       # the backend's window and loop set-up
        self._running = True
        threading.Thread(target=setup, args=(self,), daemon=True).start()
        self._stopped.wait()


def test_a_preparation_that_fails_before_the_tray_loop_runs_still_ends_the_launcher(monkeypatch, tmp_path, capsys):
    """`--ctx 8` fails the plan at once, before the icon's loop runs; on a terminal that quits the tray, whose stop()
    the backend ignores until its loop is up: the quit now waits for the loop (it hung for good on Windows / macOS /
    GTK, where nothing else ends the loop)."""
    import types

    pytest.importorskip("PIL")
    stub = types.SimpleNamespace(Icon=StubIcon, MenuItem=lambda *a, **k: None,
                                 Menu=type("Menu", (), {"__init__": lambda self, f: None, "SEPARATOR": None}))
    monkeypatch.setitem(sys.modules, "pystray", stub)
    monkeypatch.setattr(tray, "tray_unavailable_reason", lambda: None)
    monkeypatch.setattr(main, "_stderr_is_terminal", lambda: True)
    monkeypatch.setenv("OPENJET_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("OPENJET_LOG_DIR", str(tmp_path / "logs"))
    out = []
    t = threading.Thread(target=lambda: out.append(main.run_default(_default_args("--ctx", "8", "--port", str(free_port())))),
                         daemon=True)
    t.start()
    t.join(20)
    assert out == [1], "the launcher was still running 20 s after its preparation failed"
    assert "--ctx 8 is too small" in capsys.readouterr().err


def test_stop_while_another_process_holds_the_download_ends_the_wait(hub, tmp_path, monkeypatch):  # noqa: F811
    """A desktop launch waiting for a terminal's download of the same file: Stop ends the wait within about a second
    (the session stayed "cancelling the download", Start disabled, until the other download ended)."""
    from filelock import FileLock

    from openjet_launcher.launcher import download
    monkeypatch.setattr(download, "_LOCK_POLL_S", 0.05)
    hub.repos[REPO] = {NAME: b"x" * 50_000}
    folder = download.dirs.models_dir() / REPO
    (folder / ".locks").mkdir(parents=True)
    other = FileLock(str(folder / ".locks" / (NAME + ".lock")))
    other.acquire()
    try:
        session, seen = _session(lambda p: ensure_model(f"{REPO}/{NAME}", progress=p, show_progress=False), tmp_path)
        session.start()
        assert _until(lambda: any("downloading the model" in m for _, m in seen))
        session.stop()
        assert session.state == STOPPED and not session.preparing
    finally:
        other.release()
