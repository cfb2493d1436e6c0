#include "engine_gemv.cuh"
#include "gemv_kquant.cuh"

namespace openjet {

cudaError_t engine_gemv(int qtype, const void* w, int n, int k, int t, const int8_t* xq, const float2* xds,
                        const float* xf, float* y, cudaStream_t stream) {
    const GemvArgs a{qtype, w, n, k, t, xq, xds, xf, y};
    return launch_gemv(a, stream);
}

}  // namespace openjet
