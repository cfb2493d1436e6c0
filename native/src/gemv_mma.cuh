// Decode GEMV on tensor cores, straight from GGUF k-quant blocks (gemv.cuh has the contract).
//
// One mma.sync m16n8k16 (fp16 x fp16 -> fp32) multiplies 16 weight rows by the 8 token columns of the
// activation pack over 16 elements of k. A warp owns a 16-row tile over a quarter of k; the four warps of a
// block sum their partials in a fixed order. Every column is computed whatever t is (columns >= t read
// zeros), so a row's arithmetic is the same for t = 1 and t = 8.
//
// Weights: each warp streams its tile's rows one unit (256 elements: one super-block, or 8 Q8_0 blocks) at
// a time global -> shared with 16-byte cp.async, kStages deep. Q6_K units (210 bytes) are not 16-byte
// aligned: a unit is copied from its 16-byte floor and read back with funnel shifts.
//
// Fragments: lane = (g, tq) = (lane / 4, lane % 4) holds A rows g and g + 8, B column g, C rows g, g + 8 x
// columns 2tq, 2tq + 1. In each mma the lane's four k slots are four consecutive elements e..e+3 whose codes
// sit in one 32-bit word: bytes (0, 2) go to k slots (2tq, 2tq + 1) and bytes (1, 3) to (2tq + 8, 2tq + 9);
// the pack stores each quad as (0, 2, 1, 3), so one 8-byte load is the matching B pair. Which elements a
// lane takes in which mma is free (a sum does not care), and is chosen so its weight bytes are contiguous.
//
// Codes become fp16 exactly with the magic-number trick: (0x6400 | c) is the fp16 1024 + c.
//   Q4_K / Q5_K: A = q * sc (<= 1953, exact in fp16) by one fma; the unit's sum is scaled by d once, and the
//                min term -dmin * sum_j m_j * sum(x in sub-block j) is one more mma over the pack's 32-block
//                sums (split in two fp16 each: 22 bits).
//   Q6_K:        A = q - 32; each mma covers one 16-element sub-block and is scaled by d * sc in fp32
//                ((q - 32) * sc reaches 4064, which fp16 would round).
//   Q8_0:        A = q; two mma per 32-block, scaled by d in fp32.
// So the weights enter exactly as the reference dequantises them, and the only rounding on the way in is
// the activations' fp16.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "act_pack.cuh"
#include "cp_async.cuh"
#include "dense_gemm.cuh"
#include "device_attr.cuh"
#include "gemv.cuh"
#include "gemv_tma.cuh"
#include "kquant.cuh"
#include "mma_f16.cuh"
#include "pdl.cuh"
#include "launch_count.h"
#include "prefill_gemm.cuh"
#include "weight_layout.cuh"

namespace openjet {

constexpr int kMmaRows = 16;    // weight rows per tile
#ifndef OPENJET_GEMV_WARPS   // build-time experiment knobs (native/bench); the defaults are the measured best
#define OPENJET_GEMV_WARPS 4
#endif
#ifndef OPENJET_GEMV_STAGES
#define OPENJET_GEMV_STAGES 3
#endif
// Decode blocks per SM the kernel's registers are cut for (__launch_bounds__), as many as shared memory holds
// at 3 stages (per block: Q4_K 27.6 KB, Q5_K 33.8, Q6_K 43.0): sm_90/100 (228 KB per SM) take 4 blocks, and
// for Q6_K 6 (80 registers, no spills there; H200: Q6_K 5120 -> 10240 27.4 -> 21.7 us, lm_head 417 ->
// 391); 100 KB (sm_86, sm_89, sm_120) hold 3 and 2 (sm_120 spilled Q6_K at 80 and at 128 registers).
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900 || __CUDA_ARCH__ == 1000)
#define OPENJET_GEMV_SMEM_BIG 1
#endif
#ifndef OPENJET_GEMV_MIN_BLOCKS
#ifdef OPENJET_GEMV_SMEM_BIG
#define OPENJET_GEMV_MIN_BLOCKS 4
#else
#define OPENJET_GEMV_MIN_BLOCKS 3
#endif
#endif
#ifndef OPENJET_GEMV_MIN_BLOCKS_Q6K
#ifdef OPENJET_GEMV_SMEM_BIG
#define OPENJET_GEMV_MIN_BLOCKS_Q6K 6
#else
#define OPENJET_GEMV_MIN_BLOCKS_Q6K 2
#endif
#endif
// The same for the half-tile kernels (8 rows, half the shared memory; sm_90: Q5_K spilled 4 bytes at 6 blocks'
// 80 registers, none at 5 blocks' 96).
#ifndef OPENJET_GEMV_MIN_BLOCKS_HALF
#ifdef OPENJET_GEMV_SMEM_BIG
#define OPENJET_GEMV_MIN_BLOCKS_HALF 5
#else
#define OPENJET_GEMV_MIN_BLOCKS_HALF 4
#endif
#endif
constexpr int kGemvWarps = OPENJET_GEMV_WARPS;    // warps per tile, splitting k; fixed: the same sum order on every GPU
constexpr int kGemvStages = OPENJET_GEMV_STAGES;  // cp.async depth per warp
static_assert(kGemvStages >= 2, "cp.async stages: one in use, the rest in flight");
constexpr int kUnitElems = kGemvUnit;
// The first unit of k quarter q (0..kGemvWarps) of nu units: quarter q is [quarter_begin(nu, q), quarter_begin(nu, q +
// 1)). Every kernel that gives a row decode's bits (this file's, ffn_persistent.cu's, gemv_tma.cu's) splits k so.
__host__ __device__ __forceinline__ constexpr int quarter_begin(int nu, int q) { return nu * q / kGemvWarps; }
constexpr int kPrefillGroups = 4;  // groups of 8 token rows a prefill block takes (one weight decode for all)

// kRows: weight rows per tile, 16 (an mma's rows) or 8 (a half tile: the mma's rows g + 8 are zeros; see
// gemv_mma_kernel for why).
template <int QT, int kRows = kMmaRows> struct MmaShape {
    static_assert(kRows == 16 || kRows == 8, "a tile is an mma's 16 rows or its first 8");
    static constexpr int kUnitBytes = unit_bytes_of<QT>();
    static constexpr bool kAligned = kUnitBytes % 16 == 0;  // then every unit of every row is 16-byte aligned
    static constexpr int kWords = kAligned ? kUnitBytes / 16 : (kUnitBytes + 14 + 15) / 16;  // per row and stage
    static constexpr int kStageWords = kRows * kWords;
    static constexpr int kWarpWords = kGemvStages * kStageWords;
    static constexpr int kSmemBytes = kGemvWarps * kWarpWords * 16 + 16;  // +16: funnel reads one word past
};

// ------------------------------------------------------------------------------------------ arithmetic

// mma_16816, hsub2_u, hfma2_u, kMagic: mma_f16.cuh.

// 32-bit word at a 2-byte-aligned shared address (two aligned loads and a funnel shift).
__device__ __forceinline__ uint32_t lds_u32(const uint8_t* p) {
    const int mis = static_cast<int>(reinterpret_cast<uintptr_t>(p) & 3);
    const uint32_t* w = reinterpret_cast<const uint32_t*>(p - mis);
    return __funnelshift_r(w[0], w[1], 8 * mis);
}

// Activations: from global memory through the read-only path, or from shared memory (kSmemB: the prefill
// kernel stages them there for all its warps). 8 bytes: one mma's B pair; 16 bytes: two.
template <bool kSmemB> __device__ __forceinline__ uint2 ld_b(const __half* p) {
    if constexpr (kSmemB) return *reinterpret_cast<const uint2*>(p);
    else return __ldg(reinterpret_cast<const uint2*>(p));
}
template <bool kSmemB> __device__ __forceinline__ uint4 ld_b2(const __half* p) {
    if constexpr (kSmemB) return *reinterpret_cast<const uint4*>(p);
    else return __ldg(reinterpret_cast<const uint4*>(p));
}

