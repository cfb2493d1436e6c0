// Decode GEMV on GGUF k-quant weights: y[t, n] = sum_k W[n, k] * x[t, k] for T <= 8 token rows sharing
// one read of W. W stays in its GGUF blocks; x arrives quantised to int8 blocks of 32 (quantize_act.cuh),
// so the inner products are dp4a on integers with fp32 scales applied per 16/32-element group.
//
// Design (one warp = R weight rows over the whole K; no inter-warp reduction):
//   * Each warp iteration covers kBlocksPerIter weight blocks of each of its R rows (1024 weights per
//     row: 4 super-blocks of 256, or 32 Q8_0 blocks). Those row spans are copied global -> shared with
//     16-byte cp.async (L1 bypassed), kStages deep, so the next spans stream in while this one is used.
//     Q6_K (210 B) and Q8_0 (34 B) blocks are not 16-byte aligned: a span is copied from its 16-byte
//     floor, and lanes read their bytes back with funnel shifts.
//   * Lane = (block in span, chunk): a chunk is 32 weights, two groups of 16 with their own activation
//     pieces A and B (16 int8 each). The lane decodes its chunk of each of the R rows once, then for each
//     token row t loads the two activation pieces (L1-cached: every warp of the SM reads the same x) and
//     runs 8 dp4a per weight row. Weight decode is shared by all T; activations are shared by all R.
//   * Lanes sum their chunks in K order, then the warp sums its lanes with a fixed xor butterfly.
//     Nothing in a row's arithmetic depends on T or R, and the fp32 steps are pinned (__fmaf_rn,
//     __fmul_rn) so the compiler cannot contract them differently per instantiation: row t of a T-row
//     call is bit-identical to a 1-row call on the same x row (speculative decoding relies on it).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kquant.cuh"

