// launch_rmsnorm: one block per token row (the fused norm + activation packing is in act_pack.cu).
#include "rmsnorm.cuh"
#include "pdl.cuh"

namespace openjet {
namespace {

__global__ void __launch_bounds__(kRowThreads) rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                                              int k, float eps, float* __restrict__ y,
                                                              long long y_stride) {
    pdl_start();  // pdl.cuh
    const float* xr = x + (long long)blockIdx.x * k;
    float* yr = y + (long long)blockIdx.x * y_stride;
    const float scale = row_rms_scale(xr, k, eps);
    for (int i = threadIdx.x; i < k; i += kRowThreads) yr[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
}

}  // namespace

cudaError_t launch_rmsnorm(const float* x, const float* w, int t, int k, float eps, float* y, cudaStream_t stream,
                           long long y_stride) {
    if (!x || !w || !y || t < 1 || k < 1 || (y_stride && y_stride < k)) return cudaErrorInvalidValue;
    return launch_kernel(rmsnorm_kernel, t, kRowThreads, 0, stream, x, w, k, eps, y, y_stride ? y_stride : k);
}

}  // namespace openjet
