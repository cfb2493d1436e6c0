"""How much GPU memory serving a Qwen3.8 model takes, term by term, computed from its shape.

Every figure is derived from ``ModelShape`` and the unsloth Q4_K_M recipe (``model.synth.plan_tensors``),
never typed in, so a synthetic shape gets its own model. The terms (bytes):

* weights: every tensor of the recipe, MTP block included; ``token_embd`` (the embedding table) is
  only gathered one row per token, so it can stay in pinned host memory (``embd_on_host``);
* KV cache: K and V of every full-attention layer plus the MTP layer, n_head_kv x head_dim values each
  per token, in one of ``KV_FORMATS`` (fp16, q8_0 = 34 bytes per 32 values, q4_0 = 18 per 32);
* per agent: the Gated DeltaNet recurrent state (fp32, [v heads, 128, 128] per GDN layer) and conv
  state (fp32, the last kernel-1 inputs of every conv channel), times ``STATE_COPIES``;
* prefill scratch, linear in the prefill chunk (``prefill_scratch_bytes`` has the formula);
* decode workspace (logits and activations of the 1 + n_draft rows of every agent);
* the MTP head's draft rows (CUDA engine v1): the lm_head rows of the draft vocabulary's list and the room
  reserved for the sequence's own tokens (model/draft_vocab.py), gathered into a buffer of their own;
* the CUDA context and a safety margin, which are not ours to allocate but are not free either.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

from ..model.shape import QWEN38_27B, ModelShape

MiB = 1 << 20
GiB = 1 << 30

CUDA_CONTEXT_BYTES = 500 * MiB   # context + module images + driver heaps, measured 300-550 MiB on 8.6-12.0
MIN_MARGIN_BYTES = 512 * MiB     # fragmentation and the driver's own growth while serving
MARGIN_FRACTION = 0.02           # ... and 2% of the card, so large cards keep a proportionate reserve

# Recurrent + conv state copies per agent: the live state, the checkpoint taken before each speculative
# verification step (rollback by replay, engine/interface.py) and the one kept at the prompt's end for
# conversation reuse.
STATE_COPIES = 3

GDN_CHUNK = 64          # tokens per chunk of the chunked delta rule in prefill
DECODE_ROWS = 8         # 1 + n_draft rows per agent a decode step may verify (n_draft <= 7)

# The CUDA engine v1's own allocation (native/src/engine.cu, create_impl), mirrored part by part so that a plan
# for it is what the engine will ask for (tests/test_presets.py checks it against the engine's memory reports
# on the H200). Each arena part takes align_up(bytes + 16) of V1_ALIGN.
V1_ALIGN = 256
V1_MAX_T = 8              # OPENJET_ENGINE_MAX_T: rows of a decode or verify step
# Checkpoints `serve --engine cuda` loads the engine with when drafting (the launcher's default; server/cli.py):
# STATE_COPIES less the live state and one kept for the verify step (OPENJET_GDN_REPLAY=accept's shadow state in the
# scratch; the fused default holds the verify rows in rings instead, so this leaves a copy's room spare).
V1_CHECKPOINTS = STATE_COPIES - 2
V1_ATTN_SPREAD = 2        # attention chunk blocks per SM its workspace is sized for (kDefaultAttnSpread)
V1_ATTN_MIN_CHUNK = 64    # kAttnMinChunk (attn_decode.cuh)
V1_ATTN_HEAD_DIM = 256    # kAttnHeadDim
V1_TOPK_CHUNK = 4096      # topk.cu's logits per pass-1 block
V1_TOPK_MAX = 32          # kTopKMax
V1_FFN_SCRATCH_FIXED = 204  # ffn_persistent.cuh kFfnScratchFixedInts (then an int per 16 rows of n_ff)
V1_FFN_PROFILE_SLOTS = 14   # ffn_persistent.cuh kFfnProfileSlots (8-byte accumulators)
V1_GDN_CHUNK = 32        # gdn_chunk.cuh kGdnChunk: the CUDA engine's chunked GDN
V1_SM_COUNT = 170         # SMs assumed where the card's count is not known: the most of the cards we plan for


def v1_tiled(plan) -> bool:
    """Whether the CUDA engine stores the tensor in the tile layout, as it does every GEMV weight that has one by
    default (engine.cu, OPENJET_WEIGHT_LAYOUT; weight_layout.cuh tile_layout_fits: a k-quant type the decode GEMV
    reads, rows a multiple of 16; not the token embedding, read by row)."""
    return (plan.spec.role != "token_embd" and plan.qtype.name in ("Q4_K", "Q5_K", "Q6_K", "Q8_0")
            and plan.rows % 16 == 0)


def v1_weight_bytes(plan) -> int:
    """A tensor's bytes in the CUDA engine's weight arena: its GGUF bytes, or in the tile layout (v1_tiled) each
    256-weight unit padded to a multiple of 4 bytes: only Q6_K's 210 -> 212 changes."""
    return plan.n_bytes // 210 * 212 if v1_tiled(plan) and plan.qtype.name == "Q6_K" else plan.n_bytes


