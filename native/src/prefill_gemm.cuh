// Prefill projections as a plain tensor-core GEMM over fp16-dequantised weights (issue 8), for Q4_K, Q5_K, Q6_K
// and Q8_0: the default prefill numerics since 2026-12-02 (OPENJET_PREFILL_GEMM=exact takes the bit-exact kernels of
// gemv_mma.cuh instead; gemv_mma.cuh's prefill_gemm_choice has the figures); every other type takes those always.
//
// Numerics (declared, its own): each weight becomes, by one fp16 fma over the exact code, w = fp16(q ds - dm)
// with ds = fp16(d sc), dm = fp16(dmin m) (Q4_K, Q5_K), w = fp16((q - 32) ds), ds = fp16(d sc) (Q6_K) or
// w = fp16(q d) (Q8_0); each
// activation is the pack's fp16 h (act_pack.cuh); an output is ONE fp32
// chain of mma m16n8k16 over k in order, times the pack's 1/s. An output depends on its own weight row and
// token row only, so chunk sizes and turn boundaries give the same bits; decode's bits it does not give (the
// decode GEMV keeps its exact-code numerics): a conversation resumed from the cache matches a fresh prefill
// only if the tokens decoded in between are prefilled again.
#pragma once

#include <cuda_runtime.h>

#include "gemv.cuh"

namespace openjet {

// Whether the GEMM takes this weight type.
bool prefill_gemm_takes(int qtype);

// Whether a prefill call of this W may take the dense path where the caller gives it scratch (GemvArgs::dense): a
// type the GEMM takes, the dense GEMM's alignment, a build and device that run it (dense_gemm.cuh).
bool prefill_dense_takes(int qtype, int n, int k);

// Rows from which a call takes the dense path: below, dequantising the whole matrix costs more than the fast
// kernel's reading of the blocks (H200, 17408 x 5120 Q4_K: ~95 us of dequantisation against ~0.3 us a row saved).
// Either path gives the same bits (wgmma sums the k16 products in mma.sync's chain: tested on the H200), so a
// row's bits do not depend on its call's size.
constexpr int kDenseMinRows = 256;

// y[t, n] = W x for a W of a type it takes and a pack of t rows (GemvArgs as launch_gemv's); with a.dense where
// prefill_dense_takes and t >= kDenseMinRows, W is dequantised into a.dense (n k halves) and multiplied there
// (dense_gemm.cuh), or, where a.w16 holds W's rows packed (ld16 = k), multiplied there.
cudaError_t launch_prefill_gemm(const GemvArgs& a, cudaStream_t stream);

// W (a's qtype, w, n, k, tiled) as the dense path's fp16 rows into w16, ld16 halves from one row to the next (k, or
// 2k for launch_ffn_gate_up_pack's interleaved gate and up): the bits a prefill call writes before its dense GEMM,
// for an engine that keeps them (GemvArgs::w16). A type the prefill GEMM takes, k a multiple of 256.
cudaError_t launch_dequant_f16(const GemvArgs& a, __half* w16, long long ld16, cudaStream_t stream);

// The FFN's input to ffn_down: out <- the pack of silu(gate x) * (up x), [t, n], for gate and up GemvArgs of one pack
// and t (gate.y and up.y: [t, n] floats each; for a prefill, gate.y holds 2 t n floats: the engine's big1 and big2
// are one allocation). A prefill's rows of a type the prefill GEMM takes, with prefill numerics of its own, take gate
// and up in one GEMM unless OPENJET_PREFILL_FFN_FUSED=0 (read at each call): the fast kernel reads the two matrices'
// rows interleaved in groups of 8, so that each thread holds an output's gate and up products and its epilogue
// writes silu(g) u, then the plain pack; the dense path (gate.dense: 2 n k halves) dequantises gate and up into one
// [2n, k] matrix, their rows interleaved, for one dense GEMM whose epilogue writes silu(g) u (launch_dense_gemm_swiglu)
// (or takes that matrix from gate.w16 where up.w16 = gate.w16 + k and ld16 = 2k: kept by the engine) and then the pack
// of those rows (OPENJET_PREFILL_SWIGLU=split or rows: [gate; up] for the plain dense GEMM, whose
// [t, 2n] output the swiglu pack reads). Everything else: launch_gemv_pair, then launch_swiglu_pack. Either way the
// same bits: the same products, swiglu1 and pack. H200, 27B, 2,048 rows: docs/ENGINE.md's switch table.
//
// The bounded form (the default where the engine keeps the FFN's fp16 rows: gate.w16 holds gate and up interleaved in
// the pack's order, their norms in gate.w16_norms (launch_gate_up_pack_order); OPENJET_PREFILL_SWIGLU unset or
// epilogue; `half` given): each row's scale s comes from a bound on |silu(g) u| (row_bound.cuh) instead of the
// row's maximum, so that the dense GEMM can write fp16(silu(g) u s) in its epilogue (launch_dense_gemm_swiglu_half)
// into half->h with 1 / s in half->inv: no fp32 values, no pack pass, no sums. That only where half->direct (the
// caller's ffn_down takes the dense path, which reads no sums: prefill_dense_runs); every other call of such rows (a
// call under kDenseMinRows rows on the fast kernel) packs its values under the same scale, so that a row's bits do
// not depend on its call's size. *wrote_half says which of out and half holds the result. Numerics of their own: the
// pack's values times a power of two where they are normal fp16 numbers (the down GEMM's bits then), the smallest
// (|v| s < 2^-14) as subnormals.
struct FfnHalfOut {
    __half* h;    // [t, n] fp16, the pack's element order (rows n apart)
    float* s;     // [t] scratch: the row scales
    float* inv;   // [t] their inverses, the down GEMM's row factors
    bool direct;  // whether h may take the pack's place (ffn_down on the dense GEMM)
};
cudaError_t launch_ffn_gate_up_pack(const GemvArgs& gate, const GemvArgs& up, const ActPack& out,
                                    cudaStream_t stream, const FfnHalfOut* half = nullptr,
                                    bool* wrote_half = nullptr);

// Whether a prefill call of `a` runs on the dense GEMM (launch_gemv's choice: scratch given, kDenseMinRows rows or
// more, OPENJET_PREFILL_GEMM dense, a type and shape it takes).
bool prefill_dense_runs(const GemvArgs& a);

// The kept gate-and-up matrix w16 ([2n, k] fp16, gate row j at 2j, up's at 2j + 1, in launch_dequant_f16's element
// order) put in the order of the pack's elements of its outputs (pair slots 4q + 1 and 4q + 2 swapped: act_quad_pos),
// so that the fp16 form's output column p is the pack's element p, which ffn_down's fp16 rows multiply as they are;
// and the largest row norms of gate and up (fp32 sums of the fp16 rows) into norms[0] and norms[1]. n % 4 == 0.
cudaError_t launch_gate_up_pack_order(__half* w16, int n, int k, float* norms, cudaStream_t stream);

}  // namespace openjet
