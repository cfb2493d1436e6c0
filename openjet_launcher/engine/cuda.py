"""The CUDA engine v1: the Engine interface over the native decode engine (native/include/openjet_engine.h).

What v1 is (and is not):

* ``decode`` runs the trunk on the GPU for T <= 8 tokens per step (tensor-core GEMVs on the GGUF blocks with
  fp16 activations, the recurrent Gated DeltaNet step, split-K attention over an F16 or Q8_0 KV cache), one
  kernel launch per op. ``load`` refuses a GPU the library has no code for (device_probe).
* ``prefill`` runs chunks of up to ``prefill_rows`` tokens (``load``'s argument: 512 by default, at most 8192,
  ~260 KB of device scratch per row at 27B): every projection reads its weights once per
  chunk (the GEMV in groups of 8 token rows, the groups of a weight tile side by side so they share it through
  L2); the GDN step takes the chunk in one launch per layer and attention in launches of up to 64 rows (both
  in sub-steps of 8 rows inside), the MTP head's cache fill too. By default the Q4_K/Q5_K/Q6_K/Q8_0 projections
  of a prefill take a tensor-core GEMM over fp16-dequantised weights (numerics of its own, KL ~1e-6 nats from
  decode's; the same bits whatever the chunk size or turn boundaries); OPENJET_PREFILL_GEMM=exact gives each
  row the bits a decode step gives it instead (~20% slower). ``prefill_matches_decode`` says which holds;
  ``truncate`` replays each run of tokens the way it was first run. A prefill's attention is a flash kernel over
  the whole chunk and its Gated DeltaNet the chunked WY form (qwen38.md §3.4) in chunks of 32 that start at each
  call's first row: ``prefill`` keeps its calls on those boundaries (gdn_chunk_rows), so a conversation resumed
  from the cache gets the bits of a fresh prefill.
* One sequence per engine: the device holds one set of KV caches and recurrent states. ``new_state()`` resets
  it and retires every state made before; using a retired state raises. ``SequenceState.copy`` raises.
* ``checkpoint`` snapshots the recurrent + conv state on the device (``n_checkpoints`` slots, the oldest
  position evicted first); ``truncate`` restores the latest checkpoint at or before the target and replays
  the tokens after it (rollback by replay, interface.py; prefilled tokens by prefill, decoded ones by decode
  steps), without computing logits.
* ``mtp_draft`` runs the MTP head on the device one draft step per call of the C API (its cache is filled by
  every decode and prefill step); the host picks each drafted token. tests/test_gpu_engine.py checks it
  against the reference (passed on the H200, 2026-12-01).
* ``verify`` / ``accept`` (speculative.py's cycle): the device keeps the committed GDN state through a verify
  step and ``accept(n)`` replays only the GDN recurrence over the kept rows (``native_verify``; without the
  MTP head, or with it False, the interface's checkpoint + decode + truncate). ``decode_top`` (what the
  sampler uses for greedy and top_k <= 32 requests) ranks on the device (``native_top``; False: on the host).
  Both device paths passed their GPU tests on the H200 on 2026-12-01 (bits equal to decode, ids equal to
  the host ranking) and are on by default since.
* Files: the unsloth Q4_K_M recipe (the synthetic models use it) and plain llama-quantize Q4_K_M files, whose
  four differing tensor roles are re-encoded at load (model/reencode.py).
"""

from __future__ import annotations

import bisect
import ctypes
import functools
import itertools
import json
import operator
import os
import time
import warnings
import weakref

import numpy as np

from ..errors import ModelFileError, OpenJetError
from ..model.config import ModelConfig, read_config
from ..model.draft_vocab import SEQUENCE_ROWS
from ..model.gguf_file import GGUFFile
from ..model.recipe import PLAIN_Q4_K_M, UNSLOTH_Q4_K_M, classify
from ..sampling import GPU_MAX_TOP_K
from .interface import (MAX_GPU_DECODE_TOKENS, Choose, ChooseTop, DraftOutput, DraftTopOutput, Engine, EngineStats,
                        SampledDrafts, SequenceState, StepOutput, TokenIds, TopOutput, argmax, check_chunk_size,
                        check_draft_request, check_token_ids, first_id, rank_row, rank_subset)
from .device_probe import probe_in_child, require_runnable_device
from .native import load_library

KV_TYPES = {"f16": 1, "q8_0": 8}
DEFAULT_N_CTX = 32768
DEFAULT_CHECKPOINTS = 4
PREFILL_ROWS = 512        # OPENJET_ENGINE_PREFILL_ROWS (openjet_engine.h): default token rows of a prefill chunk
PREFILL_ROWS_MAX = 8192   # OPENJET_ENGINE_PREFILL_ROWS_MAX
# OPENJET_PREFILL_GEMM's values (native/src/gemv_mma.cuh, prefill_gemm_choice): "fast" (the default) gives a
# prefill numerics of its own, "exact" decode's bits ("shared" / "grouped": "exact" with one kernel forced), "dense"
# numerics of its own again through CUTLASS's Hopper GEMM (a 90a build with CUTLASS on sm_90: dense_gemm.cuh).
PREFILL_GEMMS = ("fast", "exact", "shared", "grouped", "dense")
PREFILL_OWN_NUMERICS = ("fast", "dense")  # the values under which a prefill does not leave decode's bits


def prefill_gemm() -> str:
    """The prefill numerics OPENJET_PREFILL_GEMM asks for; an OpenJetError naming the valid values for others."""
    value = os.environ.get("OPENJET_PREFILL_GEMM") or "fast"
    if value not in PREFILL_GEMMS:
        raise OpenJetError(f"OPENJET_PREFILL_GEMM={value!r} is not one of {', '.join(PREFILL_GEMMS)} (fast: the "
                           f"default; exact: prefill leaves decode's bits, ~20% slower)")
    return value


GDN_CHUNK = 32  # gdn_chunk.cuh kGdnChunk: tokens per chunk of the chunked Gated DeltaNet


def gdn_chunk_rows() -> int:
    """GDN_CHUNK where a prefill call takes the two-phase chunked GDN (gdn_chunk.cuh: the default, OPENJET_GDN_CHUNKED
    unset or 2, with prefill numerics of its own), else 0. Its chunks start at the call's first row, so a row's bits
    depend on where its call began modulo GDN_CHUNK: CudaEngine.prefill keeps calls on chunk boundaries."""
    form = os.environ.get("OPENJET_GDN_CHUNKED") or "2"
    return GDN_CHUNK if form == "2" and prefill_gemm() in PREFILL_OWN_NUMERICS else 0


