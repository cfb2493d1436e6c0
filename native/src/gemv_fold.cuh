// The fold (an experiment, sm_90a producer-warp GEMVs of Q4_K, Q5_K and Q6_K; the engine's OPENJET_FOLD): an add-norm
// pack between two decode GEMVs made by the two GEMVs themselves, without its launch at t = 1 and without a grid-wide
// meeting. A declared numerics change against launch_add_norm_pack (NOTES_gemv.md, thirty-ninth session;
// docs/MEGAKERNEL.md).
//
// GEMV A (its outputs y, n = k of B, a residual's delta) ends each 16-row tile j of token row c with
//   hn_i = fl(y_i + h_i)              the residual stream after the add (y_i = fl(sum_i * inv_c), launch_gemv's bits)
//   u_i  = fl(hn_i * w_i)             w: the next norm's weights
//   part[c][j] = {q_j, m_j, s_j, 0}   q_j = sum of hn_i^2, s_j = sum of u_i (lane order), m_j = max |u_i|
// and B's input, row by row, is a pack made from u and the partials alone (gemv_fold_device.cuh fold_pack_row), with
// the normed row a_i = fl(u_i r) where a float copy is asked for (GemvFold::a_out):
//   Q = sum_j q_j                     (a fixed order: the same in every block, at every t)
//   r = rsqrtf(Q / k + eps)           as row_rms_scale
//   P = max_j m_j
//   shift = act_pack_shift(fl(fl(r P) (1 + 2^-10)))   a bound on max |fl(u_i c)|, so no value reaches 2^15
//   c = r 2^shift, inv = 2^-shift
//   values fp16_rn(fl(u_i c)); 32-block sums S_b = fl(c fl(s_2b + s_2b+1)) (the pack's hi / lo halves of S_b / 32)
// At t = 1 each block of B makes that pack in its shared memory before its first unit (no launch between A and B);
// for more rows launch_fold_pack makes it in B's pack first, with the same code, so a row's bits are the same at every
// t. Against the add-norm pack: the norm is fl(fl(h w) r) where it was fl(fl(h r) w), the scale may be one binade low
// where r P lies within 2^-10 under a power of two, and the min term's sums are of the unrounded values.
#pragma once

#include <cuda_runtime.h>

#include "act_pack.cuh"
#include "gemv.cuh"