namespace openjet {

constexpr int kGemvMaxT = 8;           // token rows per call (1 + drafts)
constexpr int kGemvMaxWarpsPerBlock = 4;
// Register cap through min blocks per SM: 3 (<= 168 registers, >= 12 warps per SM keep enough copies in
// flight), 2 for the largest tile (T = 8, R = 4), which would spill a word under 168.
constexpr int gemv_min_blocks_per_sm(int t, int r) { return t * r >= 32 ? 2 : 3; }

// Arguments of one GEMV launch. w: n rows of row_bytes (16-byte aligned base; readable up to the next
// 16-byte boundary past its end, as cudaMalloc'ed memory is). xq/xds: quantised activations of t rows.
struct GemvArgs {
    int qtype;
    const void* w;
    int n, k, t;
    const int8_t* xq;   // [t, k]
    const float2* xds;  // [t, k/32]
    const float* xf;    // [t, k] float activations (F32 weights only)
    float* y;           // [t, n]
};

// One chunk of 32 decoded weights of one row: q[0..3] meet activation piece A, q[4..7] piece B.
struct Chunk {
    int q[8];
    int sc_a, sc_b;  // integer scales of groups A and B (K-quants)
    float d;         // block scale
    float dm;        // dmin * m of the sub-block whose min this lane subtracts (Q4_K/Q5_K), else 0
};

template <int QT> struct ChunkMap {
    static constexpr int kChunks = Block<QT>::kElems == 256 ? 8 : 1;  // lanes per weight block
};

// Where chunk c's activation pieces lie: 32-blocks a, b (relative to the weight block) at byte offsets
// oa, ob; min_b: the sub-block whose min term this lane adds is b's (else a's).
template <int QT>
__device__ __forceinline__ void chunk_pieces(int c, int& a, int& oa, int& b, int& ob, bool& min_b) {
    if constexpr (QT == kQ4_K || QT == kQ5_K) {  // c = (j, h): qs bytes 32j+16h.. = sub-blocks 2j (lo), 2j+1 (hi)
        const int j = c >> 1, h = c & 1;
        a = 2 * j; b = 2 * j + 1; oa = ob = 16 * h; min_b = h;
    } else if constexpr (QT == kQ6_K) {  // c = (h, k', u): elements 128h + 32k + 16u + i, k = k' and k'+2
        const int h = c >> 2, kp = (c >> 1) & 1, u = c & 1;
        a = 4 * h + kp; b = a + 2; oa = ob = 16 * u; min_b = false;
    } else {  // Q8_0: the whole block, halves A and B
        a = b = 0; oa = 0; ob = 16; min_b = false;
    }
}

// Decodes chunk c of the weight block at p (shared memory; 16-byte aligned for Q4_K/Q5_K, 2-byte else).
template <int QT>
__device__ __forceinline__ void decode_chunk(const uint8_t* p, int c, Chunk& w) {
    if constexpr (QT == kQ4_K || QT == kQ5_K) {
        const int j = c >> 1, h = c & 1;
        int ma, mb;
        k4_scale_min(p + 4, 2 * j, w.sc_a, ma);
        k4_scale_min(p + 4, 2 * j + 1, w.sc_b, mb);
        w.d = f16_at(p);
        w.dm = __fmul_rn(f16_at(p + 2), static_cast<float>(h ? mb : ma));
        constexpr int kQs = QT == kQ4_K ? 16 : 48;
        const uint4 qs = *reinterpret_cast<const uint4*>(p + kQs + 32 * j + 16 * h);
        const int qv[4] = {static_cast<int>(qs.x), static_cast<int>(qs.y), static_cast<int>(qs.z),
                           static_cast<int>(qs.w)};
        if constexpr (QT == kQ4_K) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                w.q[i] = qv[i] & 0x0F0F0F0F;
                w.q[4 + i] = (qv[i] >> 4) & 0x0F0F0F0F;
            }
        } else {  // qh[16h + i] bit 2j is bit 4 of the low-nibble element, bit 2j+1 of the high one
            const uint4 qh = *reinterpret_cast<const uint4*>(p + 16 + 16 * h);
            const int hv[4] = {static_cast<int>(qh.x), static_cast<int>(qh.y), static_cast<int>(qh.z),
                               static_cast<int>(qh.w)};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                w.q[i] = (qv[i] & 0x0F0F0F0F) | (((hv[i] >> (2 * j)) & 0x01010101) << 4);
                w.q[4 + i] = ((qv[i] >> 4) & 0x0F0F0F0F) | (((hv[i] >> (2 * j + 1)) & 0x01010101) << 4);
            }
        }
    } else if constexpr (QT == kQ6_K) {
        const int h = c >> 2, kp = (c >> 1) & 1, u = c & 1;
        int ql[4], qh[4];
        lds_4x_u32_at(p, 64 * h + 32 * kp + 16 * u, ql);
        lds_4x_u32_at(p, 128 + 32 * h + 16 * u, qh);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w.q[i] = sub32_bytes((ql[i] & 0x0F0F0F0F) | (((qh[i] >> (2 * kp)) & 0x03030303) << 4));
            w.q[4 + i] = sub32_bytes(((ql[i] >> 4) & 0x0F0F0F0F) | (((qh[i] >> (2 * kp + 4)) & 0x03030303) << 4));
        }
        const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192);
        w.sc_a = sc[8 * h + 2 * kp + u];
        w.sc_b = sc[8 * h + 2 * kp + 4 + u];
        w.d = f16_at(p + 208);
        w.dm = 0.0f;
    } else {  // Q8_0
        lds_4x_u32_at(p, 2, w.q);
        lds_4x_u32_at(p, 18, w.q + 4);
        w.d = f16_at(p);
        w.sc_a = w.sc_b = 1;
        w.dm = 0.0f;
    }
}

__device__ __forceinline__ int dot16(const int* q, const int4 x) {
    return __dp4a(q[3], x.w, __dp4a(q[2], x.z, __dp4a(q[1], x.y, __dp4a(q[0], x.x, 0))));
}

