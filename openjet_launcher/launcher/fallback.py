"""`--fallback llama-server`: serve a GGUF our engine cannot run with llama.cpp's `llama-server` from PATH.

Same address, port and context as our server would use; `--jinja` so the GGUF's chat template (reasoning,
tool calls) applies; MTP self-speculation (`--spec-type draft-mtp`) when the file carries an MTP head;
every layer on the GPU. llama-server's /health also answers 503 while loading and 200 once ready, so the
Supervisor watches it unchanged.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..errors import OpenJetError

FALLBACKS = ("llama-server",)
MTP_DRAFT_MAX = 4  # drafts per step for llama.cpp's MTP speculation

INSTALL_HINT = ("llama-server was not found on PATH. Install llama.cpp (a release build from "
                "github.com/ggml-org/llama.cpp/releases with CUDA, `brew install llama.cpp`, or build it with "
                "`cmake -B build -DGGML_CUDA=ON && cmake --build build --target llama-server`) and put "
                "llama-server on PATH, or point $OPENJET_LLAMA_SERVER at it.")


class FallbackError(OpenJetError):
    pass


def find_llama_server() -> str | None:
    """$OPENJET_LLAMA_SERVER, else `llama-server` on PATH."""
    explicit = os.environ.get("OPENJET_LLAMA_SERVER")
    if explicit:
        return explicit if Path(explicit).is_file() else shutil.which(explicit)
    return shutil.which("llama-server")


def has_mtp_head(path: str | os.PathLike) -> bool:
    """Whether the GGUF carries an MTP (next-n) block: llama.cpp names its tensors `blk.N.nextn.*`."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(os.fspath(path))
    except Exception:
        return False
    return any(".nextn." in t.name for t in reader.tensors)


def llama_server_command(exe: str, model: str | os.PathLike, *, host: str = "127.0.0.1", port: int = 8080,
                         ctx: int | None = None, mtp: bool = False, alias: str | None = None) -> list[str]:
    """llama-server's command line equivalent to `openjet-launch serve` (API key via $LLAMA_API_KEY)."""
    cmd = [exe, "-m", os.fspath(model), "--host", host, "--port", str(port), "--jinja", "-ngl", "999"]
    if ctx:
        cmd += ["-c", str(ctx)]
    if alias:
        cmd += ["--alias", alias]
    if mtp:
        cmd += ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(MTP_DRAFT_MAX)]
    return cmd


def fallback_command(name: str, model: str | os.PathLike, *, host: str, port: int,
                     ctx: int | None) -> list[str]:
    """The command for fallback `name`, or FallbackError saying what to install."""
    if name not in FALLBACKS:
        raise FallbackError(f"unknown fallback {name!r}: the one supported is llama-server")
    exe = find_llama_server()
    if exe is None:
        raise FallbackError(INSTALL_HINT)
    return llama_server_command(exe, model, host=host, port=port, ctx=ctx, mtp=has_mtp_head(model),
                                alias=Path(model).name)


def api_key_env(api_key: str | None) -> dict[str, str]:
    """llama-server reads its key from LLAMA_API_KEY: kept off the command line."""
    return {"LLAMA_API_KEY": api_key} if api_key else {}