// The lane's B registers for elements e..e+3 of its column.
template <bool kSmemB> __device__ __forceinline__ void load_b(const __half* xcol, int e, uint32_t b[2]) {
    const uint2 v = ld_b<kSmemB>(xcol + e);
    b[0] = v.x;
    b[1] = v.y;
}

// (a & kMask) | kMagic in one lop3 (the compiler splits it in two: two immediates).
template <uint32_t kMask> __device__ __forceinline__ uint32_t mask_magic(uint32_t a) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "n"(kMask), "r"(kMagic));
    return d;
}
// (a & kMask) | b in one lop3.
template <uint32_t kMask> __device__ __forceinline__ uint32_t mask_or(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "n"(kMask), "r"(b));
    return d;
}

// ------------------------------------------------------------------------------------------ one unit

// What unit_mma needs besides the weights: the lane's B column at the unit's start, and its B pair of the
// pack's 32-block sums (hi, lo of sub-blocks 2tq, 2tq + 1 of column g). A lane whose column is >= t reads
// column t - 1 instead (its callers clamp): the mma's columns are independent and columns >= t are never
// written, so loads need neither predicates nor zeros.
struct UnitX {
    const __half* col;
    const __half* sum;
};

// fp16x2 (v, v) of byte `idx` of w (a value < 1024), exactly: the byte is placed in both halves' mantissas.
__device__ __forceinline__ uint32_t h2_of_byte(uint32_t w, int idx) {
    return hsub2_u(__byte_perm(w, 0u, 0x4040u | idx | (idx << 8)) | kMagic, kMagic);
}
// fp16x2 (byte idx, byte idx + 1) of w, exactly.
__device__ __forceinline__ uint32_t h2_of_bytes(uint32_t w, int idx) {
    return hsub2_u(__byte_perm(w, 0u, 0x4040u | idx | ((idx + 1) << 8)) | kMagic, kMagic);
}

// acc[j] (this lane's C fragment of group j) += the unit's W[16 rows, 256] x_j[256, 8] for NG groups of 8
// token columns: each A fragment is decoded once and meets the NG groups' B fragments, and a group's sequence
// of operations is the same for every NG (so NG = 4 gives each group the bits NG = 1 gives it). r[0], r[1]:
// rows g and g + 8 of the unit in shared memory. kHalves = 1: a half tile, only row g (r[0]); the A registers
// of row g + 8 are zeros and acc[j][2..3] are left alone. An mma's output element depends only on its own row
// of A, so row g gets the bits a full tile gives it.
template <int QT, int NG, bool kSmemB = false, int kHalves = 2> struct UnitMma;

// Q4_K / Q5_K pieces of unit_mma_k4. A row's header: d, dmin and the 12 scale bytes, unpacked in registers
// (ggml get_scale_min_k4) to the 6-bit sc and m of sub-blocks 0..3 and 4..7, one byte each. (Index sc / mn
// with constants: a lane-dependent index put the array in local memory.)
struct K4Header {
    float d, dm32;        // dm32 = dmin * 32: the pack's sums are stored / 32
    uint32_t sc[2], mn[2];
    __device__ __forceinline__ explicit K4Header(const uint8_t* row) {
        const uint4 hd = *reinterpret_cast<const uint4*>(row);
        const float2 dd = __half22float2(*reinterpret_cast<const __half2*>(&hd.x));
        d = dd.x;
        dm32 = __fmul_rn(dd.y, 32.0f);
        sc[0] = hd.y & 0x3F3F3F3Fu;
        mn[0] = hd.z & 0x3F3F3F3Fu;
        sc[1] = (hd.w & 0x0F0F0F0Fu) | ((hd.y >> 2) & 0x30303030u);
        mn[1] = ((hd.w >> 4) & 0x0F0F0F0Fu) | ((hd.z >> 2) & 0x30303030u);
    }
};

// A = q * sc of sub-block 2 jj + nb (= byte 2 (tq / 2) + nb of scale word hv), exactly, by one fma on the code
// as an fp16 with the magic exponent: nb = 0 takes the low nibble, (1024 + q) * sc - 1024 sc; nb = 1 the high
// nibble where it lies, (1024 + 16 q) * (sc / 16) - 64 sc (no shift; sc / 16 is exact). The pair (sc2, nsc2):
template <int nb> __device__ __forceinline__ void k4_scale_pair(uint32_t sc_word, int tq, uint32_t& sc2,
                                                                uint32_t& nsc2) {
    sc2 = h2_of_byte(sc_word, 2 * (tq >> 1) + nb);
    if (nb) sc2 = hfma2_u(sc2, 0x2C002C00u, 0u);  // * 1/16
    nsc2 = hfma2_u(sc2, 0xE400E400u, 0u);          // * -1024
}

// A row's two A registers from its code word w (bytes (0, 2) -> lo, (1, 3) -> hi) of nibble nb; Q5_K: hb, the
// qh word shifted so that bit 0 of each byte is the code's fifth bit.
template <int QT, int nb>
__device__ __forceinline__ void k4_a_regs(uint32_t w, uint32_t hb, uint32_t sc2, uint32_t nsc2, uint32_t& a_lo,
                                          uint32_t& a_hi) {
    const uint32_t w8 = w >> 8;
    uint32_t lo, hi;
    if constexpr (QT == kQ5_K) {
        if (nb == 0) {
            lo = mask_or<0x000F000Fu>(w, mask_magic<0x00100010u>(hb << 4));
            hi = mask_or<0x000F000Fu>(w8, mask_magic<0x00100010u>(hb >> 4));
        } else {
            lo = mask_or<0x00F000F0u>(w, mask_magic<0x01000100u>(hb << 8));
            hi = mask_or<0x00F000F0u>(w8, mask_magic<0x01000100u>(hb));
        }
    } else if (nb == 0) {
        lo = mask_magic<0x000F000Fu>(w);
        hi = mask_magic<0x000F000Fu>(w8);
    } else {
        lo = mask_magic<0x00F000F0u>(w);
        hi = mask_magic<0x00F000F0u>(w8);
    }
    a_lo = hfma2_u(lo, sc2, nsc2);
    a_hi = hfma2_u(hi, sc2, nsc2);
}

template <int QT, int NG, bool kSmemB, int kHalves>
__device__ __forceinline__ void unit_mma_k4(const uint8_t* const r[2], const UnitX (&x)[NG], int tq,
                                            float (&acc)[NG][4]) {
    constexpr int kQs = QT == kQ4_K ? 16 : 48;
    const K4Header hdr[2] = {K4Header(r[0]), K4Header(r[kHalves - 1])};  // a half tile uses hdr[0] only
    // Min term: one mma, A[row, j] = A[row, 8 + j] = m_j (j = 0..7), B = the sums' hi (k < 8) and lo parts.
    float mins[NG][4] = {};
    {
        uint32_t a[4] = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int i = 0; i < kHalves; ++i) a[i] = a[2 + i] = h2_of_bytes((tq >> 1) ? hdr[i].mn[1] : hdr[i].mn[0], 2 * (tq & 1));
#pragma unroll
        for (int j = 0; j < NG; ++j) {
            uint32_t b[2];
            load_b<kSmemB>(x[j].sum, 4 * tq, b);
            mma_16816(mins[j], a, b);
        }
    }
    uint4 qh[kHalves];
    if constexpr (QT == kQ5_K) {
#pragma unroll
        for (int i = 0; i < kHalves; ++i) qh[i] = *reinterpret_cast<const uint4*>(r[i] + 16 + 16 * (tq & 1));
    }
    float u[NG][4][4] = {};  // four accumulators (by wd): four short mma dependency chains instead of one of 16
    // The lane's elements 64 (tq / 2) + 16 (tq % 2) + ... of each column: with the lane's offset added to the pointer
    // first, the loads below take their constants as immediates (not a 64-bit index and its descriptor per load).
    const __half* xb[NG];
