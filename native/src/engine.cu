// The decode engine v1 (include/openjet_engine.h): the qwen35 trunk (qwen38.md §3) assembled from the kernel
// families, one launch per op on one stream. Per step of T <= 8 tokens:
//   h = embed(ids)
//   per layer: a = rms(h, attn_norm) -> pack (fp16, act_pack.cuh; + float for the F32 projections)
//              GDN:  qkv, z = W a; beta, alpha = W_f32 a; y = gdn_step(...); mix = W_ssm_out pack(y)
//              attn: qg, k, v = W a; o = attn_decode(...) (prep, chunks, combine with sigmoid gate);
//                    mix = W_attn_output pack(o)
//              h += mix; f = rms(h, post_attention_norm) -> pack; up/gate = W f;
//              mix = W_down pack(silu(gate) * up)          (the next layer's norm adds mix to h first)
//   hidden = rms(h + mix, output_norm); logits = W_output hidden (Q6_K)
// MTP head (qwen38.md §3.3, when the file has blk.{n_layer}.nextn.*): after every step its attention layer's
// cache is extended by the step's pairs (x_{i+1}, hidden_i) (row r of that cache = position r + 1);
// openjet_engine_mtp_step runs the whole head for one drafted token on rows past the committed ones.
// Every op works row by row in a fixed order, so row t of a T-row step equals the one-row step at that
// position bit for bit, except when attention's context split changes (attn_decode.cuh).
// Prefill (openjet_engine_prefill) runs the same trunk over chunks of up to prefill_rows rows (config; 512 by
// default, at most 8192): the projections take all rows at once (the GEMV's groups of 8), the GDN step takes
// them in one launch (sub-steps of 8 inside), attention in sub-steps of 8 (merged into launches of up to 64
// rows where no bit changes), so its rows carry decode's bits. A verify step (openjet_engine_verify) is a
// decode step that leaves the committed GDN state alone; openjet_engine_accept replays the GDN recurrence over
// the kept rows from a ring of their inputs.
//
// Memory: four device arenas, each one cudaMalloc: weights, sequence state (GDN states, the two conv-state
// buffers the GDN kernel ping-pongs, KV caches), checkpoint slots, scratch. Sizes are computed and checked
// against free memory before any allocation; a failed create frees what it took (the destructor).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <new>
#include <cstdlib>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "api_common.cuh"
#include "attn_decode.cuh"
#include "attn_prefill.cuh"
#include "dense_gemm.cuh"
#include "device_attr.cuh"
#include "elementwise.cuh"
#include "embed.cuh"
#include "ffn_persistent.cuh"
#include "gemv.cuh"
#include "gemv_fold.cuh"
#include "gemv_imma.cuh"
#include "gemv_tma.cuh"
#include "gdn_chunk.cuh"
#include "gdn_decode.cuh"
#include "kquant.cuh"
#include "launch_count.h"
#include "prefill_gemm.cuh"
#include "row_bound.cuh"
#include "sample_top.cuh"
#include "topk.cuh"
#include "weight_layout.cuh"
#include "openjet_engine.h"
#include "act_pack.cuh"

namespace {

using namespace openjet;

constexpr auto& fail = fail_in<Api::kEngine>;

// This thread's count of the engine's failures part way through an operation: failed CUDA calls, and the trunk's
// internal checks (GpuFailureWatch reads it).
unsigned long long& gpu_failures() {
    static thread_local unsigned long long n = 0;
    return n;
}

int cuda_fail(cudaError_t e, const char* what) {
    cudaGetLastError();  // clear a sticky-free error so the next call starts clean
    ++gpu_failures();
    return cuda_fail_in<Api::kEngine>(e, what, nullptr);
}

constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Bytes of openjet_engine::out_host (StagedOutputs): `rows` rows of top-k values and ids and of hidden rows.
size_t staged_output_bytes(int rows, int n_embd) {
    return align_up(sizeof(float) * rows * kTopKMax) + align_up(sizeof(int32_t) * rows * kTopKMax) +
           align_up(sizeof(float) * rows * n_embd);
}

// A tensor in the weight arena.
struct DevTensor {
    int type = -1;
    int64_t ne0 = 0, ne1 = 0;  // ne0 = input dim k, ne1 = rows n
    size_t bytes = 0, offset = 0;
    const void* host = nullptr;
    const void* d = nullptr;
    bool tiled = false;  // stored in the tile layout (weight_layout.cuh; every GEMV weight that has one, by default)
    // Its prefill fp16 rows where the engine keeps them (OPENJET_PREFILL_F16_WEIGHTS; GemvArgs::w16), or null.
    __half* w16 = nullptr;
    long long ld16 = 0;
    // The FFN's gate kept with its up in the pack's order: their largest row norms (GemvArgs::w16_norms), or null.
    const float* w16_norms = nullptr;
    // Its bytes in the weight arena: the GGUF's, or the tile layout's (Q6_K pieces padded 210 -> 212).
    size_t device_bytes() const {
        if (!tiled) return bytes;
        return static_cast<size_t>(tile_layout_bytes(type, static_cast<int>(ne1), static_cast<int>(ne0)));
    }
};

struct LayerW {
    bool attn = false;
    int idx = 0;  // index among the GDN layers or among the attention layers
    DevTensor attn_norm, post_norm, ffn_gate, ffn_up, ffn_down;
    // GDN
    DevTensor qkv, gate, alpha, beta, conv, dt_bias, ssm_a, ssm_norm, ssm_out;
    // The GDN output's bounded pack (row_bound.cuh launch_gdn_out_scale): the largest row norm of the z projection's
    // kept fp16 rows and max |ssm_norm|, set at load where those rows are kept; -1 elsewhere (the pack of y then).
    float z_norm_max = -1.0f, norm_w_max = -1.0f;
    // attention
    DevTensor wq, wk, wv, q_norm, k_norm, wo;
    // OPENJET_FOLD's plan for the layer, fixed at create (plan_folds): its FFN-input add-norm is the fold (the mixer's
    // out projection, then gate / up), and so is the next layer's input add-norm (this layer's down projection, then
    // that layer's first input projections; the MTP head's: its head norm, then the draft head). Decode and prefill
    // read the same plan, so they take the same numerics.
    bool fold_ffn_in = false, fold_next_in = false;
};

const char* type_name(int t) {
    switch (t) {
        case kF32: return "F32";
        case 1: return "F16";
        case kQ8_0: return "Q8_0";
        case kQ4_K: return "Q4_K";
        case kQ5_K: return "Q5_K";
        case kQ6_K: return "Q6_K";
        default: return "an unsupported type";
    }
}

}  // namespace

// Attention chunk blocks per SM the split aims at (attn_chunk_keys gets sm_count x spread). 2 by default: at
// 32K context on the 27B (H200) one block of 8 warps per SM left the chunk blocks latency-bound; 2 per SM took
// T=1 from 17.79 to 16.73 ms and T=4 from 22.53 to 20.30 (4: 17.08 / 21.14, 8: 18.50 / 22.56). It changes
// the partials' merge order at long contexts only (logits within 4e-5 relative, tests/test_gpu_engine.py).
// openjet_engine_set_attn_spread picks 1..cap, the cap OPENJET_ATTN_SPREAD gave at create (default 2; the
// workspace is sized for the cap: ~13 MB per unit at 27B, 32K context, 132 SMs).
constexpr int kDefaultAttnSpread = 2;
constexpr int kMaxAttnSpread = 8;

namespace openjet {
// A few CUDA graphs kept by key (OPENJET_BENCH_GRAPH): found, or a slot to capture into (an empty one, else the least
// recently used).
template <class Key, int N> struct GraphCache {
    struct Slot {
        Key key{};
        cudaGraphExec_t exec = nullptr;
        long used = 0;  // when it last ran (clock)
    } slots[N];
    long clock = 0;
    Slot* find(const Key& key) {
        for (Slot& s : slots)
            if (s.exec && s.key == key) return &s;
        return nullptr;
    }
    Slot* room() {
        const auto rank = [](const Slot& s) { return s.exec ? s.used : -1L; };
        Slot* pick = &slots[0];
        for (Slot& s : slots)
            if (rank(s) < rank(*pick)) pick = &s;
        return pick;
    }
    void clear() {
        for (Slot& s : slots)
            if (s.exec) cudaGraphExecDestroy(s.exec), s.exec = nullptr;
    }
};
}  // namespace openjet

struct openjet_engine {
    openjet_engine_config cfg{};
    cudaStream_t stream = nullptr;
    int sm_count = 0;
    int prefill_rows = 0;  // a prefill call's chunk limit: config.prefill_rows, or OPENJET_ENGINE_PREFILL_ROWS for 0
    int scratch_rows = 0;  // the row buffers' rows: prefill_rows, at least a step's OPENJET_ENGINE_MAX_T
    int attn_spread = kDefaultAttnSpread, attn_spread_cap = kDefaultAttnSpread;  // 1 <= spread <= cap <= kMaxAttnSpread
    bool gdn_fused = true;  // F32 beta/alpha projected inside the GDN step (OPENJET_GDN_FUSED=0 at create: two GEMVs)
    // A decode or verify step's GDN step packs its own output for the out projection (GdnStepArgs::pack_out) instead
    // of a pack launch after it; its blocks meet through gdn_pack_sync (GdnPackSync, in the zeroed scratch). The same
    // bits; OPENJET_GDN_STEP_PACK=0 at create: the pack launch (T=1 8.99 -> 8.80 ms with OPENJET_ADD_NORM_MAX_EST on
    // the H100 at 17de1b0).
    bool gdn_step_pack = true;
    // OPENJET_GDN_STAGED=0 at create: off (on by default since 2026-12-06): the GDN step's staged form
    // (GdnStepArgs::staged: its weights' DRAM round trips before its PDL wait; the same bits). Timed with the own pack's
    // lighter meeting (GdnPackSync, now every form's) on the H100, twice against neither: the gdn.step phase 0.677 ->
    // 0.639 ms a T=1 step, the no-draft cycle 8.095 -> 8.030 ms; the staging alone gained nothing (0.691).
    bool gdn_staged = true;
    // OPENJET_GDN_LATE=0 at create: off (on by default since 2026-12-07): GdnStepArgs::late_launch (the same bits).
    // H100, the `full` model, alternating twice: T=1 7.936 / 7.901 -> 7.896 / 7.875 ms, T=5 10.276 / 10.251 -> 10.160 /
    // 10.218 ms.
    bool gdn_late = true;
    // OPENJET_GEMV_GROUP=0 at create: off (on by default since 2026-12-07): a decode or verify step's input
    // projections that share an input but not a type (a GDN layer's Q6_K qkv and Q4_K z) or come three to a layer
    // (attention's q, k and v) in one producer-warp launch (launch_gemv_tma_group, the same bits) instead of two. H100,
    // the `full` model, alternating twice: T=1 8.003 / 7.949 -> 7.889 / 7.845 ms, T=5 10.361 / 10.225 -> 9.988 / 9.909.
    bool gemv_group = true;
    GdnProbe* gdn_probe = nullptr;  // OPENJET_BENCH_GDN_PROBE=1 at create: GdnStepArgs::probe (a measurement)
    // OPENJET_FOLD (at create; on unless "0"; a declared numerics change, gemv_fold.cuh: T=1 8.93 -> 8.54 ms on the
    // H100 at 32e090a, the teacher-forced bars and the n_draft identity held): a decode or verify step's add-norms
    // inside the trunk made by the GEMVs around them: the FFN-input one by the mixer's out projection (its
    // tiles add the delta to h and write u = h w and the norm's partials) and the FFN's gate / up (their pack from
    // those), the next layer's input one by the down projection and that layer's first input projections (which also
    // leave the pack in x and the normed rows in a for the kernels after them). fold_norm, fold_u: set by the trunk for
    // the next output projection (project_out takes them, and clears fold_norm: the trunk sees the fold ran);
    // fold_input: the next mixer's first input projections read it (input_projections).
    bool fold = true;
    // OPENJET_FOLD_ROWS=1 at create (an experiment, off by default; the same bits): at more than one row the fold's B
    // makes its rows' pack itself, its first t blocks each one row with the pack launch's code while the others wait
    // for them (GemvFold::rows, FoldRowsSync in the zeroed scratch), instead of launch_fold_pack's launch before it: one
    // completion hop fewer at each of a verify step's 127 folds, where that launch cost ~4 us (H100, T=5 trace).
    bool fold_rows = false;
    FoldRowsSync* fold_rows_sync = nullptr;
    // OPENJET_SWIGLU_ROWS=1 at create (an experiment, off by default; the same bits): at more than one row a down
    // projection that is the fold's A makes its input, the swiglu pack, itself: its first blocks compute the rows'
    // maxima, meet through SwigluRowsSync (in the zeroed scratch) and pack, while the others wait for them, instead of
    // the swiglu pack launch before it (64 a verify step, ~10 us marginal each at T=5 on the H100). swiglu_g / swiglu_u:
    // set by ffn for the down projection (project_out takes them and clears them).
    bool swiglu_rows = false;
    SwigluRowsSync* swiglu_rows_sync = nullptr;
    const float* swiglu_g = nullptr;
    const float* swiglu_u = nullptr;
    const float* fold_norm = nullptr;
    float* fold_u = nullptr;
    bool fold_input = false;
    unsigned* gdn_pack_sync = nullptr;
    // OPENJET_ATTN_OWN_PACK=0 at create: off (on by default since 2026-12-07): a decode or verify step's attention
    // combine packs its own output for the out projection (AttnDecodeArgs::pack_out, its blocks meeting through
    // attn_pack_sync, AttnPackSync in the zeroed scratch) instead of a pack launch after it. The same bits. H100, the
    // trace: an attention layer from its prep to its out projection 25.4 -> 23.5 us at T=1, 34.8 -> 32.0 at T=5.
    bool attn_own_pack = true;
    unsigned* attn_pack_sync = nullptr;
    // OPENJET_SWIGLU_SELF at create (the same bits): a decode step's gate / up pack their own swiglu for the down
    // projection (launch_gemv_swiglu: tile pairs, v in their epilogue, a meeting of their blocks, then the pack),
    // instead of the swiglu pack launch. 1 (the default): in steps of one row, where it gains (7.97 against 8.27 ms
    // a T=1 step on an H100, NOTES_gemv.md, forty-first session); 0: never. At more rows it lost on the H100 and the
    // H200, with and without the meeting (forty-second session), so steps of more rows keep the pack launch.
    // grid_meet: the blocks' meeting place, in the zeroed scratch.
    int swiglu_self = 1;
    GridMeet* grid_meet = nullptr;
    // A decode step's FFNs as one persistent launch each (ffn_persistent.cuh; OPENJET_FFN_PERSISTENT at create, an
    // experiment: the same bits; 1: the FFN, 2: from the mixer's output on, 3: and the next norm, 4: and the next
    // layer's input projections) and its scratch.
    int ffn_persistent = 0;
    // OPENJET_FFN_TMA at create (an experiment: the same bits): the persistent FFN in its producer-warp form where it
    // runs (ffn_tma_takes), whatever OPENJET_FFN_PERSISTENT says: 1 the FFN, 2 and the next norm, 3 also the tail, 4
    // also the next layer's input projections (3 and 4: OPENJET_FFN_PERSISTENT=3's and 4's launches); the MTP head's
    // FFN too (from 2 with its head norm).
    int ffn_tma = 0;
    int* ffn_counters = nullptr;
    unsigned long long* ffn_profile = nullptr;  // its in-kernel profile (FfnProfile), timed while prof.on
    int persistent_sms = 0;  // OPENJET_PERSISTENT_SMS at create: the persistent grid's SMs (0: all; emulation)
    // The two-phase chunked GDN's scratch for a prefill chunk's rows (gdn_chunk.cuh; the default, made unless
    // OPENJET_GDN_CHUNKED is 0 or 1 at create); null otherwise (the recurrence or form 1 then runs in its place).
    float* gdn_chunk_scratch = nullptr;
    // OPENJET_PREFILL_GEMM=dense at create, the default where it runs (dense_gemm.cuh): scratch for the largest
    // matrix a prefill GEMM dequantises (the 27B's FFN gate and up together, 2 x 17408 x 5120 halves: 340 MiB); null
    // otherwise.
    __half* wdense = nullptr;
    // The bounded packs (row_bound.cuh; on the kept fp16 rows): the norms of each kept FFN gate and up (2 floats a
    // layer, the MTP head's last) and a prefill chunk's row scales and their inverses (2 R floats), used in turn by
    // a layer's GDN output pack (the scales only) and its FFN.
    float* ffn_norms = nullptr;
    float* row_scale = nullptr;
    // OPENJET_ATTN_PREFILL_F16 (default on): where a Q8_0 cache's prefill attention puts its fp16 rows, the larger of
    // the two scratches above (both free during attention), and the keys per kv head it holds; null where neither is
    // made.
    char* attn_f16_rows = nullptr;
    int attn_f16_capacity = 0;
    int n_gdn = 0, n_attn = 0;  // n_attn counts the MTP layer's cache too (the last one)
    std::vector<LayerW> layers;
    DevTensor tok_embd, out_norm, output;
    bool has_mtp = false;
    LayerW mtp;                               // the MTP head's attention layer + FFN (blk.{n_layer}.*)
    DevTensor mtp_enorm, mtp_hnorm, mtp_eh_proj, mtp_head_norm;

    char* weights = nullptr;
    char* state = nullptr;
    char* ckpt = nullptr;
    char* scratch = nullptr;
    char* prefill_f16 = nullptr;  // the prefill's fp16 weights, where kept (keep_prefill_f16_weights)
    size_t weights_bytes = 0, kv_bytes = 0, gdn_bytes = 0, ckpt_bytes = 0, scratch_bytes = 0, prefill_f16_bytes = 0;

    // state arena
    float* ssm = nullptr;              // [n_gdn, n_v, 128, 128]
    float* conv[2] = {nullptr, nullptr};  // [n_gdn, 3, conv_dim] each
    char* kv = nullptr;                // [n_attn, K|V, n_kv, n_ctx, row bytes]
    size_t ssm_layer_floats = 0, conv_layer_floats = 0, kv_layer_half = 0;  // kv: bytes of K (or V) of a layer
    int conv_cur = 0;
    int n_past = 0;
    // A verify step (openjet_engine_verify) leaves the committed GDN state as it was and keeps what its
    // accepted rows need: `pending` rows await openjet_engine_accept, which replays them from the ring onto
    // the committed state (the same kernel on the same inputs: decode's bits) instead of a trunk replay.
    int pending = 0;
    // An operation failed on the GPU part way (GpuFailureWatch): the sequence is undefined (openjet_engine.h) until a
    // reset or a restore, and every other operation is refused instead of running on a half-updated state.
    bool broken = false;
    bool verifying = false;
    bool prefilling = false;  // inside openjet_engine_prefill: its GEMVs say so (GemvArgs::prefill)
    int attn_prefill_rows = 0, attn_prefill_keys = 0;  // the call's OPENJET_ATTN_PREFILL_ROWS / _KEYS (prefill_impl)
    // The last output projection (project_out) was added to h in its GEMM's epilogue: mix holds nothing to add.
    bool mix_added = false;
    // openjet_engine_prefill_checkpoint inside a chunk: every GDN layer's form-2 step also writes its state before
    // the chunk's row snap_row to checkpoint slot snap_slot (-1: none).
    int snap_slot = -1, snap_row = 0;
    float* ssm_shadow = nullptr;       // [n_gdn, n_v, 128, 128] the verify step's own GDN states (accept mode)
    float* ring_qkv = nullptr;         // [rings, n_gdn, T, conv_dim] the verify step's GDN inputs, by layer
    float* ring_b = nullptr;           // [rings, n_gdn, T, n_v]
    float* ring_a = nullptr;           // [rings, n_gdn, T, n_v]
    // OPENJET_GDN_REPLAY at create (gdn_replay_switch): unset or "fused" defers accept's GDN replay into the next
    // decode or verify step's GDN launches (GdnStepArgs::replay: the rows' own arithmetic, so the same bits; the replay
    // then costs a few rows of a launch that runs anyway instead of a launch per GDN layer, and a verify step writes no
    // shadow state); "accept", accept replays at once. Fused: two rings, a verify step writes ring_w while
    // the rows of the one before it may still wait in the other.
    bool replay_fused = false;
    // OPENJET_BENCH_SKIP_NORM_PACKS at create (a measurement, never for use: the outputs are WRONG): a decode step's
    // add-norm packs are not launched (1: the FFN's input norms, 2: every layer's two, 3: and the mixers' output
    // packs, 4: and the FFN's swiglu packs), so a benchmark shows what those pack boundaries of the 27B's step cost
    // (64 / 128 / 192 / 256: what folding the packs into the GEMVs could save).
    int bench_skip_norm_packs = 0;
    // OPENJET_BENCH_SKIP_SWIGLU_PACK=1 at create (a measurement, never for use: the outputs are WRONG): a decode step's
    // FFNs make no swiglu pack for their down projections (no pack launch, no own pack in gate / up: the plain
    // launches), so a benchmark shows the most an own pack without a meeting could gain at each T.
    bool bench_skip_swiglu_pack = false;
    // OPENJET_BENCH_GRAPH=1 at create (a measurement, not for use): a decode step's trunk is captured as a CUDA graph
    // and replayed while the state its launches depend on (TrunkKey) stays the same, a few kept (GraphCache):
    // what ~700 stream launches a step cost the GPU beyond their work (trunk_graph).
    bool bench_graph = false;
    // OPENJET_MTP_INPUT_PACK (unset or 1; 0: off) at create: the MTP head's embedding, its two input norms and their
    // pack in one launch (launch_mtp_input_pack) where it can, the same bits as the four launches (mtp_rows).
    bool mtp_input_pack = true;
    struct TrunkKey {  // (process-wide test knobs, such as kernels_test's GEMV tile choice, are not in it)
        int t, split, n_past, conv_cur, ring_w, replay_rows, attn_spread;  // split, n_past: trunk_key
        bool at_start, verifying;
        bool operator==(const TrunkKey& o) const {
            return t == o.t && split == o.split && n_past == o.n_past && conv_cur == o.conv_cur && ring_w == o.ring_w &&
                   replay_rows == o.replay_rows && attn_spread == o.attn_spread && at_start == o.at_start &&
                   verifying == o.verifying;
        }
    };
    // With OPENJET_BENCH_GRAPH=1 a whole greedy cycle (openjet_engine_cycle_greedy: drafts, verify, verdict, MTP
    // fill) is a graph too, keyed also by what the drafts read (the draft rows can move when they grow).
    struct CycleKey {
        TrunkKey trunk;
        int n_draft, n_valid, draft_n;
        const void* draft_rows;
        const void* draft_ids;
        bool operator==(const CycleKey& o) const {
            return trunk == o.trunk && n_draft == o.n_draft && n_valid == o.n_valid && draft_n == o.draft_n &&
                   draft_rows == o.draft_rows && draft_ids == o.draft_ids;
        }
    };
    // Eight of each kept (a decode's T=1 steps alternate two conv buffers; bench_cycle.py's rounds use four keys: a
    // cycle after a restore and one after its accept, at both conv buffer parities, which a restore keeps).
    GraphCache<TrunkKey, 8> trunk_graphs;
    GraphCache<CycleKey, 8> cycle_graphs;
    std::pair<double, long> enqueue{0.0, 0};  // decode steps' host time to enqueue their trunks (ms) and their count
    // OPENJET_ATTN_PIPE / OPENJET_ATTN_STAGES at create (attn_pipe_switch): AttnDecodeArgs::pipe and stages of every
    // attention launch (the chunk blocks' planned tile pipeline: on unless OPENJET_ATTN_PIPE=0).
    int attn_pipe = 0, attn_stages = 0;
    int ring_w = 0;
    int replay_rows = 0;  // accepted rows whose GDN replay is pending (their ring: kept_ring)
    float* verify_hidden = nullptr;    // [T, E] its hidden rows (the MTP head's next input)
    // openjet_engine_mtp_draft_greedy's outputs on the device: each step's h' [T, E], drafted id and its logit [T];
    // openjet_engine_mtp_draft_sampled's uniforms [T] and distributions [T, kTopKMax] (ids, probabilities, lengths);
    // openjet_engine_cycle_sampled's uniforms [2 T]: its n drafts', then its acceptance stream's n + 1
    float* draft_hidden = nullptr;
    int32_t* draft_pick = nullptr;
    float* draft_value = nullptr;
    double* draft_u = nullptr;
    int32_t* draft_q_ids = nullptr;
    double* draft_q_probs = nullptr;
    int* draft_q_len = nullptr;
    int32_t* cycle_out = nullptr;  // a device cycle's verdict (cycle_greedy / _sampled): [T] kept drafts, next token
    // [3]: that count, the cycle's token again for its verify rows after the drafts, the acceptance uniforms taken
    int* cycle_n = nullptr;
    // OPENJET_BENCH_GRAPH: the sequence's length on the device (pos_dev, set before each graph launch), which the
    // attention launches captured into a graph read (graph_positions: while capturing), so that a graph serves every
    // length its key covers (TrunkKey: the attention split, not the length).
    int* pos_dev = nullptr;
    bool graph_positions = false;
    // The MTP head's draft vocabulary (openjet_engine_set_draft_rows): rows of the lm_head it computes while
    // drafting, gathered from output.weight; none = every row. A buffer of its own, grown as rows are added.
    char* draft_rows = nullptr;
    int32_t* draft_ids = nullptr;      // device copy of the ids (the gather's input)
    int draft_n = 0, draft_cap = 0;
    // Per-phase profile (OPENJET_PROFILE=1 at create; openjet_engine_profile reads it): an event recorded on the
    // stream at every phase mark; after a call's sync the time between consecutive marks is added to the
    // earlier mark's phase. Off: one branch per mark.
    struct Profile {
        bool on = false;
        std::vector<cudaEvent_t> events;
        std::vector<const char*> labels;
        size_t used = 0;
        std::map<std::string, std::pair<double, long>> phases;  // ms, marks
        long calls = 0;
    } prof;
    std::vector<int> ckpt_n_past;      // -1: empty slot

