"""The CUDA engine's Python side (openjet_launcher/engine/cuda.py) over a fake native library: the host
bookkeeping that the GPU tests exercise only on a GPU. The fake keeps the device's sequence (n_past, the draft
rows, a pending verify step) and checks every call's arguments the way the C API does, so this catches a
binding that passes the wrong count, forgets a row or loses track of the sequence."""

from __future__ import annotations

import ctypes
import re
import types

import numpy as np
import pytest

from openjet_launcher.engine.cuda import GDN_CHUNK, CudaEngine, gdn_chunk_rows
from openjet_launcher.engine.interface import rank_subset
from openjet_launcher.errors import OpenJetError

N_VOCAB, N_EMBD = 300, 16


def head_logit(token_id: int) -> float:
    """What the fake MTP head gives a token: highest at id 77."""
    return -abs(token_id - 77) / 10


class FakeLib:
    """openjet_engine_* on the host: the calls cuda.py makes, with the C API's checks."""

    def __init__(self):
        self.n_past, self.pending, self.rows, self.slots = 0, 0, [], {}
        self.draft_cap = self.draft_allocations = 0
        self.calls: list[tuple] = []
        self.error = b""
        self.mtp = 1
        self.prefill_rows = 1024
        self.target = 0                                  # every verify row's argmax (top 1)
        self.head_rows = False                           # verify_top's rows (k > 1): the head's top k, not ids k-1..0

    def _fail(self, msg: str) -> int:
        self.error = msg.encode()
        return -1

    def openjet_engine_last_error(self):
        return self.error

    def openjet_engine_reset(self, h):
        self.n_past, self.pending = 0, 0
        return 0

    def openjet_engine_has_mtp(self, h, out):
        ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = self.mtp
        return 0

    def _step(self, name, ids, t):
        self.calls.append((name, [int(ids[i]) for i in range(t)]))
        if self.pending:
            return self._fail(f"{name}: a verify step awaits openjet_engine_accept")
        return 0

    def openjet_engine_n_past(self, h, out):
        out._obj.value = self.n_past
        return 0

    def openjet_engine_prefill(self, h, ids, n, chunk, logits, hidden):
        self.calls.append(("prefill", n, chunk))
        if not 1 <= chunk <= self.prefill_rows:
            return self._fail(f"prefill: chunk = {chunk} is not 1..{self.prefill_rows} (the engine's prefill_rows)")
        self.n_past += n
        return 0

    def openjet_engine_prefill_checkpoint(self, h, ids, n, chunk, slot, at, logits, hidden):
        self.calls.append(("prefill_checkpoint", n, chunk, at))
        if not 1 <= chunk <= self.prefill_rows or not 1 <= at < n:
            return self._fail(f"prefill_checkpoint: chunk = {chunk} or at = {at}")
        self.slots[slot] = self.n_past + at
        self.n_past += n
        return 0

    def openjet_engine_decode(self, h, ids, t, logits, hidden):
        rc = self._step("decode", ids, t)
        if rc == 0:
            self.n_past += t
        return rc

    def openjet_engine_verify(self, h, ids, t, logits, hidden):
        rc = self._step("verify", ids, t)
        if rc == 0:
            self.pending = t
            np.ctypeslib.as_array(logits, shape=(t, N_VOCAB))[:] = [head_logit(i) for i in range(N_VOCAB)]
        return rc

    def openjet_engine_verify_top(self, h, ids, t, k, n_valid, values, top_ids, hidden):
        rc = self._step("verify_top", ids, t)
        if rc == 0:
            self.pending = t
            if self.head_rows and k > 1:
                np.ctypeslib.as_array(values, shape=(t, k))[:], np.ctypeslib.as_array(top_ids, shape=(t, k))[:] = \
                    self._head_top(k, n_valid)
            else:
                np.ctypeslib.as_array(top_ids, shape=(t, k))[:] = np.arange(k)[::-1] if k > 1 else self.target
        return rc

    @staticmethod
    def _head_top(k: int, n_valid: int) -> tuple[np.ndarray, np.ndarray]:
        """The fake head's top k logits among ids < n_valid (value down, ties to the lower id) and their ids."""
        ids = np.array(sorted(range(max(0, 77 - k), min(n_valid, 78 + k)), key=lambda i: (-head_logit(i), i))[:k])
        return np.array([head_logit(i) for i in ids], np.float32), ids.astype(np.int32)

    def openjet_engine_accept(self, h, n):
        if not 1 <= n <= self.pending:
            return self._fail(f"accept: n = {n} is not 1..{self.pending}")
        self.n_past += n
        self.pending = 0
        return 0

    def openjet_engine_decode_top(self, h, ids, t, k, n_valid, pen_ids, pen_deltas, n_pen, values, top_ids, hidden):
        rc = self._step("decode_top", ids, t)
        if rc == 0:
            self.n_past += t
            out = np.ctypeslib.as_array(top_ids, shape=(t, k))
            out[:] = np.arange(k)
        return rc

    def openjet_engine_checkpoint(self, h, slot):
        self.slots[slot] = self.n_past
        return 0

    def openjet_engine_restore(self, h, slot):
        self.n_past = self.slots[slot]
        return 0

    def openjet_engine_set_draft_rows(self, h, ids, n, keep):
        if not 0 <= keep <= len(self.rows) or n < keep:
            return self._fail("set_draft_rows: keep")
        if n > self.draft_cap:  # engine.cu's buffer grows (a new allocation beside the old) and never shrinks
            self.draft_cap = n
            self.draft_allocations += 1
        self.rows = self.rows[:keep] + [int(ids[i]) for i in range(keep, n)]
        self.calls.append(("set_draft_rows", n, keep))
        return 0

    def openjet_engine_mtp_step(self, h, token, k, logits, hidden):
        n = len(self.rows) or N_VOCAB
        out = np.ctypeslib.as_array(logits, shape=(n,))
        out[:] = [head_logit(i) for i in (self.rows or range(N_VOCAB))]
        return 0

    def _greedy_pick(self, n_valid: int) -> tuple[float, int]:
        """The C API's pick: value down, ties to the lower id, ids < n_valid (none: id 0 at -inf)."""
        cands = sorted((-head_logit(i), i) for i in (self.rows or range(N_VOCAB)) if i < n_valid)
        return (-cands[0][0], cands[0][1]) if cands else (-np.inf, 0)

    def openjet_engine_mtp_draft_greedy(self, h, token, n, n_valid, drafts, values, hidden):
        self.calls.append(("mtp_draft_greedy", int(token), n, n_valid, tuple(self.rows)))
        if not 1 <= n <= 8 or not 1 <= n_valid <= N_VOCAB:
            return self._fail(f"mtp_draft_greedy: n = {n} or n_valid = {n_valid}")
        value, pick = self._greedy_pick(n_valid)
        np.ctypeslib.as_array(drafts, shape=(n,))[:] = pick
        if values:
            np.ctypeslib.as_array(values, shape=(n,))[:] = value
        if hidden:
            np.ctypeslib.as_array(hidden, shape=(n, N_EMBD))[:] = 0.0
        return 0

    def openjet_engine_mtp_draft_sampled(self, h, token, n, n_valid, k, temperature, top_p, min_p, u, drafts, q_ids,
                                         q_probs, q_len):
        self.calls.append(("mtp_draft_sampled", int(token), n, n_valid, k, round(temperature, 6), round(top_p, 6),
                           round(min_p, 6), tuple(self.rows)))
        if not 1 <= n <= 8 or not 1 <= k <= 32:
            return self._fail(f"mtp_draft_sampled: n = {n} or k = {k}")
        picks, ids, probs = self._sampled_drafts(n_valid, k, np.ctypeslib.as_array(u, shape=(n,)))
        np.ctypeslib.as_array(drafts, shape=(n,))[:] = picks
        np.ctypeslib.as_array(q_ids, shape=(n, k))[:, :len(ids)] = ids
        np.ctypeslib.as_array(q_probs, shape=(n, k))[:, :len(ids)] = probs
        np.ctypeslib.as_array(q_len, shape=(n,))[:] = len(ids)
        return 0

    def _sampled_drafts(self, n_valid: int, k: int, us: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The fake's sampled drafts, one a uniform, and their q (ids increasing, probabilities). Not the kernel's
        transform: any q serves, as long as the caller gets back the one each draft came from."""
        cands = sorted((-head_logit(i), i) for i in (self.rows or range(N_VOCAB)) if i < n_valid)[:k]
        ids = np.array(sorted(i for _, i in cands), np.int32)
        probs = np.full(len(ids), 1.0 / len(ids))
        return ids[np.minimum((us * len(ids)).astype(int), len(ids) - 1)], ids, probs

    def openjet_engine_cycle_sampled(self, h, token, n_draft, n_valid, k, temperature, top_p, min_p, u, out, n_out,
                                     n_used):
        """The C API's contract on the host: the fake's sampled drafts with u[:n_draft], its verify_top rows (the
        head's top k), speculative.py's accept_sampled over the request's transform of them, taking the acceptance
        stream u[n_draft:] one uniform at a time, and the accept."""
        from openjet_launcher.sampling import Sampler, SamplingParams
        from openjet_launcher.speculative import accept_sampled
        self.calls.append(("cycle_sampled", int(token), n_draft, n_valid, k, tuple(self.rows)))
        if self.pending or not 0 <= n_draft <= 7 or not 1 <= k <= 32:
            return self._fail(f"cycle_sampled: pending {self.pending}, n_draft = {n_draft} or k = {k}")
        us = np.ctypeslib.as_array(u, shape=(2 * n_draft + 1,))
        drafts, ids, probs = self._sampled_drafts(n_valid, k, us[:n_draft])
        stream = iter(us[n_draft:].tolist())
        taken = []
        sampler = Sampler(SamplingParams(temperature=temperature, top_k=k, top_p=top_p, min_p=min_p), n_valid)
        sampler.rng = types.SimpleNamespace(random=lambda: taken.append(next(stream)) or taken[-1])
        p_rows = [sampler.distribution_top(*self._head_top(k, n_valid)) for _ in range(1 + n_draft)]
        kept, next_token = accept_sampled(p_rows, [(ids, probs)] * n_draft, [int(d) for d in drafts], sampler)
        o = np.ctypeslib.as_array(out, shape=(n_draft + 1,))
        o[:kept], o[kept] = drafts[:kept], next_token
        n_out._obj.value, n_used._obj.value = kept + 1, len(taken)
        self.n_past += kept + 1
        return 0

    def openjet_engine_cycle_greedy(self, h, token, n_draft, n_valid, out, n_out):
        self.calls.append(("cycle_greedy", int(token), n_draft, n_valid, tuple(self.rows)))
        if self.pending or not 0 <= n_draft <= 7:
            return self._fail(f"cycle_greedy: pending {self.pending} or n_draft = {n_draft}")
        drafts = [self._greedy_pick(n_valid)[1]] * n_draft
        k = 0
        while k < n_draft and drafts[k] == self.target:
            k += 1
        o = np.ctypeslib.as_array(out, shape=(n_draft + 1,))
        o[:k], o[k] = drafts[:k], self.target
        n_out._obj.value = k + 1
        self.n_past += k + 1
        return 0

    def openjet_engine_destroy(self, h):
        return None


def fake_engine(n_ctx: int = 4096, n_checkpoints: int = 2, prefill_rows: int = 512) -> CudaEngine:
    shape = types.SimpleNamespace(n_vocab=N_VOCAB, n_embd=N_EMBD, n_layer=2)
    return CudaEngine(types.SimpleNamespace(shape=shape, name="fake"), FakeLib(), 1, n_ctx, "f16", n_checkpoints,
                      prefill_rows=prefill_rows)


@pytest.fixture
def engine():
    e = fake_engine(n_ctx=64)
    yield e
    e._handle = ctypes.c_void_p()


def test_the_draft_rows_follow_the_list_and_the_sequence(engine):
    lib = engine._lib
    engine.set_draft_vocabulary(np.array([5, 3, 90]))
    assert lib.rows == [3, 5, 90]
    state = engine.new_state()
    engine.decode(state, [3, 150, 151])
    draft = engine.mtp_draft(state, 200, 2)
    assert lib.rows == [3, 5, 90, 150, 151, 200]                # the sequence's tokens and the drafted-after one
    finite = np.flatnonzero(np.isfinite(draft.logits[0]))
    assert list(finite) == lib.rows
    assert draft.logits[0][90] == np.float32(head_logit(90)) and draft.tokens == [90, 90]   # nearest to 77
    engine.truncate(state, 1)                                    # back to [3]: then new tokens at old positions
    engine.decode(state, [160, 161])
    engine.mtp_draft(state, 3, 1)
    assert lib.rows == [3, 5, 90, 160, 161]                     # the rewound tokens' rows went: the sequence's own
    assert [c for c in lib.calls if c[0] == "set_draft_rows"][-1] == ("set_draft_rows", 5, 3)
    engine.new_state()                                            # a new sequence: the list's rows only
    assert lib.rows == [3, 5, 90]
    engine.set_draft_vocabulary(None)
    assert lib.rows == []
    state = engine.new_state()
    engine.decode(state, [1])
    assert np.isfinite(engine.mtp_draft(state, 3, 1).logits).all()   # the full head again


def test_the_draft_rows_room_is_reserved_with_the_list_and_never_grown(engine, monkeypatch):
    """set_draft_vocabulary reserves the list's rows and SEQUENCE_ROWS more in one allocation (what
    launcher/memory.py plans for); a sequence's new tokens fill that room in order of first appearance and later ones
    wait for room: the library's buffer is never grown while serving (a growth holds the old and the new buffer at
    once)."""
    from openjet_launcher.engine import cuda

    monkeypatch.setattr(cuda, "SEQUENCE_ROWS", 3)
    lib = engine._lib
    engine.set_draft_vocabulary(np.array([5, 3, 90]))
    assert (lib.draft_cap, lib.draft_allocations, lib.rows) == (6, 1, [3, 5, 90])
    state = engine.new_state()
    engine.decode(state, [3, 150])
    engine.mtp_draft(state, 151, 1)
    assert lib.rows == [3, 5, 90, 150, 151]
    engine.decode(state, [151, 160, 161, 162])
    engine.mtp_draft(state, 163, 1)                               # 160..163 new, one row left: the first
    assert lib.rows == [3, 5, 90, 150, 151, 160] and lib.draft_allocations == 1
    engine.mtp_draft(state, 170, 1)                               # full: nothing added, nothing grown
    assert lib.rows == [3, 5, 90, 150, 151, 160] and (lib.draft_cap, lib.draft_allocations) == (6, 1)
    engine.truncate(state, 2)                                     # [3, 150]: room again, for what follows now
    engine.decode(state, [170])
    engine.mtp_draft(state, 171, 1)
    assert lib.rows == [3, 5, 90, 150, 170, 171] and lib.draft_allocations == 1
    engine.new_state()
    assert lib.rows == [3, 5, 90]


def test_the_draft_rows_depend_on_the_sequence_alone(engine):
    """Rows are the list's, then the sequence's other tokens and the token drafted after, at first appearance: the
    same sequence gives the same rows whatever an earlier request on the rewound sequence left (the server rewinds
    its slot with truncate), so a seeded sampled request drafts over the same q both times."""
    lib = engine._lib
    engine.set_draft_vocabulary(np.array([5, 3, 90]))
    fresh = engine.new_state()
    engine.decode(fresh, [3, 150, 151])
    engine.mtp_draft(fresh, 152, 1)
    wanted = list(lib.rows)
    assert wanted == [3, 5, 90, 150, 151, 152]
    state = engine.new_state()
    engine.decode(state, [3, 150, 200, 201, 202])                 # an earlier request's answer ...
    engine.mtp_draft(state, 203, 2)
    engine.truncate(state, 2)                                     # ... rewound to the shared prompt [3, 150]
    engine.decode(state, [151])
    engine.mtp_draft(state, 152, 1)
    assert lib.rows == wanted
    n_calls = len(lib.calls)
    engine.decode(state, [152])                                   # the drafted-after token, now in the sequence:
    engine.mtp_draft(state, 153, 1)                               # only the new row is sent
    assert lib.rows == wanted + [153] and [c for c in lib.calls[n_calls:] if c[0] == "set_draft_rows"] == [
        ("set_draft_rows", 7, 6)]


def test_the_plan_holds_the_draft_rows_the_binding_reserves():
    """launcher/memory.py's draft_rows term is engine.cu's draft_bytes at the capacity set_draft_vocabulary reserves
    for the shipped list (which is at most DEFAULT_SIZE ids), for the 27B's lm_head rows (Q6_K: 4,200 bytes in the
    GGUF, 4,240 in the tile layout the engine gathers them into: 20 units of 210 bytes at a pitch of 212)."""
    from openjet_launcher.launcher.memory import memory_model
    from openjet_launcher.model import draft_vocab
    from openjet_launcher.model.shape import QWEN38_27B

    assert len(draft_vocab.load(draft_vocab.SHIPPED).tokens) <= draft_vocab.DEFAULT_SIZE
    mm = memory_model(QWEN38_27B)
    # by hand: (32,768 listed + 8,192 sequence rows: whole groups of 16) x (a Q6_K row of 5,120 in the tile layout: 20
    # units at a 212-byte pitch, + a 4-byte id)
    assert mm.draft_rows_bytes == (32768 + 8192) * (20 * 212 + 4) + 16 == 173_834_256
    plan = mm.plan(n_ctx=4096, kv_format="q8_0", chunk=512, n_agents=1, embd_on_host=False, total_vram=24 << 30,
                   v1_arena=True)
    assert plan.draft_rows == mm.draft_rows_bytes and plan.total >= plan.decode_workspace + plan.draft_rows


def test_the_binding_reserves_no_more_rows_than_the_plan_holds(engine, monkeypatch):
    """What set_draft_vocabulary reserves with a full-size list is what the plan counts rows for (list + room)."""
    from openjet_launcher.model import draft_vocab

    monkeypatch.setattr(draft_vocab, "DEFAULT_SIZE", 200)
    from openjet_launcher.engine import cuda
    monkeypatch.setattr(cuda, "SEQUENCE_ROWS", 50)
    engine.set_draft_vocabulary(np.arange(200))
    assert engine._lib.draft_cap == min(200 + 50, N_VOCAB) and engine._lib.draft_allocations == 1


def test_native_verify_keeps_the_sequence_until_accept(engine):
    lib = engine._lib
    engine.native_verify = True
    state = engine.new_state()
    engine.decode(state, [1, 2])
    out = engine.verify(state, [3, 4, 5])
    assert out.logits.shape == (3, N_VOCAB) and state.n_tokens == 2 and state.verify_rows == 3
    for call in (lambda: engine.decode(state, [9]), lambda: engine.prefill(state, [9]), lambda: engine.checkpoint(state),
                 lambda: engine.truncate(state, 1)):  # refused before anything changes (no rewind, no reset)
        with pytest.raises(OpenJetError, match=r"a verify step of 3 rows awaits accept\(state, n\), n = 1..3"):
            call()
    assert lib.n_past == 2 and state.tokens == (1, 2) and state.checkpoint_positions == ()
    with pytest.raises(OpenJetError, match="is not 1..3"):
        engine.accept(state, 4)
    engine.accept(state, 2)
    assert state.tokens == (1, 2, 3, 4) and state.verify_rows == 0 and lib.n_past == 4
    with pytest.raises(OpenJetError, match="no verify step is pending"):  # the reference engine's words
        engine.accept(state, 1)


def test_a_checkpoint_that_fails_leaves_no_record_of_its_slot(engine, monkeypatch):
    """The library empties a slot before writing it: after a failed checkpoint at a position the state already had,
    the record must not still name that slot (a truncate would restore an empty slot, 'holds no checkpoint')."""
    lib = engine._lib
    state = engine.new_state()
    engine.decode(state, [1, 2])
    engine.checkpoint(state)
    assert state.checkpoint_positions == (2,)
    monkeypatch.setattr(lib, "openjet_engine_checkpoint", lambda h, slot: lib._fail("checkpoint: cudaErrorLaunchFailure"))
    with pytest.raises(OpenJetError, match="cudaErrorLaunchFailure"):
        engine.checkpoint(state)
    assert state.checkpoint_positions == ()
    engine.truncate(state, 1)                                     # replays from the start instead
    assert state.tokens == (1,)


def test_an_accept_that_fails_on_the_gpu_leaves_no_verify_pending(engine, monkeypatch):
    """The library drops its pending verify when accept fails part way (and marks the sequence undefined): the
    binding must drop its own too, or truncate, which recovers by restore or reset, refused as 'awaits accept'."""
    lib = engine._lib
    engine.native_verify = True
    state = engine.new_state()
    engine.decode(state, [1, 2])
    engine.verify(state, [3, 4, 5])

    def fails_part_way(h, n):
        lib.pending = 0
        return lib._fail("accept: cudaErrorLaunchFailure")
    monkeypatch.setattr(lib, "openjet_engine_accept", fails_part_way)
    with pytest.raises(OpenJetError, match="cudaErrorLaunchFailure"):
        engine.accept(state, 2)
    assert state.verify_rows == 0 and engine._pending == [] and state.tokens == (1, 2)
    engine.truncate(state, 1)                                     # recovers: reset and replay
    assert state.tokens == (1,) and lib.n_past == 1


@pytest.mark.parametrize("why", ["switched off", "no MTP head"])
def test_the_interfaces_verify_checkpoints_decodes_and_truncates(engine, why):
    """Without the device's verify (switched off, or no MTP head: no shadow state on the device) the
    interface's default runs: checkpoint, decode, and on accept restore + replay."""
    lib = engine._lib
    if why == "switched off":
        engine.native_verify = False
    else:
        lib.mtp = 0
    state = engine.new_state()
    engine.decode(state, [1, 2])
    engine.verify(state, [3, 4, 5])
    assert state.n_tokens == 5 and lib.n_past == 5 and 2 in state.slots      # decoded, checkpoint at 2
    engine.accept(state, 1)
    assert state.tokens == (1, 2, 3) and lib.n_past == 3                      # restored to 2, 3 replayed
    assert lib.calls[-1] == ("decode", [3])


