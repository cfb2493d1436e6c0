// Decode GEMV on integer tensor cores: an experiment for issue 6's decode target (NOTES_gemv.md, "integer
// GEMV"). The engine runs it only under OPENJET_GEMV_INT (opt-in; gemv.cu launch_imma, its pack made from the fp16
// pack); the test API (openjet_test_gemv_imma, openjet_test_bench_gemv_imma) runs it beside the fp16 GEMV
// (gemv_mma.cuh). Measured on the H200 (NOTES_gemv.md): 4-5x closer to the unquantised x; in isolation the Q4_K +
// Q6_K decode mix at T=1 5,517 us on the tile layout against the fp16 GEMV's 6,738, slower at T=8; in the 27B's
// step no faster (2026-12-03, fourteenth session): what it would need is listed there.
//
// Why: the fp16 GEMV spends ~1 instruction per weight and lane turning codes into exact fp16 products (LOP3 +
// HFMA2 per pair, a 4-chain fold per unit, the min term as an mma) and runs at ~46% of the H200's copy rate,
// bound by issue at its occupancy. Here the codes go into the mma as they are (u8: a Q4_K nibble is one LOP3 for
// four codes; Q5_K adds its fifth bit with one more) and the activations as two int8 digits, so every sum inside a
// super-block is an exact integer (int32, no rounding, any order): about 2.2x (Q4_K) to 4x (Q6_K) fewer instructions
// per weight byte. (Q5_K since 2026-12-06, for ssm_out: not yet measured.)
//
// Numerics (a declared change against the fp16 GEMV, to pass issue 6's KL bar before the engine takes it):
//   per token row and 256-element block b: s_b = 32639 / max|x| (fp32), x_int = rint(x * s_b) in [-32639, 32639],
//   stored as the digits hi = (x_int + 128) >> 8 and lo = x_int - 256 hi (both int8); inv_b = max|x| / 32639.
//   Per output, super-block and token: the integer sums of (code * digit) over each sub-block on the tensor cores,
//   scaled by the sub-block's integer scale and summed in int32; the min / -32 term from the blocks' integer
//   sums of x_int (stored as three base-256 int8 digits each, combined by dp4a with the scale bytes); then one
//   fp32 combination per super-block, y += inv_b * (d * S - dmin * M), in super-block order within each k quarter
//   and the four quarters added in order. Nothing depends on t or on the GPU: row t of a t-row call is
//   bit-identical to a 1-row call.
// Accuracy: x_int keeps ~15 bits per 256-block against fp16's 11 per element; the weights enter exactly.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "act_pack.cuh"  // ActPack: launch_pack_act_imma_from_half

