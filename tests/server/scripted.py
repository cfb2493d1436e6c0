"""An engine double that replays a scripted token sequence: after any prefill, the n-th decode's logits
put all mass on script[n]. Lives in tests only; lets the real tokenizer, parser and SSE code be checked
end to end on known model output (thinking, XML tool calls, stop strings)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np

from openjet_launcher.engine.interface import Engine, EngineStats, SequenceState, StepOutput


class ScriptedState(SequenceState):
    def __init__(self):
        self.token_ids: list[int] = []
        self.cps: list[int] = []

    @property
    def checkpoint_positions(self):
        return tuple(self.cps)

    @property
    def nbytes(self):
        return 0

    def copy(self):
        other = ScriptedState()
        other.token_ids, other.cps = list(self.token_ids), list(self.cps)
        return other


class ScriptedEngine(Engine):
    """`script`: the token ids to produce after each prompt (end with an EOG id to stop there).
    `fail_on_prefill`: raise on the next prefill (a failing engine). `step_delay`: seconds per decode."""

    def __init__(self, n_vocab: int, script: list[int] | None = None):
        self.config = SimpleNamespace(has_mtp=False, n_vocab=n_vocab)
        self.n_vocab = n_vocab
        self.script = list(script or [])
        self.fail_on_prefill = False
        self.step_delay = 0.0
        self.prefills: list[int] = []          # tokens per prefill call, for reuse checks
        self.replayed = 0                      # tokens a truncate would replay (after the checkpoint it restores)
        self.exact_prefill = True              # prefill_matches_decode (False: the decoded tokens are prefilled again)
        self._i = 0
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path, **options):
        raise NotImplementedError

    def _logits(self) -> np.ndarray:
        row = np.zeros((1, self.n_vocab), np.float32)
        row[0, self.script[self._i % len(self.script)] if self.script else 0] = 1e4
        return row

    def new_state(self):
        return ScriptedState()

    @property
    def prefill_matches_decode(self):
        return self.exact_prefill

    def prefill(self, state, tokens, *, chunk_size=64, all_logits=False):
        if self.fail_on_prefill:
            self.fail_on_prefill = False
            raise RuntimeError("scripted failure")
        state.token_ids.extend(int(t) for t in tokens)
        self.prefills.append(len(tokens))
        self._i = 0
        return StepOutput(self._logits(), np.zeros((1, 1), np.float32))

    def decode(self, state, tokens):
        if self.step_delay:
            import time
            time.sleep(self.step_delay)
        state.token_ids.extend(int(t) for t in tokens)
        self._i += 1
        return StepOutput(self._logits(), np.zeros((1, 1), np.float32))

    def mtp_draft(self, state, token, n_draft=1, choose=None):
        raise NotImplementedError

    def checkpoint(self, state):
        state.cps.append(state.n_tokens)

    def truncate(self, state, n_tokens):
        self.replayed += n_tokens - max((c for c in state.cps if c <= n_tokens), default=0)
        del state.token_ids[n_tokens:]
        state.cps = [c for c in state.cps if c <= n_tokens]

    def memory(self):
        return {"weights_bytes": 0, "states_bytes": 0, "n_states": 1}

    def stats(self):
        return EngineStats()

    def reset_stats(self):
        pass
