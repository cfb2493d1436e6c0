// Activation quantisation for the dp4a GEMVs, optionally fused with the RMSNorm that precedes every GEMV:
//   v = x (or x * rsqrt(mean x^2 + eps) * w);  per 32-block: d = max|v| / 127, q = round(v / d) (half away
//   from zero, 0 when the block is all zero), ds = (d, d * sum(q)).
// Like ggml's q8_1, but d and d*sum(q) are fp32 and the sum is of the int8 codes, so the Q4_K/Q5_K min term
// (dmin * m * sum x) uses exactly the values the dot products use.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace openjet {

// x [t, k] -> xq [t, k] int8, xds [t, k/32] float2. norm_w == nullptr: no norm. k % 32 == 0.
cudaError_t launch_quantize_act(const float* x, int t, int k, const float* norm_w, float eps, int8_t* xq,
                                float2* xds, cudaStream_t stream);

}  // namespace openjet