namespace openjet {

constexpr int kImmaMaxInt = 32639;  // 127 * 256 + 127: both digits of x_int fit int8
constexpr int kImmaMaxT = 8;        // token rows of one call (1 + drafts)

// The activations of an integer GEMV, for `rows` token rows of k (k a multiple of 256).
struct ActPackI {
    int8_t* dig;  // [rows][2][k]: x_int = 256 * dig[r][0][e] + dig[r][1][e]
    int8_t* s32;  // [rows][3][k / 32]: each 32-block's sum of x_int as base-256 int8 digits (low first)
    int8_t* s16;  // [rows][3][k / 16]: the same for 16-blocks (Q6_K's sub-blocks)
    float* inv;   // [rows][k / 256]
    int rows = 0;
};

// Bytes of a pack of `rows` rows of k.
inline long long act_pack_imma_bytes(int rows, int k) {
    return static_cast<long long>(rows) * (2LL * k + 3LL * (k / 32) + 3LL * (k / 16) + 4LL * (k / 256));
}

// x [t, k] float -> the pack (t <= p.rows).
cudaError_t launch_pack_act_imma(const float* x, int t, int k, const ActPackI& p, cudaStream_t stream);

// The same from the fp16 pack of the fp16 GEMV (act_pack.cuh) instead of floats: its values h = x s (exact in
// fp32) in place of x, each block's inv times the row's 1 / s. So an engine whose kernels write the fp16 pack can
// run this GEMV behind one more launch (engine.cu: OPENJET_GEMV_INT); x's fp16 rounding stays in the result.
cudaError_t launch_pack_act_imma_from_half(const ActPack& x, int t, int k, const ActPackI& p, cudaStream_t stream);

// The pack of `rows` rows of k laid out from base (act_pack_imma_bytes(rows, k) bytes, 16-byte aligned): the digits,
// the 16-block then the 32-block sums, inv; every part starts 16-byte aligned (each part's size but inv's is a
// multiple of 16 bytes for k a multiple of 256).
__host__ __device__ inline ActPackI act_pack_imma_view(void* base, int rows, int k) {
    auto* b = static_cast<int8_t*>(base);
    ActPackI p;
    p.dig = b;
    p.s16 = p.dig + 2LL * rows * k;
    p.s32 = p.s16 + 3LL * rows * (k / 16);
    p.inv = reinterpret_cast<float*>(p.s32 + 3LL * rows * (k / 32));
    p.rows = rows;
    return p;
}

// The integer twin of an fp16 pack (ActPack::imma, OPENJET_GEMV_INT=3): kImmaMaxT rows of k, every 256-block of a
// row under the row's one scale (act_quant_study.py's i16row: 8x closer to the reference than the fp16 pack by KL).
__host__ __device__ inline ActPackI act_pack_imma_of(const ActPack& p, int k) {
    return act_pack_imma_view(p.imma, kImmaMaxT, k);
}

#ifdef __CUDACC__
// The scale of a 256-block or row whose max |x| is amax: s = 32639 / amax, and inv = amax / 32639 (zeros: all 0).
struct ImmaScale {
    float s, inv;
};
__device__ __forceinline__ ImmaScale imma_scale(float amax) {
    if (!(amax > 0.0f)) return {0.0f, 0.0f};
    return {__fdiv_rn(static_cast<float>(kImmaMaxInt), amax), __fdiv_rn(amax, static_cast<float>(kImmaMaxInt))};
}

// Three base-256 signed digits of X (|X| <= 32 * 32639) at j of a sums array whose digit planes are `stride` apart:
// X = d0 + 256 d1 + 65536 d2, d0 and d1 in [-128, 127].
__device__ __forceinline__ void imma_store_sum(int8_t* base, int stride, int j, int x) {
    const int d0 = ((x + 128) & 255) - 128;
    x = (x - d0) >> 8;
    const int d1 = ((x + 128) & 255) - 128;
    base[j] = static_cast<int8_t>(d0);
    base[stride + j] = static_cast<int8_t>(d1);
    base[2 * stride + j] = static_cast<int8_t>((x - d1) >> 8);
}

// 32-block b of row `row` of an integer pack of k, by one warp (lane = element 32 b + lane, as act_pack.cuh's
// pack_block): x_int = rint(v s) held to the digits' range, its two digits, and the sums of its 16- and 32-blocks
// (exact integers: their order is free).
__device__ __forceinline__ void pack_block_imma(float v, float s, int b, int k, const ActPackI& p, int row) {
    const int lane = threadIdx.x & 31, e = b * 32 + lane;
    const int xi = max(-kImmaMaxInt, min(kImmaMaxInt, __float2int_rn(__fmul_rn(v, s))));
    const int hi = (xi + 128) >> 8;
    int8_t* dig = p.dig + static_cast<long long>(row) * 2 * k;
    dig[e] = static_cast<int8_t>(hi);
    dig[k + e] = static_cast<int8_t>(xi - 256 * hi);
    int s16 = xi;
#pragma unroll
    for (int o = 8; o >= 1; o >>= 1) s16 += __shfl_xor_sync(0xffffffffu, s16, o);
    const int s32 = s16 + __shfl_xor_sync(0xffffffffu, s16, 16);
    if ((lane & 15) == 0) imma_store_sum(p.s16 + static_cast<long long>(row) * 3 * (k / 16), k / 16, e / 16, s16);
    if (lane == 0) imma_store_sum(p.s32 + static_cast<long long>(row) * 3 * (k / 32), k / 32, b, s32);
}

// The row's inv in each of its 256-blocks (a row scale), by threads `first`, first + stride, ... of the caller's.
__device__ __forceinline__ void imma_store_row_inv(const ActPackI& p, int row, int k, float inv, int first,
                                                   int stride) {
    for (int i = first; i < k / 256; i += stride) p.inv[static_cast<long long>(row) * (k / 256) + i] = inv;
}
#endif

// Whether the integer GEMV reads this GGML type (Q4_K, Q5_K and Q6_K so far).
bool gemv_imma_supports(int qtype);

// y [t, n] = W x for k-quant W (GGUF blocks, rows 16-byte aligned, readable 16 bytes past the end), t <= 8.
// stages: cp.async depth per warp (2, 3, 4, 6; 0: the default); persistent: as many blocks as the GPU holds at once,
// each streaming several tiles (the same bits); tiled: W in the tile layout (weight_layout.cuh; n % 16 == 0), the
// same bits.
cudaError_t launch_gemv_imma(int qtype, const void* w, int n, int k, const ActPackI& x, int t, float* y,
                             cudaStream_t stream, int stages = 0, bool persistent = false, bool tiled = false);

// The same on the producer-warp GEMV's shape (gemv_tma.cuh: sm_90a, a 90a build; W in the tile layout, n % 16 == 0):
// each block's weights streamed by one producer thread's bulk copies, a grid of the blocks the GPU holds. The same
// bits as launch_gemv_imma. cudaErrorNotSupported where the producer-warp GEMV does not run.
cudaError_t launch_gemv_tma_imma(int qtype, const void* w, int n, int k, const ActPackI& x, int t, float* y,
                                 cudaStream_t stream);

}  // namespace openjet
