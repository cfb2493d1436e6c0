// Prefill projections as dequantise-then-GEMM (issue 8, OPENJET_PREFILL_GEMM=dense): a call's k-quant weights are
// first written out as fp16 rows (launch_dequant_f16, prefill_gemm.cu: the fast GEMM's own weights, w = fp16(q ds
// - dm) in the pack's element order), then multiplied by a dense fp16 GEMM from CUTLASS (sm_90a: TMA, warp-
// specialised wgmma, fp32 accumulation) with y = acc * inv[token] in its epilogue. Why: the fused kernels
// dequantise inside the GEMM's k loop and are bound by shared memory (~300 TFLOP/s on the H200 at best, Q6_K
// ~190), while the same products on plain fp16 run at cuBLAS's ~690 (bench_gemm_ceiling.py); writing a weight
// out as fp16 costs ~0.1-0.2 ms per 27B matrix against ~1-2 ms saved in its 2,048-row GEMM.
//
// Numerics: the fast GEMM's weights and activations, products summed by wgmma in fp32 in CUTLASS's fixed order:
// one kernel configuration for every call (no split-k, no stream-k), so an output depends on its own weight row
// and token row only, and chunk sizes and turn boundaries give the same bits. Not the fast kernel's bits, nor
// decode's.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "act_pack.cuh"

namespace openjet {

// Whether this build carries the dense GEMM (a 90a build with CUTLASS's headers: OPENJET_HAVE_CUTLASS_SM90) and the
// current device runs it (compute capability 9.0).
bool dense_gemm_available();

// Whether this build carries it at all (whatever the device): the probe's build report.
bool dense_gemm_compiled();

// Whether (n, k) meet the GEMM's alignment (n a multiple of 4 for the fp32 output's TMA rows, k of 8); checked
// by the caller before it picks the dense path for a matrix, so that every call of one matrix takes one path.
bool dense_gemm_shape_ok(int n, int k);

// y[t, n] = (x.h[t, :] . w16[n, :]) * x.inv[t] for t tokens (t <= x.rows); w16 row-major [n, k] fp16 in the
// pack's element order. cudaErrorNotSupported where !dense_gemm_available().
cudaError_t launch_dense_gemm(const __half* w16, int n, int k, const ActPack& x, int t, float* y,
                              cudaStream_t stream);

// y[t, n] += (x.h[t, :] . w16[n, :]) * x.inv[t]: launch_dense_gemm's product added to y in its epilogue, rounded once
// (the bits of launch_dense_gemm into scratch, then y += that).
cudaError_t launch_dense_gemm_add(const __half* w16, int n, int k, const ActPack& x, int t, float* y,
                                  cudaStream_t stream);

// v[t, n] = swiglu1(g, u) (elementwise.cuh) of g = (x.h[t, :] . w16[2j, :]) * x.inv[t] and u the same of row 2j + 1:
// the FFN's gate and up in one GEMM over their rows interleaved (w16 [2n, k], row 2j gate's j, 2j + 1 up's), v the
// bits of launch_dense_gemm's outputs put through swiglu1 (dense_gemm_swiglu.cu). cudaErrorNotSupported where
// !dense_gemm_available().
cudaError_t launch_dense_gemm_swiglu(const __half* w16, int n, int k, const ActPack& x, int t, float* v,
                                     cudaStream_t stream);

// h[t, n] = fp16(swiglu1(g, u) * s[t]), g and u as launch_dense_gemm_swiglu's: the FFN's input to ffn_down as fp16
// under the row scale s (a power of two that keeps every |v| s below 2^15: prefill_gemm.cu's bound), written by the
// GEMM's epilogue without the fp32 values or a pack's pass; the down GEMM then multiplies h with 1 / s as its row
// factor. Where every v s is a normal fp16 number, h is the pack's value times a power of two, so the down GEMM's
// output has the pack's bits (the products and sums scale exactly); values under 2^-14 / s round as subnormals.
cudaError_t launch_dense_gemm_swiglu_half(const __half* w16, int n, int k, const ActPack& x, int t, const float* s,
                                          __half* h, cudaStream_t stream);

}  // namespace openjet
