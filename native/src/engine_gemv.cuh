// The GEMV entry the engine calls, in its own translation unit: gemv_kquant.cuh and attn_decode.cuh both
// define cp.async helpers in namespace openjet, so one file cannot include both.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace openjet {

// y [t, n] = W x: W of GGML type qtype ([n, k] in GGUF blocks); k-quant W reads xq/xds, F32 W reads xf.
cudaError_t engine_gemv(int qtype, const void* w, int n, int k, int t, const int8_t* xq, const float2* xds,
                        const float* xf, float* y, cudaStream_t stream);

}  // namespace openjet
