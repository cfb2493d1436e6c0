"""The server as a supervised child process, and the lock that keeps one launcher per user.

Life of a `Supervisor` (one monitor thread; every state change goes to the `on_state` callbacks):

    stopped --start()--> loading --/health 200--> ready
                            |                       |
                            +---- child exits ------+--> backoff, loading again (at most `max_restarts`
                            |                              quick crashes in a row) --> failed
                            +---- health timeout --------> failed (a model that loads too slowly is not
                            |                                      retried: the next try would be as slow)
                            +---- exit EXIT_LOAD_FAILED -> failed (the model cannot load: no retry either)
    any --stop()--> stopping --> stopped  (SIGTERM / CTRL_BREAK, then kill after `stop_timeout_s`)

A child that stayed ready for `stable_after_s` and then crashed starts a fresh restart budget: only a
crash loop gives up. The child's stdout and stderr go, line by line, to `server.log` in the log folder
(rotated, `log_files` kept); the last lines are kept in memory for the failure message.
"""

from __future__ import annotations

import argparse
import collections
import errno
import json
import logging
import logging.handlers
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ..errors import EXIT_LOAD_FAILED, OpenJetError

STOPPED, LOADING, READY, STOPPING, FAILED = "stopped", "loading", "ready", "stopping", "failed"
STATES = (STOPPED, LOADING, READY, STOPPING, FAILED)

StateFn = Callable[[str, str], None]  # (state, message)


class AlreadyRunning(OpenJetError):
    """Another openjet-launch holds the instance lock; `info` is its lock record (pid, host, port, ...)."""

    def __init__(self, message: str, info: dict):
        super().__init__(message)
        self.info = info


def serve_command(model: str | os.PathLike, *, engine: str = "reference", host: str = "127.0.0.1",
                  port: int = 8080, ctx: int | None = None, extra: Sequence[str] = (),
                  prefix: Sequence[str] | None = None) -> list[str]:
    """`openjet-launch serve MODEL ...` as a child command line (this Python, so the same install).

    The API key is not an argument here: it goes through OPENJET_API_KEY so it never shows in `ps`.
    """
    cmd = list(prefix) if prefix else [sys.executable, "-m", "openjet_launcher", "serve"]
    cmd += [os.fspath(model), "--engine", engine, "--host", host, "--port", str(port)]
    if ctx is not None:
        cmd += ["--ctx", str(ctx)]
    return cmd + list(extra)


EVERY_ADDRESS = ("0.0.0.0", "", "::")  # --host values that listen on every address of the machine


def local_netloc(host: str, port: int) -> str:
    """host:port as a client on this machine writes it in a URL: a server listening on every address is reached on
    loopback, an IPv6 address goes in brackets."""
    if host in EVERY_ADDRESS:  # IPv6's every address on IPv6's loopback: where "::" is IPv6-only (Windows' default),
        host = "::1" if host == "::" else "127.0.0.1"  # 127.0.0.1 never reaches it
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def health_url(host: str, port: int) -> str:
    """Where the launcher asks."""
    return f"http://{local_netloc(host, port)}/health"


def port_number(text: str) -> int:
    """argparse type of --port: 1..65535 (0 would mean "any free port", which no client could find)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1..65535)") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number: choose 1..65535")
    return port


def _bind_error(host: str, port: int) -> OSError | None:
    """What binding (host, port) raises now, as the server would bind it; None when it works."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as uvicorn binds
    with socket.socket(family, socket.SOCK_STREAM) as s:
        if sys.platform != "win32":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e
    return None