    // scratch arena: kPrefillRows rows for the trunk's buffers (a prefill chunk), 8 for logits and the MTP head
    int32_t* ids = nullptr;
    float *h = nullptr, *a = nullptr, *big1 = nullptr, *big2 = nullptr, *big3 = nullptr, *sb = nullptr,
          *sa = nullptr, *y = nullptr, *mix = nullptr, *logits = nullptr, *attn_work = nullptr;
    size_t attn_work_floats = 0;  // its size: a T = 8 step's at the longest split
    size_t big2_floats = 0;       // big2's size (a prefill chunk's attention takes its tail as the workspace)
    ActPack x{};  // the next GEMV's activations
    // OPENJET_GEMV_INT at create (an experiment, a declared numerics change): 1: decode GEMVs of Q4_K weights run on
    // the integer GEMV (gemv_imma.cuh), 2: those of Q6_K weights too, each call's int pack made from x into this
    // scratch (GemvArgs::xi); 3: Q4_K, Q5_K and Q6_K calls on the integer pack the decode packs' makers write beside
    // the fp16 one under the row's scale (this scratch as e.x's twin, ActPack::imma: no pack launch a call; only the
    // cluster packs write it, so the fold, the swiglu's and the GDN step's own packs are off). Per weight type, so
    // every t takes the same path (T-invariance).
    int gemv_int = 0;
    int gemv_tma = 0;  // OPENJET_GEMV_TMA (read at create; gemv_tma_switch): GemvArgs::tma of decode calls
    void* xi = nullptr;
    // the sampler's top-k on the device (topk.cuh): T rows of values / ids, its work, the penalty list
    float* top_values = nullptr;
    int32_t* top_ids = nullptr;
    void* top_work = nullptr;
    int32_t* pen_ids = nullptr;
    float* pen_deltas = nullptr;
    // MTP: the trunk's last hidden row (kept across steps and in checkpoints) and the head's own last output h'
    // [E] (its scratch is the trunk's: mtp_rows).
    float *mtp_last = nullptr, *mtp_hp = nullptr;
    // Pinned host memory for a step's small outputs (top-k values and ids, hidden rows: StagedOutputs), so that their
    // copies do not hold the host. A copy to the caller's pageable memory returns only once the GPU has reached it,
    // and the step's MTP rows, enqueued after it, started only then: the T=5 trace at f96c0f1 (decode_top, H100)
    // shows the GPU idle 82.5 us between the top-k and the MTP rows.
    char* out_host = nullptr;
    size_t out_host_bytes = 0;

    ~openjet_engine() {
        for (cudaEvent_t ev : prof.events) cudaEventDestroy(ev);
        trunk_graphs.clear();
        cycle_graphs.clear();
        if (draft_rows) cudaFree(draft_rows);
        if (draft_ids) cudaFree(draft_ids);
        if (weights) cudaFree(weights);
        if (state) cudaFree(state);
        if (ckpt) cudaFree(ckpt);
        if (scratch) cudaFree(scratch);
        if (prefill_f16) cudaFree(prefill_f16);
        if (out_host) cudaFreeHost(out_host);
        if (stream) cudaStreamDestroy(stream);
    }

    int conv_dim() const { return (2 * cfg.ssm_n_k_heads + cfg.ssm_n_v_heads) * cfg.ssm_head_dim; }
    int d_inner() const { return cfg.ssm_n_v_heads * cfg.ssm_head_dim; }
    int q_dim() const { return cfg.n_head * cfg.head_dim; }
    int kv_dim() const { return cfg.n_head_kv * cfg.head_dim; }
    size_t kv_row_bytes() const { return cfg.kv_type == kKvF16 ? 512 : 272; }
    size_t output_row_bytes() const { return static_cast<size_t>(output.ne0) / block_elems(output.type) * block_bytes(output.type); }
    // The draft rows are gathered into output.weight's layout: in the tile layout (the default) the head is a
    // producer-warp GEMV as the lm_head is (the row layout takes the cp.async kernel: 79% of the copy rate on the H100,
    // fifty-first session), whole groups of 16 rows (draft_cap a multiple of 16), a row's units at the tile pitch.
    size_t draft_row_bytes() const { return output.device_bytes() / output.ne1; }
    int draft_groups_of(int rows) const {  // rows rounded up to whole groups where the draft rows are tiled
        return output.tiled ? (rows + kTileLayoutRows - 1) / kTileLayoutRows * kTileLayoutRows : rows;
    }
    size_t draft_bytes() const { return draft_cap ? static_cast<size_t>(draft_cap) * (draft_row_bytes() + 4) + 16 : 0; }
    // The lm_head the MTP head drafts with: the draft rows when set, else output.weight. In the tile layout its rows
    // are draft_n rounded up to a group: the logits past draft_n (of zeroed or stale rows) are never read (every
    // pick and copy of them takes draft_n).
    DevTensor draft_head() const {
        if (!draft_n) return output;
        DevTensor t = output;
        t.d = draft_rows, t.ne1 = draft_groups_of(draft_n);
        return t;
    }
};

namespace {

constexpr int kMaxCtx = 262144;    // Qwen3.8's trained context: the issue's limit, and the attention workspace's sizing
constexpr int kMaxVocab = 262144;  // topk.cu: pass 2 sorts 64 chunks' 32 keys of 4,096 logits

int check_config(const openjet_engine_config& c) {
    auto bad = [](const char* what, int v, const char* want) {
        return fail(OPENJET_ENGINE_ERR_MODEL, "config: %s = %d, expected %s", what, v, want);
    };
    // Upper bounds first: sizes below are int products of these (and n_layer sizes a host vector before any tensor
    // is looked at), so a hostile or corrupt config must not overflow them.
    if (c.n_embd < 256 || c.n_embd % 256 || c.n_embd > 65536)
        return bad("n_embd", c.n_embd, "a positive multiple of 256, at most 65536");
    if (c.n_ff < 256 || c.n_ff % 256 || c.n_ff > 262144) return bad("n_ff", c.n_ff, "a multiple of 256, 256..262144");
    if (c.n_layer < 1 || c.n_layer > 1024) return bad("n_layer", c.n_layer, "1..1024");
    if (c.n_head > 1024 || c.ssm_n_v_heads > 1024) return bad("n_head / ssm_n_v_heads", std::max(c.n_head,
                                                                 c.ssm_n_v_heads), "at most 1024");
    if (c.head_dim != kAttnHeadDim) return bad("head_dim", c.head_dim, "256");
    if (c.n_head_kv < 1 || c.n_head < c.n_head_kv || c.n_head % c.n_head_kv)
        return bad("n_head", c.n_head, "a positive multiple of n_head_kv");
    if (c.n_head / c.n_head_kv * OPENJET_ENGINE_MAX_T > kAttnMaxRows)
        return bad("n_head / n_head_kv", c.n_head / c.n_head_kv, "<= 8 (attention serves 64 rows per kv head)");
    if (c.n_rot < 2 || c.n_rot % 2 || c.n_rot > kAttnHeadDim) return bad("n_rot", c.n_rot, "even, 2..256");
    if (c.ssm_head_dim != kGdnHeadDim) return bad("ssm_head_dim", c.ssm_head_dim, "128");
    if (c.ssm_n_k_heads < 1 || c.ssm_n_v_heads < c.ssm_n_k_heads || c.ssm_n_v_heads % c.ssm_n_k_heads)
        return bad("ssm_n_v_heads", c.ssm_n_v_heads, "a positive multiple of ssm_n_k_heads");
    if (c.ssm_conv_kernel != kGdnConvTaps) return bad("ssm_conv_kernel", c.ssm_conv_kernel, "4");
    if (c.full_attn_interval < 1) return bad("full_attn_interval", c.full_attn_interval, ">= 1");
    if (c.n_vocab < 1 || c.n_vocab > kMaxVocab) return bad("n_vocab", c.n_vocab, "1..262144 (the device top-k's reach)");
    if (c.n_ctx < 1 || c.n_ctx > kMaxCtx) return bad("n_ctx", c.n_ctx, "1..262144 (the model's context)");
    if (c.kv_type != kKvF16 && c.kv_type != kKvQ8_0) return bad("kv_type", c.kv_type, "1 (F16) or 8 (Q8_0)");
    if (c.n_checkpoints < 0 || c.n_checkpoints > 64) return bad("n_checkpoints", c.n_checkpoints, "0..64");
    if (c.prefill_rows < 0 || c.prefill_rows > OPENJET_ENGINE_PREFILL_ROWS_MAX)
        return fail(OPENJET_ENGINE_ERR_MODEL, "config: prefill_rows = %d, expected 0 (the default) .. %d",
                    c.prefill_rows, OPENJET_ENGINE_PREFILL_ROWS_MAX);
    if (!(c.rms_eps > 0.0f) || !(c.rope_base > 0.0f))
        return fail(OPENJET_ENGINE_ERR_MODEL, "config: rms_eps and rope_base must be positive");
    return OPENJET_OK;
}

// Looks a tensor up and checks it: type among `types` (a -1 terminated list), ne = (ne0, ne1), byte size.
class TensorTable {
  public:
    TensorTable(const openjet_tensor_desc* t, int n) {
        for (int i = 0; i < n; ++i)
            if (t[i].name) map_[t[i].name] = &t[i];
    }
    bool has(const std::string& name) const { return map_.count(name) != 0; }
    int get(const std::string& name, const std::vector<int>& types, int64_t ne0, int64_t ne1, DevTensor& out) {
        auto it = map_.find(name);
        if (it == map_.end()) return fail(OPENJET_ENGINE_ERR_MODEL, "tensor %s is missing", name.c_str());
        const openjet_tensor_desc& d = *it->second;
        bool ok = false;
        for (int t : types) ok = ok || t == d.ggml_type;
        if (!ok) {
            std::string want;
            for (int t : types) want += std::string(want.empty() ? "" : ", ") + type_name(t);
            return fail(OPENJET_ENGINE_ERR_MODEL, "tensor %s is %s (type %d), this engine reads %s", name.c_str(),
                        type_name(d.ggml_type), d.ggml_type, want.c_str());
        }
        int64_t rows = 1;
        for (int i = 1; i < d.n_dims && i < 4; ++i) rows *= d.ne[i];
        if (d.n_dims < 1 || d.n_dims > 4 || d.ne[0] != ne0 || rows != ne1)
            return fail(OPENJET_ENGINE_ERR_MODEL, "tensor %s has ne [%lld, %lld], expected [%lld, %lld]", name.c_str(),
                        (long long)d.ne[0], (long long)rows, (long long)ne0, (long long)ne1);
        const int elems = block_elems(d.ggml_type), bb = block_bytes(d.ggml_type);
        if (ne0 % elems)
            return fail(OPENJET_ENGINE_ERR_MODEL, "tensor %s: ne0 = %lld is not a multiple of %s's %d", name.c_str(),
                        (long long)ne0, type_name(d.ggml_type), elems);
        if (d.ggml_type != kF32 && ne0 % kGemvUnit)
            return fail(OPENJET_ENGINE_ERR_MODEL, "tensor %s: ne0 = %lld is not a multiple of %d (the GEMV's unit)",
                        name.c_str(), (long long)ne0, kGemvUnit);
        const size_t bytes = static_cast<size_t>(ne1) * static_cast<size_t>(ne0 / elems) * bb;
        if (d.n_bytes != bytes || !d.data)
            return fail(OPENJET_ENGINE_ERR_MODEL, "tensor %s: %zu bytes at %p, expected %zu bytes", name.c_str(),
                        d.n_bytes, d.data, bytes);
        out.type = d.ggml_type;
        out.ne0 = ne0;
        out.ne1 = ne1;
        out.bytes = bytes;
        out.host = d.data;
        return OPENJET_OK;
    }

  private:
    std::unordered_map<std::string, const openjet_tensor_desc*> map_;
};

#define TRY(x)                       \
    do {                             \
        if (int s_ = (x)) return s_; \
    } while (0)

const std::vector<int> kVec = {kF32};
const std::vector<int> kMat = {kQ4_K, kQ5_K, kQ6_K, kQ8_0};

// attn_norm and the gated attention of layer prefix p ("blk.N.").
int bind_attention(TensorTable& tt, const std::string& p, openjet_engine& e, LayerW& L) {
    const auto& c = e.cfg;
    const int E = c.n_embd;
    TRY(tt.get(p + "attn_norm.weight", kVec, E, 1, L.attn_norm));
    TRY(tt.get(p + "attn_q.weight", kMat, E, 2 * e.q_dim(), L.wq));
    TRY(tt.get(p + "attn_k.weight", kMat, E, e.kv_dim(), L.wk));
    TRY(tt.get(p + "attn_v.weight", kMat, E, e.kv_dim(), L.wv));
    TRY(tt.get(p + "attn_q_norm.weight", kVec, c.head_dim, 1, L.q_norm));
    TRY(tt.get(p + "attn_k_norm.weight", kVec, c.head_dim, 1, L.k_norm));
    return tt.get(p + "attn_output.weight", kMat, e.q_dim(), E, L.wo);
}

int bind_ffn(TensorTable& tt, const std::string& p, const openjet_engine_config& c, LayerW& L) {
    const int E = c.n_embd;
    TRY(tt.get(p + "post_attention_norm.weight", kVec, E, 1, L.post_norm));
    TRY(tt.get(p + "ffn_gate.weight", kMat, E, c.n_ff, L.ffn_gate));
    TRY(tt.get(p + "ffn_up.weight", kMat, E, c.n_ff, L.ffn_up));
    return tt.get(p + "ffn_down.weight", kMat, c.n_ff, E, L.ffn_down);
}

int bind_weights(openjet_engine& e, const openjet_tensor_desc* tensors, int n) {
    TensorTable tt(tensors, n);
    const auto& c = e.cfg;
    const int E = c.n_embd;
    TRY(tt.get("token_embd.weight", {kQ4_K}, E, c.n_vocab, e.tok_embd));
    TRY(tt.get("output_norm.weight", kVec, E, 1, e.out_norm));
    TRY(tt.get("output.weight", kMat, E, c.n_vocab, e.output));
    e.layers.resize(c.n_layer);
    for (int il = 0; il < c.n_layer; ++il) {
        LayerW& L = e.layers[il];
        const std::string p = "blk." + std::to_string(il) + ".";
        L.attn = (il + 1) % c.full_attn_interval == 0;
        L.idx = L.attn ? e.n_attn++ : e.n_gdn++;
        if (L.attn) {
            TRY(bind_attention(tt, p, e, L));
        } else {
            TRY(tt.get(p + "attn_norm.weight", kVec, E, 1, L.attn_norm));
            const int nv = c.ssm_n_v_heads;
            TRY(tt.get(p + "attn_qkv.weight", kMat, E, e.conv_dim(), L.qkv));
            TRY(tt.get(p + "attn_gate.weight", kMat, E, e.d_inner(), L.gate));
            TRY(tt.get(p + "ssm_alpha.weight", {kF32, kQ4_K, kQ5_K, kQ6_K, kQ8_0}, E, nv, L.alpha));
            TRY(tt.get(p + "ssm_beta.weight", {kF32, kQ4_K, kQ5_K, kQ6_K, kQ8_0}, E, nv, L.beta));
            TRY(tt.get(p + "ssm_conv1d.weight", kVec, c.ssm_conv_kernel, e.conv_dim(), L.conv));
            TRY(tt.get(p + "ssm_dt.bias", kVec, nv, 1, L.dt_bias));
            TRY(tt.get(p + "ssm_a", kVec, nv, 1, L.ssm_a));
            TRY(tt.get(p + "ssm_norm.weight", kVec, c.ssm_head_dim, 1, L.ssm_norm));
            TRY(tt.get(p + "ssm_out.weight", kMat, e.d_inner(), E, L.ssm_out));
        }
        TRY(bind_ffn(tt, p, c, L));
    }
    const std::string p = "blk." + std::to_string(c.n_layer) + ".";
    e.has_mtp = tt.has(p + "nextn.eh_proj.weight");
    if (e.has_mtp) {
        LayerW& L = e.mtp;
        L.attn = true;
        L.idx = e.n_attn++;
        TRY(tt.get(p + "nextn.enorm.weight", kVec, E, 1, e.mtp_enorm));
        TRY(tt.get(p + "nextn.hnorm.weight", kVec, E, 1, e.mtp_hnorm));
        TRY(tt.get(p + "nextn.eh_proj.weight", kMat, 2 * E, E, e.mtp_eh_proj));
        TRY(tt.get(p + "nextn.shared_head_norm.weight", kVec, E, 1, e.mtp_head_norm));
        TRY(bind_attention(tt, p, e, L));
        TRY(bind_ffn(tt, p, c, L));
    }
    return OPENJET_OK;
}

template <class F> void for_each_tensor(openjet_engine& e, F f) {
    f(e.tok_embd);
    f(e.out_norm);
    f(e.output);
    auto layer = [&](LayerW& L) {
        for (DevTensor* t : {&L.attn_norm, &L.post_norm, &L.ffn_gate, &L.ffn_up, &L.ffn_down})
            f(*t);
        if (L.attn) {
            for (DevTensor* t : {&L.wq, &L.wk, &L.wv, &L.q_norm, &L.k_norm, &L.wo}) f(*t);
        } else {
            for (DevTensor* t : {&L.qkv, &L.gate, &L.alpha, &L.beta, &L.conv, &L.dt_bias, &L.ssm_a, &L.ssm_norm,
                                 &L.ssm_out})
                f(*t);
        }
    };
    for (LayerW& L : e.layers) layer(L);
    if (e.has_mtp) {
        layer(e.mtp);
        for (DevTensor* t : {&e.mtp_enorm, &e.mtp_hnorm, &e.mtp_eh_proj, &e.mtp_head_norm}) f(*t);
    }
}

int device_alloc(char** p, size_t bytes, const char* what) {
    const cudaError_t err = cudaMalloc(reinterpret_cast<void**>(p), bytes ? bytes : 1);
    if (err != cudaSuccess) {
        *p = nullptr;
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        return fail(OPENJET_ENGINE_ERR_DEVICE_MEMORY, "cudaMalloc of %.1f MiB for the %s failed (%s); %.1f MiB free of %.1f MiB",
                    bytes / 1048576.0, what, cudaGetErrorName(err), free_b / 1048576.0, total_b / 1048576.0);
    }
    return OPENJET_OK;
}

// OPENJET_PREFILL_F16_WEIGHTS at create: unset or `auto`, the dense prefill path's fp16 weights are made once here and
// kept where they fit beside everything else with a reserve left (1/16 of the device, at least 2 GiB: the draft
// vocabulary's rows and the CUDA libraries allocate later), so that a prefill multiplies them without dequantising
// every projection at every call (the same bits: the same kernel writes them); `1`: kept or create fails; `0`: never.
// The 27B's are ~49 GB: an 80 GB or larger card; never a 24 GB one. Each projection the dense path takes, the FFN's
// gate and up of one type as one [2n, k] matrix of interleaved rows (launch_ffn_gate_up_pack's epilogue layout).
int keep_prefill_f16_weights(openjet_engine& e) {
    const char* v = std::getenv("OPENJET_PREFILL_F16_WEIGHTS");
    const bool forced = v && std::strcmp(v, "1") == 0;
    if (v && !forced && std::strcmp(v, "0") != 0 && std::strcmp(v, "auto") != 0)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "OPENJET_PREFILL_F16_WEIGHTS=%s: expected 0, 1 or auto", v);
    if (v && std::strcmp(v, "0") == 0) return OPENJET_OK;
    if (!e.wdense) {
        if (forced)
            return fail(OPENJET_ERR_INVALID_ARGUMENT, "OPENJET_PREFILL_F16_WEIGHTS=1: this engine has no dense prefill "
                        "GEMM (it needs compute capability 9.0 and a 90a build with CUTLASS); unset it");
        return OPENJET_OK;
    }
    struct Kept { DevTensor* w; DevTensor* up; };  // up: w is the FFN's gate, the two interleaved
    std::vector<Kept> kept;
    std::vector<const DevTensor*> paired;
    auto ffn = [&](LayerW& L) {
        const DevTensor &g = L.ffn_gate, &u = L.ffn_up;
        if (g.type == u.type && g.ne0 == u.ne0 && g.ne1 == u.ne1 &&
            prefill_dense_takes(g.type, static_cast<int>(2 * g.ne1), static_cast<int>(g.ne0))) {
            kept.push_back({&L.ffn_gate, &L.ffn_up});
            paired.push_back(&L.ffn_gate), paired.push_back(&L.ffn_up);
        }
    };
    for (LayerW& L : e.layers) ffn(L);
    if (e.has_mtp) ffn(e.mtp);
    for_each_tensor(e, [&](DevTensor& t) {
        const bool projection = &t != &e.output && &t != &e.tok_embd;
        if (projection && std::find(paired.begin(), paired.end(), &t) == paired.end() &&
            prefill_dense_takes(t.type, static_cast<int>(t.ne1), static_cast<int>(t.ne0)))
            kept.push_back({&t, nullptr});
    });
    const auto halves_of = [](const Kept& m) { return static_cast<size_t>(m.up ? 2 : 1) * m.w->ne0 * m.w->ne1; };
    size_t halves = 0;
    for (const Kept& m : kept) halves += halves_of(m);
    const size_t bytes = halves * sizeof(__half);
    size_t free_b = 0, total_b = 0;
    CHECK(cudaMemGetInfo(&free_b, &total_b));
    const size_t reserve = std::max<size_t>(size_t(2) << 30, total_b / 16);
    if (!bytes) return OPENJET_OK;
    if (bytes + reserve > free_b) {
        if (!forced) return OPENJET_OK;
        return fail(OPENJET_ENGINE_ERR_DEVICE_MEMORY, "OPENJET_PREFILL_F16_WEIGHTS=1: the prefill's fp16 weights need "
                    "%.1f MiB and %.1f MiB stay free for later allocations, but %.1f MiB are free: unset it",
                    bytes / 1048576.0, reserve / 1048576.0, free_b / 1048576.0);
    }
    TRY(device_alloc(&e.prefill_f16, bytes, "prefill fp16 weights"));
    e.prefill_f16_bytes = bytes;
    __half* at = reinterpret_cast<__half*>(e.prefill_f16);
    float* norms = e.ffn_norms;  // 2 floats a kept gate and up: one pair a layer at most
    for (const Kept& m : kept) {
        const long long k = m.w->ne0, ld = m.up ? 2 * k : k;
        for (DevTensor* t : {m.w, m.up}) {
            if (!t) continue;
            GemvArgs a{};
            a.qtype = t->type, a.w = t->d, a.n = static_cast<int>(t->ne1), a.k = static_cast<int>(t->ne0);
            a.tiled = t->tiled;
            t->w16 = at + (t == m.up ? k : 0), t->ld16 = ld;
            const cudaError_t err = launch_dequant_f16(a, t->w16, ld, e.stream);
            if (err != cudaSuccess) return cuda_fail(err, "launch_dequant_f16 (prefill fp16 weights)");
        }
        if (m.up) {  // the FFN's bounded form: the pack's order and the norms (launch_ffn_gate_up_pack)
            const cudaError_t err = launch_gate_up_pack_order(m.w->w16, static_cast<int>(m.w->ne1),
                                                              static_cast<int>(k), norms, e.stream);
            if (err != cudaSuccess) return cuda_fail(err, "launch_gate_up_pack_order (prefill fp16 weights)");
            m.w->w16_norms = norms;
            norms += 2;
        }
        at += halves_of(m);
    }
    for (LayerW& L : e.layers) {  // the GDN output's bounded pack: W_z's largest row norm, max |ssm_norm|
        if (L.attn || !L.gate.w16 || L.ssm_norm.type != kF32) continue;
        const cudaError_t err = launch_row_norm_max(L.gate.w16, static_cast<int>(L.gate.ne1),
                                                    static_cast<int>(L.gate.ne0), L.gate.ld16, e.row_scale, e.stream);
        if (err != cudaSuccess) return cuda_fail(err, "launch_row_norm_max (prefill fp16 weights)");
        CHECK(cudaMemcpyAsync(&L.z_norm_max, e.row_scale, sizeof(float), cudaMemcpyDeviceToHost, e.stream));
        // The norm's weights from the device copy: the caller's host pages are no longer ours (create's upload).
        std::vector<float> w(static_cast<size_t>(L.ssm_norm.ne0 * L.ssm_norm.ne1));
        CHECK(cudaMemcpyAsync(w.data(), L.ssm_norm.d, w.size() * sizeof(float), cudaMemcpyDeviceToHost, e.stream));
        CHECK(cudaStreamSynchronize(e.stream));
        L.norm_w_max = 0.0f;
        for (const float v : w) L.norm_w_max = std::max(L.norm_w_max, std::fabs(v));
    }
    CHECK(cudaStreamSynchronize(e.stream));
    return OPENJET_OK;
}

