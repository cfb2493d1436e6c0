// Activation quantisation for the dp4a GEMVs, optionally fused with the RMSNorm that precedes every GEMV:
//   v = x (or x * rsqrt(mean x^2 + eps) * w);  per 32-block: d = max|v| / 127, q = round(v / d) (half away
//   from zero, 0 when the block is all zero), ds = (d, d * sum(q)).
// Like ggml's q8_1, but d and d*sum(q) are fp32 and the sum is of the int8 codes, so the Q4_K/Q5_K min term
// (dmin * m * sum x) uses exactly the values the dot products use.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace openjet {

// Quantises v (this lane's element of a 32-block, the warp holding the block): d = max|v| / 127, q = round(v / d)
// (half away from zero; 0 for an all-zero block); writes q_out[lane] and, lane 0, *ds_out = (d, d*sum q). The one
// quantiser of the format above: launch_quantize_act and the fused row ops (elementwise.cuh) all call it.
__device__ __forceinline__ void quantize_block32(float v, int lane, int8_t* q_out, float2* ds_out) {
    float amax = fabsf(v);
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
    const float d = __fdiv_rn(amax, 127.0f);
    const int q = amax == 0.0f ? 0 : static_cast<int>(roundf(__fdiv_rn(v, d)));
    int sum = q;
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, m);
    q_out[lane] = static_cast<int8_t>(q);
    if (lane == 0) *ds_out = make_float2(d, __fmul_rn(d, static_cast<float>(sum)));
}

// x [t, k] -> xq [t, k] int8, xds [t, k/32] float2. norm_w == nullptr: no norm. k % 32 == 0.
cudaError_t launch_quantize_act(const float* x, int t, int k, const float* norm_w, float eps, int8_t* xq,
                                float2* xds, cudaStream_t stream);

}  // namespace openjet
