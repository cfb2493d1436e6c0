// Gated DeltaNet recurrent step (qwen38.md §3.1 steps 2-7) over T tokens (a decode or verify step's <= 8, or a
// prefill chunk's rows), one thread block per value head.
//
// Design. The delta rule is independent per column j of S[k][j] (j = value dim): δ_j, the update of column
// j and o_j need only column j, q, k, β and g. A block owns one value head; thread (rg, j) keeps rows
// k = rg*R .. rg*R+R-1 of column j in registers (R = kGdnRowsPerThread, 128/R row groups), so the 64 KiB
// head state is read once and written once per call whatever T is. A warp's 32 lanes are 32 adjacent
// columns: every row load/store is one coalesced 128-byte line. Per token each thread forms partial
// dots over its R rows of the decayed state S' = e^g S (with k and with q), the partials meet in shared
// memory (one barrier per token, double-buffered) and every thread sums the 128/R partials of its column
// in the same fixed order, so
//     δ = β (v − S'ᵀk),  S ← S' + k δᵀ,  o = S'ᵀq + δ (k·q)      (= S_newᵀq, the spec's cheap form).
// The block also does the head's causal conv (q/k channels of key head h mod n_k, v channels of head h),
// the L2 norms, the gates and the gated RMSNorm, so one launch (48 blocks) is the whole step.
//
// Column split (prefill calls, t > 8 rows without the fused projections): the same per-column work on blocks
// of kGdnSplitCols columns (4 blocks per head, 192 at 27B instead of 48: a chunk's token-by-token recurrence,
// ~1.1 us a token on one SM per head, spreads over the whole GPU). Each block does the conv, norms and gates of
// q and k (all 128 rows, which every column reads) and of its own v columns, and writes its columns' o to y;
// a second launch (one warp per token and head) applies the gated RMSNorm, which needs the whole o row, in
// place. Every value is computed by the same operations in the same order: the same bits.
//
// T-invariance: every per-token quantity is computed by the same code in the same order whether a token
// comes first in a call or later, and the state round-trips through memory as exact fp32, so T tokens in
// one call equal T one-token calls bit for bit.
//
// Conv state: conv_state_in and conv_state_out must not overlap (up to three blocks read a key head's
// q/k channels; one of them writes them), so the caller ping-pongs two buffers. S is updated in place.
#pragma once

#include <cuda_runtime.h>

#include "cp_async.cuh"  // prefetch_l2
#include "gemv.cuh"  // f32_dot_lanes: the fused beta/alpha projections
#include "pdl.cuh"  // pdl_let_in (kLateLaunch)