// An experiment's level from the environment (read at create): a single digit 1..max, else 0 (off; CudaEngine.load
// refuses other values before the library sees them).
int env_level(const char* name, int max) {
    const char* f = std::getenv(name);
    return f && f[0] >= '1' && f[0] <= '0' + max && !f[1] ? f[0] - '0' : 0;
}

// OPENJET_GEMV_TMA (read at create): unset or "auto", decode GEMVs on the producer-warp kernel where it runs
// (gemv_tma.cuh: a 90a build on a 9.0 GPU; the same bits, its form chosen by t: -1); "0" the cp.async kernels; "1" ..
// "4" one of its forms for every t (gemv_tma.cu). CudaEngine.load refuses other values.
int gemv_tma_switch() {
    const char* v = std::getenv("OPENJET_GEMV_TMA");
    return !v || std::strcmp(v, "auto") == 0 ? -1 : env_level("OPENJET_GEMV_TMA", kGemvTmaForms);
}

// OPENJET_GDN_REPLAY (read at create; openjet_engine::replay_fused): unset or "fused" (the default since 2026-12-05: on
// the H200 at 499afb1 accept 0.38 -> 0.018 ms, a one-call greedy cycle with 4 drafts 11.26 -> 10.96 ms), the next
// decode or verify step's GDN launches replay the kept rows first; "accept", accept replays them at once. Other values
// are refused.
int gdn_replay_switch(bool* fused) {
    const char* v = std::getenv("OPENJET_GDN_REPLAY");
    *fused = !v || !*v || std::strcmp(v, "fused") == 0;
    if (*fused || std::strcmp(v, "accept") == 0) return OPENJET_OK;
    return fail(OPENJET_ERR_INVALID_ARGUMENT, "OPENJET_GDN_REPLAY=%s: expected accept or fused", v);
}

// OPENJET_WEIGHT_LAYOUT (read at create): unset or "tiles", every GEMV weight that has a tile layout (a k-quant
// type, rows a multiple of 16; not the token embedding, which is read by row) is stored in it (weight_layout.cuh):
// the decode GEMV mix runs ~6% faster in it (H200, 27B: T=1 step 10.54 -> 10.06 ms in one run,
// bench/results/engine-full-h200-ba6cec0-layout-*.json), and every reader takes either layout with the same bits;
// "rows": the GGUF's row layout throughout (bisecting). Other values are refused.
int weight_layout_tiles(bool* tiles) {
    const char* v = std::getenv("OPENJET_WEIGHT_LAYOUT");
    *tiles = !v || !*v || std::strcmp(v, "tiles") == 0;
    if (*tiles || std::strcmp(v, "rows") == 0) return OPENJET_OK;
    return fail(OPENJET_ERR_INVALID_ARGUMENT, "OPENJET_WEIGHT_LAYOUT=%s: expected tiles or rows", v);
}

// Tensor t's GGUF bytes (host) into its place in the tile layout, through `stage` (stage_bytes of device memory: the
// scratch arena, unused during create) in chunks of whole groups of 16 rows, each moved by launch_tile_layout.
int upload_tiled(openjet_engine& e, DevTensor& t, char* stage, size_t stage_bytes) {
    const int n = static_cast<int>(t.ne1), k = static_cast<int>(t.ne0);
    const size_t group_bytes = t.bytes / n * kTileLayoutRows;  // 16 rows of the row layout
    const int chunk_groups = static_cast<int>(std::min<size_t>(stage_bytes / group_bytes, n / kTileLayoutRows));
    if (chunk_groups < 1)
        return fail(OPENJET_ENGINE_ERR_DEVICE_MEMORY, "tensor of %d x %d: %zu bytes of scratch stage fewer than one "
                    "group of 16 rows (%zu bytes)", n, k, stage_bytes, group_bytes);
    const size_t tile_group_bytes = static_cast<size_t>(tile_layout_bytes(t.type, kTileLayoutRows, k));
    for (int g0 = 0; g0 < n / kTileLayoutRows; g0 += chunk_groups) {
        const int groups = std::min(chunk_groups, n / kTileLayoutRows - g0);
        // stream order: this copy waits for the previous chunk's move out of the stage
        CHECK(cudaMemcpyAsync(stage, static_cast<const char*>(t.host) + g0 * group_bytes, groups * group_bytes,
                              cudaMemcpyHostToDevice, e.stream));
        char* dst = const_cast<char*>(static_cast<const char*>(t.d)) + g0 * tile_group_bytes;
        const cudaError_t err = launch_tile_layout(stage, dst, t.type, groups * kTileLayoutRows, k, e.stream);
        if (err != cudaSuccess) return cuda_fail(err, "launch_tile_layout (weight upload)");
    }
    CHECK(cudaStreamSynchronize(e.stream));
    return OPENJET_OK;
}

// Largest attention workspace over every position of the cache at T = 8 (the split depends on n_past).
size_t attn_work_floats_max(const openjet_engine& e, int spread) {
    int max_chunks = 1;
    for (int n_past = 0; n_past < e.cfg.n_ctx; ++n_past) {
        const int ck = attn_chunk_keys(n_past, e.cfg.n_head_kv, e.sm_count * spread);
        const int nc = attn_n_chunks(n_past, OPENJET_ENGINE_MAX_T, ck);
        if (nc > max_chunks) max_chunks = nc;
    }
    return attn_decode_work_floats(e.cfg.n_head, OPENJET_ENGINE_MAX_T, max_chunks);
}

size_t ckpt_slot_bytes(const openjet_engine& e);
size_t ckpt_ssm_bytes(const openjet_engine& e);
char* ckpt_slot(const openjet_engine& e, int slot);
float* ckpt_mtp_row(const openjet_engine& e, int slot);
int save_checkpoint(openjet_engine& e, int slot);
int replay_now(openjet_engine& e);

void plan_folds(openjet_engine& e);

int create_impl(openjet_engine& e, const openjet_tensor_desc* tensors, int n_tensors) {
    const auto& c = e.cfg;
    TRY(check_config(c));
    e.prefill_rows = c.prefill_rows ? c.prefill_rows : OPENJET_ENGINE_PREFILL_ROWS;
    TRY(bind_weights(e, tensors, n_tensors));

    int n_dev = 0;
    CHECK(cudaGetDeviceCount(&n_dev));
    if (c.device < 0 || c.device >= n_dev)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "device %d: %d CUDA device(s) visible", c.device, n_dev);
    CHECK(cudaSetDevice(c.device));
    CHECK(cudaDeviceGetAttribute(&e.sm_count, cudaDevAttrMultiProcessorCount, c.device));

    // Sizes of the four arenas.
    bool tiles = true;
    TRY(weight_layout_tiles(&tiles));
    size_t off = 0;
    for_each_tensor(e, [&](DevTensor& t) {
        const int n = static_cast<int>(t.ne1), k = static_cast<int>(t.ne0);
        t.tiled = tiles && &t != &e.tok_embd && tile_layout_fits(t.type, n, k);
        t.offset = off;
        off = align_up(off + t.device_bytes() + 16);  // +16: the GEMV may read to the next 16-byte boundary
    });
    e.weights_bytes = off;
    // Row buffers hold a prefill chunk or a step's T rows, whichever is more (prefill_rows may be 1..7: a step of 8
    // rows must still fit, e.g. a verify of 7 drafts or truncate's replay of decoded tokens).
    const int T = OPENJET_ENGINE_MAX_T, R = e.scratch_rows = std::max(e.prefill_rows, T);
    e.ssm_layer_floats = static_cast<size_t>(c.ssm_n_v_heads) * kGdnHeadDim * kGdnHeadDim;
    e.conv_layer_floats = static_cast<size_t>(kGdnConvTaps - 1) * e.conv_dim();
    e.kv_layer_half = static_cast<size_t>(c.n_head_kv) * c.n_ctx * e.kv_row_bytes();
    const size_t ssm_b = align_up(sizeof(float) * e.ssm_layer_floats * e.n_gdn);
    const size_t conv_b = align_up(sizeof(float) * e.conv_layer_floats * e.n_gdn);
    e.kv_bytes = align_up(2 * e.kv_layer_half * e.n_attn);
    e.gdn_bytes = ssm_b + 2 * conv_b;
    e.ckpt_bytes = static_cast<size_t>(c.n_checkpoints) * ckpt_slot_bytes(e);

    const size_t E = c.n_embd;
    const size_t kmax = std::max({E, (size_t)c.n_ff, (size_t)e.d_inner(), (size_t)e.q_dim(), e.has_mtp ? 2 * E : E});
    const size_t big1 = std::max({(size_t)e.conv_dim(), (size_t)2 * e.q_dim(), (size_t)c.n_ff, 2 * E});  // 2E: mtp_rows
    const size_t big2 = std::max({(size_t)e.d_inner(), (size_t)e.kv_dim(), (size_t)c.n_ff});
    const size_t ybuf = std::max((size_t)e.d_inner(), (size_t)e.q_dim());
    if (const char* f = std::getenv("OPENJET_GDN_FUSED")) e.gdn_fused = std::strcmp(f, "0") != 0;  // bisecting bits
    if (const char* f = std::getenv("OPENJET_GDN_STEP_PACK")) e.gdn_step_pack = std::strcmp(f, "0") != 0;
    if (const char* f = std::getenv("OPENJET_GDN_STAGED")) e.gdn_staged = std::strcmp(f, "0") != 0;
    if (const char* f = std::getenv("OPENJET_GDN_LATE")) e.gdn_late = std::strcmp(f, "0") != 0;
    if (const char* f = std::getenv("OPENJET_GEMV_GROUP")) e.gemv_group = std::strcmp(f, "0") != 0;
    if (const char* f = std::getenv("OPENJET_ATTN_OWN_PACK")) e.attn_own_pack = std::strcmp(f, "0") != 0;
    if (env_level("OPENJET_BENCH_GDN_PROBE", 1)) e.gdn_probe = gdn_probe_buffer();
    if (const char* f = std::getenv("OPENJET_FOLD")) e.fold = std::strcmp(f, "0") != 0;
    e.fold_rows = env_level("OPENJET_FOLD_ROWS", 1) == 1;
    e.swiglu_rows = env_level("OPENJET_SWIGLU_ROWS", 1) == 1;
    if (std::getenv("OPENJET_SWIGLU_SELF")) e.swiglu_self = env_level("OPENJET_SWIGLU_SELF", 1);
    e.ffn_persistent = env_level("OPENJET_FFN_PERSISTENT", 4);
    e.ffn_tma = env_level("OPENJET_FFN_TMA", 4);
    // (the persistent FFN makes no fold; a prefill, which cannot tell which layers it takes, then takes none either)
    if (e.ffn_persistent || e.ffn_tma) e.fold = false;
    if (const char* f = std::getenv("OPENJET_PERSISTENT_SMS")) e.persistent_sms = std::max(0, std::atoi(f));
    e.gemv_int = env_level("OPENJET_GEMV_INT", 3);
    if (e.gemv_int == 3) {  // the makers of the twin: the cluster packs alone
        if (e.ffn_persistent || e.ffn_tma)
            return fail(OPENJET_ERR_INVALID_ARGUMENT, "OPENJET_GEMV_INT=3 takes no persistent FFN (its packs have no "
                        "integer twin); unset OPENJET_FFN_PERSISTENT / OPENJET_FFN_TMA");
        for (const size_t k : {E, (size_t)c.n_ff, (size_t)e.d_inner(), (size_t)e.q_dim(), e.has_mtp ? 2 * E : 0})
            if (k && !pack_cluster_writes_imma(static_cast<int>(k)))
                return fail(OPENJET_ERR_INVALID_ARGUMENT, "OPENJET_GEMV_INT=3: rows of %zu cannot take the cluster "
                            "packs that write the integer pack (they need a 9.0 GPU and OPENJET_PACK_CLUSTER unset "
                            "or 2); unset it", k);
        e.gdn_step_pack = false, e.swiglu_self = 0;
    }
    e.gemv_tma = gemv_tma_switch();
    TRY(gdn_replay_switch(&e.replay_fused));
    e.bench_skip_norm_packs = env_level("OPENJET_BENCH_SKIP_NORM_PACKS", 4);
    e.bench_skip_swiglu_pack = env_level("OPENJET_BENCH_SKIP_SWIGLU_PACK", 1) == 1;
    if (const char* f = std::getenv("OPENJET_BENCH_GRAPH")) e.bench_graph = std::strcmp(f, "1") == 0;
    if (const char* f = std::getenv("OPENJET_MTP_INPUT_PACK")) e.mtp_input_pack = std::strcmp(f, "0") != 0;
    attn_pipe_switch(&e.attn_pipe, &e.attn_stages);
    const size_t rings = e.replay_fused ? 2 : 1;  // verify steps' GDN input rings
    if (const char* sp = std::getenv("OPENJET_ATTN_SPREAD")) {
        e.attn_spread_cap = std::min(kMaxAttnSpread, std::max(1, std::atoi(sp)));
        e.attn_spread = std::min(kDefaultAttnSpread, e.attn_spread_cap);
    }
    size_t dense_halves = 0;
    if (prefill_gemm_dense()) {  // asked for, or the default where it runs (gemv_mma.cuh, prefill_gemm_choice)
        if (!dense_gemm_available())
            return fail(OPENJET_ERR_INVALID_ARGUMENT, "OPENJET_PREFILL_GEMM=dense: this library has no dense prefill GEMM "
                        "for this GPU (it needs compute capability 9.0 and a build for 90a with CUTLASS's headers: "
                        "scripts/fetch_cutlass.py); unset it for the default");
        for_each_tensor(e, [&](DevTensor& t) {
            const bool projection = &t != &e.output && &t != &e.tok_embd;  // lm_head: decode's GEMV; embedding: a gather
            if (projection && prefill_dense_takes(t.type, static_cast<int>(t.ne1), static_cast<int>(t.ne0)))
                dense_halves = std::max(dense_halves, static_cast<size_t>(t.ne0 * t.ne1));
        });
        for (const LayerW& L : e.layers)  // gate and up in one GEMM (launch_ffn_gate_up_pack): both matrices
            if (L.ffn_gate.type == L.ffn_up.type && prefill_dense_takes(L.ffn_gate.type, 2 * c.n_ff, c.n_embd))
                dense_halves = std::max(dense_halves, static_cast<size_t>(2) * c.n_ff * c.n_embd);
    }
    size_t gdn_chunk_floats = 0;
    if (gdn_chunked_form() == 2 && e.n_gdn)
        gdn_chunk_floats = gdn_chunk_scratch_floats(c.ssm_n_k_heads, c.ssm_n_v_heads, R);
    const size_t work = e.n_attn ? attn_work_floats_max(e, e.attn_spread_cap) : 1;
    e.attn_work_floats = work;
    e.big2_floats = R * big2;
    const size_t big1_bytes = align_up(sizeof(float) * R * big1 + 16);
    struct Part { void** p; size_t bytes; };
    const Part parts[] = {
        {(void**)&e.ids, sizeof(int32_t) * R},
        {(void**)&e.h, sizeof(float) * R * E},
        {(void**)&e.a, sizeof(float) * R * E},
        {(void**)&e.x.h, sizeof(__half) * R * kmax},
        {(void**)&e.x.sum, sizeof(__half) * R * (kmax / kActBlock) * 2},
        {(void**)&e.x.inv, sizeof(float) * R},
        // big1 then big2 in one part (set below): from big1 on, a prefill's [t, 2 n_ff] gate and up outputs fit
        {(void**)&e.big1, big1_bytes + sizeof(float) * R * big2},
        {(void**)&e.big3, sizeof(float) * R * e.kv_dim()},
        {(void**)&e.sb, sizeof(float) * R * c.ssm_n_v_heads},
        {(void**)&e.sa, sizeof(float) * R * c.ssm_n_v_heads},
        {(void**)&e.y, sizeof(float) * R * ybuf},
        {(void**)&e.mix, sizeof(float) * R * E},
        {(void**)&e.logits, sizeof(float) * T * c.n_vocab},
        {(void**)&e.attn_work, sizeof(float) * work},
        {(void**)&e.top_values, sizeof(float) * T * kTopKMax},
        {(void**)&e.top_ids, sizeof(int32_t) * T * kTopKMax},
        {(void**)&e.top_work, topk_work_bytes(T, c.n_vocab)},
        {(void**)&e.pen_ids, sizeof(int32_t) * c.n_vocab},
        {(void**)&e.pen_deltas, sizeof(float) * c.n_vocab},
        {(void**)&e.mtp_last, e.has_mtp ? sizeof(float) * E : 0},
        {(void**)&e.mtp_hp, e.has_mtp ? sizeof(float) * E : 0},
        // speculation (verify / accept) only with the MTP head that drafts
        {(void**)&e.ssm_shadow, e.has_mtp && !e.replay_fused ? sizeof(float) * e.ssm_layer_floats * e.n_gdn : 0},
        {(void**)&e.ring_qkv, e.has_mtp ? sizeof(float) * rings * e.n_gdn * T * e.conv_dim() : 0},
        {(void**)&e.ring_b, e.has_mtp ? sizeof(float) * rings * e.n_gdn * T * c.ssm_n_v_heads : 0},
        {(void**)&e.ring_a, e.has_mtp ? sizeof(float) * rings * e.n_gdn * T * c.ssm_n_v_heads : 0},
        {(void**)&e.verify_hidden, e.has_mtp ? sizeof(float) * T * E : 0},
        {(void**)&e.draft_hidden, e.has_mtp ? sizeof(float) * T * E : 0},
        {(void**)&e.draft_pick, e.has_mtp ? sizeof(int32_t) * T : 0},
        {(void**)&e.draft_value, e.has_mtp ? sizeof(float) * T : 0},
        {(void**)&e.draft_u, e.has_mtp ? sizeof(double) * 2 * T : 0},
        {(void**)&e.draft_q_ids, e.has_mtp ? sizeof(int32_t) * T * kTopKMax : 0},
        {(void**)&e.draft_q_probs, e.has_mtp ? sizeof(double) * T * kTopKMax : 0},
        {(void**)&e.draft_q_len, e.has_mtp ? sizeof(int) * T : 0},
        {(void**)&e.cycle_out, e.has_mtp ? sizeof(int32_t) * T : 0},
        {(void**)&e.cycle_n, e.has_mtp ? sizeof(int) * 3 : 0},
        {(void**)&e.pos_dev, sizeof(int)},
        {(void**)&e.ffn_counters, sizeof(int) * ffn_persistent_scratch_ints(c.n_ff)},
        {(void**)&e.ffn_profile, sizeof(unsigned long long) * kFfnProfileSlots},
        {(void**)&e.gdn_pack_sync, e.gdn_step_pack ? sizeof(GdnPackSync) : 0},
        {(void**)&e.attn_pack_sync, e.attn_own_pack ? sizeof(AttnPackSync) : 0},
        {(void**)&e.grid_meet, e.swiglu_self ? sizeof(GridMeet) : 0},
        {(void**)&e.fold_rows_sync, e.fold_rows ? sizeof(FoldRowsSync) : 0},
        {(void**)&e.swiglu_rows_sync, e.swiglu_rows ? sizeof(SwigluRowsSync) : 0},
        {(void**)&e.wdense, sizeof(__half) * dense_halves},
        {(void**)&e.ffn_norms, sizeof(float) * 2 * (c.n_layer + 1)},
        {(void**)&e.row_scale, sizeof(float) * 2 * R},
        {(void**)&e.gdn_chunk_scratch, sizeof(float) * gdn_chunk_floats},
        {(void**)&e.xi, e.gemv_int ? static_cast<size_t>(act_pack_imma_bytes(T, static_cast<int>(kmax))) : 0},
    };
    size_t scratch_off[sizeof(parts) / sizeof(parts[0])];
    e.scratch_bytes = 0;
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); ++i) {
        scratch_off[i] = e.scratch_bytes;
        e.scratch_bytes = align_up(e.scratch_bytes + parts[i].bytes + 16);
    }

    // Check before allocating.
    const size_t need = e.weights_bytes + e.kv_bytes + e.gdn_bytes + e.ckpt_bytes + e.scratch_bytes;
    size_t free_b = 0, total_b = 0;
    CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (need > free_b) {
        // What fits instead: the context each KV format leaves room for beside the rest (whose attention workspace
        // shrinks a little with the context: the figures are a floor), and what the checkpoints hold.
        const size_t rest = need - e.kv_bytes;
        auto ctx_fits = [&](size_t row_bytes) -> long long {
            const size_t per_token = 2 * static_cast<size_t>(c.n_head_kv) * row_bytes * e.n_attn;
            return free_b > rest && per_token ? static_cast<long long>(std::min<size_t>((free_b - rest) / per_token,
                                                                                       kMaxCtx)) : 0;
        };
        return fail(OPENJET_ENGINE_ERR_DEVICE_MEMORY,
                    "the engine needs %.1f MiB on device %d (weights %.1f, KV cache %.1f at n_ctx %d, recurrent "
                    "state %.1f, checkpoints %.1f, scratch %.1f) but %.1f MiB are free of %.1f MiB. What fits: "
                    "n_ctx up to %lld with the F16 KV cache, up to %lld with Q8_0 (with %d checkpoints, which take "
                    "%.1f MiB)",
                    need / 1048576.0, c.device, e.weights_bytes / 1048576.0, e.kv_bytes / 1048576.0, c.n_ctx,
                    e.gdn_bytes / 1048576.0, e.ckpt_bytes / 1048576.0, e.scratch_bytes / 1048576.0,
                    free_b / 1048576.0, total_b / 1048576.0, ctx_fits(512), ctx_fits(272), c.n_checkpoints,
                    e.ckpt_bytes / 1048576.0);
    }

    CHECK(cudaStreamCreateWithFlags(&e.stream, cudaStreamNonBlocking));
    TRY(device_alloc(&e.weights, e.weights_bytes, "weights"));
    TRY(device_alloc(&e.state, e.kv_bytes + e.gdn_bytes, "KV cache and recurrent state"));
    if (e.ckpt_bytes) TRY(device_alloc(&e.ckpt, e.ckpt_bytes, "checkpoints"));
    TRY(device_alloc(&e.scratch, e.scratch_bytes, "scratch"));
    e.out_host_bytes = staged_output_bytes(T, c.n_embd);
    if (const cudaError_t err = cudaHostAlloc(reinterpret_cast<void**>(&e.out_host), e.out_host_bytes,
                                              cudaHostAllocDefault); err != cudaSuccess) {
        e.out_host = nullptr;
        return cuda_fail(err, "cudaHostAlloc (pinned host memory for a step's outputs)");
    }

    // Upload (synchronous copies from the caller's host pages, e.g. the memory-mapped file; the tile layout's through
    // the scratch arena, not in use yet).
    int status = OPENJET_OK;
    for_each_tensor(e, [&](DevTensor& t) {
        t.d = e.weights + t.offset;
        if (status == OPENJET_OK) {
            if (t.tiled) {
                status = upload_tiled(e, t, e.scratch, e.scratch_bytes);
            } else {
                const cudaError_t err = cudaMemcpy(const_cast<void*>(t.d), t.host, t.bytes, cudaMemcpyHostToDevice);
                if (err != cudaSuccess) status = cuda_fail(err, "cudaMemcpy (weight upload)");
            }
        }
        t.host = nullptr;  // the caller's memory is not ours after create
    });
    TRY(status);

    e.ssm = reinterpret_cast<float*>(e.state);
    e.conv[0] = reinterpret_cast<float*>(e.state + ssm_b);
    e.conv[1] = reinterpret_cast<float*>(e.state + ssm_b + conv_b);
    e.kv = e.state + e.gdn_bytes;
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); ++i) *parts[i].p = e.scratch + scratch_off[i];
    e.big2 = reinterpret_cast<float*>(reinterpret_cast<char*>(e.big1) + big1_bytes);
    if (!dense_halves) e.wdense = nullptr;  // no dense prefill GEMM: its calls see no scratch
    if (!gdn_chunk_floats) e.gdn_chunk_scratch = nullptr;
    {  // the dense GEMM's weights hold ~43 K keys of the 27B; the chunked GDN's ~36 K at 2,048-row chunks, ~9 K at 512
        const size_t dense_b = dense_halves * sizeof(__half), gdn_b = gdn_chunk_floats * sizeof(float);
        e.attn_f16_rows = dense_b >= gdn_b ? reinterpret_cast<char*>(e.wdense)
                                           : reinterpret_cast<char*>(e.gdn_chunk_scratch);
        if (e.attn_f16_rows && e.n_attn)
            e.attn_f16_capacity = static_cast<int>(
                std::min<size_t>(std::max(dense_b, gdn_b) / attn_prefill_f16_bytes(c.n_head_kv, 1), 1 << 30));
    }
    e.x.rows = R;
    if (e.gemv_int == 3) e.x.imma = e.xi;  // (cleared while a prefill runs: Prefilling)
    // The plain uploads ran on the legacy stream, whose DMA may still be in flight when cudaMemcpy returns (pageable
    // memory), and e.stream is non-blocking (not ordered with it): wait for them, then clear and prepare on e.stream,
    // so that the zeroing cannot land after the FFN profile's marker or keep_prefill_f16_weights's row norms.
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemsetAsync(e.state, 0, e.kv_bytes + e.gdn_bytes, e.stream));
    CHECK(cudaMemsetAsync(e.scratch, 0, e.scratch_bytes, e.stream));
    CHECK(ffn_profile_reset(e.ffn_profile, e.stream));
    TRY(keep_prefill_f16_weights(e));
    e.ckpt_n_past.assign(c.n_checkpoints, -1);
    const char* prof = std::getenv("OPENJET_PROFILE");
    e.prof.on = prof && *prof && std::strcmp(prof, "0") != 0;
    e.n_past = 0;
    e.conv_cur = 0;
    plan_folds(e);
    CHECK(cudaDeviceSynchronize());
    return OPENJET_OK;
}

