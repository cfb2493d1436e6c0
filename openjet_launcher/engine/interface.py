"""The engine interface: what the numpy reference engine and the CUDA engine both offer.

An engine runs one qwen35 GGUF file (qwen38.md §3). A ``SequenceState`` holds everything one sequence
needs (token ids, attention KV caches, the Gated DeltaNet recurrent and conv states, the MTP head's KV
cache, the last hidden state, rollback checkpoints); the engine holds the weights. Sampling is not part
of the engine: it returns float32 logits and the caller chooses tokens.

Design note: the two forward algorithms and the invariants they share.

* ``prefill(state, tokens)`` and ``decode(state, tokens)`` both extend the sequence by ``tokens`` and
  have the same effect on the state; only the algorithm differs. ``prefill`` is the batched path (the
  chunked WY form of the Gated DeltaNet, §3.4); ``decode`` is the per-token recurrent form (§3.1) over
  T >= 1 tokens (T <= ``MAX_GPU_DECODE_TOKENS`` on the GPU: 1 + n_draft rows of a verification step).
* Positions are sequence indices: the i-th token ever processed by a state is at position i.
* Hidden states are post-output_norm (``h_nextn``, the MTP input). After the trunk has processed
  x_0..x_{n-1} with hidden states h_0..h_{n-1}, the MTP head's own KV cache holds the entries of the
  pairs (x_{t+1}, h_t) for t = 0..n-2 (§3.3: filled for every verified position, prompt included),
  the entry of (x_{t+1}, h_t) at position t+1 (llama.cpp's convention: the position of x_{t+1}), and the
  state keeps h_{n-1}. A call that adds tokens x_n.. also adds the pair (x_n, h_{n-1}) joining the
  previous call's last hidden state and the new call's first token.
* ``mtp_draft`` reads the state and never changes it: its KV entries live past the committed length
  and are discarded.
* Rollback by replay: KV caches can be cut, the recurrent and conv states cannot. ``checkpoint`` records
  a snapshot of the recurrent + conv state (and the last hidden state) at the current position;
  ``truncate(state, n)`` restores the latest checkpoint at a position <= n (the start of the sequence
  always counts as one) and re-runs the tokens between it and n, which the state keeps. The speculative
  loop checkpoints before a verification step and truncates to the accepted length after it.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import OpenJetError
from ..model.config import ModelConfig

# Rows one GPU decode step accepts: the last committed token plus up to 7 drafted ones.
MAX_GPU_DECODE_TOKENS = 8

TokenIds = Sequence[int] | np.ndarray
Choose = Callable[[np.ndarray], int]          # logits [n_vocab] float32 -> token id
ChooseTop = Callable[[np.ndarray, np.ndarray], int]  # a row's top values [k], their ids [k] -> token id


def first_id(values: np.ndarray, ids: np.ndarray) -> int:
    """Greedy choice from a ranked top k: its first id."""
    return int(ids[0])


def argmax(logits: np.ndarray) -> int:
    """Greedy choice: the first index of the largest logit."""
    return int(np.argmax(logits))


def check_chunk_size(chunk_size: object) -> int:
    """prefill's chunk_size: a positive integer (OpenJetError otherwise)."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise OpenJetError(f"chunk_size must be a positive integer, not {chunk_size!r}")
    return int(chunk_size)


def check_draft_request(model: str, n_layer: int, has_mtp: bool, n_tokens: int, n_draft: int) -> None:
    """What every engine's mtp_draft checks besides the token id: an MTP head, a processed token, n_draft >= 1."""
    if not has_mtp:
        raise OpenJetError(f"{model}: the file has no MTP head (blk.{n_layer}.nextn.*), so it cannot draft tokens; "
                           "decode without speculation")
    if n_tokens == 0:
        raise OpenJetError("mtp_draft needs the hidden state of a processed token: prefill first")
    if n_draft < 1:
        raise OpenJetError(f"n_draft must be at least 1, not {n_draft}")