namespace openjet {

struct GridMeet;  // (below: where a launch's blocks meet)

// B's rows made by its own blocks at t > 1 (the engine's OPENJET_FOLD_ROWS; an experiment): blocks 0..t-1 of B's
// launch each make one token row's pack in B's a.x (block b rows b, b + grid, ... where the grid is smaller) with the
// pack launch's code (fold_pack_row: the same bits) and count it in ready; every block waits for ready to reach t
// before its first unit reads a.x, so no pack launch and no completion hop lie between A and B, and only t blocks
// signal (no grid-wide meeting). left counts the blocks past their wait; the last one out zeroes both words for the
// next launch, which reads them only after its PDL wait (the stream's order: launches that share one run one after
// another). Zeroed once when allocated.
struct FoldRowsSync {
    int ready;
    int left;
};

// The swiglu's pack at t > 1 made by the GEMV that reads it (the down projection as the fold's A; the engine's
// OPENJET_SWIGLU_ROWS, an experiment) instead of the swiglu pack launch: the launch's first kSwigluPackers blocks (or
// all, where the grid is smaller) take the rows' 32-blocks b = block, + packers, ... (a warp each), fold their max |v|
// of each row into row_max (atomicMax on the bits: maxima >= 0, exact in any order) and count in maxed; once all have,
// each packs its 32-blocks under the rows' exact maxima (pack_block, as every swiglu pack: the same bits) and counts
// in ready; every block waits for ready before its first unit reads x. left and the zeroing as FoldRowsSync's.
constexpr int kSwigluPackers = 64;
struct SwigluRowsSync {
    unsigned row_max[kActRows];
    int maxed;
    int ready;
    int left;
};

struct GemvFold {
    // A's side (the GEMV whose outputs are the delta): h [t, n] the residual stream before the add, h_out after it (may
    // be h), w [n] the next norm's weights, u [t, n] and part [t, n / 16] as above. y is not written.
    const float* h = nullptr;
    float* h_out = nullptr;
    const float* w = nullptr;
    float* u = nullptr;
    float4* part = nullptr;
    // B's side (the GEMV that reads the fold instead of a pack): u_in [t, k], part_in [t, k / 16], the norm's eps.
    // scales (optional): row c's (c, inv) (tests).
    const float* u_in = nullptr;
    const float4* part_in = nullptr;
    float eps = 0.0f;
    float2* scales = nullptr;
    // B's rows for the kernels after it (optional): a_out [t, k] the normed rows a = fl(u r) (in place of the add-norm's
    // float copy: the GDN step's fused beta / alpha read it), pack_out the pack B read (must be B's a.x: at t > 1 the
    // pack launch makes it there anyway; at t = 1 block 0 writes it).
    float* a_out = nullptr;
    ActPack pack_out{nullptr, nullptr, nullptr, 0};
    // The swiglu's own pack (launch_gemv_swiglu): gate / up's launch writes v = swiglu1(g, u) into gate's y and packs
    // it into swiglu_pack itself, its blocks meeting through meet for the rows' maxima.
    ActPack swiglu_pack{nullptr, nullptr, nullptr, 0};
    GridMeet* meet = nullptr;
    // B at t > 1: where given, B's blocks make the rows' pack in a.x themselves (FoldRowsSync) instead of a pack launch.
    FoldRowsSync* rows = nullptr;
    // A at t > 1: where given, A's blocks make its input a.x, the swiglu pack of swiglu1(swiglu_g, swiglu_u) ([t, k]
    // each), themselves (SwigluRowsSync) instead of the swiglu pack launch before it.
    const float* swiglu_g = nullptr;
    const float* swiglu_u = nullptr;
    SwigluRowsSync* swiglu_rows = nullptr;
};

// Where the blocks of one launch meet once, after their tiles (launch_gemv_swiglu): zeroed once,
// then left as each launch leaves it. arrive: arrivals; release: a launch's blocks read it before arriving and wait for
// it to change, the last to arrive resets arrive and bumps it; max_of: each block's maxima by token row (the swiglu's).
// Launches that share one must run in stream order (each reads release after its PDL wait).
constexpr int kMeetMaxBlocks = 1024;

// The longest row the fold's B makes its pack of (in shared memory past its rings): a hidden row, the add-norm's place
// (the 27B's 5,120; its attention output 6,144).
constexpr int kFoldMaxK = 6144;
struct GridMeet {
    int arrive;
    int release;
    float max_of[kMeetMaxBlocks][kActRows];
};

// Whether the fold runs here (a 90a build on 9.0) for a decode call of a's type (Q4_K, Q5_K, Q6_K) and layout, as A
// (out: the fold's epilogue) or B (in: its k, the fold's row, up to kFoldMaxK).
bool gemv_fold_takes(const GemvArgs& a, bool in);

// A's GEMV with the fold's tile epilogue (out: fold.h .. fold.part; a.y not written; no b; at t > 1 with
// fold.swiglu_rows, its input the swiglu pack its own blocks make first) or B's reading the fold (in:
// fold.u_in .. eps, and b, a second matrix of the same input, where given), one of the two. B at t > 1 takes a.x as its
// pack: launch_fold_pack fills it first, or, with fold.rows, B's first t blocks do (FoldRowsSync).
// cudaErrorNotSupported: the fold does not run here.
cudaError_t launch_gemv_fold(const GemvArgs& a, const GemvArgs* b, const GemvFold& fold, bool in, bool out,
                             cudaStream_t stream);

// B of the fold as a group (gemv_tma.cuh launch_gemv_tma_group: a and b of two types, or a, b and c, in one launch),
// with launch_gemv_fold's B's checks and pack. cudaErrorNotSupported: the group or the fold does not run here.
cudaError_t launch_gemv_fold_group(const GemvArgs& a, const GemvArgs& b, const GemvArgs* c, const GemvFold& fold,
                                   cudaStream_t stream);

// The pack p of t rows of k from the fold's u and partials (fold.u_in, fold.part_in, fold.eps; B's input at t > 1).
cudaError_t launch_fold_pack(const GemvFold& fold, int t, int k, const ActPack& p, cudaStream_t stream);

// The swiglu's own pack (an experiment, the engine's OPENJET_SWIGLU_SELF; the same bits as launch_swiglu_pack): gate
// (a) and up (b) in one launch of the producer-warp GEMV whose blocks take their tiles in pairs (gate tile j, then up
// tile j), so that the second's epilogue makes v = swiglu1(g, u) of the pair's rows into a.y, keeping the block's
// max |v| of each token row. After its last tile a block publishes its maxima and meets the others (fold.meet); then
// each packs its share of the rows' 32-blocks (pack_block, under act_row's scale of the exact max) into
// fold.swiglu_pack: no pack launch between gate / up and the down projection. Reading the fold (fold_in: its blocks'
// own pack) or a.x. Q4_K at one token row only (at more rows it lost to the pack launch on the H100 and the H200, with
// and without the meeting, and with scales from a bound instead of a meeting: NOTES_gemv.md, forty-first, forty-second,
// fifty-sixth and fifty-seventh sessions), where gemv_tma_takes(a, b).
bool gemv_swiglu_takes(const GemvArgs& a, const GemvArgs& b);
cudaError_t launch_gemv_swiglu(const GemvArgs& a, const GemvArgs& b, const GemvFold& fold, bool fold_in,
                               cudaStream_t stream);

// The fold's add-norm pack without its GEMVs, for any number of rows (a prefill's add-norms where a decode step's are
// the fold, so that prefill leaves the bits decode does): A's epilogue arithmetic over t rows of k, given the delta
// (delta [t, k]: hn = fl(delta + h) into h_out, which may be h; null: h already holds the sum, h_out unused), u and
// part as in GemvFold (buffers of t k and t k / 16 float4), then launch_fold_pack into p, with the normed rows in a_out
// where given. The same bits, row for row, as A then B.
cudaError_t launch_fold_add_norm_pack(const float* h, const float* delta, const float* w, int t, int k, float eps,
                                      float* h_out, float* u, float4* part, float* a_out, const ActPack& p,
                                      cudaStream_t stream);

}  // namespace openjet