// A phase mark of the profile (nothing when it is off): what runs on the stream from here to the next mark
// is counted as `label`.
void mark(openjet_engine& e, const char* label) {
    auto& p = e.prof;
    if (!p.on) return;
    if (p.used == p.events.size()) {
        cudaEvent_t ev = nullptr;
        if (cudaEventCreate(&ev) != cudaSuccess) {
            cudaGetLastError();
            p.on = false;  // no events: no profile, the engine runs on
            return;
        }
        p.events.push_back(ev);
        p.labels.push_back(nullptr);
    }
    if (cudaEventRecord(p.events[p.used], e.stream) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    p.labels[p.used++] = label;
}

// After the stream's sync: the marks' intervals into the totals.
void collect_profile(openjet_engine& e) {
    auto& p = e.prof;
    if (!p.on || !p.used) return;
    mark(e, "end");
    cudaEventSynchronize(p.events[p.used - 1]);
    for (size_t i = 0; i + 1 < p.used; ++i) {
        float ms = 0.0f;
        if (cudaEventElapsedTime(&ms, p.events[i], p.events[i + 1]) == cudaSuccess) {
            auto& slot = p.phases[p.labels[i]];
            slot.first += ms;
            slot.second += 1;
        }
    }
    cudaGetLastError();
    p.used = 0;
    p.calls += 1;
}

// (gemv_args_as: as a prefill's call or a decode step's, whichever the engine is in now)
GemvArgs gemv_args_as(const openjet_engine& e, bool prefill, const DevTensor& w, int t, const float* xf, float* y) {
    GemvArgs a{w.type, w.d, static_cast<int>(w.ne1), static_cast<int>(w.ne0), t, e.x, xf, y,
               prefill, prefill && &w != &e.output ? e.wdense : nullptr};
    a.tiled = w.tiled;
    if (a.dense) a.w16 = w.w16, a.ld16 = w.ld16, a.w16_norms = w.w16_norms;
    if (!prefill && e.gemv_int <= 2 && (w.type == kQ4_K ? e.gemv_int >= 1 : w.type == kQ6_K && e.gemv_int >= 2))
        a.xi = e.xi;
    if (!prefill) a.tma = e.gemv_tma, a.grid_sms = e.persistent_sms;
    return a;
}
GemvArgs gemv_args(const openjet_engine& e, const DevTensor& w, int t, const float* xf, float* y) {
    return gemv_args_as(e, e.prefilling, w, t, xf, y);
}

int gemv(openjet_engine& e, const DevTensor& w, int t, const float* xf, float* y) {
    const cudaError_t err = launch_gemv(gemv_args(e, w, t, xf, y), e.stream);
    if (err != cudaSuccess) return cuda_fail(err, "gemv");
    return OPENJET_OK;
}

// Two projections of the same activations (one launch where they share type and k: launch_gemv_pair).
int gemv_pair(openjet_engine& e, const DevTensor& wa, float* ya, const DevTensor& wb, float* yb, int t,
              const float* xf) {
    const cudaError_t err = launch_gemv_pair(gemv_args(e, wa, t, xf, ya), gemv_args(e, wb, t, xf, yb), e.stream);
    if (err != cudaSuccess) return cuda_fail(err, "gemv_pair");
    return OPENJET_OK;
}

// The fold's buffers (OPENJET_FOLD): A adds its delta to h in place and leaves u = h w in u and the norm's partials in
// e.mix, which holds no delta (the fold added it) and is next written by the output projection after B. u: e.a for the
// FFN-input norm (the layer's input norm there, which the mixer has read), e.y for the next layer's input norm (the
// mixer's output, written after its input projections: B writes that norm's rows into e.a itself). norm_w: the norm's
// weights.
GemvFold fold_args(const openjet_engine& e, const float* norm_w, float* u) {
    GemvFold f;
    f.h = e.h, f.h_out = e.h, f.w = norm_w, f.u = u, f.part = reinterpret_cast<float4*>(e.mix);
    f.u_in = u, f.part_in = reinterpret_cast<const float4*>(e.mix), f.eps = e.cfg.rms_eps;
    f.rows = e.fold_rows ? e.fold_rows_sync : nullptr;  // (B at more than one row: OPENJET_FOLD_ROWS)
    return f;
}

// Whether an add-norm (its weights norm) is the fold in a decode or verify step (OPENJET_FOLD): the integer GEMV off,
// the norm's weights F32, and the output projection out before it (n_embd rows: A, the fold's epilogue) and the pair
// b0 / b1 after it (B, reading the fold; b1 on the pack b0 leaves where the two cannot share a launch: fold_in) on the
// producer-warp GEMV in types the fold takes. The same answer in a prefill, whose add-norm then takes the fold's
// numerics (launch_fold_add_norm_pack) so that it leaves a decode step's bits. (The persistent FFN turns the fold off
// at create; the benchmark's skipped packs take none: the callers check.)
bool fold_fits(const openjet_engine& e, const DevTensor& norm, const DevTensor& out, const DevTensor& b0,
               const DevTensor& b1) {
    if (!e.fold || e.gemv_int || norm.type != kF32) return false;
    const auto decode_args = [&e](const DevTensor& w) { return gemv_args_as(e, false, w, 1, nullptr, nullptr); };
    const GemvArgs a = decode_args(out), in0 = decode_args(b0), in1 = decode_args(b1);
    return a.n == e.cfg.n_embd && gemv_fold_takes(a, false) && gemv_fold_takes(in0, true) &&
           gemv_tma_takes(in1, nullptr);
}

// Each trunk layer's LayerW::fold_ffn_in (its FFN-input add-norm: the mixer's out projection, then gate / up) and
// fold_next_in (the next layer's input add-norm: this layer's down projection, then that layer's first two input
// projections, wq / wk or qkv / gate; u in e.y, fold_args; not after the last layer: the output norm and the MTP
// head's input norms stay add-norms), and the MTP head's fold_ffn_in and fold_next_in (its head norm, before the draft
// head). Everything fold_fits asks is fixed at create, so a step asks nothing.
void plan_folds(openjet_engine& e) {
    const auto& c = e.cfg;
    const bool next_fits = std::max(e.d_inner(), e.q_dim()) >= c.n_embd;  // (e.y holds u)
    for (int il = 0; il < c.n_layer; ++il) {
        LayerW& L = e.layers[il];
        L.fold_ffn_in = fold_fits(e, L.post_norm, L.attn ? L.wo : L.ssm_out, L.ffn_gate, L.ffn_up);
        if (il + 1 < c.n_layer && next_fits) {
            const LayerW& N = e.layers[il + 1];
            L.fold_next_in = fold_fits(e, N.attn_norm, L.ffn_down, N.attn ? N.wq : N.qkv, N.attn ? N.wk : N.gate);
        }
    }
    // The MTP head's FFN-input norm in a draft step (mtp_rows; u in e.y, which its attention's pack has read), and its
    // head norm (fold_next_in: the down projection, then the draft head alone, in output.weight's type and layout as
    // the draft rows are; u in e.y again)
    e.mtp.fold_ffn_in = e.has_mtp && next_fits && fold_fits(e, e.mtp.post_norm, e.mtp.wo, e.mtp.ffn_gate,
                                                           e.mtp.ffn_up);
    e.mtp.fold_next_in = e.has_mtp && next_fits && fold_fits(e, e.mtp_head_norm, e.mtp.ffn_down, e.output, e.output);
}

// B of the fold f: a and b (and c), matrices of the same input, reading it in one launch where they can (one type; or,
// with OPENJET_GEMV_GROUP, a group); else (two types: a Q4_K_M's Q6_K qkv beside its Q4_K gate) a reads the fold and
// leaves its pack in e.x, which b then reads; c last, on that pack.
cudaError_t fold_in(openjet_engine& e, const GemvArgs& a, const GemvArgs& b, GemvFold f, const GemvArgs* c = nullptr) {
    if (e.gemv_group && gemv_tma_group_takes(a, b, c)) {
        f.pack_out = e.x;
        const cudaError_t err = launch_gemv_fold_group(a, b, c, f, e.stream);
        if (err != cudaErrorNotSupported) return err;  // (else one by one, below)
    }
    cudaError_t err = cudaSuccess;
    if (gemv_tma_takes(a, &b)) {
        err = launch_gemv_fold(a, &b, f, true, false, e.stream);
    } else {
        f.pack_out = e.x;
        err = launch_gemv_fold(a, nullptr, f, true, false, e.stream);
        if (err == cudaSuccess) err = launch_gemv(b, e.stream);
    }
    return err != cudaSuccess || !c ? err : launch_gemv(*c, e.stream);
}

// A mixer's input projections (of the layer's input norm), wa and wb, then wc where given: on its pack e.x (a
// gemv_pair, or with OPENJET_GEMV_GROUP a group launch where it takes them), or, where the layer before's down
// projection made that norm's fold (fold_input), reading the fold, which also leaves the pack in e.x and the normed
// rows in e.a for the projections and the GDN step after it.
int input_projections(openjet_engine& e, const DevTensor& wa, float* ya, const DevTensor& wb, float* yb, int t,
                      const DevTensor* wc = nullptr, float* yc = nullptr) {
    const GemvArgs a = gemv_args(e, wa, t, e.a, ya), b = gemv_args(e, wb, t, e.a, yb);  // (e.a: F32 rows only)
    const GemvArgs c = wc ? gemv_args(e, *wc, t, e.a, yc) : GemvArgs{};
    const GemvArgs* third = wc ? &c : nullptr;
    if (e.fold_input) {
        e.fold_input = false;
        GemvFold f = fold_args(e, nullptr, e.y);
        f.a_out = e.a, f.pack_out = e.x;
        if (const cudaError_t err = fold_in(e, a, b, f, third)) return cuda_fail(err, "input projections (fold)");
        return OPENJET_OK;
    }
    if (!e.prefilling && e.gemv_group && gemv_tma_group_takes(a, b, third)) {
        const cudaError_t err = launch_gemv_tma_group(a, b, third, nullptr, e.stream);
        if (err == cudaSuccess) return OPENJET_OK;
        if (err != cudaErrorNotSupported) return cuda_fail(err, "input projections (group)");
    }
    cudaError_t err = launch_gemv_pair(a, b, e.stream);
    if (err == cudaSuccess && third) err = launch_gemv(c, e.stream);
    if (err != cudaSuccess) return cuda_fail(err, "input projections");
    return OPENJET_OK;
}

// A mixer's or the FFN's output projection of t rows, which the next add-norm adds to the residual stream h (the
// trunk's, or the MTP head's u, which is h too): into e.mix, or, where the call's dense GEMM can add it
// (OPENJET_PREFILL_RESIDUAL, the default; prefill_gemm_adds), into h in the GEMM's epilogue: the same bits, the
// delta neither written nor read back. The next add-norm adds mix_delta(e).
int project_out(openjet_engine& e, const DevTensor& w, int t, const ActPack* x = nullptr) {
    GemvArgs a = gemv_args(e, w, t, nullptr, e.h);
    if (x) a.x = *x;
    if (e.fold_norm) {  // OPENJET_FOLD: the delta added to h in the tiles' epilogue, with the norm's u and partials
        GemvFold f = fold_args(e, e.fold_norm, e.fold_u);
        if (e.swiglu_g) {  // OPENJET_SWIGLU_ROWS (ffn): its input, the swiglu pack, made by its own blocks
            f.swiglu_g = e.swiglu_g, f.swiglu_u = e.swiglu_u, f.swiglu_rows = e.swiglu_rows_sync;
            e.swiglu_g = e.swiglu_u = nullptr;
        }
        const cudaError_t err = launch_gemv_fold(a, nullptr, f, false, true, e.stream);
        if (err != cudaSuccess) return cuda_fail(err, "project_out (fold)");
        e.fold_norm = nullptr, e.mix_added = false;  // (the caller sees the fold ran)
        return OPENJET_OK;
    }
    a.add_to_y = true;
    e.mix_added = e.prefilling && prefill_gemm_adds(a);  // (a decode step asks nothing: no environment read)
    if (!e.mix_added) a.add_to_y = false, a.y = e.mix;
    const cudaError_t err = launch_gemv(a, e.stream);
    if (err != cudaSuccess) return cuda_fail(err, "project_out");
    return OPENJET_OK;
}
const float* mix_delta(const openjet_engine& e) { return e.mix_added ? nullptr : e.mix; }

// Layer L's FFN after its norm's pack e.x (folded: after the fold's out projection, its gate / up reading the fold:
// fold_args): ffn_down's input silu(gate x) * (up x) packed into e.x
// (launch_ffn_gate_up_pack: a prefill's in one GEMM, whose [t, 2 n_ff] output big1 and big2 hold together: one
// allocation, create), or, on the kept fp16 rows where ffn_down takes the dense path, as the bounded form's fp16 rows
// in big1 with their row factors (the dense GEMM reads no sums: e.x's stand in), then the output projection.
int ffn(openjet_engine& e, const LayerW& L, int t, bool folded = false, float* folded_u = nullptr) {
    const GemvArgs gate = gemv_args(e, L.ffn_gate, t, nullptr, e.big1);
    const GemvArgs up = gemv_args(e, L.ffn_up, t, nullptr, e.big2);
    float* const u = folded_u ? folded_u : e.a;  // (the fold's u: the trunk's in e.a, the MTP head's in e.y)
    const bool skip_pack = !e.prefilling && e.bench_skip_swiglu_pack;  // a measurement: wrong outputs
    if (!e.prefilling && e.swiglu_self && !skip_pack && gemv_swiglu_takes(gate, up) && !gate.xi) {
        // OPENJET_SWIGLU_SELF: gate / up pack their own swiglu into e.x (one token row: gemv_swiglu_takes)
        GemvFold f = folded ? fold_args(e, nullptr, u) : GemvFold{};
        f.swiglu_pack = e.x, f.meet = e.grid_meet;
        if (const cudaError_t err = launch_gemv_swiglu(gate, up, f, folded, e.stream))
            return cuda_fail(err, "ffn gate/up (the swiglu's own pack)");
        return project_out(e, L.ffn_down, t);
    }
    if (folded) {
        if (const cudaError_t err = fold_in(e, gate, up, fold_args(e, nullptr, u)))
            return cuda_fail(err, "ffn gate/up (fold)");
        if (!skip_pack && e.swiglu_rows && t > 1 && e.fold_norm && !e.prefilling)
            e.swiglu_g = gate.y, e.swiglu_u = up.y;  // OPENJET_SWIGLU_ROWS: the down projection packs (project_out)
        else if (!skip_pack)
            CHECK(launch_swiglu_pack(gate.y, up.y, t, gate.n, e.x, e.stream));
        return project_out(e, L.ffn_down, t);
    }
    if (skip_pack || (!e.prefilling && e.bench_skip_norm_packs >= 4)) {  // a measurement, wrong outputs: no swiglu pack
        const cudaError_t err = launch_gemv_pair(gate, up, e.stream);
        if (err != cudaSuccess) return cuda_fail(err, "ffn gate/up");
        return project_out(e, L.ffn_down, t);
    }
    const bool direct = e.prefilling && prefill_dense_runs(gemv_args(e, L.ffn_down, t, nullptr, e.h));
    const FfnHalfOut half{reinterpret_cast<__half*>(e.big1), e.row_scale, e.row_scale + e.x.rows, direct};
    bool wrote_half = false;
    const cudaError_t err = launch_ffn_gate_up_pack(gate, up, e.x, e.stream, &half, &wrote_half);
    if (err != cudaSuccess) return cuda_fail(err, "ffn_gate_up_pack");
    const ActPack down_x{half.h, e.x.sum, half.inv, e.x.rows};
    return project_out(e, L.ffn_down, t, wrote_half ? &down_x : nullptr);
}

// Attention mixes a step's token rows in sub-steps of up to 8 (its kernels take at most 8 rows and give a row
// the same bits whatever its sub-step; the GDN step loops over such sub-steps itself), while every projection
// reads its weights once for all t rows (the GEMV's groups of 8).
constexpr int kSubRows = OPENJET_ENGINE_MAX_T;
static_assert(OPENJET_ENGINE_PREFILL_ROWS_MAX <= kActMaxRows && OPENJET_ENGINE_MAX_T == kActRows,
              "the activation pack holds a prefill chunk; a decode step is one GEMV group");
static_assert(OPENJET_ENGINE_PREFILL_ROWS_MAX <= kGdnMaxRows && OPENJET_ENGINE_MAX_T <= kGdnMaxT &&
                  OPENJET_ENGINE_MAX_T <= kAttnMaxT && kSubRows <= kAttnMaxCallT,
              "one GDN step takes a chunk, one attention call a step");

// The GDN step's arguments that depend only on the layer (weights, its committed state).
GdnStepArgs gdn_layer_args(const openjet_engine& e, const LayerW& L) {
    const auto& c = e.cfg;
    GdnStepArgs g{};
    g.n_k = c.ssm_n_k_heads, g.n_v = c.ssm_n_v_heads, g.eps = c.rms_eps;
    g.conv_w = static_cast<const float*>(L.conv.d);
    g.ssm_a = static_cast<const float*>(L.ssm_a.d);
    g.dt_bias = static_cast<const float*>(L.dt_bias.d);
    g.norm_w = static_cast<const float*>(L.ssm_norm.d);
    g.state = e.ssm + e.ssm_layer_floats * L.idx;
    return g;
}

// Where a verify step keeps GDN layer L's inputs (its T rows of qkv, beta and alpha): accept replays them.
struct GdnRing {
    float *qkv, *b, *alpha;
};
// The ring holding the accepted rows whose replay is pending: the last verify step's (accept flipped ring_w past it
// with the fused replay; accept mode has one ring).
int kept_ring(const openjet_engine& e) { return e.replay_fused ? e.ring_w ^ 1 : e.ring_w; }

// Ring `which` (0, or 1 with the fused replay); by default the one the next verify step writes.
GdnRing gdn_ring(const openjet_engine& e, const LayerW& L, int which = -1) {
    const size_t rows = (static_cast<size_t>(which < 0 ? e.ring_w : which) * e.n_gdn + L.idx) * OPENJET_ENGINE_MAX_T;
    const size_t n_v = e.cfg.ssm_n_v_heads;
    return {e.ring_qkv + rows * e.conv_dim(), e.ring_b + rows * n_v, e.ring_a + rows * n_v};
}

// OPENJET_BENCH_SKIP_NORM_PACKS=3 (a measurement with wrong outputs): a decode step's mixer output packs skipped too.
bool skip_out_pack(const openjet_engine& e) { return !e.prefilling && e.bench_skip_norm_packs >= 3; }

// The GDN mixer of layer L: a (packed in e.x, float in e.a) -> e.mix. One step over all t rows (the kernel takes
// them in sub-steps of 8, the state held on chip between them): it reads conv buffer conv_cur and writes the
// other; the caller flips conv_cur once all layers ran.
// Whether a GDN step of t rows projects beta and alpha inside the step (F32 weights, a decode or verify step).
bool gdn_fuses(const openjet_engine& e, const LayerW& L, int t) {
    return e.gdn_fused && L.beta.type == kF32 && L.alpha.type == kF32 && t <= kSubRows &&
           !(e.prefilling && (e.gdn_chunk_scratch || prefill_f32_own()));
}

// out_proj false: the mixer's output stays in e.y, unpacked and unprojected (the persistent FFN's tail does both).
// in_proj false: the input projections are already in their buffers (the persistent FFN before did them; the
// caller has checked that this step fuses the beta and alpha projections: gdn_fuses).
int gdn_mixer(openjet_engine& e, const LayerW& L, int t, bool out_proj = true, bool in_proj = true) {
    const auto& c = e.cfg;
    // A verify step (t <= 8) keeps its inputs in the ring (ring_w) and writes its states to the shadow (accept mode).
    const GdnRing in = e.verifying ? gdn_ring(e, L) : GdnRing{e.big1, e.sb, e.sa};
    float *qkv = in.qkv, *b = in.b, *alpha = in.alpha;
    // F32 beta and alpha (the usual case) of a decode or verify step are projected inside the step (GdnStepArgs:
    // two launches fewer per layer, the same bits); a prefill chunk (many sub-steps, where the step's projections
    // would stall each one) or another type takes the GEMV.
    // A prefill with the two-phase chunked GDN never fuses: every prefill row takes the chunked form (gdn_chunked).
    const bool fused = gdn_fuses(e, L, t);
    // The bounded pack of the output (OPENJET_GDN_PACK_BOUND, the default; where W_z's rows are kept): its row scales
    // from the layer's input pack e.x, which the step's pack overwrites only after the projections read it.
    const bool bound = e.prefilling && in_proj && out_proj && L.z_norm_max >= 0.0f && gdn_pack_bound() &&
                       prefill_numerics_own();
    if (in_proj) {
        mark(e, "gdn.in_proj");
        if (bound)
            CHECK(launch_gdn_out_scale(e.x, c.n_embd, t, L.z_norm_max, L.norm_w_max, e.row_scale, e.stream));
        TRY(input_projections(e, L.qkv, qkv, L.gate, e.big2, t));
    }
    if (!fused) TRY(gemv_pair(e, L.beta, b, L.alpha, alpha, t, e.a));
    mark(e, "gdn.step");
    GdnStepArgs g = gdn_layer_args(e, L);
    if (e.replay_rows) {  // the kept rows of the verify step before (fused replay): first, in this launch
        const GdnRing kept = gdn_ring(e, L, kept_ring(e));
        g.replay = e.replay_rows, g.replay_qkv = kept.qkv, g.replay_b = kept.b, g.replay_alpha = kept.alpha;
    }
    // A verify step commits only the replayed rows (fused: in place, so no shadow), or (accept mode) none.
    if (e.verifying && e.replay_fused) g.commit = g.replay;
    else if (e.verifying) g.state_out = e.ssm_shadow + e.ssm_layer_floats * L.idx;
    g.t = t;
    g.qkv = qkv, g.z = e.big2, g.b = b, g.alpha = alpha;
    g.staged = e.gdn_staged;
    g.late_launch = e.gdn_late;
    g.probe = e.gdn_probe;
    if (fused) {
        g.w_beta = static_cast<const float*>(L.beta.d), g.w_alpha = static_cast<const float*>(L.alpha.d);
        g.proj_k = c.n_embd, g.x_in = e.a;
        if (e.verifying) g.b_out = b, g.alpha_out = alpha;  // the logits kept in the ring, where accept's replay reads them
    }
    g.conv_state_in = e.conv[e.conv_cur] + e.conv_layer_floats * L.idx;
    g.conv_state_out = e.conv[e.conv_cur ^ 1] + e.conv_layer_floats * L.idx;
    g.y = e.y;
    if (e.prefilling) g.chunk_scratch = e.gdn_chunk_scratch;
    if (e.snap_slot >= 0) {
        char* slot = ckpt_slot(e, e.snap_slot);
        g.snap_state = reinterpret_cast<float*>(slot) + e.ssm_layer_floats * L.idx;
        g.snap_conv = reinterpret_cast<float*>(slot + ckpt_ssm_bytes(e)) + e.conv_layer_floats * L.idx;
        g.snap_row = e.snap_row;
    }
    // A prefill's gated norm packs y for the out projection in the same pass where it runs apart from the step and
    // OPENJET_GDN_NORM_PACK=1 (launch_gdn_step; the same bits): e.x, the layer's input pack, was read above.
    // OPENJET_GDN_STEP_PACK: the step packs y itself (launch_gdn_step: a call of at most 8 rows whose blocks the GPU
    // holds at once; else the pack launch below).
    if (e.gdn_step_pack && out_proj && !bound && !skip_out_pack(e)) g.pack_sync = e.gdn_pack_sync;
    bool packed = false;
    CHECK(launch_gdn_step(g, e.stream, (e.prefilling || g.pack_sync) && out_proj ? &e.x : nullptr, &packed,
                          bound ? e.row_scale : nullptr));
    if (!out_proj) return OPENJET_OK;
    mark(e, "gdn.out_proj");
    if (!packed && !skip_out_pack(e)) CHECK(launch_pack_act(e.y, t, e.d_inner(), nullptr, 0.0f, e.x, e.stream));
    return project_out(e, L.ssm_out, t);
}

// Rows of the next attention launch from position n_past (left: rows still to go): a sub-step of up to 8, and
// the following sub-steps with it while their split is the same (attn_chunk_keys at each sub-step's start: then
// every row gets the bits its own 8-row launch gives it), the launch takes them (kAttnMaxCallT) and their
// partials fit work_floats: decode's workspace (sized for an 8-row step at the longest split) or, for a prefill
// chunk, big2's tail (attn_mixer).
int attn_group_rows(const openjet_engine& e, int n_past, int left, int sm_count, size_t work_floats) {
    const auto& c = e.cfg;
    const int ck = attn_chunk_keys(n_past, c.n_head_kv, sm_count);
    int rows = std::min(kSubRows, left);
    while (rows < left && rows + kSubRows <= kAttnMaxCallT &&
           attn_chunk_keys(n_past + rows, c.n_head_kv, sm_count) == ck) {
        const int more = std::min(kSubRows, left - rows);
        if (attn_decode_work_floats(c.n_head, rows + more, attn_n_chunks(n_past, rows + more, ck)) > work_floats)
            break;
        rows += more;
    }
    return rows;
}

// What every attention launch of layer L shares: the shapes, norms, RoPE and the layer's cache.
AttnDecodeArgs attn_args(const openjet_engine& e, const LayerW& L, int rope_offset) {
    const auto& c = e.cfg;
    AttnDecodeArgs a{};
    a.kv_type = c.kv_type, a.n_head = c.n_head, a.n_kv = c.n_head_kv;
    a.rope_offset = rope_offset;
    a.capacity = c.n_ctx, a.n_rot = c.n_rot, a.eps = c.rms_eps, a.rope_base = c.rope_base;
    a.q_norm = static_cast<const float*>(L.q_norm.d);
    a.k_norm = static_cast<const float*>(L.k_norm.d);
    a.k_cache = e.kv + 2 * e.kv_layer_half * L.idx;
    a.v_cache = a.k_cache + e.kv_layer_half;
    a.pipe = e.attn_pipe, a.stages = e.attn_stages;
    return a;
}

// The cache length n_past an attention launch is made for; while a graph is captured, also read on the device at
// its offset from the sequence's (AttnDecodeArgs::pos), so that a replay runs at the length of its own step.
void set_length(const openjet_engine& e, AttnDecodeArgs& a, int n_past) {
    a.n_past = n_past;
    if (e.graph_positions) a.pos = e.pos_dev, a.pos_delta = n_past - e.n_past;
}

// How a prefill's attention runs (OPENJET_PREFILL_ATTN, read at each prefill call), where the prefill has numerics
// of its own (else always kPairs, decode's bits): kFlash (default) attn_prefill.cuh, every row of every prefill
// call; "chunks": decode's kernel with q and the probabilities as single fp16 (AttnDecodeArgs::hi_only; 2,048-row
// chunk on the H200: attn.core 49.6 -> 47.3 ms, bench/results/engine-full-h200-13e6b67-chunked-fast.json); "pairs":
// decode's kernel and numerics.
enum class PrefillAttn { kFlash, kChunks, kPairs };
PrefillAttn prefill_attn(int kv_type) {
    const char* v = std::getenv("OPENJET_PREFILL_ATTN");
    if (!prefill_numerics_own() || (v && std::strcmp(v, "pairs") == 0)) return PrefillAttn::kPairs;
    if ((v && std::strcmp(v, "chunks") == 0) || !attn_prefill_fits(kv_type)) return PrefillAttn::kChunks;
    return PrefillAttn::kFlash;
}

// The attention mixer of layer L for cache rows n_past.. (RoPE positions n_past + rope_offset ..): a -> e.mix;
// appends k, v to the layer's cache (in sub-steps of 8: each attends to the rows before it; attn_group_rows
// merges sub-steps into one launch where that keeps every bit).
int attn_mixer(openjet_engine& e, const LayerW& L, int t, int n_past, int rope_offset, bool out_proj = true,
               bool in_proj = true) {
    // The MTP head's attention counts in the profile as the head's (mtp.fill or mtp.draft.attn), not the trunk's.
    const auto phase = [&](const char* label) { if (&L != &e.mtp) mark(e, label); };
    if (in_proj) {  // (false: done by the persistent FFN before, as gdn_mixer's)
        phase("attn.in_proj");
        TRY(input_projections(e, L.wq, e.big1, L.wk, e.big2, t, &L.wv, e.big3));
    }
    phase("attn.core");
    AttnDecodeArgs a = attn_args(e, L, rope_offset);
    a.work = e.attn_work, a.sm_count = e.sm_count * e.attn_spread;
    const PrefillAttn form = e.prefilling ? prefill_attn(a.kv_type) : PrefillAttn::kPairs;
    a.hi_only = form == PrefillAttn::kChunks;
    if (form == PrefillAttn::kFlash) {  // query rows per flash block: unset, the kernel's choice; the same bits
        a.prefill_rows = e.attn_prefill_rows;  // (read and checked by prefill_impl before any layer ran)
        a.prefill_keys = e.attn_prefill_keys;  // keys per tile: 0, the kernel's choice (numerics)
        // OPENJET_ATTN_PREFILL_F16 (unset or 1, the default): a Q8_0 cache's keys as fp16 rows once per call (the
        // same bits), in the scratch chosen at create (the Q8_0 kernel where the call's rows exceed its capacity)
        if (attn_prefill_f16_switch() && a.kv_type == kKvQ8_0)
            a.f16_rows = e.attn_f16_rows, a.f16_capacity = e.attn_f16_capacity;
    }
    size_t work_floats = e.attn_work_floats;
    // A prefill chunk's q rows or partials go to big2's tail, past the chunk's k rows, where it is larger (no bit
    // depends on where they lie): big2 is a chunk's FFN width, so the launches grow with the chunk.
    const size_t k_floats = (static_cast<size_t>(t) * e.kv_dim() + 63) / 64 * 64;
    if ((t > kSubRows || form == PrefillAttn::kFlash) && e.big2_floats > k_floats &&
        e.big2_floats - k_floats > work_floats)
        a.work = e.big2 + k_floats, work_floats = e.big2_floats - k_floats;
    // Flash: as many rows per launch as their q rows fit the workspace (a row's bits do not depend on it).
    const size_t flash_rows = work_floats / attn_prefill_work_floats(e.cfg.n_head, 1);
    // OPENJET_ATTN_OWN_PACK: the combine packs o for the out projection where the step's rows take one launch
    const bool own_pack = e.attn_own_pack && !e.prefilling && out_proj && !skip_out_pack(e);
    bool packed = false;
    for (int r0 = 0; r0 < t;) {
        const int rows = form == PrefillAttn::kFlash ? static_cast<int>(std::min<size_t>(t - r0, flash_rows))
                                                     : attn_group_rows(e, n_past + r0, t - r0, a.sm_count, work_floats);
        if (rows < 1) CHECK(cudaErrorInvalidValue);  // never: decode's workspace alone holds 8 rows' q
        a.t = rows;
        set_length(e, a, n_past + r0);
        a.qproj = e.big1 + static_cast<long long>(r0) * 2 * e.q_dim();
        a.k = e.big2 + static_cast<long long>(r0) * e.kv_dim(), a.v = e.big3 + static_cast<long long>(r0) * e.kv_dim();
        a.o = e.y + static_cast<long long>(r0) * e.q_dim();
        if (own_pack && r0 == 0 && rows == t) a.pack_out = e.x, a.pack_sync = e.attn_pack_sync;
        CHECK(form == PrefillAttn::kFlash ? launch_attn_prefill(a, e.stream)
                                          : launch_attn_decode_packed(a, e.stream, &packed));
        r0 += rows;
    }
    if (!out_proj) return OPENJET_OK;  // as gdn_mixer's
    phase("attn.out_proj");
    if (!skip_out_pack(e) && !packed) CHECK(launch_pack_act(e.y, t, e.q_dim(), nullptr, 0.0f, e.x, e.stream));
    return project_out(e, L.wo, t);
}

// Layer L's cache rows n_past.. of t rows whose attention input is packed in e.x: k (normed, rotated) and v,
// stored exactly as attn_mixer's launch stores them (the prep kernel's kv blocks). Filling a cache needs no q, no
// attention and no output projection.
int attn_store_kv(openjet_engine& e, const LayerW& L, int t, int n_past, int rope_offset) {
    TRY(gemv(e, L.wk, t, e.a, e.big2));  // gemv_pair(wq, wk)'s k blocks do what this launch's do: the same bits
    TRY(gemv(e, L.wv, t, e.a, e.big3));
    AttnDecodeArgs a = attn_args(e, L, rope_offset);
    a.t = t, a.k = e.big2, a.v = e.big3;
    set_length(e, a, n_past);
    CHECK(launch_attn_store_kv(a, e.stream));
    return OPENJET_OK;
}

// The persistent FFN's arguments for layer L's FFN (the post-attention add-norm of h += e.mix, gate / up, the swiglu
// pack, down into e.mix) of a decode step of t rows: what the trunk's layers and the MTP head share.
FfnPersistentArgs ffn_launch_args(const openjet_engine& e, const LayerW& L, int t) {
    const auto& c = e.cfg;
    FfnPersistentArgs f;
    f.t = t, f.n_embd = c.n_embd, f.n_ff = c.n_ff, f.eps = c.rms_eps;
    f.h = e.h, f.mix_in = e.mix, f.post_norm = static_cast<const float*>(L.post_norm.d), f.x = e.x;
    f.gu_type = L.ffn_gate.type == L.ffn_up.type ? L.ffn_gate.type : -1, f.down_type = L.ffn_down.type;
    f.gate = L.ffn_gate.d, f.up = L.ffn_up.d, f.down = L.ffn_down.d, f.tiled = L.ffn_gate.tiled;
    f.g_out = e.big1, f.u_out = e.big2, f.mix_out = e.mix, f.counters = e.ffn_counters;
    f.grid_sms = e.persistent_sms;
    f.tma = e.ffn_tma > 0;
    if (e.prof.on) f.profile = e.ffn_profile;
    return f;
}

// The MTP head's FFN as one persistent launch (OPENJET_FFN_TMA, the producer-warp form, as the trunk's layers; from 2
// with the head norm, its normed rows into e.mtp_hp; no tail: the head's mixer projected): false where it is off, a
// prefill, or the layer is not what the launch takes (mtp_rows then launches the FFN's parts).
bool mtp_persistent_ffn_args(const openjet_engine& e, int t, FfnPersistentArgs* out) {
    if (!e.ffn_tma || e.prefilling) return false;
    const LayerW& L = e.mtp;
    FfnPersistentArgs f = ffn_launch_args(e, L, t);
    if (e.ffn_tma >= 2) f.next_norm = static_cast<const float*>(e.mtp_head_norm.d), f.next_a = e.mtp_hp;
    *out = f;
    return L.ffn_up.tiled == f.tiled && L.ffn_down.tiled == f.tiled && ffn_persistent_takes(f);
}

// The MTP head over t pairs (ids [t] on the device; hidden rows: row 0's at hs0, rows 1.. at hs1 [t - 1, E]) at
// its cache rows row0.. (qwen38.md §3.3): u = eh_proj [rms(E[x], enorm) || rms(h, hnorm)]; u += attn(rms(u)); with
// `full`, also u += ffn(rms(u)) and h' = rms(u, shared_head_norm) -> e.mtp_hp (t = 1) and logits -> e.logits.
// Without `full` only the head's k and v rows are made and stored: what filling its cache needs. Scratch: u in
// e.h (the trunk's residual, free between steps); where the input pack is four launches (launch_mtp_input_pack
// does not take the call), the embedding in e.h and the [embedding | hidden] rows in e.big1 until packed; the FFN-input
// and head norms' folds' u in e.y (LayerW::fold_ffn_in, fold_next_in: a declared numerics change of the drafts, as the
// trunk's fold).
int mtp_rows(openjet_engine& e, const int32_t* ids, const float* hs0, const float* hs1, int t, int row0, bool full) {
    const auto& c = e.cfg;
    const int E = c.n_embd;
    float *u = e.h, *cat = e.big1;
    e.fold_norm = nullptr, e.fold_input = false;  // (the head's folds are its FFN input's and head norm's, below)
    e.swiglu_g = e.swiglu_u = nullptr;
    const float *enorm = static_cast<const float*>(e.mtp_enorm.d), *hnorm = static_cast<const float*>(e.mtp_hnorm.d);
    // The input pack in one launch where it can (OPENJET_MTP_INPUT_PACK; the four launches' bits), else those four.
    const cudaError_t fused = e.mtp_input_pack ? launch_mtp_input_pack(e.tok_embd.type, e.tok_embd.d, c.n_vocab, ids,
                                                                       hs0, hs1, enorm, hnorm, t, E, c.rms_eps, e.x,
                                                                       e.stream)
                                               : cudaErrorNotSupported;
    if (fused != cudaErrorNotSupported) {
        CHECK(fused);
    } else {
        CHECK(launch_embed(e.tok_embd.type, e.tok_embd.d, c.n_vocab, E, ids, t, u, e.stream));
        CHECK(launch_rmsnorm(u, enorm, t, E, c.rms_eps, cat, e.stream, 2 * E));
        CHECK(launch_rmsnorm(hs0, hnorm, 1, E, c.rms_eps, cat + E, e.stream));
        if (t > 1) CHECK(launch_rmsnorm(hs1, hnorm, t - 1, E, c.rms_eps, cat + 3 * E, e.stream, 2 * E));
        CHECK(launch_pack_act(cat, t, 2 * E, nullptr, 0.0f, e.x, e.stream));
    }
    TRY(gemv(e, e.mtp_eh_proj, t, nullptr, u));
    const LayerW& L = e.mtp;
    CHECK(launch_add_norm_pack(u, nullptr, static_cast<const float*>(L.attn_norm.d), t, E, c.rms_eps, nullptr, e.x,
                               e.stream));
    if (!full) return attn_store_kv(e, L, t, row0, 1);
    mark(e, "mtp.draft.attn");  // (a draft step's parts in the profile: the caller marked mtp.draft.in)
    FfnPersistentArgs f;
    const bool persistent = mtp_persistent_ffn_args(e, t, &f);
    // OPENJET_FOLD: the FFN-input norm made by the out projection and gate / up (plan_folds), as the trunk's; u in
    // e.y, the attention's output, which its pack has read before the out projection writes
    const bool may_fold = !persistent && !e.prefilling && !e.bench_skip_norm_packs;  // (then plan_folds' answers hold)
    const bool fold_here = may_fold && L.fold_ffn_in;
    e.fold_norm = fold_here ? static_cast<const float*>(L.post_norm.d) : nullptr, e.fold_u = e.y;
    TRY(attn_mixer(e, L, t, row0, 1));
    const bool folded = fold_here && !e.fold_norm;  // (its out projection took it)
    e.fold_norm = nullptr;
    mark(e, "mtp.draft.ffn");
    // OPENJET_FOLD: the head norm made by the down projection and the draft head (plan_folds: LayerW::fold_next_in of
    // e.mtp); u in e.y again (gate / up have read the FFN input's before down's writes pass their PDL wait), the
    // normed rows h' into e.mtp_hp by the head's blocks (GemvFold::a_out), as the add-norm leaves them
    const bool fold_head = may_fold && L.fold_next_in;
    bool head_folded = false;
    if (persistent) {
        CHECK(launch_ffn_persistent(f, e.stream));
    } else {
        if (!folded)
            CHECK(launch_add_norm_pack(u, mix_delta(e), static_cast<const float*>(L.post_norm.d), t, E, c.rms_eps,
                                       nullptr, e.x, e.stream));
        e.fold_norm = fold_head ? static_cast<const float*>(e.mtp_head_norm.d) : nullptr, e.fold_u = e.y;
        TRY(ffn(e, L, t, folded, e.y));
        head_folded = fold_head && !e.fold_norm;  // (its down projection took it)
        e.fold_norm = nullptr;
    }
    mark(e, "mtp.draft.head");
    if (head_folded) {
        GemvFold hf = fold_args(e, nullptr, e.y);
        hf.a_out = e.mtp_hp;
        const cudaError_t err = launch_gemv_fold(gemv_args(e, e.draft_head(), t, nullptr, e.logits), nullptr, hf, true,
                                                 false, e.stream);
        if (err != cudaSuccess) return cuda_fail(err, "MTP draft head (fold)");
        return OPENJET_OK;
    }
    if (!persistent || !f.next_norm)
        CHECK(launch_add_norm_pack(u, mix_delta(e), static_cast<const float*>(e.mtp_head_norm.d), t, E, c.rms_eps,
                                   e.mtp_hp, e.x, e.stream));
    return gemv(e, e.draft_head(), t, nullptr, e.logits);
}

// After a trunk step or prefill chunk of t tokens that started at n_past0 (hidden rows hs [t, E], on the device):
// the MTP cache rows of the pairs (x_i, hidden_{i-1}) for i in the step (x_0 has none: the carried e.mtp_last
// gives the step's first row its hidden), then e.mtp_last = the step's last hidden row. ids: the step's ids on
// the device. Each cache row depends on its own pair alone, so a chunk fills the cache bit for bit as its 8-row
// steps do.
int mtp_fill(openjet_engine& e, const int32_t* ids, const float* hs, int t, int n_past0) {
    mark(e, "mtp.fill");
    const int E = e.cfg.n_embd;
    const int first = n_past0 == 0 ? 1 : 0;  // the sequence's first token has no pair
    if (t - first > 0) {
        const float* hs0 = first ? hs : e.mtp_last;        // hidden of the first pair
        const float* hs1 = first ? hs + E : hs;            // of the later ones
        TRY(mtp_rows(e, ids + first, hs0, hs1, t - first, n_past0 + first - 1, false));
    }
    CHECK(cudaMemcpyAsync(e.mtp_last, hs + static_cast<long long>(t - 1) * E, sizeof(float) * E,
                          cudaMemcpyDeviceToDevice, e.stream));
    return OPENJET_OK;
}

// Layer il's persistent FFN launch for a decode step of t rows (OPENJET_FFN_PERSISTENT): with 2, from the mixer's
// output on (its pack and out projection inside the launch); with 3, also the next layer's input norm (the output
// norm after the last layer); with 4, also the next layer's input projections. OPENJET_FFN_TMA instead: the FFN (1),
// and the next norm (2), and the tail (3), and the next layer's input projections (4) in the producer-warp form. False
// where it is off, a prefill, or the layer's weights are not what the kernel takes: the separate launches then.
bool persistent_ffn_args(const openjet_engine& e, int il, int t, FfnPersistentArgs* out) {
    if ((!e.ffn_persistent && !e.ffn_tma) || e.prefilling) return false;
    const int level = e.ffn_tma ? (e.ffn_tma >= 3 ? e.ffn_tma : 1) : e.ffn_persistent;  // (its 2: level 1 + next norm)
    const auto& c = e.cfg;
    const LayerW& L = e.layers[il];
    FfnPersistentArgs f = ffn_launch_args(e, L, t);
    bool one_layout = L.ffn_up.tiled == f.tiled && L.ffn_down.tiled == f.tiled;
    if (level >= 2) {
        const DevTensor& w = L.attn ? L.wo : L.ssm_out;
        f.y_in = e.y, f.k_out = L.attn ? e.q_dim() : e.d_inner(), f.out_w = w.d, f.out_type = w.type;
        one_layout = one_layout && w.tiled == f.tiled;
    }
    if (level >= 3 || e.ffn_tma == 2) {
        const DevTensor& w = il + 1 < c.n_layer ? e.layers[il + 1].attn_norm : e.out_norm;
        f.next_norm = static_cast<const float*>(w.d), f.next_a = e.a;
    }
    // The next layer's input projections, where nothing else of that layer reads the norm's pack: attention, or a
    // GDN step that projects beta and alpha itself (from e.a).
    if (level == 4 && il + 1 < c.n_layer) {
        const LayerW& N = e.layers[il + 1];
        const DevTensor* w[kFfnNextProjections] = {N.attn ? &N.wq : &N.qkv, N.attn ? &N.wk : &N.gate,
                                                   N.attn ? &N.wv : nullptr};
        float* y[kFfnNextProjections] = {N.attn || !e.verifying ? e.big1 : gdn_ring(e, N).qkv, e.big2, e.big3};
        bool same_layout = true;
        for (int m = 0; m < kFfnNextProjections && w[m]; ++m) same_layout = same_layout && w[m]->tiled == f.tiled;
        if (same_layout && (N.attn || gdn_fuses(e, N, t)))
            for (int m = 0; m < kFfnNextProjections && w[m]; ++m) {
                f.next_w[m] = w[m]->d, f.next_n[m] = static_cast<int>(w[m]->ne1), f.next_type[m] = w[m]->type;
                f.next_y[m] = y[m];
            }
    }
    *out = f;
    return one_layout && ffn_persistent_takes(f);
}

// Layer il's FFN (folded: its input norm the fold, LayerW::fold_ffn_in); where the next layer's input norm can be the
// fold (OPENJET_FOLD, LayerW::fold_next_in, and no benchmark skips), its down projection makes it: *normed then says
// the add-norm is done, and the next mixer's first input projections read the fold (fold_input).
int ffn_then_fold(openjet_engine& e, int il, int t, bool folded, bool* normed) {
    const LayerW& L = e.layers[il];
    const bool fold_next = !e.prefilling && !e.bench_skip_norm_packs && L.fold_next_in;
    e.fold_norm = fold_next ? static_cast<const float*>(e.layers[il + 1].attn_norm.d) : nullptr, e.fold_u = e.y;
    TRY(ffn(e, L, t, folded));
    if (fold_next && !e.fold_norm) e.fold_input = true, *normed = true;  // (the down projection took it)
    e.fold_norm = nullptr;
    return OPENJET_OK;
}

// A prefill's add-norm where a decode step's is the fold (LayerW::fold_ffn_in, fold_next_in): the fold's numerics
// without its GEMVs (launch_fold_add_norm_pack; u and the partials in big1, free between a layer's mixer and FFN), the
// pack in e.x and the normed rows in a where given, as B leaves them.
int prefill_fold_norm(openjet_engine& e, const DevTensor& norm, int t, float* a) {
    const int E = e.cfg.n_embd;
    float* u = e.big1;
    auto* part = reinterpret_cast<float4*>(e.big1 + static_cast<long long>(t) * E);
    const cudaError_t err = launch_fold_add_norm_pack(e.h, mix_delta(e), static_cast<const float*>(norm.d), t, E,
                                                      e.cfg.rms_eps, e.h, u, part, a, e.x, e.stream);
    if (err != cudaSuccess) return cuda_fail(err, "add-norm (the fold's numerics)");
    return OPENJET_OK;
}

// The trunk over t token rows (ids already in e.ids) at positions n_past..: hidden rows (post-output_norm)
// in e.a, packed in e.x for the lm_head. Weights are read once for all t rows; attention and GDN run in
// sub-steps of 8 (GDN's inside one launch), and every row gets the bits it gets in a decode step of 1..8 rows.
int trunk(openjet_engine& e, int t) {
    const auto& c = e.cfg;
    mark(e, "embed");
    e.fold_norm = nullptr, e.fold_input = false;  // (a step that failed part way may have left them)
    e.swiglu_g = e.swiglu_u = nullptr;
    CHECK(launch_embed(e.tok_embd.type, e.tok_embd.d, c.n_vocab, c.n_embd, e.ids, t, e.h, e.stream));
    bool normed = false;     // the layer's input norm (or the output norm) done by the persistent FFN before it
    bool projected = false;  // and its input projections too
    for (int il = 0; il < c.n_layer; ++il) {
        const LayerW& L = e.layers[il];
        const bool skip_norm = !e.prefilling && e.bench_skip_norm_packs;  // a measurement: wrong outputs
        if (!normed && !(skip_norm && e.bench_skip_norm_packs >= 2)) {
            mark(e, "norm");
            if (e.prefilling && il && e.layers[il - 1].fold_next_in)
                TRY(prefill_fold_norm(e, L.attn_norm, t, e.a));
            else
                CHECK(launch_add_norm_pack(e.h, il ? mix_delta(e) : nullptr, static_cast<const float*>(L.attn_norm.d),
                                           t, c.n_embd, c.rms_eps, e.a, e.x, e.stream));
        }
        const bool in_proj = !projected;
        normed = projected = false;
        FfnPersistentArgs f;
        const bool persistent = persistent_ffn_args(e, il, t, &f);
        const bool tail = persistent && f.out_w;
        // OPENJET_FOLD: the mixer's out projection makes the FFN-input norm's fold (project_out takes fold_norm)
        const bool fold_here = !e.prefilling && !persistent && !skip_norm && L.fold_ffn_in;
        e.fold_norm = fold_here ? static_cast<const float*>(L.post_norm.d) : nullptr, e.fold_u = e.a;
        TRY(L.attn ? attn_mixer(e, L, t, e.n_past, 0, !tail, in_proj) : gdn_mixer(e, L, t, !tail, in_proj));
        const bool folded = fold_here && !e.fold_norm;  // (its out projection took it)
        e.fold_norm = nullptr;  // (a mixer that ran no projection leaves it: the add-norm below then runs)
        e.fold_input = false;   // (a mixer whose projections were done before left it: none was folded then)
        if (folded) {
            mark(e, "ffn");
            TRY(ffn_then_fold(e, il, t, true, &normed));
            continue;
        }
        if (persistent) {
            mark(e, "ffn");  // the norm inside (and with a tail, the out projection; with 3, the next norm; 4, ...)
            CHECK(launch_ffn_persistent(f, e.stream));
            e.mix_added = false;  // its output is in e.mix, not yet added (project_out's flag: it ran none with a tail)
            normed = f.next_norm != nullptr;
            projected = f.next_w[0] != nullptr;
            continue;
        }
        mark(e, "norm");
        if (e.prefilling && L.fold_ffn_in)
            TRY(prefill_fold_norm(e, L.post_norm, t, nullptr));
        else if (!skip_norm)
            CHECK(launch_add_norm_pack(e.h, mix_delta(e), static_cast<const float*>(L.post_norm.d), t, c.n_embd,
                                       c.rms_eps, nullptr, e.x, e.stream));
        mark(e, "ffn");
        TRY(ffn_then_fold(e, il, t, false, &normed));
    }
    if (!normed) {
        mark(e, "norm");
        CHECK(launch_add_norm_pack(e.h, mix_delta(e), static_cast<const float*>(e.out_norm.d), t, c.n_embd, c.rms_eps,
                                   e.a, e.x, e.stream));
    }
    return OPENJET_OK;
}

// What follows a trunk step of t rows: the MTP head's cache rows (mtp_fill: their k and v), then the sequence
// advances.
int commit_rows(openjet_engine& e, int t) {
    if (e.has_mtp) TRY(mtp_fill(e, e.ids, e.a, t, e.n_past));  // (it writes e.x and e.mix, not the step's outputs)
    e.n_past += t;
    if (e.n_gdn) e.conv_cur ^= 1;  // every GDN layer's step wrote the other conv buffer
    return OPENJET_OK;
}

// What decode_top asks for instead of the logits: each row's top k after the penalties (checked by the caller).
struct TopRequest {
    int k, n_valid;
    const int32_t* pen_ids;
    const float* pen_deltas;
    int n_pen;
    float* values;    // host [t, k]
    int32_t* ids;     // host [t, k]
};

// A step's small outputs on their way to the caller through e.out_host (pinned): stage() enqueues a copy there, which
// does not hold the host, and deliver() moves every staged output to its caller's buffer once the stream has been
// synchronised. A step that fails before deliver() leaves the caller's buffers unwritten.
class StagedOutputs {
  public:
    explicit StagedOutputs(openjet_engine& e) : eng_(e) {}

    int stage(void* dst, const void* src, size_t bytes) {
        if (n_ == kMoves || used_ + bytes > eng_.out_host_bytes)
            return fail(OPENJET_ERR_INTERNAL, "a step's outputs (%zu bytes more) exceed their pinned buffer (%zu "
                        "bytes)", bytes, eng_.out_host_bytes);
        CHECK(cudaMemcpyAsync(eng_.out_host + used_, src, bytes, cudaMemcpyDeviceToHost, eng_.stream));
        moves_[n_++] = {dst, used_, bytes};
        used_ = align_up(used_ + bytes);
        return OPENJET_OK;
    }

    void deliver() const {
        for (int i = 0; i < n_; ++i) std::memcpy(moves_[i].dst, eng_.out_host + moves_[i].off, moves_[i].bytes);
    }

  private:
    static constexpr int kMoves = 3;  // top-k values, top-k ids, hidden rows
    struct Move {
        void* dst;
        size_t off, bytes;
    };
    openjet_engine& eng_;  // (not e_: CHECK's name for its error)
    Move moves_[kMoves] = {};
    int n_ = 0;
    size_t used_ = 0;
};

// Each of the t rows of e.logits ranked on the device (the request's penalties first), its top k staged for the
// host: what decode_top and verify_top hand back instead of the logits.
int top_rows(openjet_engine& e, int t, const TopRequest& top, StagedOutputs& out) {
    mark(e, "topk");
    if (top.n_pen) {
        CHECK(cudaMemcpyAsync(e.pen_ids, top.pen_ids, sizeof(int32_t) * top.n_pen, cudaMemcpyHostToDevice, e.stream));
        CHECK(cudaMemcpyAsync(e.pen_deltas, top.pen_deltas, sizeof(float) * top.n_pen, cudaMemcpyHostToDevice,
                              e.stream));
    }
    CHECK(launch_topk(e.logits, t, e.cfg.n_vocab, top.n_valid, top.k, e.pen_ids, e.pen_deltas, top.n_pen,
                      e.top_values, e.top_ids, e.top_work, e.stream));
    TRY(out.stage(top.values, e.top_values, sizeof(float) * t * top.k));
    TRY(out.stage(top.ids, e.top_ids, sizeof(int32_t) * t * top.k));
    return OPENJET_OK;
}

// What a decode or verify step of t rows hands back after the trunk (each output may be NULL): the lm_head (where
// the logits or their top k are asked for), the top k ranked on the device, the hidden rows; staged in `out`. The
// logits themselves are copied by copy_logits, after the step's MTP rows.
int step_outputs(openjet_engine& e, int t, bool logits, float* hidden, const TopRequest* top, StagedOutputs& out) {
    mark(e, "lm_head");
    if (logits || top) TRY(gemv(e, e.output, t, nullptr, e.logits));
    if (top) TRY(top_rows(e, t, *top, out));
    if (hidden) TRY(out.stage(hidden, e.a, sizeof(float) * t * e.cfg.n_embd));
    return OPENJET_OK;
}

// The t rows of logits to the caller's (pageable) memory, enqueued after the step's MTP rows (mtp_fill, which writes
// neither e.logits nor e.a): the copy holds the host until the GPU reaches it, so the MTP rows' launches go first.
int copy_logits(openjet_engine& e, int t, float* logits) {
    if (!logits) return OPENJET_OK;
    mark(e, "logits.copy");
    CHECK(cudaMemcpyAsync(logits, e.logits, sizeof(float) * t * e.cfg.n_vocab, cudaMemcpyDeviceToHost, e.stream));
    return OPENJET_OK;
}

// OPENJET_BENCH_GRAPH=1: `launches` (which enqueue on e.stream) captured into *exec (replacing what it held), without
// a profile's marks. Host bookkeeping inside `launches` runs once, now: a replay must redo it (trunk_done).
template <class Launches> int capture_graph(openjet_engine& e, cudaGraphExec_t* exec, const Launches& launches) {
    if (*exec) CHECK(cudaGraphExecDestroy(*exec));
    *exec = nullptr;
    CHECK(cudaStreamBeginCapture(e.stream, cudaStreamCaptureModeThreadLocal));
    const bool prof = e.prof.on, graph = e.bench_graph;
    e.prof.on = e.bench_graph = false;  // (a trunk inside a captured cycle: no capture of its own)
    e.graph_positions = true;
    const int status = launches();
    e.prof.on = prof, e.bench_graph = graph, e.graph_positions = false;
    cudaGraph_t g = nullptr;
    const cudaError_t end = cudaStreamEndCapture(e.stream, &g);
    if (status != OPENJET_OK) {
        if (g) cudaGraphDestroy(g);
        return status;
    }
    CHECK(end);
    const cudaError_t made = cudaGraphInstantiate(exec, g, 0);
    cudaGraphDestroy(g);
    CHECK(made);
    return OPENJET_OK;
}

// What a captured trunk or cycle depends on besides the buffers: the length only through the attention launches'
// split (the chunk size, attn_chunk_keys) at the lengths they run at, n_past - 1 (the MTP fill's first row) to
// n_past + 7 (a step's last row; the drafts' lie between), and whether the sequence starts there (the MTP fill has no
// first pair then). Where the split is one size over that window, the key holds it and not the length (n_past -1);
// where it changes inside the window, the length itself.
openjet_engine::TrunkKey trunk_key(const openjet_engine& e, int t, bool verifying) {
    const int kv = e.cfg.n_head_kv, sms = e.sm_count * e.attn_spread;
    const int lo = attn_chunk_keys(std::max(e.n_past - 1, 0), kv, sms);
    const bool one_split = lo == attn_chunk_keys(e.n_past + kSubRows - 1, kv, sms);
    return {t, lo, one_split ? -1 : e.n_past, e.conv_cur, e.ring_w, e.replay_rows, e.attn_spread, e.n_past == 0,
            verifying};
}

// A captured graph launched at the sequence's current length (its attention launches read it on the device).
int launch_graph(openjet_engine& e, cudaGraphExec_t exec) {
    CHECK(cudaMemcpyAsync(e.pos_dev, &e.n_past, sizeof(int), cudaMemcpyHostToDevice, e.stream));
    CHECK(cudaGraphLaunch(exec, e.stream));
    return OPENJET_OK;
}

// `launches` from the cache's graph for `key`, captured first where it holds none (the host bookkeeping inside
// `launches` then runs once: on a replay, `replayed` redoes it).
template <class Key, int N, class Launches, class Replayed>
int run_graph(openjet_engine& e, GraphCache<Key, N>& cache, const Key& key, Counted captures, Counted replays,
              const Launches& launches, const Replayed& replayed) {
    auto* slot = cache.find(key);
    count_launch(slot ? replays : captures);
    if (slot) {
        replayed();
    } else {
        slot = cache.room();
        slot->key = {};  // (no key while it holds nothing)
        TRY(capture_graph(e, &slot->exec, launches));
        slot->key = key;
    }
    slot->used = ++cache.clock;
    return launch_graph(e, slot->exec);
}

// OPENJET_BENCH_GRAPH=1: the trunk's launches from a graph captured at the same key (every host value trunk() reads
// that changes between steps), captured first where the key is new.
int trunk_graph(openjet_engine& e, int t) {
    return run_graph(e, e.trunk_graphs, trunk_key(e, t, e.verifying), Counted::kTrunkGraphCapture,
                     Counted::kTrunkGraphReplay, [&] { return trunk(e, t); }, [] {});  // (trunk(): no host state)
}

// What a trunk step changes on the host (step_trunk; a replayed cycle graph redoes it). A pending replay ran in the
// step's GDN launches (gdn_mixer). A verify step wrote the conv window after the replayed rows to the other buffer,
// which now holds the committed one (a decode step flips in commit_rows).
void trunk_done(openjet_engine& e, bool verifying) {
    if (verifying && e.replay_rows && e.n_gdn) e.conv_cur ^= 1;
    e.replay_rows = 0;
}

// The trunk of a decode or verify step over t <= 8 host ids, or (ids NULL) the ids already in e.ids (the device's
// own cycle) (verifying: the GDN states go to the shadow and the GDN inputs to the ring, the committed state stays).
int step_trunk(openjet_engine& e, const int32_t* ids, int t, bool verifying) {
    CHECK(cudaSetDevice(e.cfg.device));
    if (ids) CHECK(cudaMemcpyAsync(e.ids, ids, sizeof(int32_t) * t, cudaMemcpyHostToDevice, e.stream));
    e.verifying = verifying;
    const int status = e.bench_graph ? trunk_graph(e, t) : trunk(e, t);
    e.verifying = false;
    trunk_done(e, verifying);
    return status;
}

int decode_impl(openjet_engine& e, const int32_t* ids, int t, float* logits, float* hidden,
                const TopRequest* top = nullptr) {
    const auto t0 = std::chrono::steady_clock::now();
    TRY(step_trunk(e, ids, t, false));
    // The host's share: how long the trunk's ~700 launches took to enqueue (before copy_logits, whose copy to
    // pageable memory waits for the GPU). Near the step's GPU time, the GPU waits on the host.
    e.enqueue.first += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    e.enqueue.second += 1;
    StagedOutputs out(e);
    TRY(step_outputs(e, t, logits != nullptr, hidden, top, out));
    TRY(commit_rows(e, t));
    TRY(copy_logits(e, t, logits));
    CHECK(cudaStreamSynchronize(e.stream));
    out.deliver();
    collect_profile(e);
    return OPENJET_OK;
}

// n tokens in chunks of up to `chunk` rows (<= e.prefill_rows); the last token's logits and
// hidden row. The lm_head runs on that row alone (packed by itself: the bits decode's pack gives it). snap_slot >= 0:
// the state after the first snap_at tokens also goes to that checkpoint slot, taken inside the chunk that holds
// that point by the GDN's form 2 (the caller checked it runs and that snap_at and chunk are multiples of kGdnChunk),
// or after the chunk that ends there.
int prefill_impl(openjet_engine& e, const int32_t* ids, int n, int chunk, float* logits, float* hidden,
                 int snap_slot = -1, int snap_at = 0) {
    const auto& c = e.cfg;
    // The flash prefill's switches, read at each prefill call (as the test API reads them) and checked before
    // anything runs: a bad value found at a layer would leave the earlier layers' state updated.
    const char* rows = std::getenv("OPENJET_ATTN_PREFILL_ROWS");
    e.attn_prefill_rows = rows ? std::atoi(rows) : 0;
    if (rows && e.attn_prefill_rows != 64 && e.attn_prefill_rows != 128)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "OPENJET_ATTN_PREFILL_ROWS=%s: must be 64 or 128", rows);
    e.attn_prefill_keys = attn_prefill_keys_switch();
    if (e.attn_prefill_keys < 0)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "OPENJET_ATTN_PREFILL_KEYS=%s: must be 32 or 64",
                    std::getenv("OPENJET_ATTN_PREFILL_KEYS"));
    CHECK(cudaSetDevice(c.device));
    TRY(replay_now(e));  // a prefill's GDN forms take no replay rows
    struct Prefilling {  // e.prefilling for this call's GEMVs and no snapshot request left, however it returns
        openjet_engine& e;
        void* const imma;  // e.x's integer twin (OPENJET_GEMV_INT=3): a prefill's makers write none
        explicit Prefilling(openjet_engine& e_) : e(e_), imma(e_.x.imma) { e.prefilling = true, e.x.imma = nullptr; }
        ~Prefilling() { e.prefilling = false, e.snap_slot = -1, e.x.imma = imma; }
    } prefilling(e);
    for (int i0 = 0; i0 < n; i0 += chunk) {
        const int t = std::min(chunk, n - i0);
        CHECK(cudaMemcpyAsync(e.ids, ids + i0, sizeof(int32_t) * t, cudaMemcpyHostToDevice, e.stream));
        const int rel = snap_at - i0;  // the snapshot's row in this chunk
        if (snap_slot >= 0 && rel > 0 && rel < t)  // the slot holds nothing while the layers overwrite it
            e.snap_slot = snap_slot, e.snap_row = rel, e.ckpt_n_past[snap_slot] = -1;
        TRY(trunk(e, t));
        if (e.snap_slot >= 0) {  // the GDN layers wrote their states; the carried hidden row is row rel - 1
            if (e.has_mtp)
                CHECK(cudaMemcpyAsync(ckpt_mtp_row(e, snap_slot), e.a + static_cast<long long>(rel - 1) * c.n_embd,
                                      sizeof(float) * c.n_embd, cudaMemcpyDeviceToDevice, e.stream));
            e.ckpt_n_past[snap_slot] = e.n_past + rel;
            e.snap_slot = -1;
        }
        if (i0 + t == n) {
            const float* last = e.a + static_cast<long long>(t - 1) * c.n_embd;
            if (hidden) CHECK(cudaMemcpyAsync(hidden, last, sizeof(float) * c.n_embd, cudaMemcpyDeviceToHost, e.stream));
            if (logits) {
                mark(e, "lm_head");
                CHECK(launch_pack_act(last, 1, c.n_embd, nullptr, 0.0f, e.x, e.stream));
                // Decode's GEMV, not the fast prefill GEMM: one row, always one (so every chunking gives these
                // bits), and the GEMM would dequantise all of output.weight for it (H200: 2.9 against 0.6 ms).
                GemvArgs head = gemv_args(e, e.output, 1, nullptr, e.logits);
                head.prefill = false;
                const cudaError_t err = launch_gemv(head, e.stream);
                if (err != cudaSuccess) return cuda_fail(err, "gemv (lm_head)");
                CHECK(cudaMemcpyAsync(logits, e.logits, sizeof(float) * c.n_vocab, cudaMemcpyDeviceToHost, e.stream));
            }
        }
        TRY(commit_rows(e, t));
        if (snap_slot >= 0 && rel == t) TRY(save_checkpoint(e, snap_slot));  // the point ends this chunk
        // Pageable host ids: the copy above is staged before it returns, so the next chunk may overwrite e.ids
        // only after this chunk's kernels read it: stream order sees to that.
        if (e.prof.on) collect_profile(e);  // per chunk: the profile's events are reused
    }
    CHECK(cudaStreamSynchronize(e.stream));
    return OPENJET_OK;
}

