"""GPU tests append their measured figures, one JSON object a line, to $OPENJET_GPU_REPORT when it is set
(how a device run brings its numbers back); the tests' assertions never depend on it."""

import json
import os


def report(**fields) -> None:
    path = os.environ.get("OPENJET_GPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(fields) + "\n")
