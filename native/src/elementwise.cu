// launch_add_norm_quantize, launch_swiglu_quantize (elementwise.cuh): one block of kRowThreads per row.
#include "elementwise.cuh"
#include "kquant.cuh"

namespace openjet {
namespace {

__global__ void __launch_bounds__(kRowThreads)
add_norm_quantize_kernel(float* __restrict__ h, const float* __restrict__ delta, const float* __restrict__ w, int k,
                         float eps, float* __restrict__ a_out, int8_t* __restrict__ xq, float2* __restrict__ xds) {
    const long long row = blockIdx.x;
    float* hr = h + row * k;
    if (delta) {
        const float* dr = delta + row * k;
        for (int i = threadIdx.x; i < k; i += kRowThreads) hr[i] = __fadd_rn(hr[i], dr[i]);
    }
    __syncthreads();
    const float scale = row_rms_scale(hr, k, eps);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, kb = k / kQ8Block;
    for (int b = warp; b < kb; b += kRowThreads / 32) {
        const int i = b * kQ8Block + lane;
        const float v = __fmul_rn(__fmul_rn(hr[i], scale), w[i]);
        if (a_out) a_out[row * k + i] = v;
        quantize_block32(v, lane, xq + row * k + b * kQ8Block, xds + row * kb + b);
    }
}

__global__ void __launch_bounds__(kRowThreads)
swiglu_quantize_kernel(const float* __restrict__ gate, const float* __restrict__ up, int k, int8_t* __restrict__ xq,
                       float2* __restrict__ xds) {
    const long long row = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, kb = k / kQ8Block;
    for (int b = warp; b < kb; b += kRowThreads / 32) {
        const long long i = row * k + b * kQ8Block + lane;
        quantize_block32(swiglu1(gate[i], up[i]), lane, xq + row * k + b * kQ8Block, xds + row * kb + b);
    }
}

}  // namespace

cudaError_t launch_add_norm_quantize(float* h, const float* delta, const float* w, int t, int k, float eps,
                                     float* a_out, int8_t* xq, float2* xds, cudaStream_t stream) {
    if (!h || !w || !xq || !xds || t < 1 || k < kQ8Block || k % kQ8Block) return cudaErrorInvalidValue;
    add_norm_quantize_kernel<<<t, kRowThreads, 0, stream>>>(h, delta, w, k, eps, a_out, xq, xds);
    return cudaGetLastError();
}

cudaError_t launch_swiglu_quantize(const float* gate, const float* up, int t, int k, int8_t* xq, float2* xds,
                                   cudaStream_t stream) {
    if (!gate || !up || !xq || !xds || t < 1 || k < kQ8Block || k % kQ8Block) return cudaErrorInvalidValue;
    swiglu_quantize_kernel<<<t, kRowThreads, 0, stream>>>(gate, up, k, xq, xds);
    return cudaGetLastError();
}

}  // namespace openjet
