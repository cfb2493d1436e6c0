// The activations a GEMV reads (the B operand of its tensor-core tiles): per token row t of x [t, k]
//   s      = 2^e with e chosen so that max|x| * s lies in [2^14, 2^15) (fp16 cannot overflow; exact scaling)
//   h      = fp16(x * s), each aligned quad of elements stored in the order 0, 2, 1, 3 (so one 8-byte load
//            gives a thread its two mma B registers: see gemv_mma.cuh)
//   sum    = per 32-block j, S_j = the fp32 sum of its h values, as two fp16: hi = fp16(S_j / 32) and
//            lo = fp16(S_j / 32 - hi) (22 significant bits; / 32 keeps |S_j| <= 32 * 2^15 in fp16 range).
//            The Q4_K/Q5_K min term sum_j m_j S_j is one mma over them (gemv_mma.cuh). Per 256-element unit
//            the 16 halves are stored as 4 groups (hi_2q, hi_2q+1, lo_2q, lo_2q+1), q = 0..3: the B pair of
//            lane tq = q is one 8-byte load.
//   inv    = 1 / s, applied to each GEMV output
// fp16 keeps 11 significant bits per element: ~30x less rounding than int8 blocks of 32, which moved the
// logits far enough to flip 2-3% of the top-1 tokens of our synthetic models (issue 6 notes).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "rmsnorm.cuh"  // kRowThreads

namespace openjet {

constexpr int kActRows = 8;        // token columns of one mma (N): a GEMV reads a pack in groups of 8 rows
constexpr int kActMaxRows = 8192;  // rows a prefill pack may hold (OPENJET_ENGINE_PREFILL_ROWS_MAX)
constexpr int kActBlock = 32;      // elements per sum

struct ActPack {
    __half* h;    // [rows, k]
    __half* sum;  // [rows, k / 32 * 2]
    float* inv;   // [rows]
    int rows = kActRows;  // capacity (rows allocated)
    // The integer GEMV's pack of the same rows beside this one (gemv_imma.cuh's ActPackI under the row's scale,
    // act_pack_imma_of; OPENJET_GEMV_INT=3), or null. Where it is set, a pack's maker writes it too, or refuses
    // (act_pack_plain): no GEMV may read an integer pack older than the fp16 one.
    void* imma = nullptr;

