// The CUTLASS side of the dense prefill GEMM, shared by its epilogues (dense_gemm.cu: y = acc * inv[m], or y += that;
// dense_gemm_swiglu.cu: silu(gate) * up of column pairs). Only compiled where OPENJET_HAVE_CUTLASS_SM90.
//
// In CUTLASS's terms: M = tokens (A = the pack's h, row-major [t, k]), N = weight rows (B = w16, [n, k], i.e.
// column-major k x n), K = k; D row-major [t, n] = the epilogue visitor tree Fusion over the accumulators, and C
// (row-major [t, n], ElementC) where the tree reads it (void: none). Tile 128 x 256 x 64, clusters of 2 along M (each weight tile is multicast to two token tiles), the
// cooperative warp-specialised kernel and the plain persistent tile scheduler: every output is one wgmma chain over
// k in order whatever the call's t, so its bits depend on its own rows only.
#pragma once

#ifdef OPENJET_HAVE_CUTLASS_SM90
#include <cuda_runtime.h>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>

#include "act_pack.cuh"
#include "dense_gemm.cuh"
#include "device_attr.cuh"
#include "launch_count.h"

namespace openjet::dense_detail {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

using ElementA = cutlass::half_t;  // activations
using ElementB = cutlass::half_t;  // weights
using ElementAcc = float;
using LayoutA = cutlass::layout::RowMajor;     // [t, k]
using LayoutB = cutlass::layout::ColumnMajor;  // k x n stored as [n, k]
using LayoutD = cutlass::layout::RowMajor;     // [t, n]
constexpr int kAlignA = 8, kAlignB = 8;        // elements per 16 bytes
using TileShape = Shape<_128, _256, _64>;
using ClusterShape = Shape<_2, _1, _1>;

// inv[m] * acc: the pack's row factor (a power of two, so the product is exact), in fp32.
using RowFactor = fusion::Sm90ColBroadcast<0, TileShape, float>;
using Product = fusion::Sm90Compute<cutlass::multiplies, float, float, cutlass::FloatRoundStyle::round_to_nearest>;
using ScaledAcc = fusion::Sm90EVT<Product, RowFactor, fusion::Sm90AccFetch>;

// C + inv[m] * acc, C = D: a projection added to the residual stream in place, rounded once as the add-norm's
// h + delta rounds (the product is exact; fp32 addition commutes).
using Plus = fusion::Sm90Compute<cutlass::plus, float, float, cutlass::FloatRoundStyle::round_to_nearest>;
using ResidualAdd = fusion::Sm90EVT<Plus, fusion::Sm90SrcFetch<float>, ScaledAcc>;

// The GEMM writing D of ElementD through the epilogue visitor tree Fusion (reading C of ElementC where not void).
template <class Fusion, class ElementD, class ElementC = void> struct DenseGemm {
    static constexpr int kAlignD = 16 / sizeof(ElementD);
    using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
        cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, float, ElementC, LayoutD, kAlignD, ElementD,
        LayoutD, kAlignD, cutlass::epilogue::TmaWarpSpecializedCooperative, Fusion>::CollectiveOp;
    using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA, kAlignA, ElementB, LayoutB, kAlignB,
        ElementAcc, TileShape, ClusterShape,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
            sizeof(typename CollectiveEpilogue::SharedStorage))>,
        cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
    using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                        CollectiveEpilogue, cutlass::gemm::PersistentScheduler>;
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
    using FusionArguments = typename CollectiveEpilogue::FusionCallbacks::Arguments;  // the visitor tree's
};

inline cudaError_t status_error(cutlass::Status s) {
    return s == cutlass::Status::kSuccess ? cudaSuccess
           : s == cutlass::Status::kErrorInternal ? cudaErrorLaunchFailure
                                                  : cudaErrorInvalidValue;
}

// D [t, n] (row-major, n ElementD a row) from w16 [n, k] and the pack's t rows, through G's epilogue with `thread`
// (its visitor tree's arguments) and C = c (laid out as D; null where G reads none); the launch counted as `what`.
// cudaErrorNotSupported where !dense_gemm_available(), cudaErrorInvalidValue on bad arguments.
template <class G, class ElementD>
cudaError_t run_dense_gemm(const __half* w16, int n, int k, const ActPack& x, int t, ElementD* d,
                           const typename G::FusionArguments& thread, Counted what, cudaStream_t stream,
                           const void* c = nullptr) {
    using Gemm = typename G::Gemm;
    if (!dense_gemm_available()) return cudaErrorNotSupported;
    if (!w16 || !x.h || !x.inv || !d || t < 1 || t > x.rows || !dense_gemm_shape_ok(n, k)) return cudaErrorInvalidValue;
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
    args.epilogue.thread = thread;
    args.epilogue.ptr_C = static_cast<decltype(args.epilogue.ptr_C)>(c);
    args.epilogue.dC = sd;
    args.epilogue.ptr_D = d;
    args.epilogue.dD = sd;
    args.hw_info.device_id = device;
    args.hw_info.sm_count = sms;

    Gemm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
    if (Gemm::get_workspace_size(args) != 0) return cudaErrorNotSupported;  // the persistent scheduler needs none
    if (const cutlass::Status s = gemm.initialize(args, nullptr, stream); s != cutlass::Status::kSuccess)
        return status_error(s);
    if (const cutlass::Status s = gemm.run(stream); s != cutlass::Status::kSuccess) return status_error(s);
    if (const cudaError_t e = cudaGetLastError()) return e;
    count_launch(what);
    return cudaSuccess;
}

}  // namespace openjet::dense_detail
#endif
