"""The supervisor: a child server watched through /health, restarted after crashes, stopped gracefully then
forcefully, logged with rotation; the instance lock; and the same cycle with the real server on `tiny`.

Most tests drive a fake server (FAKE below) that behaves like `openjet-launch serve`: /health answers 503
while it "loads", then 200; it can be told to crash, to crash on its first N starts, or to ignore SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from openjet_launcher.launcher.supervisor import (FAILED, LOADING, READY, STOPPED, AlreadyRunning, InstanceLock,
                                                  Supervisor, TerminalStatus, bind_problem, health_url,
                                                  serve_command)


def pid_alive(pid: int) -> bool:
    """Whether process pid exists (the tests' check that a server died with its launcher)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


FAKE = textwrap.dedent('''
    import argparse, http.server, os, signal, sys, threading, time
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--load-s", type=float, default=0.3)
    p.add_argument("--crash-after-s", type=float, default=None)
    p.add_argument("--crash-first", type=int, default=0)
    p.add_argument("--counter", default=None)
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--load-fail", action="store_true")
    p.add_argument("--pid-file", default=None)
    a, _ = p.parse_known_args()  # also as `serve MODEL --engine ...` (the launcher's SERVE_PREFIX)
    if a.pid_file:
        open(a.pid_file, "w").write(str(os.getpid()))
    if a.load_fail:
        print("openjet-launch serve: error: the model failed to load: no GPU", flush=True)
        os._exit(4)
    n = 0
    if a.counter:
        n = int(open(a.counter).read()) if os.path.exists(a.counter) else 0
        open(a.counter, "w").write(str(n + 1))
    t0 = time.monotonic()
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ok = time.monotonic() - t0 >= a.load_s
            self.send_response(200 if ok else 503); self.end_headers()
            self.wfile.write(b'{"status":"ok"}' if ok else b'{"status":"loading"}')
        def log_message(self, *args):
            pass
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", a.port), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    print(f"fake server start {n} on port {a.port}", flush=True)
    if n < a.crash_first:
        print(f"boom: crash on start {n}", flush=True)
        os._exit(3)
    def term(*_):
        print("got SIGTERM", flush=True)
        if not a.ignore_term:
            os._exit(0)
    signal.signal(signal.SIGTERM, term)
    if a.crash_after_s is not None:
        time.sleep(a.load_s + a.crash_after_s)
        print("boom: crash while serving", flush=True)
        os._exit(5)
    while True:
        time.sleep(0.1)
''')


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    """run_default installs its own SIGINT/SIGTERM/SIGHUP handlers: tests that call it leave pytest's alone."""
    import signal

    names = [n for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n)]
    saved = {n: signal.getsignal(getattr(signal, n)) for n in names}
    yield
    for n, handler in saved.items():
        signal.signal(getattr(signal, n), handler)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fake(tmp_path):
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE)

    def make(*args: str, **kw) -> tuple[Supervisor, list[tuple[str, str]]]:
        port = free_port()
        sup = Supervisor([sys.executable, str(script), "--port", str(port), *args], health_url("127.0.0.1", port),
                         log_dir=tmp_path / "logs", poll_s=0.05, backoff_s=0.05, **kw)
        seen: list[tuple[str, str]] = []
        sup.on_state(lambda s, m: seen.append((s, m)))
        return sup, seen
    return make