def test_native_top_returns_the_devices_rows_and_advances(engine):
    engine.native_top = True
    state = engine.new_state()
    top = engine.decode_top(state, [7, 8], k=4, penalties={2: 0.5})
    assert top.ids.shape == (2, 4) and list(top.ids[0]) == [0, 1, 2, 3] and state.tokens == (7, 8)
    with pytest.raises(OpenJetError, match="at most 8 tokens"):
        engine.decode_top(state, list(range(9)), k=4)


def test_verify_top_is_a_verify_step_that_returns_the_devices_rows(engine):
    """verify_top goes through openjet_engine_verify_top (the device's ranking), holds the sequence like
    verify until accept, and without native_top takes the interface's verify + host ranking."""
    lib = engine._lib
    state = engine.new_state()
    engine.decode(state, [1, 2])
    top = engine.verify_top(state, [3, 4, 5], k=4)
    assert lib.calls[-1] == ("verify_top", [3, 4, 5]) and list(top.ids[0]) == [3, 2, 1, 0]
    assert state.n_tokens == 2 and lib.pending == 3
    engine.accept(state, 2)
    assert state.tokens == (1, 2, 3, 4) and lib.n_past == 4
    engine.native_top = False
    top = engine.verify_top(state, [6, 7], k=2)
    assert lib.calls[-1] == ("verify", [6, 7])
    best = sorted(range(N_VOCAB), key=lambda i: (-np.float32(head_logit(i)), i))[:2]   # host ranking
    assert [list(r) for r in top.ids] == [best, best]


