// Causal flash attention for a prefill call's rows (qwen38.md §3.2), on tensor cores: the gated attention of
// attn_decode.cuh with numerics of its own (q, K, V and the probabilities as single fp16, fp32 accumulation), for
// calls of any number of rows. The decode kernel serves at most 64 rows (a kv head's 6 q heads x ~10 tokens) per
// launch and reads the whole cache once per launch; here a block takes 64 or 128 rows of one q head and walks the
// cache once for them, so a 2,048-row chunk reads it 16-32 times per q head instead of ~200 times per kv head.
//
// Row invariance: every row's result depends on its own q, the cache and its position alone: keys are taken in
// tiles of 32 or 64 keys (attn_prefill_keys) at fixed absolute positions (0, 64, ...), each row's online softmax runs
// over the tiles in order, keys after the row are masked, and a tile with no key for the row leaves its state exactly
// as it was (scale 1, probabilities 0). So a row gets the same bits whichever call, chunk size or block it is computed
// in: what the engine's prefill needs for chunk sizes and resumed conversations to agree. The tile size is part of
// the numerics (the online softmax rescales once per tile): 32 and 64 keys give different roundings.
#pragma once

#include <cuda_runtime.h>

#include "attn_decode.cuh"

namespace openjet {

// OPENJET_ATTN_PREFILL_KEYS, the keys per tile: 32, 64, or 0 when unset (the default: 64 where shared memory holds
// the block's tiles, sm_90/100; else 32); -1 for any other value (the engine refuses it).
int attn_prefill_keys_switch();

// OPENJET_ATTN_PREFILL_F16 unset or 1 (the default; 0 turns it off): the engine gives a Q8_0 cache's prefill
// attention fp16 rows (AttnDecodeArgs::f16_rows) in scratch that is free during attention (the dense GEMM's or the
// chunked GDN's).
bool attn_prefill_f16_switch();

// OPENJET_ATTN_PREFILL_WGMMA (read at each call): where the F16 kernel runs at 128 rows x 64 keys (an F16 cache, or a
// Q8_0 cache's fp16 rows) on compute capability 9.0 with a 90a build, the same tiles on Hopper's warpgroup MMA, the
// same bits; elsewhere ignored. Unset or 2 (the default): warp-specialised, a producer warpgroup loading for two
// consumer warpgroups (attn_prefill_wgmma_ws.cu); 1: every warpgroup loading and computing (attn_prefill_wgmma.cu);
// 0: the mma.sync kernel. Returns 0, 1 or 2 (any other value: 2).
int attn_prefill_wgmma_switch();

// Whether this build (a 90a target: OPENJET_HAVE_SM90A) and device (compute capability 9.0, its shared memory) run the
// wgmma kernel.
bool attn_prefill_wgmma_available();

// Bytes of AttnDecodeArgs::f16_rows for `capacity` keys per kv head.
inline size_t attn_prefill_f16_bytes(int n_kv, int capacity) { return 2 * static_cast<size_t>(n_kv) * capacity * 512; }

// Floats of a.work the launch needs for t rows: the q rows after norm and RoPE.
__host__ __device__ inline size_t attn_prefill_work_floats(int n_head, int t) {
    return static_cast<size_t>(t) * n_head * kAttnHeadDim;
}

// Whether this device's shared memory per block holds the kernel's 64-row tiles for the cache type (every supported
// GPU does: ~98 KB of the 99 KB that sm_86/89/120 allow; 128-row blocks take ~130 KB, where the device has it).
bool attn_prefill_fits(int kv_type);

// Rows 0 .. a.t - 1 (any t < 65,536) at positions a.n_past ..: q, k normed and rotated, k and v appended to the
// caches, then o = softmax(q K^T / 16) V * sigmoid(gate) per row and q head over keys 0 .. its position. a.work holds
// attn_prefill_work_floats(n_head, t) floats; a.prefill_rows picks the block size, a.prefill_keys the tile; a.sm_count
// and a.hi_only are not read. cudaErrorInvalidValue on bad arguments and on tiles this device cannot hold.
cudaError_t launch_attn_prefill(const AttnDecodeArgs& a, cudaStream_t stream);

}  // namespace openjet