def _until(pred, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_start_reports_loading_until_health_answers_200_then_ready(fake):
    sup, seen = fake("--load-s", "0.5")
    sup.start()
    assert sup.state == LOADING
    assert sup.wait_ready(20)
    assert [s for s, _ in seen] == [LOADING, READY]
    assert urllib.request.urlopen(sup.health_url).status == 200
    sup.stop()
    assert sup.state == STOPPED and sup.proc.poll() is not None


def test_stop_is_graceful_first(fake):
    sup, _ = fake()
    sup.start()
    assert sup.wait_ready(20)
    t0 = time.monotonic()
    sup.stop()
    assert time.monotonic() - t0 < 5
    if sys.platform != "win32":
        assert sup.proc.returncode == 0  # the fake's SIGTERM handler ran
    assert _until(lambda: "got SIGTERM" in sup.log_path.read_text())


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_stop_kills_a_child_that_ignores_sigterm_after_the_timeout(fake):
    sup, _ = fake("--ignore-term", stop_timeout_s=0.5)
    sup.start()
    assert sup.wait_ready(20)
    t0 = time.monotonic()
    sup.stop()
    assert 0.4 < time.monotonic() - t0 < 5
    assert sup.proc.returncode == -9 and sup.state == STOPPED


def test_a_crash_while_serving_restarts_the_server(fake, tmp_path):
    counter = tmp_path / "n"
    sup, seen = fake("--crash-after-s", "0.3", "--counter", str(counter), max_restarts=5)
    sup.start()
    assert _until(lambda: sup.starts >= 2 and sup.state == READY)
    assert any("exited (code 5); restart 1 of 5" in m for _, m in seen)
    sup.stop()
    assert int(counter.read_text()) >= 2


def test_a_crash_at_start_restarts_with_exponential_backoff_then_serves(fake, tmp_path):
    sup, seen = fake("--crash-first", "2", "--counter", str(tmp_path / "n"), max_restarts=3)
    sup.start()
    assert sup.wait_ready(20)
    assert sup.starts == 3
    waits = [m for s, m in seen if s == LOADING and "restart" in m]
    assert waits == ["the server exited (code 3); restart 1 of 3 in 0.05 s",
                     "the server exited (code 3); restart 2 of 3 in 0.1 s"]
    sup.stop()


def test_a_crash_loop_gives_up_with_the_last_log_lines(fake, tmp_path):
    sup, seen = fake("--crash-first", "99", "--counter", str(tmp_path / "n"), max_restarts=2)
    sup.start()
    assert _until(lambda: sup.state == FAILED)
    assert sup.starts == 3
    assert "exited (code 3) 3 times in a row; gave up" in sup.message
    assert "boom: crash on start 2" in sup.message and str(sup.log_path) in sup.message
    assert seen[-1][0] == FAILED
    sup.stop()  # harmless after a failure
    assert sup.state == FAILED


def test_a_model_that_fails_to_load_fails_at_once_with_the_reason_and_no_restart(fake):
    sup, seen = fake("--load-fail", health_timeout_s=900, max_restarts=3)
    t0 = time.monotonic()
    sup.start()
    try:
        assert _until(lambda: sup.state == FAILED, 10), sup.state
    finally:
        sup.stop()
    assert time.monotonic() - t0 < 10 and sup.starts == 1
    assert sup.message.startswith("the model failed to load: no GPU. Log: ")


def test_the_reason_printed_last_is_in_the_message_after_much_output(tmp_path):
    """The failure message quotes the child's last lines; they are read by a pump thread, which an exiting child
    outran (with 2,000 lines before the error, 17 runs in 30 gave the generic 'the model failed to load')."""
    script = tmp_path / "loud.py"
    script.write_text("import os, sys\nfor i in range(5000): print('loading part', i)\n"
                      "print('openjet-launch serve: error: the GGUF is broken', flush=True)\nos._exit(4)\n")
    for _ in range(3):
        sup = Supervisor([sys.executable, str(script)], health_url("127.0.0.1", free_port()),
                         log_dir=tmp_path / "logs", poll_s=0.01)
        sup.start()
        try:
            assert _until(lambda: sup.state == FAILED, 20), sup.state
        finally:
            sup.stop()
        assert sup.message.startswith("the GGUF is broken. Log: "), sup.message


def test_the_health_check_never_goes_through_a_proxy(fake, monkeypatch):
    """A proxy in the environment (corporate networks) cannot reach our loopback server: the check through it never
    succeeded, so a working server was reported FAILED after the health timeout and killed."""
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")       # nothing listens there
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.setattr(urllib.request, "_opener", None)         # urlopen's opener reads the proxies when first built
    sup, seen = fake(health_timeout_s=8)
    sup.start()
    try:
        assert sup.wait_ready(20), sup.message
    finally:
        sup.stop()


def test_ctrl_c_during_stop_kills_the_child_at_once(fake):
    """A second Ctrl-C while stop() waits out the grace period ends the child now, never abandons it."""
    import signal

    sup, _ = fake("--ignore-term", stop_timeout_s=30)
    sup.start()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert sup.wait_ready(20)
        proc = sup.proc
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        sup.stop()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - t0 < 10 and proc.poll() is not None and sup.state == STOPPED


def test_a_server_that_never_gets_healthy_fails_after_the_timeout(fake):
    sup, _ = fake("--load-s", "999", health_timeout_s=0.5)
    sup.start()
    assert _until(lambda: sup.state == FAILED)
    assert "did not answer /health within 0.5 s" in sup.message
    assert sup.proc.poll() is not None  # the hung child was stopped


def test_a_command_that_cannot_start_fails_with_a_message(tmp_path):
    sup = Supervisor([str(tmp_path / "no-such-program")], "http://127.0.0.1:9/health", log_dir=tmp_path)
    sup.start()
    assert _until(lambda: sup.state == FAILED)
    assert "could not start the server" in sup.message


def test_start_after_stop_serves_again(fake):
    sup, _ = fake()
    for _ in range(2):
        sup.start()
        assert sup.wait_ready(20)
        sup.stop()
        assert sup.state == STOPPED
    assert sup.starts == 2


def test_logs_rotate_and_keep_n_files(fake, tmp_path):
    sup, _ = fake(log_files=3, log_max_bytes=200)
    for _ in range(4):
        sup.start()
        assert sup.wait_ready(20)
        sup.stop()
    names = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert names == ["server.log", "server.log.1", "server.log.2"]


def test_terminal_status_lines_on_a_pipe(capsys):
    import io

    out = io.StringIO()
    ts = TerminalStatus("demo", "http://127.0.0.1:8080/v1", out)
    ts(LOADING, "starting the server")
    ts(READY, "serving")
    ts(FAILED, "it broke")
    assert out.getvalue().splitlines() == [
        "[openjet] demo: loading the model ... 0 s",
        "[openjet] demo: ready at http://127.0.0.1:8080/v1 (Ctrl-C stops)",
        "[openjet] demo: FAILED: it broke"]


def test_serve_command_and_health_url():
    cmd = serve_command("/m/x.gguf", engine="reference", host="0.0.0.0", port=9000, ctx=4096)
    assert cmd[:4] == [sys.executable, "-m", "openjet_launcher", "serve"]
    assert cmd[4:] == ["/m/x.gguf", "--engine", "reference", "--host", "0.0.0.0", "--port", "9000", "--ctx", "4096"]
    assert health_url("0.0.0.0", 9000) == "http://127.0.0.1:9000/health"
    assert health_url("::1", 80) == "http://[::1]:80/health"
    # every IPv6 address is checked on IPv6's loopback (on Windows "::" is IPv6-only: 127.0.0.1 never answered)
    assert health_url("::", 9000) == "http://[::1]:9000/health"


def test_a_server_on_every_ipv6_address_only_is_seen_ready(tmp_path):
    """A child listening on "::" with IPV6_V6ONLY (Windows' default) is reached on ::1 (127.0.0.1 was refused, so the
    launcher waited out the health timeout and reported a working server FAILED)."""
    import socket as s

    if not s.has_ipv6:
        pytest.skip("no IPv6 here")
    probe = s.socket(s.AF_INET6)
    try:
        probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    finally:
        probe.close()
    script = tmp_path / "v6only.py"
    script.write_text(textwrap.dedent('''
        import http.server, socket, sys
        class V6(http.server.ThreadingHTTPServer):
            address_family = socket.AF_INET6
            def server_bind(self):
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                super().server_bind()
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
            def log_message(self, *a):
                pass
        V6(("::", int(sys.argv[1])), H).serve_forever()
    '''))
    port = free_port()
    sup = Supervisor([sys.executable, str(script), str(port)], health_url("::", port), log_dir=tmp_path / "logs",
                     health_timeout_s=15, poll_s=0.05)
    sup.start()
    try:
        assert sup.wait_ready(30), sup.message
    finally:
        sup.stop()


def test_a_busy_port_is_reported_as_one():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert bind_problem("127.0.0.1", s.getsockname()[1]).startswith(
            f"port {s.getsockname()[1]} on 127.0.0.1 is already in use by another program")
    assert bind_problem("127.0.0.1", free_port()) is None


def test_a_wrong_host_is_not_reported_as_a_busy_port():
    port = free_port()
    # TEST-NET-3: an address no machine here has
    assert bind_problem("203.0.113.7", port).startswith("--host 203.0.113.7: this machine has no such address")
    assert bind_problem("no-such-host.invalid", port).startswith(
        "--host no-such-host.invalid: not an address of this machine, nor a name it can resolve")


# --- the instance lock ---------------------------------------------------------------------------------


def test_second_instance_is_refused_with_where_the_first_serves(tmp_path):
    lock_path = tmp_path / "openjet-launch.lock"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f'''
        import sys, time
        from openjet_launcher.launcher.supervisor import InstanceLock
        lock = InstanceLock(__import__("pathlib").Path({str(lock_path)!r}), "127.0.0.1", 8123)
        lock.acquire(); print("held", flush=True); sys.stdin.read()
        lock.release()''')], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(AlreadyRunning) as e:
            InstanceLock(lock_path, "127.0.0.1", 8080).acquire()
        assert f"pid {holder.pid}" in str(e.value) and "http://127.0.0.1:8123/v1" in str(e.value)
        assert e.value.info["port"] == 8123
    finally:
        holder.communicate("", timeout=20)
    assert not lock_path.exists()  # released on a clean exit
    with InstanceLock(lock_path, "127.0.0.1", 8080) as lock:
        assert lock.read()["pid"] == os.getpid()
    assert not lock_path.exists()