#pragma unroll
    for (int j = 0; j < NG; ++j) xb[j] = x[j].col + 64 * (tq >> 1) + 16 * (tq & 1);
#pragma unroll
    for (int hv = 0; hv < 2; ++hv) {
        const int jj = (tq >> 1) + 2 * hv;
        uint4 q[kHalves];
#pragma unroll
        for (int i = 0; i < kHalves; ++i) q[i] = *reinterpret_cast<const uint4*>(r[i] + kQs + 16 * (tq + 4 * hv));
#pragma unroll
        for (int nb = 0; nb < 2; ++nb) {
            uint32_t sc2[kHalves], nsc2[kHalves];  // k4_scale_pair: A = q * sc of sub-block 2 jj + nb, exactly
#pragma unroll
            for (int i = 0; i < kHalves; ++i) {
                if (nb) k4_scale_pair<1>(hdr[i].sc[hv], tq, sc2[i], nsc2[i]);
                else k4_scale_pair<0>(hdr[i].sc[hv], tq, sc2[i], nsc2[i]);
            }
            // The B pairs of the four mma: elements 128 hv + 32 nb + 16 (tq & 1) + 64 (tq / 2) + 4 wd, wd = 0..3,
            // are 16 consecutive halves: two 16-byte loads (one group; several groups load each pair where it
            // is used: 32 more live registers per group spilled on sm_120).
            const int e0 = 128 * hv + 32 * nb;  // from the lane's base xb
            uint4 bv[2];
            if constexpr (NG == 1) {
                bv[0] = ld_b2<kSmemB>(xb[0] + e0);
                bv[1] = ld_b2<kSmemB>(xb[0] + e0 + 8);
            }
#pragma unroll
            for (int wd = 0; wd < 4; ++wd) {
                uint32_t a[4] = {0u, 0u, 0u, 0u};
#pragma unroll
                for (int i = 0; i < kHalves; ++i) {  // Q5_K: bit 2 jj + nb of each qh byte is the code's fifth bit
                    const uint32_t w = (&q[i].x)[wd], hb = QT == kQ5_K ? (&qh[i].x)[wd] >> (2 * jj + nb) : 0u;
                    if (nb) k4_a_regs<QT, 1>(w, hb, sc2[i], nsc2[i], a[i], a[2 + i]);
                    else k4_a_regs<QT, 0>(w, hb, sc2[i], nsc2[i], a[i], a[2 + i]);
                }
#pragma unroll
                for (int j = 0; j < NG; ++j) {
                    uint32_t b[2];
                    if constexpr (NG == 1) {
                        const uint4& v = bv[wd >> 1];
                        b[0] = (wd & 1) ? v.z : v.x;
                        b[1] = (wd & 1) ? v.w : v.y;
                    } else {
                        load_b<kSmemB>(xb[j], e0 + 4 * wd, b);
                    }
                    mma_16816(u[j][wd], a, b);
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NG; ++j) {
#pragma unroll
        for (int c = 0; c < 2 * kHalves; ++c) {
            const float uc = __fadd_rn(__fadd_rn(u[j][0][c], u[j][1][c]), __fadd_rn(u[j][2][c], u[j][3][c]));
            acc[j][c] = __fmaf_rn(hdr[c >> 1].d, uc, __fmaf_rn(-hdr[c >> 1].dm32, mins[j][c], acc[j][c]));
        }
    }
}

template <int NG, bool kSmemB, int kHalves> struct UnitMma<kQ4_K, NG, kSmemB, kHalves> {
    __device__ __forceinline__ static void run(const uint8_t* const r[2], const UnitX (&x)[NG], int tq,
                                               float (&acc)[NG][4]) {
        unit_mma_k4<kQ4_K, NG, kSmemB, kHalves>(r, x, tq, acc);
    }
};
template <int NG, bool kSmemB, int kHalves> struct UnitMma<kQ5_K, NG, kSmemB, kHalves> {
    __device__ __forceinline__ static void run(const uint8_t* const r[2], const UnitX (&x)[NG], int tq,
                                               float (&acc)[NG][4]) {
        unit_mma_k4<kQ5_K, NG, kSmemB, kHalves>(r, x, tq, acc);
    }
};

// 32-bit words of a row's unit in shared memory at byte offsets that are multiples of 4 from its start,
// which is 4-byte aligned (kAligned4) or 2-byte aligned: then two aligned loads and a funnel shift by the
// row's misalignment, worked out once per row.
template <bool kAligned4> struct RowWords {
    const uint32_t* w;
    int sh;
    __device__ __forceinline__ explicit RowWords(const uint8_t* p) {
        const int mis = kAligned4 ? 0 : static_cast<int>(reinterpret_cast<uintptr_t>(p) & 3);
        w = reinterpret_cast<const uint32_t*>(p - mis);
        sh = 8 * mis;
    }
    __device__ __forceinline__ uint32_t operator[](int i) const {  // the word at byte offset 4 i
        if constexpr (kAligned4) return w[i];
        else return __funnelshift_r(w[i], w[i + 1], sh);
    }
};
// The same words, each address worked out where it is read: fewer live registers, for the kernels that
// hold several groups' accumulators (sm_120 spilled with RowWords there).
template <bool kAligned4> struct RowWordsLean {
    const uint8_t* p;
    __device__ __forceinline__ explicit RowWordsLean(const uint8_t* p_) : p(p_) {}
    __device__ __forceinline__ uint32_t operator[](int i) const {
        if constexpr (kAligned4) return *reinterpret_cast<const uint32_t*>(p + 4 * i);
        else return lds_u32(p + 4 * i);
    }
};

// Q6_K: element 128 hh + 32 qd + l (l = 16 lh + 4 tq + 0..3): low 4 bits in ql[64 hh + 32 (qd & 1) + l]
// (nibble qd / 2), high 2 bits in qh[32 hh + l] (bits 2 qd), scale sc[8 hh + 2 qd + lh]. Units start 2-byte
// aligned; kAligned4 when every row's unit in the warp is 4-byte aligned (every other unit when a row has
// an even number of units).
template <bool kAligned4, int NG, bool kSmemB, int kHalves>
__device__ __forceinline__ void unit_mma_q6_k(const uint8_t* const r[2], const UnitX (&x)[NG], int tq,
                                              float (&acc)[NG][4]) {
    constexpr uint32_t k1056 = 0x64206420u;  // fp16x2 (1024 + 32)
    float d[kHalves];
    uint32_t scw[kHalves][4];  // the 16 int8 scales
    using Words = std::conditional_t<NG == 1, RowWords<kAligned4>, RowWordsLean<kAligned4>>;
    const __half* xb[NG];  // the lane's elements 4 tq + ... of each column
#pragma unroll
    for (int j = 0; j < NG; ++j) xb[j] = x[j].col + 4 * tq;
    const Words rw[2] = {Words(r[0]), Words(r[kHalves - 1])};
#pragma unroll
    for (int i = 0; i < kHalves; ++i) {
        d[i] = f16_at(r[i] + 208);
#pragma unroll
        for (int j = 0; j < 4; ++j) scw[i][j] = rw[i][48 + j];
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
        for (int lh = 0; lh < 2; ++lh) {
            uint32_t ql[kHalves][2], qh[kHalves];
#pragma unroll
            for (int i = 0; i < kHalves; ++i) {
                const int l4 = 4 * lh + tq;  // byte 16 lh + 4 tq
                ql[i][0] = rw[i][16 * hh + l4];
                ql[i][1] = rw[i][16 * hh + 8 + l4];
                qh[i] = rw[i][32 + 8 * hh + l4];
            }
#pragma unroll
            for (int qd = 0; qd < 4; ++qd) {
                uint32_t a[4] = {0u, 0u, 0u, 0u};
                float coef[kHalves];
#pragma unroll
                for (int i = 0; i < kHalves; ++i) {
                    // A = q - 32 exactly, from the code as an fp16 with the magic exponent: the low nibble (qd < 2)
                    // as (1024 + q) - 1056; the high nibble where it lies, (1024 + 16 q) / 16 - 96 (no shift).
                    const uint32_t w = ql[i][qd & 1], w8 = w >> 8, h = qh[i] >> (2 * qd);
                    if (qd < 2) {
                        a[i] = hsub2_u(mask_or<0x000F000Fu>(w, mask_magic<0x00300030u>(h << 4)), k1056);
                        a[2 + i] = hsub2_u(mask_or<0x000F000Fu>(w8, mask_magic<0x00300030u>(h >> 4)), k1056);
                    } else {
                        a[i] = hfma2_u(mask_or<0x00F000F0u>(w, mask_magic<0x03000300u>(h << 8)), 0x2C002C00u,
                                       0xD600D600u);
                        a[2 + i] = hfma2_u(mask_or<0x00F000F0u>(w8, mask_magic<0x03000300u>(h)), 0x2C002C00u,
                                           0xD600D600u);
                    }
                    const int sb = 8 * hh + 2 * qd + lh;
                    const int8_t sc = static_cast<int8_t>(scw[i][sb >> 2] >> (8 * (sb & 3)));
                    coef[i] = __fmul_rn(d[i], static_cast<float>(sc));
                }
#pragma unroll
                for (int j = 0; j < NG; ++j) {
                    uint32_t b[2];
                    load_b<kSmemB>(xb[j], 128 * hh + 32 * qd + 16 * lh, b);
                    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mma_16816(s, a, b);
#pragma unroll
                    for (int c = 0; c < 2 * kHalves; ++c) acc[j][c] = __fmaf_rn(coef[c >> 1], s[c], acc[j][c]);
                }
            }
        }
    }
}

template <int NG, bool kSmemB, int kHalves> struct UnitMma<kQ6_K, NG, kSmemB, kHalves> {
    __device__ __forceinline__ static void run(const uint8_t* const r[2], const UnitX (&x)[NG], int tq,
                                               float (&acc)[NG][4]) {
        // The choice must be the same for the whole warp (mma.sync.aligned): rows alternate alignment when a
        // row has an odd number of units.
        if (__all_sync(0xffffffffu,
                       ((reinterpret_cast<uintptr_t>(r[0]) | reinterpret_cast<uintptr_t>(r[1])) & 3) == 0))
            unit_mma_q6_k<true, NG, kSmemB, kHalves>(r, x, tq, acc);
        else
            unit_mma_q6_k<false, NG, kSmemB, kHalves>(r, x, tq, acc);
    }
};

// Q8_0: 8 blocks of 34 bytes (d, q[32]); two mma per block.
template <int NG, bool kSmemB, int kHalves> struct UnitMma<kQ8_0, NG, kSmemB, kHalves> {
    __device__ __forceinline__ static void run(const uint8_t* const r[2], const UnitX (&x)[NG], int tq,
                                               float (&acc)[NG][4]) {
        const __half* xb[NG];  // the lane's elements 4 tq + ... of each column
#pragma unroll
        for (int j = 0; j < NG; ++j) xb[j] = x[j].col + 4 * tq;
#pragma unroll 2
        for (int blk = 0; blk < 8; ++blk) {
            float s[NG][4] = {};
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                uint32_t a[4] = {0u, 0u, 0u, 0u};
#pragma unroll
                for (int i = 0; i < kHalves; ++i) {
                    const uint32_t w = lds_u32(r[i] + 34 * blk + 2 + 16 * hf + 4 * tq);  // int8 codes
                    a[i] = h2_of_s8_bytes02(w & 0x00FF00FFu);
                    a[2 + i] = h2_of_s8_bytes02((w >> 8) & 0x00FF00FFu);
                }
#pragma unroll
                for (int j = 0; j < NG; ++j) {
                    uint32_t b[2];
                    load_b<kSmemB>(xb[j], 32 * blk + 16 * hf, b);
                    mma_16816(s[j], a, b);
                }
            }
            const float d0 = f16_at(r[0] + 34 * blk), d1 = kHalves == 2 ? f16_at(r[1] + 34 * blk) : 0.0f;
#pragma unroll
            for (int j = 0; j < NG; ++j) {
#pragma unroll
                for (int c = 0; c < 2 * kHalves; ++c) acc[j][c] = __fmaf_rn(c < 2 ? d0 : d1, s[j][c], acc[j][c]);
            }
        }
    }
};

// ------------------------------------------------------------------------------------------ one warp

// A warp's cp.async plan for its 16-row tile, worked out once: the lane copies words i = lane + 32 j of each
// stage (row i / kWords, word i % kWords of that row), kept as byte offsets from the tile's first row (-1: a
// word past the stage or in a row >= n). Per unit only the tile's address moves, by kUnitBytes: the unit loop
// spends a few instructions per copy instead of a 64-bit row-address product (SASS: ~100 of its ~540).
template <int QT, int kRows = kMmaRows> struct TileCopy {
    using S = MmaShape<QT, kRows>;
    static constexpr int kJ = (S::kStageWords + 31) / 32;
    int off[kJ];  // rr * row_bytes (+ 16 wi when every unit is aligned)

    __device__ __forceinline__ TileCopy(long long row_bytes, int n, int row0, int lane) {
#pragma unroll
        for (int j = 0; j < kJ; ++j) {
            const int i = lane + 32 * j, rr = i / S::kWords, wi = i - rr * S::kWords;
            off[j] = i < S::kStageWords && row0 + rr < n
                         ? static_cast<int>(rr * row_bytes) + (S::kAligned ? 16 * wi : 0)
                         : -1;
        }
    }

    // The lane's copies of one unit into dst (one stage); tile: that unit's address in the tile's first row.
    __device__ __forceinline__ void issue(uintptr_t tile, uint4* dst, int lane) const {
#pragma unroll
        for (int j = 0; j < kJ; ++j) {
            if (off[j] < 0) continue;
            const int i = lane + 32 * j;
            const uintptr_t a = tile + off[j];
            if constexpr (S::kAligned) {
                cp_async16(dst + i, reinterpret_cast<const void*>(a));
            } else {  // a row's unit from its 16-byte floor: the words that hold some of its bytes
                const int wi = i % S::kWords;
                if (wi * 16 < static_cast<int>(a & 15) + S::kUnitBytes)
                    cp_async16(dst + i, reinterpret_cast<const void*>((a & ~uintptr_t(15)) + 16 * wi));
            }
        }
    }
};

// Whether a tile's row offsets fit TileCopy's ints (every k-quant row up to ~130 MB does).
inline bool tile_offsets_fit(long long row_bytes) { return row_bytes * kMmaRows < 0x7fffffffLL; }

// Rows g and g + 8 of the unit at `tile` (its address in the tile's first row) in a stage that TileCopy filled;
// a half tile (kRows = 8) has row g only, given twice.
template <int QT, int kRows = kMmaRows>
__device__ __forceinline__ void tile_unit_rows(const uint4* stage, uintptr_t tile, long long row_bytes, int g,
                                               const uint8_t* r[2]) {
    using S = MmaShape<QT, kRows>;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        if (kRows == 8 && i == 1) {
            r[1] = r[0];
            break;
        }
        const int mis = S::kAligned ? 0 : static_cast<int>((tile + static_cast<int>((g + 8 * i) * row_bytes)) & 15);
        r[i] = reinterpret_cast<const uint8_t*>(stage) + (g + 8 * i) * S::kWords * 16 + mis;
    }
}

