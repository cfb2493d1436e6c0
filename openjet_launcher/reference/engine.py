"""The numpy reference engine: qwen38.md §3 in float32 on dequantised weights, the oracle for the GPU engine.

The trunk (§3): h = E[x]; per layer h += Mixer(rms(h, attn_norm)), h += FFN(rms(h, post_attention_norm));
hidden = rms(h, output_norm) (also the MTP input); logits = output hidden. Mixers: gdn.py (Gated DeltaNet,
recurrent and chunked), attention.py (gated attention and KV cache); the MTP head: mtp.py; weights and
their layout: weights.py; the sequence state and its checkpoints: state.py. Semantics of every method:
engine/interface.py.

Numerics: float32 storage and arithmetic everywhere (BLAS sgemm/sgemv for the matmuls, LAPACK sgesv for
the WY solve); RoPE angles in float64 before rounding; l2 norm in HF's form x * rsqrt(sum x^2 + eps).
For test-size models only (weights.py says why).
"""

from __future__ import annotations

import os
import time
import weakref

import numpy as np

from ..engine.interface import (Choose, DraftOutput, Engine, EngineStats, StepOutput, TokenIds, argmax,
                                check_chunk_size, check_draft_request, check_token_ids)
from ..errors import ModelFileError, OpenJetError
from ..model.config import ModelConfig, read_config
from ..model.gguf_file import GGUFFile
from ..model.recipe import UNSUPPORTED, classify
from .attention import attention_mixer
from .gdn import gdn_mixer
from .mtp import mtp_fill, mtp_forward
from .ops import rms_norm, swiglu
from .state import ReferenceState
from .weights import DEFAULT_MAX_WEIGHT_BYTES, GDNWeights, ModelWeights, load_weights