def test_a_stale_lock_is_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert not pid_alive(dead.pid)
    lock_path = tmp_path / "l.lock"
    lock_path.write_text(json.dumps({"pid": dead.pid, "hostname": socket.gethostname(), "host": "127.0.0.1",
                                     "port": 8080}))
    with InstanceLock(lock_path, "127.0.0.1", 9000) as lock:
        assert lock.read()["port"] == 9000
    lock_path.write_text("not json")  # a lock file cut short by a crash
    with InstanceLock(lock_path, "127.0.0.1", 9001) as lock:
        assert lock.read()["port"] == 9001


def test_a_record_naming_a_live_unrelated_pid_does_not_block_a_launch(tmp_path):
    """After a reboot (or a SIGKILL) the record stays, and its pid may now be another program's: the lock is the
    OS's (dropped when its holder died), so the record is overwritten instead of refusing every launch."""
    lock_path = tmp_path / "openjet-launch.lock"
    lock_path.write_text(json.dumps({"pid": os.getppid(), "hostname": socket.gethostname(), "host": "127.0.0.1",
                                     "port": 8080, "url": "http://127.0.0.1:8080/v1"}))
    assert pid_alive(os.getppid())
    with InstanceLock(lock_path, "127.0.0.1", 9002) as lock:
        assert lock.read()["pid"] == os.getpid() and lock.read()["port"] == 9002


