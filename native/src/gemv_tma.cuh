// The decode GEMV fed by a producer warp's bulk copies (gemv_tma.cu; sm_90a, the engine's OPENJET_GEMV_TMA): the
// arithmetic and bits of gemv_mma_kernel, the weights brought in another way.
#pragma once

#include <cuda_runtime.h>

#include "gemv.cuh"
#include "gemv_fold.cuh"

namespace openjet {

// GemvArgs::tma's forms: 1 .. kGemvTmaForms (the engine's OPENJET_GEMV_TMA; -1 the default's choice, 0 off).
constexpr int kGemvTmaForms = 4;

// Whether this library and GPU run it: a 90a build on compute capability 9.0.
bool gemv_tma_available();

// Whether a decode call a (and b, launched with it) runs on it: a.tma not 0, gemv_tma_available(), the tile layout
// (whole 16-row groups), t <= 8, b of a's type, k and layout.
bool gemv_tma_takes(const GemvArgs& a, const GemvArgs* b);

// a's GEMV (and b's after it in the same launch) on a grid of resident blocks, each a producer warp and four consumer
// warps; the caller has checked gemv_tma_takes. cudaErrorNotSupported, nothing launched: no block of the form fits
// an SM (the caller takes the cp.async kernel).
template <int QT> cudaError_t launch_gemv_tma(const GemvArgs& a, const GemvArgs* b, cudaStream_t stream);

// The fold's forms (gemv_fold.cuh; Q4_K, Q5_K, Q6_K): in, B making its own pack (with b, a second matrix of the same
// input), at one token row in shared memory, at more (f.rows) in a.x by its first t blocks; else A with the fold's tile
// epilogue. launch_gemv_fold checks the call first.
template <int QT>
cudaError_t launch_gemv_tma_fold(const GemvArgs& a, const GemvArgs* b, const GemvFold& f, bool in, cudaStream_t stream);
// A group (the engine's OPENJET_GEMV_GROUP): decode calls of one input (k, t and pack) that launch_gemv_tma cannot
// take in one launch, a and b of two types (a Q6_K, b Q4_K), or a, b and c (Q4_K, Q4_K, then Q4_K or Q6_K), on one
// grid: each tile computed as its type's launch computes it, so the same bits. Whether it takes them:
bool gemv_tma_group_takes(const GemvArgs& a, const GemvArgs& b, const GemvArgs* c);
// The launch (fold: B's own pack, at one token row or, with fold->rows, at more; else a.x; launch_gemv_fold_group
// checks the fold's call).
// cudaErrorNotSupported, nothing launched: no block of the form fits an SM (the caller launches them one by one).
cudaError_t launch_gemv_tma_group(const GemvArgs& a, const GemvArgs& b, const GemvArgs* c, const GemvFold* fold,
                                  cudaStream_t stream);
// The swiglu's own pack's forms (gemv_fold.cuh launch_gemv_swiglu; Q4_K).
cudaError_t launch_gemv_tma_swiglu(const GemvArgs& a, const GemvArgs& b, const GemvFold& f, bool fold_in,
                                   cudaStream_t stream);

}  // namespace openjet
