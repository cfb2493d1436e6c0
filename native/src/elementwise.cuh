// Small row ops of the decode step that sit between the GEMVs, each fused with the activation packing that
// the next GEMV needs (act_pack.cuh's format and arithmetic, bit for bit):
//   add_norm_pack: h += delta; a = rms(h) * w; (a written as float when asked); a -> the pack.
//   swiglu_pack:   a = silu(gate) * up -> the pack (the ffn_down input).
// One block of kPackThreads per token row, in a fixed order (the add, the squares of row_rms_scale, the
// packer's max and sums), so each row's arithmetic depends on that row alone: T rows give the bits of T
// one-row calls.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "act_pack.cuh"
#include "l2_prefetch.cuh"
#include "rmsnorm.cuh"

namespace openjet {

// silu(g) * u with the reference's steps: g * (1 / (1 + e^-g)), then * u.
__device__ __forceinline__ float swiglu1(float g, float u) {
    return __fmul_rn(__fmul_rn(g, __frcp_rn(__fadd_rn(1.0f, expf(-g)))), u);
}

// h [t, k] += delta (nullptr: no add); a = rms(h) * w -> a_out [t, k] (nullptr: not written) and the pack.
// next: weights to warm in L2 meanwhile (l2_prefetch.cuh; not by the opt-in cluster packs).
cudaError_t launch_add_norm_pack(float* h, const float* delta, const float* w, int t, int k, float eps,
                                 float* a_out, const ActPack& p, cudaStream_t stream, L2Next next = {});

// The pack <- silu(gate) * up, rows [t, k]; next as above.
cudaError_t launch_swiglu_pack(const float* gate, const float* up, int t, int k, const ActPack& p,
                               cudaStream_t stream, L2Next next = {});

}  // namespace openjet
