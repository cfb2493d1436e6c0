"""The memory model and the preset policy: figures checked against hand arithmetic from qwen38.md §1, each
known card against the settings it must get, refusals against the messages a user needs. The policy tests
run for the planned engine (presets.PLANNED: q4_0 KV, the embedding table in host memory, agents); the
last section checks it within what the CUDA engine v1 does (presets.CUDA_V1), which the launcher uses."""

from __future__ import annotations

import argparse
import json

import pytest

from openjet_launcher.errors import OpenJetError
from openjet_launcher.launcher import presets
from openjet_launcher.launcher.memory import (CUDA_CONTEXT_BYTES, STATE_COPIES, GiB, KV_FORMATS, MiB,
                                              memory_model, safety_margin_bytes, v1_align)
from openjet_launcher.launcher.presets import CARDS, CTX_STEP, CUDA_V1, DENSE_CHUNK, MIN_CTX, PLANNED, format_table
from openjet_launcher.model.shape import PRESETS, QWEN38_27B

MM = memory_model(QWEN38_27B)
CARD = {c.name: c for c in CARDS}


def choose_settings(*args, **kw):
    """The policy for the planned engine (most tests here); CUDA_V1's tests pass engine= themselves."""
    return presets.choose_settings(*args, **{"engine": PLANNED, **kw})


def smallest_plan(total, engine=PLANNED):
    return presets.smallest_plan(total, QWEN38_27B, engine)


def table_rows(**kw):
    return presets.table_rows(**{"engine": PLANNED, **kw})


# --- memory model against qwen38.md §1 ---------------------------------------------------------------------


def test_kv_cache_is_64_kib_per_token_in_fp16_for_the_16_attention_layers_plus_the_mtp_layer():
    per_layer = 4 * 256 * 2 * 2                       # 4 kv heads x 256 dims, K and V, 2 bytes
    assert 16 * per_layer == 64 * 1024                # qwen38.md: 64 KiB per token over 16 layers
    assert MM.kv_layers == 17
    assert MM.kv_bytes_per_token("fp16") == 17 * per_layer == 69632


def test_quantised_kv_formats_cost_34_and_18_bytes_per_32_values():
    values = 17 * 2 * 4 * 256                         # 34816 values per token
    assert MM.kv_bytes_per_token("q8_0") == values // 32 * 34 == 36992
    assert MM.kv_bytes_per_token("q4_0") == values // 32 * 18 == 19584


def test_gated_deltanet_state_is_144_mib_and_conv_state_5_6_mib_in_float32():
    assert MM.gdn_state_bytes == 48 * 48 * 128 * 128 * 4 == 144 * MiB
    assert MM.conv_state_bytes == 48 * 10240 * 3 * 4 == 5898240     # 5.625 MiB
    assert MM.agent_state_bytes == STATE_COPIES * (144 * MiB + 5898240)


