// The integer GEMV's arithmetic on one unit (gemv_imma.cuh has the numerics): the integer mma, the Q4_K, Q5_K and Q6_K units
// from their rows in shared memory, as gemv_imma.cu's kernels (the cp.async and the producer-warp forms) run them.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "gemv_imma.cuh"
#include "gemv_mma.cuh"  // RowWords, f16_at
#include "kquant.cuh"

namespace openjet {

// ------------------------------------------------------------------------------------------ arithmetic

// c = A (16 x 32 u8) B (32 x 8 s8), exactly.
__device__ __forceinline__ void imma_k32(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %10, %10, %10};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}
// c = A (16 x 16 u8) B (16 x 8 s8), exactly.
__device__ __forceinline__ void imma_k16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}
// c + the dot product of a's four bytes (unsigned) with b's (signed).
__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ int dp4a_ss(uint32_t a, uint32_t b, int c) {
    int d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
// acc += the mma's C under the sub-block scales of rows g (s0: C's first two) and g + 8 (s1: its last two).
__device__ __forceinline__ void imma_scaled_add(int (&acc)[4], const int (&c)[4], int s0, int s1) {
    acc[0] += s0 * c[0];
    acc[1] += s0 * c[1];
    acc[2] += s1 * c[2];
    acc[3] += s1 * c[3];
}
__device__ __forceinline__ int byte_u(uint32_t w, int i) { return static_cast<int>((w >> (8 * i)) & 0xFFu); }
__device__ __forceinline__ int byte_s(uint32_t w, int i) { return static_cast<int>(static_cast<int8_t>(w >> (8 * i))); }

// Token tok's block sums of unit u as V (uint2: the 8 32-block sums, uint4: the 16 16-block sums), one per base-256
// digit, and its inv.
template <class V>
__device__ __forceinline__ float unit_sums(const int8_t* plane, int per_row, const ActPackI& p, int tok, int u, int k,
                                           V (&xs)[3]) {
#pragma unroll
    for (int dg = 0; dg < 3; ++dg)
        xs[dg] = __ldg(reinterpret_cast<const V*>(plane + (static_cast<long long>(tok) * 3 + dg) * per_row) + u);
    return __ldg(p.inv + static_cast<long long>(tok) * (k / 256) + u);
}

// What a warp's units read besides the weights: its B columns (set s: tokens 4 s .. 4 s + 3; column g is digit
// g & 1 of token 4 s + g / 2, clamped to t - 1) and the tokens its C columns belong to (4 s + tq, clamped).
template <int NS> struct ImmaX {
    const int8_t* col[NS];  // the column's digit row at the warp's current unit
    int tok[NS];            // the lane's result token (for the block sums and inv)
};

// ------------------------------------------------------------------------------------------ Q4_K, Q5_K

// One super-block of rows g and g + 8 (r[0], r[1] in shared memory) into y[s][i] (set s, row g + 8 i). Q4_K: the
// codes are the nibbles, the high one read in place (16 q: its sums and the low one's x 16 meet as 16 S, d / 16 undoes
// it); Q5_K: each code is its nibble and its fifth bit (qh[l] bit j of element l of sub-block j) as a byte <= 31.
template <int QT, int NS>
__device__ __forceinline__ void unit_imma_k4(const uint8_t* const r[2], const ImmaX<NS>& x, const ActPackI& p, int u,
                                             int k, int tq, float (&y)[NS][2]) {
    static_assert(QT == kQ4_K || QT == kQ5_K, "the 4-bit k-quants");
    constexpr bool kQ5 = QT == kQ5_K;
    constexpr int kQs = kQ5 ? 48 : 16;  // the codes' offset in the block (Q5_K: after its 32 qh bytes)
    uint32_t sc[2][2], mn[2][2];
    float dq[2], dmin[2];
    uint2 qh[2];  // Q5_K: the fifth bits of elements 8 tq .. 8 tq + 7 of every sub-block
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const uint4 hd = *reinterpret_cast<const uint4*>(r[i]);
        const float2 dd = __half22float2(*reinterpret_cast<const __half2*>(&hd.x));
        dq[i] = kQ5 ? dd.x : __fmul_rn(dd.x, 0.0625f);  // (Q4_K: the nibble sums are kept x 16, below)
        dmin[i] = dd.y;
        sc[i][0] = hd.y & 0x3F3F3F3Fu;
        mn[i][0] = hd.z & 0x3F3F3F3Fu;
        sc[i][1] = (hd.w & 0x0F0F0F0Fu) | ((hd.y >> 2) & 0x30303030u);
        mn[i][1] = ((hd.w >> 4) & 0x0F0F0F0Fu) | ((hd.z >> 2) & 0x30303030u);
        if constexpr (kQ5) qh[i] = *reinterpret_cast<const uint2*>(r[i] + 16 + 8 * tq);
    }
    // acc[s][nb][c]: sum over sub-blocks 2 c' + nb of sc * (codes . digits)
    int acc[NS][2][4] = {};
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        uint2 q[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) q[i] = *reinterpret_cast<const uint2*>(r[i] + kQs + 32 * c + 8 * tq);
#pragma unroll
        for (int nb = 0; nb < 2; ++nb) {
            const int j = 2 * c + nb;
            uint32_t a[4];
            if constexpr (kQ5) {
                const auto code = [&](uint32_t w, uint32_t h) {
                    return ((nb ? w >> 4 : w) & 0x0F0F0F0Fu) | (((h >> j) & 0x01010101u) << 4);
                };
                a[0] = code(q[0].x, qh[0].x), a[1] = code(q[1].x, qh[1].x);
                a[2] = code(q[0].y, qh[0].y), a[3] = code(q[1].y, qh[1].y);
            } else {
                const uint32_t mask = nb ? 0xF0F0F0F0u : 0x0F0F0F0Fu;
                a[0] = q[0].x & mask, a[1] = q[1].x & mask, a[2] = q[0].y & mask, a[3] = q[1].y & mask;
            }
            const int s0 = byte_u(sc[0][j >> 2], j & 3), s1 = byte_u(sc[1][j >> 2], j & 3);
#pragma unroll
            for (int s = 0; s < NS; ++s) {
                const uint2 b = __ldg(reinterpret_cast<const uint2*>(x.col[s] + 32 * j + 8 * tq));
                int cc[4];
                imma_k32(cc, a, b.x, b.y);
                imma_scaled_add(acc[s][nb], cc, s0, s1);
            }
        }
    }
    constexpr int kLow = kQ5 ? 1 : 16;  // the low nibble's sums against the high one's
