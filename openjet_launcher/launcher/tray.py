"""The tray icon: pystray over menu.py's TrayController.

pystray is imported only inside `tray_unavailable_reason()` and `Tray.__init__`: on Linux its import
connects to the X server and raises without one, so a headless machine must never import it at module
load. `tray_unavailable_reason()` says why there is no tray (no display, pystray or Pillow missing, the
backend failing) so the launcher can fall back to the terminal with that one line.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from .menu import MenuEntry, TrayController

INSTALL_HINT = "pip install pystray Pillow: openjet-launcher depends on them"
ICON_PX = 64


def tray_unavailable_reason() -> str | None:
    """None when a tray icon can be shown here, else why not (one line)."""
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return "no graphical display (DISPLAY is not set)"
    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        return f"Pillow is not installed ({INSTALL_HINT})"
    try:
        import pystray  # noqa: F401
    except ImportError as e:
        if getattr(e, "name", None) == "pystray":
            return f"pystray is not installed ({INSTALL_HINT})"
        return f"no tray backend works here ({e})"
    except Exception as e:  # Xlib raises its own errors for a display it cannot open
        return f"the tray cannot reach the display ({type(e).__name__}: {e})"
    if getattr(pystray.Icon, "__module__", "") == "pystray._xorg" and not _x11_tray_manager():
        # pystray's plain X11 backend docks into an XEmbed system tray; without a manager the icon never shows
        # and every redraw logs a docking error (stock GNOME has none)
        return ("this desktop has no X11 system tray (on GNOME: the AppIndicator extension; or install PyGObject "
                "for pystray's AppIndicator backend)")
    return None


def _x11_tray_manager() -> bool:
    """Whether an X11 system-tray manager owns _NET_SYSTEM_TRAY_S<screen> (True when that cannot be asked: the
    backend then says what it says)."""
    try:
        import Xlib.X
        import Xlib.display

        display = Xlib.display.Display()
    except Exception:
        return True
    try:
        atom = display.intern_atom(f"_NET_SYSTEM_TRAY_S{display.get_default_screen()}")
        return display.get_selection_owner(atom) != Xlib.X.NONE
    except Exception:
        return True
    finally:
        display.close()


def icon_image(rgb: tuple[int, int, int], size: int = ICON_PX):
    """A filled disc in the state's colour with a white ring: readable on light and dark panels."""
    from PIL import Image, ImageDraw

    img = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    d = ImageDraw.Draw(img)
    m = size // 16
    d.ellipse((m, m, size - 1 - m, size - 1 - m), fill=(*rgb, 255), outline=(255, 255, 255, 255), width=max(2, size // 16))
    r = size // 5  # the "jet": a white dot in the middle
    c = size // 2
    d.ellipse((c - r, c - r, c + r, c + r), fill=(255, 255, 255, 255))
    return img


class Tray:
    """One pystray Icon whose picture, tooltip and menu follow the controller's state."""

    def __init__(self, controller: TrayController):
        import pystray

        self._pystray = pystray
        self.controller = controller
        self.icon = pystray.Icon("openjet", icon_image(controller.icon_colour()), controller.title(),
                                 menu=pystray.Menu(self._items))
        controller.menu_supported = bool(getattr(self.icon, "HAS_MENU", True))
        _listen_for_clicks_on_x11(self.icon)
        self._x11 = X11Side.attach(self.icon)
        controller.on_change(self.refresh)
        self._notified: str | None = None
        self._watch: threading.Thread | None = None
        # Redraws happen on a painter thread: pystray's X11 backend runs them on its loop thread and waits,
        # so the supervisor's thread must never call into pystray itself (nor after the loop has ended).
        self._dirty = threading.Event()
        self._alive = False
        self._x_lock = threading.Lock()     # one thread at a time talks to pystray (paint vs stop)
        self._loop_ended = threading.Event()
        self._loop_ready = threading.Event()  # setup ran: pystray's stop() is ignored before its loop runs

    def _item(self, e: MenuEntry):
        if e.action is None:
            return self._pystray.Menu.SEPARATOR
        action = e.action

        def on_click(icon, item) -> None:  # exactly (icon, item): pystray rejects callables with more arguments
            self._click(action)
        return self._pystray.MenuItem(e.label, on_click, enabled=e.enabled, default=e.default)

    def _items(self):
        return tuple(self._item(e) for e in self.controller.entries())

    def _click(self, action: str) -> None:
        message = self.controller.activate(action)   # Quit sets quit_requested: _wait_quit stops the icon
        if message:
            self._notify(message)

    def _notify(self, text: str) -> None:
        if getattr(self.icon, "HAS_NOTIFICATION", False):
            try:
                self.icon.notify(text, "OpenJet")
            except Exception:
                pass
        print(f"[openjet] {text}", file=sys.stderr, flush=True)

    def refresh(self) -> None:
        """Ask for a redraw after a state change (any thread; returns at once)."""
        self._dirty.set()

    def _painter(self) -> None:
        while True:
            self._dirty.wait()
            self._dirty.clear()
            with self._x_lock:
                if not self._alive:
                    return
                try:
                    self._paint()
                except Exception:
                    pass

    def _paint(self) -> None:
        c = self.controller
        self.icon.icon = icon_image(c.icon_colour())
        self.icon.title = c.title()
        try:
            self.icon.update_menu()
        except Exception:
            pass
        notice = c.notification()
        if notice and notice != self._notified:
            self._notified = notice
            self._notify(notice)
        elif not notice:
            self._notified = None

    def run(self, on_ready=None) -> None:
        """Show the icon and block until Quit (or `stop()`); pystray wants the main thread on macOS."""
        def setup(icon) -> None:
            _await_x11_loop_thread(icon)
            icon.visible = True
            self._alive = True
            threading.Thread(target=self._painter, name="openjet-tray-painter", daemon=True).start()
            self.refresh()
            self._loop_ready.set()
            if on_ready is not None:
                on_ready(self)
        # Quit from elsewhere (Ctrl-C handler, tests) also ends the loop.
        self._watch = threading.Thread(target=self._wait_quit, daemon=True)
        self._watch.start()
        if self._x11 is not None:
            threading.Thread(target=self._x11.nudge_until, args=(self._loop_ended,), name="openjet-tray-nudge",
                             daemon=True).start()
        try:
            self.icon.run(setup=setup)
        finally:
            self._alive = False
            self._loop_ended.set()
            self._dirty.set()

    def _wait_quit(self) -> None:
        self.controller.quit_requested.wait()
        # A Quit before the loop runs (a launch whose preparation failed at once) must wait for it: pystray ignores
        # stop() until then, and the icon would stay with nothing left to end it (its Quit only sets this event).
        self._loop_ready.wait(LOOP_THREAD_WAIT_S)
        with self._x_lock:                  # never while a redraw is in flight: that could lose the stop
            self._alive = False
            try:
                self.icon.stop()
            except Exception:
                pass
        if not self._loop_ended.wait(STOP_GRACE_S):
            _wake_x11_loop(self.icon)

    def stop(self) -> None:
        self.controller.quit_requested.set()


# pystray's X11 backend (0.19.5) runs the other threads' calls (show, update, stop) on its loop thread: the caller
# sends a ClientMessage to the icon's window and waits on a queue for the loop to run the call. pystray sends it over
# the icon's own X connection, the one its loop reads, and python-xlib (0.33) cannot share a connection that way: a
# thread that flushes while the loop thread waits for a reply returns early when data arrives that it does not read,
# without waking that waiter, and the loop waits forever (faulthandler: the loop in get_geometry's reply under
# pystray's _draw, our setup in pystray's queue; no icon; 1 run in ~30 of tests/test_tray_xvfb.py with three at once
# on two busy cores, and in clean-clone CI runs). So X11Side sends those messages over a connection of our own: the
# icon's connection is its loop thread's alone. The same connection nudges the loop every NUDGE_S (a no-op
# ClientMessage: an earlier remedy for a select() seen stuck with an event already queued, from the same sharing),
# and STOP_GRACE_S after stop() the loop's connection is shut down, which ends the loop for good (Xlib raises, pystray
# logs it): the window is already gone then, nothing else is lost.
STOP_GRACE_S = 3.0
NUDGE_S = 0.5


# pystray's X11 Icon._run marks the icon ready (which starts run()'s setup thread) one line before it records its
# loop thread in `_thread`, and every call from another thread (show, update, stop) first compares itself with
# `_thread`: a setup that wins that race dies on an AttributeError in its thread, silently, and the icon never shows
# (seen once in a clean-clone CI run of tests/test_tray_xvfb.py, pystray 0.19.5). So setup waits for `_thread`.
LOOP_THREAD_WAIT_S = 10.0


def _await_x11_loop_thread(icon, timeout_s: float = LOOP_THREAD_WAIT_S) -> bool:
    """True once pystray's X11 loop thread is recorded on the icon (at once for other backends); False after
    timeout_s without it (the caller goes on: pystray then raises what it raises)."""
    if type(icon).__module__ != "pystray._xorg":
        return True
    deadline = time.monotonic() + timeout_s
    while getattr(icon, "_thread", None) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


class X11Side:
    """A second X connection for every thread but pystray's X11 loop: it carries their calls into the loop (in place
    of pystray's sends over the loop's own connection) and the loop's nudges."""

    # pystray's calls that run on its loop (Icon._rewrite_implementation) and the atom each is sent as
    CALLS = ("_show", "_hide", "_update_icon", "_update_title", "_stop")

    @classmethod
    def attach(cls, icon) -> "X11Side | None":
        """Route the icon's cross-thread calls through a connection of our own; None (pystray's own way kept) for
        other backends or an X11 icon that does not look as expected (another pystray version)."""
        if type(icon).__module__ != "pystray._xorg" or getattr(icon, "_window", None) is None:
            return None
        if not all(name in vars(icon) and hasattr(type(icon), name) for name in cls.CALLS) or \
                not hasattr(icon, "_queue"):
            return None
        try:
            return cls(icon)
        except Exception:
            return None

    def __init__(self, icon):
        import Xlib.display

        self.icon = icon
        self.display = Xlib.display.Display()
        self.display.set_error_handler(lambda *error: None)   # a message after the window is destroyed: BadWindow
        self.window = self.display.create_resource_object("window", icon._window.id)
        self.lock = threading.Lock()                             # one thread at a time on this connection
        self.nudge_atom = self.display.intern_atom("_OPENJET_NUDGE")
        for name in self.CALLS:                                  # pystray's atom names: '_PYSTRAY_%s' % name.upper()
            atom = self.display.intern_atom(f"_PYSTRAY_{name.upper()}")
            setattr(icon, name, self._call(getattr(type(icon), name).__get__(icon), atom))

    def _call(self, original, atom):
        icon = self.icon

        def call() -> None:
            if threading.current_thread().ident == icon._thread.ident:   # the loop itself (pystray's test)
                original()
                return
            self.send(atom)
            result = icon._queue.get()                            # the loop's handler puts True or exc_info
            if result is not True:
                raise result[1].with_traceback(result[2])
        return call

    def send(self, atom) -> None:
        """A ClientMessage of `atom` to the icon's window (raises when the window or the server is gone)."""
        import Xlib.X
        from Xlib.protocol import event

        with self.lock:
            self.window.send_event(event.ClientMessage(window=self.window, client_type=atom,
                                                       data=(32, [0, 0, 0, 0, 0])), event_mask=Xlib.X.NoEventMask)
            self.display.flush()

    def nudge_until(self, ended: threading.Event) -> None:
        """Until the loop ends: a no-op message to the loop every NUDGE_S; then this connection closes."""
        try:
            while not ended.wait(NUDGE_S):
                try:
                    self.send(self.nudge_atom)
                except Exception:
                    return                      # the window or the server is gone
        finally:
            with self.lock:
                self.display.close()


def _wake_x11_loop(icon) -> None:
    """End pystray's X11 loop by shutting its X connection's socket (both directions)."""
    if type(icon).__module__ != "pystray._xorg":
        return
    try:
        import socket

        icon._display.display.socket.shutdown(socket.SHUT_RDWR)
    except Exception:
        pass


def _listen_for_clicks_on_x11(icon) -> None:
    """pystray's plain X11 backend handles ButtonPress but never selects it on its window (0.19.5), so a
    click on the icon never arrives; select it, keeping the masks pystray set."""
    window = getattr(icon, "_window", None)
    if type(icon).__module__ != "pystray._xorg" or window is None:
        return
    import Xlib.X

    try:
        window.change_attributes(event_mask=Xlib.X.ExposureMask | Xlib.X.StructureNotifyMask |
                                 Xlib.X.ButtonPressMask)
        icon._display.flush()
    except Exception:
        pass
