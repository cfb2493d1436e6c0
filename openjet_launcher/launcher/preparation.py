"""The launch before its server exists (the GPU check, the model's download and check) made visible in the tray.

A first launch from the desktop downloads ~17 GB with no terminal to draw a bar; without this the tray icon came
only once the download was done. `LaunchSession` runs `prepare(progress)` (plan_launch with the download's
progress) on a thread, then builds the Supervisor with `make_supervisor(plan)` and starts it. To TrayController it
is that Supervisor all along (state, message, on_state, start, stop, log_dir, proc): amber with "downloading the
model: 42% (7.1 of 16.9 GB)" while it prepares, then the server's own states.

Stop while preparing cancels the download at its next chunk (the .part stays and the next start resumes it);
Start after a cancelled or failed preparation tries again (a network that is back, space freed).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from ..errors import OpenJetError
from .supervisor import FAILED, LOADING, STOPPED, STOPPING

PREPARING = "checking the GPU and the model file"
StateFn = Callable[[str, str], None]


class PreparationCancelled(Exception):
    """Raised from the download's progress callback when the preparation is stopped (not an OSError: the download
    code turns those into its own errors)."""


def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"


def progress_message(done: int, total: int) -> str:
    pct = int(100 * done / total) if total > 0 else 100
    return f"downloading the model: {pct}% ({_size(done)} of {_size(total)})"


class LaunchSession:
    """The preparation, then the server, behind one Supervisor-like face (see the module's docstring)."""

    # The join's bound when stopping a preparation: a download blocked in a read sees the cancel only when the read
    # returns (download._TIMEOUT_S); the thread is a daemon, so the launcher need not wait for it.
    cancel_wait_s = 2.0

    def __init__(self, prepare: Callable[[Callable[[int, int], None]], object],
                 make_supervisor: Callable[[object], object], *, log_dir: str | Path):
        self._prepare, self._make_supervisor = prepare, make_supervisor
        self.log_dir = Path(log_dir)
        self.supervisor = None
        self._state, self._message = STOPPED, ""
        self._callbacks: list[StateFn] = []
        self._lock = threading.RLock()
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._shown = -1  # the last percent told: observers hear of whole percents, not of every chunk

    # --- the Supervisor's face ------------------------------------------------------------------------------

    @property
    def state(self) -> str:
        sup = self.supervisor
        return sup.state if sup is not None else self._state

    @property
    def message(self) -> str:
        sup = self.supervisor
        return sup.message if sup is not None else self._message

    @property
    def stop_timeout_s(self) -> float:  # (launcher.main._stop_server's words: only once there is a server)
        sup = self.supervisor
        return sup.stop_timeout_s if sup is not None else 0.0

    @property
    def proc(self):
        sup = self.supervisor
        return sup.proc if sup is not None else None

    @property
    def failure_title(self) -> str:
        """The failure notification's first words: a preparation has no server yet to fail."""
        return "OpenJet server failed" if self.supervisor is not None else "OpenJet could not start"

    def on_state(self, fn: StateFn) -> None:
        self._callbacks.append(fn)

    def _tell(self, state: str, message: str) -> None:
        for fn in list(self._callbacks):
            try:
                fn(state, message)
            except Exception:  # an observer's bug must not end the preparation
                pass

    def _set(self, state: str, message: str = "") -> None:
        with self._lock:
            self._state, self._message = state, message
        self._tell(state, message)

    @property
    def preparing(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Prepare (again, after a failure or a stop), or start the server once prepared; returns at once."""
        with self._lock:
            sup = self.supervisor
            if sup is None:
                if self.preparing:
                    return
                self._cancel.clear()
                self._shown = -1
                self._state, self._message = LOADING, PREPARING
                self._thread = threading.Thread(target=self._run, name="openjet-prepare", daemon=True)
                self._thread.start()
        if sup is not None:
            sup.start()
        else:
            self._tell(LOADING, PREPARING)

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop the server, or cancel the preparation: waits up to cancel_wait_s for its thread, which says STOPPED
        when it ends (a read blocked on the network or a file being re-hashed sees the cancel only when it returns;
        until then the state stays STOPPING, whose Start is disabled)."""
        with self._lock:
            sup, thread = self.supervisor, self._thread
            self._cancel.set()  # seen by a preparation that ends after this (it then starts no server)
        if sup is not None:
            sup.stop(timeout_s) if timeout_s is not None else sup.stop()
            return
        if thread is not None and thread.is_alive():
            self._set(STOPPING, "cancelling the download")
            thread.join(self.cancel_wait_s)
        elif self._state not in (FAILED, STOPPED):
            self._set(STOPPED)

    # --- the preparation's thread -------------------------------------------------------------------------

    def _progress(self, done: int, total: int) -> None:
        if self._cancel.is_set():
            raise PreparationCancelled
        pct = int(100 * done / total) if total > 0 else 100
        if pct != self._shown:
            self._shown = pct
            self._set(LOADING, progress_message(done, total))

    def _run(self) -> None:
        try:
            plan = self._prepare(self._progress)
        except Exception as e:  # OpenJetError: what to do; anything else is a bug, shown, not an amber icon forever
            self._end(FAILED, _words(e))
            return
        failure = ""
        with self._lock:  # stop() either comes before (cancel seen here) or after (it stops the supervisor)
            if self._cancel.is_set():
                sup = None
            else:
                try:
                    sup = self._make_supervisor(plan)  # (opens the server log: a root-owned one raises OSError)
                except Exception as e:
                    failure = _words(e)
                    sup = None
                else:
                    self.supervisor = sup
                    sup.on_state(self._tell)
                    sup.start()
        if sup is None:
            self._end(FAILED, failure)

    def _end(self, state: str, message: str) -> None:
        """The preparation's last word: STOPPED when it was cancelled (whatever it then raised), else `state`."""
        if self._cancel.is_set():
            self._set(STOPPED)
        else:
            self._set(state, message)


def _words(e: Exception) -> str:
    return str(e) if isinstance(e, OpenJetError) else f"{type(e).__name__}: {e}"
