"""One sequence's state in the reference engine: token ids, per-layer caches and recurrent state,
the MTP head's KV cache, the last hidden state and rollback checkpoints (engine/interface.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..engine.interface import SequenceState
from ..model.shape import ModelShape
from .attention import KVCache


def _frozen(x: np.ndarray) -> np.ndarray:
    x = x.copy()
    x.flags.writeable = False
    return x


@dataclass(frozen=True)
class Checkpoint:
    """The recurrent + conv state and the last hidden state after ``n_tokens`` tokens. Its arrays are
    read-only, so copies of a state share their checkpoints safely."""
    n_tokens: int
    conv: tuple[np.ndarray, ...]
    ssm: tuple[np.ndarray, ...]
    last_hidden: np.ndarray

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (*self.conv, *self.ssm, self.last_hidden))


class ReferenceState(SequenceState):
    def __init__(self, shape: ModelShape, has_mtp: bool):
        s = shape
        n_gdn = sum(not s.is_attention_layer(il) for il in range(s.n_layer))
        self.shape = shape
        self.token_ids: list[int] = []
        self.conv = [np.zeros((s.ssm_conv_kernel - 1, s.ssm_conv_dim), np.float32) for _ in range(n_gdn)]
        self.ssm = [np.zeros((s.ssm_n_v_heads, s.ssm_head_dim, s.ssm_head_dim), np.float32) for _ in range(n_gdn)]
        self.kv = [KVCache(s.n_head_kv, s.head_dim) for _ in range(s.n_layer - n_gdn)]
        self.mtp_kv = KVCache(s.n_head_kv, s.head_dim) if has_mtp else None
        self.last_hidden: np.ndarray | None = None      # h_{n-1}, post-output_norm
        self.checkpoints: list[Checkpoint] = []         # ascending positions, all <= n_tokens

    @property
    def checkpoint_positions(self) -> tuple[int, ...]:
        return tuple(c.n_tokens for c in self.checkpoints)

    @property
    def nbytes(self) -> int:
        caches = self.kv + ([self.mtp_kv] if self.mtp_kv is not None else [])
        return (sum(a.nbytes for a in self.conv + self.ssm) + sum(c.nbytes for c in caches)
                + (self.last_hidden.nbytes if self.last_hidden is not None else 0)
                + sum(c.nbytes for c in self.checkpoints))

    def copy(self) -> "ReferenceState":
        out = ReferenceState.__new__(ReferenceState)
        out.shape = self.shape
        out.token_ids = list(self.token_ids)
        out.conv = [a.copy() for a in self.conv]
        out.ssm = [a.copy() for a in self.ssm]
        out.kv = [c.copy() for c in self.kv]
        out.mtp_kv = self.mtp_kv.copy() if self.mtp_kv is not None else None
        out.last_hidden = None if self.last_hidden is None else self.last_hidden.copy()
        out.checkpoints = list(self.checkpoints)
        return out

    def snapshot(self) -> Checkpoint:
        assert self.last_hidden is not None
        return Checkpoint(self.n_tokens, tuple(_frozen(a) for a in self.conv), tuple(_frozen(a) for a in self.ssm),
                          _frozen(self.last_hidden))

    def rewind_to(self, cp: Checkpoint | None) -> None:
        """Back to checkpoint ``cp`` (None: the start): recurrent state restored, caches and tokens cut."""
        n = 0 if cp is None else cp.n_tokens
        for i in range(len(self.conv)):
            self.conv[i][...] = 0 if cp is None else cp.conv[i]
            self.ssm[i][...] = 0 if cp is None else cp.ssm[i]
        self.last_hidden = None if cp is None else cp.last_hidden.copy()
        del self.token_ids[n:]
        for c in self.kv:
            c.truncate(n)
        if self.mtp_kv is not None:
            self.mtp_kv.truncate(max(n - 1, 0))         # pairs (x_{t+1}, h_t), t = 0..n-2
        self.checkpoints = [c for c in self.checkpoints if c.n_tokens <= n]