// After a verify trunk of t rows (verify_impl, the device cycles): its hidden rows kept for accept (the MTP head's
// next input) and the MTP cache rows of its pairs filled; rows past the accepted ones die, as after a decode step.
int verify_rows_kept(openjet_engine& e, int t) {
    CHECK(cudaMemcpyAsync(e.verify_hidden, e.a, sizeof(float) * t * e.cfg.n_embd, cudaMemcpyDeviceToDevice, e.stream));
    return mtp_fill(e, e.ids, e.a, t, e.n_past);
}

// A verify step: decode's trunk and lm_head over t <= 8 rows (the MTP cache rows of its pairs filled too),
// but the committed GDN and conv states stay as they were; the GDN inputs wait in the ring for accept.
int verify_impl(openjet_engine& e, const int32_t* ids, int t, float* logits, float* hidden,
                const TopRequest* top = nullptr) {
    TRY(step_trunk(e, ids, t, true));
    StagedOutputs out(e);
    TRY(step_outputs(e, t, logits != nullptr, hidden, top, out));
    TRY(verify_rows_kept(e, t));
    TRY(copy_logits(e, t, logits));
    CHECK(cudaStreamSynchronize(e.stream));
    out.deliver();
    collect_profile(e);
    e.pending = t;
    return OPENJET_OK;
}

