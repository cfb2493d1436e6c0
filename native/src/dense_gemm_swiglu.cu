// launch_dense_gemm_swiglu (dense_gemm.cuh): the dense prefill GEMM of the FFN's gate and up in one, whose epilogue
// writes silu(gate) * up. Why: the plain GEMM wrote [t, 2 n_ff] fp32 (the 27B's 4,096-row chunk: 570 MB) that a
// pass of its own then read to write the swiglu values (H200: 201 us a layer); here the GEMM writes the values,
// [t, n_ff] fp32, and only the pack's pass is left.
//
// How, within CUTLASS's sm90 epilogue (whose visitor tree maps each accumulator to one output element): the weight
// rows come interleaved, row 2j gate's row j and row 2j + 1 up's (launch_ffn_gate_up_pack's dequantisation), so
// output columns 2j and 2j + 1 are the pair. A wgmma accumulator fragment holds adjacent columns of a row in
// adjacent registers, and the epilogue's fragments keep them (its register-to-shared copy stores them as one 32-bit
// word: stmatrix of fp16 pairs), so the tree's root SwigluPairBits sees a pair in elements 2i, 2i + 1 of its
// fragment. It writes the fp32 value v = swiglu1(g inv, u inv) as two fp16 words carrying v's low and high 16 bits:
// D, [t, 2 n_ff] "fp16", is then byte for byte v [t, n_ff] fp32. The values are swiglu1 of the plain GEMM's
// outputs (the same product inv * acc, then the same function): the plain GEMM's and the swiglu pass's bits.
#include "dense_gemm.cuh"

#include "dense_gemm_cutlass.cuh"
#include "elementwise.cuh"
#include "launch_count.h"

namespace openjet {

#ifdef OPENJET_HAVE_CUTLASS_SM90
namespace {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

// Root of the visitor tree: input fragment = inv * acc (fp32) of adjacent column pairs (gate, up); output = the fp16
// words of the fp32 swiglu value of each pair, low half first (little-endian: the float's bytes).
struct SwigluPairBits : fusion::Sm90VisitorImpl<> {
    using fusion::Sm90VisitorImpl<>::Sm90VisitorImpl;

    struct ConsumerStoreCallbacks : fusion::EmptyConsumerStoreCallbacks {
        template <class ElementAccumulator, class ElementInput, int kFragment>
        CUTLASS_DEVICE cutlass::Array<cutlass::half_t, kFragment> visit(
            cutlass::Array<ElementAccumulator, kFragment> const&, int, int, int,
            cutlass::Array<ElementInput, kFragment> const& in) {
            static_assert(kFragment % 2 == 0, "whole column pairs");
            cutlass::Array<cutlass::half_t, kFragment> out;
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < kFragment; i += 2) {
                const float v = swiglu1(static_cast<float>(in[i]), static_cast<float>(in[i + 1]));
                const uint32_t bits = __float_as_uint(v);
                out[i] = cutlass::half_t::bitcast(static_cast<uint16_t>(bits & 0xFFFFu));
                out[i + 1] = cutlass::half_t::bitcast(static_cast<uint16_t>(bits >> 16));
            }
            return out;
        }
    };

    template <bool kReferenceSrc, class... Args>
    CUTLASS_DEVICE auto get_consumer_store_callbacks(fusion::detail::ConsumerStoreArgs<Args...> const&) {
        return ConsumerStoreCallbacks();
    }
};

using G = dense_detail::DenseGemm<fusion::Sm90EVT<SwigluPairBits, dense_detail::ScaledAcc>, cutlass::half_t>;

// The fp16 form's root (launch_dense_gemm_swiglu_half): inputs inv * acc of adjacent column pairs (gate, up) and the
// row's scale s; output the bytes of fp16(swiglu1(g, u) * s) of each pair, low byte first, so that D, [t, 2n]
// bytes, is byte for byte h [t, n] fp16: the pack's value (pack_block: the same product, the same rounding) under
// another power-of-two scale.
struct SwigluHalfBytes : fusion::Sm90VisitorImpl<> {
    using fusion::Sm90VisitorImpl<>::Sm90VisitorImpl;

    struct ConsumerStoreCallbacks : fusion::EmptyConsumerStoreCallbacks {
        template <class ElementAccumulator, class ElementPair, class ElementScale, int kFragment>
        CUTLASS_DEVICE cutlass::Array<uint8_t, kFragment> visit(
            cutlass::Array<ElementAccumulator, kFragment> const&, int, int, int,
            cutlass::Array<ElementPair, kFragment> const& in, cutlass::Array<ElementScale, kFragment> const& s) {
            static_assert(kFragment % 2 == 0, "whole column pairs");
            cutlass::Array<uint8_t, kFragment> out;
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < kFragment; i += 2) {
                const float v = swiglu1(static_cast<float>(in[i]), static_cast<float>(in[i + 1]));
                const uint16_t bits = __half_as_ushort(__float2half_rn(__fmul_rn(v, static_cast<float>(s[i]))));
                out[i] = static_cast<uint8_t>(bits & 0xFFu);
                out[i + 1] = static_cast<uint8_t>(bits >> 8);
            }
            return out;
        }
    };

    template <bool kReferenceSrc, class... Args>
    CUTLASS_DEVICE auto get_consumer_store_callbacks(fusion::detail::ConsumerStoreArgs<Args...> const&) {
        return ConsumerStoreCallbacks();
    }
};

using RowScale = fusion::Sm90ColBroadcast<0, dense_detail::TileShape, float>;
using GHalf = dense_detail::DenseGemm<fusion::Sm90EVT<SwigluHalfBytes, dense_detail::ScaledAcc, RowScale>, uint8_t>;

}  // namespace
#endif

cudaError_t launch_dense_gemm_swiglu(const __half* w16, int n, int k, const ActPack& x, int t, float* v,
                                     cudaStream_t stream) {
#ifdef OPENJET_HAVE_CUTLASS_SM90
    const G::FusionArguments thread{{{x.inv, 0.0f, {}}, {}, {}}, {}};  // ((row factor, accumulator, product), root)
    return dense_detail::run_dense_gemm<G>(w16, 2 * n, k, x, t, reinterpret_cast<cutlass::half_t*>(v), thread,
                                           Counted::kDenseGemmSwiglu, stream);
#else
    (void)w16, (void)n, (void)k, (void)x, (void)t, (void)v, (void)stream;
    return cudaErrorNotSupported;
#endif
}

cudaError_t launch_dense_gemm_swiglu_half(const __half* w16, int n, int k, const ActPack& x, int t, const float* s,
                                          __half* h, cudaStream_t stream) {
#ifdef OPENJET_HAVE_CUTLASS_SM90
    if (!s) return cudaErrorInvalidValue;
    // ((row factor, accumulator, product), row scale, root)
    const GHalf::FusionArguments thread{{{x.inv, 0.0f, {}}, {}, {}}, {s, 0.0f, {}}, {}};
    return dense_detail::run_dense_gemm<GHalf>(w16, 2 * n, k, x, t, reinterpret_cast<uint8_t*>(h), thread,
                                               Counted::kDenseGemmSwigluHalf, stream);
#else
    (void)w16, (void)n, (void)k, (void)x, (void)t, (void)s, (void)h, (void)stream;
    return cudaErrorNotSupported;
#endif
}

}  // namespace openjet