def test_draft_top_ranks_only_the_draft_rows_as_the_whole_row_would_rank(engine):
    """mtp_draft_top with a draft vocabulary ranks its rows alone; the result is the whole (-inf padded) row's
    ranking (value down, ties to the lower id: the fake head ties 76 with 78), within n_valid; with fewer
    rows than k it ranks the whole row. Oracle: numpy's stable sort of the padded rows."""
    engine.set_draft_vocabulary(np.array([78, 5, 76, 90, 299, 77]))
    state = engine.new_state()
    engine.decode(state, [3, 150])
    full = engine.mtp_draft(state, 200, 2)
    for k, n_valid in ((1, N_VOCAB), (4, N_VOCAB), (4, 78), (12, N_VOCAB)):
        top = engine.mtp_draft_top(state, 200, 2, k=k, n_valid=n_valid)
        for j in range(2):
            order = np.argsort(-full.logits[j][:n_valid], kind="stable")[:k]
            np.testing.assert_array_equal(top.ids[j], order, err_msg=f"k={k} n_valid={n_valid}")
            np.testing.assert_array_equal(top.values[j], full.logits[j][order])
        assert top.tokens == [int(top.ids[0][0]), int(top.ids[1][0])]
    picked = engine.mtp_draft_top(state, 200, 2, k=4, choose=lambda values, ids: int(ids[-1]))
    assert picked.tokens == [int(picked.ids[0][-1]), int(picked.ids[1][-1])]


