"""The host's own cost per speculative cycle on the CUDA engine (a benchmark, not a test): prints one JSON object.

    python bench/host_cycle.py                      # 2000 cycles per case
    python bench/host_cycle.py --cycles 500 --profile

CudaEngine (the Python above the C API: drafting, ranking, verify_top, accept, the draft vocabulary's rows) and
speculative_cycle over tests/test_cuda_binding.py's fake library, made instant: its calls copy precomputed rows of
the 27B's shapes (a 248,320-entry vocabulary, a 32,768-row draft vocabulary), so what is timed is the host's work
a GPU cycle waits on. Cases: greedy and sampled (top-k 20) requests; a plain decode step (no drafts); cycles of 1
and 3 drafts, chained on the device or drafted step by step with a host ranking (CudaEngine.native_draft; greedy:
the whole cycle in one call), and sampled cycles in one call (CudaEngine.native_sampled_cycle). --profile prints the
top functions of the slowest case to stderr.
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import json
import pstats
import sys
import time
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from openjet_launcher.engine.cuda import CudaEngine  # noqa: E402
from openjet_launcher.sampling import Sampler, SamplingParams  # noqa: E402
from openjet_launcher.speculative import plain_step, speculative_cycle  # noqa: E402
from tests.test_cuda_binding import FakeLib  # noqa: E402

N_VOCAB, N_EMBD, DRAFT_ROWS = 248_320, 5120, 32_768


class InstantLib(FakeLib):
    """The fake library with the hot calls reduced to copies of precomputed rows (every draft agrees with the
    target's top 1, so greedy cycles keep all their drafts)."""

    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(0)
        self.head = rng.standard_normal(N_VOCAB).astype(np.float32)
        self.top_ids = np.argsort(-self.head)[:32].astype(np.int32)

    def openjet_engine_mtp_step(self, h, token, k, logits, hidden):
        n = len(self.rows) or N_VOCAB
        np.ctypeslib.as_array(logits, shape=(n,))[:] = self.head[:n]
        return 0

    def openjet_engine_mtp_draft_greedy(self, h, token, n, n_valid, drafts, values, hidden):
        np.ctypeslib.as_array(drafts, shape=(n,))[:] = self.top_ids[0]
        return 0

    def openjet_engine_mtp_draft_sampled(self, h, token, n, n_valid, k, temperature, top_p, min_p, u, drafts, q_ids,
                                         q_probs, q_len):
        ids = np.sort(self.top_ids[:k])
        np.ctypeslib.as_array(drafts, shape=(n,))[:] = ids[0]
        np.ctypeslib.as_array(q_ids, shape=(n, k))[:] = ids
        np.ctypeslib.as_array(q_probs, shape=(n, k))[:] = 1.0 / k
        np.ctypeslib.as_array(q_len, shape=(n,))[:] = k
        return 0

    def openjet_engine_cycle_greedy(self, h, token, n_draft, n_valid, out, n_out):
        np.ctypeslib.as_array(out, shape=(n_draft + 1,))[:] = self.top_ids[0]  # every draft kept
        n_out._obj.value = n_draft + 1
        self.n_past += n_draft + 1
        return 0

    def openjet_engine_cycle_sampled(self, h, token, n_draft, n_valid, k, temperature, top_p, min_p, u, out, n_out,
                                     n_used):
        np.ctypeslib.as_array(out, shape=(n_draft + 1,))[:] = self.top_ids[0]  # every draft kept
        n_out._obj.value, n_used._obj.value = n_draft + 1, n_draft + 1
        self.n_past += n_draft + 1
        return 0

    def openjet_engine_decode_top(self, h, ids, t, k, n_valid, pen_ids, pen_deltas, n_pen, values, top_ids, hidden):
        self.n_past += t
        np.ctypeslib.as_array(top_ids, shape=(t, k))[:] = self.top_ids[:k]
        np.ctypeslib.as_array(values, shape=(t, k))[:] = self.head[self.top_ids[:k]]
        return 0

    def openjet_engine_verify_top(self, h, ids, t, k, n_valid, values, top_ids, hidden):
        self.pending = t
        np.ctypeslib.as_array(top_ids, shape=(t, k))[:] = self.top_ids[:k]
        np.ctypeslib.as_array(values, shape=(t, k))[:] = self.head[self.top_ids[:k]]
        return 0


def engine_with_draft_vocabulary() -> CudaEngine:
    shape = types.SimpleNamespace(n_vocab=N_VOCAB, n_embd=N_EMBD, n_layer=64)
    config = types.SimpleNamespace(shape=shape, name="instant", has_mtp=True)
    e = CudaEngine(config, InstantLib(), 1, 1 << 20, "q8_0", 2)
    e.set_draft_vocabulary(np.arange(0, 2 * DRAFT_ROWS, 2))
    return e


def ms_per_call(engine: CudaEngine, params: SamplingParams, calls: int, step) -> float:
    """ms of host work per step(state, sampler, token) -> next token, after a 199-token prompt (the sequence grows
    as the steps keep tokens; new tokens join the draft rows)."""
    state = engine.new_state()
    engine.prefill(state, list(range(1, 200)))
    sampler = Sampler(params, N_VOCAB)
    token = 7
    t0 = time.perf_counter()
    for _ in range(calls):
        token = step(state, sampler, token)
    return (time.perf_counter() - t0) / calls * 1e3


def time_cycles(engine: CudaEngine, params: SamplingParams, n_draft: int, cycles: int) -> float:
    """ms per speculative cycle of n_draft drafts."""
    def cycle(state, sampler, token):
        return speculative_cycle(engine, state, sampler, token, n_draft).next_token
    return ms_per_call(engine, params, cycles, cycle)


def time_plain_steps(engine: CudaEngine, params: SamplingParams, steps: int) -> float:
    """ms per decode step without drafts (plain_step: decode_top and the sampler)."""
    return ms_per_call(engine, params, steps,
                       lambda state, sampler, token: plain_step(engine, state, sampler, token))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=2000)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    engine = engine_with_draft_vocabulary()
    requests = {"greedy": SamplingParams(temperature=0.0),
                "sampled_top_k_20": SamplingParams(temperature=0.7, top_k=20, top_p=0.95, seed=1)}
    out = {"bench": "host_cycle", "n_vocab": N_VOCAB, "draft_rows": DRAFT_ROWS, "cycles": a.cycles,
           "ms_per_cycle": {}}
    worst = None
    engine.native_sampled_cycle = False  # (the pieces first: drafts, verify_top, the host's verdict, accept)
    for name, params in requests.items():
        out["ms_per_cycle"][f"{name}/no_drafts"] = round(time_plain_steps(engine, params, a.cycles), 4)
        for native in (False, True):
            engine.native_draft = native
            for n_draft in (1, 3):
                ms = time_cycles(engine, params, n_draft, a.cycles)
                out["ms_per_cycle"][f"{name}/{'device' if native else 'host'}_drafts/{n_draft}"] = round(ms, 4)
                if worst is None or ms > worst[0]:
                    worst = (ms, params, native, n_draft)
    engine.native_draft = engine.native_sampled_cycle = True  # a sampled cycle in one call (cycle_sampled)
    for n_draft in (1, 3):
        ms = time_cycles(engine, requests["sampled_top_k_20"], n_draft, a.cycles)
        out["ms_per_cycle"][f"sampled_top_k_20/one_call/{n_draft}"] = round(ms, 4)
    try:
        engine.close()
    finally:
        engine._handle = ctypes.c_void_p()
    print(json.dumps(out, indent=1))
    if a.profile and worst:
        engine = engine_with_draft_vocabulary()
        engine.native_draft, engine.native_sampled_cycle = worst[2], False
        prof = cProfile.Profile()
        prof.runcall(time_cycles, engine, worst[1], worst[3], a.cycles)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(15)
        engine._handle = ctypes.c_void_p()


if __name__ == "__main__":
    main()
