// launch_pack_act: one block per token row; row_pack_threads.
#include <cstdlib>
#include <cstring>

#include "act_pack.cuh"
#include "elementwise.cuh"
#include "openjet.h"
#include "pdl.cuh"

namespace openjet {
namespace {

template <bool kNorm, int kThreads = kPackThreads, int kCached = kPackCached>
__global__ void __launch_bounds__(kThreads) pack_act_kernel(const float* __restrict__ x, int k,
                                                           const float* __restrict__ norm_w, float eps, ActPack p) {
    pdl_start();  // pdl.cuh
    const int row = blockIdx.x;
    const float* xr = x + static_cast<long long>(row) * k;
    const float scale = kNorm ? row_rms_scale(xr, k, eps) : 1.0f;
    pack_act_row<kThreads, kCached>(
        [&](int i) { return kNorm ? __fmul_rn(__fmul_rn(xr[i], scale), norm_w[i]) : xr[i]; }, k, p, row);
}

// kThreads threads a row, each keeping kCached values (the 27B's rows of 6,144 at 256 and 512).
template <int kThreads, int kCached>
cudaError_t launch_pack_rows(const float* x, int t, int k, const float* norm_w, float eps, const ActPack& p,
                             cudaStream_t stream) {
    if (norm_w)
        return launch_kernel(pack_act_kernel<true, kThreads, kCached>, t, kThreads, 0, stream, x, k, norm_w, eps, p);
    return launch_kernel(pack_act_kernel<false, kThreads, kCached>, t, kThreads, 0, stream, x, k, nullptr, eps, p);
}

}  // namespace

int row_pack_threads(RowPack kernel) {
    const char* v = std::getenv("OPENJET_ROW_PACK_THREADS");
    if (v && std::strcmp(v, "auto") != 0) {
        const int n = std::atoi(v);
        return n == 512 || n == 1024 ? n : 256;
    }
    return kernel == RowPack::kSwiglu ? 512 : 256;
}

cudaError_t launch_pack_act(const float* x, int t, int k, const float* norm_w, float eps, const ActPack& p,
                            cudaStream_t stream) {
    if (!x || !act_pack_fits(p, t, k)) return cudaErrorInvalidValue;
    if (t <= OPENJET_ENGINE_MAX_T) {
        if (!norm_w) {  // on clusters by default (OPENJET_PACK_CLUSTER), the same bits (elementwise.cuh)
            const cudaError_t e = launch_pack_act_cluster(x, t, k, p, stream);
            if (e != cudaErrorNotSupported) return e;
        }
        if (!act_pack_plain(p)) return cudaErrorNotSupported;  // (only the cluster pack writes the integer twin)
        return launch_pack_rows<kPackThreads, kPackCached>(x, t, k, norm_w, eps, p, stream);
    }
    if (!act_pack_plain(p)) return cudaErrorNotSupported;
    switch (row_pack_threads(RowPack::kPack)) {
    case 1024: return launch_pack_rows<1024, kPackCached>(x, t, k, norm_w, eps, p, stream);
    case 512: return launch_pack_rows<512, 12>(x, t, k, norm_w, eps, p, stream);
    default: return launch_pack_rows<256, 24>(x, t, k, norm_w, eps, p, stream);
    }
}

}  // namespace openjet