def test_greedy_drafts_go_to_the_device_chain_with_the_host_rankings_answer(engine):
    """Greedy drafting (mtp_draft_top with k = 1 and no choice) is one openjet_engine_mtp_draft_greedy call per chain,
    after the draft rows took the sequence's tokens, and hands back what the step-by-step host ranking gives (the
    fake head peaks at 77 and ties 76 with 78: the lower id; n_valid bounds the ids); native_draft off, a choice, or
    k > 1 take the steps."""
    state = engine.new_state()
    engine.decode(state, [3, 150])
    expected = {(True, N_VOCAB): 77, (True, 77): 76, (True, 78): 77, (False, N_VOCAB): 76, (False, 77): 76,
                (False, 76): 5}
    for (with_77, n_valid), want in expected.items():
        engine.set_draft_vocabulary(np.array([78, 5, 76, 90, 299, 77] if with_77 else [78, 5, 76, 90]))
        got = {}
        for native in (True, False):
            engine.native_draft = native
            engine._lib.calls.clear()
            got[native] = engine.mtp_draft_top(state, 200, 3, k=1, n_valid=n_valid)
            chains = [c for c in engine._lib.calls if c[0] == "mtp_draft_greedy"]
            assert len(chains) == (1 if native else 0)
        np.testing.assert_array_equal(got[True].ids, got[False].ids)
        np.testing.assert_array_equal(got[True].values, got[False].values)
        assert got[True].tokens == got[False].tokens == [want] * 3, (with_77, n_valid)
    engine.native_draft = True
    engine._lib.calls.clear()
    engine.mtp_draft_top(state, 201, 2, k=1)
    # the rows are the sequence's: 200, drafted after last time but not in the sequence, went
    assert engine._lib.calls[-1] == ("mtp_draft_greedy", 201, 2, N_VOCAB, (5, 76, 78, 90, 3, 150, 201))
    engine._lib.calls.clear()
    engine.mtp_draft_top(state, 201, 2, k=4)
    engine.mtp_draft_top(state, 201, 2, k=1, choose=lambda values, ids: int(ids[0]))
    assert not [c for c in engine._lib.calls if c[0] == "mtp_draft_greedy"]


