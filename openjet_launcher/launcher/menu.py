"""The tray's menu as data: what it shows and what each entry does, apart from pystray (no display needed).

`TrayController` holds the supervisor and the facts the status line shows; `entries()` is the menu for
the current state, `icon_colour()` the icon's colour, `notification()` the text shown when the server
fails. tray.py turns these into pystray objects and calls `controller.activate(action)` on a click; tests
call the same method.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import webbrowser
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .supervisor import FAILED, LOADING, READY, STOPPED, STOPPING, local_netloc

DEFAULT_CHAT_URL = "http://localhost:3000"  # Open WebUI's default port; `--chat-url` / $OPENJET_CHAT_URL

# RGB per state: grey stopped, amber loading, green ready, red failed.
STATE_COLOURS: dict[str, tuple[int, int, int]] = {
    STOPPED: (128, 128, 128),
    STOPPING: (128, 128, 128),
    LOADING: (235, 165, 0),
    READY: (40, 170, 70),
    FAILED: (210, 40, 40),
}

STATE_WORDS = {STOPPED: "stopped", STOPPING: "stopping", LOADING: "loading", READY: "ready", FAILED: "failed"}

# Actions: the stable names tray.py and tests pass to `activate`.
STATUS, START, STOP, COPY_URL, OPEN_CHAT, OPEN_LOGS, QUIT = (
    "status", "start", "stop", "copy_api_url", "open_chat", "open_logs", "quit")


@dataclass(frozen=True)
class MenuEntry:
    label: str
    action: str | None          # None: a separator
    enabled: bool = True
    default: bool = False       # what a left click on the icon does


SEPARATOR = MenuEntry("-", None, enabled=False)


def api_base_url(host: str, port: int) -> str:
    """The OpenAI base URL a client on this machine uses (a server on every address is reached on loopback)."""
    return f"http://{local_netloc(host, port)}/v1"


@dataclass
class Effects:
    """What the menu does to the desktop; tests replace these."""

    copy: Callable[[str], bool]
    open_url: Callable[[str], object]
    open_path: Callable[[Path], object]


def copy_to_clipboard(text: str) -> bool:
    """Through the platform's clipboard tool; False when none is installed."""
    if sys.platform == "win32":
        tools = [["clip"]]
    elif sys.platform == "darwin":
        tools = [["pbcopy"]]
    else:
        tools = [["wl-copy"]] if os.environ.get("WAYLAND_DISPLAY") else []
        tools += [["xclip", "-selection", "clipboard"], ["xsel", "--clipboard", "--input"]]
    for tool in tools:
        if shutil.which(tool[0]):
            try:
                subprocess.run(tool, input=text, text=True, timeout=5, check=True)
                return True
            except (OSError, subprocess.SubprocessError):
                continue
    return False