namespace openjet {

constexpr int kGdnHeadDim = 128;     // linear_key_head_dim = linear_value_head_dim
constexpr int kGdnConvTaps = 4;      // linear_conv_kernel_dim; the state holds the last 3 raw inputs
constexpr int kGdnMaxT = 8;          // token rows per sub-step (shared memory holds one sub-step's inputs)
constexpr int kGdnMaxRows = 8192;    // token rows per call (a prefill chunk: OPENJET_ENGINE_PREFILL_ROWS_MAX)
constexpr int kGdnRowsPerThread = 16;                                        // R: state rows in registers
constexpr int kGdnThreads = kGdnHeadDim * (kGdnHeadDim / kGdnRowsPerThread);  // 1024: one per (row group, column)
constexpr int kGdnSplitCols = 32;                                            // columns per block, column split

struct GdnProbe;  // below: what OPENJET_BENCH_GDN_PROBE records

struct GdnStepArgs {
    int n_k, n_v, t;                  // key heads, value heads (n_v % n_k == 0), tokens 1..kGdnMaxRows
    float eps;                        // L2 norm and gated RMSNorm eps (1e-6)
    const float* qkv;                 // [t, conv_dim] projection output, conv_dim = 2*n_k*128 + n_v*128
    const float* z;                   // [t, n_v*128] gate projection
    const float* b;                   // [t, n_v]  beta logits
    const float* alpha;               // [t, n_v]  decay logits
    const float* conv_w;              // [conv_dim, 4] tap 3 multiplies the current token
    const float* conv_state_in;       // [3, conv_dim] raw inputs x_{-3}, x_{-2}, x_{-1}
    float* conv_state_out;            // [3, conv_dim] (must not overlap conv_state_in)
    const float* ssm_a;               // [n_v] = -exp(A_log)
    const float* dt_bias;             // [n_v]
    const float* norm_w;              // [128] gated RMSNorm weight (plain w)
    float* state;                     // [n_v, 128 (k), 128 (v)] fp32, updated in place unless state_out
    float* y;                         // [t, n_v*128] rms(o)·w·silu(z), input of ssm_out
    float* state_out = nullptr;       // or where the updated state goes (state is then only read; a verify
                                      // step keeps the committed state for its accepted rows' replay)
    // A deferred accept (the engine's fused replay, OPENJET_GDN_REPLAY=fused): the call first runs `replay` rows
    // (0..kGdnMaxT) of the previous verify step's kept rows from its ring (replay_qkv [replay, conv_dim], replay_b /
    // replay_alpha [replay, n_v] logits), the same per-row code as its own rows, without outputs; its own t rows
    // follow (y rows 0..t-1). Every row's arithmetic is what a call of those rows alone does: the same bits.
    int replay = 0;
    const float* replay_qkv = nullptr;
    const float* replay_b = nullptr;
    const float* replay_alpha = nullptr;
    // Where the state (in place, or state_out) and conv_state_out are written: after this many of the call's
    // rows, replay rows counted; -1: after all of them. A verify step with a fused replay commits its replay rows
    // only (its own rows wait in the ring for accept); 0 writes neither.
    int commit = -1;
    // The beta and alpha projections fused (F32 W [n_v, proj_k], both set; t <= kGdnMaxT): each block computes its
    // head's logits from x_in [t, proj_k] in the F32 GEMV's order (f32_dot_lanes: the same bits as the two launches
    // it saves) and writes them to b_out / alpha_out where set (a verify step's ring); b and alpha unread.
    const float* w_beta = nullptr;
    const float* w_alpha = nullptr;
    const float* x_in = nullptr;
    int proj_k = 0;
    float* b_out = nullptr;
    float* alpha_out = nullptr;
    // OPENJET_GDN_CHUNKED=2's scratch (gdn_chunk.cuh, gdn_chunk_scratch_floats for t rows), or null.
    float* chunk_scratch = nullptr;
    // Form 2 only (gdn_chunk.cuh): the state and conv state before row snap_row (a multiple of kGdnChunk in 1..t-1)
    // also written to snap_state / snap_conv (a checkpoint slot's parts), or null.
    float* snap_state = nullptr;
    float* snap_conv = nullptr;
    int snap_row = 0;
    // The out projection's pack of y made by the step itself (OPENJET_GDN_STEP_PACK: launch_gdn_step fills pack_out
    // for a whole-head call of at most kGdnMaxT rows whose blocks the GPU holds at once, and launches the kernel form
    // that reads it; the default form ignores it): after its y rows, each block gives its head's max |y| of every row
    // to the others through pack_sync (GdnPackSync, zeroed once, never reset by the host) and packs its head's 4
    // 32-blocks of each row under the row's max, as launch_pack_act packs y: the same bits, without that launch.
    ActPack pack_out{nullptr, nullptr, nullptr, 0};
    unsigned* pack_sync = nullptr;
    // The staged form (OPENJET_GDN_STAGED, on in the engine by default): a whole-head call copies what it reads that no
    // kernel writes (its conv taps, the norm weight, its ssm_a and dt_bias) into shared memory before its PDL wait,
    // asks L2 for its conv state's lines there too, and its own pack takes y from shared memory where it replays no
    // rows (gdn_stage_params). The same values, so the same bits. launch_gdn_step takes it where conv_w and norm_w are
    // 16-byte aligned.
    bool staged = false;
    // OPENJET_GDN_LATE (on in the engine by default; the staged own-pack form only): the state's loads before the fused
    // projections, and the kernels after the step let in past its first barrier instead of at its start (the next
    // GEMV's ring fill then streams after those loads, not beside them). The same values, so the same bits.
    bool late_launch = false;
    // OPENJET_BENCH_GDN_PROBE (a measurement; outputs unchanged): where set (gdn_probe_buffer()), a launch of the
    // default form (whole heads, own pack, staged) records its phases' clocks in it (GdnProbe).
    GdnProbe* probe = nullptr;
};

// The words through which a launch's blocks meet for the step's own pack (GdnStepArgs::pack_sync), no atomics, no
// fence: block b writes its head's max |y| of each row with its phase (its launches so far, counted in phase_of[b],
// which only it reads) in one 64-bit word, row_word[b][row] = phase << 32 | the max's bits; every block takes each
// other block's word once its phase is the launch's. They start zeroed and need no host reset (each launch runs every
// block once: the phases agree).
constexpr int kGdnPackMaxBlocks = 64;
struct GdnPackSync {
    unsigned phase_of[kGdnPackMaxBlocks];
    unsigned long long row_word[kGdnPackMaxBlocks][kGdnMaxT];
};

// What a probed GDN step (GdnStepArgs::probe) leaves, the last launch's: thread 0 of block b writes clock64() at each
// of kGdnProbePoints points (the phase ends below, in order; a call of several sub-steps leaves its last one's),
// the global timer at its entry and end (ns) and its SM.
enum GdnProbePoint {
    kProbeEntry,        // the kernel's first instruction
    kProbeWaited,       // past its PDL wait (the kernel before done)
    kProbeProjected,    // the fused beta / alpha projections (thread 0's group: beta of row 0)
    kProbeLoaded,       // the sub-step's first barrier: every load in, the rows stored in shared memory
    kProbeConv,         // the conv and the gates
    kProbeNormed,       // the q / k L2 norms
    kProbeKq,           // k·q
    kProbeDelta,        // the delta rule, every row
    kProbeGatedNorm,    // y of row 0 (warp 0's gated RMSNorm)
    kProbePublished,    // the own pack: the block's row maxima published
    kProbeMet,          // every block's maxima in
    kProbeEnd,          // the pack written
    kGdnProbePoints
};
struct GdnProbe {
    long long clock[kGdnPackMaxBlocks][kGdnProbePoints];
    unsigned long long ns[kGdnPackMaxBlocks][2];
    unsigned sm[kGdnPackMaxBlocks];
};

template <bool kProbe>
__device__ __forceinline__ void gdn_mark(GdnProbe* p, int point) {
    if constexpr (kProbe) {
        if (threadIdx.x == 0) p->clock[blockIdx.x][point] = clock64();
    }
}

// One GDN step for all value heads: grid n_v blocks of kGdnThreads, or (a call of more than kGdnMaxT rows
// without the fused projections, unless OPENJET_GDN_SPLIT=0) the column split or the chunked form and its gated
// RMSNorm launch. pack (optional): where that separate gated RMSNorm runs, it also packs y for the out projection
// (launch_pack_act's bits: pack_act_row of the same values) into *pack in the same pass, y itself left as o, and
// *packed says so (the caller packs y itself otherwise); only under OPENJET_GDN_NORM_PACK=1 (read at each call; an
// experiment until its bit test has run on a GPU). pack_scales (optional, with pack): the rows' scales of a bounded
// pack (row_bound.cuh launch_gdn_out_scale): the gated norm then packs each head's values under its row's scale, a
// warp a head, without a row's maximum (numerics of its own where v s is subnormal); pack->inv[row] = 1 / s.
cudaError_t launch_gdn_step(const GdnStepArgs& a, cudaStream_t stream, const ActPack* pack = nullptr,
                            bool* packed = nullptr, const float* pack_scales = nullptr);

// OPENJET_BENCH_GDN_PROBE: the device address of the record a probed launch writes (GdnStepArgs::probe; null where
// CUDA fails to give it), and a copy of its last contents.
GdnProbe* gdn_probe_buffer();
cudaError_t gdn_probe_read(GdnProbe* out);

constexpr int kGdnRowGroups = kGdnHeadDim / kGdnRowsPerThread;  // partial dots per column

// Shared memory of one head's step (47.4 KiB, static: the own pack's kernels reach 48,544 bytes of the 49,152 a
// static allocation may take).
struct GdnSmem {
    float x[3][kGdnMaxT][kGdnHeadDim];  // q, k, v: raw qkv, then silu(conv), then q and k L2-normalised
    float z[kGdnMaxT][kGdnHeadDim];     // gate projection of this head
    float o[kGdnMaxT][kGdnHeadDim];     // S_tᵀ q_t
    float norm_w[kGdnHeadDim];
    float4 conv_w[3 * kGdnHeadDim];     // this head's conv taps (q, k, v channels), and the window of their
    float conv_x[3][3 * kGdnHeadDim];   // last three raw inputs carried between sub-steps (each thread its own)
    float red[2][2][kGdnRowGroups][kGdnHeadDim];  // [token parity][k·S', q·S'][row group][column]
    float beta[kGdnMaxT], decay[kGdnMaxT], kq[kGdnMaxT];
    float proj[2 * kGdnMaxT][4];  // fused projections: [2 t + (alpha)][warp of the 128-thread group]
    float gate_par[2];            // the staged form's ssm_a[h], dt_bias[h]
};

__device__ __forceinline__ float gdn_sigmoid(float x) { return __frcp_rn(__fadd_rn(1.0f, expf(-x))); }
__device__ __forceinline__ float gdn_silu(float x) { return __fmul_rn(x, gdn_sigmoid(x)); }
// log(1 + e^x), the identity above 20 (PyTorch's threshold, as reference/ops.py).
__device__ __forceinline__ float gdn_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float gdn_warp_sum(float s) {
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
    return s;
}

// Sum over a warp of the squares of row[lane + 32 i], i = 0..3 (fixed order: lane-local, then butterfly).
__device__ __forceinline__ float gdn_warp_sumsq(const float* row, int lane) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) s = __fmaf_rn(row[lane + 32 * i], row[lane + 32 * i], s);
    return gdn_warp_sum(s);
}