def check_token_ids(tokens: TokenIds, n_vocab: int) -> np.ndarray:
    """A non-empty 1-D array of ids inside [0, n_vocab), as int64; OpenJetError naming the problem otherwise."""
    ids = np.asarray(tokens)
    if ids.ndim != 1 or len(ids) == 0:
        raise OpenJetError(f"expected a non-empty list of token ids, got shape {ids.shape}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise OpenJetError(f"token ids must be integers, got {ids.dtype}")
    if ids.min() < 0 or ids.max() >= n_vocab:
        bad = ids[(ids < 0) | (ids >= n_vocab)][0]
        raise OpenJetError(f"token id {bad} is outside the vocabulary [0, {n_vocab})")
    return ids.astype(np.int64)


@dataclass(frozen=True)
class StepOutput:
    """What a forward call returns, for R rows (R = T, or 1 for a prefill without ``all_logits``)."""
    logits: np.ndarray      # [R, n_vocab] float32
    hidden: np.ndarray      # [R, n_embd] float32, post-output_norm: the MTP input h_nextn


@dataclass(frozen=True)
class TopOutput:
    """decode_top's rows: each row's top k logits (after the penalties) by value, ties to the lower id."""
    values: np.ndarray      # [T, k] float32
    ids: np.ndarray         # [T, k] int32
    hidden: np.ndarray      # [T, n_embd] float32


def top_k_order(z: np.ndarray, k: int) -> np.ndarray:
    """Ids by decreasing value (ties: lower id first), only the first k when k > 0. With k set, a partial
    selection finds the candidates (every id tied with the k-th included), so the result equals the first k
    of a full stable sort without sorting the whole vocabulary."""
    if k == 1:
        return np.array([np.argmax(z)])     # the first maximum: the lowest id among ties, as the sort's
    if 0 < k < len(z):
        kth = np.partition(z, len(z) - k)[len(z) - k]
        cand = np.flatnonzero(z >= kth)
        return cand[np.argsort(-z[cand], kind="stable")][:k]
    return np.argsort(-z, kind="stable")


def rank_row(row: np.ndarray, k: int, n_valid: int | None = None,
             penalties: dict[int, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(values, ids) of one row's top k logits among ids < n_valid after logit[id] -= delta (float32)."""
    z = np.asarray(row[:n_valid], dtype=np.float32)
    if penalties:
        z = z.copy()
        for i, d in penalties.items():
            z[i] = np.float32(z[i] - np.float32(d))
    order = top_k_order(z, k)
    return z[order], order


def rank_rows(logits: np.ndarray, hidden: np.ndarray, k: int, n_valid: int | None,
              penalties: dict[int, float] | None) -> TopOutput:
    """rank_row of every row: decode_top's and verify_top's answer computed on the host."""
    values, ids = np.empty((len(logits), k), np.float32), np.empty((len(logits), k), np.int32)
    for r, row in enumerate(logits):
        values[r], ids[r] = rank_row(row, k, n_valid, penalties)
    return TopOutput(values, ids, hidden)


def rank_subset(values: np.ndarray, ids: np.ndarray, k: int, n_valid: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The top k of a row whose other entries are -inf, given as its finite part (values of ids, any order):
    (values, ids) as top_k_order ranks the whole row (value down, ties to the lower id), or None when fewer
    than k of them are below n_valid (the whole row's top k would reach into the -inf entries)."""
    keep = ids < n_valid
    v, i = values[keep], ids[keep]
    if len(v) < k:
        return None
    # the k-th largest value (k = 1, greedy's: the maximum, several times faster than a partition) and every tie of it
    kth = v.max() if k == 1 else np.partition(v, len(v) - k)[len(v) - k] if k < len(v) else None
    cand = np.flatnonzero(v >= kth) if kth is not None else np.arange(len(v))
    order = cand[np.lexsort((i[cand], -v[cand]))][:k]
    return v[order], i[order]


@dataclass(frozen=True)
class DraftTopOutput:
    """Chained MTP drafts seen through each row's top k: ``tokens[j]`` is ``choose(values[j], ids[j])``."""
    tokens: list[int]
    values: np.ndarray      # [n_draft, k] float32, by value down, ties to the lower id
    ids: np.ndarray         # [n_draft, k] int32
    hidden: np.ndarray      # [n_draft, n_embd] float32, post shared_head_norm


@dataclass(frozen=True)
class SampledDrafts:
    """Chained MTP drafts, each drawn from its q: ``tokens[j]`` from ``q[j]`` = (ids increasing, probabilities
    float64), the distribution exact speculative sampling's acceptance test must use for draft j."""
    tokens: list[int]
    q: list[tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class DraftOutput:
    """Chained MTP drafts: ``tokens[k]`` is ``choose(logits[k])``; ``hidden[k]`` is the MTP output h'."""
    tokens: list[int]
    logits: np.ndarray      # [n_draft, n_vocab] float32
    hidden: np.ndarray      # [n_draft, n_embd] float32, post shared_head_norm


@dataclass
class EngineStats:
    """Work done since the engine was loaded (or since ``reset_stats``): tokens and wall seconds."""
    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_tokens: int = 0
    decode_steps: int = 0
    decode_seconds: float = 0.0
    draft_tokens: int = 0
    draft_seconds: float = 0.0
    replay_tokens: int = 0          # tokens re-run by truncate (rollback by replay)
    replay_seconds: float = 0.0

    def as_dict(self) -> dict[str, float]:
        out: dict[str, float] = asdict(self)
        for kind in ("prefill", "decode", "draft", "replay"):
            seconds = out[f"{kind}_seconds"]
            out[f"{kind}_tok_s"] = out[f"{kind}_tokens"] / seconds if seconds > 0 else 0.0
        return out


class SequenceState(abc.ABC):
    """One sequence's caches and recurrent state. Made by ``Engine.new_state``, used with that engine.
    Every state keeps the ids it has processed in ``token_ids`` (the engine appends and cuts them)."""

    token_ids: list[int]
    verify_rows: int = 0            # rows of a verify step awaiting accept (Engine.verify)

    @property
    def n_tokens(self) -> int:
        """Tokens processed so far (= the position of the next token)."""
        return len(self.token_ids)

    @property
    def tokens(self) -> tuple[int, ...]:
        """The ids of the processed tokens, in order (``truncate`` replays from them)."""
        return tuple(self.token_ids)

    @property
    @abc.abstractmethod
    def checkpoint_positions(self) -> tuple[int, ...]:
        """Positions of the recorded checkpoints, ascending (0 is implicit and not listed)."""

    @property
    @abc.abstractmethod
    def nbytes(self) -> int:
        """Memory the state holds: caches at their allocated size, recurrent state, checkpoints."""

    @abc.abstractmethod
    def copy(self) -> "SequenceState":
        """An independent deep copy: changing either afterwards never affects the other."""


class Engine(abc.ABC):
    """A loaded qwen35 model. Every method that takes a state may change only that state."""

    config: ModelConfig

    @classmethod
    @abc.abstractmethod
    def load(cls, path: str | os.PathLike[str], **options) -> "Engine":
        """Open a GGUF file. Reads the configuration with ``model.config.read_config`` and raises
        OpenJetError (ModelFileError for file problems) for a file or recipe this engine cannot run."""

    @abc.abstractmethod
    def new_state(self) -> SequenceState:
        """An empty sequence (position 0, zero recurrent and conv states, empty caches)."""

    @abc.abstractmethod
    def prefill(self, state: SequenceState, tokens: TokenIds, *, chunk_size: int = 64,
                all_logits: bool = False) -> StepOutput:
        """Extend the sequence by ``tokens`` (T >= 1) with the batched algorithm: chunked WY Gated DeltaNet
        (chunks of ``chunk_size`` tokens) and causal attention over the cache. Returns the last token's
        logits and hidden state (R = 1), or every token's when ``all_logits`` (R = T)."""

    @abc.abstractmethod
    def decode(self, state: SequenceState, tokens: TokenIds) -> StepOutput:
        """Extend the sequence by ``tokens`` (T >= 1; at most ``MAX_GPU_DECODE_TOKENS`` on the GPU) with the
        recurrent Gated DeltaNet step and the KV caches. Returns logits [T, n_vocab] and hidden [T, n_embd]."""

    @abc.abstractmethod
    def mtp_draft(self, state: SequenceState, token: int, n_draft: int = 1,
                  choose: Choose = argmax) -> DraftOutput:
        """Draft ``n_draft`` tokens after ``token`` (the token chosen from the last logits, not yet
        processed) with the MTP head, chained (§3.3 item 5): step 1 runs the head on (token, h_{n-1}) at
        position n; step k > 1 on (draft_{k-1}, h'_{k-1}) at position n+k-1, h' being the head's own output.
        Needs n >= 1 and a file with an MTP head (OpenJetError otherwise). Leaves ``state`` unchanged."""

    def mtp_draft_top(self, state: SequenceState, token: int, n_draft: int, *, k: int, n_valid: int | None = None,
                      choose: ChooseTop | None = None) -> DraftTopOutput:
        """``mtp_draft`` where each draft row is reduced to its top k logits among ids < n_valid before
        ``choose(values, ids)`` picks the token (default: the first, i.e. the argmax): what greedy drafting
        (k = 1) and speculative sampling with top-k <= k need. Here: rank each whole row on the host; the CUDA
        engine ranks only the rows of its draft vocabulary."""
        pick = choose or first_id
        rows: list[tuple[np.ndarray, np.ndarray]] = []

        def choose_row(logits: np.ndarray) -> int:
            rows.append(rank_row(logits, k, n_valid))
            return pick(*rows[-1])

        out = self.mtp_draft(state, token, n_draft, choose=choose_row)
        values, ids = zip(*rows)
        return DraftTopOutput(out.tokens, np.stack(values), np.stack(ids).astype(np.int32), out.hidden)

    def mtp_draft_sampled(self, state: SequenceState, token: int, n_draft: int, sampler, *, k: int) -> SampledDrafts:
        """Sampled drafts: draft j drawn from q_j, the sampler's transform of the head's top k logits at step j
        (Sampler.distribution_top), with one uniform from the sampler's generator per draft, in order; the next step
        drafts after it. Here: mtp_draft_top with the draws on the host; the CUDA engine draws on the device and
        hands back its own q_j (exact speculative sampling needs only that the test use the q the draft came from)."""
        q: list[tuple[np.ndarray, np.ndarray]] = []

        def choose(values: np.ndarray, ids: np.ndarray) -> int:
            q.append(sampler.distribution_top(values, ids))
            return int(q[-1][0][sampler.draw(q[-1][1])])

        out = self.mtp_draft_top(state, token, n_draft, k=k, n_valid=sampler.n_valid, choose=choose)
        return SampledDrafts(list(out.tokens), q)

    def decode_top(self, state: SequenceState, tokens: TokenIds, *, k: int, n_valid: int | None = None,
                   penalties: dict[int, float] | None = None) -> TopOutput:
        """``decode``, but each row comes back as its top k logits among ids < n_valid (default: all) after
        logit[id] -= delta for the penalties (float32): all a sampler with top-k <= k needs. Here: decode and
        rank on the host; the CUDA engine ranks on the device and copies k values per row, not the vocabulary."""
        out = self.decode(state, tokens)
        return rank_rows(out.logits, out.hidden, k, n_valid, penalties)

    def verify(self, state: SequenceState, tokens: TokenIds) -> StepOutput:
        """A speculative verify step over [token, drafts...]: decode's output for these rows, to be followed by
        ``accept(state, n)``, which keeps the first n. Here: checkpoint, decode, and accept truncates (rollback
        by replay); an engine may do better (the CUDA engine replays only the GDN recurrence)."""
        if state.verify_rows:
            raise OpenJetError("a verify step is still waiting for accept")
        self.checkpoint(state)
        out = self.decode(state, tokens)
        state.verify_rows = len(out.hidden)
        return out

    def verify_top(self, state: SequenceState, tokens: TokenIds, *, k: int, n_valid: int | None = None) -> TopOutput:
        """``verify``, but each row comes back as its top k logits among ids < n_valid, as decode_top gives
        them (no penalties: speculation runs without them): what greedy verification (k = 1) and speculative
        sampling with top-k <= k need. Here: verify and rank on the host; ``accept`` follows either way."""
        out = self.verify(state, tokens)
        return rank_rows(out.logits, out.hidden, k, n_valid, None)

    def accept(self, state: SequenceState, n: int) -> None:
        """Keep the first n rows (1 <= n <= its rows) of the verify step that ``state`` is waiting on."""
        t = state.verify_rows
        if not 1 <= n <= t:
            raise OpenJetError(f"accept({n}): the pending verify step has {t} rows" if t else
                               "accept: no verify step is pending")
        state.verify_rows = 0
        self.truncate(state, state.n_tokens - t + n)

    def greedy_cycle(self, state: SequenceState, token: int, n_draft: int, *, n_valid: int) -> tuple[list[int], int]:
        """One greedy speculative cycle after `token` (chosen, not processed): n_draft (0 or more) greedy drafts, a
        verify step of [token, drafts] ranked to each row's argmax among ids < n_valid, the longest prefix of drafts
        equal to those argmaxes kept (accept), and the target's token after them: (the kept drafts, that token). Here
        the pieces one call at a time; the CUDA engine runs them in one call (openjet_engine_cycle_greedy)."""
        drafts = list(self.mtp_draft_top(state, token, n_draft, k=1, n_valid=n_valid).tokens) if n_draft else []
        top = self.verify_top(state, [token, *drafts], k=1, n_valid=n_valid)
        targets = [int(i[0]) for i in top.ids]
        k = 0
        while k < len(drafts) and drafts[k] == targets[k]:
            k += 1
        self.accept(state, 1 + k)
        return drafts[:k], targets[k]

    def sampled_cycle(self, state: SequenceState, token: int, n_draft: int, sampler, *,
                      k: int) -> tuple[list[int], int]:
        """One sampled speculative cycle after `token` (chosen, not processed) for a request whose distribution needs
        only each row's top k (k = sampler.top_request(...), no penalties): n_draft (1 or more) drafts drawn from q_j
        (mtp_draft_sampled), a verify step of [token, drafts] ranked to each row's top k among ids < sampler.n_valid,
        exact speculative sampling over the target's distributions p_j = sampler.distribution_top of those rows
        (speculative.accept_sampled, with the sampler's generator) and the accept: (the kept drafts, the target's next
        token). Here the pieces one call at a time; the CUDA engine can run them in one call
        (openjet_engine_cycle_sampled, CudaEngine.native_sampled_cycle)."""
        from ..speculative import accept_sampled  # (speculative.py builds on this module)
        sampled = self.mtp_draft_sampled(state, token, n_draft, sampler, k=k)
        drafts = list(sampled.tokens)
        top = self.verify_top(state, [token, *drafts], k=k, n_valid=sampler.n_valid)
        p_rows = [sampler.distribution_top(v, i) for v, i in zip(top.values, top.ids)]
        kept, next_token = accept_sampled(p_rows, list(sampled.q), drafts, sampler)
        self.accept(state, 1 + kept)
        return drafts[:kept], next_token

    @abc.abstractmethod
    def checkpoint(self, state: SequenceState) -> None:
        """Record the recurrent + conv state at the current position, for ``truncate``."""

    @abc.abstractmethod
    def truncate(self, state: SequenceState, n_tokens: int) -> None:
        """Make ``state`` exactly as if only its first ``n_tokens`` tokens had been processed: cut the KV
        caches, restore the latest checkpoint at a position <= n_tokens and replay the tokens after it.
        Checkpoints past n_tokens are dropped."""

    @property
    def prefill_matches_decode(self) -> bool:
        """Whether prefilling tokens leaves, bit for bit, the state that decoding them one by one leaves. Where it
        does not (the CUDA engine with its default prefill numerics; under OPENJET_PREFILL_GEMM=exact it does), a
        conversation that goes on after decoded tokens equals a fresh prefill only if those tokens are prefilled
        again: the server's conversation reuse then keeps no more than the previous prompt (worker.Slot)."""
        return True

    @property
    def prefill_checkpoint_stride(self) -> int:
        """g > 0 where a prefill's calls must start on multiples of g to keep a fresh prefill's bits, and a prefill
        leaves its own checkpoint at the last multiple of g it passes (the CUDA engine's chunked GDN: CudaEngine.prefill
        rewinds a call that would start inside a chunk to the chunk's start, which drops any later checkpoint); 0: any
        position will do (worker.Slot then checkpoints before the last prompt token itself)."""
        return 0

    @abc.abstractmethod
    def memory(self) -> dict[str, int]:
        """Bytes held: ``weights_bytes``; ``states_bytes`` and ``n_states`` over the live states this engine
        made or was given (copies included; checkpoints shared by copies count once per state)."""

    @abc.abstractmethod
    def stats(self) -> EngineStats:
        """Timing counters (a copy)."""

    @abc.abstractmethod
    def reset_stats(self) -> None:
        """Zero the timing counters."""