#pragma unroll
    for (int s = 0; s < NS; ++s) {
        uint2 xs[3];
        const float inv = unit_sums(p.s32, k / 32, p, x.tok[s], u, k, xs);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            int m = 0;  // sum_j m_j X_j, digit by digit from the top
#pragma unroll
            for (int dg = 2; dg >= 0; --dg) m = 256 * m + dp4a_us(mn[i][0], xs[dg].x, dp4a_us(mn[i][1], xs[dg].y, 0));
            const int hi = kLow * acc[s][0][2 * i] + acc[s][1][2 * i];
            const int lo = kLow * acc[s][0][2 * i + 1] + acc[s][1][2 * i + 1];
            const float sum = __fmaf_rn(256.0f, static_cast<float>(hi), static_cast<float>(lo));
            y[s][i] = __fmaf_rn(inv, __fmaf_rn(-dmin[i], static_cast<float>(m), __fmul_rn(dq[i], sum)), y[s][i]);
        }
    }
}

// ------------------------------------------------------------------------------------------ Q6_K

// Element 128 hh + 32 qd + l (l = 16 lh + 4 tq + 0..3): low 4 bits in ql[64 hh + 32 (qd & 1) + l] (nibble qd / 2),
// high 2 bits in qh[32 hh + l] (bits 2 qd), sub-block 8 hh + 2 qd + lh. Units start 2-byte aligned (RowWords).
template <bool kAligned4, int NS>
__device__ __forceinline__ void unit_imma_q6_k(const uint8_t* const r[2], const ImmaX<NS>& x, const ActPackI& p,
                                               int u, int k, int tq, float (&y)[NS][2]) {
    const RowWords<kAligned4> rw[2] = {RowWords<kAligned4>(r[0]), RowWords<kAligned4>(r[1])};
    float d[2];
    uint32_t scw[2][4];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        d[i] = f16_at(r[i] + 208);
#pragma unroll
        for (int j = 0; j < 4; ++j) scw[i][j] = rw[i][48 + j];
    }
    int acc[NS][4] = {};
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
        for (int lh = 0; lh < 2; ++lh) {
            uint32_t ql[2][2], qh[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int l4 = 4 * lh + tq;
                ql[i][0] = rw[i][16 * hh + l4];
                ql[i][1] = rw[i][16 * hh + 8 + l4];
                qh[i] = rw[i][32 + 8 * hh + l4];
            }
#pragma unroll
            for (int qd = 0; qd < 4; ++qd) {
                uint32_t a[2];
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    const uint32_t w = qd < 2 ? ql[i][qd & 1] : ql[i][qd & 1] >> 4;
                    a[i] = (w & 0x0F0F0F0Fu) | (((qh[i] >> (2 * qd)) << 4) & 0x30303030u);
                }
                const int sb = 8 * hh + 2 * qd + lh;
                const int s0 = byte_s(scw[0][sb >> 2], sb & 3), s1 = byte_s(scw[1][sb >> 2], sb & 3);
#pragma unroll
                for (int s = 0; s < NS; ++s) {
                    const uint32_t b = __ldg(reinterpret_cast<const uint32_t*>(x.col[s] + 16 * sb + 4 * tq));
                    int cc[4];
                    imma_k16(cc, a[0], a[1], b);
                    imma_scaled_add(acc[s], cc, s0, s1);
                }
            }
        }
    }
