// launch_dense_gemm (dense_gemm.cuh): CUTLASS's Hopper GEMM over fp16 operands (dense_gemm_cutlass.cuh), built only
// where the engine is compiled for sm_90a and CUTLASS's headers were found (native/CMakeLists.txt:
// OPENJET_HAVE_CUTLASS_SM90). D = y row-major [t, n] fp32 = acc * inv[m] (an epilogue visitor tree: a per-row
// vector times the accumulator).
#include "dense_gemm.cuh"

#include "dense_gemm_cutlass.cuh"
#include "device_attr.cuh"
#include "launch_count.h"

namespace openjet {

bool dense_gemm_available() {
#ifdef OPENJET_HAVE_CUTLASS_SM90
    int major = 0, minor = 0;
    return device_attribute(cudaDevAttrComputeCapabilityMajor, &major) == cudaSuccess &&
           device_attribute(cudaDevAttrComputeCapabilityMinor, &minor) == cudaSuccess && major == 9 && minor == 0;
#else
    return false;
#endif
}

bool dense_gemm_compiled() {
#ifdef OPENJET_HAVE_CUTLASS_SM90
    return true;
#else
    return false;
#endif
}

bool dense_gemm_shape_ok(int n, int k) { return n > 0 && k > 0 && n % 4 == 0 && k % 8 == 0; }

cudaError_t launch_dense_gemm(const __half* w16, int n, int k, const ActPack& x, int t, float* y,
                              cudaStream_t stream) {
#ifdef OPENJET_HAVE_CUTLASS_SM90
    using G = dense_detail::DenseGemm<dense_detail::ScaledAcc, float>;
    const G::FusionArguments thread{{x.inv, 0.0f, {}}, {}, {}};  // (row factor, accumulator, product)
    return dense_detail::run_dense_gemm<G>(w16, n, k, x, t, y, thread, Counted::kDenseGemm, stream);
#else
    (void)w16, (void)n, (void)k, (void)x, (void)t, (void)y, (void)stream;
    return cudaErrorNotSupported;
#endif
}

cudaError_t launch_dense_gemm_add(const __half* w16, int n, int k, const ActPack& x, int t, float* y,
                                  cudaStream_t stream) {
#ifdef OPENJET_HAVE_CUTLASS_SM90
    using G = dense_detail::DenseGemm<dense_detail::ResidualAdd, float, float>;
    const G::FusionArguments thread{{}, {{x.inv, 0.0f, {}}, {}, {}}, {}};  // (C, the scaled accumulator, the sum)
    const cudaError_t e =
        dense_detail::run_dense_gemm<G>(w16, n, k, x, t, y, thread, Counted::kPrefillResidual, stream, y);
    if (e == cudaSuccess) count_launch(Counted::kDenseGemm);  // a dense GEMM too
    return e;
#else
    (void)w16, (void)n, (void)k, (void)x, (void)t, (void)y, (void)stream;
    return cudaErrorNotSupported;
#endif
}

}  // namespace openjet