// 1 / sqrt(mean o² + eps) of one token's head row o (128 values), by one warp (every lane gets it).
__device__ __forceinline__ float gdn_inv_rms(const float* o, float eps, int lane) {
    return __frcp_rn(__fsqrt_rn(__fadd_rn(__fdiv_rn(gdn_warp_sumsq(o, lane), (float)kGdnHeadDim), eps)));
}
// One element of the gated RMSNorm: o·r·w·silu(z), r = gdn_inv_rms of its head row.
__device__ __forceinline__ float gdn_gated(float o, float r, float w, float z) {
    return __fmul_rn(__fmul_rn(__fmul_rn(o, r), w), gdn_silu(z));
}

// y = o·rsqrt(mean o² + eps)·w·silu(z) of one token's head row o (128 values), by one warp; out may be o.
template <class W, class Z>
__device__ __forceinline__ void gdn_gated_norm_row(const float* o, const W& norm_w, const Z& z, float eps, int lane,
                                                   float* out) {
    const float r = gdn_inv_rms(o, eps, lane);
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // each lane rewrites only the elements it read: in place is safe
        const int c = lane + 32 * i;
        out[c] = gdn_gated(o[c], r, norm_w(c), z(c));
    }
}

// The conv channel (index into a qkv row, conv_w's rows, the conv state's rows) of column cl of part 0 (q) or 1 (k)
// of key head kh, or of part 2 (v) of value head h.
__device__ __forceinline__ int gdn_conv_channel(int key_dim, int kh, int h, int part, int cl) {
    return part == 0 ? kh * kGdnHeadDim + cl
                     : part == 1 ? key_dim + kh * kGdnHeadDim + cl : 2 * key_dim + h * kGdnHeadDim + cl;
}