// What gemv_tile_warp waits for between its first weight copies and its first activation read: the kernel before
// it in the stream (pdl.cuh), or, in a persistent kernel, a counter (ffn_persistent.cu).
struct PdlWait {
    __device__ __forceinline__ void operator()() const { pdl_wait(); }
};

// The warp's part of a tile: rows [row0, row0 + kRows) over units [u0, u1), for NG groups of 8 token rows of
// x starting at group grp0 (rows >= t: UnitX), into acc (its C fragments; a half tile's rows g + 8, acc[j][2..3],
// stay as they were). smem: this warp's kWarpWords (MmaShape<QT, kRows>). A device function, so that a persistent
// kernel can call it per work item, with its own `wait` (PdlWait's place). tiled: w in the tile layout
// (weight_layout.cuh), where the same bytes sit in another order: the same arithmetic, the same bits.
template <int QT, int NG, int kRows = kMmaRows, class Wait = PdlWait>
__device__ __forceinline__ void gemv_tile_warp(const uint8_t* __restrict__ w, long long row_bytes, int n, int row0,
                                               int u0, int u1, const ActPack& x, int k, int t, int grp0,
                                               uint4* smem, float (&acc)[NG][4], const Wait& wait = Wait{},
                                               bool tiled = false) {
    using S = MmaShape<QT, kRows>;
    const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    // unit u of row row0 + rr: tile0 + u * step.unit + rr * step.row
    const WeightSteps step(row_bytes, S::kUnitBytes, tiled, row0);
    const uintptr_t tile0 = reinterpret_cast<uintptr_t>(w) + step.start;
    const TileCopy<QT, kRows> copy(step.row, n, row0, lane);

    auto issue = [&](int it) {
        const int u = u0 + it;
        if (u < u1)
            copy.issue(tile0 + u * step.unit, smem + static_cast<unsigned>(it) % kGemvStages * S::kStageWords, lane);
        cp_async_commit();
    };

#pragma unroll
    for (int s = 0; s < kGemvStages - 1; ++s) issue(s);
    wait();  // the weights above are immutable; the activations and outputs are another kernel's (pdl.cuh)

    const int kb = k / kActBlock;
    UnitX ux[NG];
    const __half *xh[NG], *xs[NG];  // this lane's token row in group j (t - 1 past t: UnitX) at unit u0
#pragma unroll
    for (int j = 0; j < NG; ++j) {
        const long long col = min(static_cast<long long>(grp0 + j) * kActRows + g, static_cast<long long>(t - 1));
        xh[j] = x.h + col * k + u0 * kUnitElems;
        xs[j] = x.sum + col * kb * 2 + u0 * 16;
    }
    auto unit = [&](int it) {  // unit u0 + it from its stage into acc
        const uint8_t* r[2];
        tile_unit_rows<QT, kRows>(smem + static_cast<unsigned>(it) % kGemvStages * S::kStageWords,
                                  tile0 + (u0 + it) * step.unit, step.row, g, r);
#pragma unroll
        for (int j = 0; j < NG; ++j) {
            ux[j].col = xh[j] + it * kUnitElems;
            ux[j].sum = xs[j] + it * 16;
        }
        UnitMma<QT, NG, false, kRows / 8>::run(r, ux, tq, acc);
    };
    const int nu = u1 - u0;
    for (int it = 0; it < nu; ++it) {
        cp_async_wait<kGemvStages - 2>();
        __syncwarp();
        unit(it);
        __syncwarp();
        issue(it + kGemvStages - 1);
    }
    cp_async_wait<0>();
}

