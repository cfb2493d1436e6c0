"""`serve`'s command line: the parser the lead wires in, loopback detection, a real launch answering."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import httpx

import pytest

from openjet_launcher.launcher import download
from openjet_launcher.server import cli
from openjet_launcher.server.cli import add_serve_parser, is_loopback

from .conftest import free_port, serve_app


def test_serve_parser_defaults_and_options():
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "demo"])
    assert (args.model, args.engine, args.host, args.port, args.ctx, args.api_key) == \
        ("demo", "reference", "127.0.0.1", 8080, None, None)
    args = parser.parse_args(["serve", "m.gguf", "--host", "0.0.0.0", "--port", "9", "--ctx", "512", "--api-key", "k"])
    assert (args.host, args.port, args.ctx, args.api_key) == ("0.0.0.0", 9, 512, "k")


def test_serve_max_tokens_takes_a_ceiling_of_at_least_one_token(tiny_path):
    assert serve_app(str(tiny_path), "--ctx", "512", "--max-tokens", "7").state.core.settings.max_tokens_ceiling == 7
    for bad in ("0", "-5"):
        with pytest.raises(cli.OpenJetError, match=f"--max-tokens {bad}: a request must be allowed at least 1 token"):
            serve_app(str(tiny_path), "--ctx", "512", "--max-tokens", bad)


def test_loopback_detection():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4") and not is_loopback("example.com")


def test_serve_warns_beyond_loopback_without_a_key_and_answers(tiny_path, serve_engine_args):
    port = free_port()
    code = ("import argparse,sys; from openjet_launcher.server.cli import add_serve_parser;"
            "p=argparse.ArgumentParser(); add_serve_parser(p.add_subparsers());"
            "a=p.parse_args(sys.argv[1:]); sys.exit(a.func(a))")
    env = {k: v for k, v in os.environ.items() if k != "OPENJET_API_KEY"}
    proc = subprocess.Popen([sys.executable, "-c", code, "serve", str(tiny_path), "--host", "0.0.0.0",
                             "--port", str(port), "--ctx", "512", *serve_engine_args],
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline, ok = time.monotonic() + 60, False
        while time.monotonic() < deadline and not ok:
            try:
                ok = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
            except httpx.TransportError:
                time.sleep(0.1)
        assert ok
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=30,
                       json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert "without an API key" in err


def test_serve_resolves_a_hugging_face_spec_through_ensure_model(monkeypatch, tiny_path):
    asked = []

    def ensure_model(spec, **kw):
        asked.append(spec)
        return download.LocalModel(path=tiny_path, parts=(tiny_path,), repo="someone/model", commit="c0ffee")
    monkeypatch.setattr(download, "ensure_model", ensure_model)
    app = serve_app("someone/model/tiny-Q8_0.gguf", "--ctx", "512")
    assert asked == ["someone/model/tiny-Q8_0.gguf"]
    assert app.state.core.settings.model_id == tiny_path.name


def test_serve_takes_a_path_or_demo_without_the_hub(monkeypatch, tiny_path, tmp_path, capsys):
    def no_hub(spec, **kw):
        raise AssertionError(f"{spec} went to the Hub")
    monkeypatch.setattr(download, "ensure_model", no_hub)
    assert serve_app(str(tiny_path), "--ctx", "512").state.core.settings.model_id == tiny_path.name
    monkeypatch.setenv("OPENJET_CACHE", str(tmp_path))
    if cli.bundled_demo_file().is_file():       # the trained demo model in the package
        assert cli.model_path("demo") == cli.bundled_demo_file()
        assert capsys.readouterr().err == ""
    # without it (a checkout where it was removed): the synthetic tiny model in the cache, with a warning
    monkeypatch.setattr(cli, "bundled_demo_file", lambda: tmp_path / "absent" / cli.DEMO_FILE)
    assert cli.model_path("demo") == tmp_path / "models" / "openjet-synthetic-tiny.gguf"
    assert cli.model_path("demo").is_file()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "bundled demo model" in err[0] and "synthetic tiny model" in err[0]


def test_serve_demo_answers_an_openai_sdk_chat_request(monkeypatch):
    """`serve demo` as the CLI builds it (bundled model, reference engine), live, through the real OpenAI SDK;
    the answer separated from the thinking, as the demo model was trained to give it."""
    openai = pytest.importorskip("openai")
    from .conftest import LiveServer

    if not cli.bundled_demo_file().is_file():
        pytest.skip("no bundled demo model in this checkout")
    app = serve_app("demo", "--ctx", "512")
    assert app.state.core.settings.model_id == cli.DEMO_FILE
    with LiveServer(app) as server, openai.OpenAI(base_url=server.base + "/v1", api_key="none", timeout=60) as client:
        t0 = time.monotonic()
        r = client.chat.completions.create(model=cli.DEMO_FILE, max_tokens=120, temperature=0,
                                           messages=[{"role": "user", "content": "Hi, who are you?"}])
        seconds = time.monotonic() - t0
    assert r.choices[0].finish_reason == "stop"
    assert "OpenJet" in r.choices[0].message.content and "</think>" not in r.choices[0].message.content
    assert seconds < 30, seconds


def test_a_missing_local_path_is_an_error_that_says_so(tmp_path):
    with pytest.raises(download.DownloadError, match="no such model file"):
        cli.model_path(str(tmp_path / "nope.gguf"))


@pytest.mark.parametrize("engine", ["reference", "cuda"])
def test_serve_refuses_more_drafts_than_a_step_holds_before_loading_on_every_engine(tiny_path, engine):
    """A verify step holds 8 tokens (engine/interface.py): --draft 8 (or a negative count) is refused up front,
    naming the maximum, on the reference engine too (it used to start and then fail every request)."""
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    for n, msg in (("8", "at most 7 drafts"), ("-1", "cannot be negative")):
        args = parser.parse_args(["serve", str(tiny_path), "--engine", engine, "--draft", n])
        with pytest.raises(cli.OpenJetError, match=msg):
            cli.cmd_serve(args)


def test_a_model_that_fails_to_load_ends_serve_with_the_load_exit_code_and_one_error_line(tiny_path, monkeypatch,
                                                                                        capsys):
    """/health says 503 while the model loads; a load that fails ends `serve` at once with EXIT_LOAD_FAILED and
    the reason as one line on stderr (no traceback), so the launcher reports it instead of waiting 15 minutes."""
    from openjet_launcher import cli as main_cli
    from openjet_launcher.errors import EXIT_LOAD_FAILED, OpenJetError
    from openjet_launcher.reference import ReferenceEngine

    def fail(path):
        raise OpenJetError("No usable NVIDIA GPU (no driver)")
    monkeypatch.setattr(ReferenceEngine, "load", staticmethod(fail))
    t0 = time.monotonic()
    code = main_cli.main(["serve", str(tiny_path), "--port", str(free_port()), "--ctx", "512"])
    assert code == EXIT_LOAD_FAILED and time.monotonic() - t0 < 60
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == "openjet-launch serve: error: the model failed to load: No usable NVIDIA GPU " \
                                   "(no driver)"


def test_serve_checks_the_port_and_the_host_before_loading_the_model(tmp_path, monkeypatch):
    import socket

    from openjet_launcher.launcher.supervisor import port_number

    monkeypatch.setattr(cli, "model_path", lambda spec: pytest.fail("the model was looked at first"))
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        args = parser.parse_args(["serve", "demo", "--port", str(busy.getsockname()[1])])
        with pytest.raises(cli.OpenJetError, match="already in use"):
            cli.cmd_serve(args)
    args = parser.parse_args(["serve", "demo", "--host", "203.0.113.7", "--port", str(free_port())])
    with pytest.raises(cli.OpenJetError, match="--host 203.0.113.7: this machine has no such address"):
        cli.cmd_serve(args)
    for bad in ("0", "-1", "70000", "http"):
        with pytest.raises(argparse.ArgumentTypeError):
            port_number(bad)
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "demo", "--port", "70000"])
    for bad in ("0", "5", "-1"):
        with pytest.raises(cli.OpenJetError, match=f"--ctx {bad} is too small: give at least 16"):
            cli.cmd_serve(parser.parse_args(["serve", "demo", "--ctx", bad]))


def test_the_draft_vocabulary_is_used_only_where_the_list_maps_onto_the_model(text_layer, caplog):
    """`serve --draft` maps the shipped list onto the model's tokens: the tiny model's own small vocabulary
    holds too few of them, so drafting stays on the full vocabulary and the log says why; a vocabulary made of
    the list's own strings maps onto all of them."""
    import logging

    from openjet_launcher.model.draft_vocab import SHIPPED, load

    tokenizer, _ = text_layer
    with caplog.at_level(logging.INFO, logger=cli.log.name):
        assert cli.draft_vocabulary(tokenizer) is None
    assert "not used" in caplog.text and "full vocabulary" in caplog.text
    strings = list(load(SHIPPED).tokens)
    ids = cli.draft_vocabulary(["<pad>", *strings])
    assert ids is not None and list(ids) == list(range(1, len(strings) + 1))


