// launch_dense_gemm (dense_gemm.cuh): CUTLASS's Hopper GEMM over fp16 operands, built only where the engine is
// compiled for sm_90a and CUTLASS's headers were found (native/CMakeLists.txt: OPENJET_HAVE_CUTLASS_SM90).
//
// In CUTLASS's terms: M = tokens (A = the pack's h, row-major [t, k]), N = weight rows (B = w16, [n, k], i.e.
// column-major k x n), K = k; D = y row-major [t, n] fp32 = acc * inv[m] (an epilogue visitor tree: a per-row
// vector times the accumulator), no C operand. Tile 128 x 256 x 64, clusters of 2 along M (each weight tile is
// multicast to two token tiles), the cooperative warp-specialised kernel and the plain persistent tile scheduler:
// every output is one wgmma chain over k in order whatever the call's t, so its bits depend on its own rows only.
#include "dense_gemm.cuh"

#include "device_attr.cuh"
#include "launch_count.h"

#ifdef OPENJET_HAVE_CUTLASS_SM90
#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>
#endif

namespace openjet {

#ifdef OPENJET_HAVE_CUTLASS_SM90
namespace {

using namespace cute;

using ElementA = cutlass::half_t;  // activations
using ElementB = cutlass::half_t;  // weights
using ElementD = float;
using ElementAcc = float;
using LayoutA = cutlass::layout::RowMajor;     // [t, k]
using LayoutB = cutlass::layout::ColumnMajor;  // k x n stored as [n, k]
using LayoutD = cutlass::layout::RowMajor;     // [t, n]
constexpr int kAlignA = 8, kAlignB = 8, kAlignD = 4;  // elements per 16 bytes
using TileShape = Shape<_128, _256, _64>;
using ClusterShape = Shape<_2, _1, _1>;

// D = inv[m] * acc: the pack's row factor (a power of two, so the product is exact).
using RowFactor = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float>;
using Product = cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, ElementD, float,
                                                       cutlass::FloatRoundStyle::round_to_nearest>;
using Epilogue = cutlass::epilogue::fusion::Sm90EVT<Product, RowFactor, cutlass::epilogue::fusion::Sm90AccFetch>;

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, float, void, LayoutD, kAlignD, ElementD, LayoutD,
    kAlignD, cutlass::epilogue::TmaWarpSpecializedCooperative, Epilogue>::CollectiveOp;

using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA, kAlignA, ElementB, LayoutB, kAlignB,
    ElementAcc, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename CollectiveEpilogue::SharedStorage))>,
    cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                        CollectiveEpilogue, cutlass::gemm::PersistentScheduler>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

cudaError_t status_error(cutlass::Status s) {
    return s == cutlass::Status::kSuccess ? cudaSuccess
           : s == cutlass::Status::kErrorInternal ? cudaErrorLaunchFailure
                                                  : cudaErrorInvalidValue;
}

}  // namespace
#endif

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
    if (!dense_gemm_available()) return cudaErrorNotSupported;
    if (!w16 || !x.h || !x.inv || !y || t < 1 || t > x.rows || !dense_gemm_shape_ok(n, k)) return cudaErrorInvalidValue;
    int sms = 0;
    if (const cudaError_t e = device_attribute(cudaDevAttrMultiProcessorCount, &sms)) return e;
    int device = 0;
    if (const cudaError_t e = cudaGetDevice(&device)) return e;

    using StrideA = typename Gemm::GemmKernel::StrideA;
    using StrideB = typename Gemm::GemmKernel::StrideB;
    using StrideD = typename Gemm::GemmKernel::StrideD;
    const StrideA sa = make_stride(static_cast<int64_t>(k), _1{}, static_cast<int64_t>(t) * k);
    const StrideB sb = make_stride(static_cast<int64_t>(k), _1{}, static_cast<int64_t>(n) * k);
    const StrideD sd = make_stride(static_cast<int64_t>(n), _1{}, static_cast<int64_t>(t) * n);

    typename Gemm::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.problem_shape = make_shape(t, n, k, 1);
    args.mainloop.ptr_A = reinterpret_cast<const ElementA*>(x.h);
    args.mainloop.dA = sa;
    args.mainloop.ptr_B = reinterpret_cast<const ElementB*>(w16);
    args.mainloop.dB = sb;
    args.epilogue.thread = {{x.inv, 0.0f, {}}, {}, {}};  // (row factor, accumulator, product)
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = sd;
    args.epilogue.ptr_D = y;
    args.epilogue.dD = sd;
    args.hw_info.device_id = device;
    args.hw_info.sm_count = sms;

    Gemm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
    if (Gemm::get_workspace_size(args) != 0) return cudaErrorNotSupported;  // the persistent scheduler needs none
    if (const cutlass::Status s = gemm.initialize(args, nullptr, stream); s != cutlass::Status::kSuccess)
        return status_error(s);
    if (const cutlass::Status s = gemm.run(stream); s != cutlass::Status::kSuccess) return status_error(s);
    count_launch(Counted::kDenseGemm);
    return cudaGetLastError();
#else
    (void)w16, (void)n, (void)k, (void)x, (void)t, (void)y, (void)stream;
    return cudaErrorNotSupported;
#endif
}

}  // namespace openjet
