// launch_add_norm_pack, launch_swiglu_pack (elementwise.cuh): one block of kPackThreads per row.
#include "elementwise.cuh"
#include "pdl.cuh"

namespace openjet {
namespace {

__global__ void __launch_bounds__(kPackThreads)
add_norm_pack_kernel(float* __restrict__ h, const float* __restrict__ delta, const float* __restrict__ w, int k,
                     float eps, float* __restrict__ a_out, ActPack p) {
    pdl_start();  // pdl.cuh
    const int row = blockIdx.x;
    float* hr = h + static_cast<long long>(row) * k;
    if (delta) {
        const float* dr = delta + static_cast<long long>(row) * k;
#pragma unroll 4
        for (int i = threadIdx.x; i < k; i += kPackThreads) hr[i] = __fadd_rn(hr[i], dr[i]);
    }
    __syncthreads();
    const float scale = row_rms_scale(hr, k, eps);
    pack_act_row([&](int i) { return __fmul_rn(__fmul_rn(hr[i], scale), w[i]); }, k, p, row,
                 a_out ? a_out + static_cast<long long>(row) * k : nullptr);
}

__global__ void __launch_bounds__(kPackThreads)
swiglu_pack_kernel(const float* __restrict__ gate, const float* __restrict__ up, int k, ActPack p) {
    pdl_start();  // pdl.cuh
    const int row = blockIdx.x;
    const float* g = gate + static_cast<long long>(row) * k;
    const float* u = up + static_cast<long long>(row) * k;
    pack_act_row([&](int i) { return swiglu1(g[i], u[i]); }, k, p, row);
}

}  // namespace

cudaError_t launch_add_norm_pack(float* h, const float* delta, const float* w, int t, int k, float eps,
                                 float* a_out, const ActPack& p, cudaStream_t stream) {
    if (!h || !w || !act_pack_fits(p, t, k)) return cudaErrorInvalidValue;
    return launch_kernel(add_norm_pack_kernel, t, kPackThreads, 0, stream, h, delta, w, k, eps, a_out, p);
}

cudaError_t launch_swiglu_pack(const float* gate, const float* up, int t, int k, const ActPack& p,
                               cudaStream_t stream) {
    if (!gate || !up || !act_pack_fits(p, t, k)) return cudaErrorInvalidValue;
    return launch_kernel(swiglu_pack_kernel, t, kPackThreads, 0, stream, gate, up, k, p);
}

}  // namespace openjet