// A tile's sum at the lane's C fragment element c of group j: the warps' k quarters added in order, 0 + 1 + 2 + 3 (the
// order a decode output's bits rest on; every epilogue of the tile takes it from here).
template <int NG>
__device__ __forceinline__ float tile_quarters_sum(const float (&part)[kGemvWarps][NG][32][4], int j, int lane, int c) {
    float v = part[0][j][lane][c];
#pragma unroll
    for (int i = 1; i < kGemvWarps; ++i) v = __fadd_rn(v, part[i][j][lane][c]);
    return v;
}

// A tile's output from its warps' C fragments part[warp] (warp i: k quarter i), by one warp: the quarters added in
// order (tile_quarters_sum), y[col, row] = sum * inv[col] for rows < n and columns < t. inv is read from L2 (ld.cg): a
// persistent kernel (ffn_persistent.cu) reads inv entries that other SMs wrote earlier in the same launch, beside ones
// this SM read before in the same 128-byte line, which a plain load could find stale in this SM's L1.
// tile_sum_store_by: the same with inv[col] from inv_of(c & 1, col) (gemv_tma.cu reads the call's scales once).
template <int NG, int kRows, class InvOf>
__device__ __forceinline__ void tile_sum_store_by(const float (&part)[kGemvWarps][NG][32][4], int lane, int row0,
                                                  int grp0, int n, int t, const InvOf& inv_of, float* __restrict__ y) {
    const int g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int j = 0; j < NG; ++j) {
#pragma unroll
        for (int c = 0; c < 2 * (kRows / 8); ++c) {
            const float v = tile_quarters_sum(part, j, lane, c);
            const int row = row0 + g + 8 * (c >> 1), col = (grp0 + j) * kActRows + 2 * tq + (c & 1);
            if (row < n && col < t) y[static_cast<long long>(col) * n + row] = __fmul_rn(v, inv_of(c & 1, col));
        }
    }
}
template <int NG, int kRows>
__device__ __forceinline__ void tile_sum_store(const float (&part)[kGemvWarps][NG][32][4], int lane, int row0, int grp0,
                                               int n, int t, const float* inv, float* __restrict__ y) {
    tile_sum_store_by<NG, kRows>(part, lane, row0, grp0, n, t, [&](int, int col) { return __ldcg(inv + col); }, y);
}

// A second weight matrix one launch may carry (launch_gemv_mma_pair): blocks from `from` on compute it, with
// the first's type, k and activations. Its blocks do exactly what its own launch's blocks would do.
struct GemvSecond {
    const uint8_t* w = nullptr;
    int n = 0;
    float* y = nullptr;
    int from = 0x7fffffff;  // none
};

// One block = one 16-row tile x NG groups of 8 token rows (decode: NG = 1, one group; prefill: NG = 4, the
// tile's weights decoded once for 32 token rows); the blocks of a tile are consecutive, so they run together
// and share its weights through L2. Warp i takes units [nu * i / 4, nu * (i + 1) / 4); warp 0 sums the four
// partials in order and writes y[col, row] = sum * inv[col] for col < t. A group's arithmetic does not
// depend on NG. NG = 1: min 4 blocks per SM caps the registers at 128 (without it ptxas gave sm_86's Q6_K 80
// registers and a 4-byte spill); NG = 4 needs about twice that.
// kRows = 8 (decode only): half tiles. Where a grid of 16-row tiles leaves block slots empty (every n = 5120
// projection: 320 tiles), a warp's serial chain of units is what the call waits for; a half tile halves the
// decoding per unit and doubles the blocks, with the bits of the full tile (UnitMma: rows are independent).
// (Two units per wait, deeper stages, was measured slower in the 27B's step and removed: NOTES_gemv.md.)
template <int QT, int NG, int kRows = kMmaRows>
__global__ void __launch_bounds__(kGemvWarps * 32, NG != 1 ? 2 : kRows == 8 ? OPENJET_GEMV_MIN_BLOCKS_HALF
                                                   : QT == kQ6_K ? OPENJET_GEMV_MIN_BLOCKS_Q6K : OPENJET_GEMV_MIN_BLOCKS)
gemv_mma_kernel(const uint8_t* __restrict__ w, long long row_bytes, int n, int k, ActPack x, int t, int blocks_per_tile,
                float* __restrict__ y, GemvSecond second, bool tiled) {
    extern __shared__ uint4 smem[];
    __shared__ float part[kGemvWarps][NG][32][4];
    pdl_launch_dependents();  // pdl_wait() is in gemv_tile_warp, after its first weight copies
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int block = blockIdx.x;
    if (block >= second.from) w = second.w, n = second.n, y = second.y, block -= second.from;
    const int grp0 = block % blocks_per_tile * NG, tile = block / blocks_per_tile;
    const int nu = k / kUnitElems, row0 = tile * kRows;
    float acc[NG][4] = {};
    gemv_tile_warp<QT, NG, kRows>(w, row_bytes, n, row0, quarter_begin(nu, warp), quarter_begin(nu, warp + 1), x, k,
                                  t, grp0, smem + warp * MmaShape<QT, kRows>::kWarpWords, acc, PdlWait{}, tiled);
#pragma unroll
    for (int j = 0; j < NG; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) part[warp][j][lane][c] = acc[j][c];
    __syncthreads();
    if (warp == 0) tile_sum_store<NG, kRows>(part, lane, row0, grp0, n, t, x.inv, y);
}

