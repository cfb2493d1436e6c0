"""Token sampling above the engine: the semantics the GPU engine reproduces on the device.

Order of operations (vLLM's and transformers' order; llama.cpp applies temperature last):
  1. presence and frequency penalties over the tokens generated so far (OpenAI semantics):
     logit[t] -= presence * (count[t] > 0) + frequency * count[t]
  2. temperature 0 -> greedy argmax (ties: lowest id); otherwise logits / temperature
  3. top-k (0 = off), then top-p (nucleus over the top-k survivors, smallest set whose mass >= top_p,
     always at least one token), then min-p (drop tokens whose probability < min_p * max probability)
  4. draw from the renormalised survivors by inverse CDF with one uniform number from a seeded
     generator, so a seed gives the same tokens on every run.
Padding rows of the vocabulary (ids without a real token) are never produced.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from .engine.interface import top_k_order
from .errors import OpenJetError

GPU_MAX_TOP_K = 32   # the device sampler keeps the top 32 logits


class SamplingError(OpenJetError):
    """A sampling parameter out of range (the server answers 400)."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self, max_top_k: int | None = None) -> "SamplingParams":
        def finite(name: str, v: float) -> None:
            if not isinstance(v, numbers.Real) or isinstance(v, (bool, np.bool_)) or not math.isfinite(v):
                raise SamplingError(f"{name} must be a finite number, got {v!r}")
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty"):
            finite(name, getattr(self, name))
        if not 0.0 <= self.temperature <= 2.0:
            raise SamplingError(f"temperature must be between 0 and 2, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise SamplingError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise SamplingError(f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise SamplingError(f"{name} must be between -2 and 2, got {getattr(self, name)}")
        if not isinstance(self.top_k, numbers.Integral) or isinstance(self.top_k, (bool, np.bool_)) or self.top_k < 0:
            raise SamplingError(f"top_k must be a non-negative integer (0 = off), got {self.top_k!r}")
        if max_top_k is not None and (self.top_k == 0 or self.top_k > max_top_k) and not self.greedy:
            raise SamplingError(f"top_k must be between 1 and {max_top_k} on the GPU engine "
                                f"(it samples from the top {max_top_k} logits), got {self.top_k}")
        if self.seed is not None and (not isinstance(self.seed, numbers.Integral) or isinstance(self.seed, (bool, np.bool_))
                                      or self.seed < 0):
            raise SamplingError(f"seed must be a non-negative integer, got {self.seed!r}")
        return self


def _refuse_nan(z: np.ndarray, first_id: int = 0) -> None:
    """A NaN logit is an engine or model failure: ranked, it is neither above nor below anything (numpy's argmax
    takes it, a partition drops it, the device's top-k ranks it first), so no token choice would be right.
    z: logits from token id first_id on."""
    if np.isnan(z).any():
        at = first_id + int(np.flatnonzero(np.isnan(z))[0])
        raise OpenJetError(f"the model produced a NaN logit (at token id {at}): the model file or the engine computed "
                           "an invalid value, so no token can be chosen")


class Sampler:
    """One request's sampler: holds its generator and the counts of generated tokens."""

    def __init__(self, params: SamplingParams, n_valid: int):
        self.params = params.validate()
        self.n_valid = n_valid                       # ids >= n_valid are padding rows
        self.rng = np.random.default_rng(params.seed)
        self.counts: dict[int, int] = {}

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        """The distribution step 4 draws from (float64, zeros outside the survivors)."""
        p = self.params
        out = np.zeros(self.n_valid, dtype=np.float64)
        z = self._penalised(logits)
        if p.greedy:
            i = int(np.argmax(z))  # (numpy's argmax takes the first NaN: checking it is checking them all)
            _refuse_nan(z[i:i + 1], i)
            out[i] = 1.0
            return out
        if np.isnan(z.max()):  # (max propagates a NaN: no temporary of the vocabulary's size)
            _refuse_nan(z)
        order = top_k_order(z, p.top_k)                   # survivors of top-k, best first, ties by id
        order, probs = self._survivors(z[order], order)
        out[order] = probs
        return out

    def _survivors(self, ranked: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Steps 2-3 after top-k: (ids, normalised probabilities) of the tokens that top-p and min-p keep,
        from the top-k logits `ranked` (best first) of ids `order`."""
        p = self.params
        x = ranked.astype(np.float64)
        with np.errstate(over="ignore"):  # an overflow here is handled: below
            zs = x / p.temperature
            if not np.isfinite(zs[0]):  # a temperature so small that the top logit / t leaves float64 (inf - inf:
                zs = (x - x[0]) / p.temperature  # nan); its limit instead, 0 for the maxima and -inf below them
        probs = np.exp(zs - zs[0])
        probs /= probs.sum()
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1   # smallest prefix with mass >= top_p
            probs = probs[:keep]
            order = order[:keep]
        if p.min_p > 0.0:
            keep = probs >= p.min_p * probs[0]
            probs, order = probs[keep], order[keep]
        return order, probs / probs.sum()

    def top_request(self, max_k: int) -> int | None:
        """How many top logits the next token needs (Engine.decode_top's k): 1 when greedy, top_k when it is
        1..max_k (and below the vocabulary); None when the sampler needs the whole row (top-k off or larger)."""
        p = self.params
        if p.greedy:
            return 1
        return p.top_k if 0 < p.top_k <= min(max_k, self.n_valid) else None

    def penalty_deltas(self) -> dict[int, np.float32]:
        """Step 1 as {id: delta} (logit -= delta, float32): the same subtraction _penalised makes."""
        p = self.params
        if not self.counts or not (p.presence_penalty or p.frequency_penalty):
            return {}
        presence, frequency = np.float32(p.presence_penalty), np.float32(p.frequency_penalty)
        return {t: np.float32(presence + frequency * np.float32(c)) for t, c in self.counts.items()}

    def sample_top(self, values: np.ndarray, ids: np.ndarray) -> int:
        """sample() from one row of Engine.decode_top (k = top_request(), penalty_deltas() applied): the token
        sample() picks from the whole row, with the same draw (the CDF runs over the survivors in id order,
        as it does over the whole vocabulary)."""
        _refuse_nan(np.asarray(values)[:1])  # the device ranks a NaN first
        if self.params.greedy:
            token = int(ids[0])
        else:
            order, probs = self.distribution_top(values, ids)
            token = int(order[self.draw(probs)])
        self.note(token)
        return token

    def distribution_top(self, values: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """probabilities() from one row's top logits (ranked as top_k_order ranks them, at least top_k of them,
        penalties applied), as (surviving ids in increasing order, their probabilities): the non-zeros of
        probabilities(), the same numbers in the same order."""
        k = self.params.top_k if self.params.top_k > 0 else len(ids)
        order, probs = self._survivors(np.asarray(values)[:k], np.asarray(ids)[:k])
        by_id = np.argsort(order, kind="stable")
        return order[by_id], probs[by_id]

    def _penalised(self, logits: np.ndarray) -> np.ndarray:
        z = np.asarray(logits[: self.n_valid], dtype=np.float32)
        p = self.params
        if self.counts and (p.presence_penalty or p.frequency_penalty):
            z = z.copy()
            ids = np.fromiter(self.counts.keys(), dtype=np.int64)
            cnt = np.fromiter(self.counts.values(), dtype=np.float32)
            z[ids] -= np.float32(p.presence_penalty) + np.float32(p.frequency_penalty) * cnt
        return z

    def draw(self, probs: np.ndarray) -> int:
        """One token from unnormalised probabilities by inverse CDF with one uniform number (not counted)."""
        cdf = np.cumsum(probs)
        # the first index whose cumulative mass exceeds u: it always has a non-zero probability
        return int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right"))

    def note(self, token: int) -> None:
        """Count a generated token (for the penalties)."""
        self.counts[token] = self.counts.get(token, 0) + 1

    def sample(self, logits: np.ndarray) -> int:
        probs = self.probabilities(logits)
        token = int(np.argmax(probs)) if self.params.greedy else self.draw(probs)
        self.note(token)
        return token
