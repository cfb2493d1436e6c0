// launch_add_norm_pack, launch_swiglu_pack (elementwise.cuh): one block of kPackThreads per row.
#include "elementwise.cuh"
#include "pdl.cuh"

namespace openjet {
namespace {

// Rows add_norm_pack stages in shared memory (2 k floats within the 48 KiB a launch gets without opting in, beside
// the packer's and row_rms_scale's own 160 bytes): the 27B's 5,120.
constexpr int kAddNormStagedMax = 6016;

// kStaged (k <= kAddNormStagedMax): the summed row and the norm weights are staged in shared memory as they are
// written, so the sum of squares and the pack read them there instead of from L2 again (two round trips fewer
// per call, ~129 calls per 27B decode step); the same operations in the same order, so the same bits.
template <bool kStaged>
__global__ void __launch_bounds__(kPackThreads)
add_norm_pack_kernel(float* __restrict__ h, const float* __restrict__ delta, const float* __restrict__ w, int k,
                     float eps, float* __restrict__ a_out, ActPack p) {
    extern __shared__ float staged[];  // kStaged: [k] the row after the add, [k] w
    pdl_start();  // pdl.cuh
    const int row = blockIdx.x;
    float* hr = h + static_cast<long long>(row) * k;
    const float* dr = delta ? delta + static_cast<long long>(row) * k : nullptr;
    if constexpr (kStaged) {
        float* sh = staged;
        float* sw = staged + k;
#pragma unroll 4
        for (int i = threadIdx.x; i < k; i += kPackThreads) {
            const float x = dr ? __fadd_rn(hr[i], dr[i]) : hr[i];
            if (dr) hr[i] = x;
            sh[i] = x;
            sw[i] = w[i];
        }
        __syncthreads();
        const float scale = row_rms_scale(sh, k, eps);
        pack_act_row([&](int i) { return __fmul_rn(__fmul_rn(sh[i], scale), sw[i]); }, k, p, row,
                     a_out ? a_out + static_cast<long long>(row) * k : nullptr);
    } else {
        if (dr) {
#pragma unroll 4
            for (int i = threadIdx.x; i < k; i += kPackThreads) hr[i] = __fadd_rn(hr[i], dr[i]);
        }
        __syncthreads();
        const float scale = row_rms_scale(hr, k, eps);
        pack_act_row([&](int i) { return __fmul_rn(__fmul_rn(hr[i], scale), w[i]); }, k, p, row,
                     a_out ? a_out + static_cast<long long>(row) * k : nullptr);
    }
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
    if (k <= kAddNormStagedMax)
        return launch_kernel(add_norm_pack_kernel<true>, t, kPackThreads, sizeof(float) * 2 * k, stream, h, delta, w,
                             k, eps, a_out, p);
    return launch_kernel(add_norm_pack_kernel<false>, t, kPackThreads, 0, stream, h, delta, w, k, eps, a_out, p);
}

cudaError_t launch_swiglu_pack(const float* gate, const float* up, int t, int k, const ActPack& p,
                               cudaStream_t stream) {
    if (!gate || !up || !act_pack_fits(p, t, k)) return cudaErrorInvalidValue;
    return launch_kernel(swiglu_pack_kernel, t, kPackThreads, 0, stream, gate, up, k, p);
}

}  // namespace openjet