    // The pack seen from row r0 on (a group of the prefill GEMM): same k, rows - r0 rows.
    __host__ __device__ ActPack from_row(int r0, int k) const {
        return ActPack{h + static_cast<long long>(r0) * k, sum + static_cast<long long>(r0) * (k / kActBlock) * 2,
                       inv + r0, rows - r0};
    }
};

// Where hi of 32-block b lies in its row of `sum` (lo: 2 halves further).
__host__ __device__ __forceinline__ int act_sum_pos(int b) { return (b >> 3) * 16 + ((b & 7) >> 1) * 4 + (b & 1); }

// Position of element i of its quad in storage: 0, 2, 1, 3.
__device__ __forceinline__ int act_quad_pos(int i) {
    const int r = i & 3;
    return (i & ~3) | (r == 1 ? 2 : r == 2 ? 1 : r);
}

// Threads of the kernels that pack a row (one block per row). At T = 1 a row is the whole launch on one SM,
// so its passes are latency-bound: 1024 threads take a 17,408-element row in 17 steps instead of 68. The
// bits do not depend on the count (a maximum; each 32-block summed by one warp; row_rms_scale's fixed order).
constexpr int kPackThreads = 1024;

// Elements per thread a pack kernel keeps in registers between its passes: rows up to 20,480 (every row the
// 27B packs: 17,408 at most) read their inputs once, all loads in flight together; longer rows compute each
// value twice. Measured per launch on the H200 before (ncu, cold L2): swiglu_pack 19 us, add_norm_pack 8 us.
constexpr int kPackCached = 20;

// A 32-block's stored sum from the fp32 sum S of its fp16 values: hi = fp16(S / 32) and lo = fp16(S / 32 - hi) at
// act_sum_pos(b) (S / 32 exact), into sum and, where given, copy. Every maker of a pack writes its sums here.
__device__ __forceinline__ void act_store_sum(float S, int b, __half* sum, __half* copy = nullptr) {
    const float t32 = __fmul_rn(S, 1.0f / 32.0f);  // exact
    const __half hi = __float2half_rn(t32);
    const __half lo = __float2half_rn(__fsub_rn(t32, __half2float(hi)));
    sum[act_sum_pos(b)] = hi;
    sum[act_sum_pos(b) + 2] = lo;
    if (copy) copy[act_sum_pos(b)] = hi, copy[act_sum_pos(b) + 2] = lo;
}

// The pack's second pass over one row: the 32-block values v (v[j] = value of element threadIdx.x + j
// kPackThreads: block warp + 32 j, lane) scaled by s, stored, summed.
__device__ __forceinline__ void pack_block(float v, float s, int b, __half* h, __half* sum) {
    const int lane = threadIdx.x & 31;
    const int i = b * kActBlock + lane;
    const __half hv = __float2half_rn(__fmul_rn(v, s));
    h[act_quad_pos(i)] = hv;
    float t = __half2float(hv);
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    if (lane == 0) act_store_sum(t, b, sum);
}

// pack_block for four 32-blocks b[q] of one warp at once (v[q]: lane = element of block b[q]; blocks b[q] >= nb are
// skipped whole, warp-uniformly): the same fp16 values and the same sum tree (lane pairs 16, 8, 4, 2, 1 apart, each
// sum's operands those of pack_block's butterfly; IEEE addition commutes, so every lane of a butterfly ends with the
// bits lane 0 writes there) with 6 shuffles and 6 adds instead of 20 and 20: at the first two levels each lane sends
// the values it drops (lanes 0-15 keep blocks 0 and 1, 16-31 blocks 2 and 3; then bit 3 picks one), the last three
// run on one value in groups of 8 lanes, and block q's sum lands in lanes 8q .. 8q + 7 (lane 8q writes it).
__device__ __forceinline__ void pack_blocks4(const float (&v)[4], float s, const int (&b)[4], int nb, __half* h,
                                             __half* sum) {
    const int lane = threadIdx.x & 31;
    float t[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const __half hv = __float2half_rn(__fmul_rn(v[q], s));
        if (b[q] < nb) h[act_quad_pos(b[q] * kActBlock + lane)] = hv;
        t[q] = __half2float(hv);
    }
    const bool upper = lane & 16, odd = lane & 8;
    float keep0 = upper ? t[2] : t[0], keep1 = upper ? t[3] : t[1];
    const float send0 = upper ? t[0] : t[2], send1 = upper ? t[1] : t[3];
    keep0 += __shfl_xor_sync(0xffffffffu, send0, 16);
    keep1 += __shfl_xor_sync(0xffffffffu, send1, 16);
    float x = odd ? keep1 : keep0;
    x += __shfl_xor_sync(0xffffffffu, odd ? keep0 : keep1, 8);
#pragma unroll
    for (int o = 4; o >= 1; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    const int q = lane >> 3;
    if ((lane & 7) == 0 && b[q] < nb) act_store_sum(x, b[q], sum);
}

// The pack's power-of-two row scale s = 2^shift for the row's max |x|: amax * s in [2^14, 2^15).
__device__ __forceinline__ int act_pack_shift(float amax) {
    int e = 0;
    frexpf(amax, &e);  // amax in [2^(e-1), 2^e)
    return amax > 0.0f ? min(100, max(-100, 15 - e)) : 0;
}

// The largest of the block's threads' m (each >= 0: a max |x|), in every thread of a block of kThreads; its shared
// memory free again when it returns. Exact in any order: the same value however the threads split the row.
template <int kThreads> __device__ __forceinline__ float block_amax(float m) {
    __shared__ float part[kThreads / 32];
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = m;
    __syncthreads();
    float amax = 0.0f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) amax = fmaxf(amax, part[w]);
    __syncthreads();  // part may be written again
    return amax;
}

// Where row `row` of a pack of k-element rows goes and its scale s (a power of two) with inv = 1 / s (p.inv[row],
// written once the row is packed).
struct ActRow {
    __half* h;
    __half* sum;
    float s, inv;
};
__device__ __forceinline__ ActRow act_row_at(const ActPack& p, int row, int k, float s, float inv) {
    return {p.h + static_cast<long long>(row) * k, p.sum + static_cast<long long>(row) * (k / kActBlock) * 2, s, inv};
}
// The row's scale for its max |x| (act_pack_shift): s = 2^shift.
__device__ __forceinline__ ActRow act_row(const ActPack& p, int row, int k, float amax) {
    const int sh = act_pack_shift(amax);
    return act_row_at(p, row, k, ldexpf(1.0f, sh), ldexpf(1.0f, -sh));
}
// The row under a scale given by a bound (row_bound.cuh), not its maximum.
__device__ __forceinline__ ActRow act_row_scaled(const ActPack& p, int row, int k, float s) {
    return act_row_at(p, row, k, s, __frcp_rn(s));
}

// Packs row `row` of the pack from value(i), i in [0, k) (pure: a long row calls it twice per element), by
// the whole block of kThreads threads (kPackThreads, or fewer in a persistent kernel: ffn_persistent.cu), each
// keeping up to kCached values in registers (rows longer than kCached * kThreads compute each value twice);
// copy (optional): value(i) also written there as float. Sums and maxima run in a fixed order (the max is exact
// in any order, each 32-block is summed by one warp in lane order): the bits depend on the row alone, cached or
// not, whatever kThreads.
template <int kThreads = kPackThreads, int kCached = kPackCached, class Value>
__device__ __forceinline__ void pack_act_row(const Value& value, int k, const ActPack& p, int row,
                                             float* copy = nullptr) {
    static_assert(kThreads % 32 == 0 && kThreads >= 256 && kThreads <= kPackThreads, "whole warps, >= row_rms's");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool cached = k <= kCached * kThreads;
    float v[kCached];
    float m = 0.0f;
    if (cached) {
#pragma unroll
        for (int j = 0; j < kCached; ++j) {
            const int i = threadIdx.x + j * kThreads;
            v[j] = i < k ? value(i) : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < kCached; ++j) {
            m = fmaxf(m, fabsf(v[j]));
            const int i = threadIdx.x + j * kThreads;
            if (copy && i < k) copy[i] = v[j];
        }
    } else {
        for (int i = threadIdx.x; i < k; i += kThreads) {
            const float x = value(i);
            m = fmaxf(m, fabsf(x));
            if (copy) copy[i] = x;
        }
    }
    const ActRow r = act_row(p, row, k, block_amax<kThreads>(m));
    const int nb = k / kActBlock;
    if (cached) {
        // v[j]: element threadIdx.x + j kThreads, in 32-block warp + (kThreads / 32) j; four blocks at a time
        constexpr int kFours = kCached / 4 * 4;
#pragma unroll
        for (int j = 0; j < kFours; j += 4) {
            if (warp + kThreads / 32 * j >= nb) break;  // warp-uniform: the blocks ahead are past the row too
            const float v4[4] = {v[j], v[j + 1], v[j + 2], v[j + 3]};
            int b4[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) b4[q] = warp + kThreads / 32 * (j + q);
            pack_blocks4(v4, r.s, b4, nb, r.h, r.sum);
        }
#pragma unroll
        for (int j = kFours; j < kCached; ++j)
            if (warp + kThreads / 32 * j < nb)
                pack_block(v[j], r.s, warp + kThreads / 32 * j, r.h, r.sum);  // whole warps: k % 32 == 0
    } else {
        for (int b = warp; b < nb; b += kThreads / 32) pack_block(value(b * kActBlock + lane), r.s, b, r.h, r.sum);
    }
    if (threadIdx.x == 0) p.inv[row] = r.inv;
}

// Elements per unit of the sums' layout (act_sum_pos: 16 halves per 256 elements): a row of k % kActUnit != 0 would
// write its last sums into the next row's (found 2026-12-03: two rows' blocks raced there). Every GEMV reading a
// pack has k a multiple of it (gemv.cuh, kGemvUnit).
constexpr int kActUnit = 256;

// Whether a pack has no integer twin (ActPack::imma): what a maker that writes only the fp16 pack checks first.
inline bool act_pack_plain(const ActPack& p) { return p.imma == nullptr; }

// Whether a pack can hold t rows of k (every launcher that writes one checks this).
inline bool act_pack_fits(const ActPack& p, int t, int k) {
    return p.h && p.sum && p.inv && t >= 1 && t <= p.rows && p.rows <= kActMaxRows && k >= kActUnit &&
           k % kActUnit == 0;
}

// Threads a row for the pack kernels of a prefill call's rows (more than a decode step's OPENJET_ENGINE_MAX_T). At
// decode's kPackThreads a block holds 40-48 registers a thread, so one block, one row, per SM at a time: the passes'
// barriers and each row's ramp and tail unhidden (the 27B's 2,048-row add-norm ~120 us, ~2x its bytes' time, 15.4
// ms of a chunk's 129 calls). Smaller blocks put several rows on an SM, with the same bits (the counts do not
// change them: pack_act_row, row_rms_scale). OPENJET_ROW_PACK_THREADS (read at each call; CudaEngine.load refuses
// other values): unset or auto: what measured fastest per kernel on the H200 (add-norm and pack 256, swiglu 512: a
// row of 17,408 held in registers at 60 a thread; the 27B's prefill at 32,768 tokens 5,938 -> 6,101 tok/s at
// 5693a91); 256, 512 or 1024: every kernel at that count.
enum class RowPack { kAddNorm, kSwiglu, kPack };
int row_pack_threads(RowPack kernel);

// Packs x [t, k] (norm_w != nullptr: rmsnorm(x) * norm_w first). t <= p.rows, k % kActUnit == 0.
cudaError_t launch_pack_act(const float* x, int t, int k, const float* norm_w, float eps, const ActPack& p,
                            cudaStream_t stream);

}  // namespace openjet
