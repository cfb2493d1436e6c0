// launch_gdn_step: the standalone launch of gdn_step_head (gdn_decode.cuh), one block per value head.
#include <cstdint>

#include "gdn_decode.cuh"
#include "pdl.cuh"

namespace openjet {
namespace {

__global__ void __launch_bounds__(kGdnThreads, 1) gdn_step_kernel(const GdnStepArgs a) {
    __shared__ GdnSmem sm;
    pdl_start();  // pdl.cuh
    gdn_step_head(a, blockIdx.x, sm);
}

bool overlap(const float* a, const float* b, size_t n) { return a < b + n && b < a + n; }

}  // namespace

cudaError_t launch_gdn_step(const GdnStepArgs& a, cudaStream_t stream) {
    if (a.n_k < 1 || a.n_v < a.n_k || a.n_v % a.n_k || a.t < 1 || a.t > kGdnMaxRows || !(a.eps >= 0.0f))
        return cudaErrorInvalidValue;
    if (!a.qkv || !a.z || !a.conv_w || !a.conv_state_in || !a.conv_state_out || !a.ssm_a || !a.dt_bias || !a.norm_w ||
        !a.state || !a.y)
        return cudaErrorInvalidValue;
    if (a.w_beta) {  // fused projections: F32 rows and x rows 16-byte aligned (float4 loads)
        const uintptr_t bits = reinterpret_cast<uintptr_t>(a.w_beta) | reinterpret_cast<uintptr_t>(a.w_alpha) |
                               reinterpret_cast<uintptr_t>(a.x_in);
        if (!a.w_alpha || !a.x_in || a.proj_k < 4 || a.proj_k % 4 || bits & 15 || a.t > kGdnMaxT)
            return cudaErrorInvalidValue;
    } else if (!a.b || !a.alpha) {
        return cudaErrorInvalidValue;
    }
    const size_t conv_dim = (size_t)(2 * a.n_k + a.n_v) * kGdnHeadDim;
    if (overlap(a.conv_state_in, a.conv_state_out, 3 * conv_dim)) return cudaErrorInvalidValue;
    if (a.state_out && overlap(a.state, a.state_out, (size_t)a.n_v * kGdnHeadDim * kGdnHeadDim))
        return cudaErrorInvalidValue;
    return launch_kernel(gdn_step_kernel, a.n_v, kGdnThreads, 0, stream, a);
}

}  // namespace openjet