# The library's other switches of the prefill and decode kernels (docs/ENGINE.md, Switches): a value outside these
# is refused at load instead of silently taking the default.
KERNEL_SWITCHES = {
    "OPENJET_GEMV_HALF": ("0", "1", "auto"),                # gemv.cu, gemv_half_tiles (decode; read once)
    "OPENJET_PREFILL_ATTN": ("flash", "chunks", "pairs"),   # engine.cu, prefill_attn
    "OPENJET_ATTN_PREFILL_ROWS": ("64", "128"),             # engine.cu, attn_mixer (the flash kernel's block rows)
    "OPENJET_ATTN_PREFILL_KEYS": ("32", "64"),              # attn_prefill.cu, the flash kernel's keys per tile
    "OPENJET_ATTN_PREFILL_F16": ("0", "1"),                 # engine.cu, attn_mixer (Q8_0 rows as fp16; 1: default)
    "OPENJET_ATTN_PREFILL_WGMMA": ("0", "1", "2"),          # attn_prefill.cu, flash on wgmma (2, FA3-style: default)
    "OPENJET_GDN_CHUNKED": ("0", "1", "2"),                 # gdn_chunk.cu, gdn_chunked_form
    "OPENJET_GDN_STATE_TC": ("0", "1", "tf32", "tf32-cvt", "3xtf32"),  # gdn_chunk.cu, gdn_state_form (1 = tf32: default)
    "OPENJET_GDN_LOCAL_TC": ("0", "1"),                     # gdn_chunk.cu, gdn_local_tc (1: default)
    "OPENJET_ROW_PACK_THREADS": ("auto", "256", "512", "1024"),  # act_pack.cu, row_pack_threads (prefill rows)
    "OPENJET_PREFILL_FFN_FUSED": ("0", "1"),                # prefill_gemm.cu, gate_up_in_one_gemm (1: default)
    "OPENJET_PREFILL_SWIGLU": ("epilogue", "epilogue-f32", "split", "rows"),  # elementwise.cu, prefill_swiglu
    "OPENJET_PREFILL_F16_WEIGHTS": ("0", "1", "auto"),      # engine.cu, keep_prefill_f16_weights (read at load)
    "OPENJET_GDN_NORM_PACK": ("0", "1"),                    # gdn_decode.cu, gdn_norm_pack (an experiment: 1)
    "OPENJET_GDN_STEP_PACK": ("0", "1"),                    # engine.cu, gdn_step_pack (1: default; at load)
    "OPENJET_GDN_STAGED": ("0", "1"),                       # engine.cu, gdn_staged (1: default; at load)
    "OPENJET_GDN_LATE": ("0", "1"),                         # engine.cu, gdn_late (1: default; at load)
    "OPENJET_GEMV_GROUP": ("0", "1"),                       # engine.cu, gemv_group (1: default; at load)
    "OPENJET_ATTN_OWN_PACK": ("0", "1"),                    # engine.cu, attn_own_pack (1: default; at load)
    "OPENJET_ADD_NORM_MAX_EST": ("0", "1"),                 # elementwise.cu, launch_add_norm_pack (1: default)
    "OPENJET_SWIGLU_SELF": ("0", "1"),                      # engine.cu, ffn (1, at t = 1: default; at load)
    "OPENJET_FOLD": ("0", "1"),                             # engine.cu, fold_fits (on by default; "0" off; at load)
    "OPENJET_FOLD_ROWS": ("0", "1"),                        # engine.cu, fold_rows (an experiment: 1; at load)
    "OPENJET_SWIGLU_ROWS": ("0", "1"),                      # engine.cu, swiglu_rows (an experiment: 1; at load)
    "OPENJET_GDN_PACK_BOUND": ("0", "1"),                   # row_bound.cu, gdn_pack_bound (1: default)
    "OPENJET_PREFILL_F32": ("rows", "tf32x3", "tf32x3-rna"),  # gemv.cu / prefill_f32.cu (tf32x3: default)
    "OPENJET_PREFILL_RESIDUAL": ("0", "1"),                 # engine.cu project_out (1: default)
    "OPENJET_ATTN_PREP_ROWS": ("0", "1"),                   # attn_decode.cu, attn_prep_rows (1: default)
    "OPENJET_FFN_PERSISTENT": ("0", "1", "2", "3", "4"),    # engine.cu, ffn_persistent (decode; read at load)
    "OPENJET_FFN_TMA": ("0", "1", "2", "3", "4"),           # engine.cu, ffn_tma (an experiment; read at load)
    "OPENJET_WEIGHT_LAYOUT": ("tiles", "rows"),             # engine.cu, weight_layout_tiles (read at load)
    "OPENJET_PACK_CLUSTER": ("0", "1", "2"),                # elementwise.cu, pack_cluster_takes (2: default; read once)
    "OPENJET_GEMV_INT": ("0", "1", "2", "3"),               # engine.cu, gemv_int (an experiment; read at load)
    "OPENJET_GEMV_TMA": ("auto", "0", "1", "2", "3", "4"),  # engine.cu, gemv_tma_switch (read at load)
    "OPENJET_GEMV_CARVEOUT": ("default", "max"),            # gemv_tma.cu, carveout_max (an experiment; read once)
    "OPENJET_GDN_REPLAY": ("accept", "fused"),              # engine.cu, gdn_replay_switch (fused: default; at load)
    "OPENJET_ATTN_PIPE": ("0", "1"),                        # engine.cu, attn_pipe_switch (1: default; at load)
    "OPENJET_ATTN_STAGES": ("auto", "2", "3", "4"),         # engine.cu, attn_pipe_switch (not with OPENJET_ATTN_PIPE=0)
    "OPENJET_TOPK": ("sort", "least", "warp"),              # topk.cu, topk_form (k > 1, warp: default; each call)
    "OPENJET_BENCH_SKIP_NORM_PACKS": ("0", "1", "2", "3", "4"),  # engine.cu (a measurement: WRONG outputs; at load)
    "OPENJET_BENCH_SKIP_SWIGLU_PACK": ("0", "1"),           # engine.cu, ffn (a measurement: WRONG outputs; at load)
    "OPENJET_BENCH_GEMV_NO_MATH": ("0", "1"),               # gemv_tma.cu (a measurement: WRONG outputs; read once)
    "OPENJET_BENCH_GRAPH": ("0", "1"),                      # engine.cu, trunk_graph (a measurement; read at load)
    "OPENJET_BENCH_GDN_PROBE": ("0", "1"),                  # engine.cu, gdn_probe (a measurement; read at load)
    "OPENJET_MTP_INPUT_PACK": ("0", "1"),                   # engine.cu, mtp_rows (1: default; read at load)
}

# The measurements among them whose decode steps compute wrong outputs: what each leaves out.
WRONG_OUTPUT_SWITCHES = {
    "OPENJET_BENCH_SKIP_NORM_PACKS": "decode steps skip some of their packs",
    "OPENJET_BENCH_SKIP_SWIGLU_PACK": "decode steps make no swiglu pack for their down projections",
    "OPENJET_BENCH_GEMV_NO_MATH": "decode GEMVs stream their weights without computing",
}


def check_kernel_switches() -> None:
    """An OpenJetError naming the variable and its valid values for such a switch set to anything else."""
    for name, values in KERNEL_SWITCHES.items():
        value = os.environ.get(name)
        if value and value not in values:
            raise OpenJetError(f"{name}={value!r} is not one of {', '.join(values)} (docs/ENGINE.md, Switches)")
    # engine.cu, persistent_sms (read at load): the persistent kernels' grid sized for this many SMs, emulating a
    # smaller GPU (issue 7 asks for 46 and 82); more than the GPU has means all of them.
    sms = os.environ.get("OPENJET_PERSISTENT_SMS")
    if sms and not (sms.isdigit() and int(sms) >= 1):
        raise OpenJetError(f"OPENJET_PERSISTENT_SMS={sms!r} is not a positive number of SMs (docs/ENGINE.md, Switches)")
    for name, what in WRONG_OUTPUT_SWITCHES.items():
        if os.environ.get(name, "0") != "0":
            warnings.warn(f"{name} is set: {what} and give WRONG outputs (a benchmark's measurement; unset it to use "
                          "the engine)", RuntimeWarning, stacklevel=2)


def _pad(dst: np.ndarray, subset: np.ndarray, row: np.ndarray) -> None:
    """A whole-vocabulary row from the draft vocabulary's logits: -inf outside the subset."""
    dst[:] = -np.inf
    dst[subset] = row


class EngineConfig(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int) for n in (
        "n_embd", "n_ff", "n_layer", "n_head", "n_head_kv", "head_dim", "n_rot", "ssm_n_k_heads",
        "ssm_n_v_heads", "ssm_head_dim", "ssm_conv_kernel", "full_attn_interval", "n_vocab")] + [
        ("rms_eps", ctypes.c_float), ("rope_base", ctypes.c_float),
        ("n_ctx", ctypes.c_int), ("kv_type", ctypes.c_int), ("n_checkpoints", ctypes.c_int),
        ("device", ctypes.c_int), ("prefill_rows", ctypes.c_int)]


class TensorDesc(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("ggml_type", ctypes.c_int), ("n_dims", ctypes.c_int),
                ("ne", ctypes.c_int64 * 4), ("data", ctypes.c_void_p), ("n_bytes", ctypes.c_size_t)]


class MemoryReport(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "weights_bytes", "kv_bytes", "state_bytes", "checkpoint_bytes", "scratch_bytes", "prefill_f16_bytes",
        "total_bytes")]