def test_serve_engine_cuda_loads_with_the_kv_format_and_checkpoints_the_memory_plan_assumes(tiny_path, monkeypatch):
    """`serve --engine cuda --kv q8_0` (what openjet-launch passes on a 24 GB card) loads the engine with that
    KV format and the state copies the launcher's memory plan holds (STATE_COPIES: the live state and
    checkpoints; with --draft, which adds the MTP head, the engine's verify shadow takes one checkpoint's
    place)."""
    from openjet_launcher.engine.cuda import PREFILL_ROWS, CudaEngine
    from openjet_launcher.launcher.memory import STATE_COPIES

    seen = {}
    monkeypatch.setattr(CudaEngine, "load", classmethod(lambda cls, path, **kw: seen.update(kw) or "engine"))
    for extra, kv, mtp, checkpoints, rows in (([], "f16", False, STATE_COPIES - 1, PREFILL_ROWS),
                                              (["--kv", "q8_0", "--draft", "3", "--prefill-chunk", "2048"], "q8_0",
                                               True, STATE_COPIES - 2, 2048)):
        app = serve_app(str(tiny_path), "--engine", "cuda", "--ctx", "2048", *extra)
        assert app.state.core.worker._engine_or_loader() == "engine"
        assert seen == {"n_ctx": 2048, "kv_type": kv, "n_checkpoints": checkpoints, "mtp": mtp,
                        "prefill_rows": rows}
    for bad in ("0", "8193"):
        with pytest.raises(cli.OpenJetError, match=f"--prefill-chunk {bad}: expected 1..8192"):
            serve_app(str(tiny_path), "--engine", "cuda", "--prefill-chunk", bad)