#pragma unroll
    for (int s = 0; s < NS; ++s) {
        uint4 xs[3];
        const float inv = unit_sums(p.s16, k / 16, p, x.tok[s], u, k, xs);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            int o = 0;  // sum_s sc_s X16_s (the -32 of every code), digit by digit from the top
#pragma unroll
            for (int dg = 2; dg >= 0; --dg)
                o = 256 * o + dp4a_ss(scw[i][0], xs[dg].x, dp4a_ss(scw[i][1], xs[dg].y,
                                      dp4a_ss(scw[i][2], xs[dg].z, dp4a_ss(scw[i][3], xs[dg].w, 0))));
            const float sum = __fmaf_rn(-32.0f, static_cast<float>(o),
                                        __fmaf_rn(256.0f, static_cast<float>(acc[s][2 * i]),
                                                  static_cast<float>(acc[s][2 * i + 1])));
            y[s][i] = __fmaf_rn(__fmul_rn(inv, d[i]), sum, y[s][i]);
        }
    }
}

// A unit of type QT from rows r (any 2-byte alignment): Q4_K and Q5_K as above, Q6_K below.
template <int QT, int NS> struct UnitImma {
    __device__ __forceinline__ static void run(const uint8_t* const r[2], const ImmaX<NS>& x, const ActPackI& p,
                                               int u, int k, int tq, float (&y)[NS][2]) {
        unit_imma_k4<QT, NS>(r, x, p, u, k, tq, y);
    }
};
template <int NS> struct UnitImma<kQ6_K, NS> {
    __device__ __forceinline__ static void run(const uint8_t* const r[2], const ImmaX<NS>& x, const ActPackI& p,
                                               int u, int k, int tq, float (&y)[NS][2]) {
        // mma.sync needs the whole warp on one path: rows alternate alignment when a row has an odd unit count
        if (__all_sync(0xffffffffu, ((reinterpret_cast<uintptr_t>(r[0]) | reinterpret_cast<uintptr_t>(r[1])) & 3) == 0))
            unit_imma_q6_k<true, NS>(r, x, p, u, k, tq, y);
        else
            unit_imma_q6_k<false, NS>(r, x, p, u, k, tq, y);
    }
};

}  // namespace openjet