// ------------------------------------------------------------------------------------------ prefill

// Prefill (t > 8 rows): the grouped kernel above re-reads the activations from L2 for every 16-row tile,
// which bounds it near 45 TFLOP/s on the H200. This one stages them in shared memory for kPrefillWarps
// tiles at once: a block = kPrefillWarps warps x one 16-row tile each, over the same kPrefillGroups groups
// of 8 token rows; each unit's activations (and 32-block sums) are copied once per block, beside each
// warp's own weight stream. A warp walks the whole of k in the decode kernel's four quarters, each
// summed from zero and added to the total in order: the bits of the decode kernel, whose four warps take
// one quarter each.
// Its shape: kPrefillGroups groups (32 token rows) x kPrefillStages stages. (A "lean" shape, 2 stages and
// registers cut for 3 blocks per SM, was slower on the H200, 2,594 against 2,692 tok/s, and removed: NOTES_gemv.md.)
constexpr int kPrefillWarps = 4;
constexpr int kPrefillStages = 3;
// A B stage holds, per group, its 8 token rows of one unit and then their 32-block sums (16 halves a row).
// Where token row rr starts (halves): 256 rr, shifted by h(rr) 16-byte chunks so that a half-warp's 8-byte B
// loads (rows g = 0..3 or 4..7) hit as few 128-byte bank lines as they can. Q4_K/Q5_K lanes read elements
// 64 (tq / 2) + 16 (tq % 2) + c: chunks h + 2 (tq % 2) (mod 8) must differ over g, so h = 0, 1, 4, 5 (two lanes
// per chunk remain, 128 bytes apart: 2 wavefronts, was 4 with rows 528 bytes apart); Q6_K/Q8_0 lanes read 4 tq
// + c: chunks h + tq / 2, so h = 0, 2, 4, 6 (1 wavefront, was 2). Rows 4..7 sit one more bank line (64 halves)
// on, since h falls from row 3 to row 4 and rows must not overlap. Layout only: the same bits.
template <int QT> __host__ __device__ constexpr int b_row_halves(int rr) {
    const int h = QT == kQ4_K || QT == kQ5_K ? (rr & 1) | ((rr & 2) << 1) : 2 * (rr & 3);
    return rr * kUnitElems + 64 * (rr >> 2) + 8 * h;
}
constexpr int kBSumHalves = kActRows * kUnitElems + 128;  // past every shifted row, 128-byte aligned
constexpr int kBGroupHalves = kBSumHalves + kActRows * 16;  // a multiple of 64 halves: groups keep the bank pattern
template <int QT> constexpr bool b_rows_apart() {  // each row ends before the next begins, the last before the sums
    for (int rr = 0; rr < kActRows; ++rr)
        if (b_row_halves<QT>(rr) + kUnitElems > (rr + 1 < kActRows ? b_row_halves<QT>(rr + 1) : kBSumHalves))
            return false;
    return true;
}
static_assert(b_rows_apart<kQ4_K>() && b_rows_apart<kQ5_K>() && b_rows_apart<kQ6_K>() && b_rows_apart<kQ8_0>() &&
                  kBGroupHalves % 64 == 0,
              "B stage layout");

template <int QT> struct PrefillShape {
    static constexpr int kStageHalves = kPrefillGroups * kBGroupHalves;  // one unit's activations of the groups
    static constexpr int kWeightBytes = kPrefillWarps * kPrefillStages * MmaShape<QT>::kStageWords * 16;
    static constexpr int kSmemBytes = kWeightBytes + kPrefillStages * kStageHalves * 2 + 16;
    static constexpr int kStaticBytes = sizeof(float) * kPrefillWarps * kPrefillGroups * 32 * 4;  // total[]
};

// A thread's share of the block's activation copies per unit (each unit: the 8 NG token rows' 32 chunks of 16
// bytes and their 2 chunks of 32-block sums, rows < t only, into one B stage), worked out once per block like
// TileCopy: per unit only two base addresses move (before: a division, a modulo and 64-bit address arithmetic
// per copy, ~9 copies per thread per unit).
template <int QT, int NG> struct ActCopy {
    static constexpr int kRowChunks = kUnitElems * 2 / 16;  // 32 chunks of 16 bytes per token row
    static constexpr int kChunks = NG * kActRows * (kRowChunks + 2);
    static constexpr int kJ = (kChunks + kPrefillWarps * 32 - 1) / (kPrefillWarps * 32);
    int src[kJ];    // halves from the unit's start in x.h (a row chunk) or in x.sum (a sums chunk)
    int dst[kJ];    // halves into the B stage; -1: nothing to copy (past the chunks or a row >= t)
    unsigned sums;  // bit j: chunk j is a sums chunk
    static_assert(kJ <= 32, "sums holds a bit per copy");

    __device__ __forceinline__ ActCopy(int k, int t, int grp0) : sums(0) {
        const int kb2 = k / kActBlock * 2;
#pragma unroll
        for (int j = 0; j < kJ; ++j) {
            const int i = threadIdx.x + j * kPrefillWarps * 32;
            const int row = i / (kRowChunks + 2), c = i - row * (kRowChunks + 2);  // row: 0 .. 8 NG - 1
            const int col = grp0 * kActRows + row, grp = row / kActRows, rr = row % kActRows;
            src[j] = 0, dst[j] = -1;
            if (i >= kChunks || col >= t) continue;
            if (c < kRowChunks) {
                src[j] = col * k + 8 * c;
                dst[j] = grp * kBGroupHalves + b_row_halves<QT>(rr) + 8 * c;
            } else {
                src[j] = col * kb2 + 8 * (c - kRowChunks);
                dst[j] = grp * kBGroupHalves + kBSumHalves + rr * 16 + 8 * (c - kRowChunks);
                sums |= 1u << j;
            }
        }
    }

    __device__ __forceinline__ void issue(const ActPack& x, int u, __half* stage) const {
        const __half* h = x.h + static_cast<long long>(u) * kUnitElems;
        const __half* s = x.sum + u * 16;
#pragma unroll
        for (int j = 0; j < kJ; ++j)
            if (dst[j] >= 0) cp_async16(stage + dst[j], ((sums >> j) & 1 ? s : h) + src[j]);
    }
};

