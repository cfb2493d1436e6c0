"""User mistakes on the command line end in one line on stderr and a non-zero exit, never a traceback; a
destination that exists is never replaced without --force, and a device or folder never at all."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from openjet_launcher import cli


def _fails_with_one_line(capsys, argv: list[str], says: str) -> str:
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code != 0, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert says in err, err
    return err


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from openjet_launcher.model.synth import synthesize

    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    synthesize("tiny", path, show_progress=False)
    return path


# --- run ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, says", [
    (["-n", "0"], "-n 0: generate at least 1 token"),
    (["-n", "-1"], "-n -1: generate at least 1 token"),
    (["--seed", "-1"], "--seed -1: choose 0 or more"),
    (["--draft", "-1"], "--draft -1: the number of drafts per step cannot be negative"),
    (["--draft", "8"], "--draft 8: at most 7 drafts per step"),
])
def test_run_refuses_bad_numbers_in_one_line(capsys, tiny, argv, says):
    _fails_with_one_line(capsys, ["run", str(tiny), "-p", "hi", *argv], says)


def test_run_takes_demo_like_serve(capsys):
    assert cli.main(["run", "demo", "-p", "hi", "-n", "1"]) == 0
    assert "1 generated" in capsys.readouterr().err


# --- synth -------------------------------------------------------------------------------------------------


def test_synth_never_replaces_what_exists_without_force_nor_anything_but_a_file(capsys, tmp_path):
    existing = tmp_path / "exists.gguf"
    existing.write_bytes(b"keep me")
    _fails_with_one_line(capsys, ["synth", "--preset", "tiny", "--quiet", str(existing)], "--force")
    assert existing.read_bytes() == b"keep me"
    folder = tmp_path / "folder.gguf"
    folder.mkdir()
    _fails_with_one_line(capsys, ["synth", "--preset", "tiny", "--quiet", "--force", str(folder)],
                         "is not a regular file")
    fifo = tmp_path / "fifo.gguf"  # stands for a device file (/dev/full): not a regular file
    os.mkfifo(fifo)
    _fails_with_one_line(capsys, ["synth", "--preset", "tiny", "--quiet", "--force", str(fifo)],
                         "is not a regular file")
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    _fails_with_one_line(capsys, ["synth", "--preset", "tiny", "--quiet", str(tmp_path / "no" / "x.gguf")],
                         "does not exist")
    assert cli.main(["synth", "--preset", "tiny", "--quiet", "--force", str(existing)]) == 0
    assert json.loads(capsys.readouterr().out)["bytes"] == existing.stat().st_size > 1_000_000


@pytest.mark.parametrize("argv, says", [(["--seed", "-5"], "seed -5: choose 0 or more"),
                                        (["--workers", "-1"], "workers -1: choose 1 or more"),
                                        (["--workers", "0"], "workers 0: choose 1 or more")])
def test_synth_refuses_bad_numbers_in_one_line(capsys, tmp_path, argv, says):
    _fails_with_one_line(capsys, ["synth", "--preset", "tiny", "--quiet", str(tmp_path / "x.gguf"), *argv], says)
    assert not (tmp_path / "x.gguf").exists()


def test_synth_help_gives_the_tiny_presets_real_size(tiny):
    sub = next(a for a in cli.build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    described = sub.choices["synth"].description
    size_mb = round(tiny.stat().st_size / 1e6)
    assert f"tiny (CPU tests, ~{size_mb} MB)" in described


# --- inspect, probe ----------------------------------------------------------------------------------------


def test_inspect_json_answers_for_a_file_it_cannot_describe(capsys, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(b"GGUF\x03\x00")
    assert cli.main(["inspect", "--json", str(cut)]) == 1
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert report["runnable"] is False and report["error"] and "Traceback" not in out.err


def test_probe_exits_nonzero_when_its_report_is_an_error(capsys, monkeypatch):
    import openjet_launcher.engine as engine

    monkeypatch.setattr(engine, "probe", lambda: {"error": {"name": "cudaErrorNoDevice", "message": "none"}})
    assert cli.main(["probe"]) == 1
    assert json.loads(capsys.readouterr().out)["error"]["name"] == "cudaErrorNoDevice"
    monkeypatch.setattr(engine, "probe", lambda: {"error": None, "devices": []})
    assert cli.main(["probe"]) == 0


# --- folders and numbers of the launcher's subcommands -----------------------------------------------------


def test_a_models_folder_that_is_a_file_is_a_one_line_error(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    _fails_with_one_line(capsys, ["download", "someone/repo/x.gguf", "--models-dir", str(a_file)],
                         "point OPENJET_MODELS_DIR (or `openjet-launch download --models-dir`) at a folder")


@pytest.mark.parametrize("vram", ["inf", "nan", "0", "-3"])
def test_presets_refuses_a_vram_that_is_no_size(capsys, vram):
    _fails_with_one_line(capsys, ["presets", "--vram", vram], f"--vram {float(vram)}")


def test_an_option_of_the_default_action_before_a_command_is_refused_not_dropped(capsys):
    """`openjet-launch --api-key K serve ...`: serve's own --api-key default used to replace the one given, so the
    server ran without the key asked for (found in review). Options before a command are refused, naming them."""
    with pytest.raises(SystemExit) as e:
        cli.main(["--api-key", "s3cret", "--port", "9000", "serve", "demo"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--api-key" in err and "--port" in err and "after the command" in err


def test_a_reader_that_leaves_a_pipe_ends_the_command_quietly(tmp_path):
    """`openjet-launch presets --json | head -1`: a BrokenPipeError traceback before (found in review)."""
    import subprocess
    import sys
    cmd = f"{sys.executable} -m openjet_launcher presets --json | head -c 10"
    r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert "Traceback" not in r.stderr and "BrokenPipeError" not in r.stderr, r.stderr


@pytest.mark.parametrize("argv, says", [
    (["presets", "--vram", "24", "--cc", "abc", "--only"], "not a compute capability"),
    (["doctor", "--probe-timeout", "nan"], "number of seconds"),
    (["doctor", "--probe-timeout", "0"], "number of seconds"),
    (["serve", "demo", "--max-connections", "0"], "at least 1"),
    (["serve", "demo", "--max-body", "-1"], "at least 1"),
    (["serve", "demo", "--stall-timeout", "0"], "above 0"),
])
def test_bad_option_values_are_usage_errors_not_tracebacks_or_a_server_that_refuses_all(capsys, argv, says):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_synth_into_a_folder_it_cannot_write_is_a_one_line_error(capsys, tmp_path, monkeypatch):
    from openjet_launcher.model import synth

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied", str(tmp_path / "x.gguf.part"))

    monkeypatch.setattr(synth, "write_gguf", refuse)
    assert cli.main(["synth", "--preset", "tiny", "--quiet", str(tmp_path / "x.gguf")]) == 1
    err = capsys.readouterr().err
    assert "cannot write" in err and "Permission denied" in err and "Traceback" not in err


def test_an_option_the_command_does_not_have_is_not_advised_after_it(capsys):
    """`openjet-launch --port 9000 inspect FILE`: the advice was to put --port after `inspect`, which has no --port."""
    with pytest.raises(SystemExit) as e:
        cli.main(["--port", "9000", "inspect", "x.gguf"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--port does not apply to `inspect`" in err and "after the command" not in err


def test_run_on_a_file_without_token_types_and_without_an_mtp_head(tmp_path, capsys):
    """A file without tokenizer.ggml.token_type (inspect calls it runnable) crashed `run` with a KeyError; --draft on
    a model without an MTP head generated without drafts and said nothing; the stop token was printed as text."""
    from test_model_file import TINY, write_variant

    from openjet_launcher.model.inventory import expected_tensors

    def no_types(w):
        del w.kv_data[0]["tokenizer.ggml.token_type"]
    mtp = {s.name for s in expected_tensors(TINY) if s.block == TINY.n_layer}
    model = write_variant(tmp_path / "plain.gguf", customize=no_types, drop=mtp)
    code = cli.main(["run", str(model), "-p", "hello", "-n", "3", "--draft", "2"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "no MTP head, so it generates without drafts" in captured.err and "Traceback" not in captured.err
    assert "<|im_end|>" not in captured.out


def test_a_folder_or_an_unreadable_file_is_said_as_such(tmp_path):
    """A folder was 'no such file'; a file without read permission was a PermissionError traceback in `run` and
    'damaged' in `inspect`; a GGUF of another version was 'damaged or truncated'."""
    import os

    from openjet_launcher.errors import ModelFileError
    from openjet_launcher.model.gguf_file import GGUFFile

    with pytest.raises(ModelFileError, match="is a folder, not a .gguf file"):
        GGUFFile(tmp_path)
    v4 = tmp_path / "v4.gguf"
    v4.write_bytes(b"GGUF" + (4).to_bytes(4, "little") + bytes(16))
    with pytest.raises(ModelFileError, match="GGUF version 4 is not supported"):
        GGUFFile(v4)
    locked = tmp_path / "locked.gguf"
    locked.write_bytes(b"GGUF" + bytes(20))
    locked.chmod(0)
    if os.access(locked, os.R_OK):
        pytest.skip("this user reads anything (root)")
    with pytest.raises(ModelFileError, match="cannot read it: Permission denied"):
        GGUFFile(locked)