@pytest.mark.parametrize("target", [0, 77])
def test_a_greedy_cycle_in_one_call_gives_the_calls_one_at_a_time(engine, target):
    """With native_draft on, a greedy cycle is one openjet_engine_cycle_greedy call (after the draft rows took the
    sequence's tokens), and its kept drafts, next token and sequence are those of the interface's cycle over the
    single calls (drafts, verify_top, accept): every draft kept (the fake's verify agrees with its head at 77) or
    none (target 0)."""
    engine.set_draft_vocabulary(np.array([78, 5, 76, 90, 299, 77]))
    engine._lib.target = target
    got = {}
    for native in (True, False):
        engine.native_draft = native
        state = engine.new_state()
        engine.decode(state, [3, 150])
        engine._lib.calls.clear()
        got[native] = (engine.greedy_cycle(state, 200, 3, n_valid=N_VOCAB), list(state.token_ids),
                       engine._lib.n_past)
        cycles = [c for c in engine._lib.calls if c[0] == "cycle_greedy"]
        assert cycles == ([("cycle_greedy", 200, 3, N_VOCAB, (5, 76, 77, 78, 90, 299, 3, 150, 200))] if native else [])
    assert got[True] == got[False]
    kept, next_token = got[True][0]
    assert (kept, next_token) == (([77, 77, 77], 77) if target == 77 else ([], 0))
    assert got[True][1] == [3, 150, 200, *kept] and got[True][2] == len(got[True][1])


@pytest.mark.parametrize("n_draft", [1, 3, 7])
def test_a_sampled_cycle_in_one_call_gives_the_calls_one_at_a_time(engine, n_draft):
    """With native_sampled_cycle on, a sampled cycle is one openjet_engine_cycle_sampled call with the drafts'
    uniforms and the acceptance stream drawn ahead from the request's generator; its kept drafts, next tokens and
    sequence over 6 cycles are those of the interface's cycle over the single calls (device drafts, verify_top,
    the host's accept_sampled, accept), and the generator ends where theirs leaves it (it takes back the uniforms
    the acceptance did not use). The fake's verdict is accept_sampled itself, so this checks the binding's
    bookkeeping (the uniforms' layout, the rewind, the sequence); the device's verdict against the pieces is
    test_gpu_engine's test_the_sampled_cycle_in_one_call_gives_the_pieces_tokens."""
    from openjet_launcher.sampling import Sampler, SamplingParams
    from openjet_launcher.speculative import speculative_cycle
    engine.set_draft_vocabulary(np.array([78, 5, 76, 90, 299, 77, 79, 75]))
    engine._lib.head_rows = True
    engine.native_draft = True
    got = {}
    for one_call in (True, False):
        engine.native_sampled_cycle = one_call
        sampler = Sampler(SamplingParams(temperature=0.7, top_k=6, top_p=0.95, seed=3), N_VOCAB)
        state = engine.new_state()
        engine.decode(state, [3, 150])
        engine._lib.calls.clear()
        token, cycles = 200, []
        for _ in range(6):
            cycle = speculative_cycle(engine, state, sampler, token, n_draft)
            cycles.append((cycle.accepted, cycle.next_token))
            token = cycle.next_token
        calls = [c[0] for c in engine._lib.calls]
        assert ("cycle_sampled" in calls) == one_call and ("verify_top" in calls) != one_call
        got[one_call] = (cycles, list(state.token_ids), engine._lib.n_past, sampler.rng.random())
    assert got[True] == got[False]
    kept = sum(len(a) for a, _ in got[True][0])
    assert 0 < kept < 6 * n_draft  # both verdicts happened: drafts kept, and a rejection's draw


def test_sampled_drafts_go_to_the_device_chain_with_its_uniforms_and_hand_back_its_q(engine):
    """Sampled drafting on the device (native_draft): one openjet_engine_mtp_draft_sampled call with the request's
    transform and one uniform per draft from the sampler's generator (its stream advances by n_draft, as the host's
    draws advance it); the drafts and each one's q (ids increasing, probabilities) come back as the device gave them.
    Off, the host draws from Sampler.distribution_top of mtp_draft_top's rows."""
    from openjet_launcher.sampling import Sampler, SamplingParams
    params = SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, seed=11)
    state = engine.new_state()
    engine.decode(state, [3, 150])
    engine.set_draft_vocabulary(np.array([78, 5, 76, 90, 299, 77]))
    engine.native_draft = True
    sampler = Sampler(params, N_VOCAB)
    got = engine.mtp_draft_sampled(state, 200, 3, sampler, k=5)
    assert engine._lib.calls[-1] == ("mtp_draft_sampled", 200, 3, N_VOCAB, 5, 0.7, 0.9, 0.05,
                                     (5, 76, 77, 78, 90, 299, 3, 150, 200))
    u = np.random.default_rng(11).random(3)
    assert sampler.rng.random() == np.random.default_rng(11).random(4)[3]  # the generator moved on by 3
    five = [5, 76, 77, 78, 90]                                             # the fake head's top 5, ids increasing
    assert got.tokens == [five[min(int(x * 5), 4)] for x in u]
    for ids, probs in got.q:
        assert ids.tolist() == five and np.allclose(probs, 0.2)
    engine.native_draft = False
    engine._lib.calls.clear()
    host = Sampler(params, N_VOCAB)
    off = engine.mtp_draft_sampled(state, 200, 2, host, k=5)
    assert not [c for c in engine._lib.calls if c[0] == "mtp_draft_sampled"]
    ref = Sampler(params, N_VOCAB)
    rows = np.array(engine._draft_rows, np.int64)
    values, ids = rank_subset(np.array([head_logit(i) for i in rows], np.float32), rows, 5, N_VOCAB)
    for j in range(2):
        want = ref.distribution_top(values, ids)
        np.testing.assert_array_equal(off.q[j][0], want[0])
        np.testing.assert_array_equal(off.q[j][1], want[1])
        assert off.tokens[j] == int(want[0][ref.draw(want[1])])


