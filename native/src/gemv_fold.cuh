// The fold (an experiment, sm_90a producer-warp GEMVs, Q4_K / Q5_K): an add-norm pack between two decode GEMVs made by
// the two GEMVs themselves, without its launch and without a grid-wide meeting. A declared numerics change against
// launch_add_norm_pack (NOTES_gemv.md, thirty-ninth session; docs/MEGAKERNEL.md "The step on the GPU's clock").
//
// GEMV A (its outputs y, n = k of B, a residual's delta) ends each 16-row tile j of token row c with
//   hn_i = fl(y_i + h_i)              the residual stream after the add (y_i = fl(sum_i * inv_c), launch_gemv's bits)
//   u_i  = fl(hn_i * w_i)             w: the next norm's weights
//   part[c][j] = {q_j, m_j, s_j, 0}   q_j = sum of hn_i^2, s_j = sum of u_i (lane order below), m_j = max |u_i|
// GEMV B reads u instead of a pack. Each block, before its first unit, takes for each token row c
//   Q = sum_j q_j                     (fold_row_scales: a fixed order, the same in every block and at every t)
//   r = rsqrtf(Q / k + eps)           as row_rms_scale
//   P = max_j m_j
//   shift = act_pack_shift(fl(fl(r P) (1 + 2^-10)))   a bound on max |fl(u_i c)|, so no value reaches 2^15
//   c = r 2^shift, inv = 2^-shift
// and multiplies fp16_rn(fl(u_i c)) in place of the pack's values, with the 32-block sums S_b = fl(c fl(s_2b +
// s_2b+1)) (the pack's hi / lo halves of S_b / 32) in place of the sums of those fp16 values.
// So against the pack: the norm is fl(fl(h w) r) where it was fl(fl(h r) w), the scale may be one binade low where r P
// lies within 2^-10 under a power of two, and the min term's sums are of the unrounded values. Every row's bits
// depend on that row alone: the same at every t.
#pragma once

#include <cuda_runtime.h>

#include "gemv.cuh"

namespace openjet {

struct GemvFold {
    // A's side (the GEMV whose outputs are the delta): h [t, n] the residual stream before the add, h_out after it (may
    // be h), w [n] the next norm's weights, u [t, n] and part [t, n / 16] as above. y is not written.
    const float* h = nullptr;
    float* h_out = nullptr;
    const float* w = nullptr;
    float* u = nullptr;
    float4* part = nullptr;
    // B's side (the GEMV that reads the fold instead of a pack): u_in [t, k], part_in [t, k / 16], the norm's eps.
    // scales (optional): row c's (c, inv) written by block 0 (tests).
    const float* u_in = nullptr;
    const float4* part_in = nullptr;
    float eps = 0.0f;
    float2* scales = nullptr;
    // B at t = 1 (an experiment's form): the row's fp16 values made once a block into shared memory before the units,
    // which then read them there as a pack; the same bits.
    bool stage = false;
};

// Whether the fold runs here (a 90a build on 9.0) for a decode call of this type, k and t.
bool gemv_fold_takes(const GemvArgs& a);

// A's GEMV with the fold's tile epilogue (out: fold.h .. fold.part; a.y not written) or B's reading the fold (in:
// fold.u_in .. eps; a.x not read), one of the two. cudaErrorNotSupported: the fold does not run here.
cudaError_t launch_gemv_fold(const GemvArgs& a, const GemvFold& fold, bool in, bool out, cudaStream_t stream);

}  // namespace openjet
