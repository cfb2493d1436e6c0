// One layer's FFN of a decode step in one persistent launch (issue 7's build step 2, docs/MEGAKERNEL.md): the
// post-attention add-norm pack, gate + up, the swiglu pack and down, as phases of one persistent kernel whose
// blocks wait on counters instead of kernel boundaries, so a phase's weights start streaming before its input is
// ready, and each pack is spread over the grid's warps instead of one block per row. Every value is computed with
// the separate launches' arithmetic, in the same order: the same bits. With a tail (out_w set), the launch starts one
// step earlier, at the mixer's output: its pack and the out projection (ssm_out or attn_output) into mix_in. Opt-in
// (OPENJET_FFN_PERSISTENT=1 at load: the FFN; 2: with the tail; 3: with the tail and the next layer's input norm, the
// output norm after the last layer; 4: also the next layer's input projections) until measured faster.
#pragma once

#include <cuda_runtime.h>

#include "act_pack.cuh"

namespace openjet {

constexpr int kFfnNextProjections = 3;  // the next layer's input projections a launch may run (attention's q, k, v)

struct FfnPersistentArgs {
    int t = 0;                    // token rows, 1..kActRows
    int n_embd = 0, n_ff = 0;     // model width, FFN width (multiples of 256)
    float eps = 0.0f;             // the norm's
    float* h = nullptr;           // [t, n_embd] residual: h += mix_in
    float* mix_in = nullptr;      // [t, n_embd] the mixer's projected output (written here with a tail)
    const float* post_norm = nullptr;  // [n_embd]
    ActPack x;                    // the pack: the norm's rows at 0.., the swiglu rows at kActRows.. (>= 16 rows), the
                                  // tail's past those (ffn_persistent_takes checks its rows)
    // The tail (null out_w: none, mix_in is the launches' before): y_in packed and projected by out_w into mix_in.
    const float* y_in = nullptr;  // [t, k_out] the mixer's output (the GDN's gated norm, attention's gated rows)
    int k_out = 0;                // its width (a multiple of 256)
    const void* out_w = nullptr;  // [n_embd, k_out]
    int out_type = -1;            // Q4_K or Q5_K (the recipe's attn_output and ssm_out)
    int gu_type = -1, down_type = -1;  // k-quant types of gate and up (-1 where they differ) and of down
    const void* gate = nullptr;   // [n_ff, n_embd]
    const void* up = nullptr;     // [n_ff, n_embd]
    const void* down = nullptr;   // [n_embd, n_ff]
    bool tiled = false;           // every weight in the tile layout (weight_layout.cuh) or all in the row layout
    float* g_out = nullptr;       // [t, n_ff] gate's output, then silu(gate) * up (the pack's input)
    float* u_out = nullptr;       // [t, n_ff]
    float* mix_out = nullptr;     // [t, n_embd] down's output
    int* counters = nullptr;      // ffn_persistent_scratch_ints(n_ff) ints of device memory, zero between launches
    int grid_sms = 0;             // the grid sized for at most this many SMs (0: the GPU's; OPENJET_PERSISTENT_SMS
                                  // emulates a smaller GPU: the work is split over fewer blocks, the bits stay)
    // The next norm (null next_norm: none, the launches after do it): after down, h += mix_out and the norm with these
    // weights packed into the pack's rows 0.. and copied as floats to next_a [t, n_embd] (null: not copied).
    const float* next_norm = nullptr;
    float* next_a = nullptr;
    // The next layer's input projections (with a next norm; null next_w[0]: none): after the next norm, up to
    // kFfnNextProjections GEMVs reading its pack (then in rows of its own, ffn_next_pack_row0): next_w[i] [next_n[i],
    // n_embd], of type next_type[i] (Q4_K or Q6_K), into next_y[i] [t, next_n[i]]. The GDN layer's qkv and z; the
    // attention layer's q (with its gate), k and v.
    const void* next_w[kFfnNextProjections] = {};
    int next_n[kFfnNextProjections] = {};
    int next_type[kFfnNextProjections] = {-1, -1, -1};
    float* next_y[kFfnNextProjections] = {};
    unsigned long long* profile = nullptr;  // kFfnProfileSlots accumulators (FfnProfile), or null: nothing timed
    // The producer-warp form (OPENJET_FFN_TMA; ffn_tma_takes): the launch's tiles streamed by a producer warp's bulk
    // copies, as the decode GEMV's default streams them (gemv_tma.cu), instead of each team warp's cp.async stages.
    bool tma = false;
};

// The kernel's own profile, accumulated over launches where FfnPersistentArgs::profile is set (the engine's profile
// on): launches, their spans (first block's start to last block's end, in ns), the warps that ran, and when each
// phase ended (ns after the launch's first block started, taken by the warp whose release completed it). Where a
// persistent launch loses time to its phase boundaries, the gaps between those say which (docs/MEGAKERNEL.md).
// (Approximate where, under PDL, a launch's blocks start before the previous launch's last block has reset the
// start and end slots: with the profile's events between the kernels, a chain of early starts that long is unlikely.)
enum FfnProfile : int {
    kProfLaunches, kProfSpanNs, kProfWarps,
    kProfAtTailMax,       // the tail pack's row maxima folded
    kProfAtTailPacked,    // the tail packed
    kProfAtOutTiles,      // the out projection stored (mix_in complete)
    kProfAtNormPacked,    // the add-norm packed
    kProfAtGateUp,        // every gate / up tile stored (with the swiglu values)
    kProfAtSwigluPacked,  // the swiglu packed
    kProfAtDown,          // every down tile stored (mix_out complete)
    kProfAtNextNorm,      // the next norm packed (where the launch has one)
    kProfAtNextProj,      // the next layer's input projections stored (where the launch has them)
    kProfStartMin, kProfEndMax,  // the launch in progress (ns; reset by its last block)
    kFfnProfileSlots
};

// The slot's name in the engine's profile report (openjet_engine_profile's "persistent_ffn").
const char* ffn_profile_name(int slot);

// Zeroes the accumulators (before the first launch that is timed, and on a profile reset).
cudaError_t ffn_profile_reset(unsigned long long* profile, cudaStream_t stream);

// The launch's counters, flags and per-row values: a fixed part (12 phase counters; per token row, 2 pack maxima and,
// for each of the two add-norms, 3 counters and maxima and its parts' 8 sums of squares) and a flag per 16-row
// (gate, up) tile pair.
constexpr int kFfnScratchFixedInts = 12 + 2 * kActRows + 2 * (3 * kActRows + kActRows * 8);
__host__ __device__ constexpr int ffn_persistent_scratch_ints(int n_ff) {
    return kFfnScratchFixedInts + (n_ff + 15) / 16;
}

// Where the next norm's pack rows start when the launch also runs the next layer's input projections (in rows of
// n_embd): past every byte of the rows phases 0-4 use, on a 32-row boundary (no 128-byte line shared with rows an
// SM read earlier in the launch through its L1); 0 otherwise (the lm_head or the next launches read rows 0..).
int ffn_next_pack_row0(const FfnPersistentArgs& a);

// Where the tail's pack rows start (in rows of k_out; -1 without a tail): past every byte of the swiglu rows.
int ffn_tail_pack_row0(const FfnPersistentArgs& a);

// Whether the kernel is built for these weight types (the Q4_K_M recipe's: Q4_K gate / up, Q4_K or Q6_K down, a
// Q4_K or Q5_K tail), the pack holds its row ranges and the shapes fit; otherwise the caller takes the separate
// launches.
bool ffn_persistent_takes(const FfnPersistentArgs& a);

// Whether the launch takes the producer-warp form: asked for (tma), whole 16-row tiles in the next layer's input
// projections, the tile layout, and a 90a build on a 9.0 GPU (gemv_tma_available). Otherwise, or where its blocks do
// not fit, the team kernel runs: the same bits either way.
bool ffn_tma_takes(const FfnPersistentArgs& a);

// The launch on `stream` (PDL where pdl_enabled()). `counters` must be zero before the first launch (the engine's
// scratch is zeroed at create); each launch leaves them zero.
cudaError_t launch_ffn_persistent(const FfnPersistentArgs& a, cudaStream_t stream);

}  // namespace openjet