// acc + this chunk's share of sum_k W[n,k] x[t,k]:
//   K-quants: d * (dA * (dotA * scA) + dB * (dotB * scB)) - dmin*m * d*sum(q) of the min's sub-block
//   Q8_0:     (d * dx) * (dotA + dotB)
template <int QT>
__device__ __forceinline__ float chunk_dot(const Chunk& w, int4 xa, int4 xb, float2 dsa, float2 dsb,
                                           bool min_b, float acc) {
    const int da = dot16(w.q, xa), db = dot16(w.q + 4, xb);
    if constexpr (QT == kQ8_0) {
        return __fmaf_rn(__fmul_rn(w.d, dsa.x), static_cast<float>(da + db), acc);
    } else {
        float s = __fmul_rn(dsa.x, static_cast<float>(da * w.sc_a));
        s = __fmaf_rn(dsb.x, static_cast<float>(db * w.sc_b), s);
        acc = __fmaf_rn(w.d, s, acc);
        if constexpr (QT == kQ4_K || QT == kQ5_K) acc = __fmaf_rn(-w.dm, min_b ? dsb.y : dsa.y, acc);
        return acc;
    }
}

// Compile-time shape of a warp's work for weight type QT and R rows per warp.
template <int QT, int R> struct GemvShape {
    static constexpr int kChunks = ChunkMap<QT>::kChunks;
    static constexpr int kBlocksPerIter = 32 / kChunks;                      // weight blocks per row per iteration
    static constexpr int kSpan = kBlocksPerIter * Block<QT>::kBytes;         // row bytes per iteration
    static constexpr bool kAligned = Block<QT>::kBytes % 16 == 0;             // spans start 16-byte aligned
    static constexpr int kWordsPerRow = kAligned ? kSpan / 16 : (kSpan + 14 + 15) / 16;  // + misalignment
    static constexpr int kStageWords = R * kWordsPerRow;                      // 16-byte words per stage
    static constexpr int kLoadsPerLane = (kStageWords + 31) / 32;
    static constexpr int kStages = 3;
    static constexpr int kWarpSmemBytes = kStages * kStageWords * 16;
};

__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem_src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// The warp's part of one GEMV: rows [row0, row0 + R) of W, all T token rows. smem: this warp's
// kWarpSmemBytes. Exposed as a device function so a persistent kernel can call it per work item.
template <int QT, int T, int R>
__device__ __forceinline__ void gemv_warp(const uint8_t* __restrict__ w, long long row_bytes, int n, int nblk,
                                          const int8_t* __restrict__ xq, const float2* __restrict__ xds, int k,
                                          float* __restrict__ y, int row0, uint4* smem) {
    using S = GemvShape<QT, R>;
    constexpr int kSub = Block<QT>::kElems / kQ8Block;  // activation 32-blocks per weight block
    const int lane = threadIdx.x & 31;
    const int n_it = (nblk + S::kBlocksPerIter - 1) / S::kBlocksPerIter;

    // Copies iteration it's row spans into stage it % kStages (an empty group past the end).
    auto issue = [&](int it) {
        if (it < n_it) {
            const int span = min(S::kBlocksPerIter, nblk - it * S::kBlocksPerIter) * Block<QT>::kBytes;
            uint4* dst = smem + (it % S::kStages) * S::kStageWords;
#pragma unroll
            for (int i = 0; i < S::kLoadsPerLane; ++i) {
                const int wi_all = lane + 32 * i;
                const int r = wi_all / S::kWordsPerRow, wi = wi_all - r * S::kWordsPerRow;
                if (wi_all < S::kStageWords && row0 + r < n) {
                    const uintptr_t a = reinterpret_cast<uintptr_t>(w) +
                                        static_cast<uintptr_t>((row0 + r) * row_bytes + (long long)it * S::kSpan);
                    if (wi * 16 < static_cast<int>(a & 15) + span)
                        cp_async16(dst + wi_all, reinterpret_cast<const void*>((a & ~uintptr_t(15)) + 16 * wi));
                }
            }
        }
        cp_async_commit();
    };

#pragma unroll
    for (int s = 0; s < S::kStages - 1; ++s) issue(s);

    int row_off0[R];  // byte misalignment of each row's start (0 for 16-byte blocks)
#pragma unroll
    for (int r = 0; r < R; ++r)
        row_off0[r] = S::kAligned ? 0 : static_cast<int>((reinterpret_cast<uintptr_t>(w) + (row0 + r) * row_bytes) & 15);

    const int c = lane % S::kChunks, blk_in_iter = lane / S::kChunks;
    int pa, oa, pb, ob;
    bool min_b;
    chunk_pieces<QT>(c, pa, oa, pb, ob, min_b);

    float acc[R][T];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;

    const int kb = k / kQ8Block;
    for (int it = 0; it < n_it; ++it) {
        cp_async_wait<S::kStages - 2>();
        __syncwarp();
        issue(it + S::kStages - 1);
        const int blk = it * S::kBlocksPerIter + blk_in_iter;  // weight block of this lane, within a row
        if (blk < nblk) {
            const uint8_t* st = reinterpret_cast<const uint8_t*>(smem + (it % S::kStages) * S::kStageWords);
            Chunk ch[R];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const int off = S::kAligned ? 0 : ((row_off0[r] + it * S::kSpan) & 15);
                decode_chunk<QT>(st + r * S::kWordsPerRow * 16 + off + blk_in_iter * Block<QT>::kBytes, c, ch[r]);
            }
            const int ga = blk * kSub + pa, gb = blk * kSub + pb;
#pragma unroll
            for (int t = 0; t < T; ++t) {
                const int4 xa = __ldg(reinterpret_cast<const int4*>(xq + (long long)t * k + ga * kQ8Block + oa));
                const int4 xb = __ldg(reinterpret_cast<const int4*>(xq + (long long)t * k + gb * kQ8Block + ob));
                const float2 dsa = __ldg(xds + t * kb + ga);
                const float2 dsb = __ldg(xds + t * kb + gb);
#pragma unroll
                for (int r = 0; r < R; ++r) acc[r][t] = chunk_dot<QT>(ch[r], xa, xb, dsa, dsb, min_b, acc[r][t]);
            }
        }
    }
    cp_async_wait<0>();  // no copy may land in shared memory after the warp has moved on