def test_two_launchers_racing_for_a_stale_record_cannot_both_hold_it(tmp_path):
    """Each racer read the stale record, one replaced it, the other then removed the winner's and took it too."""
    lock_path = tmp_path / "openjet-launch.lock"
    lock_path.write_text(json.dumps({"pid": 999999, "hostname": socket.gethostname()}))
    racer = textwrap.dedent(f'''
        import sys
        from pathlib import Path
        from openjet_launcher.launcher.supervisor import AlreadyRunning, InstanceLock
        lock = InstanceLock(Path({str(lock_path)!r}), "127.0.0.1", 8000)
        try:
            lock.acquire(); print("held", flush=True)
        except AlreadyRunning:
            print("refused", flush=True)
        sys.stdin.read()''')
    procs = [subprocess.Popen([sys.executable, "-c", racer], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(6)]
    try:
        answers = sorted(p.stdout.readline().strip() for p in procs)
    finally:
        for p in procs:
            p.communicate("", timeout=30)
    assert answers == ["held"] + ["refused"] * 5


def test_a_config_folder_it_cannot_write_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    from openjet_launcher.launcher.main import run_default

    folder = tmp_path / "config"
    folder.mkdir()
    folder.chmod(0o500)
    if os.access(folder, os.W_OK):  # (root ignores permissions)
        pytest.skip("this user can write anywhere")
    monkeypatch.setenv("OPENJET_CONFIG_DIR", str(folder))
    assert run_default(_default_args("--model", "demo", "--no-tray", "--port", str(free_port()))) == 1
    err = capsys.readouterr().err
    assert "cannot write the launcher's lock" in err and "OPENJET_CONFIG_DIR" in err and "Traceback" not in err


def test_run_default_refuses_a_second_instance_and_exits_nonzero(tmp_path, monkeypatch, capsys):
    from openjet_launcher.launcher.main import add_default_options, run_default

    monkeypatch.setenv("OPENJET_CONFIG_DIR", str(tmp_path))
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f'''
        import sys
        from pathlib import Path
        from openjet_launcher.launcher.supervisor import InstanceLock
        lock = InstanceLock(Path({str(tmp_path / "openjet-launch.lock")!r}), "127.0.0.1", 8080)
        lock.acquire()
        print("held", flush=True); sys.stdin.read()''')], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"held"
        parser = argparse.ArgumentParser()
        add_default_options(parser)
        code = run_default(parser.parse_args(["--no-tray", "--model", "demo", "--engine", "reference"]))
    finally:
        holder.communicate(b"", timeout=20)
    assert code != 0
    err = capsys.readouterr().err
    assert "already running" in err and "http://127.0.0.1:8080/v1" in err


# --- the real server -----------------------------------------------------------------------------------


def _serve_prefix() -> list[str]:
    """`openjet-launch serve` once cli.py wires it; until then the same parser through a one-line shim."""
    from openjet_launcher import cli

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if "serve" in sub.choices:
        return [sys.executable, "-m", "openjet_launcher", "serve"]
    code = ("import argparse,sys; from openjet_launcher.server.cli import add_serve_parser;"
            "p=argparse.ArgumentParser(); add_serve_parser(p.add_subparsers());"
            "a=p.parse_args(['serve']+sys.argv[1:]); sys.exit(a.func(a))")
    return [sys.executable, "-c", code]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from openjet_launcher.model.synth import synthesize

    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    synthesize("tiny", path, show_progress=False)
    return path


@pytest.mark.slow
def test_real_server_on_tiny_start_health_crash_restart_stop(tiny_model, tmp_path):
    pytest.importorskip("openjet_launcher.server.cli")
    pytest.importorskip("uvicorn")
    port = free_port()
    cmd = serve_command(tiny_model, engine="reference", port=port, ctx=512, prefix=_serve_prefix())
    sup = Supervisor(cmd, health_url("127.0.0.1", port), log_dir=tmp_path / "logs", backoff_s=0.1,
                     health_timeout_s=120)
    states: list[str] = []
    sup.on_state(lambda s, m: states.append(s))
    sup.start()
    try:
        assert sup.wait_ready(120), sup.message
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            assert json.load(r)["choices"][0]["message"] is not None
        first = sup.proc.pid
        sup.proc.kill()  # a crash
        # the state is set before its callbacks run: wait for the second READY callback too (a loaded machine
        # once checked between the two, 2026-12-02)
        assert _until(lambda: sup.starts == 2 and sup.state == READY and states.count(READY) == 2, 120), sup.message
        assert sup.proc.pid != first
        with pytest.raises(AlreadyRunning):  # a second launcher, same config folder
            with InstanceLock(tmp_path / "lock", "127.0.0.1", port):
                InstanceLock(tmp_path / "lock", "127.0.0.1", port).acquire()
    finally:
        sup.stop()
    assert sup.state == STOPPED and sup.proc.poll() is not None
    assert bind_problem("127.0.0.1", port) is None  # the port is free again
    log = sup.log_path.read_text()
    assert "start #2" in log and "Uvicorn running" in log


# --- the default action (launcher/main.py) and the llama-server fallback ----------------------------------


def _default_args(*argv: str) -> argparse.Namespace:
    from openjet_launcher.launcher.main import add_default_options

    parser = argparse.ArgumentParser()
    add_default_options(parser)
    return parser.parse_args(list(argv))


def _no_gpu(monkeypatch):
    from openjet_launcher.launcher import hardware

    report = hardware.HardwareReport(None, None, None, {"built": False}, [], None,
                                     [hardware.Problem("no_driver", "No NVIDIA driver was found.")])
    monkeypatch.setattr(hardware, "detect", lambda gpu=None, *a, **k: report)


def test_without_a_gpu_the_default_explains_and_offers_the_cpu_path(monkeypatch):
    from openjet_launcher.errors import OpenJetError
    from openjet_launcher.launcher.main import plan_launch

    _no_gpu(monkeypatch)
    with pytest.raises(OpenJetError) as e:
        plan_launch(_default_args("--no-tray"))
    assert "No NVIDIA driver was found." in str(e.value)
    assert "openjet-launch --engine reference --model demo" in str(e.value)


