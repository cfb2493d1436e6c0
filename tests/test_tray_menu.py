"""The tray's menu model (launcher/menu.py) without a display: entries per state, the actions they trigger,
icon colours, the failure notification; and tray.py's import being safe without a display."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from openjet_launcher.launcher.menu import (COPY_URL, OPEN_CHAT, OPEN_LOGS, QUIT, START, STATE_COLOURS, STATUS, STOP,
                                            Effects, TrayController, api_base_url)
from openjet_launcher.launcher.supervisor import FAILED, LOADING, READY, STOPPED, STOPPING


class FakeSupervisor:
    def __init__(self):
        self.state, self.message = STOPPED, ""
        self.calls: list[str] = []
        self._cbs = []

    def on_state(self, fn):
        self._cbs.append(fn)

    def set(self, state, message=""):
        self.state, self.message = state, message
        for fn in self._cbs:
            fn(state, message)

    def start(self):
        self.calls.append("start")
        self.set(LOADING)

    def stop(self):
        self.calls.append("stop")
        self.set(STOPPED)


@pytest.fixture
def ctl(tmp_path):
    sup = FakeSupervisor()
    done: dict[str, list] = {"copy": [], "url": [], "path": []}
    effects = Effects(copy=lambda t: done["copy"].append(t) or True, open_url=done["url"].append,
                      open_path=done["path"].append)
    c = TrayController(sup, model="Qwen3.8-27B-Q4_K_M.gguf", gpu="GPU 0 (NVIDIA H200)", host="127.0.0.1",
                       port=8080, log_dir=tmp_path / "logs", chat_url="http://localhost:3000", effects=effects)
    c.done = done
    return c


def labels(c: TrayController) -> list[str]:
    return [e.label for e in c.entries()]


def test_stopped_menu_offers_start_and_the_status_line(ctl):
    assert labels(ctl) == [
        "Qwen3.8-27B-Q4_K_M.gguf · GPU 0 (NVIDIA H200) · port 8080 · stopped", "-",
        "Start server", "Copy API URL (http://127.0.0.1:8080/v1)", "Open chat (http://localhost:3000)",
        "Open logs folder", "-", "Quit"]
    status = ctl.entries()[0]
    assert status.action == STATUS and not status.enabled


@pytest.mark.parametrize("state,toggle", [(LOADING, "Stop server"), (READY, "Stop server"),
                                          (FAILED, "Start server"), (STOPPED, "Start server")])
def test_the_toggle_follows_the_state(ctl, state, toggle):
    ctl.supervisor.set(state)
    assert labels(ctl)[2] == toggle
    assert labels(ctl)[0].endswith(f"port 8080 · {state}")


def test_while_stopping_the_toggle_is_disabled(ctl):
    ctl.supervisor.set(STOPPING)
    assert not ctl.entries()[2].enabled


def test_start_and_stop_call_the_supervisor(ctl):
    ctl.activate(START)
    assert ctl.supervisor.calls == ["start"] and ctl.entries()[2].action == STOP
    ctl.activate(STOP)  # on a thread: stop() waits for the child
    import time
    deadline = time.monotonic() + 5
    while ctl.supervisor.calls != ["start", "stop"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ctl.supervisor.calls == ["start", "stop"] and ctl.entries()[2].action == START


def test_copy_open_chat_open_logs_and_quit(ctl, tmp_path):
    assert ctl.activate(COPY_URL) == "Copied http://127.0.0.1:8080/v1"
    assert ctl.done["copy"] == ["http://127.0.0.1:8080/v1"]
    ctl.activate(OPEN_CHAT)
    assert ctl.done["url"] == ["http://localhost:3000"]
    ctl.activate(OPEN_LOGS)
    assert ctl.done["path"] == [tmp_path / "logs"]
    assert not ctl.quit_requested.is_set()
    ctl.activate(QUIT)
    assert ctl.quit_requested.is_set()


def test_without_a_clipboard_tool_the_url_is_shown_instead(ctl):
    ctl.effects = Effects(copy=lambda t: False, open_url=print, open_path=print)
    msg = ctl.activate(COPY_URL)
    assert "No clipboard tool" in msg and "http://127.0.0.1:8080/v1" in msg


def test_unknown_action_is_an_error(ctl):
    with pytest.raises(ValueError):
        ctl.activate("format_disk")


def test_icon_colour_per_state(ctl):
    seen = {}
    for state in (STOPPED, LOADING, READY, FAILED):
        ctl.supervisor.set(state)
        seen[state] = ctl.icon_colour()
    assert seen == {s: STATE_COLOURS[s] for s in seen}
    assert len(set(seen.values())) == 4  # four states, four colours
    assert seen[READY][1] > seen[READY][0] and seen[FAILED][0] > seen[FAILED][1]  # green, red


def test_failure_notifies_with_the_first_line_and_the_logs_folder(ctl, tmp_path):
    assert ctl.notification() is None
    changes = []
    ctl.on_change(lambda: changes.append(ctl.state))
    ctl.supervisor.set(FAILED, "the server exited (code 3) 4 times in a row; gave up. Log: x\nLast lines:\n  boom")
    assert ctl.notification() == ("OpenJet server failed: the server exited (code 3) 4 times in a row; gave up. "
                                  f"Log: x Logs: {tmp_path / 'logs'}")
    assert ctl.last_notice == ctl.notification() and changes == [FAILED]


def test_left_click_opens_chat_with_a_menu_and_toggles_without_one(ctl):
    assert ctl.default_action() == OPEN_CHAT
    ctl.menu_supported = False  # pystray's plain X11 backend: no menu, only the left click
    assert ctl.default_action() == START
    ctl.supervisor.set(READY)
    assert ctl.default_action() == STOP


def test_chat_url_default_and_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENJET_CHAT_URL", "http://webui.local:8081")
    c = TrayController(FakeSupervisor(), model="m", gpu="g", host="0.0.0.0", port=9000, log_dir=tmp_path)
    assert c.chat_url == "http://webui.local:8081"
    monkeypatch.delenv("OPENJET_CHAT_URL")
    c = TrayController(FakeSupervisor(), model="m", gpu="g", host="0.0.0.0", port=9000, log_dir=tmp_path)
    assert c.chat_url == "http://localhost:3000"
    assert c.api_url == "http://127.0.0.1:9000/v1"  # every address: clients on this machine use loopback


def test_api_base_url():
    assert api_base_url("127.0.0.1", 8080) == "http://127.0.0.1:8080/v1"
    assert api_base_url("::1", 8080) == "http://[::1]:8080/v1"
    assert api_base_url("192.168.1.5", 80) == "http://192.168.1.5:80/v1"


def test_tray_module_imports_and_explains_without_a_display():
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    code = ("from openjet_launcher.launcher.tray import tray_unavailable_reason;"
            "import sys; print(tray_unavailable_reason()); print('pystray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    if sys.platform.startswith("linux"):
        assert out.stdout.splitlines() == ["no graphical display (DISPLAY is not set)", "False"]


def test_tray_explains_a_display_it_cannot_open(monkeypatch):
    pytest.importorskip("Xlib")
    env = {"PATH": "/usr/bin:/bin", "DISPLAY": ":97", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    code = "from openjet_launcher.launcher.tray import tray_unavailable_reason; print(tray_unavailable_reason())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(("the tray cannot reach the display", "no tray backend works here",
                                  "pystray is not installed", "Pillow is not installed"))


def test_icon_images_differ_by_state():
    pytest.importorskip("PIL")
    from openjet_launcher.launcher.tray import icon_image

    a, b = icon_image(STATE_COLOURS[READY]), icon_image(STATE_COLOURS[FAILED])
    assert a.size == (64, 64) and a.getpixel((12, 32))[:3] == STATE_COLOURS[READY]
    assert b.getpixel((12, 32))[:3] == STATE_COLOURS[FAILED] and a.getpixel((0, 0))[3] == 0


class _XorgIconStandIn:
    """What _await_x11_loop_thread looks at in pystray's X11 Icon: the class's module and `_thread`, which
    Icon._run records one line after it lets the setup thread go."""
    __module__ = "pystray._xorg"


def test_setup_waits_for_the_x11_loop_thread_before_calling_into_pystray():
    import threading
    import time

    from openjet_launcher.launcher.tray import _await_x11_loop_thread

    icon = _XorgIconStandIn()
    seen = {}

    def loop_starts():
        time.sleep(0.2)
        seen["set_at"] = time.monotonic()
        icon._thread = threading.current_thread()

    threading.Thread(target=loop_starts).start()
    assert _await_x11_loop_thread(icon, timeout_s=10)
    assert time.monotonic() >= seen["set_at"] and icon._thread is not None
    t0 = time.monotonic()
    assert not _await_x11_loop_thread(_XorgIconStandIn(), timeout_s=0.1)   # never recorded: gives up, says so
    assert 0.1 <= time.monotonic() - t0 < 5
    assert _await_x11_loop_thread(object(), timeout_s=0)                   # other backends: nothing to wait for