def v1_align(n: int, pad: int = 16) -> int:
    """The arena bytes of a part of n bytes (engine.cu: align_up(bytes + 16) for scratch parts, whose 16 spare
    bytes let a GEMV read past the end; align_up(bytes) for the state arenas, pad = 0)."""
    return (n + pad + V1_ALIGN - 1) // V1_ALIGN * V1_ALIGN


def v1_attn_chunks(n_ctx: int, n_kv: int, sm_count: int, spread: int = V1_ATTN_SPREAD) -> int:
    """The most chunks an attention step of V1_MAX_T rows splits the context into, over every position below
    n_ctx (engine.cu attn_work_floats_max with attn_decode.cuh's attn_chunk_keys): within a range of positions
    with one chunk size the count is largest at the range's end, so only those ends are looked at."""
    units = sm_count * spread
    target = (units + n_kv - 1) // n_kv if units > n_kv else 1
    most, chunk, start = 1, V1_ATTN_MIN_CHUNK, 0
    while start < n_ctx:
        # chunk_keys(n_past) = chunk while ceil((n_past + 1) / target) <= chunk, i.e. n_past < chunk * target
        end = min(n_ctx - 1, chunk * target - 1)
        if end >= start:
            most = max(most, (end + V1_MAX_T + chunk - 1) // chunk)
            start = end + 1
        chunk *= 2
    return most


@dataclass(frozen=True)
class EngineV1Arena:
    """What the CUDA engine v1 allocates besides its weights and KV cache (bytes; its memory report's names)."""
    state_bytes: int        # recurrent state and two conv state copies
    checkpoint_bytes: int   # n_checkpoints slots of state + conv (+ the MTP head's carried row)
    row_bytes: int          # the scratch that grows with prefill_rows
    fixed_bytes: int        # the rest of the scratch: step logits, attention workspace, top-k, verify's shadow

    @property
    def scratch_bytes(self) -> int:
        return self.row_bytes + self.fixed_bytes


@dataclass(frozen=True)
class KvFormat:
    name: str
    block_values: int   # values per quantisation block
    block_bytes: int    # bytes per block (scale included)
    about: str

    def bytes_for(self, n_values: int) -> int:
        if n_values % self.block_values:
            raise ValueError(f"{self.name}: {n_values} values are not whole blocks of {self.block_values}")
        return n_values // self.block_values * self.block_bytes


# Most precise first: the preset policy walks this order.
KV_FORMATS: dict[str, KvFormat] = {
    "fp16": KvFormat("fp16", 1, 2, "exact cache of the model's fp16 activations"),
    "q8_0": KvFormat("q8_0", 32, 34, "8-bit values + one fp16 scale per 32 (ggml q8_0); near lossless"),
    "q4_0": KvFormat("q4_0", 32, 18, "4-bit values + one fp16 scale per 32 (ggml q4_0); the low-bit fallback"),
}


def safety_margin_bytes(total_vram: int) -> int:
    return max(MIN_MARGIN_BYTES, int(total_vram * MARGIN_FRACTION))


@dataclass(frozen=True)
class MemoryPlan:
    """One configuration's GPU memory, term by term (bytes); ``total`` must fit in the free memory."""
    weights: int            # on the GPU (the embedding table excluded when it lives in host memory)
    token_embd_host: int    # pinned host memory taken by the embedding table (0 when on the GPU)
    kv_cache: int
    agent_state: int
    prefill_scratch: int
    decode_workspace: int
    draft_rows: int         # the MTP head's draft vocabulary rows (v1 plans of a model with the head; else 0)
    cuda_context: int
    safety_margin: int

    @property
    def total(self) -> int:
        return (self.weights + self.kv_cache + self.agent_state + self.prefill_scratch
                + self.decode_workspace + self.draft_rows + self.cuda_context + self.safety_margin)

    def to_dict(self) -> dict[str, int]:
        return {**asdict(self), "total": self.total}


@dataclass(frozen=True)
class MemoryModel:
    shape: ModelShape
    weights_bytes: int          # every tensor of the recipe, MTP block included
    token_embd_bytes: int       # the share of token_embd.weight
    weights_v1_bytes: int       # the same in the CUDA engine v1's weight arena (v1_weight_bytes, v1_align'ed)
    draft_row_bytes: int        # one row of output.weight (the lm_head) in the engine's layout (v1_weight_bytes)
    draft_row_group: int        # 16 where that layout is the tile layout (draft rows in whole groups), else 1

    # --- per token -----------------------------------------------------------------------------------
    @property
    def kv_layers(self) -> int:
        """Layers with a KV cache: the full-attention trunk layers and the MTP block (16 + 1 for 27B)."""
        return sum(self.shape.is_attention_layer(il) for il in range(self.shape.n_block))

    @property
    def kv_values_per_token(self) -> int:
        return self.kv_layers * 2 * self.shape.kv_dim           # K and V, n_head_kv x head_dim each

    def kv_bytes_per_token(self, kv_format: str) -> int:
        return KV_FORMATS[kv_format].bytes_for(self.kv_values_per_token)

    # --- per agent -----------------------------------------------------------------------------------
    @property
    def gdn_layers(self) -> int:
        return sum(not self.shape.is_attention_layer(il) for il in range(self.shape.n_layer))

    @property
    def gdn_state_bytes(self) -> int:
        """Recurrent state, fp32: layers x v heads x head_dim(k) x head_dim(v) (27B: 144 MiB)."""
        s = self.shape
        return self.gdn_layers * s.ssm_n_v_heads * s.ssm_head_dim * s.ssm_head_dim * 4

    @property
    def conv_state_bytes(self) -> int:
        """Conv state, fp32: the last kernel-1 inputs of every conv channel (27B: 5.625 MiB)."""
        s = self.shape
        return self.gdn_layers * s.ssm_conv_dim * (s.ssm_conv_kernel - 1) * 4

    @property
    def agent_state_bytes(self) -> int:
        return STATE_COPIES * (self.gdn_state_bytes + self.conv_state_bytes)

    # --- work buffers --------------------------------------------------------------------------------
    def prefill_scratch_bytes(self, chunk: int) -> int:
        """Activations of one prefill chunk of ``chunk`` tokens; buffers are reused layer to layer.

        per token = residual stream (fp32) + normed input (fp16) + sub-layer output (fp32)
                  + the largest sub-layer's own buffers, the max of
                    FFN:  gate and up (fp16) + silu(gate)*up (fp16)
                    GDN:  qkv before and after the conv (fp32) + z and the gated output (fp32) + a, b (fp32)
                          + chunked delta rule: per v head one row of the chunk's GDN_CHUNK^2 decay-masked
                            K K^T and of W and U (GDN_CHUNK x head_dim each), fp32
                    attention: query and gate (fp32) + K and V before the cache write (fp32) + output (fp32)
        plus the logits of the chunk's last token (fp32). Flash-attention tiles live in shared memory.
        27B: 244,096 bytes per token, i.e. 477 MiB for a 2048-token chunk (the design's engine; the CUDA engine
        v1's own arena: ``engine_v1_arena``).
        """
        s = self.shape
        trunk = s.n_embd * 4 + s.n_embd * 2 + s.n_embd * 4
        ffn = 2 * s.n_ff * 2 + s.n_ff * 2
        gdn = (2 * s.ssm_conv_dim * 4 + 2 * s.ssm_d_inner * 4 + 2 * s.ssm_n_v_heads * 4
               + s.ssm_n_v_heads * (GDN_CHUNK + 2 * s.ssm_head_dim) * 4)
        attn = 2 * s.q_dim * 4 + 2 * s.kv_dim * 4 + s.q_dim * 4
        return chunk * (trunk + max(ffn, gdn, attn)) + s.n_vocab * 4

    def engine_v1_row_parts(self) -> list[int]:
        """Bytes per prefill row of each row-sized part of the CUDA engine v1's scratch (native/src/engine.cu
        create_impl, in its order): token id, residual and normed rows (fp32), the activation pack (fp16 at the
        widest input, its 32-block sums as two fp16, the row scale), two wide buffers (fp32: the widest of conv
        channels, query and gate, FFN), K/V rows, beta and alpha, the mixer's output and the sub-layer output."""
        s = self.shape
        kmax = max(s.n_embd, s.n_ff, s.ssm_d_inner, s.q_dim, 2 * s.n_embd if s.n_nextn else s.n_embd)
        big1 = max(s.ssm_conv_dim, 2 * s.q_dim, s.n_ff, 2 * s.n_embd)  # 2 n_embd: the MTP head's [embedding | hidden]
        big2 = max(s.ssm_d_inner, s.kv_dim, s.n_ff)
        return [4, s.n_embd * 4, s.n_embd * 4, kmax * 2, kmax // 32 * 2 * 2, 4, big1 * 4, big2 * 4, s.kv_dim * 4,
                s.ssm_n_v_heads * 4, s.ssm_n_v_heads * 4, max(s.ssm_d_inner, s.q_dim) * 4, s.n_embd * 4]

    @property
    def engine_v1_row_bytes(self) -> int:
        """Scratch per prefill row of the CUDA engine v1 (before the arena's alignment)."""
        return sum(self.engine_v1_row_parts())

    def engine_v1_rows_bytes(self, chunk: int) -> int:
        """The CUDA engine v1's row-sized scratch for prefill_rows = chunk, aligned as its arena is."""
        return sum(v1_align(chunk * b) for b in self.engine_v1_row_parts())

    @property
    def dense_prefill_bytes(self) -> int:
        """The dense prefill GEMM's scratch (sm_90a builds on compute capability 9.0: native/src/dense_gemm.cuh):
        the largest matrix it dequantises as fp16, at 27B the FFN's gate and up together (one GEMM since 7cd6fd3:
        2 x 17,408 x 5,120 halves, 340 MiB)."""
        s = self.shape
        return 2 * max(2 * s.n_ff, s.ssm_conv_dim, 2 * s.q_dim) * s.n_embd

    @property
    def ffn_persistent_scratch_bytes(self) -> int:
        """The persistent FFN's counters, per-row values and a flag per 16-row (gate, up) tile pair
        (ffn_persistent.cuh ffn_persistent_scratch_ints; in the arena whether or not OPENJET_FFN_PERSISTENT is set)."""
        return 4 * (V1_FFN_SCRATCH_FIXED + -(-self.shape.n_ff // 16))

    def gdn_chunk_scratch_bytes(self, chunk: int) -> int:
        """The two-phase chunked GDN's scratch for prefill chunks of `chunk` rows (gdn_chunk.cu ChunkScratch: per
        row the q and k rows, and per value head two head-width rows and a chunk-width one plus 3 scalars; fp32;
        at 27B ~72 KB a row, 148 MB for 2,048 rows)."""
        s = self.shape
        rows = -(-chunk // V1_GDN_CHUNK) * V1_GDN_CHUNK
        per_row = 2 * s.ssm_n_k_heads * s.ssm_head_dim + s.ssm_n_v_heads * (2 * s.ssm_head_dim + V1_GDN_CHUNK + 3)
        return 4 * rows * per_row if self.gdn_layers else 0

    def engine_v1_arena(self, *, n_ctx: int, chunk: int, sm_count: int = V1_SM_COUNT,
                        n_checkpoints: int = V1_CHECKPOINTS, dense_prefill: bool = False,
                        replay_fused: bool = True) -> EngineV1Arena:
        """The CUDA engine v1's state, checkpoints and scratch for this context, prefill chunk (prefill_rows)
        and SM count, part by part as engine.cu create_impl allocates them; ``dense_prefill``: with the dense
        prefill GEMM's scratch (an H100 / H200 on a release build). The chunked GDN's scratch is always there
        (the default prefill form; OPENJET_GDN_CHUNKED=0 or 1 at load drops it). ``replay_fused``: the GDN replay
        of OPENJET_GDN_REPLAY's default (no verify shadow state, two input rings); False: OPENJET_GDN_REPLAY=accept."""
        s, T = self.shape, V1_MAX_T
        mtp = s.n_nextn > 0
        ssm = self.gdn_state_bytes
        conv = self.conv_state_bytes
        scratch_rows = max(chunk, T)  # the row buffers hold a chunk or a step's T rows, whichever is more
        rows = self.engine_v1_rows_bytes(scratch_rows)
        chunks = v1_attn_chunks(n_ctx, s.n_head_kv, sm_count)
        attn_work = 4 * (T * s.n_head * V1_ATTN_HEAD_DIM * (1 + chunks) + 2 * chunks * T * s.n_head)
        fixed = [T * s.n_vocab * 4, attn_work, T * V1_TOPK_MAX * 4, T * V1_TOPK_MAX * 4,
                 8 * T * -(-s.n_vocab // V1_TOPK_CHUNK) * V1_TOPK_MAX, s.n_vocab * 4, s.n_vocab * 4]
        # With the MTP head: its carried rows, verify's GDN shadow state (accept mode only), its rings of inputs
        # (two with the fused replay) and hidden rows, then the device drafts' and cycle's outputs (draft_hidden,
        # draft_pick, draft_value, draft_u, draft_q_ids, draft_q_probs, draft_q_len, cycle_out, cycle_n); without the
        # head the parts stay, empty: each still takes its 16 spare bytes' alignment.
        rings = 2 if replay_fused else 1
        fixed += [b if mtp else 0 for b in (
            s.n_embd * 4, s.n_embd * 4, 0 if replay_fused else ssm, rings * self.gdn_layers * T * s.ssm_conv_dim * 4,
            rings * self.gdn_layers * T * s.ssm_n_v_heads * 4, rings * self.gdn_layers * T * s.ssm_n_v_heads * 4,
            T * s.n_embd * 4, T * s.n_embd * 4, T * 4, T * 4, T * 8, T * V1_TOPK_MAX * 4, T * V1_TOPK_MAX * 8, T * 4,
            T * 4, 8)]
        fixed.append(4)  # OPENJET_BENCH_GRAPH's device length (pos_dev), with or without the head
        # Parts added after the ENGINE_REPORTS runs of tests/test_presets.py, each in the arena even when empty: the
        # persistent FFN's counters and flags (ffn_persistent_scratch_ints) and its profile, the dense prefill GEMM's
        # scratch, the FFN's bounded form's norms (two floats a layer and the MTP head's) and row scales (two floats a
        # prefill row), the two-phase chunked GDN's, the integer decode GEMV's pack (only under OPENJET_GEMV_INT=1, an
        # experiment: empty in every plan).
        fixed += [self.ffn_persistent_scratch_bytes, V1_FFN_PROFILE_SLOTS * 8, self.dense_prefill_bytes if dense_prefill else 0,
                  4 * 2 * (s.n_layer + 1), 4 * 2 * scratch_rows, self.gdn_chunk_scratch_bytes(scratch_rows), 0]
        slot = v1_align(ssm, 0) + v1_align(conv, 0) + (v1_align(s.n_embd * 4, 0) if mtp else 0)
        return EngineV1Arena(state_bytes=v1_align(ssm, 0) + 2 * v1_align(conv, 0),
                             checkpoint_bytes=n_checkpoints * slot, row_bytes=rows,
                             fixed_bytes=sum(v1_align(b) for b in fixed))

    @property
    def draft_rows_bytes(self) -> int:
        """The CUDA engine's draft-row buffer (engine.cu draft_bytes) at the capacity the binding reserves with the
        shipped list (engine/cuda.py set_draft_vocabulary): the list's rows and the sequence's room, rounded up to
        whole groups of 16 in the tile layout, each an lm_head row in output.weight's layout and its int32 id, + 16
        bytes; none without an MTP head."""
        from ..model.draft_vocab import DEFAULT_SIZE, SEQUENCE_ROWS

        if self.shape.n_nextn == 0:
            return 0
        rows = -(-min(DEFAULT_SIZE + SEQUENCE_ROWS, self.shape.n_vocab) // self.draft_row_group) * self.draft_row_group
        return rows * (self.draft_row_bytes + 4) + 16

    def decode_workspace_bytes(self, n_agents: int) -> int:
        """Logits and activations of DECODE_ROWS rows per agent (fp32): vocab + FFN + conv + q/gate widths."""
        s = self.shape
        per_row = (s.n_vocab + 2 * s.n_ff + s.ssm_conv_dim + 2 * s.q_dim + 2 * s.n_embd) * 4
        return n_agents * DECODE_ROWS * per_row

    # --- the whole ------------------------------------------------------------------------------------
    def plan(self, *, n_ctx: int, kv_format: str, chunk: int, n_agents: int, embd_on_host: bool,
             total_vram: int, v1_arena: bool = False, sm_count: int | None = None,
             dense_prefill: bool = False) -> MemoryPlan:
        """Memory of ``n_agents`` sequences of ``n_ctx`` tokens each. ``v1_arena``: what the CUDA engine v1
        allocates (engine_v1_arena: its weight arena's alignment, state, checkpoints and scratch; the attention
        workspace sized for the longest context the engine takes, so that max_ctx's room per token holds;
        ``sm_count``: the card's, else V1_SM_COUNT; ``dense_prefill``: the dense prefill GEMM's scratch too)."""
        embd = self.token_embd_bytes if embd_on_host else 0
        if v1_arena:
            arena = self.engine_v1_arena(n_ctx=self.shape.n_ctx_train, chunk=chunk,
                                         sm_count=sm_count or V1_SM_COUNT, dense_prefill=dense_prefill)
            weights, state = self.weights_v1_bytes - embd, arena.state_bytes + arena.checkpoint_bytes
            scratch, workspace = arena.row_bytes, arena.fixed_bytes
        else:
            weights, state = self.weights_bytes - embd, self.agent_state_bytes
            scratch, workspace = self.prefill_scratch_bytes(chunk), self.decode_workspace_bytes(n_agents)
        return MemoryPlan(
            weights=weights,
            token_embd_host=embd,
            kv_cache=n_agents * n_ctx * self.kv_bytes_per_token(kv_format),
            agent_state=n_agents * state,
            prefill_scratch=scratch,
            decode_workspace=workspace,
            draft_rows=self.draft_rows_bytes if v1_arena else 0,
            cuda_context=CUDA_CONTEXT_BYTES,
            safety_margin=safety_margin_bytes(total_vram),
        )

    def max_ctx(self, *, free_vram: int, total_vram: int, kv_format: str, chunk: int, n_agents: int,
                embd_on_host: bool, v1_arena: bool = False, sm_count: int | None = None,
                dense_prefill: bool = False) -> int:
        """The most tokens per agent that fit in ``free_vram`` (0 when not even the fixed terms fit)."""
        fixed = self.plan(n_ctx=0, kv_format=kv_format, chunk=chunk, n_agents=n_agents, embd_on_host=embd_on_host,
                          total_vram=total_vram, v1_arena=v1_arena, sm_count=sm_count,
                          dense_prefill=dense_prefill).total
        room = free_vram - fixed
        if room <= 0:
            return 0
        return room // (n_agents * self.kv_bytes_per_token(kv_format))


@functools.lru_cache(maxsize=8)
def memory_model(shape: ModelShape = QWEN38_27B) -> MemoryModel:
    """The memory model of ``shape`` in the unsloth Q4_K_M recipe (sizes from plan_tensors)."""
    from ..model.synth import plan_tensors

    plans = plan_tensors(shape, with_mtp=shape.n_nextn > 0)
    return MemoryModel(
        shape=shape,
        weights_bytes=sum(p.n_bytes for p in plans),
        token_embd_bytes=sum(p.n_bytes for p in plans if p.spec.role == "token_embd"),
        weights_v1_bytes=sum(v1_align(v1_weight_bytes(p)) for p in plans),
        draft_row_bytes=next(v1_weight_bytes(p) // p.rows for p in plans if p.spec.role == "output"),
        draft_row_group=next(16 if v1_tiled(p) else 1 for p in plans if p.spec.role == "output"),
    )