// Head h's state lines in `state` ([n_v, 128, 128]) at columns [c0, c0 + kCols), 128 rows of kCols floats, asked of
// L2 a line a thread: threads 0 .. gdn_state_lines<kCols> - 1 take one.
template <int kCols> constexpr int gdn_state_lines = kGdnHeadDim * (kCols / 32);  // 32 floats a line
template <int kCols>
__device__ __forceinline__ void gdn_prefetch_state(const float* state, int h, int c0) {
    constexpr int D = kGdnHeadDim, kLinesPerRow = kCols / 32;
    static_assert(kCols % 32 == 0, "whole lines a row");
    static_assert(gdn_state_lines<kCols> <= kGdnThreads, "a line a thread");
    const int tid = threadIdx.x;
    if (tid < gdn_state_lines<kCols>)
        prefetch_l2(state + (size_t)h * D * D + (size_t)(tid / kLinesPerRow) * D + c0 + (tid % kLinesPerRow) * 32);
}

// Asks L2 for what gdn_step_head<kCols> reads at column c0 of head h that no kernel just before it writes: the
// state's lines there (gdn_prefetch_state) and, whole heads with the fused projections, the head's beta and
// alpha weight rows (read in five round trips a thread: a helper's SASS audit, 2026-12-05, counted ~5 DRAM round
// trips a launch without this); a line a thread. A launch calls it before its PDL wait, so those cold lines (3 MB of
// state and 1 MB of weights a layer of the 27B; a step's weight stream evicts them from L2) come in while the kernel
// before still runs. Only a hint: every load stays after the wait (L2 is the point of coherence), so the wait's rule
// holds.
template <int kCols>
__device__ __forceinline__ void gdn_prefetch_inputs(const GdnStepArgs& a, int h, int c0) {
    gdn_prefetch_state<kCols>(a.state, h, c0);
    if (kCols == kGdnHeadDim && a.w_beta) {
        const int lines = (a.proj_k + 31) >> 5, i = static_cast<int>(threadIdx.x) - gdn_state_lines<kCols>;
        if (i >= 0 && i < 2 * lines)
            prefetch_l2((i < lines ? a.w_beta : a.w_alpha) + (size_t)h * a.proj_k + (i < lines ? i : i - lines) * 32);
    }
}

