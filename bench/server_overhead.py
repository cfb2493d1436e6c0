"""The server's own cost per streamed token (a benchmark, not a test): prints one JSON object.

    python bench/server_overhead.py                 # 3 runs of 3000 streamed tokens
    python bench/server_overhead.py --tokens 5000 --runs 5 --profile

A fast engine double (a fixed logits row, returned at once) behind the real stack: uvicorn with the limits
`serve` applies, the engine worker thread, sampler, detokenizer, stop matcher, output parser, SSE chunks.
The client is another process (it reads the stream with a raw socket), so it takes no GIL from the server.
ms_per_token = (wall - engine time) / tokens, wall measured by the client from sending the request to
`data: [DONE]`; target under 0.3 ms. --profile runs one more request under cProfile (both server threads)
and prints the top functions by own time to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from openjet_launcher.engine.interface import StepOutput  # noqa: E402
from openjet_launcher.model.gguf_file import GGUFFile  # noqa: E402
from openjet_launcher.model.synth import synthesize  # noqa: E402
from openjet_launcher.sampling import Sampler, SamplingParams  # noqa: E402
from openjet_launcher.server import ServerSettings, create_app  # noqa: E402
from openjet_launcher.server.limits import uvicorn_options  # noqa: E402
from openjet_launcher.text.chat import ChatTemplate  # noqa: E402
from openjet_launcher.text.tokenizer import Tokenizer  # noqa: E402
from tests.server.scripted import ScriptedEngine  # noqa: E402

QWEN_VOCAB = 248_320        # the real model's logits row, for the sampler figure


class FastEngine(ScriptedEngine):
    """Every step returns the same logits row (all mass on `token`) at once; counts its own time. The rest
    (states, checkpoints, truncate, memory) is the scripted test double's."""

    def __init__(self, n_vocab: int, token: int):
        super().__init__(n_vocab)
        self.row = np.full((1, n_vocab), -1e4, np.float32)
        self.row[0, token] = 1e4
        self.hidden = np.zeros((1, 1), np.float32)
        self.seconds = 0.0

    def prefill(self, state, tokens, *, chunk_size=64, all_logits=False):
        return self._step(state, tokens)

    def decode(self, state, tokens):
        return self._step(state, tokens)

    def _step(self, state, tokens) -> StepOutput:
        t0 = time.perf_counter()
        state.token_ids.extend(tokens)
        out = StepOutput(self.row, self.hidden)
        self.seconds += time.perf_counter() - t0
        return out


# A client in its own process: send the request, read raw bytes until [DONE], print wall time and bytes.
CLIENT = r"""
import json, socket, sys, time
port, body = int(sys.argv[1]), sys.argv[2].encode()
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
t0 = time.perf_counter()
s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
data = bytearray()
while not data.endswith(b"data: [DONE]\n\n") and not data.endswith(b"0\r\n\r\n"):
    chunk = s.recv(1 << 16)
    if not chunk:
        break
    data += chunk
wall = time.perf_counter() - t0
usage = [json.loads(l[6:]) for l in data.decode().split("\r\n") if l.startswith("data: {") and '"usage"' in l]
print(json.dumps({"wall_s": wall, "bytes": len(data), "chunks": data.count(b"data: "),
                  "tokens": usage[-1]["usage"]["completion_tokens"] if usage else None}))
"""


def run_client(port: int, n_tokens: int) -> dict:
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": n_tokens, "stream": True,
                       "temperature": 0, "stream_options": {"include_usage": True},
                       "chat_template_kwargs": {"enable_thinking": False}})
    out = subprocess.run([sys.executable, "-c", CLIENT, str(port), body], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def sampler_cost_ms(n_vocab: int, reps: int = 200) -> dict:
    """Sampling one token from a real-size logits row (outside the server: its cost scales with the vocab)."""
    row = np.random.default_rng(0).standard_normal(n_vocab).astype(np.float32)
    out = {}
    for name, params in (("greedy", SamplingParams(temperature=0.0)), ("t1_top_p0.9", SamplingParams(top_p=0.9))):
        s = Sampler(params.validate(None), n_vocab)
        t0 = time.perf_counter()
        for _ in range(reps):
            s.sample(row)
        out[name] = (time.perf_counter() - t0) / reps * 1e3
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=3000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="cProfile one more run, top functions to stderr")
    args = ap.parse_args()

    import uvicorn

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiny.gguf"
        synthesize("tiny", path, show_progress=False)
        gguf = GGUFFile(path)
        tokenizer, template = Tokenizer.from_gguf(gguf), ChatTemplate.from_gguf(gguf)
    token = tokenizer.encode(" word")[0]
    engine = FastEngine(tokenizer.n_vocab, token)
    settings = ServerSettings(model_id="bench", n_ctx=args.tokens + 256)
    app = create_app(engine, tokenizer, template, settings)
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           **uvicorn_options(settings)))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not app.state.core.worker.ready.is_set() or not server.started:
        time.sleep(0.02)
    run_client(port, 50)                                       # warm-up

    runs = []
    for _ in range(args.runs):
        engine.seconds = 0.0
        r = run_client(port, args.tokens)
        r["engine_s"] = engine.seconds
        r["ms_per_token"] = (r["wall_s"] - engine.seconds) / r["tokens"] * 1e3
        runs.append(r)

    if args.profile:
        import cProfile
        import pstats
        # cProfile profiles the thread that enables it: the event loop's and the worker's, each from inside.
        prof, worker_prof = cProfile.Profile(), cProfile.Profile()
        loop = server.servers[0].get_loop()
        loop.call_soon_threadsafe(prof.enable)
        _profile_worker(app, worker_prof)
        run_client(port, args.tokens)
        done = threading.Event()
        loop.call_soon_threadsafe(lambda: (prof.disable(), done.set()))
        done.wait(5)
        for name, p in (("event loop", prof), ("engine worker", worker_prof)):
            print(f"--- {name} (own time) ---", file=sys.stderr)
            pstats.Stats(p, stream=sys.stderr).sort_stats("tottime").print_stats(18)

    server.should_exit = True
    thread.join(10)
    per = [r["ms_per_token"] for r in runs]
    print(json.dumps({
        "bench": "server_overhead", "tokens_per_run": args.tokens, "runs": runs,
        "ms_per_token_median": statistics.median(per), "target_ms_per_token": 0.3,
        "tokens_per_second_server_bound": 1e3 / statistics.median(per),
        "sse_bytes_per_token": statistics.median(r["bytes"] / r["tokens"] for r in runs),
        "sampler_ms_per_token_qwen_vocab": sampler_cost_ms(QWEN_VOCAB),
        "python": sys.version.split()[0], "cpus": os.cpu_count(),
    }, indent=1))
    return 0


def _profile_worker(app, prof) -> None:
    """Profile the engine worker thread from its next job on (cProfile is per thread)."""
    worker = app.state.core.worker
    serve = worker._serve

    def profiled(slot, job):
        prof.enable()
        try:
            serve(slot, job)
        finally:
            prof.disable()
    worker._serve = profiled


if __name__ == "__main__":
    raise SystemExit(main())