_P = ctypes.c_void_p


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """argtypes/restype of the openjet_engine_* functions (once per library)."""
    if getattr(lib, "_openjet_engine_declared", False):
        return lib
    f32p, i32p, f64p = ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_double)
    sig = {
        "openjet_engine_last_error": ([], ctypes.c_char_p),
        "openjet_engine_create": ([ctypes.POINTER(EngineConfig), ctypes.POINTER(TensorDesc), ctypes.c_int,
                                   ctypes.POINTER(_P)], ctypes.c_int),
        "openjet_engine_destroy": ([_P], None),
        "openjet_engine_reset": ([_P], ctypes.c_int),
        "openjet_engine_n_past": ([_P, ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
        "openjet_engine_decode": ([_P, i32p, ctypes.c_int, f32p, f32p], ctypes.c_int),
        "openjet_engine_checkpoint": ([_P, ctypes.c_int], ctypes.c_int),
        "openjet_engine_restore": ([_P, ctypes.c_int], ctypes.c_int),
        "openjet_engine_memory": ([_P, ctypes.POINTER(MemoryReport)], ctypes.c_int),
        "openjet_engine_has_mtp": ([_P, ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
        "openjet_engine_mtp_step": ([_P, ctypes.c_int32, ctypes.c_int, f32p, f32p], ctypes.c_int),
        "openjet_engine_mtp_draft_greedy": ([_P, ctypes.c_int32, ctypes.c_int, ctypes.c_int, i32p, f32p, f32p],
                                            ctypes.c_int),
        "openjet_engine_cycle_greedy": ([_P, ctypes.c_int32, ctypes.c_int, ctypes.c_int, i32p,
                                         ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
        "openjet_engine_mtp_draft_sampled": ([_P, ctypes.c_int32, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                              ctypes.c_double, ctypes.c_double, ctypes.c_double, f64p, i32p, i32p,
                                              f64p, ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
        "openjet_engine_cycle_sampled": ([_P, ctypes.c_int32, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                          ctypes.c_double, ctypes.c_double, ctypes.c_double, f64p, i32p,
                                          ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
        "openjet_engine_profile": ([_P, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int),
        "openjet_engine_set_profile": ([_P, ctypes.c_int], ctypes.c_int),
        "openjet_engine_set_attn_spread": ([_P, ctypes.c_int], ctypes.c_int),
        "openjet_engine_attn_spread": ([_P, ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
        "openjet_engine_set_draft_rows": ([_P, i32p, ctypes.c_int, ctypes.c_int], ctypes.c_int),
        "openjet_engine_prefill": ([_P, i32p, ctypes.c_int, ctypes.c_int, f32p, f32p], ctypes.c_int),
        "openjet_engine_prefill_checkpoint": ([_P, i32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, f32p,
                                               f32p], ctypes.c_int),
        "openjet_engine_verify": ([_P, i32p, ctypes.c_int, f32p, f32p], ctypes.c_int),
        "openjet_engine_accept": ([_P, ctypes.c_int], ctypes.c_int),
        "openjet_engine_verify_top": ([_P, i32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, f32p, i32p, f32p],
                                      ctypes.c_int),
        "openjet_engine_decode_top": ([_P, i32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, i32p, f32p, ctypes.c_int,
                                       f32p, i32p, f32p], ctypes.c_int),
    }
    try:
        for name, (args, res) in sig.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
    except AttributeError as e:
        raise OpenJetError(f"the OpenJet engine library predates the decode engine (missing {e}): rebuild it "
                           "(`pip install --force-reinstall --no-deps .`)") from e
    lib._openjet_engine_declared = True
    return lib


def _f32p(a: np.ndarray | None):
    return None if a is None else a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


class CudaState(SequenceState):
    """The host-side record of the engine's one device sequence: token ids and checkpoint slots."""

    def __init__(self, engine: "CudaEngine", generation: int):
        self._engine = weakref.ref(engine)
        self.generation = generation
        self.token_ids: list[int] = []
        # Per token, 1 where a prefill processed it, 0 where a decode step did: truncate replays each run the
        # way it was first run, since prefill's numerics (by default) are not decode's (prefill_matches_decode).
        self.prefilled = bytearray()
        self.slots: dict[int, int] = {}          # checkpoint position -> device slot

    def add(self, ids, *, prefilled: bool) -> None:
        """Record ids the device has just processed (by a prefill or by a decode step)."""
        n = len(self.token_ids)
        self.token_ids.extend(int(x) for x in ids)
        self.prefilled += (b"\x01" if prefilled else b"\x00") * (len(self.token_ids) - n)

    def cut(self, n: int) -> None:
        del self.token_ids[n:], self.prefilled[n:]

    @property
    def checkpoint_positions(self) -> tuple[int, ...]:
        return tuple(sorted(self.slots))

    @property
    def nbytes(self) -> int:
        engine = self._engine()
        if engine is None:
            return 0
        m = engine.memory_report()
        return m["kv_bytes"] + m["state_bytes"] + m["checkpoint_bytes"]

    def copy(self) -> "CudaState":
        raise NotImplementedError("the CUDA engine v1 holds one sequence per engine on the device: states "
                                  "cannot be copied yet")


@functools.lru_cache(maxsize=1)
def _device_report() -> dict:
    """The device probe's report, from a child process and once per process: probed here, CUDA would keep a context
    (hundreds of MiB) on every visible GPU for this process's life, not only on the engine's."""
    return probe_in_child()


class CudaEngine(Engine):
    def __init__(self, config: ModelConfig, lib: ctypes.CDLL, handle: int, n_ctx: int, kv_type: str,
                 n_checkpoints: int, prefill_rows: int = PREFILL_ROWS):
        self.config = config
        self.prefill_rows = prefill_rows
        self._lib = lib
        self._handle = ctypes.c_void_p(handle)
        self.n_ctx, self.kv_type, self.n_checkpoints = n_ctx, kv_type, n_checkpoints
        self._stats = EngineStats()
        self._generation = 0
        self._pending: list[int] = []            # ids of a verify step awaiting accept
        # A call failed since the last reset or restore: the device's sequence may be undefined (a GPU failure part
        # way), so truncate restores even to the current length (it returned at once, leaving the engine refusing).
        self._suspect = False
        # The MTP head's draft vocabulary (set_draft_vocabulary): the device's rows in order, and which
        # state's tokens they already cover (generation, count).
        self._draft_base: np.ndarray | None = None
        self._draft_rows: list[int] = []
        self._draft_row_ids = np.empty(0, np.int64)     # the same, as the array each draft step's ranking takes
        self._draft_index: dict[int, int] = {}
        self._draft_cap = 0                              # rows reserved on the device (list + SEQUENCE_ROWS)
        self._draft_row_pos: list[int] = []              # the sequence position of each row after the list's
        self._draft_synced = (0, 0)
        self._state: CudaState | None = None
        self._slot_clock: list[int] = [0] * n_checkpoints     # last use, for eviction
        self._clock = 0
        s = config.shape
        self._logits = np.empty((MAX_GPU_DECODE_TOKENS, s.n_vocab), np.float32)
        self._hidden = np.empty((MAX_GPU_DECODE_TOKENS, s.n_embd), np.float32)

    @property
    def prefill_matches_decode(self) -> bool:
        # The library reads OPENJET_PREFILL_GEMM at each prefill call: so does this.
        return prefill_gemm() not in PREFILL_OWN_NUMERICS

    @property
    def prefill_checkpoint_stride(self) -> int:
        # _prefill's in-call checkpoint at a chunk start (it needs a checkpoint slot to keep it in)
        return gdn_chunk_rows() if self.n_checkpoints else 0

    # ------------------------------------------------------------------------------------------ loading

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, n_ctx: int | None = None, kv_type: str = "f16",
             n_checkpoints: int = DEFAULT_CHECKPOINTS, device: int = 0, mtp: bool = True,
             prefill_rows: int = PREFILL_ROWS) -> "CudaEngine":
        """Upload the trunk of an unsloth Q4_K_M file (a plain llama-quantize Q4_K_M file is re-encoded to the
        unsloth types at load: model/reencode.py). ``n_ctx``: KV cache capacity in tokens (default
        min(context_length, 32768)); ``kv_type``: "f16" or "q8_0"; ``mtp``: also upload the MTP head (when the
        file has one) and keep its cache filled, for mtp_draft; False leaves it out (less memory, no drafts);
        ``prefill_rows``: the longest prefill chunk (1..8192 tokens; each reads the weights once, and costs ~260
        KB of device scratch per row at 27B)."""
        prefill_gemm()  # a bad OPENJET_PREFILL_GEMM is refused before anything is read
        check_kernel_switches()
        gguf = GGUFFile(path)
        config = read_config(gguf)
        verdict = classify(gguf, config)
        if verdict.kind not in (UNSLOTH_Q4_K_M, PLAIN_Q4_K_M):
            why = verdict.problem or f"its recipe is {verdict.kind}"
            raise ModelFileError(f"{gguf.path.name}: the CUDA engine v1 runs Q4_K_M files (unsloth or plain llama-quantize) only ({why})")
        if kv_type not in KV_TYPES:
            raise OpenJetError(f"kv_type must be one of {', '.join(KV_TYPES)}, not {kv_type!r}")
        if isinstance(prefill_rows, bool) or not isinstance(prefill_rows, (int, np.integer)) \
                or not 1 <= prefill_rows <= PREFILL_ROWS_MAX:
            raise OpenJetError(f"prefill_rows must be 1..{PREFILL_ROWS_MAX} tokens, not {prefill_rows!r}")
        s = config.shape
        n_ctx = min(s.n_ctx_train, DEFAULT_N_CTX) if n_ctx is None else int(n_ctx)
        if not 1 <= n_ctx <= 262144:
            raise OpenJetError(f"n_ctx must be 1..262144 tokens, not {n_ctx}")
        replaced = {}
        if verdict.kind == PLAIN_Q4_K_M:       # re-encode its ssm_out/ssm_alpha/ssm_beta/eh_proj to unsloth's types
            from ..model.reencode import reencode
            replaced = reencode(gguf, verdict.conversions)

        lib = _declare(load_library())
        require_runnable_device(_device_report(), device)   # a clear message instead of a failed first kernel launch
        cfg = EngineConfig(
            n_embd=s.n_embd, n_ff=s.n_ff, n_layer=s.n_layer, n_head=s.n_head, n_head_kv=s.n_head_kv,
            head_dim=s.head_dim, n_rot=s.n_rot, ssm_n_k_heads=s.ssm_n_k_heads, ssm_n_v_heads=s.ssm_n_v_heads,
            ssm_head_dim=s.ssm_head_dim, ssm_conv_kernel=s.ssm_conv_kernel,
            full_attn_interval=s.full_attn_interval, n_vocab=s.n_vocab, rms_eps=s.rms_eps,
            rope_base=s.rope_base, n_ctx=n_ctx, kv_type=KV_TYPES[kv_type], n_checkpoints=n_checkpoints,
            device=device, prefill_rows=int(prefill_rows))
        mtp_prefix = f"blk.{s.n_layer}."
        names = [n for n in gguf.tensors if mtp or not n.startswith(mtp_prefix)]
        descs = (TensorDesc * len(names))()
        keep = []                                           # the memory-mapped arrays and names, alive
        for d, name in zip(descs, names):
            info = gguf.tensors[name]
            qtype, raw = replaced.get(name, (info.qtype, gguf.raw(name)))
            keep += [raw, name.encode()]
            d.name = keep[-1]
            d.ggml_type = int(qtype)
            d.n_dims = len(info.ne)
            d.ne[:] = list(info.ne) + [1] * (4 - len(info.ne))
            d.data = raw.ctypes.data
            d.n_bytes = raw.nbytes
        handle = ctypes.c_void_p()
        rc = lib.openjet_engine_create(ctypes.byref(cfg), descs, len(names), ctypes.byref(handle))
        if rc != 0:
            raise OpenJetError(f"{gguf.path.name}: the CUDA engine could not load it: "
                               f"{lib.openjet_engine_last_error().decode(errors='replace')}")
        del keep
        return cls(config, lib, handle.value, n_ctx, kv_type, n_checkpoints, int(prefill_rows))

    def close(self) -> None:
        """Free the device memory now (also done when the engine is garbage-collected)."""
        if self._handle:
            self._lib.openjet_engine_destroy(self._handle)
            self._handle = ctypes.c_void_p()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise self._error(what)

    def _error(self, what: str) -> OpenJetError:
        """The library's last error, as the failed call `what` reports it."""
        self._suspect = True
        return OpenJetError(f"{what}: {self._lib.openjet_engine_last_error().decode(errors='replace')}")

    # ---------------------------------------------------------------------------------------- interface

    def new_state(self) -> CudaState:
        self._check(self._lib.openjet_engine_reset(self._handle), "reset")
        self._suspect = False
        self._generation += 1
        self._pending = []
        if self._draft_base is not None and len(self._draft_rows) > len(self._draft_base):
            self._draft_rows_to_device(len(self._draft_base), [])  # the last sequence's tokens go
        self._draft_row_pos = []
        self._state = CudaState(self, self._generation)
        self._slot_clock = [0] * self.n_checkpoints
        return self._state

    def decode(self, state: CudaState, tokens: TokenIds) -> StepOutput:
        ids32 = self._step_ids(state, tokens, "decode")
        t0 = time.perf_counter()
        out = self._step(state, ids32, logits=True)
        self._count_step(len(ids32), t0)
        return out

    # The device's verify / accept (openjet_engine_verify): no checkpoint, no trunk replay. Its shadow state
    # and input ring exist only with the MTP head; False (or no head): the interface's checkpoint + decode +
    # truncate. tests/test_gpu_engine.py checks both give decode's bits.
    native_verify = True

    def verify(self, state: CudaState, tokens: TokenIds) -> StepOutput:
        """A speculative verify step over [token, drafts...]: decode's logits and hidden rows, but the sequence
        stays where it was until accept(state, n) commits the first n rows, replaying only the GDN recurrence
        from the inputs the step kept (no trunk replay). Needs the MTP head (load with mtp=True)."""
        if not (self.native_verify and self.has_mtp):
            return super().verify(state, tokens)
        ids32 = self._step_ids(state, tokens, "verify")
        t = len(ids32)
        lg, hd = self._logits[:t], self._hidden[:t]
        t0 = time.perf_counter()
        rc = self._lib.openjet_engine_verify(self._handle, ids32.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), t,
                                             _f32p(lg), _f32p(hd))
        self._check(rc, "verify")
        self._await_accept(state, ids32, t0)
        return StepOutput(logits=lg.copy(), hidden=hd.copy())

    def verify_top(self, state: CudaState, tokens: TokenIds, *, k: int, n_valid: int | None = None) -> TopOutput:
        """verify, with each row ranked on the device (openjet_engine_verify_top): k values per row come back
        instead of the vocabulary (with native_verify and native_top; else the interface's host ranking)."""
        if not (self.native_verify and self.native_top and self.has_mtp):
            return super().verify_top(state, tokens, k=k, n_valid=n_valid)
        ids32 = self._step_ids(state, tokens, "verify_top")
        t = len(ids32)
        n_valid = self.config.shape.n_vocab if n_valid is None else n_valid
        values, top_ids = np.empty((t, k), np.float32), np.empty((t, k), np.int32)
        i32 = ctypes.POINTER(ctypes.c_int32)
        t0 = time.perf_counter()
        rc = self._lib.openjet_engine_verify_top(self._handle, ids32.ctypes.data_as(i32), t, k, n_valid,
                                                 _f32p(values), top_ids.ctypes.data_as(i32), _f32p(self._hidden[:t]))
        self._check(rc, "verify_top")
        self._await_accept(state, ids32, t0)
        return TopOutput(values, top_ids, self._hidden[:t].copy())

    def _await_accept(self, state: CudaState, ids32: np.ndarray, t0: float) -> None:
        """After the device's verify step: the sequence waits for accept, which adds the kept ids."""
        self._pending = [int(x) for x in ids32]
        state.verify_rows = len(ids32)
        self._count_step(len(ids32), t0)

    def accept(self, state: CudaState, n: int) -> None:
        """Commit the first n rows of the pending verify step (1 <= n <= its rows)."""
        if not (self.native_verify and self.has_mtp):
            return super().accept(state, n)
        self._check_state(state)
        n = operator.index(n)
        if not self._pending:  # the interface's words (a second accept, or none verified)
            raise OpenJetError("accept: no verify step is pending")
        if not 1 <= n <= len(self._pending):  # refused before anything changes: the verify stays pending
            raise OpenJetError(f"accept: n = {n} is not 1..{len(self._pending)} (the pending verify step's rows)")
        try:
            self._check(self._lib.openjet_engine_accept(self._handle, n), "accept")
        finally:  # done, or failed part way on the GPU: either way the library holds no pending verify any more (a
            # failure leaves the sequence undefined: truncate or new_state, which restore or reset, recover it)
            pending, self._pending, state.verify_rows = self._pending, [], 0
        state.add(pending[:n], prefilled=False)

    # The device's top-k (openjet_engine_decode_top); False: the interface's decode + ranking on the host.
    native_top = True

    def decode_top(self, state: CudaState, tokens: TokenIds, *, k: int = GPU_MAX_TOP_K,
                   n_valid: int | None = None, penalties: dict[int, float] | None = None) -> TopOutput:
        """A decode step that brings back each row's top k logits (by value, ties to the lower id, ids below
        n_valid) after the penalties {id: delta} (logit -= delta, float32), instead of the whole vocabulary:
        what the sampler needs (sampling.py keeps at most the top 32 on the GPU)."""
        if not self.native_top:
            return super().decode_top(state, tokens, k=k, n_valid=n_valid, penalties=penalties)
        ids32 = self._step_ids(state, tokens, "decode_top")
        t = len(ids32)
        n_valid = self.config.shape.n_vocab if n_valid is None else n_valid
        pen_ids = np.fromiter((penalties or {}).keys(), np.int32, len(penalties or {}))
        pen_deltas = np.fromiter((penalties or {}).values(), np.float32, len(penalties or {}))
        values, top_ids = np.empty((t, k), np.float32), np.empty((t, k), np.int32)
        i32 = ctypes.POINTER(ctypes.c_int32)
        t0 = time.perf_counter()
        rc = self._lib.openjet_engine_decode_top(self._handle, ids32.ctypes.data_as(i32), t, k, n_valid,
                                                 pen_ids.ctypes.data_as(i32), _f32p(pen_deltas), len(pen_ids),
                                                 _f32p(values), top_ids.ctypes.data_as(i32), _f32p(self._hidden[:t]))
        self._check(rc, "decode_top")
        state.add(ids32, prefilled=False)
        self._count_step(t, t0)
        return TopOutput(values, top_ids, self._hidden[:t].copy())

    def prefill(self, state: CudaState, tokens: TokenIds, *, chunk_size: int | None = None,
                all_logits: bool = False) -> StepOutput:
        """Chunks of chunk_size tokens (default and most: the engine's prefill_rows), each reading the weights
        once (openjet_engine_prefill); a row's bits do not depend on chunk_size (nor, under
        OPENJET_PREFILL_GEMM=exact, differ from a decode step's: prefill_matches_decode). all_logits: decode steps
        of up to 8 tokens, for every row's logits (teacher forcing)."""
        chunk = self.prefill_rows if chunk_size is None else min(check_chunk_size(chunk_size), self.prefill_rows)
        ids = self._token_ids(state, tokens)
        self._check_idle(state, "prefill")
        t0 = time.perf_counter()
        if not all_logits and len(ids):
            self._check_room(state, len(ids))  # before a rewind or a first part: refused, the sequence is as it was
            chunk = self._call_rows(chunk)
            if gdn := gdn_chunk_rows():  # chunked GDN: calls start on its chunk boundaries (gdn_chunk_rows)
                ids = self._rewind_to_gdn_chunk(state, ids, gdn)
            out = self._prefill(state, ids, chunk)
            self._stats.prefill_tokens += len(ids)
            self._stats.prefill_seconds += time.perf_counter() - t0
            return out
        logits, hidden = [], []
        for i in range(0, len(ids), MAX_GPU_DECODE_TOKENS):
            part = ids[i:i + MAX_GPU_DECODE_TOKENS]
            last = i + MAX_GPU_DECODE_TOKENS >= len(ids)
            out = self._step(state, part, logits=all_logits or last)
            if all_logits or last:
                logits.append(out.logits)
                hidden.append(out.hidden)
        self._stats.prefill_tokens += len(ids)
        self._stats.prefill_seconds += time.perf_counter() - t0
        if all_logits:
            return StepOutput(np.concatenate(logits), np.concatenate(hidden))
        return StepOutput(logits[-1][-1:], hidden[-1][-1:])

    @property
    def has_mtp(self) -> bool:
        flag = ctypes.c_int(0)
        self._check(self._lib.openjet_engine_has_mtp(self._handle, ctypes.byref(flag)), "has_mtp")
        return bool(flag.value)

    def set_attn_spread(self, spread: int) -> None:
        """Attention chunk blocks per SM (2 at load; 1 up to OPENJET_ATTN_SPREAD at load time, at most 8): rows
        stay T-invariant, attention's rounding at long contexts changes with it."""
        self._check(self._lib.openjet_engine_set_attn_spread(self._handle, int(spread)), "set_attn_spread")

    def attn_spread(self) -> int:
        spread = ctypes.c_int(0)
        self._check(self._lib.openjet_engine_attn_spread(self._handle, ctypes.byref(spread)), "attn_spread")
        return spread.value

    def set_profile(self, on: bool) -> None:
        """Record per-phase device times from now on (an event between phases: a little slower) or stop."""
        self._check(self._lib.openjet_engine_set_profile(self._handle, int(on)), "set_profile")

    def profile(self, reset: bool = False) -> dict:
        """Device milliseconds per phase (embed, norm, gdn.step, attn.core, ffn, lm_head, ...) summed over the
        calls since the last reset, while profiling is on (set_profile, or OPENJET_PROFILE=1 at load)."""
        buf = ctypes.create_string_buffer(1 << 16)
        self._check(self._lib.openjet_engine_profile(self._handle, buf, len(buf), int(reset)), "profile")
        return json.loads(buf.value.decode())

    def set_draft_vocabulary(self, ids: np.ndarray | None) -> None:
        """Draft over these token ids only (model/draft_vocab.py's list mapped onto this model: sorted unique
        ids), plus every token of the current sequence, added as it appears; None: the full vocabulary.
        Drafted logits outside the rows are -inf. Verification always uses the full vocabulary, so this changes
        only how many drafts are accepted (and how fast the head drafts), never the output."""
        if ids is None:
            self._draft_base = None
            self._draft_rows_to_device(0, [])
            return
        base = np.unique(np.asarray(ids, dtype=np.int64))
        if base.size == 0 or base[0] < 0 or base[-1] >= self.config.shape.n_vocab:
            raise OpenJetError(f"draft vocabulary: ids must be a non-empty set inside [0, {self.config.shape.n_vocab})")
        self._draft_base = base.astype(np.int32)
        # The list's rows and room for the sequence's own tokens, reserved now: the library's buffer keeps the
        # capacity it once had (openjet_engine_set_draft_rows only grows it), so the rows a sequence adds never
        # reallocate (a second copy of ~150 MB while serving, which launcher/memory.py's plan does not hold).
        self._draft_cap = min(base.size + SEQUENCE_ROWS, self.config.shape.n_vocab)
        room = np.full(self._draft_cap, base[0], np.int32)
        self._check(self._lib.openjet_engine_set_draft_rows(self._handle, room.ctypes.data_as(
            ctypes.POINTER(ctypes.c_int32)), room.size, 0), "draft vocabulary")
        self._draft_rows = []
        self._draft_index = {}
        self._draft_row_ids = np.empty(0, np.int64)
        self._draft_row_pos = []
        self._draft_rows_to_device(0, self._draft_base.tolist())

    def _draft_rows_to_device(self, n_keep: int, new: list[int]) -> None:
        """The device's draft rows become the first n_keep of the current ones, then `new` (only those are
        sent and gathered: the C API does not read ids[0..keep))."""
        n = n_keep + len(new)
        arr = np.empty(n, np.int32)
        arr[n_keep:] = new
        self._check(self._lib.openjet_engine_set_draft_rows(self._handle, arr.ctypes.data_as(
            ctypes.POINTER(ctypes.c_int32)), n, n_keep), "draft vocabulary")
        for t in self._draft_rows[n_keep:]:
            del self._draft_index[t]
        del self._draft_rows[n_keep:]
        for t in new:
            self._draft_index[t] = len(self._draft_rows)
            self._draft_rows.append(t)
        # kept beside the list: a 32K-row list made into an array took ~0.5 ms of every cycle on the host
        self._draft_row_ids = np.concatenate([self._draft_row_ids[:n_keep], np.asarray(new, np.int64)])
        self._draft_synced = (0, 0)

    def _sync_draft_rows(self, state: CudaState, token: int) -> None:
        """The draft rows become the list's, then the sequence's other tokens and the token drafted after, each at
        its first appearance, the first SEQUENCE_ROWS of them: a function of the sequence alone. (Rows left by an
        earlier request on a rewound sequence changed the drafts' q, so a seeded sampled answer differed between
        two identical requests.) Positions below the last sync's are unchanged, so only later rows are redone."""
        gen, done = self._draft_synced
        if gen != state.generation or done > state.n_tokens:
            done = 0
        n_base = len(self._draft_base)
        keep = n_base + bisect.bisect_left(self._draft_row_pos, done)   # rows first seen before `done` stand
        new: list[int] = []
        pos: list[int] = []
        taken: set[int] = set()  # (new's members: a 100K-token prompt made a list search of it cost seconds)
        room = self._draft_cap - keep
        for p, t in enumerate(itertools.chain(state.token_ids[done:], [token]), start=done):
            if len(new) == room:
                break
            at = self._draft_index.get(t)
            if (at is None or at >= keep) and t not in taken:
                taken.add(t)
                new.append(t)
                pos.append(p)
        same = 0  # rows already there as wanted (the usual case: the sequence grew by what was drafted after)
        while keep + same < len(self._draft_rows) and same < len(new) and self._draft_rows[keep + same] == new[same]:
            same += 1
        if keep + same < len(self._draft_rows) or same < len(new):
            self._draft_rows_to_device(keep + same, new[same:])
        self._draft_row_pos[keep - n_base:] = pos
        self._draft_synced = (state.generation, state.n_tokens)

    def mtp_draft(self, state: CudaState, token: int, n_draft: int = 1, choose: Choose = argmax) -> DraftOutput:
        """The MTP head on the device, one launch sequence per draft step; ``choose`` runs here between steps
        (the engine's own on-device drafting loop is issue 7's cycle). With a draft vocabulary the head
        computes only its rows; the other logits come back as -inf."""
        logits = np.empty((n_draft, self.config.shape.n_vocab), np.float32)

        def on_row(j: int, row: np.ndarray, subset: np.ndarray | None) -> int:
            if subset is not None:
                _pad(logits[j], subset, row)
            return int(choose(logits[j]))

        drafted, hidden = self._draft_steps(state, token, n_draft, on_row, logits)
        return DraftOutput(drafted, logits, hidden)

    def mtp_draft_top(self, state: CudaState, token: int, n_draft: int, *, k: int, n_valid: int | None = None,
                      choose: ChooseTop | None = None) -> DraftTopOutput:
        """mtp_draft through each row's top k: with a draft vocabulary only its rows are ranked (a whole row,
        mostly -inf, takes numpy's partition ~5 ms at 248,320 entries; its 32,768 rows ~0.03 ms)."""
        n_valid = self.config.shape.n_vocab if n_valid is None else n_valid
        if choose is None and k == 1 and self.native_draft and 1 <= n_draft <= MAX_GPU_DECODE_TOKENS:
            return self._draft_greedy(state, token, n_draft, n_valid)
        pick = choose or first_id
        values, ids = np.empty((n_draft, k), np.float32), np.empty((n_draft, k), np.int32)
        full = np.empty((n_draft, self.config.shape.n_vocab), np.float32)

        def on_row(j: int, row: np.ndarray, subset: np.ndarray | None) -> int:
            top = rank_subset(row, subset, k, n_valid) if subset is not None else None
            if top is None:                              # the whole row (no draft vocabulary, or too few rows)
                if subset is not None:
                    _pad(full[j], subset, row)
                top = rank_row(full[j], k, n_valid)
            values[j], ids[j] = top
            return int(pick(values[j], ids[j]))

        drafted, hidden = self._draft_steps(state, token, n_draft, on_row, full)
        return DraftTopOutput(drafted, values, ids, hidden)

    # The speculative cycle's host round trips on the device: greedy drafts chained there (openjet_engine_mtp_draft_
    # greedy: each step's argmax feeds the next step), a whole greedy cycle in one call (openjet_engine_cycle_greedy)
    # and sampled drafts drawn there (openjet_engine_mtp_draft_sampled, its q handed back); False: a step and a host
    # ranking or draw at a time (_draft_steps), the same greedy drafts. On since 2026-12-05: their GPU tests passed on
    # the H200 (391385a: test_greedy_drafts_chained_on_the_device_are_the_host_rankings, the "+chain" cases of
    # test_greedy_ids_..., the native_draft case of the sampled chi-square test), and the 27B's modelled tok/s at
    # acceptance 0.7 with 4 drafts is 241 drafting on the host, 250 chained on the device, 253 in one call (499afb1).
    # Drafts change how many tokens a cycle keeps, never which.
    native_draft = True

    def _start_drafting(self, state: CudaState, token: int, n_draft: int) -> int:
        """Every drafting's start: the token's id, checked with the request (an MTP head, a processed token, n_draft >=
        1), and the draft rows holding the sequence's tokens and it."""
        tok = int(self._token_ids(state, [token])[0])
        check_draft_request(self.config.name, self.config.shape.n_layer, self.has_mtp, state.n_tokens, n_draft)
        if self._draft_base is not None:
            self._sync_draft_rows(state, tok)
        return tok

    def _draft_greedy(self, state: CudaState, token: int, n_draft: int, n_valid: int) -> DraftTopOutput:
        """mtp_draft_top with k = 1 and the argmax as the choice, the chain on the device."""
        s = self.config.shape
        t0 = time.perf_counter()
        tok = self._start_drafting(state, token, n_draft)
        drafts, values = np.empty(n_draft, np.int32), np.empty((n_draft, 1), np.float32)
        hidden = np.empty((n_draft, s.n_embd), np.float32)
        self._check(self._lib.openjet_engine_mtp_draft_greedy(
            self._handle, tok, n_draft, n_valid, drafts.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
            _f32p(values), _f32p(hidden)), "mtp_draft")
        self._stats.draft_tokens += n_draft
        self._stats.draft_seconds += time.perf_counter() - t0
        return DraftTopOutput([int(x) for x in drafts], values, drafts.reshape(n_draft, 1).copy(), hidden)

    def greedy_cycle(self, state: CudaState, token: int, n_draft: int, *, n_valid: int) -> tuple[list[int], int]:
        """The interface's greedy cycle in one call when native_draft is on (openjet_engine_cycle_greedy: the drafts,
        the verify step, its argmaxes, the verdict and the accept on the device, one wait; the ids the calls one at a
        time give)."""
        if not (self.native_draft and self.native_verify and self.native_top and self.has_mtp
                and 0 <= n_draft < MAX_GPU_DECODE_TOKENS):
            return super().greedy_cycle(state, token, n_draft, n_valid=n_valid)
        self._check_state(state)
        self._check_room(state, 1 + n_draft)
        t0 = time.perf_counter()
        tok = self._start_drafting(state, token, n_draft) if n_draft else int(self._token_ids(state, [token])[0])
        out, n_out = np.empty(1 + n_draft, np.int32), ctypes.c_int()
        self._check(self._lib.openjet_engine_cycle_greedy(self._handle, tok, n_draft, n_valid,
                                                          out.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                                                          ctypes.byref(n_out)), "cycle")
        return self._cycle_done(state, tok, out[:n_out.value], n_draft, t0)

    def _cycle_done(self, state: CudaState, tok: int, out: np.ndarray, n_draft: int,
                    t0: float) -> tuple[list[int], int]:
        """A one-call cycle's verdict (out: the kept drafts, then the next token) into the sequence and the counts."""
        kept = [int(x) for x in out[:-1]]
        state.add([tok, *kept], prefilled=False)
        self._stats.draft_tokens += n_draft  # their time is the step's (one call)
        self._count_step(1 + n_draft, t0)
        return kept, int(out[-1])

    def mtp_draft_sampled(self, state: CudaState, token: int, n_draft: int, sampler, *, k: int) -> SampledDrafts:
        """The interface's sampled drafts, chained on the device when native_draft is on
        (openjet_engine_mtp_draft_sampled: one uniform per draft from the sampler's generator, in order, as the
        host's draws take them; the q each draft came from comes back)."""
        if not (self.native_draft and 1 <= n_draft <= MAX_GPU_DECODE_TOKENS and 1 <= k <= GPU_MAX_TOP_K):
            return super().mtp_draft_sampled(state, token, n_draft, sampler, k=k)
        p = sampler.params
        t0 = time.perf_counter()
        tok = self._start_drafting(state, token, n_draft)
        u = sampler.rng.random(n_draft)
        drafts, q_len = np.empty(n_draft, np.int32), np.empty(n_draft, np.intc)
        q_ids, q_probs = np.empty((n_draft, k), np.int32), np.empty((n_draft, k), np.float64)
        i32, f64 = ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_double)
        self._check(self._lib.openjet_engine_mtp_draft_sampled(
            self._handle, tok, n_draft, sampler.n_valid, k, p.temperature, p.top_p, p.min_p,
            u.ctypes.data_as(f64), drafts.ctypes.data_as(i32), q_ids.ctypes.data_as(i32), q_probs.ctypes.data_as(f64),
            q_len.ctypes.data_as(ctypes.POINTER(ctypes.c_int))), "mtp_draft")
        self._stats.draft_tokens += n_draft
        self._stats.draft_seconds += time.perf_counter() - t0
        q = [(q_ids[j, :q_len[j]].astype(np.int64), q_probs[j, :q_len[j]].copy()) for j in range(n_draft)]
        return SampledDrafts([int(x) for x in drafts], q)

    # A sampled request's whole cycle in one call (openjet_engine_cycle_sampled: the drafts, the verify step, its rows'
    # top k, exact speculative sampling and the accept on the device, one wait instead of three calls and the host's
    # verdict); False: the pieces. On since 2026-12-07: its GPU tests passed on the H100 (d6801d2: the pieces' tokens
    # and generator state under three transforms, the chi-square test), and the host's share of a sampled cycle went
    # ~0.18-0.39 -> ~0.06 ms (bench/host_cycle.py, the 2-core CPU machine).
    native_sampled_cycle = True

    def sampled_cycle(self, state: CudaState, token: int, n_draft: int, sampler, *, k: int) -> tuple[list[int], int]:
        """The interface's sampled cycle in one call where native_sampled_cycle is on. The uniforms are the sampler's,
        in the order the pieces take them: the drafts' n_draft, then the acceptance stream, of which the device takes
        as many as the host's accept_sampled would (n_used); the generator ends where the pieces leave it. The
        target's distributions are the device's transform of the same top k (sample_top.cuh, double precision, not
        numpy's operations), so a seeded answer is the pieces' unless a test lands within rounding of its bound."""
        if not (self.native_sampled_cycle and self.native_draft and self.native_verify and self.native_top
                and self.has_mtp and 1 <= n_draft < MAX_GPU_DECODE_TOKENS and 1 <= k <= GPU_MAX_TOP_K):
            return super().sampled_cycle(state, token, n_draft, sampler, k=k)
        self._check_state(state)
        self._check_room(state, 1 + n_draft)
        p, rng = sampler.params, sampler.rng
        t0 = time.perf_counter()
        tok = self._start_drafting(state, token, n_draft)
        u = np.empty(2 * n_draft + 1, np.float64)
        u[:n_draft] = rng.random(n_draft)
        accept_from = rng.bit_generator.state  # the acceptance stream, drawn ahead; taken back to what was used
        u[n_draft:] = rng.random(n_draft + 1)
        out, n_out, n_used = np.empty(1 + n_draft, np.int32), ctypes.c_int(), ctypes.c_int()
        try:
            self._check(self._lib.openjet_engine_cycle_sampled(
                self._handle, tok, n_draft, sampler.n_valid, k, p.temperature, p.top_p, p.min_p,
                u.ctypes.data_as(ctypes.POINTER(ctypes.c_double)), out.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                ctypes.byref(n_out), ctypes.byref(n_used)), "cycle")
        finally:
            rng.bit_generator.state = accept_from
        rng.random(n_used.value)
        return self._cycle_done(state, tok, out[:n_out.value], n_draft, t0)

    def _draft_steps(self, state: CudaState, token: int, n_draft: int, on_row, full: np.ndarray):
        """The draft loop of mtp_draft and mtp_draft_top: per step the head's logits (the draft vocabulary's
        rows in their order, or the whole row written into full[j]), then on_row(j, logits, subset or None)
        picks the token the next step drafts after."""
        s = self.config.shape
        t0 = time.perf_counter()
        tok = self._start_drafting(state, token, n_draft)
        subset = None
        if self._draft_base is not None:
            subset = self._draft_row_ids
            compact = np.empty(len(subset), np.float32)
        drafted, hidden = [], np.empty((n_draft, s.n_embd), np.float32)
        for j in range(n_draft):
            out = compact if subset is not None else full[j]
            self._check(self._lib.openjet_engine_mtp_step(self._handle, tok, j, _f32p(out),
                                                          _f32p(hidden[j])), "mtp_draft")
            tok = on_row(j, out, subset)
            drafted.append(tok)
        self._stats.draft_tokens += n_draft
        self._stats.draft_seconds += time.perf_counter() - t0
        return drafted, hidden

    def checkpoint(self, state: CudaState) -> None:
        self._check_state(state)
        self._check_idle(state, "checkpoint")
        if self.n_checkpoints == 0:
            raise OpenJetError("this engine was loaded with n_checkpoints=0: checkpoints are disabled")
        n = state.n_tokens
        if n == 0:
            return
        slot = self._slot_for(state, n)
        self._check(self._lib.openjet_engine_checkpoint(self._handle, slot), "checkpoint")
        self._took_checkpoint(state, n, slot)

    def _took_checkpoint(self, state: CudaState, n: int, slot: int) -> None:
        """Device slot `slot` now holds the sequence's state at position n."""
        state.slots[n] = slot
        self._touch(slot)

    def _slot_for(self, state: CudaState, n: int) -> int:
        """The device slot a checkpoint at position n takes: its own, a free one, or the least recently used one.
        It leaves state.slots until _took_checkpoint: the library empties a slot before writing it, so after a failed
        write the record must not name it."""
        if n in state.slots:
            slot = state.slots[n]
        else:
            used = set(state.slots.values())
            free = [s for s in range(self.n_checkpoints) if s not in used]
            slot = free[0] if free else min(used, key=lambda s: self._slot_clock[s])
        state.slots = {p: s for p, s in state.slots.items() if s != slot}
        return slot

    def truncate(self, state: CudaState, n_tokens: int) -> None:
        self._check_state(state)
        self._check_idle(state, "truncate")
        try:  # an int, before anything changes (a float would fail half way, the device and the record apart)
            n_tokens = operator.index(n_tokens)
        except TypeError:
            raise OpenJetError(f"truncate: the token count must be an integer, not {n_tokens!r}") from None
        if not 0 <= n_tokens <= state.n_tokens:
            raise OpenJetError(f"cannot truncate a sequence of {state.n_tokens} tokens to {n_tokens}")
        if n_tokens == state.n_tokens and not self._suspect:
            return
        state.slots = {p: s for p, s in state.slots.items() if p <= n_tokens}
        gen, done = self._draft_synced
        self._draft_synced = (gen, min(done, n_tokens))          # tokens after n_tokens may come back changed
        base = max(state.slots, default=0)
        if base:
            self._check(self._lib.openjet_engine_restore(self._handle, state.slots[base]), "restore")
            self._touch(state.slots[base])
        else:
            self._check(self._lib.openjet_engine_reset(self._handle), "reset")
        self._suspect = False
        replay = np.array(state.token_ids[base:n_tokens], dtype=np.int64)
        how = bytes(state.prefilled[base:n_tokens])
        state.cut(base)
        t0 = time.perf_counter()
        i = 0
        for prefilled, run in itertools.groupby(how):  # each run as it was first run: the bits it left then
            part = replay[i:i + len(list(run))]
            i += len(part)
            if prefilled:  # in the calls prefill made (a row's bits depend on where its GDN chunk began)
                self._prefill(state, part, self._call_rows(self.prefill_rows))
            else:
                for k in range(0, len(part), MAX_GPU_DECODE_TOKENS):
                    self._step(state, part[k:k + MAX_GPU_DECODE_TOKENS], logits=False)
        self._stats.replay_tokens += len(replay)
        self._stats.replay_seconds += time.perf_counter() - t0

    def memory_report(self) -> dict[str, int]:
        r = MemoryReport()
        self._check(self._lib.openjet_engine_memory(self._handle, ctypes.byref(r)), "memory")
        return {name: int(getattr(r, name)) for name, _ in MemoryReport._fields_}

    def memory(self) -> dict[str, int]:
        m = self.memory_report()
        live = self._state is not None
        return {"weights_bytes": m["weights_bytes"],
                "states_bytes": m["kv_bytes"] + m["state_bytes"] + m["checkpoint_bytes"] if live else 0,
                "n_states": int(live), **m}

    def stats(self) -> EngineStats:
        return EngineStats(**vars(self._stats))

    def reset_stats(self) -> None:
        self._stats = EngineStats()

    # ------------------------------------------------------------------------------------------ helpers

    def _step(self, state: CudaState, ids: np.ndarray, *, logits: bool) -> StepOutput:
        t = len(ids)
        if state.n_tokens + t > self.n_ctx:
            raise OpenJetError(f"the sequence would reach {state.n_tokens + t} tokens, past this engine's "
                               f"context of {self.n_ctx} (load with a larger n_ctx)")
        ids32 = np.ascontiguousarray(ids, dtype=np.int32)
        lg = self._logits[:t] if logits else None
        rc = self._lib.openjet_engine_decode(self._handle, ids32.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                                             t, _f32p(lg), _f32p(self._hidden[:t]))
        self._check(rc, "decode")
        state.add(ids, prefilled=False)
        return StepOutput(logits=lg.copy() if logits else None, hidden=self._hidden[:t].copy())

    def _step_ids(self, state: CudaState, tokens: TokenIds, what: str) -> np.ndarray:
        """The ids of one step (decode, verify, decode_top) as int32, checked: vocabulary, rows, context."""
        ids = self._token_ids(state, tokens)
        self._check_idle(state, what)
        if len(ids) > MAX_GPU_DECODE_TOKENS:
            raise OpenJetError(f"{what} takes at most {MAX_GPU_DECODE_TOKENS} tokens per step on the GPU, "
                               f"got {len(ids)}: use prefill for longer runs")
        self._check_room(state, len(ids))
        return np.ascontiguousarray(ids, dtype=np.int32)

    def _check_room(self, state: CudaState, n: int) -> None:
        if state.n_tokens + n > self.n_ctx:
            raise OpenJetError(f"the sequence would reach {state.n_tokens + n} tokens, past this engine's "
                               f"context of {self.n_ctx} (load with a larger n_ctx)")

    def _count_step(self, t: int, t0: float) -> None:
        self._stats.decode_tokens += t
        self._stats.decode_steps += 1
        self._stats.decode_seconds += time.perf_counter() - t0

    def _call_rows(self, chunk: int) -> int:
        """The rows of a prefill's calls for a requested chunk (<= prefill_rows): with the chunked GDN a multiple of
        its chunk (the calls then start on chunk boundaries), as prefill and truncate's replay both need."""
        gdn = gdn_chunk_rows()
        return min(self.prefill_rows, max(gdn, chunk - chunk % gdn)) if gdn else chunk

    def _rewind_to_gdn_chunk(self, state: CudaState, ids: np.ndarray, gdn: int) -> np.ndarray:
        """A prefill that would start inside a chunk of the chunked GDN, after tokens a prefill read from its start f:
        back to f (the checkpoint _prefill left there), the tokens since f put in front of ids, so that the chunk is
        read in one call, as a prefill of the whole text reads it (the same bits: a resumed conversation)."""
        n = state.n_tokens
        f = n - n % gdn
        if f == n or (f and f not in state.slots) or not all(state.prefilled[f:n]):  # truncate(0) is a reset
            return ids
        head = np.asarray(state.token_ids[f:n], dtype=ids.dtype)
        self.truncate(state, f)
        return np.concatenate([head, ids])

    def _prefill(self, state: CudaState, ids: np.ndarray, chunk: int) -> StepOutput:
        """ids by openjet_engine_prefill in chunks of `chunk` rows. With the chunked GDN (gdn_chunk_rows) a run
        from a chunk boundary that ends inside a chunk leaves a checkpoint at that chunk's start f
        (openjet_engine_prefill_checkpoint: taken inside the call), to which the next prefill rewinds
        (_rewind_to_gdn_chunk)."""
        n = len(ids)
        self._check_room(state, n)
        gdn, n0 = gdn_chunk_rows(), state.n_tokens
        f = (n0 + n) // gdn * gdn if gdn else 0
        at = f - n0 if gdn and self.n_checkpoints and n0 % gdn == 0 and f < n0 + n else -1
        if at == 0 and n0 in state.slots:  # (a rewind just restored it: the slot holds this very state)
            self._touch(state.slots[n0])
        elif at == 0:
            self.checkpoint(state)
        ids32 = np.ascontiguousarray(ids, dtype=np.int32)
        lg, hd = self._logits[:1], self._hidden[:1]
        ptr = ids32.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        start = ctypes.c_int(-1)  # where the device is (a failure before may have left it past the record)
        self._lib.openjet_engine_n_past(self._handle, ctypes.byref(start))
        if at > 0:
            slot = self._slot_for(state, f)
            rc = self._lib.openjet_engine_prefill_checkpoint(self._handle, ptr, n, chunk, slot, at, _f32p(lg),
                                                             _f32p(hd))
        else:
            rc = self._lib.openjet_engine_prefill(self._handle, ptr, n, chunk, _f32p(lg), _f32p(hd))
        if rc != 0:  # the engine commits chunk by chunk: the record keeps the chunks it committed before failing
            error = self._error("prefill")  # (before the n_past query below)
            done = ctypes.c_int(-1)
            if (start.value == n0 and self._lib.openjet_engine_n_past(self._handle, ctypes.byref(done)) == 0
                    and n0 < done.value <= n0 + n):
                state.add(ids[:done.value - n0], prefilled=True)
            raise error
        if at > 0:
            self._took_checkpoint(state, f, slot)
        state.add(ids, prefilled=True)
        return StepOutput(logits=lg.copy(), hidden=hd.copy())

    def _touch(self, slot: int) -> None:
        self._clock += 1
        self._slot_clock[slot] = self._clock

    def _check_state(self, state: SequenceState) -> None:
        if not isinstance(state, CudaState) or state._engine() is not self:
            raise OpenJetError("this state was not made by this engine (use engine.new_state())")
        if state.generation != self._generation:
            raise OpenJetError("this state was retired: the CUDA engine v1 holds one sequence, and a later "
                               "new_state() reset it")

    def _check_idle(self, state: CudaState, what: str) -> None:
        """Refused, before anything changes, while a verify step awaits accept (the library refuses too, but a rewind
        or an eviction on the way there would already have happened, and its message names the library's calls)."""
        if state.verify_rows:
            raise OpenJetError(f"{what}: a verify step of {state.verify_rows} rows awaits accept(state, n), n = 1.."
                               f"{state.verify_rows}: accept it first")

    def _token_ids(self, state: CudaState, tokens: TokenIds) -> np.ndarray:
        self._check_state(state)
        return check_token_ids(tokens, self.config.shape.n_vocab)