def test_the_draft_rows_array_follows_the_rows_through_every_change(engine):
    """CudaEngine keeps the draft rows twice (a list with an index, and the array each draft step ranks by): after
    setting a list, drafting after new tokens (rows appended), a new sequence (its tokens dropped) and clearing it,
    the array is the list, and the device got the same rows."""
    def same():
        assert engine._draft_row_ids.dtype == np.int64
        assert engine._draft_row_ids.tolist() == engine._draft_rows == engine._lib.rows
    engine.set_draft_vocabulary(np.array([78, 5, 76]))
    same()
    state = engine.new_state()
    engine.decode(state, [3, 150, 5])
    engine.mtp_draft_top(state, 200, 2, k=1)
    same()
    assert engine._draft_rows[3:] == [3, 150, 200]
    engine.new_state()
    same()
    assert engine._draft_rows == [5, 76, 78]
    engine.set_draft_vocabulary(None)
    same()
    assert engine._draft_rows == []


def test_prefill_chunks_default_to_the_engines_prefill_rows_and_never_pass_them(monkeypatch):
    monkeypatch.setenv("OPENJET_GDN_CHUNKED", "0")  # one call per prefill (the chunked GDN's cuts: the test below)
    shape = types.SimpleNamespace(n_vocab=N_VOCAB, n_embd=N_EMBD, n_layer=2)
    e = CudaEngine(types.SimpleNamespace(shape=shape, name="fake"), FakeLib(), 1, 4096, "f16", 2, prefill_rows=1024)
    try:
        state = e.new_state()
        e.prefill(state, [i % N_VOCAB for i in range(3000)])
        e.prefill(state, list(range(10)), chunk_size=4096)   # asked for more than the engine holds: its rows
        e.prefill(state, list(range(10)), chunk_size=64)
        assert [c for c in e._lib.calls if c[0] == "prefill"] == [("prefill", 3000, 1024), ("prefill", 10, 1024),
                                                                  ("prefill", 10, 64)]
        assert len(state.token_ids) == 3020
    finally:
        e._handle = ctypes.c_void_p()


