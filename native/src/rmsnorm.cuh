// RMSNorm as GGUF stores it (norm weights already hold 1 + w): y = x * rsqrt(mean(x^2) + eps) * w.
#pragma once

#include <cuda_runtime.h>

namespace openjet {

constexpr int kRowThreads = 256;  // one block of this many threads per token row

// rsqrt(mean(x[0..k)^2) + eps) for the calling block's row, returned to every thread. The sum runs in a
// fixed order (thread-strided over the first kRowThreads threads, then lanes by xor butterfly, then warps
// 0..7), so it depends on x alone, whatever the block size (>= kRowThreads: larger blocks' other threads
// wait; the pack kernels run 1024 threads for their other passes and keep these bits).
// x_of(i): element i (row_rms_scale_of: a row spread over a cluster's shared memory, elementwise.cu).
template <class X>
__device__ __forceinline__ float row_rms_scale_of(const X& x_of, int k, float eps) {
    __shared__ float part[kRowThreads / 32];
    if (threadIdx.x < kRowThreads) {
        float s = 0.0f;
        constexpr int kBatch = 8;  // loads in flight, then their fmas in the chain's order
        if (k <= kRowThreads) {    // one element a thread (a head's 256 in attention's prep)
            if (static_cast<int>(threadIdx.x) < k) {
                const float xi = x_of(threadIdx.x);
                s = __fmaf_rn(xi, xi, s);
            }
        } else {
            for (int i0 = threadIdx.x; i0 < k; i0 += kBatch * kRowThreads) {
                float xv[kBatch];
#pragma unroll
                for (int q = 0; q < kBatch; ++q) {  // past the row: the thread's own element again (no branch; in a
                    const int i = i0 + q * kRowThreads;  // cluster's row, no pile-up on the rank holding the last)
                    xv[q] = x_of(i < k ? i : i0);
                }
#pragma unroll
                for (int q = 0; q < kBatch; ++q)
                    if (i0 + q * kRowThreads < k) s = __fmaf_rn(xv[q], xv[q], s);
            }
        }
#pragma unroll
        for (int m = 16; m >= 1; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
        if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    }
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kRowThreads / 32; ++w) total += part[w];
    __syncthreads();  // part may be reused by the caller's next row
    return rsqrtf(__fdiv_rn(total, static_cast<float>(k)) + eps);
}

__device__ __forceinline__ float row_rms_scale(const float* __restrict__ x, int k, float eps) {
    return row_rms_scale_of([&](int i) { return x[i]; }, k, eps);
}

// y[t, :] = rmsnorm(x[t, :]) * w for t rows of k floats; y's rows y_stride floats apart (0: k).
cudaError_t launch_rmsnorm(const float* x, const float* w, int t, int k, float eps, float* y, cudaStream_t stream,
                           long long y_stride = 0);

}  // namespace openjet