def open_path(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if sys.platform == "win32":
        os.startfile(path)  # type: ignore[attr-defined]
    else:
        subprocess.Popen(["open" if sys.platform == "darwin" else "xdg-open", str(path)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


DESKTOP = Effects(copy=copy_to_clipboard, open_url=webbrowser.open, open_path=open_path)


class TrayController:
    """The menu's state and actions over a Supervisor (or anything with start/stop/state/message/on_state)."""

    def __init__(self, supervisor, *, model: str, gpu: str, host: str, port: int, log_dir: Path,
                 chat_url: str | None = None, effects: Effects = DESKTOP, menu_supported: bool = True):
        self.supervisor = supervisor
        self.model, self.gpu, self.host, self.port = model, gpu, host, port
        self.log_dir = Path(log_dir)
        self.chat_url = chat_url or os.environ.get("OPENJET_CHAT_URL") or DEFAULT_CHAT_URL
        self.effects = effects
        # Backends without a menu (pystray's plain X11 one) get Start/Stop on the left click.
        self.menu_supported = menu_supported
        self.quit_requested = threading.Event()
        self.last_notice: str | None = None
        self._listeners: list[Callable[[], None]] = []
        supervisor.on_state(self._on_state)

    # --- what is shown -------------------------------------------------------------------------------

    @property
    def state(self) -> str:
        return self.supervisor.state

    @property
    def api_url(self) -> str:
        return api_base_url(self.host, self.port)

    def _doing(self) -> str:
        """The state in words; while loading, what it is doing (a download's percent, a restart) when it says."""
        message = self.supervisor.message if self.state == LOADING else ""
        if message and message != "starting the server":
            return message
        return STATE_WORDS.get(self.state, self.state)

    @property
    def preparing(self) -> bool:
        """Before the server exists (preparation.LaunchSession's GPU check and download)."""
        return bool(getattr(self.supervisor, "preparing", False))

    def status_line(self) -> str:
        return f"{self.model} · {self.gpu} · port {self.port} · {self._doing()}"

    def title(self) -> str:
        """The icon's tooltip."""
        return f"OpenJet: {self._doing()} ({self.api_url})"

    def icon_colour(self) -> tuple[int, int, int]:
        return STATE_COLOURS.get(self.state, STATE_COLOURS[STOPPED])

    def entries(self) -> list[MenuEntry]:
        running = self.state in (LOADING, READY)
        downloading = self.preparing and self.supervisor.message.startswith("downloading")
        toggle = (MenuEntry("Cancel download" if downloading else "Stop server", STOP,
                            enabled=self.state != STOPPING, default=not self.menu_supported)
                  if running else
                  MenuEntry("Start server", START, enabled=self.state != STOPPING, default=not self.menu_supported))
        return [
            MenuEntry(self.status_line(), STATUS, enabled=False),
            SEPARATOR,
            toggle,
            MenuEntry(f"Copy API URL ({self.api_url})", COPY_URL),
            MenuEntry(f"Open chat ({self.chat_url})", OPEN_CHAT, default=self.menu_supported),
            MenuEntry("Open logs folder", OPEN_LOGS),
            SEPARATOR,
            MenuEntry("Quit", QUIT),
        ]

    def notification(self) -> str | None:
        """The text of the desktop notification for the current state (only a failure notifies)."""
        if self.state != FAILED:
            return None
        first = (self.supervisor.message or "the server stopped").splitlines()[0]
        title = getattr(self.supervisor, "failure_title", "OpenJet server failed")  # LaunchSession: before a server
        return f"{title}: {first} Logs: {self.log_dir}"

    # --- what the entries do -------------------------------------------------------------------------

    def on_change(self, fn: Callable[[], None]) -> None:
        """Called (from the supervisor's thread) whenever the state changes: redraw icon and menu."""
        self._listeners.append(fn)

    def _on_state(self, state: str, message: str) -> None:
        if state == FAILED:
            self.last_notice = self.notification()
        for fn in list(self._listeners):
            fn()

    def activate(self, action: str) -> str | None:
        """Do what the entry `action` does; returns a message to show, if any."""
        if action == START:
            self.supervisor.start()
        elif action == STOP:
            # stop() waits for the child (up to the stop timeout): keep the UI thread free
            threading.Thread(target=self.supervisor.stop, daemon=True).start()
        elif action == COPY_URL:
            if not self.effects.copy(self.api_url):
                return f"No clipboard tool found (install xclip or wl-clipboard). The API URL is {self.api_url}"
            return f"Copied {self.api_url}"
        elif action == OPEN_CHAT:
            self.effects.open_url(self.chat_url)
        elif action == OPEN_LOGS:
            self.effects.open_path(self.log_dir)
        elif action == QUIT:
            self.quit_requested.set()
        elif action == STATUS:
            pass
        else:
            raise ValueError(f"unknown menu action {action!r}")
        return None

    def default_action(self) -> str | None:
        return next((e.action for e in self.entries() if e.default and e.enabled), None)