template <int QT>
__global__ void __launch_bounds__(kPrefillWarps * 32, 1)
prefill_mma_kernel(const uint8_t* __restrict__ w, long long row_bytes, int n, int k, ActPack x, int t,
                   int blocks_per_rows, float* __restrict__ y, bool tiled) {
    constexpr int NG = kPrefillGroups;
    using S = MmaShape<QT>;
    using P = PrefillShape<QT>;
    extern __shared__ uint4 smem[];
    __shared__ float total[kPrefillWarps][NG][32][4];
    pdl_start();  // pdl.cuh (its first copies include activations)
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const int grp0 = blockIdx.x % blocks_per_rows * NG;
    const int row0 = (blockIdx.x / blocks_per_rows * kPrefillWarps + warp) * kMmaRows;
    const int nu = k / kUnitElems;
    const WeightSteps step(row_bytes, S::kUnitBytes, tiled, row0);  // either layout (weight_layout.cuh)
    const uintptr_t tile0 = reinterpret_cast<uintptr_t>(w) + step.start;
    const TileCopy<QT> copy(step.row, n, row0, lane);
    const ActCopy<QT, NG> act(k, t, grp0);
    uint4* wsm = smem + warp * kPrefillStages * S::kStageWords;
    __half* bsm = reinterpret_cast<__half*>(reinterpret_cast<uint8_t*>(smem) + P::kWeightBytes);

    auto issue = [&](int u) {
        if (u < nu) {
            copy.issue(tile0 + u * step.unit, wsm + (u % kPrefillStages) * S::kStageWords, lane);
            act.issue(x, u, bsm + (u % kPrefillStages) * P::kStageHalves);
        }
        cp_async_commit();
    };
#pragma unroll
    for (int s = 0; s < kPrefillStages - 1; ++s) issue(s);

    // This lane's token row of group j in a B stage: past t, row t - 1 (staged: grp0 * 8 < t), as UnitX says.
    int bcol[NG], bsum[NG];
#pragma unroll
    for (int j = 0; j < NG; ++j) {
        const int row = min((grp0 + j) * kActRows + g, t - 1) - grp0 * kActRows;
        const int grp = row / kActRows, rr = row % kActRows;
        bcol[j] = grp * kBGroupHalves + b_row_halves<QT>(rr);
        bsum[j] = grp * kBGroupHalves + kBSumHalves + rr * 16;
    }
    UnitX ux[NG];
    int u = 0;
#pragma unroll 1
    for (int q = 0; q < kGemvWarps; ++q) {
        float acc[NG][4] = {};
        for (const int u1 = quarter_begin(nu, q + 1); u < u1; ++u) {
            cp_async_wait<kPrefillStages - 2>();
            __syncthreads();  // the stage's activations came from every thread of the block
            const uint8_t* r[2];
            tile_unit_rows<QT>(wsm + (u % kPrefillStages) * S::kStageWords, tile0 + u * step.unit, step.row, g, r);
            const __half* b = bsm + (u % kPrefillStages) * P::kStageHalves;
#pragma unroll
            for (int j = 0; j < NG; ++j) {
                ux[j].col = b + bcol[j];
                ux[j].sum = b + bsum[j];
            }
            UnitMma<QT, NG, true>::run(r, ux, tq, acc);
            issue(u + kPrefillStages - 1);  // overwrites the stage of u - 1: every warp is past it (barrier)
        }
#pragma unroll
        for (int j = 0; j < NG; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c)
                total[warp][j][lane][c] = q == 0 ? acc[j][c] : __fadd_rn(total[warp][j][lane][c], acc[j][c]);
    }
    cp_async_wait<0>();
#pragma unroll
    for (int j = 0; j < NG; ++j) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int row = row0 + g + 8 * (c >> 1), col = (grp0 + j) * kActRows + 2 * tq + (c & 1);
            if (row < n && col < t)
                y[static_cast<long long>(col) * n + row] = __fmul_rn(total[warp][j][lane][c], x.inv[col]);
        }
    }
}

// The prefill numerics and kernel (OPENJET_PREFILL_GEMM, read at each prefill call):
// - unset or "fast" (the default since 2026-12-02): Q4_K, Q5_K and Q6_K rows of a prefill through
//   prefill_gemm.cuh's GEMM on fp16-dequantised weights, numerics of its own, so a prefill no longer leaves
//   decode's bits (Engine.prefill_matches_decode; H200, 27B projections of a 512-row chunk: 181 against 135
//   TFLOP/s, 263 at 2,048 rows; the 4,096-token prefill 2,098 -> 2,584 tok/s). Q8_0 and F32 take the kernels below.
// - "exact": decode's numerics, every prefill row the bits a decode step gives it: the shared-activation kernel
//   where its grid fills the GPU at least three times over, else the grouped one. Measured on the H200 at 128
//   rows (bench_gemv.py --prefill-only, 2026-12-01): it wins from 384 blocks of 132 SMs up (n >= 6144 at
//   k = 5120: 0.69-0.96x the grouped kernel's time) and loses below (n = 5120, 320 blocks: 1.00-1.07x; n = 1024,
//   64 blocks: 1.7-2.6x), where its 64-row tiles leave SMs idle or in a tail wave. ("wide" and "lean" shapes
//   were slower on the H200 and removed: NOTES_gemv.md.)
// - "shared" or "grouped": "exact" with one of its kernels forced (tests and benchmarks; the same bits).
// - "dense" (the default where it runs: a 90a build with CUTLASS on sm_90; the engine refuses it elsewhere):
//   "fast"'s numerics and bits (measured: wgmma sums each output's k16 products in the mma.sync chain's order),
//   but each call's W dequantised to fp16 scratch and multiplied by CUTLASS's Hopper GEMM (dense_gemm.cuh; H200,
//   2,048 rows: Q4_K 17408 x 5120 1,170 -> 619 us, Q6_K 5120 x 17408 2,045 -> 643). Calls without the scratch
//   (GemvArgs::dense) take "fast"'s kernel.
// Any other value is refused by the Python binding at load (CudaEngine.load); here it reads as the default.
enum class PrefillGemm { kFast, kExact, kShared, kGrouped, kDense };

inline PrefillGemm prefill_gemm_choice() {
    const char* choice = std::getenv("OPENJET_PREFILL_GEMM");
    if (!choice || !*choice) return dense_gemm_available() ? PrefillGemm::kDense : PrefillGemm::kFast;
    if (std::strcmp(choice, "dense") == 0) return PrefillGemm::kDense;
    if (std::strcmp(choice, "exact") == 0) return PrefillGemm::kExact;
    if (std::strcmp(choice, "shared") == 0) return PrefillGemm::kShared;
    if (std::strcmp(choice, "grouped") == 0) return PrefillGemm::kGrouped;
    return PrefillGemm::kFast;
}

// Whether `choice` gives a prefill numerics of its own (prefill_gemm.cuh's: "fast", "dense") rather than decode's.
inline bool prefill_choice_own(PrefillGemm choice) {
    return choice == PrefillGemm::kFast || choice == PrefillGemm::kDense;
}

// Whether the call goes to prefill_gemm.cuh's GEMM under `choice`: the rows of a prefill (any count) or a call
// of more than 8 rows (only a prefill makes those), of a type it takes.
inline bool fast_prefill_call(const GemvArgs& a, PrefillGemm choice) {
    return prefill_choice_own(choice) && prefill_gemm_takes(a.qtype) && (a.prefill || a.t > kActRows);
}

// The shared-activation kernel; *launched stays false where it does not fit a block's shared memory (static
// total[] included) or, unless forced, its grid is too small.
template <int QT>
cudaError_t launch_prefill_mma(const GemvArgs& a, cudaStream_t stream, bool force, bool* launched) {
    using P = PrefillShape<QT>;
    *launched = false;
    int optin = 0, sms = 0;
    cudaError_t e = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, &optin);
    if (e == cudaSuccess) e = device_attribute(cudaDevAttrMultiProcessorCount, &sms);
    if (e != cudaSuccess) return e;
    if (P::kSmemBytes + P::kStaticBytes > optin) return cudaSuccess;  // the caller takes the grouped kernel
    const long long row_bytes = row_bytes_of<QT>(a.k);
    if (!tile_offsets_fit(row_bytes)) return cudaErrorInvalidValue;
    if (static_cast<long long>(a.t) * a.k > 0x7fffffffLL) return cudaSuccess;  // ActCopy's int offsets: grouped
    const int groups = (a.t + kActRows - 1) / kActRows, per_rows = (groups + kPrefillGroups - 1) / kPrefillGroups;
    const long long row_blocks = (a.n + kPrefillWarps * kMmaRows - 1) / (kPrefillWarps * kMmaRows);
    if (row_blocks * per_rows > 0x7fffffffLL) return cudaErrorInvalidValue;
    if (!force && row_blocks * per_rows < 3LL * sms) return cudaSuccess;
    auto kernel = prefill_mma_kernel<QT>;
    if (const cudaError_t e = smem_opted_in<prefill_mma_kernel<QT>, P::kSmemBytes>()) return e;
    *launched = true;
    if (a.tiled) count_launch(Counted::kTiledWeights);
    return launch_kernel(kernel, static_cast<unsigned>(row_blocks * per_rows), kPrefillWarps * 32, P::kSmemBytes,
                         stream, static_cast<const uint8_t*>(a.w), row_bytes, a.n, a.k, a.x, a.t, per_rows, a.y,
                         a.tiled);
}