// The pending replay (accepted rows, e.replay_rows) on its own: each GDN layer's step replayed over them from their
// ring onto the committed state (in place) and conv state. Accept mode runs it at once; with the fused replay, what
// needs the committed state before the next decode or verify step does (a prefill, a checkpoint). Stream-ordered.
int replay_now(openjet_engine& e) {
    if (!e.replay_rows) return OPENJET_OK;
    const int rows = e.replay_rows;
    e.replay_rows = 0;  // taken now: a launch that fails below must not leave the rows to be replayed a second time
    for (const LayerW& L : e.layers) {
        if (L.attn) continue;
        GdnStepArgs g = gdn_layer_args(e, L);
        const GdnRing ring = gdn_ring(e, L, kept_ring(e));
        g.t = rows;
        g.qkv = ring.qkv, g.b = ring.b, g.alpha = ring.alpha;
        g.z = e.big2, g.y = e.y;  // the step's output is not needed: scratch
        g.conv_state_in = e.conv[e.conv_cur] + e.conv_layer_floats * L.idx;
        g.conv_state_out = e.conv[e.conv_cur ^ 1] + e.conv_layer_floats * L.idx;
        CHECK(launch_gdn_step(g, e.stream));
    }
    if (e.n_gdn) e.conv_cur ^= 1;
    return OPENJET_OK;
}

