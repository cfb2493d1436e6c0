// launch_quantize_act: one block per token row; each warp quantises 32-blocks, one element per lane.
#include "kquant.cuh"
#include "quantize_act.cuh"
#include "rmsnorm.cuh"

namespace openjet {
namespace {

template <bool kNorm>
__global__ void __launch_bounds__(kRowThreads) quantize_act_kernel(const float* __restrict__ x, int k,
                                                                   const float* __restrict__ norm_w, float eps,
                                                                   int8_t* __restrict__ xq, float2* __restrict__ xds) {
    const long long row = blockIdx.x;
    const float* xr = x + row * k;
    const float scale = kNorm ? row_rms_scale(xr, k, eps) : 1.0f;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, kb = k / kQ8Block;
    for (int b = warp; b < kb; b += kRowThreads / 32) {
        const int i = b * kQ8Block + lane;
        const float v = kNorm ? __fmul_rn(__fmul_rn(xr[i], scale), norm_w[i]) : xr[i];
        quantize_block32(v, lane, xq + row * k + b * kQ8Block, xds + row * kb + b);
    }
}

}  // namespace

cudaError_t launch_quantize_act(const float* x, int t, int k, const float* norm_w, float eps, int8_t* xq,
                                float2* xds, cudaStream_t stream) {
    if (!x || !xq || !xds || t < 1 || k < kQ8Block || k % kQ8Block) return cudaErrorInvalidValue;
    if (norm_w)
        quantize_act_kernel<true><<<t, kRowThreads, 0, stream>>>(x, k, norm_w, eps, xq, xds);
    else
        quantize_act_kernel<false><<<t, kRowThreads, 0, stream>>>(x, k, nullptr, eps, xq, xds);
    return cudaGetLastError();
}

}  // namespace openjet