class ReferenceEngine(Engine):
    def __init__(self, config: ModelConfig, weights: ModelWeights):
        self.config = config
        self.weights = weights
        self._stats = EngineStats()
        self._states: weakref.WeakSet[ReferenceState] = weakref.WeakSet()

    @classmethod
    def load(cls, path: str | os.PathLike[str], *,
             max_weight_bytes: int = DEFAULT_MAX_WEIGHT_BYTES) -> "ReferenceEngine":
        """Any recipe whose tensor types our codecs decode (F32 files, unsloth or plain Q4_K_M, mixed)."""
        gguf = GGUFFile(path)
        config = read_config(gguf)
        verdict = classify(gguf, config)
        if verdict.kind == UNSUPPORTED:
            raise ModelFileError(f"{gguf.path.name}: {verdict.problem}")
        return cls(config, load_weights(gguf, config, max_weight_bytes))

    # ----------------------------------------------------------------------------------- the interface

    def new_state(self) -> ReferenceState:
        state = ReferenceState(self.config.shape, has_mtp=self.weights.mtp is not None)
        self._states.add(state)
        return state

    def prefill(self, state: ReferenceState, tokens: TokenIds, *, chunk_size: int = 64,
                all_logits: bool = False) -> StepOutput:
        chunk_size = check_chunk_size(chunk_size)
        ids = self._token_ids(state, tokens)
        t0 = time.perf_counter()
        out = self._forward(state, ids, chunk_size, rows="all" if all_logits else "last")
        self._stats.prefill_tokens += len(ids)
        self._stats.prefill_seconds += time.perf_counter() - t0
        return out

    def decode(self, state: ReferenceState, tokens: TokenIds) -> StepOutput:
        ids = self._token_ids(state, tokens)
        t0 = time.perf_counter()
        out = self._forward(state, ids, None, rows="all")
        self._stats.decode_tokens += len(ids)
        self._stats.decode_steps += 1
        self._stats.decode_seconds += time.perf_counter() - t0
        return out

    def mtp_draft(self, state: ReferenceState, token: int, n_draft: int = 1,
                  choose: Choose = argmax) -> DraftOutput:
        m, s, w = self.weights.mtp, self.config.shape, self.weights
        (tok,) = self._token_ids(state, [token])
        check_draft_request(self.config.name, s.n_layer, m is not None, state.n_tokens, n_draft)
        cache = state.mtp_kv
        committed = cache.length
        assert committed == state.n_tokens - 1, (committed, state.n_tokens)
        t0 = time.perf_counter()
        drafted, logits, hidden = [], [], []
        h = state.last_hidden
        try:                                       # scratch entries past the committed length, dropped below
            for k in range(n_draft):
                hp, lg = mtp_forward(m, s, w.token_embd, w.output, np.array([tok]), h[None],
                                     np.array([state.n_tokens + k]), cache)
                tok, h = int(choose(lg[0])), hp[0]
                drafted.append(tok)
                logits.append(lg[0])
                hidden.append(h)
        finally:
            cache.truncate(committed)
        self._stats.draft_tokens += n_draft
        self._stats.draft_seconds += time.perf_counter() - t0
        return DraftOutput(drafted, np.stack(logits), np.stack(hidden))

    def checkpoint(self, state: ReferenceState) -> None:
        self._check_state(state)
        if state.n_tokens == 0:
            return                                 # the start always counts as a checkpoint
        state.checkpoints = [c for c in state.checkpoints if c.n_tokens != state.n_tokens] + [state.snapshot()]

    def truncate(self, state: ReferenceState, n_tokens: int) -> None:
        self._check_state(state)
        if not 0 <= n_tokens <= state.n_tokens:
            raise OpenJetError(f"cannot truncate a sequence of {state.n_tokens} tokens to {n_tokens}")
        if n_tokens == state.n_tokens:
            return
        base = max((c for c in state.checkpoints if c.n_tokens <= n_tokens), key=lambda c: c.n_tokens,
                   default=None)
        replay = np.array(state.token_ids[0 if base is None else base.n_tokens:n_tokens], dtype=np.int64)
        state.rewind_to(base)
        if len(replay):                            # the recurrent form, as decode would have run them
            t0 = time.perf_counter()
            self._forward(state, replay, None, rows=None)
            self._stats.replay_tokens += len(replay)
            self._stats.replay_seconds += time.perf_counter() - t0

    def memory(self) -> dict[str, int]:
        states = list(self._states)
        return {"weights_bytes": self.weights.nbytes, "states_bytes": sum(s.nbytes for s in states),
                "n_states": len(states)}

    def stats(self) -> EngineStats:
        return EngineStats(**vars(self._stats))

    def reset_stats(self) -> None:
        self._stats = EngineStats()

    # ------------------------------------------------------------------------------------- the forward

    def _forward(self, state: ReferenceState, ids: np.ndarray, chunk_size: int | None,
                 rows: str | None) -> StepOutput | None:
        """Run tokens ``ids`` through the trunk at positions n..n+T-1, extend the MTP cache by their pairs,
        and return the logits of ``rows``: "all", "last" or None (no lm_head)."""
        s, w, eps = self.config.shape, self.weights, self.config.shape.rms_eps
        n0 = state.n_tokens
        positions = np.arange(n0, n0 + len(ids))
        h = w.token_embd[ids]
        i_gdn = i_attn = 0
        for layer in w.layers:
            a = rms_norm(h, layer.mixer.norm, eps)
            if isinstance(layer.mixer, GDNWeights):
                h += gdn_mixer(layer.mixer, s, a, state.conv[i_gdn], state.ssm[i_gdn], chunk_size)
                i_gdn += 1
            else:
                h += attention_mixer(layer.mixer, s, a, state.kv[i_attn], positions)
                i_attn += 1
            h += swiglu(rms_norm(h, layer.ffn.norm, eps), layer.ffn.gate_up, layer.ffn.down)
        hidden = rms_norm(h, w.output_norm, eps)

        if w.mtp is not None:                      # pairs (x_{t+1}, h_t) at the position of x_{t+1}
            if n0 == 0:
                pair_tokens, pair_hidden, pair_pos = ids[1:], hidden[:-1], positions[1:]
            else:
                pair_tokens, pair_pos = ids, positions
                pair_hidden = np.concatenate([state.last_hidden[None], hidden[:-1]])
            if len(pair_tokens):
                mtp_fill(w.mtp, s, w.token_embd, pair_tokens, pair_hidden, pair_pos, state.mtp_kv)
        state.token_ids.extend(ids.tolist())
        state.last_hidden = hidden[-1].copy()

        if rows is None:
            return None
        if rows == "last":
            hidden = hidden[-1:]
        return StepOutput(logits=hidden @ w.output, hidden=hidden)

    def _check_state(self, state: ReferenceState) -> None:
        if not isinstance(state, ReferenceState) or state.shape != self.config.shape:
            raise OpenJetError("this state was not made by this engine (use engine.new_state())")
        self._states.add(state)                    # copies too, for memory()

    def _token_ids(self, state: ReferenceState, tokens: TokenIds) -> np.ndarray:
        self._check_state(state)
        return check_token_ids(tokens, self.config.shape.n_vocab)