def test_the_demo_model_is_served_on_the_reference_engine(tmp_path, monkeypatch):
    from openjet_launcher.launcher.main import plan_launch
    from openjet_launcher.server.cli import demo_model_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("OPENJET_API_KEY", "sekret\n")  # as read from a secret file: its newline is no part of the key
    plan = plan_launch(_default_args("--model", "demo", "--port", "9001"))
    assert plan.command[plan.command.index("--engine") + 1] == "reference"
    # the bundled trained model (or, in a checkout without it, the synthetic one generated into the cache)
    assert Path(plan.command[4]).is_file() and Path(plan.command[4]) == demo_model_path()
    assert (plan.model_label, plan.device_label) == ("demo", "CPU (reference engine)")
    assert plan.env["OPENJET_API_KEY"] == "sekret" and "sekret" not in " ".join(plan.command)


def test_the_demo_model_on_the_gpu_engine_needs_a_gpu_like_any_model(monkeypatch):
    """--engine cuda with the demo model is the GPU path (the demo file is Q4_K_M): without a GPU it says so."""
    from openjet_launcher.errors import OpenJetError
    from openjet_launcher.launcher.main import plan_launch

    _no_gpu(monkeypatch)
    with pytest.raises(OpenJetError) as e:
        plan_launch(_default_args("--model", "demo", "--engine", "cuda"))
    assert "No NVIDIA driver was found." in str(e.value)
    assert "cannot serve the demo model" in str(e.value) and "Qwen3.8-27B" not in str(e.value).splitlines()[0]


def test_the_launcher_checks_ctx_and_draft_as_the_server_does_and_passes_them_on(monkeypatch, tmp_path):
    """--ctx and --draft are refused up front by the server's own rules (not by three crashed servers), and on
    the reference engine they reach `serve` (0 included); --gpu says it does not apply there."""
    from openjet_launcher.errors import OpenJetError
    from openjet_launcher.launcher.main import plan_launch

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for bad in ("-1", "0", "5"):
        with pytest.raises(OpenJetError, match=f"--ctx {bad} is too small: give at least 16"):
            plan_launch(_default_args("--model", "demo", "--ctx", bad))
    with pytest.raises(OpenJetError, match="at most 7 drafts"):
        plan_launch(_default_args("--model", "demo", "--draft", "8"))
    plan = plan_launch(_default_args("--model", "demo", "--ctx", "512", "--draft", "3", "--gpu", "5"))
    cmd = plan.command
    assert cmd[cmd.index("--ctx") + 1] == "512" and cmd[cmd.index("--draft") + 1] == "3"
    assert any("--gpu 5 does not apply" in note for note in plan.notes)
    assert serve_command("m.gguf", ctx=0)[-2:] == ["--ctx", "0"]  # never dropped: `serve` says what is wrong


def test_listening_beyond_loopback_without_a_key_warns_on_the_launchers_terminal(monkeypatch, tmp_path):
    from openjet_launcher.launcher.main import plan_launch

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("OPENJET_API_KEY", raising=False)
    plan = plan_launch(_default_args("--model", "demo", "--host", "0.0.0.0"))
    assert any("listening on 0.0.0.0 without an API key" in note for note in plan.notes)
    plan = plan_launch(_default_args("--model", "demo", "--host", "0.0.0.0", "--api-key", "k"))
    assert not any("API key" in note for note in plan.notes)
    assert not any("API key" in note for note in plan_launch(_default_args("--model", "demo")).notes)


def test_the_launchers_port_is_checked_when_parsed():
    for bad in ("0", "-1", "70000"):
        with pytest.raises(SystemExit):
            _default_args("--port", bad)
    assert _default_args("--port", "65535").port == 65535


