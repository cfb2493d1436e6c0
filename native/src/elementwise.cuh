// Small row ops of the decode step that sit between the GEMVs, each fused with the activation quantisation
// that the next GEMV needs (quantize_act.cuh's format and arithmetic, bit for bit):
//   add_norm_quantize: h += delta; a = rms(h) * w; (a written as float when asked); a -> int8 blocks of 32.
//   swiglu_quantize:   a = silu(gate) * up -> int8 blocks of 32 (the ffn_down input).
// One block of kRowThreads per token row. Thread i owns elements i, i + 256, ... in every phase (the add, the
// squares of row_rms_scale, the quantiser's warp-per-32-block walk), so each row's arithmetic depends on
// that row alone: T rows give the bits of T one-row calls.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "quantize_act.cuh"  // quantize_block32
#include "rmsnorm.cuh"

namespace openjet {

// silu(g) * u with the reference's steps: g * (1 / (1 + e^-g)), then * u.
__device__ __forceinline__ float swiglu1(float g, float u) {
    return __fmul_rn(__fmul_rn(g, __frcp_rn(__fadd_rn(1.0f, expf(-g)))), u);
}

// h [t, k] += delta (nullptr: no add); a = rms(h) * w -> a_out [t, k] (nullptr: not written), xq, xds.
cudaError_t launch_add_norm_quantize(float* h, const float* delta, const float* w, int t, int k, float eps,
                                     float* a_out, int8_t* xq, float2* xds, cudaStream_t stream);

// xq, xds <- quantised silu(gate) * up, rows [t, k].
cudaError_t launch_swiglu_quantize(const float* gate, const float* up, int t, int k, int8_t* xq, float2* xds,
                                   cudaStream_t stream);

}  // namespace openjet