// The staged form (GdnStepArgs::staged) before its PDL wait, by a whole head's block: cp.async copies of the head's
// conv taps, the norm weight and its ssm_a, dt_bias into shared memory (weights: no kernel writes them, so they may be
// read before the wait; plain loads would not stay there, pdl.cuh), and L2 hints for its conv state's 36 lines (the
// last step wrote them long ago; a step's weight stream evicts them). Without it each of these is a DRAM round trip
// in the step's chain after the wait: the taps and the conv state with the state's loads, ssm_a and dt_bias after
// the first barriers (the gates). gdn_step_head<128, true> waits for the copies before its first barrier.
__device__ __forceinline__ void gdn_stage_params(const GdnStepArgs& a, int h, GdnSmem& sm) {
    constexpr int D = kGdnHeadDim;
    const int tid = threadIdx.x, key_dim = a.n_k * D, conv_dim = 2 * key_dim + a.n_v * D, kh = h % a.n_k;
    if (tid < 3 * D) {
        cp_async16(&sm.conv_w[tid], a.conv_w + (size_t)gdn_conv_channel(key_dim, kh, h, tid / D, tid % D) * 4);
    } else if (tid < 3 * D + D / 4) {
        cp_async16(&sm.norm_w[4 * (tid - 3 * D)], a.norm_w + 4 * (tid - 3 * D));
    } else if (tid < 3 * D + D / 4 + 2) {
        const int i = tid - 3 * D - D / 4;
        cp_async4(&sm.gate_par[i], (i ? a.dt_bias : a.ssm_a) + h);
    } else if (tid >= 4 * D && tid < 4 * D + 36) {  // 3 rows x 3 parts x 4 lines of 32 floats
        const int i = tid - 4 * D, row = i / 12, part = i % 12 / 4, line = i % 4;
        prefetch_l2(a.conv_state_in + (size_t)row * conv_dim + gdn_conv_channel(key_dim, kh, h, part, 32 * line));
    }
    cp_async_commit();
}