def test_a_config_or_log_folder_that_is_a_file_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    from openjet_launcher.launcher.main import run_default

    a_file = tmp_path / "file"
    a_file.write_text("x")
    monkeypatch.setenv("OPENJET_CONFIG_DIR", str(a_file))
    assert run_default(_default_args("--model", "demo", "--no-tray", "--port", str(free_port()))) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.splitlines()) == 1 and "point OPENJET_CONFIG_DIR at a folder" in err
    monkeypatch.setenv("OPENJET_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("OPENJET_LOG_DIR", str(a_file))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert run_default(_default_args("--model", "demo", "--no-tray", "--port", str(free_port()))) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "point OPENJET_LOG_DIR at a folder" in err
    assert not (tmp_path / "config" / "openjet-launch.lock").exists()


def test_a_file_that_is_no_model_at_all_gets_no_fallback_suggestion(tmp_path):
    from openjet_launcher.errors import OpenJetError
    from openjet_launcher.launcher.main import plan_launch

    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(_other_architecture_gguf(tmp_path / "whole.gguf").read_bytes()[:40])
    folder = tmp_path / "folder.gguf"
    folder.mkdir()
    for path in (truncated, folder):
        with pytest.raises(OpenJetError) as e:
            plan_launch(_default_args("--model", str(path), "--engine", "reference"))
        assert "llama-server" not in str(e.value), str(e.value)


def _other_architecture_gguf(path: Path) -> Path:
    import numpy as np
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_file_our_engine_cannot_run_needs_the_fallback_and_names_it(tmp_path, monkeypatch):
    from openjet_launcher.errors import OpenJetError
    from openjet_launcher.launcher.main import plan_launch

    model = _other_architecture_gguf(tmp_path / "llama.gguf")
    with pytest.raises(OpenJetError) as e:
        plan_launch(_default_args("--model", str(model), "--engine", "reference"))
    assert "--fallback llama-server" in str(e.value)


def test_the_fallback_without_llama_server_says_what_to_install(tmp_path, monkeypatch):
    from openjet_launcher.launcher.fallback import FallbackError
    from openjet_launcher.launcher.main import plan_launch

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("OPENJET_LLAMA_SERVER", raising=False)
    model = _other_architecture_gguf(tmp_path / "llama.gguf")
    with pytest.raises(FallbackError) as e:
        plan_launch(_default_args("--model", str(model), "--engine", "reference", "--fallback", "llama-server"))
    assert "llama-server was not found on PATH" in str(e.value) and "llama.cpp" in str(e.value)


def test_the_fallback_starts_llama_server_with_equivalent_settings(tmp_path, monkeypatch, tiny_model):
    from openjet_launcher.launcher.fallback import llama_server_command
    from openjet_launcher.launcher.main import plan_launch

    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    model = _other_architecture_gguf(tmp_path / "llama.gguf")
    plan = plan_launch(_default_args("--model", str(model), "--engine", "reference", "--fallback", "llama-server",
                                     "--host", "0.0.0.0", "--port", "9002", "--ctx", "8192", "--api-key", "k"))
    assert plan.command == [str(exe), "-m", str(model), "--host", "0.0.0.0", "--port", "9002", "--jinja", "-ngl",
                            "999", "-c", "8192", "--alias", "llama.gguf"]
    assert plan.env == {"LLAMA_API_KEY": "k"} and plan.device_label == "llama-server"
    # a file with an MTP head gets llama.cpp's MTP self-speculation
    assert llama_server_command("llama-server", tiny_model, mtp=True)[-4:] == \
        ["--spec-type", "draft-mtp", "--spec-draft-n-max", "4"]
    from openjet_launcher.launcher.fallback import has_mtp_head
    assert has_mtp_head(tiny_model) and not has_mtp_head(model)


def test_the_gpu_check_and_the_settings_are_for_the_files_own_shape(monkeypatch, tiny_model):
    """A file already here (a path, the demo) is checked by its own shape before the GPU is chosen (a small model
    on a 16 GB card is not refused as if it were the 27B), with the context asked for; a file without an MTP head
    is planned without one."""
    from openjet_launcher.errors import OpenJetError
    from openjet_launcher.launcher import hardware, main
    from openjet_launcher.model.shape import PRESETS, QWEN38_27B

    seen = {}

    def detect(gpu=None, *a, **kw):
        seen.update(kw)
        return hardware.HardwareReport("580.1", "13.0", "13.0", {"built": True}, [], None,
                                       [hardware.Problem("no_gpu", "none")])
    monkeypatch.setattr(hardware, "detect", detect)
    with pytest.raises(OpenJetError):
        main.plan_launch(_default_args("--model", str(tiny_model), "--engine", "cuda", "--ctx", "1024"))
    tiny = PRESETS["tiny"]                                                # the shape the file was written from
    assert seen["model"] == tiny != QWEN38_27B and seen["ctx"] == 1024
    assert main._file_shape(tiny_model) == tiny and tiny.n_nextn > 0      # the tiny model has its head
    assert main._file_shape(None) is None and main._local_model(None) is None


def test_the_fallback_runs_on_the_gpu_chosen(tmp_path, monkeypatch):
    """--gpu N (or the GPU the launcher picks) holds for llama-server too: without CUDA_VISIBLE_DEVICES llama.cpp
    spreads the layers over every visible GPU."""
    from openjet_launcher.launcher import hardware
    from openjet_launcher.launcher.main import plan_launch
    from openjet_launcher.server import cli

    gib = 1 << 30
    gpus = [hardware.GpuInfo(i, i, "NVIDIA GeForce RTX 3090", f"GPU-{i}", "8.6", 24 * gib, 23 * gib, 82, True, 86)
            for i in range(2)]
    monkeypatch.setattr(hardware, "detect", lambda gpu=None, *a, **k: hardware.HardwareReport(
        "580.1", "13.0", "13.0", {"built": True}, gpus, gpus[gpu or 0], []))
    monkeypatch.setattr(cli, "ENGINES", ("reference", "cuda"))
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    model = _other_architecture_gguf(tmp_path / "llama.gguf")
    plan = plan_launch(_default_args("--model", str(model), "--engine", "cuda", "--gpu", "1", "--fallback",
                                     "llama-server"))
    assert plan.command[0] == str(exe) and plan.env["CUDA_VISIBLE_DEVICES"] == "GPU-1"


RUN_DEFAULT = textwrap.dedent('''
    import argparse, json, sys
    from openjet_launcher.launcher import main
    main.SERVE_PREFIX = json.loads(sys.argv[1]) if sys.argv[1] != "-" else None
    p = argparse.ArgumentParser(); main.add_default_options(p)
    sys.exit(main.run_default(p.parse_args(sys.argv[2:])))
''')


@pytest.mark.slow
def test_openjet_launch_no_tray_demo_serves_refuses_a_second_and_stops_on_ctrl_c(tmp_path):
    import signal

    pytest.importorskip("uvicorn")
    port = free_port()
    env = {**os.environ, "OPENJET_CONFIG_DIR": str(tmp_path / "config"), "OPENJET_LOG_DIR": str(tmp_path / "logs"),
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("DISPLAY", None)
    argv = [sys.executable, "-c", RUN_DEFAULT, json.dumps(_serve_prefix()), "--model", "demo", "--port", str(port),
            "--ctx", "512"]
    # Ctrl-C reaches the launcher even where this test runs with SIGINT ignored (a shell's background job
    # passes SIG_IGN on to its children, and Python then keeps it)
    first = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True,
                             preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if os.name == "posix"
                             else None)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(first.stderr), daemon=True)
    reader.start()
    try:
        # the launcher's own "ready" line, not just /health: its supervisor polls on its own schedule
        assert _until(lambda: any("ready at" in line for line in lines), 120), lines
        assert _health_ok(port)
        lock = json.loads((tmp_path / "config" / "openjet-launch.lock").read_text())
        assert lock["pid"] == first.pid and lock["url"] == f"http://127.0.0.1:{port}/v1"
        second = subprocess.run(argv[:-4] + ["--port", str(port + 1)], env=env, capture_output=True, text=True,
                                timeout=60)
        assert second.returncode == 3
        assert f"already running (pid {first.pid})" in second.stderr
        assert f"http://127.0.0.1:{port}/v1" in second.stderr
        first.send_signal(signal.SIGINT)
        first.wait(timeout=60)
        reader.join(timeout=10)
        err = "".join(lines)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err
    assert "no tray icon: no graphical display" in err and f"ready at http://127.0.0.1:{port}/v1" in err
    assert not _health_ok(port) and bind_problem("127.0.0.1", port) is None
    assert not (tmp_path / "config" / "openjet-launch.lock").exists()
    assert (tmp_path / "logs" / "server.log").is_file()