// Commits the first n rows of the pending verify step: their GDN replay (at once, or with the fused replay in the
// next step's launches), the MTP head's carried hidden row set to row n - 1.
int accept_impl(openjet_engine& e, int n) {
    const auto& c = e.cfg;
    e.pending = 0;  // first: a failure below must not leave the engine awaiting an accept the host will not send
    CHECK(cudaSetDevice(c.device));
    mark(e, "accept");
    e.replay_rows = n;
    if (e.replay_fused) e.ring_w ^= 1;  // the next verify step writes the other ring (kept_ring: this one)
    CHECK(cudaMemcpyAsync(e.mtp_last, e.verify_hidden + static_cast<size_t>(n - 1) * c.n_embd,
                          sizeof(float) * c.n_embd, cudaMemcpyDeviceToDevice, e.stream));
    e.n_past += n;
    if (!e.replay_fused) TRY(replay_now(e));
    else if (!e.prof.on) return OPENJET_OK;  // nothing to wait for: the host goes on
    CHECK(cudaStreamSynchronize(e.stream));
    collect_profile(e);
    return OPENJET_OK;
}

// A checkpoint slot: GDN states, the current conv-state buffer and (with an MTP head) the trunk's last hidden
// row, which the next step's first MTP pair needs.
size_t ckpt_ssm_bytes(const openjet_engine& e) { return align_up(sizeof(float) * e.ssm_layer_floats * e.n_gdn); }
size_t ckpt_conv_bytes(const openjet_engine& e) { return sizeof(float) * e.conv_layer_floats * e.n_gdn; }
size_t ckpt_slot_bytes(const openjet_engine& e) {
    return ckpt_ssm_bytes(e) + align_up(ckpt_conv_bytes(e)) + (e.has_mtp ? align_up(sizeof(float) * e.cfg.n_embd) : 0);
}
char* ckpt_slot(const openjet_engine& e, int slot) { return e.ckpt + slot * ckpt_slot_bytes(e); }
float* ckpt_mtp_row(const openjet_engine& e, int slot) {  // the slot's copy of the trunk's last hidden row
    return reinterpret_cast<float*>(ckpt_slot(e, slot) + ckpt_ssm_bytes(e) + align_up(ckpt_conv_bytes(e)));
}

// The sequence's GDN and conv states and the carried hidden row into a slot, as of e.n_past.
int save_checkpoint(openjet_engine& e, int slot) {
    TRY(replay_now(e));  // the state as of n_past
    e.ckpt_n_past[slot] = -1;  // empty until every copy is done: a failure part way leaves no mixed slot to restore
    char* dst = ckpt_slot(e, slot);
    CHECK(cudaMemcpyAsync(dst, e.ssm, sizeof(float) * e.ssm_layer_floats * e.n_gdn, cudaMemcpyDeviceToDevice, e.stream));
    CHECK(cudaMemcpyAsync(dst + ckpt_ssm_bytes(e), e.conv[e.conv_cur], ckpt_conv_bytes(e), cudaMemcpyDeviceToDevice,
                          e.stream));
    if (e.has_mtp)
        CHECK(cudaMemcpyAsync(ckpt_mtp_row(e, slot), e.mtp_last, sizeof(float) * e.cfg.n_embd, cudaMemcpyDeviceToDevice,
                              e.stream));
    CHECK(cudaStreamSynchronize(e.stream));
    e.ckpt_n_past[slot] = e.n_past;
    return OPENJET_OK;
}

int check_engine(const openjet_engine* e) {
    if (!e) return fail(OPENJET_ERR_INVALID_ARGUMENT, "engine is NULL");
    return OPENJET_OK;
}

// An engine whose sequence is defined: none after a GPU failure until a reset or a restore (openjet_engine::broken).
int check_defined(const openjet_engine* e, const char* what) {
    if (e->broken)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "%s: an earlier call failed on the GPU part way and left the sequence "
                    "undefined; reset it (openjet_engine_reset) or restore a checkpoint first (the earlier error said "
                    "why)", what);
    return OPENJET_OK;
}

// An engine that may start a new operation: none but accept (or reset) while a verify step is pending; none but
// reset and restore (allow_broken) after a GPU failure.
int check_idle(const openjet_engine* e, const char* what, bool allow_broken = false) {
    TRY(check_engine(e));
    if (!allow_broken) TRY(check_defined(e, what));
    if (e->pending)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "%s: a verify step of %d rows awaits openjet_engine_accept", what,
                    e->pending);
    return OPENJET_OK;
}

// Marks the engine's sequence undefined (openjet_engine::broken) when a CUDA call fails while the operation it spans
// runs: the operation may have updated part of the state (some layers, the replay, n_past), which nothing can tell
// apart from a whole one afterwards.
struct GpuFailureWatch {
    openjet_engine* e;
    unsigned long long before = gpu_failures();
    explicit GpuFailureWatch(openjet_engine* engine) : e(engine) {}
    ~GpuFailureWatch() {
        if (e && gpu_failures() != before) e->broken = true;
    }
};

// n token ids (ids non-NULL) that fit the vocabulary and, after n_past, the context.
int check_ids(const openjet_engine* e, const int32_t* ids, int n, const char* what) {
    for (int i = 0; i < n; ++i)
        if (ids[i] < 0 || ids[i] >= e->cfg.n_vocab)
            return fail(OPENJET_ERR_INVALID_ARGUMENT, "%s: token id %d (position %d) is outside the vocabulary "
                        "[0, %d)", what, ids[i], i, e->cfg.n_vocab);
    if (static_cast<long long>(e->n_past) + n > e->cfg.n_ctx)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "%s: %d + %d tokens exceed the context of %d tokens", what,
                    e->n_past, n, e->cfg.n_ctx);
    return OPENJET_OK;
}

// A step of t <= 8 token ids at n_past.. (decode, decode_top, verify).
int check_step(const openjet_engine* e, const int32_t* ids, int t, const char* what) {
    TRY(check_idle(e, what));
    if (!ids || t < 1 || t > OPENJET_ENGINE_MAX_T)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "%s: ids is NULL or t = %d is not 1..%d", what, t,
                    OPENJET_ENGINE_MAX_T);
    return check_ids(e, ids, t, what);
}

// A verify step: a step, on an engine created with the MTP head (its shadow state and input ring).
int check_verify(const openjet_engine* e, const int32_t* ids, int t, const char* what) {
    TRY(check_step(e, ids, t, what));
    if (!e->has_mtp)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "%s: the engine was created without the MTP head, and with it "
                    "the buffers speculation needs", what);
    return OPENJET_OK;
}

// The outputs of a top-k request (decode_top, verify_top): k in 1..kTopKMax, n_valid in k..n_vocab.
int check_top(const openjet_engine* e, int k, int n_valid, const float* values, const int32_t* ids,
              const char* what) {
    if (!values || !ids || k < 1 || k > kTopKMax || n_valid < k || n_valid > e->cfg.n_vocab)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "%s: null output, k = %d not in 1..%d, or n_valid = %d not in "
                    "k..%d", what, k, kTopKMax, n_valid, e->cfg.n_vocab);
    return OPENJET_OK;
}

}  // namespace

extern "C" OPENJET_API const char* openjet_engine_last_error(void) { return last_error<Api::kEngine>().c_str(); }

extern "C" OPENJET_API int openjet_engine_create(const openjet_engine_config* config, const openjet_tensor_desc* tensors,
                                                 int n_tensors, openjet_engine** out) {
    if (!out) return fail(OPENJET_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = nullptr;
    if (!config || (!tensors && n_tensors > 0) || n_tensors < 0)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "config or tensors is NULL, or n_tensors < 0");
    openjet_engine* e = nullptr;
    try {
        e = new openjet_engine();
        e->cfg = *config;
        const int s = create_impl(*e, tensors, n_tensors);
        if (s != OPENJET_OK) {
            delete e;  // frees every arena taken so far
            return s;
        }
    } catch (const std::bad_alloc&) {
        delete e;
        return fail(OPENJET_ERR_OUT_OF_MEMORY, "host out of memory while creating the engine");
    } catch (...) {
        delete e;
        return fail(OPENJET_ERR_INTERNAL, "unexpected C++ exception while creating the engine");
    }
    *out = e;
    return OPENJET_OK;
}

extern "C" OPENJET_API void openjet_engine_destroy(openjet_engine* engine) {
    if (!engine) return;
    cudaSetDevice(engine->cfg.device);
    if (engine->stream) cudaStreamSynchronize(engine->stream);
    delete engine;
}

extern "C" OPENJET_API int openjet_engine_reset(openjet_engine* e) {
    TRY(check_engine(e));
    const GpuFailureWatch watch(e);  // a reset failing part way leaves the sequence undefined, as any operation
    // No verify awaits an accept and no replay is due, even if what follows fails: a failed reset then leaves an
    // engine that restore or another reset recovers (pending, restore was refused, and accept too while broken).
    e->pending = 0;
    e->replay_rows = 0;
    CHECK(cudaSetDevice(e->cfg.device));
    CHECK(cudaMemsetAsync(e->state + 0, 0, e->gdn_bytes, e->stream));  // GDN states and both conv buffers
    CHECK(cudaStreamSynchronize(e->stream));
    e->n_past = 0;
    e->conv_cur = 0;
    e->broken = false;
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_engine_n_past(const openjet_engine* e, int* n_past) {
    TRY(check_engine(e));
    if (!n_past) return fail(OPENJET_ERR_INVALID_ARGUMENT, "n_past is NULL");
    *n_past = e->n_past;
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_engine_decode(openjet_engine* e, const int32_t* ids, int t, float* logits,
                                                 float* hidden) {
    const GpuFailureWatch watch(e);
    TRY(check_step(e, ids, t, "decode"));
    return decode_impl(*e, ids, t, logits, hidden);
}

extern "C" OPENJET_API int openjet_engine_verify(openjet_engine* e, const int32_t* ids, int t, float* logits,
                                                 float* hidden) {
    const GpuFailureWatch watch(e);
    TRY(check_verify(e, ids, t, "verify"));
    return verify_impl(*e, ids, t, logits, hidden);
}

extern "C" OPENJET_API int openjet_engine_verify_top(openjet_engine* e, const int32_t* ids, int t, int k, int n_valid,
                                                     float* top_values, int32_t* top_ids, float* hidden) {
    const GpuFailureWatch watch(e);
    TRY(check_verify(e, ids, t, "verify_top"));
    TRY(check_top(e, k, n_valid, top_values, top_ids, "verify_top"));
    const TopRequest top{k, n_valid, nullptr, nullptr, 0, top_values, top_ids};
    return verify_impl(*e, ids, t, nullptr, hidden, &top);
}

extern "C" OPENJET_API int openjet_engine_accept(openjet_engine* e, int n) {
    TRY(check_engine(e));
    TRY(check_defined(e, "accept"));
    const GpuFailureWatch watch(e);
    if (!e->pending) return fail(OPENJET_ERR_INVALID_ARGUMENT, "accept: no verify step is pending");
    if (n < 1 || n > e->pending)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "accept: n = %d is not 1..%d (the verify step's rows)", n, e->pending);
    return accept_impl(*e, n);
}

extern "C" OPENJET_API int openjet_engine_decode_top(openjet_engine* e, const int32_t* ids, int t, int k, int n_valid,
                                                     const int32_t* pen_ids, const float* pen_deltas, int n_pen,
                                                     float* top_values, int32_t* top_ids, float* hidden) {
    const GpuFailureWatch watch(e);
    TRY(check_step(e, ids, t, "decode_top"));
    TRY(check_top(e, k, n_valid, top_values, top_ids, "decode_top"));
    if (n_pen < 0 || n_pen > n_valid || (n_pen && (!pen_ids || !pen_deltas)))
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "decode_top: n_pen = %d with a null list, or more than n_valid", n_pen);
    if (const char* why = n_pen ? penalty_list_problem(pen_ids, n_pen, n_valid) : nullptr)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "decode_top: %s", why);
    const TopRequest top{k, n_valid, pen_ids, pen_deltas, n_pen, top_values, top_ids};
    return decode_impl(*e, ids, t, nullptr, hidden, &top);
}

extern "C" OPENJET_API int openjet_engine_prefill(openjet_engine* e, const int32_t* ids, int n, int chunk,
                                                  float* logits, float* hidden) {
    const GpuFailureWatch watch(e);
    TRY(check_idle(e, "prefill"));
    if (!ids || n < 1) return fail(OPENJET_ERR_INVALID_ARGUMENT, "prefill: ids is NULL or n = %d < 1", n);
    if (chunk < 1 || chunk > e->prefill_rows)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "prefill: chunk = %d is not 1..%d (the engine's prefill_rows)", chunk,
                    e->prefill_rows);
    TRY(check_ids(e, ids, n, "prefill"));
    return prefill_impl(*e, ids, n, chunk, logits, hidden);
}

extern "C" OPENJET_API int openjet_engine_prefill_checkpoint(openjet_engine* e, const int32_t* ids, int n, int chunk,
                                                             int slot, int at, float* logits, float* hidden) {
    const GpuFailureWatch watch(e);
    TRY(check_idle(e, "prefill_checkpoint"));
    if (!ids || n < 2) return fail(OPENJET_ERR_INVALID_ARGUMENT, "prefill_checkpoint: ids is NULL or n = %d < 2", n);
    if (chunk < 1 || chunk > e->prefill_rows)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "prefill_checkpoint: chunk = %d is not 1..%d (the engine's prefill_rows)",
                    chunk, e->prefill_rows);
    if (slot < 0 || slot >= e->cfg.n_checkpoints)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "prefill_checkpoint: slot %d: the engine has %d slots", slot,
                    e->cfg.n_checkpoints);
    if (at < 1 || at >= n) return fail(OPENJET_ERR_INVALID_ARGUMENT, "prefill_checkpoint: at = %d is not 1..%d", at, n - 1);
    TRY(check_ids(e, ids, n, "prefill_checkpoint"));
    // Inside the call where the GDN's form 2 takes every chunk (its state at a chunk boundary is at hand); else as
    // two calls around a checkpoint, which leave the same bits.
    if (e->n_gdn && e->gdn_chunk_scratch && gdn_two_phase_runs() && chunk % kGdnChunk == 0 && at % kGdnChunk == 0)
        return prefill_impl(*e, ids, n, chunk, logits, hidden, slot, at);
    TRY(prefill_impl(*e, ids, at, chunk, nullptr, nullptr));
    TRY(save_checkpoint(*e, slot));
    return prefill_impl(*e, ids + at, n - at, chunk, logits, hidden);
}

extern "C" OPENJET_API int openjet_engine_checkpoint(openjet_engine* e, int slot) {
    const GpuFailureWatch watch(e);
    TRY(check_idle(e, "checkpoint"));
    if (slot < 0 || slot >= e->cfg.n_checkpoints)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "checkpoint slot %d: the engine has %d slots", slot, e->cfg.n_checkpoints);
    CHECK(cudaSetDevice(e->cfg.device));
    return save_checkpoint(*e, slot);
}

extern "C" OPENJET_API int openjet_engine_restore(openjet_engine* e, int slot) {
    TRY(check_idle(e, "restore", true));  // (a restore, as a reset, makes a broken sequence defined again)
    const GpuFailureWatch watch(e);        // ... once it is done: one failing part way leaves it undefined
    if (slot < 0 || slot >= e->cfg.n_checkpoints || e->ckpt_n_past[slot] < 0)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "restore: slot %d holds no checkpoint", slot);
    CHECK(cudaSetDevice(e->cfg.device));
    const char* src = ckpt_slot(*e, slot);
    CHECK(cudaMemcpyAsync(e->ssm, src, sizeof(float) * e->ssm_layer_floats * e->n_gdn, cudaMemcpyDeviceToDevice, e->stream));
    CHECK(cudaMemcpyAsync(e->conv[e->conv_cur], src + ckpt_ssm_bytes(*e), ckpt_conv_bytes(*e), cudaMemcpyDeviceToDevice,
                          e->stream));
    if (e->has_mtp)
        CHECK(cudaMemcpyAsync(e->mtp_last, ckpt_mtp_row(*e, slot), sizeof(float) * e->cfg.n_embd,
                              cudaMemcpyDeviceToDevice, e->stream));
    CHECK(cudaStreamSynchronize(e->stream));
    e->n_past = e->ckpt_n_past[slot];
    e->replay_rows = 0;  // a pending replay belonged to the state the slot replaces
    e->broken = false;
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_engine_has_mtp(const openjet_engine* e, int* has_mtp) {
    TRY(check_engine(e));
    if (!has_mtp) return fail(OPENJET_ERR_INVALID_ARGUMENT, "has_mtp is NULL");
    *has_mtp = e->has_mtp ? 1 : 0;
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_engine_mtp_step(openjet_engine* e, int32_t token, int k, float* logits,
                                                   float* hidden) {
    const GpuFailureWatch watch(e);
    TRY(check_idle(e, "mtp_step"));
    const auto& c = e->cfg;
    if (!e->has_mtp) return fail(OPENJET_ERR_INVALID_ARGUMENT, "mtp_step: the model has no MTP head");
    if (e->n_past < 1) return fail(OPENJET_ERR_INVALID_ARGUMENT, "mtp_step: no token processed yet (prefill first)");
    if (token < 0 || token >= c.n_vocab)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "mtp_step: token id %d is outside the vocabulary [0, %d)", token,
                    c.n_vocab);
    const long long row = e->n_past - 1LL + k;  // the draft's cache row, past the committed ones
    if (k < 0 || row >= c.n_ctx)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "mtp_step: draft step %d at %d tokens exceeds the context of %d", k,
                    e->n_past, c.n_ctx);
    CHECK(cudaSetDevice(c.device));
    CHECK(cudaMemcpyAsync(e->ids, &token, sizeof(int32_t), cudaMemcpyHostToDevice, e->stream));
    mark(*e, "mtp.draft.in");
    TRY(mtp_rows(*e, e->ids, k == 0 ? e->mtp_last : e->mtp_hp, nullptr, 1, static_cast<int>(row), true));
    const int n_logits = e->draft_n ? e->draft_n : c.n_vocab;
    if (logits) CHECK(cudaMemcpyAsync(logits, e->logits, sizeof(float) * n_logits, cudaMemcpyDeviceToHost, e->stream));
    if (hidden) CHECK(cudaMemcpyAsync(hidden, e->mtp_hp, sizeof(float) * c.n_embd, cudaMemcpyDeviceToHost, e->stream));
    CHECK(cudaStreamSynchronize(e->stream));
    collect_profile(*e);
    return OPENJET_OK;
}

namespace {
// What a chain of n draft steps on the device after `token` needs (start_draft_chain; cycle_greedy, whose token
// reaches the device apart).
int check_draft_chain(openjet_engine* e, int32_t token, int n, int n_valid, const void* drafts, const char* what) {
    TRY(check_idle(e, what));
    const auto& c = e->cfg;
    if (!e->has_mtp) return fail(OPENJET_ERR_INVALID_ARGUMENT, "%s: the model has no MTP head", what);
    if (e->n_past < 1) return fail(OPENJET_ERR_INVALID_ARGUMENT, "%s: no token processed yet (prefill first)", what);
    if (!drafts || n < 1 || n > OPENJET_ENGINE_MAX_T || n_valid < 1 || n_valid > c.n_vocab)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "%s: drafts is NULL, n = %d is not 1..%d, or n_valid = %d is not "
                    "1..%d", what, n, OPENJET_ENGINE_MAX_T, n_valid, c.n_vocab);
    if (token < 0 || token >= c.n_vocab)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "%s: token id %d is outside the vocabulary [0, %d)", what, token,
                    c.n_vocab);
    if (e->n_past - 1 + n > c.n_ctx)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "%s: %d draft steps at %d tokens exceed the context of %d", what, n,
                    e->n_past, c.n_ctx);
    return OPENJET_OK;
}