def test_the_config_structure_matches_the_header_field_by_field():
    """cuda.py's EngineConfig is the C struct openjet_engine_create reads: a field out of order or missing
    (prefill_rows was added at the end) would hand the engine wrong sizes without an error."""
    import re
    from pathlib import Path

    from openjet_launcher.engine.cuda import EngineConfig

    header = (Path(__file__).resolve().parents[1] / "native/include/openjet_engine.h").read_text()
    body = re.search(r"typedef struct openjet_engine_config \{(.*?)\} openjet_engine_config;", header, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    fields = []
    for decl in filter(None, (d.strip() for d in body.split(";"))):
        ctype, names = decl.split(None, 1)
        fields += [(n.strip(), {"int": ctypes.c_int, "float": ctypes.c_float}[ctype]) for n in names.split(",")]
    assert fields == list(EngineConfig._fields_)
    assert fields[-1][0] == "prefill_rows"


def test_truncate_replays_each_run_the_way_it_was_first_run(engine):
    """Prefill and decode need not leave the same bits (the default prefill numerics), so a rollback replays
    prefilled tokens by prefill and decoded ones by decode steps: a prompt, a decoded reply, a second turn."""
    lib = engine._lib
    state = engine.new_state()
    engine.prefill(state, [1, 2, 3, 4, 5])
    engine.checkpoint(state)
    engine.decode(state, [6])
    for tok in range(7, 17):                      # 10 more decoded tokens: replayed in steps of at most 8
        engine.decode(state, [tok])
    engine.prefill(state, [17, 18, 19])
    assert bytes(state.prefilled) == b"\x01" * 5 + b"\x00" * 11 + b"\x01" * 3
    del lib.calls[:]
    engine.truncate(state, 18)                     # restore at 5, replay 6..16 decoded, 17 and 18 prefilled
    assert lib.calls == [("decode", list(range(6, 14))), ("decode", [14, 15, 16]),
                         ("prefill", 2, engine.prefill_rows)]
    assert state.tokens == tuple(range(1, 19)) and lib.n_past == 18
    assert bytes(state.prefilled) == b"\x01" * 5 + b"\x00" * 11 + b"\x01" * 2
    del lib.calls[:]
    engine.truncate(state, 3)                      # before the checkpoint: from the start, one prefill
    assert lib.calls == [("prefill", 3, engine.prefill_rows)] and state.tokens == (1, 2, 3)
    assert bytes(state.prefilled) == b"\x01" * 3 and state.checkpoint_positions == ()


def test_prefill_calls_keep_to_the_chunked_gdns_chunk_boundaries(engine, monkeypatch):
    """With the two-phase chunked GDN (the default: gdn_chunk_rows() = 32) a row's bits depend on where its call began
    modulo 32, so: a prefill ending inside a chunk leaves a checkpoint at the chunk's start (in the same call:
    openjet_engine_prefill_checkpoint); the next prefill rewinds there and reads the chunk in one call, as a prefill
    of the whole text would (the GPU tests check the bits); chunk sizes become multiples of 32. Not after a decoded
    token (a fresh prefill would not give its bits anyway), and none of it under OPENJET_GDN_CHUNKED=0 or the exact
    prefill. A prefill past the context is refused before any of it (the sequence kept as it was)."""
    monkeypatch.delenv("OPENJET_GDN_CHUNKED", raising=False)
    monkeypatch.delenv("OPENJET_PREFILL_GEMM", raising=False)
    lib = engine._lib
    assert gdn_chunk_rows() == GDN_CHUNK == 32
    state = engine.new_state()
    engine.prefill(state, list(range(1, 41)))           # 40 tokens, a checkpoint after 32 of them: one call
    assert lib.calls == [("prefill_checkpoint", 40, engine.prefill_rows, 32)]
    assert state.checkpoint_positions == (32,) and lib.slots[state.slots[32]] == 32 and lib.n_past == 40
    del lib.calls[:]
    with pytest.raises(OpenJetError, match="past this engine's context of 64"):
        engine.prefill(state, list(range(25)))
    assert lib.calls == [] and state.n_tokens == 40 and lib.n_past == 40
    engine.prefill(state, [41, 42], chunk_size=50)      # back to 32: 33..42 in one call, chunks of 32
    assert lib.calls == [("prefill", 10, 32)]
    assert state.tokens == tuple(range(1, 43)) and lib.n_past == 42 and bytes(state.prefilled) == b"\x01" * 42
    engine.decode(state, [43])
    del lib.calls[:]
    engine.prefill(state, [44, 45])                     # after a decoded token: where it is
    assert lib.calls == [("prefill", 2, engine.prefill_rows)] and lib.n_past == 45
    for name, value in (("OPENJET_GDN_CHUNKED", "0"), ("OPENJET_PREFILL_GEMM", "exact")):
        monkeypatch.setenv(name, value)
        assert gdn_chunk_rows() == 0
        state = engine.new_state()
        del lib.calls[:]
        engine.prefill(state, list(range(1, 41)), chunk_size=50)
        assert lib.calls == [("prefill", 40, 50)] and state.checkpoint_positions == (), name
        monkeypatch.delenv(name)


def test_the_prefill_numerics_come_from_the_environment_and_bad_values_are_refused(engine, monkeypatch, tmp_path):
    monkeypatch.delenv("OPENJET_PREFILL_GEMM", raising=False)
    assert not engine.prefill_matches_decode            # the fast GEMM by default
    for value, matches in (("fast", False), ("exact", True), ("shared", True), ("grouped", True), ("dense", False)):
        monkeypatch.setenv("OPENJET_PREFILL_GEMM", value)
        assert engine.prefill_matches_decode == matches, value
    monkeypatch.setenv("OPENJET_PREFILL_GEMM", "lean")
    with pytest.raises(OpenJetError, match="OPENJET_PREFILL_GEMM='lean' is not one of fast, exact"):
        CudaEngine.load(tmp_path / "missing.gguf")      # refused before the file is looked at


@pytest.mark.parametrize("name, bad, good", [("OPENJET_PREFILL_ATTN", "fast", "chunks"),
                                             ("OPENJET_GDN_CHUNKED", "true", "1"),
                                             ("OPENJET_GEMV_HALF", "half", "auto"),
                                             ("OPENJET_FFN_PERSISTENT", "5", "4"),
                                             ("OPENJET_FFN_TMA", "5", "4"),
                                             ("OPENJET_GEMV_CARVEOUT", "100", "max"),
                                             ("OPENJET_WEIGHT_LAYOUT", "1", "rows"),
                                             ("OPENJET_PACK_CLUSTER", "on", "2"),
                                             ("OPENJET_ATTN_PREFILL_ROWS", "96", "128"),
                                             ("OPENJET_ATTN_PREFILL_KEYS", "128", "64"),
                                             ("OPENJET_ATTN_PREFILL_F16", "yes", "1"),
                                             ("OPENJET_ATTN_PREFILL_WGMMA", "on", "2"),
                                             ("OPENJET_GDN_STATE_TC", "tc", "1"),
                                             ("OPENJET_GDN_LOCAL_TC", "on", "1"),
                                             ("OPENJET_ROW_PACK_THREADS", "128", "512"),
                                             ("OPENJET_PREFILL_FFN_FUSED", "off", "0"),
                                             ("OPENJET_PREFILL_F16_WEIGHTS", "yes", "auto"),
                                             ("OPENJET_GDN_NORM_PACK", "on", "1"),
                                             ("OPENJET_GDN_PACK_BOUND", "yes", "1"),
                                             ("OPENJET_PREFILL_F32", "tf32", "tf32x3"),
                                             ("OPENJET_PREFILL_RESIDUAL", "on", "1"),
                                             ("OPENJET_ATTN_PREP_ROWS", "2", "0"),
                                             ("OPENJET_GEMV_GROUP", "on", "0"),
                                             ("OPENJET_ATTN_OWN_PACK", "2", "1"),
                                             ("OPENJET_BENCH_SKIP_SWIGLU_PACK", "on", "0"),
                                             ("OPENJET_BENCH_GEMV_NO_MATH", "yes", "0")])
def test_the_kernel_switches_refuse_unknown_values_at_load(name, bad, good, monkeypatch, tmp_path):
    """A mistyped switch (OPENJET_PREFILL_ATTN=fast was the opt-in value of an earlier build) is an error naming the
    valid values, not a silent default; a valid one passes the check (the missing file is what fails then)."""
    monkeypatch.delenv("OPENJET_PREFILL_GEMM", raising=False)
    monkeypatch.setenv(name, bad)
    with pytest.raises(OpenJetError, match=f"{name}='{bad}' is not one of"):
        CudaEngine.load(tmp_path / "missing.gguf")
    monkeypatch.setenv(name, good)
    with pytest.raises(Exception) as err:
        CudaEngine.load(tmp_path / "missing.gguf")
    assert "is not one of" not in str(err.value)


@pytest.mark.parametrize("name", ["OPENJET_BENCH_GEMV_NO_MATH", "OPENJET_BENCH_SKIP_NORM_PACKS",
                                  "OPENJET_BENCH_SKIP_SWIGLU_PACK"])
def test_a_measurement_that_gives_wrong_outputs_warns_at_load(name, monkeypatch, tmp_path):
    """The benchmark switches whose steps compute wrong outputs (no GEMV arithmetic; packs skipped) say so at load,
    before anything runs, so a server started with one left set is not silently wrong."""
    monkeypatch.delenv("OPENJET_PREFILL_GEMM", raising=False)
    monkeypatch.setenv(name, "1")
    with pytest.warns(RuntimeWarning, match=f"{name} is set: .*WRONG"), pytest.raises(Exception) as err:
        CudaEngine.load(tmp_path / "missing.gguf")
    assert "is not one of" not in str(err.value)


@pytest.mark.parametrize("bad", ["0", "-46", "46.5", "all", " 46"])
def test_the_persistent_grid_limit_must_be_a_number_of_sms(bad, monkeypatch, tmp_path):
    """OPENJET_PERSISTENT_SMS (the persistent kernels' grid for a smaller GPU) takes a positive whole number; anything
    else is refused at load, before the file is looked at, instead of engine.cu's atoi reading it as 0 (all SMs)."""
    monkeypatch.delenv("OPENJET_PREFILL_GEMM", raising=False)
    monkeypatch.setenv("OPENJET_PERSISTENT_SMS", bad)
    with pytest.raises(OpenJetError, match=f"OPENJET_PERSISTENT_SMS='{re.escape(bad)}' is not a positive number"):
        CudaEngine.load(tmp_path / "missing.gguf")
    monkeypatch.setenv("OPENJET_PERSISTENT_SMS", "46")
    with pytest.raises(Exception) as err:
        CudaEngine.load(tmp_path / "missing.gguf")
    assert "OPENJET_PERSISTENT_SMS" not in str(err.value)



def test_truncate_refuses_a_count_that_is_not_an_integer_before_changing_anything(engine):
    """A float target used to pass the range check, restore the device to a checkpoint and only then fail at a slice:
    the device at the checkpoint, the record still at the old length. Now refused first."""
    lib = engine._lib
    state = engine.new_state()
    engine.prefill(state, list(range(1, 41)))
    engine.decode(state, [5, 6])
    for bad in (35.0, "35", None):
        with pytest.raises(OpenJetError, match="must be an integer"):
            engine.truncate(state, bad)
        assert state.n_tokens == 42 and lib.n_past == 42
    with pytest.raises(OpenJetError, match="chunk_size must be a positive integer"):
        engine.prefill(state, [7], chunk_size=True)


def test_truncate_replays_prefilled_tokens_in_the_calls_prefill_made(monkeypatch):
    """With the chunked GDN a prefill's calls are a multiple of its 32-row chunk (prefill_rows 100: 96), and so are a
    truncate's replay of prefilled tokens (it used prefill_rows itself: calls starting at 100, inside a chunk, whose
    rows then had other bits than the first run's)."""
    monkeypatch.delenv("OPENJET_GDN_CHUNKED", raising=False)
    monkeypatch.delenv("OPENJET_PREFILL_GEMM", raising=False)
    e = fake_engine(prefill_rows=100)
    try:
        lib = e._lib
        state = e.new_state()
        e.prefill(state, [1] * 200)
        assert lib.calls == [("prefill_checkpoint", 200, 96, 192)]
        del lib.calls[:]
        e.truncate(state, 150)  # before the checkpoint at 192: from the start
        assert lib.calls == [("prefill_checkpoint", 150, 96, 128)] and lib.n_past == 150
    finally:
        e._handle = ctypes.c_void_p()


def test_the_servers_prompt_checkpoint_is_the_chunked_gdns(monkeypatch):
    """worker.Slot.load_prompt on the chunked GDN (CudaEngine.prefill_checkpoint_stride = 32): a prompt in one call
    that leaves its checkpoint at the last chunk start (100 tokens: at 96), with no checkpoint of the slot's own at 99
    (the last token's prefill would rewind to 96 and drop it, prefilling 96..98 twice); a prompt ending on a chunk
    boundary (128) split there so that 96 is kept. A regenerated answer (the same prompt again) rewinds to 96 and
    prefills the rest in one call."""
    from openjet_launcher.server.worker import Slot
    monkeypatch.delenv("OPENJET_GDN_CHUNKED", raising=False)
    monkeypatch.delenv("OPENJET_PREFILL_GEMM", raising=False)
    for checkpoints in (1, 2):  # the served MTP setting keeps one
        e = fake_engine(n_checkpoints=checkpoints)
        try:
            lib, slot = e._lib, Slot(e)
            assert e.prefill_checkpoint_stride == 32
            prompt = [i % 250 + 1 for i in range(100)]
            slot.load_prompt(prompt)
            assert lib.calls == [("prefill_checkpoint", 100, e.prefill_rows, 96)]
            assert slot.state.checkpoint_positions == (96,) and lib.n_past == 100
            del lib.calls[:]
            _, reused = slot.load_prompt(prompt)  # a regenerated answer
            assert reused == 96 and lib.calls == [("prefill", 4, e.prefill_rows)]
            long = [i % 250 + 1 for i in range(128)]
            slot.reset()
            del lib.calls[:]
            slot.load_prompt(long)
            assert lib.calls == [("prefill", 96, e.prefill_rows), ("prefill", 32, e.prefill_rows)]
            assert slot.state.checkpoint_positions == (96,) and lib.n_past == 128
        finally:
            e._handle = ctypes.c_void_p()


def test_a_prefill_that_fails_part_way_keeps_the_record_of_what_the_engine_committed(engine):
    """openjet_engine_prefill commits chunk by chunk; where a later chunk fails, the state's record holds the tokens
    the engine committed (openjet_engine_n_past), so the next call continues from where the device is."""
    class FailingHalfWay(FakeLib):
        def openjet_engine_prefill(self, h, ids, n, chunk, logits, hidden):
            self.n_past += n // 2
            return self._fail("prefill: the second chunk failed")
    engine._lib = FailingHalfWay()
    state = engine.new_state()
    engine.decode(state, [1, 2])
    with pytest.raises(OpenJetError, match="the second chunk failed"):
        engine.prefill(state, [3, 4, 5, 6, 7, 8], chunk_size=3)
    assert state.tokens == (1, 2, 3, 4, 5) and engine._lib.n_past == 5


class BrokenAfterFailure(FakeLib):
    """A GPU failure the library reports after committing the step (engine.cu decode_impl: n_past += t before the final
    sync): the sequence is then undefined, and every call but reset / restore is refused until one runs."""

    broken = False
    fail_decode = False

    def openjet_engine_decode(self, h, ids, t, logits, hidden):
        if self.broken:
            return self._fail("decode: the sequence is undefined after a failed call: reset or restore first")
        rc = super().openjet_engine_decode(h, ids, t, logits, hidden)
        if rc == 0 and self.fail_decode:
            self.fail_decode, self.broken = False, True
            return self._fail("decode: cudaErrorIllegalAddress")
        return rc

    def openjet_engine_prefill(self, h, ids, n, chunk, logits, hidden):
        if self.broken:
            self.calls.append(("prefill refused", n))
            return self._fail("prefill: the sequence is undefined after a failed call: reset or restore first")
        return super().openjet_engine_prefill(h, ids, n, chunk, logits, hidden)

    def openjet_engine_reset(self, h):
        self.broken = False
        return super().openjet_engine_reset(h)

    def openjet_engine_restore(self, h, slot):
        self.broken = False
        return super().openjet_engine_restore(h, slot)


def _broken_by_a_decode(engine) -> tuple[BrokenAfterFailure, object]:
    """[1, 2] decoded, then a decode of [3, 4] that failed after the library counted its rows."""
    engine._lib = lib = BrokenAfterFailure()
    state = engine.new_state()
    engine.decode(state, [1, 2])
    lib.fail_decode = True
    with pytest.raises(OpenJetError, match="cudaErrorIllegalAddress"):
        engine.decode(state, [3, 4])
    return lib, state


def test_a_refused_prefill_after_a_failure_records_no_tokens(engine):
    """A decode that failed after the library counted its rows leaves the device ahead of the record; a prefill then is
    refused before anything runs, and records nothing (it took the device's position for its own progress and recorded
    ids the engine never processed, which a later truncate would have replayed)."""
    lib, state = _broken_by_a_decode(engine)
    assert lib.n_past == 4 and state.tokens == (1, 2)
    with pytest.raises(OpenJetError, match="undefined"):
        engine.prefill(state, [7, 8, 9])
    assert state.tokens == (1, 2)


def test_truncate_to_the_current_length_recovers_after_a_failure(engine):
    """ENGINE.md: after a failure, truncate (restore or reset, then replay) recovers the sequence, also to its own
    length (it returned at once, so every later call stayed refused)."""
    lib, state = _broken_by_a_decode(engine)
    engine.truncate(state, state.n_tokens)
    assert not lib.broken and lib.n_past == 2 and state.tokens == (1, 2)
    engine.decode(state, [5])
    assert state.tokens == (1, 2, 5) and lib.n_past == 3
    calls = len(lib.calls)
    engine.truncate(state, state.n_tokens)  # nothing failed since: nothing to do
    assert len(lib.calls) == calls