def _health_ok(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def test_on_a_24_gb_gpu_the_launcher_asks_the_server_for_the_settings_the_engine_can_allocate(monkeypatch,
                                                                                              tiny_model):
    """The settings the launcher picks reach `serve`: the context and the KV format, chosen for the file's own shape
    (the tiny model: fp16 at its trained context; the 27B: q8_0 on a 24 GB card) within what the CUDA engine v1 does
    (presets.CUDA_V1): no q4_0, the embedding table on the GPU."""
    from openjet_launcher.launcher import hardware
    from openjet_launcher.errors import OpenJetError
    from openjet_launcher.launcher.main import DEFAULT_DRAFTS, plan_launch
    from openjet_launcher.launcher.presets import CUDA_V1, choose_settings
    from openjet_launcher.model.config import read_config
    from openjet_launcher.model.gguf_file import GGUFFile
    from openjet_launcher.server import cli

    gib = 1 << 30
    gpu = hardware.GpuInfo(0, 0, "NVIDIA GeForce RTX 3090", "GPU-test", "8.6", 24 * gib, 23 * gib, 82, True, 86)
    report = hardware.HardwareReport("580.1", "13.0", "13.0", {"built": True}, [gpu], gpu, [])
    monkeypatch.setattr(hardware, "detect", lambda gpu=None, *a, **k: report)
    monkeypatch.setattr(cli, "ENGINES", ("reference", "cuda"))
    plan = plan_launch(_default_args("--model", str(tiny_model), "--engine", "cuda"))
    cmd = plan.command
    # planned for the file's own shape: the tiny model fits in fp16 at its whole trained context
    tiny = read_config(GGUFFile(tiny_model)).shape
    expected = choose_settings(24 * gib, 23 * gib, 82, "8.6", engine=CUDA_V1, model=tiny)
    assert cmd[cmd.index("--kv") + 1] == "f16" and expected.kv_format == "fp16"
    assert expected.n_ctx == tiny.n_ctx_train < choose_settings(24 * gib, 23 * gib, 82, "8.6").n_ctx
    assert choose_settings(24 * gib, 23 * gib, 82, "8.6", engine=CUDA_V1).kv_format == "q8_0"  # the 27B's
    assert int(cmd[cmd.index("--ctx") + 1]) == expected.n_ctx and not expected.embd_on_host
    parser = argparse.ArgumentParser()
    cli.add_serve_parser(parser.add_subparsers())
    args = parser.parse_args(cmd[cmd.index("serve"):])          # `serve` takes what the launcher passes
    assert args.kv == "f16" and args.ctx == expected.n_ctx
    assert args.prefill_chunk == expected.prefill_chunk                # the chunk its scratch was planned for
    assert args.draft == DEFAULT_DRAFTS                          # MTP speculation on by default
    args = parser.parse_args(plan_launch(_default_args("--model", str(tiny_model), "--engine", "cuda",
                                                       "--draft", "0")).command[cmd.index("serve"):])
    assert args.draft == 0
    with pytest.raises(OpenJetError, match="--draft 8"):
        plan_launch(_default_args("--model", str(tiny_model), "--engine", "cuda", "--draft", "8"))


def _launch_with_fake_server(tmp_path, *fake_args: str) -> tuple[subprocess.Popen, list[str], int, Path]:
    """`openjet-launch --model demo --no-tray` serving FAKE: the launcher process, its stderr lines (read on a
    thread), the port and the file where the fake writes its pid."""
    import signal

    script = tmp_path / "fake_server.py"
    script.write_text(FAKE)
    pid_file = tmp_path / "server.pid"
    prefix = [sys.executable, str(script), "--pid-file", str(pid_file), *fake_args]
    port = free_port()
    env = {**os.environ, "OPENJET_CONFIG_DIR": str(tmp_path / "config"), "OPENJET_LOG_DIR": str(tmp_path / "logs")}
    env.pop("DISPLAY", None)

    def signals_as_in_a_terminal():  # a background job's SIG_IGN would be inherited (and then kept on purpose)
        for sig in (signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
    proc = subprocess.Popen([sys.executable, "-c", RUN_DEFAULT, json.dumps(prefix), "--model", "demo", "--no-tray",
                             "--port", str(port)], env=env, stderr=subprocess.PIPE, text=True,
                            preexec_fn=signals_as_in_a_terminal)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    assert _until(lambda: any("ready at" in line for line in lines), 60), lines
    return proc, lines, port, pid_file


@pytest.mark.skipif(os.name != "posix", reason="SIGHUP")
def test_closing_the_terminal_stops_the_server_and_releases_the_lock(tmp_path):
    import signal

    launcher, lines, port, pid_file = _launch_with_fake_server(tmp_path)
    server_pid = int(pid_file.read_text())
    try:
        launcher.send_signal(signal.SIGHUP)
        launcher.wait(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert _until(lambda: not pid_alive(server_pid), 5), "the server outlived the launcher"
    assert not (tmp_path / "config" / "openjet-launch.lock").exists()
    assert any("stopping the server (up to 15 s" in line for line in lines), lines


@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_a_second_ctrl_c_kills_a_server_that_does_not_stop(tmp_path):
    import signal

    launcher, lines, port, pid_file = _launch_with_fake_server(tmp_path, "--ignore-term")
    server_pid = int(pid_file.read_text())
    try:
        launcher.send_signal(signal.SIGINT)
        assert _until(lambda: any("stopping the server" in line for line in lines), 10), lines
        time.sleep(0.5)
        t0 = time.monotonic()
        launcher.send_signal(signal.SIGINT)
        launcher.wait(timeout=30)
        assert time.monotonic() - t0 < 5  # not the 15 s grace period
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert _until(lambda: not pid_alive(server_pid), 5), "the server outlived the launcher"
    assert not (tmp_path / "config" / "openjet-launch.lock").exists()


@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_sigterm_while_preparing_the_model_releases_the_lock(tmp_path, monkeypatch, capsys):
    """Before any server exists (a download, say), SIGTERM ends the launcher with a message and no lock left."""
    import signal

    from openjet_launcher.launcher import main

    def download_interrupted(args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        pytest.fail("SIGTERM did not interrupt")
    monkeypatch.setattr(main, "plan_launch", download_interrupted)
    monkeypatch.setenv("OPENJET_CONFIG_DIR", str(tmp_path / "config"))
    assert main.run_default(_default_args("--no-tray", "--port", str(free_port()))) == 130
    assert "interrupted" in capsys.readouterr().err
    assert not (tmp_path / "config" / "openjet-launch.lock").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_whose_launcher_is_gone_ends_at_once(monkeypatch):
    """die_with_parent, which `serve` calls first (in a child process here, as a server runs it): a server started
    by a launcher that is no longer its parent exits; one whose launcher is its parent goes on; without the
    supervisor's variable (a server started by hand) it does nothing."""
    from openjet_launcher.launcher.supervisor import PARENT_PID_ENV, die_with_parent
    monkeypatch.delenv(PARENT_PID_ENV, raising=False)
    die_with_parent()
    code = "from openjet_launcher.launcher.supervisor import die_with_parent; die_with_parent(); print('went on')"
    for parent, ok in ((os.getpid(), True), (os.getpid() + 100000, False)):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                           env={**os.environ, PARENT_PID_ENV: str(parent)})
        assert (r.returncode == 0 and "went on" in r.stdout) if ok else (r.returncode == 1 and "gone" in r.stderr), r


def test_a_server_that_failed_before_the_terminal_watches_it_ends_the_launcher():
    """The server can fail for good between sup.start() and _run_terminal's FAILED watcher (its failure callback
    then came before the watcher was there): the launcher must still end with status 1 instead of waiting forever."""
    from types import SimpleNamespace

    from openjet_launcher.launcher import main

    failed_already = SimpleNamespace(state=FAILED, on_state=lambda fn: None)   # no callback will ever come
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("code", main._run_terminal(failed_already)), daemon=True)
    t.start()
    t.join(15)
    assert out.get("code") == 1, "the server had failed, but the launcher was still waiting after 15 s"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_that_is_not_ours_does_not_outlive_a_killed_launcher(tmp_path):
    """`serve` asks to end with the launcher itself (die_with_parent); a server that cannot (llama-server, here a
    stand-in HTTP server) runs through orphan_guard, so a launcher killed without its cleanup (SIGKILL) leaves no
    server holding the port."""
    fake = ("import http.server,sys; http.server.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), type('H', "
            "(http.server.BaseHTTPRequestHandler,), {'do_GET': lambda s: (s.send_response(200), s.end_headers()), "
            "'log_message': lambda *a: None})).serve_forever()")
    launcher = textwrap.dedent('''
        import sys, time
        from openjet_launcher.launcher.supervisor import Supervisor, health_url
        port = int(sys.argv[1])
        sup = Supervisor([sys.executable, "-c", sys.argv[2], str(port)], health_url("127.0.0.1", port),
                         log_dir=sys.argv[3])
        sup.start()
        assert sup.wait_ready(30)
        print(sup.proc.pid, flush=True)
        time.sleep(600)
    ''')
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", launcher, str(port), fake, str(tmp_path)], stdout=subprocess.PIPE,
                            text=True, cwd=Path(__file__).resolve().parents[1])
    child = int(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    try:
        assert _until(lambda: not pid_alive(child), 10), f"the server (pid {child}) outlived its launcher"
    finally:
        if pid_alive(child):
            os.kill(child, signal.SIGKILL)