// a's GEMV, and b's in the same launch when given (same type, k, t and activations), in tiles of kRows rows.
template <int QT, int NG, int kRows = kMmaRows>
cudaError_t launch_gemv_mma_ng(const GemvArgs& a, cudaStream_t stream, const GemvArgs* b = nullptr) {
    using S = MmaShape<QT, kRows>;
    auto kernel = gemv_mma_kernel<QT, NG, kRows>;
    // Opt in once to the dynamic size (static part[] included, the block may pass the default 48 KiB).
    if (const cudaError_t e = smem_opted_in<gemv_mma_kernel<QT, NG, kRows>, S::kSmemBytes>()) return e;
    const long long row_bytes = row_bytes_of<QT>(a.k);
    if (!tile_offsets_fit(row_bytes)) return cudaErrorInvalidValue;
    // One launch, one layout: both of a pair in the tile layout or neither (launch_gemv's check_gemv has checked
    // that each tiled matrix has one).
    if (b && a.tiled != b->tiled) return cudaErrorInvalidValue;
    if (a.tiled) count_launch(Counted::kTiledWeights);
    const int groups = (a.t + kActRows - 1) / kActRows, per_tile = (groups + NG - 1) / NG;
    const long long first = static_cast<long long>((a.n + kRows - 1) / kRows) * per_tile;
    const long long blocks = first + (b ? static_cast<long long>((b->n + kRows - 1) / kRows) * per_tile : 0);
    if (blocks > 0x7fffffffLL) return cudaErrorInvalidValue;
    GemvSecond second;
    if (b) second = {static_cast<const uint8_t*>(b->w), b->n, b->y, static_cast<int>(first)};
    return launch_kernel(kernel, static_cast<unsigned>(blocks), kGemvWarps * 32, S::kSmemBytes, stream,
                         static_cast<const uint8_t*>(a.w), row_bytes, a.n, a.k, a.x, a.t, per_tile, a.y, second,
                         a.tiled);
}

// Whether a decode call (and b, launched with it) takes half tiles: gemv_half_tiles() (gemv.cuh) says always,
// never, or "auto" (the default): where the half tiles fit one wave of the half-tile kernel's block slots (its
// occupancy, asked once, x the SM count: nothing about the GPU is compiled in) and either the type is Q6_K (the
// longest unit, so the longest chain per warp) or the 16-row grid fills less than a quarter of the 16-row
// kernel's slots. From the H200's calls alone without PDL (bench_gemv.py, OPENJET_PDL=0, 2026-12-02: in the
// step a small-grid GEMV is followed by a one-block pack, not by another GEMV whose early blocks share its SMs),
// T = 1 16-row -> half: Q6_K 17408 -> 5120 43.4 -> 37.1 us, Q6_K 5120 -> 1024 10.4 -> 6.9, Q4_K 5120 -> 1024 5.9 ->
// 5.5; lost: Q4_K 17408 -> 5120 22.0 -> 24.8, Q5_K 6144 -> 5120 12.2 -> 13.0, and every call whose half tiles
// need a second wave (Q4_K 5120 -> 6144 9.4 -> 14.0). In the 27B's step (H200, 13e6b67): T = 1 10.69 -> 10.27 ms
// (bench/results/engine-full-h200-13e6b67-half-auto.json); the first, wider rule (every one-wave call) had moved
// nothing there.
template <int QT>
bool decode_half_tiles(const GemvArgs& a, const GemvArgs* b) {
    const GemvHalfTiles mode = gemv_half_tiles();
    if (mode != GemvHalfTiles::kAuto) return mode == GemvHalfTiles::kAlways;
    struct Slots {
        long long half = 0, full = 0;  // block slots of the 8-row and the 16-row kernel; 0: unknown (16-row tiles)
    };
    static const Slots slots = [] {
        int half = 0, full = 0, sms = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&half, gemv_mma_kernel<QT, 1, 8>, kGemvWarps * 32,
                                                          MmaShape<QT, 8>::kSmemBytes) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&full, gemv_mma_kernel<QT, 1>, kGemvWarps * 32,
                                                          MmaShape<QT>::kSmemBytes) != cudaSuccess ||
            device_attribute(cudaDevAttrMultiProcessorCount, &sms) != cudaSuccess) {
            cudaGetLastError();  // not sticky
            return Slots{};
        }
        return Slots{static_cast<long long>(half) * sms, static_cast<long long>(full) * sms};
    }();
    const long long tiles = (a.n + kMmaRows - 1) / kMmaRows + (b ? (b->n + kMmaRows - 1) / kMmaRows : 0);
    const long long half_tiles = (a.n + 7) / 8 + (b ? (b->n + 7) / 8 : 0);
    return half_tiles <= slots.half && (QT == kQ6_K || 4 * tiles < slots.full);
}

// One group of 8 token rows per block, in 16-row or half tiles (decode_half_tiles): the same bits.
template <int QT>
cudaError_t launch_gemv_decode(const GemvArgs& a, cudaStream_t stream, const GemvArgs* b = nullptr) {
    if (a.tma && gemv_tma_takes(a, b)) {  // the producer-warp GEMV (gemv_tma.cuh): the same bits
        const cudaError_t e = launch_gemv_tma<QT>(a, b, stream);
        if (e != cudaErrorNotSupported) return e;
    }
    if (decode_half_tiles<QT>(a, b)) return launch_gemv_mma_ng<QT, 1, 8>(a, stream, b);
    return launch_gemv_mma_ng<QT, 1>(a, stream, b);
}

// Decode (t <= 8): one group per block. Prefill: the fast GEMM (prefill_gemm_choice(), the default), else the
// shared-activation kernel where the choice and its shared memory allow, else four groups per block (a group
// past t reads zeros and writes nothing).
template <int QT>
cudaError_t launch_gemv_mma_impl(const GemvArgs& a, cudaStream_t stream) {
    if (a.t <= kActRows && !a.prefill) return launch_gemv_decode<QT>(a, stream);  // decode: no environment read
    const PrefillGemm choice = prefill_gemm_choice();
    if (fast_prefill_call(a, choice)) {
        GemvArgs g = a;
        if (choice != PrefillGemm::kDense) g.dense = nullptr;  // scratch given, but "fast" asked for
        return launch_prefill_gemm(g, stream);
    }
    if (a.t <= kActRows) return launch_gemv_decode<QT>(a, stream);
    if (choice != PrefillGemm::kGrouped) {
        bool launched = false;
        const cudaError_t e = launch_prefill_mma<QT>(a, stream, choice == PrefillGemm::kShared, &launched);
        if (e != cudaSuccess || launched) return e;
    }
    return launch_gemv_mma_ng<QT, kPrefillGroups>(a, stream);
}

}  // namespace openjet

// Defines launch_gemv_mma<QT> in the including file.
#define OPENJET_GEMV_MMA_INSTANCE(QT)                                                                 \
    namespace openjet {                                                                              \
    template <>                                                                                      \
    cudaError_t launch_gemv_mma<QT>(const GemvArgs& a, cudaStream_t stream) {                        \
        return launch_gemv_mma_impl<QT>(a, stream);                                                  \
    }                                                                                                \
    template <>                                                                                      \
    cudaError_t launch_gemv_mma_pair<QT>(const GemvArgs& a, const GemvArgs& b, cudaStream_t stream) { \
        return launch_gemv_decode<QT>(a, stream, &b); /* b's tiles after a's (launch_gemv_pair) */     \
    }                                                                                                \
    }