def bind_problem(host: str, port: int) -> str | None:
    """None when the server could listen on (host, port), else why not, in words a user can act on."""
    e = _bind_error(host, port)
    where = "127.0.0.1: this machine only; 0.0.0.0: every network"
    if e is None:
        return None
    if isinstance(e, socket.gaierror):
        return f"--host {host}: not an address of this machine, nor a name it can resolve ({where})"
    if e.errno == errno.EADDRINUSE:
        return (f"port {port} on {host} is already in use by another program: choose another with --port "
                f"(e.g. --port {port % 65535 + 1})")
    if e.errno == errno.EADDRNOTAVAIL:
        return f"--host {host}: this machine has no such address ({where})"
    if e.errno == errno.EACCES:
        return f"port {port}: permission denied (ports below 1024 need administrator rights)"
    return f"cannot listen on {host} port {port}: {e.strerror or e}"


PARENT_PID_ENV = "OPENJET_PARENT_PID"  # set for a server the supervisor starts: die_with_parent's parent


def die_with_parent() -> None:
    """In a server the supervisor started (PARENT_PID_ENV set), on Linux: ask for SIGTERM when the launcher's
    thread that started it ends (PR_SET_PDEATHSIG; the monitor thread ends its child before it exits, so this
    fires only when the launcher dies without stopping it: SIGKILL, a crash), and end at once if the launcher is
    already gone. Asked by the child itself: a preexec_fn would run Python between fork and exec, which can
    deadlock with the launcher's other threads."""
    parent = os.environ.get(PARENT_PID_ENV)
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != int(parent):
        raise SystemExit("the launcher that started this server is gone")


def _ending_with_us(command: list[str]) -> list[str]:
    """On Linux, `command` run through orphan_guard, which asks the kernel to end it when the launcher dies (as `serve`
    asks itself: die_with_parent) and then becomes it; elsewhere, or where the program is not found (Popen then says
    so at once), as it is."""
    exe = shutil.which(command[0]) if command and sys.platform.startswith("linux") else None
    return [sys.executable, "-m", "openjet_launcher.launcher.orphan_guard", exe, *command[1:]] if exe else command


