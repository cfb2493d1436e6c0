"""Smoke test of the real tray: pystray's xorg backend under Xvfb, over the real server on the tiny model.

Pieces, each a process: Xvfb; a minimal freedesktop system-tray manager (MANAGER_SCRIPT: owns
_NET_SYSTEM_TRAY_S0 and embeds icons into a visible panel, standing in for a desktop's panel); the tray
(TRAY_SCRIPT: Supervisor + TrayController + Tray, as the launcher builds them, driven over stdin with the
same `Tray._click(action)` that pystray's menu items call). A real X click (xdotool) on the icon runs its
default action (Start/Stop on a backend without menus). The server's /health must follow each action.
Screenshots (imagemagick `import -window root`) go to $OPENJET_TRAY_SCREENSHOT_DIR or the test's tmp dir.

Needs: Debian packages xvfb, xdotool, imagemagick; pip pystray and Pillow (the `tray` extra). Skipped
without them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Xvfb is an X11 server"),
    pytest.mark.skipif(shutil.which("Xvfb") is None, reason="Xvfb not installed (Debian: apt-get install xvfb)"),
]

MANAGER_SCRIPT = textwrap.dedent('''
    import sys
    import Xlib.display, Xlib.X
    from Xlib.protocol import event
    d = Xlib.display.Display()
    scr = d.screen()
    root = scr.root
    panel = root.create_window(20, 20, 200, 64, 0, scr.root_depth, background_pixel=0x3a3f4b,
                               event_mask=Xlib.X.StructureNotifyMask | Xlib.X.SubstructureNotifyMask)
    panel.map()
    sel = d.intern_atom("_NET_SYSTEM_TRAY_S0")
    opcode = d.intern_atom("_NET_SYSTEM_TRAY_OPCODE")
    panel.set_selection_owner(sel, Xlib.X.CurrentTime)
    root.send_event(event.ClientMessage(window=root, client_type=d.intern_atom("MANAGER"),
                                        data=(32, [Xlib.X.CurrentTime, sel, panel.id, 0, 0])),
                    event_mask=Xlib.X.StructureNotifyMask)
    d.flush()
    print("MANAGER", flush=True)
    slots = {}  # window id -> x in the panel; pystray asks to dock again on every icon update
    while True:
        e = d.next_event()
        if e.type == Xlib.X.ClientMessage and e.client_type == opcode and e.data[1][1] == 0:  # REQUEST_DOCK
            wid = e.data[1][2]
            if wid in slots:
                continue
            x = slots[wid] = 8 + 56 * len(slots)
            w = d.create_resource_object("window", wid)
            w.reparent(panel, x, 8)
            w.configure(width=48, height=48)
            w.map()
            d.flush()
            print(f"DOCKED {20 + x + 24} {20 + 8 + 24}", flush=True)  # the icon's centre on the screen
''')

TRAY_SCRIPT = textwrap.dedent('''
    import faulthandler, signal, sys, threading
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks for every thread's stack when stuck
    from pathlib import Path
    from openjet_launcher.launcher.menu import Effects, TrayController
    from openjet_launcher.launcher.supervisor import Supervisor, health_url
    from openjet_launcher.launcher.tray import Tray, tray_unavailable_reason

    port, log_dir, cmd = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    _out = threading.Lock()

    def say(*words):  # whole lines: the supervisor's thread and the command thread both write
        with _out:
            sys.stdout.write(" ".join(map(str, words)) + "\\n")
            sys.stdout.flush()
    assert tray_unavailable_reason() is None, tray_unavailable_reason()
    sup = Supervisor(cmd, health_url("127.0.0.1", port), log_dir=log_dir, health_timeout_s=120)
    sup.on_state(lambda s, m: say("STATE", s))
    ctl = TrayController(sup, model="tiny.gguf", gpu="CPU (reference engine)", host="127.0.0.1", port=port,
                         log_dir=log_dir, effects=Effects(copy=lambda t: True, open_url=print, open_path=print))
    tray = Tray(ctl)
    say("BACKEND", type(tray.icon).__module__, "menu" if ctl.menu_supported else "no-menu")

    def commands(_tray):
        say("TRAY READY")
        def loop():
            for line in sys.stdin:
                action = line.strip()
                if action:
                    tray._click(action)  # what the pystray menu item for `action` calls
                    say("DID", action)
        threading.Thread(target=loop, daemon=True).start()
    tray.run(commands)
    sup.stop()
    say("EXITED", sup.state)
''')


class Lines:
    """A child's stdout (or another of its streams) read line by line with a deadline."""

    def __init__(self, proc: subprocess.Popen, stream=None):
        import queue
        import threading

        stream = proc.stdout if stream is None else stream
        self.proc, self.q, self.seen = proc, queue.Queue(), []
        threading.Thread(target=lambda: [self.q.put(x.rstrip("\n")) for x in stream], daemon=True).start()

    def drain(self) -> list[str]:
        """Every line read so far that no wait_for took."""
        import queue

        while True:
            try:
                self.seen.append(self.q.get_nowait())
            except queue.Empty:
                return self.seen

    def wait_for(self, prefix: str, timeout_s: float = 60) -> str:
        import queue

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.q.get(timeout=0.2)
            except queue.Empty:
                continue
            self.seen.append(line)
            if line.startswith(prefix):
                return line
        raise AssertionError(f"no line starting {prefix!r} in {timeout_s} s; saw {self.seen}")


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _until(pred, timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def _screenshot(display: str, path: Path) -> Path | None:
    env = {**os.environ, "DISPLAY": display}
    if shutil.which("import"):
        subprocess.run(["import", "-window", "root", str(path)], env=env, check=True, timeout=30)
    elif shutil.which("xwd") and shutil.which("convert"):
        xwd = path.with_suffix(".xwd")
        subprocess.run(["xwd", "-root", "-silent", "-out", str(xwd)], env=env, check=True, timeout=30)
        subprocess.run(["convert", str(xwd), str(path)], check=True, timeout=30)
    else:
        return None
    return path


@pytest.fixture
def xvfb():
    r, w = os.pipe()
    proc = subprocess.Popen(["Xvfb", "-displayfd", str(w), "-screen", "0", "320x120x24", "-nolisten", "tcp"],
                            pass_fds=(w,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(w)
    with os.fdopen(r) as f:
        number = f.readline().strip()
    assert number, "Xvfb did not report a display number"
    try:
        yield f":{number}"
    finally:
        proc.terminate()
        proc.wait(10)


def test_tray_under_xvfb_start_stop_follow_the_server(xvfb, tmp_path):
    import importlib.util

    for name in ("pystray", "PIL", "Xlib", "uvicorn"):  # found, not imported: pystray needs a display to import
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} not installed (pip install 'openjet-launcher[tray]')")
    from openjet_launcher.launcher.supervisor import serve_command
    from openjet_launcher.model.synth import synthesize

    from test_supervisor import _serve_prefix, free_port

    model = tmp_path / "tiny.gguf"
    synthesize("tiny", model, show_progress=False)
    port = free_port()
    shots = Path(os.environ.get("OPENJET_TRAY_SCREENSHOT_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DISPLAY": xvfb, "PYSTRAY_BACKEND": "xorg", "PYTHONUNBUFFERED": "1"}
    env.pop("WAYLAND_DISPLAY", None)

    manager = subprocess.Popen([sys.executable, "-c", MANAGER_SCRIPT], env=env, stdout=subprocess.PIPE, text=True)
    mgr = Lines(manager)
    cmd = serve_command(model, engine="reference", port=port, ctx=512, prefix=_serve_prefix())
    tray = subprocess.Popen([sys.executable, "-c", TRAY_SCRIPT, str(port), str(tmp_path / "logs"), *cmd], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = Lines(tray)
    err = Lines(tray, stream=tray.stderr)
    try:
        mgr.wait_for("MANAGER", 90)
        assert out.wait_for("BACKEND", 60) == "BACKEND pystray._xorg no-menu"
        out.wait_for("TRAY READY", 90)
        _, x, y = mgr.wait_for("DOCKED", 90).split()
        assert not _healthy(port)

        def act(action: str) -> None:
            tray.stdin.write(action + "\n")
            tray.stdin.flush()
            out.wait_for(f"DID {action}", 30)

        act("start")                                   # the menu's Start
        out.wait_for("STATE ready", 120)
        assert _healthy(port)
        time.sleep(0.5)  # let the icon redraw in its new colour
        ready_png = _screenshot(xvfb, shots / "tray-ready.png")

        act("stop")                                    # the menu's Stop
        out.wait_for("STATE stopped", 60)
        assert _until(lambda: not _healthy(port), 10)
        time.sleep(0.5)
        stopped_png = _screenshot(xvfb, shots / "tray-stopped.png")

        if shutil.which("xdotool"):                    # a real click: the default action is Start/Stop here
            subprocess.run(["xdotool", "mousemove", x, y, "click", "1"], env=env, check=True, timeout=30)
            out.wait_for("STATE ready", 120)
            assert _healthy(port)
            subprocess.run(["xdotool", "mousemove", x, y, "click", "1"], env=env, check=True, timeout=30)
            out.wait_for("STATE stopped", 60)
            assert _until(lambda: not _healthy(port), 10)
            act("start")
            out.wait_for("STATE ready", 120)

        act("quit")                                    # Quit stops the server and ends the tray loop
        out.wait_for("EXITED stopped", 60)
        assert tray.wait(30) == 0
        assert not _healthy(port)
        for png in (ready_png, stopped_png):
            if png is not None:
                assert png.stat().st_size > 0
                print(f"screenshot: {png}")
        if ready_png is not None:
            _check_icon_colours(ready_png, stopped_png, int(x), int(y))
    except AssertionError as e:
        # A stuck tray says where it is stuck: every thread's stack (faulthandler, SIGUSR1) and what it logged.
        if tray.poll() is None:
            tray.send_signal(signal.SIGUSR1)
            time.sleep(2)
        raise AssertionError(f"{e}\ntray stderr:\n" + "\n".join(err.drain()[-200:])) from None
    finally:
        for p in (tray, manager):
            if p.poll() is None:
                p.kill()
                p.wait(10)


def _check_icon_colours(ready_png: Path, stopped_png: Path, x: int, y: int) -> None:
    """The icon's ring area shows green when ready and grey when stopped (menu.STATE_COLOURS)."""
    from PIL import Image

    from openjet_launcher.launcher.menu import STATE_COLOURS

    def near(png: Path) -> tuple[int, int, int]:
        return Image.open(png).convert("RGB").getpixel((x - 14, y))  # inside the disc, outside the white dot

    def close(a, b) -> bool:
        return all(abs(p - q) <= 40 for p, q in zip(a, b))

    assert close(near(ready_png), STATE_COLOURS["ready"]), near(ready_png)
    assert close(near(stopped_png), STATE_COLOURS["stopped"]), near(stopped_png)


# What Xlib sees of the tray selection on $DISPLAY: its owner, or the error asking it raised.
SELECTION_PROBE = textwrap.dedent('''
    import Xlib.display
    try:
        d = Xlib.display.Display()
        atom = d.intern_atom(f"_NET_SYSTEM_TRAY_S{d.get_default_screen()}")
        print("owner", d.get_selection_owner(atom))
    except Exception as e:
        print("error", type(e).__name__, e)
''')


def test_a_display_without_a_tray_manager_is_a_reason_to_run_in_the_terminal(xvfb):
    """pystray's plain X11 backend docks into an XEmbed system tray: with no manager (stock GNOME) the icon never
    showed and each redraw logged a docking error, with no word to the user; that is now a tray_unavailable_reason,
    so the launcher runs in the terminal and says why. With a manager, no reason."""
    import importlib.util

    for name in ("pystray", "PIL", "Xlib"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} not installed (pip install 'openjet-launcher[tray]')")
    env = {**os.environ, "DISPLAY": xvfb, "PYSTRAY_BACKEND": "xorg"}
    env.pop("WAYLAND_DISPLAY", None)
    ask = [sys.executable, "-c", "from openjet_launcher.launcher.tray import tray_unavailable_reason as r; print(r())"]
    alone = subprocess.run(ask, env=env, capture_output=True, text=True, timeout=60)
    seen = []  # (once in CI, at 5b2f00f: None here, not reproduced in 13 runs alone; asked again, with what Xlib saw)
    for _ in range(3):
        if "no X11 system tray" in alone.stdout:
            break
        seen.append(subprocess.run([sys.executable, "-c", SELECTION_PROBE], env=env, capture_output=True, text=True,
                                   timeout=60))
        time.sleep(0.5)
        alone = subprocess.run(ask, env=env, capture_output=True, text=True, timeout=60)
    assert "no X11 system tray" in alone.stdout, (alone, seen)
    manager = subprocess.Popen([sys.executable, "-c", MANAGER_SCRIPT], env=env, stdout=subprocess.PIPE, text=True)
    try:
        Lines(manager).wait_for("MANAGER", 30)
        with_manager = subprocess.run(ask, env=env, capture_output=True, text=True, timeout=60)
        assert with_manager.stdout.strip() == "None", with_manager
    finally:
        manager.kill()
        manager.wait(10)


ONE_CONNECTION_SCRIPT = textwrap.dedent('''
    import sys, threading
    import PIL.Image
    import pystray
    from openjet_launcher.launcher.tray import X11Side, _await_x11_loop_thread

    icon = pystray.Icon("t", PIL.Image.new("RGB", (16, 16), (0, 160, 0)), "t")
    if sys.argv[1] == "ours":
        assert X11Side.attach(icon) is not None
    def watch(name, f):  # a call on the loop's connection from any thread but the loop's (run() below: the main one)
        def call(*a, **k):
            if threading.current_thread() is not threading.main_thread():
                print("FOREIGN_CALL", name, flush=True)  # (at once: such a call may leave the loop hung)
            return f(*a, **k)
        return call
    for name in ("flush", "send_event", "sync"):
        setattr(icon._display, name, watch(name, getattr(icon._display, name)))
    def setup(icon):
        _await_x11_loop_thread(icon)
        icon.visible = True             # pystray: _update_icon and _show, run on the loop
        icon.title = "u"                # _update_title
        icon.stop()                     # _stop: the loop ends
    icon.run(setup)
    print("DONE", flush=True)
''')


def test_the_icons_x_connection_is_its_loop_threads_alone(xvfb):
    """pystray's X11 backend sends other threads' calls over the connection its loop reads, which python-xlib cannot
    share (a flushing thread can leave the loop waiting for a reply forever: tray.py, X11Side): with X11Side those
    calls reach the loop over a connection of our own, and the icon still shows, retitles and stops. pystray's own
    way, as the control, does use the loop's connection from the setup thread (and may hang on it, as it can in use:
    the control is stopped at its first such call)."""
    import importlib.util

    for name in ("pystray", "PIL", "Xlib"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} not installed (pip install 'openjet-launcher[tray]')")
    env = {**os.environ, "DISPLAY": xvfb, "PYSTRAY_BACKEND": "xorg"}
    env.pop("WAYLAND_DISPLAY", None)
    manager = subprocess.Popen([sys.executable, "-c", MANAGER_SCRIPT], env=env, stdout=subprocess.PIPE, text=True)
    try:
        Lines(manager).wait_for("MANAGER", 30)
        ours = subprocess.run([sys.executable, "-c", ONE_CONNECTION_SCRIPT, "ours"], env=env, capture_output=True,
                              text=True, timeout=60)
        assert ours.returncode == 0 and ours.stdout.strip() == "DONE", ours  # (no FOREIGN_CALL line before it)
        control = subprocess.Popen([sys.executable, "-c", ONE_CONNECTION_SCRIPT, "pystrays"], env=env,
                                   stdout=subprocess.PIPE, text=True)
        try:
            Lines(control).wait_for("FOREIGN_CALL flush", 60)
        finally:
            control.kill()
            control.wait(10)
    finally:
        manager.kill()
        manager.wait(10)