#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < T; ++t) {
            float v = acc[r][t];
#pragma unroll
            for (int m = 16; m >= 1; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
            if (lane == (r * T + t) % 32 && row0 + r < n) y[(long long)t * n + row0 + r] = v;
        }
}

template <int QT, int T, int R>
__global__ void __launch_bounds__(kGemvMaxWarpsPerBlock * 32, gemv_min_blocks_per_sm(T, R))
gemv_kquant_kernel(const uint8_t* __restrict__ w, long long row_bytes, int n, int nblk,
                   const int8_t* __restrict__ xq, const float2* __restrict__ xds, int k, float* __restrict__ y) {
    extern __shared__ uint4 gemv_smem[];
    using S = GemvShape<QT, R>;
    const int warp = threadIdx.x >> 5;
    const int row0 = (blockIdx.x * (blockDim.x >> 5) + warp) * R;
    if (row0 >= n) return;  // warps are independent: no block barrier below
    gemv_warp<QT, T, R>(w, row_bytes, n, nblk, xq, xds, k, y, row0, gemv_smem + warp * (S::kWarpSmemBytes / 16));
}

// Host: launches y = W x for a k-quant or F32 W (args.qtype a GGML type id). Returns cudaErrorInvalidValue
// for shapes or types it does not take, else the launch's error.
cudaError_t launch_gemv(const GemvArgs& args, cudaStream_t stream);

// The launch shape launch_gemv picks (rows per warp, warps per block, blocks), for benchmarks' reports.
cudaError_t gemv_launch_shape(int qtype, int n, int k, int t, int* rows_per_warp, int* warps_per_block,
                              int* blocks);

// Per-type launchers (one translation unit each, compiled in parallel): gemv_kquant_<type>.cu.
template <int QT> cudaError_t launch_gemv_type(const GemvArgs& args, int rows_per_warp, int warps_per_block,
                                               cudaStream_t stream);
template <> cudaError_t launch_gemv_type<kQ4_K>(const GemvArgs&, int, int, cudaStream_t);
template <> cudaError_t launch_gemv_type<kQ5_K>(const GemvArgs&, int, int, cudaStream_t);
template <> cudaError_t launch_gemv_type<kQ6_K>(const GemvArgs&, int, int, cudaStream_t);
template <> cudaError_t launch_gemv_type<kQ8_0>(const GemvArgs&, int, int, cudaStream_t);

template <int QT, int R> int gemv_smem_bytes(int warps_per_block) {
    return warps_per_block * GemvShape<QT, R>::kWarpSmemBytes + 16;  // +16: funnel reads one word past a span
}

}  // namespace openjet