def _log_handler(log_dir: Path, log_files: int, max_bytes: int) -> logging.Handler:
    log_dir.mkdir(parents=True, exist_ok=True)
    h = logging.handlers.RotatingFileHandler(log_dir / "server.log", maxBytes=max_bytes,
                                             backupCount=max(log_files - 1, 0), encoding="utf-8")
    h.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    return h


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Supervisor:
    """Runs `command` as a child, watches `health_url`, restarts it after crashes, stops it on request."""

    def __init__(self, command: Sequence[str], health_url: str, *, log_dir: str | os.PathLike,
                 env: dict[str, str] | None = None, health_timeout_s: float = 900.0, max_restarts: int = 3,
                 backoff_s: float = 1.0, backoff_max_s: float = 30.0, stable_after_s: float = 60.0,
                 stop_timeout_s: float = 15.0, poll_s: float = 0.25, log_files: int = 5,
                 log_max_bytes: int = 10 << 20, tail_lines: int = 40, echo: TextIO | None = None):
        self.command = list(command)
        self.health_url = health_url
        self.log_dir = Path(log_dir)
        self.env = env
        self.health_timeout_s = health_timeout_s
        self.max_restarts = max_restarts
        self.backoff_s, self.backoff_max_s = backoff_s, backoff_max_s
        self.stable_after_s = stable_after_s
        self.stop_timeout_s = stop_timeout_s
        self.poll_s = poll_s
        self.echo = echo  # the child's lines also go here (e.g. sys.stderr with --no-tray --verbose)
        self.state, self.message = STOPPED, ""
        self.restarts = 0         # restarts in the current crash streak
        self.starts = 0           # children launched since construction
        self.proc: subprocess.Popen | None = None
        self._stop_timeout_now = stop_timeout_s
        self._tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self._callbacks: list[StateFn] = []
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._log = logging.getLogger(f"openjet.supervisor.{id(self)}")
        self._log.propagate = False
        self._log.setLevel(logging.INFO)
        self._log.addHandler(_log_handler(self.log_dir, log_files, log_max_bytes))

    # --- observers -------------------------------------------------------------------------------

    def on_state(self, fn: StateFn) -> None:
        self._callbacks.append(fn)

    def _set(self, state: str, message: str = "") -> None:
        with self._lock:
            self.state, self.message = state, message
        self._log.info("[supervisor] %s%s", state, f": {message}" if message else "")
        for fn in list(self._callbacks):
            try:
                fn(state, message)
            except Exception:  # an observer's bug must not kill the monitor thread
                self._log.exception("[supervisor] state callback failed")

    def tail(self, n: int | None = None) -> list[str]:
        lines = list(self._tail)
        return lines if n is None else lines[-n:]

    @property
    def log_path(self) -> Path:
        return self.log_dir / "server.log"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --- control ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Launch the child and watch it (returns at once; the state goes loading, then ready)."""
        with self._lock:  # callbacks run outside the lock: an observer may call back into start/stop
            if self.running:
                return
            self._stop.clear()
            self._stop_timeout_now = self.stop_timeout_s
            self.restarts = 0
            self.state, self.message = LOADING, "starting the server"
            self._announced = threading.Event()  # the monitor's states come after this LOADING
            self._finished = threading.Event()   # set by the monitor thread once its child is gone
            self._thread = threading.Thread(target=self._monitor, args=(self._announced,), name="openjet-supervisor",
                                            daemon=True)
            self._thread.start()
        self._set(LOADING, "starting the server")
        self._announced.set()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop gracefully, then forcefully after `timeout_s`; returns once the child is gone."""
        with self._lock:
            thread = self._thread
            if thread is None or not thread.is_alive():
                if self.state in (STOPPED, FAILED):
                    return
                thread = None
            else:
                self._stop_timeout_now = self.stop_timeout_s if timeout_s is None else timeout_s
                self._stop.set()
        if thread is not None:
            self._set(STOPPING, "stopping the server")
            # The monitor thread ends the child on its way out. Waited on in slices, so that a signal another
            # thread received is seen here too, and on an event: an interrupted Thread.join() can mark a running
            # thread as ended.
            while True:
                try:
                    if self._finished.wait(0.2):
                        break
                except KeyboardInterrupt:  # Ctrl-C again: no more grace, but never leave the child running
                    self.kill()
            thread.join()
        self._set(STOPPED)

    def kill(self) -> None:
        """End the child now (SIGKILL); a stop() in progress then returns at once."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()

    def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Block until ready (True) or failed/stopped/timeout (False)."""
        done = threading.Event()

        def watch(state: str, _: str) -> None:
            if state in (READY, FAILED, STOPPED):
                done.set()
        self.on_state(watch)
        try:
            if self.state in (READY, FAILED, STOPPED):
                return self.state == READY
            done.wait(timeout_s)
            return self.state == READY
        finally:
            self._callbacks.remove(watch)

    # --- the monitor thread ----------------------------------------------------------------------

    def _spawn(self) -> subprocess.Popen:
        kwargs: dict = {}
        if sys.platform == "win32":  # CTRL_BREAK_EVENT reaches only a child in its own process group
            kwargs["creationflags"] = subprocess.CREATE_NEW_PROCESS_GROUP
        else:
            kwargs["start_new_session"] = True  # Ctrl-C in the terminal reaches the launcher, which stops the child
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env[PARENT_PID_ENV] = str(os.getpid())  # (die_with_parent: the server ends if the launcher dies)
        self.starts += 1
        self._log.info("[supervisor] start #%d: %s", self.starts, " ".join(self.command))
        proc = subprocess.Popen(_ending_with_us(self.command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, text=True, encoding="utf-8", errors="replace",
                                bufsize=1, **kwargs)
        self._pumper = threading.Thread(target=self._pump, args=(proc,), name="openjet-server-log", daemon=True)
        self._pumper.start()
        return proc

    def _drained(self) -> None:
        """Wait (a little) for the pump to read what an ended child printed last: the failure message quotes it (a
        traceback or `error: ...` printed just before exiting was otherwise often not in the tail yet)."""
        pumper = getattr(self, "_pumper", None)
        if pumper is not None:
            pumper.join(timeout=2.0)

    def _pump(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\r\n")
            self._tail.append(line)
            self._log.info("%s", line)
            if self.echo is not None:
                print(line, file=self.echo, flush=True)

    def _healthy(self) -> bool:
        try:  # never through a proxy (http_proxy, the system's): a proxy cannot reach our loopback server
            with _DIRECT.open(self.health_url, timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def _wait_health(self, proc: subprocess.Popen) -> str:
        """'ready', 'exited', 'timeout' or 'stopped'."""
        t0 = time.monotonic()
        while not self._stop.is_set():
            if proc.poll() is not None:
                return "exited"
            if self._healthy():
                return "ready"
            if time.monotonic() - t0 > self.health_timeout_s:
                return "timeout"
            self._stop.wait(self.poll_s)
        return "stopped"

    def _failure(self, what: str) -> str:
        lines = [line for line in self.tail(12) if line.strip()]
        text = f"{what}. Log: {self.log_path}"
        return text + ("\nLast lines of the server's output:\n  " + "\n  ".join(lines) if lines else "")

    def _monitor(self, announced: threading.Event) -> None:
        announced.wait()
        try:
            self._run_children()
        finally:
            self._terminate(self.proc, self._stop_timeout_now)
            self._finished.set()

    def _run_children(self) -> None:
        while not self._stop.is_set():
            self._tail.clear()
            try:
                proc = self.proc = self._spawn()
            except OSError as e:
                self._set(FAILED, f"could not start the server ({' '.join(self.command[:4])} ...): {e}")
                return
            outcome = self._wait_health(proc)
            if outcome == "stopped":
                return
            if outcome == "timeout":
                self._terminate(proc, self.stop_timeout_s)
                self._drained()
                self._set(FAILED, self._failure(f"the server did not answer /health within "
                                                f"{self.health_timeout_s:g} s"))
                return
            ready_at = None
            if outcome == "ready":
                ready_at = time.monotonic()
                self._set(READY, "serving")
                # only the process's exit counts as a crash: a busy server may be slow to answer /health
                while proc.poll() is None and not self._stop.is_set():
                    self._stop.wait(self.poll_s)
                if self._stop.is_set():
                    return
            code = proc.wait()
            self._drained()
            if code == EXIT_LOAD_FAILED:  # `serve` could not load the model: another start would fail the same way
                said = [line.split("error: ", 1)[1] for line in self.tail() if "error: " in line]
                self._set(FAILED, f"{said[-1] if said else 'the model failed to load'}. Log: {self.log_path}")
                return
            if ready_at is not None and time.monotonic() - ready_at >= self.stable_after_s:
                self.restarts = 0  # a crash after a long healthy run is not a crash loop
            if self.restarts >= self.max_restarts:
                self._set(FAILED, self._failure(
                    f"the server exited (code {code}) {self.restarts + 1} times in a row; gave up"))
                return
            delay = min(self.backoff_s * (2 ** self.restarts), self.backoff_max_s)
            self.restarts += 1
            self._set(LOADING, f"the server exited (code {code}); restart {self.restarts} of "
                               f"{self.max_restarts} in {delay:g} s")
            if self._stop.wait(delay):
                return

    @staticmethod
    def _terminate(proc: subprocess.Popen | None, timeout_s: float) -> None:
        if proc is None or proc.poll() is not None:
            return
        try:
            if sys.platform == "win32":
                proc.send_signal(signal.CTRL_BREAK_EVENT)
            else:
                proc.send_signal(signal.SIGTERM)
        except OSError:
            pass
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- the terminal's view -------------------------------------------------------------------------------


class TerminalStatus:
    """One status line on a terminal (rewritten in place, with the seconds spent loading); plain lines
    when the output is a file or a pipe. Use as a Supervisor `on_state` callback."""

    def __init__(self, label: str, url: str, stream: TextIO | None = None):
        self.label, self.url = label, url
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._since = time.monotonic()
        self._state = STOPPED
        self._message = ""
        self._ticker: threading.Thread | None = None
        self._closed = threading.Event()

    def line(self, state: str, message: str = "") -> str:
        if state == LOADING:
            secs = int(time.monotonic() - self._since)
            what = message if message and message != "starting the server" else "loading the model"
            return f"[openjet] {self.label}: {what} ... {secs} s"
        if state == READY:
            return f"[openjet] {self.label}: ready at {self.url} (Ctrl-C stops)"
        if state == FAILED:
            return f"[openjet] {self.label}: FAILED: {message}"
        return f"[openjet] {self.label}: {state}"

    def __call__(self, state: str, message: str) -> None:
        if state != self._state and state == LOADING and self._state != LOADING:
            self._since = time.monotonic()
        self._state, self._message = state, message
        if self.tty:
            text = self.line(state, message)
            first, _, rest = text.partition("\n")
            self.stream.write("\r\x1b[K" + first + ("\n" + rest + "\n" if rest else ""))
            if state in (READY, FAILED, STOPPED):
                self.stream.write("\n" if not rest else "")
            self.stream.flush()
            if state == LOADING and self._ticker is None:
                self._ticker = threading.Thread(target=self._tick, daemon=True)
                self._ticker.start()
        else:
            print(self.line(state, message), file=self.stream, flush=True)

    def _tick(self) -> None:
        while not self._closed.wait(1.0):
            if self._state == LOADING:
                self.stream.write("\r\x1b[K" + self.line(LOADING, self._message))
                self.stream.flush()

    def close(self) -> None:
        self._closed.set()


# --- one launcher per user -----------------------------------------------------------------------------


@dataclass
class InstanceLock:
    """One launcher per user (per config folder): an OS lock (filelock: fcntl / msvcrt) on PATH.held, taken for the
    process's life and dropped by the kernel when the process ends, however it ends; PATH holds the record {pid,
    hostname, host, port, url, started} that a second launcher reports. A record left by a launcher that died is
    overwritten: no pid is trusted (a pid is reused after a reboot, so a record naming a live pid used to refuse
    every later launch), and two launchers racing for a stale record cannot both win."""

    path: Path
    host: str
    port: int
    held: bool = False

    def record(self) -> dict:
        return {"pid": os.getpid(), "hostname": socket.gethostname(), "host": self.host, "port": self.port,
                "url": health_url(self.host, self.port).removesuffix("/health") + "/v1", "started": time.time()}

    def read(self) -> dict | None:
        try:
            info = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return info if isinstance(info, dict) else None

    def acquire(self) -> None:
        from filelock import FileLock, Timeout

        self.path.parent.mkdir(parents=True, exist_ok=True)
        os_lock = FileLock(str(self.path) + ".held")
        try:
            os_lock.acquire(timeout=0)
        except Timeout:
            info = self.read()
            for _ in range(10):  # the holder may be writing its record right now
                if info is not None:
                    break
                time.sleep(0.1)
                info = self.read()
            info = info or {}
            where = "" if info.get("hostname") in (None, socket.gethostname()) else f" on {info['hostname']}"
            raise AlreadyRunning(
                f"openjet-launch is already running (pid {info.get('pid', '?')}{where}) and serves at "
                f"{info.get('url') or info.get('host') or 'its port'}. Use that one, or quit it from its tray icon or "
                f"with Ctrl-C in its terminal.", info) from None
        try:
            tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.record()), encoding="utf-8")
            for attempt in range(20):
                try:
                    os.replace(tmp, self.path)
                    break
                except PermissionError:  # Windows: a refused launcher is reading the old record right now
                    if attempt == 19:
                        raise
                    time.sleep(0.05)
        except BaseException:
            os_lock.release()
            raise
        self._os_lock = os_lock
        self.held = True

    def release(self) -> None:
        if self.held:
            info = self.read()
            if info and info.get("pid") == os.getpid():
                _unlink(self.path)
            self._os_lock.release()
            self.held = False

    def __enter__(self) -> InstanceLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
