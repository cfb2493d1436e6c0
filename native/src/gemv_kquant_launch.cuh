// The body of launch_gemv_type<QT>: every (T, R) instance of one weight type. Included once per type by
// gemv_kquant_<type>.cu so that the types compile in parallel.
#pragma once

#include "gemv_kquant.cuh"

namespace openjet {

template <int QT, int T, int R>
cudaError_t launch_gemv_instance(const GemvArgs& a, int warps_per_block, cudaStream_t stream) {
    const int smem = gemv_smem_bytes<QT, R>(warps_per_block);
    auto kernel = gemv_kquant_kernel<QT, T, R>;
    if (smem > 48 * 1024) {  // above the default dynamic limit: opt in (once per instance)
        static cudaError_t opted = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (opted != cudaSuccess) return opted;
    }
    const int warps = (a.n + R - 1) / R;
    const int blocks = (warps + warps_per_block - 1) / warps_per_block;
    const int elems = Block<QT>::kElems;
    const long long row_bytes = (long long)(a.k / elems) * Block<QT>::kBytes;
    kernel<<<blocks, warps_per_block * 32, smem, stream>>>(static_cast<const uint8_t*>(a.w), row_bytes, a.n,
                                                            a.k / elems, a.xq, a.xds, a.k, a.y);
    return cudaGetLastError();
}

template <int QT, int T>
cudaError_t launch_gemv_rows(const GemvArgs& a, int rows_per_warp, int warps_per_block, cudaStream_t stream) {
    switch (rows_per_warp) {
        case 1: return launch_gemv_instance<QT, T, 1>(a, warps_per_block, stream);
        case 2: return launch_gemv_instance<QT, T, 2>(a, warps_per_block, stream);
        case 4: return launch_gemv_instance<QT, T, 4>(a, warps_per_block, stream);
        default: return cudaErrorInvalidValue;
    }
}

template <int QT>
cudaError_t launch_gemv_type_impl(const GemvArgs& a, int rows_per_warp, int warps_per_block, cudaStream_t stream) {
    switch (a.t) {
        case 1: return launch_gemv_rows<QT, 1>(a, rows_per_warp, warps_per_block, stream);
        case 2: return launch_gemv_rows<QT, 2>(a, rows_per_warp, warps_per_block, stream);
        case 3: return launch_gemv_rows<QT, 3>(a, rows_per_warp, warps_per_block, stream);
        case 4: return launch_gemv_rows<QT, 4>(a, rows_per_warp, warps_per_block, stream);
        case 5: return launch_gemv_rows<QT, 5>(a, rows_per_warp, warps_per_block, stream);
        case 6: return launch_gemv_rows<QT, 6>(a, rows_per_warp, warps_per_block, stream);
        case 7: return launch_gemv_rows<QT, 7>(a, rows_per_warp, warps_per_block, stream);
        case 8: return launch_gemv_rows<QT, 8>(a, rows_per_warp, warps_per_block, stream);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace openjet

// Defines launch_gemv_type<QT> in the including file.
#define OPENJET_GEMV_TYPE_INSTANCE(QT)                                                                      \
    namespace openjet {                                                                                     \
    template <>                                                                                             \
    cudaError_t launch_gemv_type<QT>(const GemvArgs& a, int rows_per_warp, int warps_per_block,             \
                                     cudaStream_t stream) {                                                 \
        return launch_gemv_type_impl<QT>(a, rows_per_warp, warps_per_block, stream);                        \
    }                                                                                                       \
    }
