"""Runs a server command that cannot ask the kernel itself to end with the launcher (llama-server; `serve` asks in
supervisor.die_with_parent): on Linux, `python -m openjet_launcher.launcher.orphan_guard EXE ARGS...` asks for
PR_SET_PDEATHSIG, which an exec keeps, then becomes EXE. Without it a launcher killed without its cleanup (SIGKILL,
the OOM killer, a crash in the tray's code) left the server holding the port and the GPU's memory, and the next launch
then blamed "another program" for the port."""

from __future__ import annotations

import os
import sys

from .supervisor import die_with_parent


def main(argv: list[str]) -> None:
    die_with_parent()
    os.execv(argv[0], argv)  # (argv[0]: the resolved path, Supervisor._spawn)


if __name__ == "__main__":
    main(sys.argv[1:])