// A sampled request's parameters (mtp_draft_sampled, cycle_sampled): k, the transform, n_u uniforms in [0, 1) and the
// outputs (outputs: none of them NULL).
int check_sampling(int k, int n_valid, double temperature, double top_p, double min_p, const double* u, int n_u,
                   bool outputs, const char* what) {
    if (k < 1 || k > kTopKMax || k > n_valid || !(temperature > 0.0) || !std::isfinite(temperature) ||
        !(top_p > 0.0 && top_p <= 1.0) || !(min_p >= 0.0 && min_p <= 1.0) || !u || !outputs)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "%s: k = %d is not 1..%d (nor above n_valid), temperature %g, top_p "
                    "%g or min_p %g out of range, or a NULL buffer", what, k, kTopKMax, temperature, top_p, min_p);
    for (int j = 0; j < n_u; ++j)
        if (!(u[j] >= 0.0 && u[j] < 1.0))
            return fail(OPENJET_ERR_INVALID_ARGUMENT, "%s: u[%d] = %g is not in [0, 1)", what, j, u[j]);
    return OPENJET_OK;
}

// The chain's arguments checked (mtp_draft_greedy, mtp_draft_sampled), then the token to e->ids[0], the first step's
// input.
int start_draft_chain(openjet_engine* e, int32_t token, int n, int n_valid, const void* drafts, const char* what) {
    TRY(check_draft_chain(e, token, n, n_valid, drafts, what));
    CHECK(cudaSetDevice(e->cfg.device));
    CHECK(cudaMemcpyAsync(e->ids, &token, sizeof(int32_t), cudaMemcpyHostToDevice, e->stream));
    return OPENJET_OK;
}

// n draft steps on the device after the token in e.ids[0] (start_draft_chain): step k runs the MTP head on e.ids[0],
// then pick(k) chooses from its logits (e.logits: the draft rows, or the vocabulary) and writes the token to e.ids[0],
// the next step's input, as well as to the chain's outputs.
template <class Pick> int draft_chain(openjet_engine& e, int n, const Pick& pick) {
    for (int k = 0; k < n; ++k) {
        mark(e, "mtp.draft.in");
        TRY(mtp_rows(e, e.ids, k == 0 ? e.mtp_last : e.mtp_hp, nullptr, 1, e.n_past - 1 + k, true));
        mark(e, "mtp.draft.pick");
        TRY(pick(k));
    }
    return OPENJET_OK;
}

// The greedy chain: each step's argmax (launch_argmax) in e.draft_pick, its logit in e.draft_value, and with `hidden`
// the step's h' in e.draft_hidden.
int greedy_draft_chain(openjet_engine& e, int n, int n_valid, bool hidden) {
    const auto& c = e.cfg;
    return draft_chain(e, n, [&](int k) -> int {
        CHECK(launch_argmax(e.logits, e.draft_n ? e.draft_n : c.n_vocab, e.draft_n ? e.draft_ids : nullptr, n_valid,
                            e.draft_pick + k, e.draft_value + k, e.ids, e.stream));
        if (hidden)
            CHECK(cudaMemcpyAsync(e.draft_hidden + static_cast<size_t>(k) * c.n_embd, e.mtp_hp,
                                  sizeof(float) * c.n_embd, cudaMemcpyDeviceToDevice, e.stream));
        return OPENJET_OK;
    });
}

// The sampled chain: each step's top k over the draft rows (or the vocabulary), then its draw with the device uniform
// u[k] (launch_sample_top): the pick in e.draft_pick (and e.ids[0], the next step's input), its q in e.draft_q_*.
int sampled_draft_chain(openjet_engine& e, int n, int n_valid, int k, const SampleTransform& tr, const double* u) {
    const auto& c = e.cfg;
    return draft_chain(e, n, [&](int j) -> int {
        CHECK(launch_topk(e.logits, 1, e.draft_n ? e.draft_n : c.n_vocab, n_valid, k, nullptr, nullptr, 0,
                          e.top_values, e.top_ids, e.top_work, e.stream, e.draft_n ? e.draft_ids : nullptr));
        CHECK(launch_sample_top(e.top_values, e.top_ids, k, tr, u + j, e.draft_pick + j, e.ids,
                                e.draft_q_ids + j * kTopKMax, e.draft_q_probs + j * kTopKMax, e.draft_q_len + j,
                                e.stream));
        return OPENJET_OK;
    });
}

// The verify rows of a device cycle after its drafts: the token again (the chain left its own draft in ids[0]; the
// caller wrote the token to e.cycle_n[1]) and the drafts.
int cycle_verify_ids(openjet_engine& e, int n_draft) {
    CHECK(cudaMemcpyAsync(e.ids, e.cycle_n + 1, sizeof(int32_t), cudaMemcpyDeviceToDevice, e.stream));
    CHECK(cudaMemcpyAsync(e.ids + 1, e.draft_pick, sizeof(int32_t) * n_draft, cudaMemcpyDeviceToDevice, e.stream));
    return OPENJET_OK;
}

// A device cycle's verify rows (the token and its drafts, in e.ids): the trunk, the lm_head and each row's top k among
// ids < n_valid (e.top_values, e.top_ids), for its verdict.
int cycle_verify_top(openjet_engine& e, int t, int n_valid, int k) {
    TRY(step_trunk(e, nullptr, t, true));
    mark(e, "lm_head");
    TRY(gemv(e, e.output, t, nullptr, e.logits));
    mark(e, "topk");
    CHECK(launch_topk(e.logits, t, e.cfg.n_vocab, n_valid, k, nullptr, nullptr, 0, e.top_values, e.top_ids,
                      e.top_work, e.stream));
    return OPENJET_OK;
}

// A sampled cycle's launches after its token (as cycle_greedy_launches') and its uniforms in e.draft_u (the drafts'
// n_draft, then the acceptance stream's n_draft + 1): n_draft sampled drafts, the verify trunk, the lm_head, each row's
// top k, the verdict (launch_accept_sampled: e.cycle_out, e.cycle_n[0], the uniforms taken in e.cycle_n[2]) and the
// MTP fill.
int cycle_sampled_launches(openjet_engine& e, int n_draft, int n_valid, int k, const SampleTransform& tr) {
    const int t = 1 + n_draft;
    if (n_draft) {
        TRY(sampled_draft_chain(e, n_draft, n_valid, k, tr, e.draft_u));
        TRY(cycle_verify_ids(e, n_draft));
    }
    TRY(cycle_verify_top(e, t, n_valid, k));
    CHECK(launch_accept_sampled(e.top_values, e.top_ids, k, tr, e.draft_pick, e.draft_q_ids, e.draft_q_probs,
                                e.draft_q_len, n_draft, e.draft_u + n_draft, e.cycle_out, e.cycle_n, e.cycle_n + 2,
                                e.stream));
    return verify_rows_kept(e, t);
}

// A greedy cycle's launches after its token (the caller wrote it to e.ids[0], and with drafts to e.cycle_n[1]: no
// input from the host, so a graph of them replays): n_draft greedy drafts, the verify trunk over the token and the
// drafts, the lm_head, each row's top 1, the verdict (e.cycle_out, e.cycle_n[0]) and the MTP fill; with the trunk's
// host bookkeeping (trunk_done), the only host state they change.
int cycle_greedy_launches(openjet_engine& e, int n_draft, int n_valid) {
    const int t = 1 + n_draft;
    if (n_draft) {  // the drafts, then the verify rows
        TRY(greedy_draft_chain(e, n_draft, n_valid, false));
        TRY(cycle_verify_ids(e, n_draft));
    }
    TRY(cycle_verify_top(e, t, n_valid, 1));
    CHECK(launch_accept_greedy(e.draft_pick, e.top_ids, n_draft, e.cycle_out, e.cycle_n, e.stream));
    return verify_rows_kept(e, t);
}

// OPENJET_BENCH_GRAPH=1: cycle_greedy_launches from a graph kept for the same key (captured first where none is).
int cycle_greedy_graph(openjet_engine& e, int n_draft, int n_valid) {
    const bool drafts = n_draft > 0;  // (a cycle of no drafts reads no draft row)
    const openjet_engine::CycleKey key{trunk_key(e, 1 + n_draft, true), n_draft, n_valid, drafts ? e.draft_n : 0,
                                       drafts ? e.draft_rows : nullptr, drafts ? e.draft_ids : nullptr};
    // (The key is taken before anything runs; a replay redoes the trunk's host bookkeeping, as the capture did inside.)
    return run_graph(e, e.cycle_graphs, key, Counted::kCycleGraphCapture, Counted::kCycleGraphReplay,
                     [&] { return cycle_greedy_launches(e, n_draft, n_valid); }, [&] { trunk_done(e, true); });
}

// A device cycle's call (cycle_greedy, cycle_sampled) after its own arguments' checks: the sequence's (idle, the MTP
// head, the token, the context, the draft chain's), the token to the device (the first input, and e.cycle_n[1] for the
// verify rows after the drafts), `launches` (the cycle's launches; their own copies), the verdict back (out [1 +
// n_draft], *n_out) with one wait, and the accept of the rows it kept.
template <class Launches>
int run_cycle(openjet_engine* e, int32_t token, int n_draft, int n_valid, int32_t* out, int* n_out, const char* what,
              const Launches& launches) {
    const auto& c = e->cfg;
    const int t = 1 + n_draft;
    TRY(check_verify(e, &token, 1, what));  // the MTP head and the buffers verify needs; the token's id
    if (static_cast<long long>(e->n_past) + t > c.n_ctx)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "%s: %d + %d tokens exceed the context of %d tokens", what, e->n_past,
                    t, c.n_ctx);
    if (n_draft) TRY(check_draft_chain(e, token, n_draft, n_valid, out, what));
    CHECK(cudaSetDevice(c.device));
    CHECK(cudaMemcpyAsync(e->ids, &token, sizeof(int32_t), cudaMemcpyHostToDevice, e->stream));
    if (n_draft) CHECK(cudaMemcpyAsync(e->cycle_n + 1, &token, sizeof(int32_t), cudaMemcpyHostToDevice, e->stream));
    TRY(launches());
    CHECK(cudaMemcpyAsync(n_out, e->cycle_n, sizeof(int), cudaMemcpyDeviceToHost, e->stream));
    CHECK(cudaMemcpyAsync(out, e->cycle_out, sizeof(int32_t) * t, cudaMemcpyDeviceToHost, e->stream));
    CHECK(cudaStreamSynchronize(e->stream));
    collect_profile(*e);
    e->pending = t;
    return accept_impl(*e, *n_out);
}
}  // namespace

extern "C" OPENJET_API int openjet_engine_mtp_draft_greedy(openjet_engine* e, int32_t token, int n, int n_valid,
                                                           int32_t* drafts, float* values, float* hidden) {
    const GpuFailureWatch watch(e);
    TRY(start_draft_chain(e, token, n, n_valid, drafts, "mtp_draft_greedy"));
    const auto& c = e->cfg;
    TRY(greedy_draft_chain(*e, n, n_valid, hidden != nullptr));
    CHECK(cudaMemcpyAsync(drafts, e->draft_pick, sizeof(int32_t) * n, cudaMemcpyDeviceToHost, e->stream));
    if (values) CHECK(cudaMemcpyAsync(values, e->draft_value, sizeof(float) * n, cudaMemcpyDeviceToHost, e->stream));
    if (hidden)
        CHECK(cudaMemcpyAsync(hidden, e->draft_hidden, sizeof(float) * n * c.n_embd, cudaMemcpyDeviceToHost,
                              e->stream));
    CHECK(cudaStreamSynchronize(e->stream));
    collect_profile(*e);
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_engine_cycle_greedy(openjet_engine* e, int32_t token, int n_draft, int n_valid,
                                                      int32_t* out, int* n_out) {
    const GpuFailureWatch watch(e);
    TRY(check_engine(e));  // (run_cycle: idle, the MTP head, the token)
    const auto& c = e->cfg;
    if (!out || !n_out || n_draft < 0 || 1 + n_draft > OPENJET_ENGINE_MAX_T || n_valid < 1 || n_valid > c.n_vocab)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "cycle_greedy: a NULL output, n_draft = %d is not 0..%d, or n_valid "
                    "= %d is not 1..%d", n_draft, OPENJET_ENGINE_MAX_T - 1, n_valid, c.n_vocab);
    return run_cycle(e, token, n_draft, n_valid, out, n_out, "cycle_greedy", [&] {
        return e->bench_graph ? cycle_greedy_graph(*e, n_draft, n_valid) : cycle_greedy_launches(*e, n_draft, n_valid);
    });
}

extern "C" OPENJET_API int openjet_engine_mtp_draft_sampled(openjet_engine* e, int32_t token, int n, int n_valid,
                                                            int k, double temperature, double top_p, double min_p,
                                                            const double* u, int32_t* drafts, int32_t* q_ids,
                                                            double* q_probs, int* q_len) {
    const GpuFailureWatch watch(e);
    TRY(check_engine(e));
    TRY(check_sampling(k, n_valid, temperature, top_p, min_p, u, std::min(n, OPENJET_ENGINE_MAX_T),
                       q_ids && q_probs && q_len, "mtp_draft_sampled"));
    TRY(start_draft_chain(e, token, n, n_valid, drafts, "mtp_draft_sampled"));
    CHECK(cudaMemcpyAsync(e->draft_u, u, sizeof(double) * n, cudaMemcpyHostToDevice, e->stream));
    TRY(sampled_draft_chain(*e, n, n_valid, k, SampleTransform{temperature, top_p, min_p}, e->draft_u));
    CHECK(cudaMemcpyAsync(drafts, e->draft_pick, sizeof(int32_t) * n, cudaMemcpyDeviceToHost, e->stream));
    CHECK(cudaMemcpy2DAsync(q_ids, sizeof(int32_t) * k, e->draft_q_ids, sizeof(int32_t) * kTopKMax,
                            sizeof(int32_t) * k, n, cudaMemcpyDeviceToHost, e->stream));
    CHECK(cudaMemcpy2DAsync(q_probs, sizeof(double) * k, e->draft_q_probs, sizeof(double) * kTopKMax,
                            sizeof(double) * k, n, cudaMemcpyDeviceToHost, e->stream));
    CHECK(cudaMemcpyAsync(q_len, e->draft_q_len, sizeof(int) * n, cudaMemcpyDeviceToHost, e->stream));
    CHECK(cudaStreamSynchronize(e->stream));
    collect_profile(*e);
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_engine_cycle_sampled(openjet_engine* e, int32_t token, int n_draft, int n_valid,
                                                       int k, double temperature, double top_p, double min_p,
                                                       const double* u, int32_t* out, int* n_out, int* n_used) {
    const GpuFailureWatch watch(e);
    TRY(check_engine(e));  // (run_cycle: idle, the MTP head, the token)
    const auto& c = e->cfg;
    if (n_draft < 0 || 1 + n_draft > OPENJET_ENGINE_MAX_T || n_valid < 1 || n_valid > c.n_vocab)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "cycle_sampled: n_draft = %d is not 0..%d, or n_valid = %d is not "
                    "1..%d", n_draft, OPENJET_ENGINE_MAX_T - 1, n_valid, c.n_vocab);
    TRY(check_sampling(k, n_valid, temperature, top_p, min_p, u, 2 * n_draft + 1, out && n_out && n_used,
                       "cycle_sampled"));
    return run_cycle(e, token, n_draft, n_valid, out, n_out, "cycle_sampled", [&]() -> int {
        CHECK(cudaMemcpyAsync(e->draft_u, u, sizeof(double) * (2 * n_draft + 1), cudaMemcpyHostToDevice, e->stream));
        TRY(cycle_sampled_launches(*e, n_draft, n_valid, k, SampleTransform{temperature, top_p, min_p}));
        CHECK(cudaMemcpyAsync(n_used, e->cycle_n + 2, sizeof(int), cudaMemcpyDeviceToHost, e->stream));
        return OPENJET_OK;
    });
}

extern "C" OPENJET_API int openjet_engine_set_attn_spread(openjet_engine* e, int spread) {
    TRY(check_idle(e, "set_attn_spread"));
    if (spread < 1 || spread > e->attn_spread_cap)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "set_attn_spread: %d is not 1..%d (the workspace was sized for "
                    "%d: create the engine with OPENJET_ATTN_SPREAD=%d for more, at most %d)", spread,
                    e->attn_spread_cap, e->attn_spread_cap, std::min(spread, kMaxAttnSpread), kMaxAttnSpread);
    e->attn_spread = spread;
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_engine_attn_spread(const openjet_engine* e, int* spread) {
    TRY(check_engine(e));
    if (!spread) return fail(OPENJET_ERR_INVALID_ARGUMENT, "spread is NULL");
    *spread = e->attn_spread;
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_engine_set_profile(openjet_engine* e, int on) {
    TRY(check_idle(e, "set_profile"));
    e->prof.on = on != 0;
    e->prof.used = 0;
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_engine_profile(openjet_engine* e, char* json, size_t capacity, int reset) {
    TRY(check_engine(e));
    const auto& p = e->prof;
    std::string out = "{\"on\": " + std::string(p.on ? "true" : "false") + ", \"calls\": " + std::to_string(p.calls) +
                      ", \"phases\": {";
    bool first = true;
    for (const auto& [label, v] : p.phases) {
        char buf[160];
        std::snprintf(buf, sizeof(buf), "%s\"%s\": {\"ms\": %.4f, \"marks\": %ld}", first ? "" : ", ", label.c_str(),
                      v.first, v.second);
        out += buf;
        first = false;
    }
    out += "}";
    // Counted with the profile on or off (decode_impl): the benchmark's timed steps run without its marks.
    char enq[96];
    std::snprintf(enq, sizeof(enq), ", \"enqueue\": {\"ms\": %.4f, \"calls\": %ld}", e->enqueue.first,
                  e->enqueue.second);
    out += enq;
    // The persistent FFN's own profile (ffn_persistent.cuh FfnProfile), where it ran while profiling.
    unsigned long long ffn[kFfnProfileSlots] = {};
    CHECK(cudaStreamSynchronize(e->stream));
    CHECK(cudaMemcpy(ffn, e->ffn_profile, sizeof(ffn), cudaMemcpyDeviceToHost));
    if (ffn[kProfLaunches]) {
        out += ", \"persistent_ffn\": {";
        for (int i = 0; i < kProfStartMin; ++i)
            out += (i ? ", \"" : "\"") + std::string(ffn_profile_name(i)) + "\": " + std::to_string(ffn[i]);
        out += "}";
    }
    out += "}";
    if (!json || capacity < out.size() + 1)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "profile: the buffer holds %zu bytes, the report needs %zu", capacity,
                    out.size() + 1);
    std::memcpy(json, out.c_str(), out.size() + 1);
    if (reset) {
        e->prof.phases.clear();
        e->prof.calls = 0;
        e->enqueue = {0.0, 0};
        CHECK(ffn_profile_reset(e->ffn_profile, e->stream));
        CHECK(cudaStreamSynchronize(e->stream));
    }
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_engine_set_draft_rows(openjet_engine* e, const int32_t* ids, int n, int keep) {
    const GpuFailureWatch watch(e);
    TRY(check_idle(e, "set_draft_rows"));
    const int n_vocab = e->cfg.n_vocab;
    if (!e->has_mtp) return fail(OPENJET_ERR_INVALID_ARGUMENT, "set_draft_rows: the engine has no MTP head");
    if (keep < 0 || keep > e->draft_n || n < keep || n > n_vocab || (n > keep && !ids))
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "set_draft_rows: keep = %d not in 0..%d, or n = %d not in keep..%d, "
                    "or ids is NULL", keep, e->draft_n, n, n_vocab);
    for (int i = keep; i < n; ++i)
        if (ids[i] < 0 || ids[i] >= n_vocab)
            return fail(OPENJET_ERR_INVALID_ARGUMENT, "set_draft_rows: ids[%d] = %d is outside the vocabulary [0, %d)", i,
                        ids[i], n_vocab);
    CHECK(cudaSetDevice(e->cfg.device));
    const size_t rb = e->output_row_bytes(), db = e->draft_row_bytes();
    if (n > e->draft_cap) {  // grow by an eighth (a sequence adds a few rows at a time), keeping `keep` rows
        // (whole groups stay within n_vocab: it is a multiple of 16 where output.weight is tiled)
        const int grown = std::min(n_vocab, std::max(n, e->draft_cap + std::max(1024, e->draft_cap / 8)));
        const int cap = e->draft_groups_of(grown);
        char* rows = nullptr;
        int32_t* dids = nullptr;
        const size_t bytes = static_cast<size_t>(cap) * db + 16;  // +16: the GEMV may read to a 16-byte boundary
        if (cudaMalloc(&rows, bytes) != cudaSuccess || cudaMalloc(&dids, sizeof(int32_t) * cap) != cudaSuccess) {
            cudaGetLastError();
            if (rows) cudaFree(rows);
            return fail(OPENJET_ENGINE_ERR_DEVICE_MEMORY, "set_draft_rows: cudaMalloc of %.1f MiB for %d draft rows "
                        "failed", bytes / 1048576.0, cap);
        }
        // zeros: the last group's rows past draft_n (their logits are unread, but finite) and the tile pitch's padding;
        // then the kept rows (whole groups in the tile layout, contiguous) and their ids (the device draft picks map
        // positions to ids through them), on the engine's stream (non-blocking: the legacy stream's copies would not
        // be ordered with it)
        cudaError_t err = cudaMemsetAsync(rows, 0, bytes, e->stream);
        if (err == cudaSuccess && keep)
            err = cudaMemcpyAsync(rows, e->draft_rows, static_cast<size_t>(e->draft_groups_of(keep)) * db,
                                  cudaMemcpyDeviceToDevice, e->stream);
        if (err == cudaSuccess && keep)
            err = cudaMemcpyAsync(dids, e->draft_ids, sizeof(int32_t) * keep, cudaMemcpyDeviceToDevice, e->stream);
        if (err == cudaSuccess) err = cudaStreamSynchronize(e->stream);  // before the old buffers are freed
        if (err != cudaSuccess) {  // the new buffers are not the engine's yet: freed here (the old ones stay)
            cudaFree(rows);
            cudaFree(dids);
            return cuda_fail(err, "set_draft_rows (zeroing the new rows, copying the kept ones)");
        }
        if (e->draft_rows) cudaFree(e->draft_rows);
        if (e->draft_ids) cudaFree(e->draft_ids);
        e->draft_rows = rows, e->draft_ids = dids, e->draft_cap = cap;
    }
    if (n > keep) {
        CHECK(cudaMemcpyAsync(e->draft_ids + keep, ids + keep, sizeof(int32_t) * (n - keep), cudaMemcpyHostToDevice,
                              e->stream));
        CHECK(launch_gather_rows(e->output.d, rb, e->output.tiled ? unit_bytes(e->output.type) : 0, e->draft_ids + keep,
                                 n - keep, e->draft_rows, keep, e->stream));
        CHECK(cudaStreamSynchronize(e->stream));
    }
    e->draft_n = n;
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_engine_memory(const openjet_engine* e, openjet_engine_memory_report* r) {
    TRY(check_engine(e));
    if (!r) return fail(OPENJET_ERR_INVALID_ARGUMENT, "report is NULL");
    r->weights_bytes = e->weights_bytes;
    r->kv_bytes = e->kv_bytes;
    r->state_bytes = e->gdn_bytes;
    r->checkpoint_bytes = e->ckpt_bytes;
    r->scratch_bytes = e->scratch_bytes + e->draft_bytes();
    r->prefill_f16_bytes = e->prefill_f16_bytes;
    r->total_bytes = r->weights_bytes + e->kv_bytes + e->gdn_bytes + e->ckpt_bytes + r->scratch_bytes +
                     r->prefill_f16_bytes;
    return OPENJET_OK;
}