def test_weights_follow_the_unsloth_q4_k_m_recipe_and_the_embedding_table_is_q4_k():
    # token_embd: 248320 rows of 5120 values in Q4_K (144 bytes per 256 values).
    assert MM.token_embd_bytes == 248320 * (5120 // 256) * 144 == 715_161_600
    assert abs(MM.weights_bytes - 17.1e9) < 0.01 * 17.1e9           # qwen38.md: the file is 17.1 GB


def test_prefill_scratch_formula_by_hand_for_the_27b_shape():
    trunk = 5120 * (4 + 2 + 4)                         # residual fp32, normed fp16, sub-layer output fp32
    gdn = (2 * 10240 * 4                               # qkv before / after the conv
           + 2 * 6144 * 4                              # z and the gated output
           + 2 * 48 * 4                                # a, b
           + 48 * (64 + 2 * 128) * 4)                  # chunked delta rule rows (64-token chunks)
    ffn = 3 * 17408 * 2
    attn = 2 * 6144 * 4 + 2 * 1024 * 4 + 6144 * 4
    assert gdn > max(ffn, attn)                        # the GDN layer sets the design's scratch size
    # The CUDA engine v1's arena per row (engine.cu create_impl), larger: it counts.
    v1 = (4                                            # token id
          + 3 * 5120 * 4                               # residual, normed row, sub-layer output (fp32)
          + 17408 * 2 + 17408 // 32 * 2 * 2 + 4        # activation pack at the widest input: fp16, sums, scale
          + 2 * 17408 * 4                              # FFN gate and up (the widest of conv / q+gate / FFN)
          + 1024 * 4 + 2 * 48 * 4                      # V rows; beta and alpha
          + 6144 * 4)                                  # the mixer's output
    assert MM.engine_v1_row_bytes == v1 == 266_760 > trunk + gdn
    for chunk in (512, 1024, 2048):
        assert MM.prefill_scratch_bytes(chunk) == chunk * (trunk + gdn) + 248320 * 4
        # each of the arena's 13 row-sized parts rounded up to 256 bytes after 16 spare ones
        assert chunk * v1 < MM.engine_v1_rows_bytes(chunk) <= chunk * v1 + 13 * 256
    assert 470 * MiB < MM.prefill_scratch_bytes(2048) < 480 * MiB
    assert 520 * MiB < MM.engine_v1_rows_bytes(2048) < 524 * MiB


# What the CUDA engine v1 reported it allocated (engine.memory(), H200, 132 SMs, 4 checkpoints, 512-row chunks,
# the MTP head loaded):
# the full 27B at n_ctx 32768 with q8_0 KV (bench/results/engine-full-h200-773592c.json) and the tiny and small
# synthetic models at n_ctx 2112 (test_gpu_engine's teacher-forced runs, gpu-tests-2026-12-02c-h200.jsonl). The
# weights in the tile layout the engine stores them in since ba6cec0 (Q6_K units 210 -> 212 bytes: 27B
# engine-full-h200-ba6cec0-layout-tiles.json, tiny and small gpu-tests-2026-12-03h-ba6cec0-h200.jsonl; the row
# layout's figures were 17095981568, 6074112 and 101412864).
ENGINE_REPORTS = [  # shape, n_ctx, kv, weights, kv_bytes, state_bytes, checkpoint_bytes, scratch_bytes
    (QWEN38_27B, 32768, "q8_0", 17139091968, 1212153856, 162791424, 627654656, 327195904),
    (PRESETS["tiny"], 2112, "q8_0", 6088960, 4595712, 1271808, 4907008, 14272768),
    (PRESETS["tiny"], 2112, "fp16", 6088960, 8650752, 1271808, 4907008, 14272768),
    (PRESETS["small"], 2112, "q8_0", 101654528, 6893568, 5087232, 19628032, 37517568),
]


# Scratch parts engine.cu create_impl gained after those runs, each an arena part of its own even when empty (align_up
# of its bytes + 16 spare: 256 bytes for the empty and small ones): the persistent FFN's scratch (2026-12-02, fourth
# session: 4 ints; since 2026-12-03, thirteenth session, its per-row values and pair flags too: ffn_scratch below) and
# its profile (14 counters of 8 bytes, thirteenth session), the dense prefill GEMM's scratch (empty without its GPU)
# and the two-phase chunked GDN's (fifth session; the default since the sixth: its bytes for 512 rows), the integer
# decode GEMV's pack (fourteenth session; empty unless OPENJET_GEMV_INT=1); the FFN's bounded form's norms (2026-12-04,
# twenty-second session: 2 floats a layer and the MTP head's) and row scales (2 floats a prefill row): bounded_parts;
# the graphs' device length (2026-12-05, thirty-second session: pos_dev, also added since the 27B runs below).
POS_DEV = 256  # its 4 bytes and 16 spare, aligned to 256 (engine.cu create_impl)
PARTS_SINCE_REPORTS = 4 * 256 + POS_DEV


def draft_parts(mm) -> int:
    """The device drafts' and one-call cycle's arena parts (2026-12-04, twenty-sixth session: engine.cu draft_hidden,
    draft_pick, draft_value, draft_u, draft_q_ids, draft_q_probs, draft_q_len, cycle_out, cycle_n), added after the
    reports below; empty without the MTP head."""
    T, E, k = 8, mm.shape.n_embd, 32
    parts = (T * E * 4, T * 4, T * 4, T * 8, T * k * 4, T * k * 8, T * 4, T * 4, 8)
    return sum(v1_align(b if mm.shape.n_nextn else 0) for b in parts)


def bounded_parts(mm, chunk: int) -> int:
    """The arena parts of the FFN's bounded form (engine.cu ffn_norms, ffn_row_scale)."""
    return v1_align(8 * (mm.shape.n_layer + 1)) + v1_align(8 * chunk)


def ffn_scratch(mm) -> int:
    """The persistent FFN's arena part as the plan sizes it (its counters, flags and per-row values: checked against
    the library's own size in tests/test_ffn_persistent_layout.py)."""
    return v1_align(mm.ffn_persistent_scratch_bytes)


@pytest.mark.parametrize("shape, n_ctx, kv, weights, kv_bytes, state, ckpt, scratch", ENGINE_REPORTS)
def test_the_engine_v1_arena_is_what_the_engine_reported_on_the_h200(shape, n_ctx, kv, weights, kv_bytes, state,
                                                                     ckpt, scratch):
    mm = memory_model(shape)
    # CudaEngine.load's default then (the fused GDN replay came later: test_the_arena_follows_the_gdn_replay_mode)
    a = mm.engine_v1_arena(n_ctx=n_ctx, chunk=512, sm_count=132, n_checkpoints=4, replay_fused=False)
    gdn = v1_align(mm.gdn_chunk_scratch_bytes(512)) - v1_align(0)
    assert mm.weights_v1_bytes == weights
    assert n_ctx * mm.kv_bytes_per_token(kv) == kv_bytes
    since = PARTS_SINCE_REPORTS + ffn_scratch(mm) + gdn + bounded_parts(mm, 512) + draft_parts(mm)
    assert (a.state_bytes, a.checkpoint_bytes, a.scratch_bytes) == (state, ckpt, scratch + since)


@pytest.mark.parametrize("chunk, scratch", [(2048, 1241441792), (4096, 1935746560), (8192, 3324356096)])
def test_the_arena_with_the_dense_gemm_and_the_chunked_gdn_is_what_the_27b_engine_reported(chunk, scratch):
    """bench/results/engine-full-h200-8bfa2d6-rows-{2048,4096,8192}.json: the full 27B on the H200 (132 SMs), n_ctx
    32768, q8_0 KV, prefill chunks of 2,048, 4,096 and 8,192 rows, the dense prefill GEMM (its scratch: the FFN's
    gate and up as fp16) and the chunked GDN's scratch: the engine reported these scratch bytes (memory()), and at
    2,048 rows 147,980,288 of them the GDN's (the -attn128 run of 8387270, without it, beside -attn128-gdn2); the FFN's
    bounded form's parts added since (bounded_parts: at 4,096 rows the engine reported 1,935,780,352 bytes at 76e77e0,
    engine-full-h200-76e77e0-ffn-bounded.json)."""
    a = MM.engine_v1_arena(n_ctx=32768, chunk=chunk, sm_count=132, n_checkpoints=4, dense_prefill=True,
                           replay_fused=False)
    assert a.scratch_bytes == scratch + bounded_parts(MM, chunk) + draft_parts(MM) + POS_DEV
    if chunk == 4096:
        assert a.scratch_bytes == 1935780352 + draft_parts(MM) + POS_DEV
    assert v1_align(MM.gdn_chunk_scratch_bytes(2048)) - v1_align(0) == 147980288


@pytest.mark.parametrize("replay_fused, scratch", [(False, 885112576), (True, 749993728)])
def test_the_arena_follows_the_gdn_replay_mode(replay_fused, scratch):
    """bench/results/engine-full-h200-499afb1-{gemv-tma-1,gdn-replay-fused}.json: the full 27B on the H200 (132 SMs), n_ctx
    32,768, q8_0 KV, 4 checkpoints, 2,048 prefill rows, a build without the dense prefill GEMM: the engine reported
    these scratch bytes with OPENJET_GDN_REPLAY=accept (its verify shadow state, one input ring) and fused (the default
    since 2026-12-05: no shadow, two rings), every part of both, the device drafts' included, as the plan sizes them."""
    a = MM.engine_v1_arena(n_ctx=32768, chunk=2048, sm_count=132, n_checkpoints=4, dense_prefill=False,
                           replay_fused=replay_fused)
    assert a.scratch_bytes == scratch + POS_DEV


def test_a_chunk_below_a_steps_rows_plans_a_steps_row_buffers():
    """The engine's row buffers hold max(prefill_rows, 8) rows (engine.cu scratch_rows: a step of 8 rows must fit
    whatever the prefill chunk), so the plan for chunks of 1..8 rows is the same arena, and 9 rows take more."""
    plans = {chunk: MM.engine_v1_arena(n_ctx=4096, chunk=chunk, sm_count=132).scratch_bytes for chunk in (1, 2, 7, 8, 9)}
    assert plans[1] == plans[2] == plans[7] == plans[8] < plans[9], plans
    assert MM.engine_v1_arena(n_ctx=4096, chunk=8, sm_count=132).row_bytes == MM.engine_v1_rows_bytes(8)


def test_an_h100_plan_holds_the_dense_prefill_gemms_scratch():
    """On compute capability 9.0 (the release wheels' sm_90a) prefill dequantises each projection into fp16 scratch
    the size of the largest (the FFN's gate and up, 2 x 17,408 x 5,120 halves at 27B, as engine.cu sizes it): the
    plan holds it, and a card of the same memory at 8.9 does not. There the chunk is DENSE_CHUNK's 4,096 rows (the
    whole context fits either way), whose row-sized scratch the plan holds too; the 8.9 card keeps 2,048."""
    h100 = choose_settings(80 * GiB, 79 * GiB, 132, "9.0", engine=CUDA_V1)
    ada = choose_settings(80 * GiB, 79 * GiB, 132, "8.9", engine=CUDA_V1)
    assert (h100.prefill_chunk, ada.prefill_chunk) == (DENSE_CHUNK, 2048)
    assert h100.n_ctx == ada.n_ctx == QWEN38_27B.n_ctx_train
    assert MM.dense_prefill_bytes == 2 * 2 * 17408 * 5120  # gate and up, one GEMM
    def arena(dense, chunk=DENSE_CHUNK):  # as plan() sizes it: the attention workspace for the longest context
        return MM.engine_v1_arena(n_ctx=QWEN38_27B.n_ctx_train, chunk=chunk, sm_count=132, dense_prefill=dense)
    assert h100.memory.decode_workspace == arena(True).fixed_bytes
    assert ada.memory.decode_workspace == arena(False, 2048).fixed_bytes
    grown = arena(True).fixed_bytes - arena(False).fixed_bytes
    assert MM.dense_prefill_bytes <= grown <= MM.dense_prefill_bytes + 256


def test_the_dense_chunk_is_taken_only_where_it_costs_no_context():
    """DENSE_CHUNK (4,096 rows) only on compute capability 9.0 and only where the model's whole context fits with it:
    a 24 GB card at 9.0 (none is sold; the rule, not the card) keeps 2,048 rows and the context 2,048 gives it."""
    small = choose_settings(24 * GiB, 23 * GiB, 132, "9.0", engine=CUDA_V1)
    assert small.prefill_chunk == 2048 and small.n_ctx < QWEN38_27B.n_ctx_train
    h200 = choose_settings(141 * GiB, 140 * GiB, 132, "9.0", engine=CUDA_V1)
    assert h200.prefill_chunk == DENSE_CHUNK and h200.kv_format == "fp16"
    assert any(r.startswith(f"prefill chunk {DENSE_CHUNK}: the dense prefill GEMM") for r in h200.reasons)


def test_a_v1_plan_holds_the_engines_arena_with_the_workspace_of_the_longest_context():
    """The launcher's plan for the CUDA engine v1 is its allocation: weights with the arena's alignment, state
    and checkpoints, the row-sized scratch, and the rest (logits, top-k, verify's shadow state, the attention
    workspace, which grows with the context and the SMs, sized for the longest context so max_ctx holds)."""
    p = MM.plan(n_ctx=32768, kv_format="q8_0", chunk=2048, n_agents=1, embd_on_host=False, total_vram=24 * GiB,
                v1_arena=True, sm_count=82)
    at_ctx = MM.engine_v1_arena(n_ctx=32768, chunk=2048, sm_count=82)
    longest = MM.engine_v1_arena(n_ctx=262144, chunk=2048, sm_count=82)
    assert p.weights == MM.weights_v1_bytes and p.agent_state == at_ctx.state_bytes + at_ctx.checkpoint_bytes
    assert p.prefill_scratch == at_ctx.row_bytes == MM.engine_v1_rows_bytes(2048)
    assert p.decode_workspace == longest.fixed_bytes >= at_ctx.fixed_bytes
    more_sms = MM.engine_v1_arena(n_ctx=262144, chunk=2048, sm_count=170)
    assert more_sms.fixed_bytes > longest.fixed_bytes        # more SMs, more attention chunks per step
    free = 23 * GiB
    n = MM.max_ctx(free_vram=free, total_vram=24 * GiB, kv_format="q8_0", chunk=2048, n_agents=1,
                   embd_on_host=False, v1_arena=True, sm_count=82)
    fits = MM.plan(n_ctx=n, kv_format="q8_0", chunk=2048, n_agents=1, embd_on_host=False, total_vram=24 * GiB,
                   v1_arena=True, sm_count=82)
    assert fits.total <= free < fits.total + MM.kv_bytes_per_token("q8_0")


def test_a_plan_adds_up_its_terms_and_moves_the_embedding_table_to_host_memory():
    on_gpu = MM.plan(n_ctx=1000, kv_format="q8_0", chunk=2048, n_agents=2, embd_on_host=False, total_vram=24 * GiB)
    on_host = MM.plan(n_ctx=1000, kv_format="q8_0", chunk=2048, n_agents=2, embd_on_host=True, total_vram=24 * GiB)
    assert on_gpu.kv_cache == 2 * 1000 * 36992
    assert on_gpu.cuda_context == CUDA_CONTEXT_BYTES == 500 * MiB
    assert on_gpu.safety_margin == safety_margin_bytes(24 * GiB) == 512 * MiB
    assert on_gpu.total - on_host.total == MM.token_embd_bytes == on_host.token_embd_host
    assert on_gpu.to_dict()["total"] == sum(v for k, v in on_gpu.to_dict().items()
                                            if k not in ("total", "token_embd_host"))


def test_the_memory_model_follows_the_shape_it_is_given():
    tiny = memory_model(PRESETS["tiny"])
    assert tiny.kv_layers == 2                         # 1 attention layer in 4 + the MTP layer
    assert tiny.kv_bytes_per_token("fp16") == 2 * 2 * 2 * 256 * 2
    assert tiny.gdn_state_bytes == 3 * 6 * 128 * 128 * 4


# --- the policy on known cards -------------------------------------------------------------------------------

EXPECTED = {  # card: (KV format, context, chunk, embedding table in host memory, agents allowed)
    "RTX 3090": ("q8_0", 167936, 2048, True, True),
    "RTX 4090": ("q8_0", 167936, 2048, True, True),
    "RTX 5090": ("fp16", 208896, 2048, True, True),
    "A10": ("q8_0", 147456, 2048, True, False),
    "L4": ("q8_0", 147456, 2048, True, False),
    "H100 80GB": ("fp16", 262144, 2048, False, True),
    "H200": ("fp16", 262144, 2048, False, True),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_known_card_gets_its_settings(name):
    c = CARD[name]
    s = choose_settings(c.total_vram, c.free_vram, c.sm_count, c.compute_capability)
    assert (s.kv_format, s.n_ctx, s.prefill_chunk, s.embd_on_host, s.agents_allowed) == EXPECTED[name]


@pytest.mark.parametrize("name", list(EXPECTED))
def test_chosen_settings_fit_and_are_the_largest_context_that_fits(name):
    c = CARD[name]
    s = choose_settings(c.total_vram, c.free_vram, c.sm_count, c.compute_capability)
    assert s.memory.total <= c.free_vram
    if s.n_ctx < QWEN38_27B.n_ctx_train:
        bigger = MM.plan(n_ctx=s.n_ctx + CTX_STEP, kv_format=s.kv_format, chunk=s.prefill_chunk, n_agents=1,
                         embd_on_host=s.embd_on_host, total_vram=c.total_vram)
        assert bigger.total > c.free_vram
    if s.kv_format != "fp16":                         # a more precise format would not hold the target
        more = list(KV_FORMATS)[list(KV_FORMATS).index(s.kv_format) - 1]
        assert MM.max_ctx(free_vram=c.free_vram, total_vram=c.total_vram, kv_format=more, chunk=2048, n_agents=1,
                          embd_on_host=True) < presets.DEFAULT_TARGET_CTX


def test_a_16_gb_card_is_refused_with_the_weights_and_the_smallest_setup():
    c = CARD["RTX 4080 16GB"]
    with pytest.raises(OpenJetError) as e:
        choose_settings(c.total_vram, c.free_vram, c.sm_count, c.compute_capability)
    msg = str(e.value)
    assert "16.0 GiB" in msg and "weights alone take 15.3 GiB" in msg and "24 GB" in msg
    assert "--engine reference" in msg


def test_several_agents_need_80_sms():
    c = CARD["A10"]
    with pytest.raises(OpenJetError, match="at least 80 SMs, this one has 72"):
        choose_settings(c.total_vram, c.free_vram, c.sm_count, c.compute_capability, requested_agents=2)
    c = CARD["RTX 3090"]
    s = choose_settings(c.total_vram, c.free_vram, c.sm_count, c.compute_capability, requested_agents=2)
    assert s.n_agents == 2 and s.memory.total <= c.free_vram
    assert s.memory.kv_cache == 2 * s.n_ctx * MM.kv_bytes_per_token(s.kv_format)
    with pytest.raises(OpenJetError, match="1 to 8 agents"):
        choose_settings(c.total_vram, c.free_vram, c.sm_count, c.compute_capability, requested_agents=9)


def test_a_full_context_on_a_24_gb_card_takes_the_low_bit_kv_format():
    c = CARD["RTX 4090"]
    s = choose_settings(c.total_vram, c.free_vram, c.sm_count, c.compute_capability, requested_ctx=262144)
    assert (s.kv_format, s.n_ctx) == ("q4_0", 262144)


def test_a_requested_setting_that_does_not_fit_is_refused_with_what_would_fit():
    c = CARD["RTX 4090"]
    with pytest.raises(OpenJetError) as e:
        choose_settings(c.total_vram, c.free_vram, c.sm_count, c.compute_capability, requested_ctx=262144,
                        requested_kv="fp16")
    msg = str(e.value)
    assert msg.startswith("262144 tokens of fp16 KV do not fit")
    fits = presets.what_fits(MM, c.free_vram, c.total_vram, 1, PLANNED)
    assert f"fp16 up to {fits['fp16']} tokens" in msg and f"q8_0 up to {fits['q8_0']} tokens" in msg
    assert fits["fp16"] < fits["q8_0"] < fits["q4_0"] == 262144


def test_a_requested_context_is_kept_exactly_and_beyond_the_model_maximum_refused():
    c = CARD["H200"]
    s = choose_settings(c.total_vram, c.free_vram, c.sm_count, c.compute_capability, requested_ctx=50000)
    assert (s.n_ctx, s.kv_format, s.embd_on_host) == (50000, "fp16", False)
    with pytest.raises(OpenJetError, match="1 to 262144 tokens"):
        choose_settings(c.total_vram, c.free_vram, c.sm_count, c.compute_capability, requested_ctx=262145)


def test_memory_held_by_other_programs_is_named_as_the_cause():
    c = CARD["RTX 4090"]
    with pytest.raises(OpenJetError, match=r"only 10.0 GiB of this GPU's 24.0 GiB is free.*nvidia-smi"):
        choose_settings(c.total_vram, 10 * GiB, c.sm_count, c.compute_capability)


def test_when_memory_is_short_the_chunk_shrinks_before_refusing():
    total = CARD["RTX 4090"].total_vram
    s = choose_settings(total, smallest_plan(total).total, 128, "8.9")
    assert (s.kv_format, s.n_ctx, s.prefill_chunk) == ("q4_0", MIN_CTX, 512)
    assert "prefill chunk 512: memory is short" in s.reasons


def test_more_free_memory_never_gives_a_less_precise_cache_or_less_context_in_the_same_format():
    total, order = 48 * GiB, list(KV_FORMATS)
    last = None
    for free in range(int(18.5 * GiB), total, GiB // 4):
        s = choose_settings(total, free, 100, "8.9")
        now = (order.index(s.kv_format), s.n_ctx)
        if last is not None:
            assert now[0] <= last[0]
            assert now[0] < last[0] or now[1] >= last[1]
        last = now
    assert order[last[0]] == "fp16"


def test_old_architectures_and_unknown_kv_formats_are_refused():
    with pytest.raises(OpenJetError, match="compute capability 7.5 is too old"):
        choose_settings(16 * GiB, 16 * GiB, 40, "7.5")
    with pytest.raises(OpenJetError, match="unknown KV format"):
        choose_settings(80 * GiB, 80 * GiB, 132, (9, 0), requested_kv="q5_1")


def test_the_table_lists_every_card_and_explains_the_refusal(capsys):
    text = format_table(table_rows())
    for c in CARDS:
        assert c.name in text
    assert "refused [1]" in text and "[1] RTX 4080 16GB: this GPU has 16.0 GiB" in text

    parser = argparse.ArgumentParser()
    presets.add_presets_parser(parser.add_subparsers())
    args = parser.parse_args(["presets", "--json", "--vram", "48", "--sms", "142", "--cc", "8.9", "--only"])
    assert args.func(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["gpu"] for r in rows] == ["this card"] and rows[0]["settings"]["kv_format"] == "fp16"


# --- within what the CUDA engine v1 does (what the launcher and doctor use) ----------------------------------

@pytest.mark.parametrize("name", ["RTX 3090", "RTX 4090", "RTX 5090", "H200"])
def test_the_engine_v1_settings_fit_what_it_allocates(name):
    """fp16 or q8_0 KV, the embedding table on the GPU, one sequence: the context is the largest such plan
    that fits, so the engine's own memory check (engine.cu) passes at it."""
    c = CARD[name]
    s = presets.choose_settings(c.total_vram, c.free_vram, c.sm_count, c.compute_capability, engine=CUDA_V1)
    assert s.kv_format in ("fp16", "q8_0") and not s.embd_on_host and not s.agents_allowed
    assert s.memory.token_embd_host == 0 and s.memory.total <= c.free_vram
    if s.n_ctx < QWEN38_27B.n_ctx_train:
        bigger = MM.plan(n_ctx=s.n_ctx + CTX_STEP, kv_format=s.kv_format, chunk=s.prefill_chunk, n_agents=1,
                         embd_on_host=False, total_vram=c.total_vram, v1_arena=True, sm_count=c.sm_count)
        assert bigger.total > c.free_vram
    planned = choose_settings(c.total_vram, c.free_vram, c.sm_count, c.compute_capability)
    assert s.n_ctx <= planned.n_ctx                    # the planned engine never gets less


def test_the_engine_v1_refuses_what_it_cannot_keep():
    c = CARD["RTX 4090"]
    with pytest.raises(OpenJetError, match="KV format q4_0: the CUDA engine v1 keeps its KV cache as fp16 or q8_0"):
        presets.choose_settings(c.total_vram, c.free_vram, c.sm_count, c.compute_capability, requested_kv="q4_0",
                                engine=CUDA_V1)
    with pytest.raises(OpenJetError, match="2 agents requested: the CUDA engine v1 holds 1 sequence"):
        presets.choose_settings(c.total_vram, c.free_vram, c.sm_count, c.compute_capability, requested_agents=2,
                                engine=CUDA_V1)
    with pytest.raises(OpenJetError) as e:                # the full context needs q4_0, which v1 lacks
        presets.choose_settings(c.total_vram, c.free_vram, c.sm_count, c.compute_capability, requested_ctx=262144,
                                engine=CUDA_V1)
    assert "do not fit" in str(e.value) and "q4_0" not in str(e.value)


def test_the_presets_command_shows_the_engine_v1_unless_asked_for_the_planned_one(capsys):
    parser = argparse.ArgumentParser()
    presets.add_presets_parser(parser.add_subparsers())
    for flags, fmt in (([], "q8_0"), (["--planned"], "q8_0")):
        args = parser.parse_args(["presets", "--json", "--vram", "24", "--sms", "128", "--cc", "8.9", "--only",
                                  *flags])
        assert args.func(args) == 0
        s = json.loads(capsys.readouterr().out)[0]["settings"]
        assert s["kv_format"] == fmt and s["embd_on_host"] == bool(flags)
    text = format_table(presets.table_rows())
    assert "for the CUDA engine v1: KV fp16 or q8_0, embedding table on the GPU" in text


def test_the_v1_plan_with_drafts_covers_serving_without_them():
    """The plan assumes serve's default, drafts on: the MTP head, its KV layer and verify's shadow state, with
    STATE_COPIES - 2 checkpoints. `--draft 0` loads the engine without the head and with STATE_COPIES - 1
    checkpoints (server/cli.py): that takes less, so the same context still fits."""
    import dataclasses

    from openjet_launcher.launcher.memory import V1_CHECKPOINTS

    c = CARD["RTX 3090"]
    s = presets.choose_settings(c.total_vram, c.free_vram, c.sm_count, c.compute_capability, engine=CUDA_V1)
    plan = s.memory
    no_head = memory_model(dataclasses.replace(QWEN38_27B, n_nextn=0))
    a = no_head.engine_v1_arena(n_ctx=s.n_ctx, chunk=s.prefill_chunk, sm_count=c.sm_count,
                                n_checkpoints=STATE_COPIES - 1)
    without = (no_head.weights_v1_bytes + s.n_ctx * no_head.kv_bytes_per_token(s.kv_format) + a.state_bytes
               + a.checkpoint_bytes + a.scratch_bytes)
    with_head = plan.weights + plan.kv_cache + plan.agent_state + plan.prefill_scratch + plan.decode_workspace
    assert V1_CHECKPOINTS == STATE_COPIES - 2 and no_head.kv_layers == MM.kv_layers - 1
    assert without < with_head


def test_a_context_asked_for_below_the_minimum_is_planned_as_asked():
    """MIN_CTX is the least the policy picks by itself, not a floor on what a user names: 8,192 tokens on a 24 GB
    card with 18 GiB free fit (17.7 GiB), where the 32,768-token minimum does not."""
    with pytest.raises(OpenJetError, match="only 18.0 GiB"):
        presets.choose_settings(24 * GiB, 18 * GiB, 82, "8.6", engine=CUDA_V1)
    s = presets.choose_settings(24 * GiB, 18 * GiB, 82, "8.6", engine=CUDA_V1, requested_ctx=8192)
    assert s.n_ctx == 8192 and s.memory.total <= 18 * GiB


def test_the_plan_is_for_the_files_shape():
    """A model trained on fewer tokens than MIN_CTX is planned at its own context (not refused, not given more than
    it was trained on), and a 27B file without the MTP head gets the context the head's weights, KV layer and draft
    rows would have taken."""
    import dataclasses

    small = PRESETS["small"]
    assert small.n_ctx_train <= MIN_CTX
    s = presets.choose_settings(16 * GiB, 15 * GiB, 76, "8.9", engine=CUDA_V1, model=small)
    assert s.n_ctx == small.n_ctx_train and s.kv_format == "fp16"
    with_head = presets.choose_settings(24 * GiB, 23 * GiB, 82, "8.6", engine=CUDA_V1)
    without = presets.choose_settings(24 * GiB, 23 * GiB, 82, "8.6", engine=CUDA_V1,
                                      model=dataclasses.replace(QWEN38_27B, n_nextn=0))
    assert without.n_ctx > with_head.n_ctx and without.memory.draft_rows == 0 < with_head.memory.draft_rows


def test_a_short_trained_model_keeps_its_context_and_a_long_declared_one_is_capped():
    """Grown contexts round down to CTX_STEP: a model trained on fewer tokens than that kept 0 (which serve refuses);
    a file declaring more than the engine takes (262,144) was planned past what the engine's create accepts."""
    import dataclasses

    short = dataclasses.replace(PRESETS["tiny"], n_ctx_train=2048)
    assert presets.choose_settings(24 * GiB, 23 * GiB, 82, "8.6", engine=CUDA_V1, model=short).n_ctx == 2048
    long = dataclasses.replace(QWEN38_27B, n_ctx_train=1 << 20)
    s = presets.choose_settings(141 * GiB, 140 * GiB, 132, "9.0", engine=CUDA_V1, model=long)
    assert s.n_ctx == presets.MAX_CTX == 262144
    with pytest.raises(OpenJetError, match="the model takes 1 to 262144 tokens"):
        presets.choose_settings(141 * GiB, 140 * GiB, 132, "9.0", engine=CUDA_V1, model=long, requested_ctx=300000)
