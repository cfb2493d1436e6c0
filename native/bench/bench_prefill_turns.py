"""What keeping prefill calls on the chunked GDN's 32-token boundaries costs (issue 8; cuda.py gdn_chunk_rows): a
prompt whose length is not a multiple of 32 is read in two calls (the second of fewer than 32 rows, after a checkpoint
at the chunk's start), and a second turn rewinds to that checkpoint and reads the chunk again. Times, on one model,
fresh prefills of aligned and unaligned lengths and a second turn after a first, with the chunked GDN (the default)
and with the recurrence (OPENJET_GDN_CHUNKED=0, no cuts). Prints JSON.

    OPENJET_LIBRARY=/tmp/b/native/libopenjet.so PYTHONPATH=. python3 native/bench/bench_prefill_turns.py MODEL.gguf
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from openjet_launcher.engine.cuda import CudaEngine  # noqa: E402

FRESH = (4096, 4100, 4127)       # aligned, 4 past a boundary, 31 past one
TURNS = ((4000, 100), (4090, 10))  # first turn, second turn (tokens)
RUNS = 3


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    model = sys.argv[1]
    ids = np.random.default_rng(5).integers(0, 200000, 8192)
    out = {"bench": "prefill turns (issue 8)", "commit": os.environ.get("OPENJET_COMMIT", ""), "model": model,
           "runs": []}
    for form in ("2", "0"):  # the switch is read at load (the two-phase form's scratch) and at each call
        os.environ["OPENJET_GDN_CHUNKED"] = form
        engine = CudaEngine.load(model, n_ctx=8192, kv_type="q8_0", prefill_rows=2048)
        try:
            engine.prefill(engine.new_state(), ids[:2048])  # warm-up
            for n in FRESH:
                s = [timed(lambda: engine.prefill(engine.new_state(), ids[:n])) for _ in range(RUNS)]
                out["runs"].append({"gdn": form, "fresh": n, "ms": round(1e3 * statistics.median(s), 2)})
                print(json.dumps(out["runs"][-1]), file=sys.stderr)
            for first, second in TURNS:
                s = []
                for _ in range(RUNS):
                    state = engine.new_state()
                    engine.prefill(state, ids[:first])
                    s.append(timed(lambda: engine.prefill(state, ids[first:first + second])))
                out["runs"].append({"gdn": form, "turn1": first, "turn2": second,
                                    "turn2_ms": round(1e3 * statistics.median(s), 2)})
                print(json.dumps(out["runs"][-1]), file=sys.stderr)
        finally:
            engine.close()
            os.environ.pop("OPENJET_GDN_CHUNKED", None)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
