// Prefill projections as a plain tensor-core GEMM over fp16-dequantised weights (issue 8). Opt-in
// (OPENJET_PREFILL_GEMM=fast) and Q4_K only for now: the experiment that says how far a prefill with numerics
// of its own goes (NOTES_gemv.md, 2026-12-02); every other case takes the bit-exact kernels of gemv_mma.cuh.
//
// Numerics (declared, its own): each weight becomes w = fp16(q ds - dm), ds = fp16(d sc), dm = fp16(dmin m),
// one fp16 fma over the exact code; each activation is the pack's fp16 h (act_pack.cuh); an output is ONE fp32
// chain of mma m16n8k16 over k in order, times the pack's 1/s. An output depends on its own weight row and
// token row only, so chunk sizes and turn boundaries give the same bits; decode's bits it does not give (the
// decode GEMV keeps its exact-code numerics): a conversation resumed from the cache matches a fresh prefill
// only if the tokens decoded in between are prefilled again.
#pragma once

#include <cuda_runtime.h>

#include "gemv.cuh"

namespace openjet {

// y[t, n] = W x for a Q4_K W and a pack of t > 8 rows (GemvArgs as launch_gemv's).
cudaError_t launch_prefill_gemm_q4_k(const GemvArgs& a, cudaStream_t stream);

}  // namespace openjet
