// launch_pack_act: one block per token row.
#include "act_pack.cuh"
#include "pdl.cuh"

namespace openjet {
namespace {

template <bool kNorm>
__global__ void __launch_bounds__(kPackThreads) pack_act_kernel(const float* __restrict__ x, int k,
                                                               const float* __restrict__ norm_w, float eps,
                                                               ActPack p) {
    pdl_start();  // pdl.cuh
    const int row = blockIdx.x;
    const float* xr = x + static_cast<long long>(row) * k;
    const float scale = kNorm ? row_rms_scale(xr, k, eps) : 1.0f;
    pack_act_row([&](int i) { return kNorm ? __fmul_rn(__fmul_rn(xr[i], scale), norm_w[i]) : xr[i]; }, k, p, row);
}

}  // namespace

cudaError_t launch_pack_act(const float* x, int t, int k, const float* norm_w, float eps, const ActPack& p,
                            cudaStream_t stream) {
    if (!x || !act_pack_fits(p, t, k)) return cudaErrorInvalidValue;
    if (norm_w) return launch_kernel(pack_act_kernel<true>, t, kPackThreads, 0, stream, x, k, norm_w, eps, p);
    return launch_kernel(pack_act_kernel<false>, t, kPackThreads, 0, stream, x, k, nullptr, eps, p);
}

}  // namespace openjet