// The whole step for value head h, columns [c0, c0 + kCols), run by one block of exactly kGdnRowGroups * kCols
// threads (a persistent kernel calls this per head; it contains __syncthreads, so all threads of the block
// must call it). kCols = 128 (c0 = 0) is the whole head: y written; fewer is the column split: its columns'
// o written to y, gdn_gated_norm_row to follow. The call's a.t rows go in sub-steps of kGdnMaxT: the state
// stays in registers and the conv window in shared memory between them, and the next sub-step's inputs are
// loaded while the delta rule of this one runs. kStaged: the block ran gdn_stage_params before its wait, so the taps,
// the norm weight and the gates' parameters are in shared memory, and step 4 also leaves y in sm.o (in place of o:
// the own pack's input where the call replays no rows).
template <int kCols = kGdnHeadDim, bool kStaged = false, bool kProbe = false, bool kLateLaunch = false>
__device__ __forceinline__ void gdn_step_head(const GdnStepArgs& a, int h, GdnSmem& sm, int c0 = 0) {
    constexpr int D = kGdnHeadDim, R = kGdnRowsPerThread;
    constexpr bool kWhole = kCols == D;
    static_assert(!kStaged || kWhole, "the staged form takes whole heads");
    static_assert(!kProbe || kStaged, "the probe takes the staged form");
    constexpr int kThreads = kGdnRowGroups * kCols, kWarps = kThreads / 32;
    constexpr int W = 2 * D + kCols;  // conv channels of the block: q, k (all rows), v (its columns)
    static_assert(D % kCols == 0 && kCols % 32 == 0, "whole warps of columns");
    const int tid = threadIdx.x, j = c0 + tid % kCols, rg = tid / kCols, lane = tid & 31, warp = tid >> 5;
    const int kh = h % a.n_k;                                  // tiled pairing: value head h reads key head h mod n_k
    const int key_dim = a.n_k * D, value_dim = a.n_v * D, conv_dim = 2 * key_dim + value_dim;
    // The call's rows: a.replay rows from the ring first (GdnStepArgs::replay), then its own a.t; "own" below is a
    // row's index among the latter (negative: a replayed row, which writes no output).
    const int total = a.replay + a.t;
    const int commit = a.commit < 0 ? total : a.commit;  // the state and conv window go out after this many rows

    // kLateLaunch: the state first, its DRAM round trip under the fused projections below, and the kernels after this
    // one let in only once every block has its rows (the caller waited, but did not let them in: pdl_start), so that
    // the next GEMV's ring fill does not stream its weights ahead of these loads.
    float s_early[kLateLaunch ? R : 1];
    if constexpr (kLateLaunch) {
        const size_t st = (size_t)h * D * D + (size_t)(rg * R) * D + j;
#pragma unroll
        for (int i = 0; i < R; ++i) s_early[i] = a.state[st + i * D];
    }
    // The fused beta (even jobs) and alpha (odd) projections of each of the call's own rows (at most kGdnMaxT: the
    // launcher checks; replayed rows bring theirs from the ring), a 128-thread group per row; first, so that their registers are free again before the state's 16
    // per thread are loaded (64 at most).
    if (kWhole && a.w_beta) {  // (the launcher takes the column split without the fused projections)
        // The dots take their cold weight rows in five round trips of two float4 a thread (the registers bound the
        // unroll); the caller asked L2 for both rows' lines before its PDL wait (gdn_prefetch_inputs), so that not
        // every trip waits on DRAM.
        // Where the 2 t jobs outnumber the 8 groups (t > 4), a group takes one matrix's row for two tokens, their dots
        // sharing the weight loads (each token's chain of sums as alone), so they run in one round instead of two:
        // the probe's projections at T=5 6.29 -> 4.58 us, verify T=5 ~0.05 ms faster (H200, NOTES_gemv.md).
        constexpr int kGroups = kThreads / 128;
        const int per = 2 * a.t > kGroups ? 2 : 1;  // a job's rows of x_in
#pragma unroll 1
        for (int job = tid / 128; job < 2 * ((a.t + per - 1) / per); job += kGroups) {
            const float* w = ((job & 1) ? a.w_alpha : a.w_beta) + (size_t)h * a.proj_k;
            const int row = (job >> 1) * per;  // sm.proj[2 row + (job & 1)]: that row's beta or alpha partials
            const float* x = a.x_in + (size_t)row * a.proj_k;
            if (row + 1 < a.t && per == 2) {
                float acc[2];
                f32_dot_lanes<2, 2>(w, x, a.proj_k, tid % 128, acc);
                const float v0 = f32_warp_sum(acc[0]), v1 = f32_warp_sum(acc[1]);
                if (lane == 0) {
                    sm.proj[2 * row + (job & 1)][warp % 4] = v0;
                    sm.proj[2 * row + 2 + (job & 1)][warp % 4] = v1;
                }
            } else {
                float acc[1];
                f32_dot_lanes<1, 2>(w, x, a.proj_k, tid % 128, acc);
                const float v = f32_warp_sum(acc[0]);
                if (lane == 0) sm.proj[2 * row + (job & 1)][warp % 4] = v;
            }
        }
    }  // sm.proj is read after the next barrier
    gdn_mark<kProbe>(a.probe, kProbeProjected);

    // Issue every global load first (state, inputs, weights): they are all in flight at once, and
    // nothing later waits on a global load (a load after a store through a maybe-aliasing pointer would).
    const size_t st = (size_t)h * D * D + (size_t)(rg * R) * D + j;  // S[h][rg*R + i][j] at [st + i*D]
    float s[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
        if constexpr (kLateLaunch) s[i] = s_early[i];
        else s[i] = a.state[st + i * D];
    }
    const auto channel = [&](int part, int cl) { return gdn_conv_channel(key_dim, kh, h, part, cl); };
    // The block's channel ch (0 .. W - 1): its part (q, k, v) and column there (v: the block's columns).
    const auto part_of = [](int ch) { return kWhole ? ch / D : ch < D ? 0 : ch < 2 * D ? 1 : 2; };
    const auto column_of = [&](int ch) { return kWhole ? ch % D : ch < 2 * D ? ch % D : c0 + ch - 2 * D; };
    // f(ch) for each of this thread's conv channels; f(i) for i = warp, warp + kWarps, ... < n (whole head: one).
    const auto for_channels = [&](auto&& f) {
        if constexpr (kWhole) {
            if (tid < W) f(tid);
        } else {
#pragma unroll 1
            for (int ch = tid; ch < W; ch += kThreads) f(ch);
        }
    };
    const auto for_warp_jobs = [&](int n, auto&& f) {
        if constexpr (kWhole) {
            if (warp < n) f(warp);
        } else {
#pragma unroll 1
            for (int i = warp; i < n; i += kWarps) f(i);
        }
    };
    constexpr int kLoads = (kGdnMaxT * W + kThreads - 1) / kThreads;  // raw qkv values per thread
    static_assert(!kWhole || kGdnMaxT * D <= kThreads, "one z value per thread");
    float xr[kLoads], zr = 0.0f;
    const auto qkv_row = [&](int row) {  // the call's row: replayed from the ring, or its own
        return row < a.replay ? a.replay_qkv + (size_t)row * conv_dim : a.qkv + (size_t)(row - a.replay) * conv_dim;
    };
    const auto load_rows = [&](int t0) {  // this thread's raw qkv (and z) values of rows t0 .. t0 + kGdnMaxT - 1
        const int n = min(kGdnMaxT, total - t0);
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
            const int e = tid + u * kThreads, t = e / W, ch = e - t * W;
            if constexpr (kWhole)
                xr[u] = e < n * W ? qkv_row(t0 + t)[channel((e / D) % 3, e % D)] : 0.0f;
            else
                xr[u] = e < n * W ? qkv_row(t0 + t)[channel(part_of(ch), column_of(ch))] : 0.0f;
        }
        const int own = t0 + tid / D - a.replay;  // z only for the call's own rows (a replayed row has no output)
        if (kWhole && tid < n * D) zr = own >= 0 ? a.z[(size_t)own * value_dim + h * D + j] : 0.0f;
    };
    load_rows(0);
    // Conv thread of channel ch: what it puts in shared memory only it reads back.
    for_channels([&](int ch) {
        const int c = channel(part_of(ch), column_of(ch));
        if constexpr (!kStaged)
            sm.conv_w[ch] =
                make_float4(a.conv_w[c * 4 + 0], a.conv_w[c * 4 + 1], a.conv_w[c * 4 + 2], a.conv_w[c * 4 + 3]);
#pragma unroll
        for (int i = 0; i < 3; ++i) sm.conv_x[i][ch] = a.conv_state_in[i * conv_dim + c];
    });
    if (!kStaged && kWhole && tid >= 4 * D && tid < 5 * D) sm.norm_w[j] = a.norm_w[j];
    if constexpr (kStaged) cp_async_wait<0>();  // gdn_stage_params' copies, seen by all after the first barrier

#pragma unroll 1
    for (int t0 = 0; t0 < total; t0 += kGdnMaxT) {
        const int n_tok = min(kGdnMaxT, total - t0);
        if (t0) __syncthreads();  // the last sub-step's readers of shared memory are done

#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
            const int e = tid + u * kThreads, t = e / W, ch = e - t * W;
            if (e >= n_tok * W) continue;
            if (kWhole) sm.x[(e / D) % 3][t][e % D] = xr[u];
            else sm.x[part_of(ch)][t][column_of(ch)] = xr[u];
        }
        if (kWhole && tid < n_tok * D) sm.z[tid / D][j] = zr;
        __syncthreads();
        gdn_mark<kProbe>(a.probe, kProbeLoaded);
        if (t0 == 0) pdl_let_in<kLateLaunch>();

        // 1. Causal conv over this head's 384 channels, then SiLU, in place; beside it the gates:
        // β = σ(b), g = ssm_a·softplus(α + dt_bias), decay = e^g (after the barrier: the fused logits are in sm.proj).
        constexpr int kGateTid = kWhole ? 3 * D : 0;  // whole head: threads without a conv channel
        if (tid >= kGateTid && tid < kGateTid + n_tok) {
            const int t = tid - kGateTid, row = t0 + t, own = row - a.replay;
            float bl, al;  // the logits: the ring's (a replayed row), computed above (the F32 GEMV's final sum), or read
            if (own < 0) {
                bl = a.replay_b[row * a.n_v + h];
                al = a.replay_alpha[row * a.n_v + h];
            } else if (a.w_beta) {
                const float* pb = sm.proj[2 * own];
                const float* pa = sm.proj[2 * own + 1];
                bl = f32_warps_total(pb[0], pb[1], pb[2], pb[3]);
                al = f32_warps_total(pa[0], pa[1], pa[2], pa[3]);
                if (a.b_out) a.b_out[own * a.n_v + h] = bl;
                if (a.alpha_out) a.alpha_out[own * a.n_v + h] = al;
            } else {
                bl = a.b[own * a.n_v + h];
                al = a.alpha[own * a.n_v + h];
            }
            sm.beta[t] = gdn_sigmoid(bl);
            const float ssm_a = kStaged ? sm.gate_par[0] : a.ssm_a[h];
            const float dt_bias = kStaged ? sm.gate_par[1] : a.dt_bias[h];
            const float g = __fmul_rn(ssm_a, gdn_softplus(__fadd_rn(al, dt_bias)));
            sm.decay[t] = expf(g);
        }
        for_channels([&](int ch) {
            float* xc = &sm.x[part_of(ch)][0][column_of(ch)];
            const float4 cw = sm.conv_w[ch];
            const float w0 = cw.x, w1 = cw.y, w2 = cw.z, w3 = cw.w;
            float x0 = sm.conv_x[0][ch], x1 = sm.conv_x[1][ch], x2 = sm.conv_x[2][ch];
            for (int t = 0; t < n_tok; ++t) {
                const float xt = xc[t * D];
                // Σ_j w_j x_{t-3+j}, multiplied then added tap by tap, as the numpy reference.
                const float out = __fadd_rn(__fadd_rn(__fadd_rn(__fmul_rn(x0, w0), __fmul_rn(x1, w1)),
                                                      __fmul_rn(x2, w2)),
                                            __fmul_rn(xt, w3));
                xc[t * D] = gdn_silu(out);
                x0 = x1; x1 = x2; x2 = xt;
                // The window after the commit row: q/k channels are written by the one block with h < n_k (and
                // c0 = 0).
                if (t0 + t + 1 == commit && (ch >= 2 * D || (h == kh && c0 == 0))) {
                    const int c = channel(part_of(ch), column_of(ch));
                    a.conv_state_out[c] = x0;
                    a.conv_state_out[conv_dim + c] = x1;
                    a.conv_state_out[2 * conv_dim + c] = x2;
                }
            }
            sm.conv_x[0][ch] = x0, sm.conv_x[1][ch] = x1, sm.conv_x[2][ch] = x2;
        });
        __syncthreads();
        gdn_mark<kProbe>(a.probe, kProbeConv);

        // 2. q ← x·rsqrt(Σx² + eps)/√128, k ← x·rsqrt(Σx² + eps): one warp per (token, q|k) row.
        for_warp_jobs(2 * n_tok, [&](int rw) {
            float* row = sm.x[rw & 1][rw >> 1];
            const float inv = __frcp_rn(__fsqrt_rn(__fadd_rn(gdn_warp_sumsq(row, lane), a.eps)));
            const float scale = (rw & 1) ? 1.0f : 0.08838834764831845f;  // float32(1/sqrt(128))
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float x = __fmul_rn(row[lane + 32 * i], inv);
                row[lane + 32 * i] = (rw & 1) ? x : __fmul_rn(x, scale);
            }
        });
        __syncthreads();
        gdn_mark<kProbe>(a.probe, kProbeNormed);
        for_warp_jobs(n_tok, [&](int tw) {  // k·q per token, for o = S'ᵀq + δ (k·q)
            float p = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; ++i) p = __fmaf_rn(sm.x[1][tw][lane + 32 * i], sm.x[0][tw][lane + 32 * i], p);
            p = gdn_warp_sum(p);
            if (lane == 0) sm.kq[tw] = p;
        });
        __syncthreads();
        gdn_mark<kProbe>(a.probe, kProbeKq);
        if (t0 + kGdnMaxT < total) load_rows(t0 + kGdnMaxT);  // in flight during the delta rule

        // 3. Delta rule, token by token, state in registers. One barrier per token (red is double-buffered:
        // a thread writing red[t&1] for token t has passed token t-1's barrier, after every read of red[t&1]
        // from token t-2).
        for (int t = 0; t < n_tok; ++t) {
            const float decay = sm.decay[t];
            const float* kt = &sm.x[1][t][rg * R];
            const float* qt = &sm.x[0][t][rg * R];
            float pk = 0.0f, pq = 0.0f;
#pragma unroll
            for (int i = 0; i < R; ++i) {
                s[i] = __fmul_rn(s[i], decay);  // S' = e^g S
                pk = __fmaf_rn(s[i], kt[i], pk);
                pq = __fmaf_rn(s[i], qt[i], pq);
            }
            const int buf = t & 1;
            sm.red[buf][0][rg][j] = pk;
            sm.red[buf][1][rg][j] = pq;
            __syncthreads();
            float ks = 0.0f, qs = 0.0f;  // S'ᵀk, S'ᵀq of column j: row groups summed 0..7, the same in every thread
#pragma unroll
            for (int r = 0; r < kGdnRowGroups; ++r) {
                ks = __fadd_rn(ks, sm.red[buf][0][r][j]);
                qs = __fadd_rn(qs, sm.red[buf][1][r][j]);
            }
            const float delta = __fmul_rn(sm.beta[t], __fsub_rn(sm.x[2][t][j], ks));  // δ = β (v − S'ᵀk)
#pragma unroll
            for (int i = 0; i < R; ++i) s[i] = __fmaf_rn(kt[i], delta, s[i]);    // S = S' + k δᵀ
            const float o = __fmaf_rn(delta, sm.kq[t], qs);                       // o = S'ᵀq + δ (k·q)
            const int own = t0 + t - a.replay;
            if (rg == 0) {
                if (kWhole) sm.o[t][j] = o;
                else if (own >= 0) a.y[(size_t)own * value_dim + (size_t)h * D + j] = o;  // normed by the next launch
            }
            if (t0 + t + 1 == commit) {  // the commit row (a decode step: the last): the state goes out
                float* so = (a.state_out ? a.state_out : a.state) + st;
#pragma unroll
                for (int i = 0; i < R; ++i) so[i * D] = s[i];
            }
        }
        __syncthreads();
        gdn_mark<kProbe>(a.probe, kProbeDelta);

        // 4. y = o·rsqrt(mean o² + eps)·w·silu(z), one warp per token (the column split: a launch of its own).
        if (kWhole && warp < n_tok && t0 + warp >= a.replay) {
            const float* zt = sm.z[warp];
            float* yt = a.y + (size_t)(t0 + warp - a.replay) * value_dim + (size_t)h * D;
            gdn_gated_norm_row(sm.o[warp], [&](int c) { return sm.norm_w[c]; }, [&](int c) { return zt[c]; }, a.eps,
                               lane, kStaged ? sm.o[warp] : yt);
            if constexpr (kStaged) {  // y in sm.o too, where the own pack reads it (each lane its own elements)
#pragma unroll
                for (int i = 0; i < 4; ++i) yt[lane + 32 * i] = sm.o[warp][lane + 32 * i];
            }
        }
        gdn_mark<kProbe>(a.probe, kProbeGatedNorm);
    }
}

}  // namespace openjet
