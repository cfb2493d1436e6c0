// launch_prefill_gemm (prefill_gemm.cuh): the fp16-dequantised-weight GEMM of a prefill chunk.
//
// Block = kBM weight rows x BN tokens, 8 warps: BN = 128 as 2 (rows) x 4 (tokens) of 64 x 32 (4 x 4 mma tiles,
// 64 fp32 accumulators a thread); BN = 64, for calls of up to 64 rows and grids under a wave of 128-token tiles
// (the n = 5120 projections of a 512-row chunk: 160 blocks), as 4 x 2 of 32 x 32; BN = 16, for calls of up to 16
// rows (a prompt's short last chunk, the one-token prefill of a regenerated answer), as 8 x 1 of 16 x 16: the
// mma work of 16 tokens instead of 128 (H200, one-row lm_head call with 128-token tiles: 2.9 ms against decode's
// 0.6). k in steps of kBK = 64. Per step:
// - A: thread (row, half) holds the raw bytes of its row's next step in registers (loaded a step ahead: FastA
//   per weight type) and dequantises its half of the step, 32 weights, into the shared tile, double-buffered;
// - B: the tokens' 64 activations of the step arrive by cp.async, kStagesB deep;
// - each warp runs ldmatrix + its 64 (BN = 64: 32; BN = 16: 8) mma.
// Both tiles keep the pack's element order (each aligned quad stored 0, 2, 1, 3: act_pack.cuh), so the k slots
// of A and B match without a permutation; rows are kLd = 72 halves apart, so ldmatrix's 8 rows of 16 bytes
// fall on 8 different bank groups. Rows past n read row 0 and tokens past t read token t - 1; neither is stored.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cp_async.cuh"
#include "dense_gemm.cuh"
#include "device_attr.cuh"
#include "elementwise.cuh"
#include "kquant.cuh"
#include "launch_count.h"
#include "mma_f16.cuh"
#include "pdl.cuh"
#include "prefill_gemm.cuh"
#include "row_bound.cuh"
#include "weight_layout.cuh"

namespace openjet {
namespace {

constexpr int kBM = 128, kBK = 64;  // block tile: weight rows, k per step (tokens: BN)
constexpr int kThreads = 256;       // 8 warps; thread = (A row, half) of the dequantisation
constexpr int kStagesB = 3;
constexpr int kLd = kBK + 8;        // halves per tile row in shared memory
static_assert(kThreads == 2 * kBM, "one thread per A row half");

// The block's shape for BN tokens: warps along rows x tokens, each warp's tile, shared memory.
template <int BN> struct FastShape {
    static constexpr int kWarpsN = BN == 128 ? 4 : BN == 64 ? 2 : 1, kWarpsM = 8 / kWarpsN;
    static constexpr int kWarpRows = kBM / kWarpsM, kMt = kWarpRows / 16;  // mma row tiles a warp
    static constexpr int kWarpToks = BN / kWarpsN, kNt = kWarpToks / 8;    // mma token tiles a warp
    static constexpr int kATile = kBM * kLd, kBTile = BN * kLd;            // halves
    static constexpr int kSmemBytes = (2 * kATile + kStagesB * kBTile) * 2;  // BN 128: 92,160; 64: 64,512; 16: 43,776
    static constexpr int kChunksB = BN * kBK / 8;  // 16-byte copies of a B stage
    static_assert((BN == 128 || BN == 64 || BN == 16) && kWarpToks % 16 == 0 && kNt % 2 == 0,
                  "B by ldmatrix.x4 of 16 tokens");
};

// fp16x2 (a, a) as a 32-bit word.
__device__ __forceinline__ uint32_t h2_bits(__half a) {
    const __half2 h = __half2half2(a);
    return *reinterpret_cast<const uint32_t*>(&h);
}

// Each weight type's side of A: Raw, what a thread holds of its row for one k step (loaded a step ahead, in
// registers); load(row, s, half); store(raw, row, s, half, dst): the 32 weights of the thread's half of step s (its
// elements 32 half .. 32 half + 31) in the pack's order to dst (64 bytes), as words(i, o) gives them: code word i
// (elements 4i .. 4i + 3 of the half) -> o[0] = (w0, w2), o[1] = (w1, w3).
template <class Words> __device__ __forceinline__ void store_half(const Words& words, uint4* dst) {
#pragma unroll
    for (int hq = 0; hq < 2; ++hq) {  // 4 code words (8 output words, two 16-byte stores) at a time: fewer registers
        uint32_t o[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) words(4 * hq + i, &o[2 * i]);
        dst[2 * hq] = make_uint4(o[0], o[1], o[2], o[3]);
        dst[2 * hq + 1] = make_uint4(o[4], o[5], o[6], o[7]);
    }
}

template <int QT> struct FastA;

// Q4_K / Q5_K: w = fp16(q ds - dm), ds = fp16(d sc), dm = fp16(dmin m) of sub-block 2 (s % 4) + half; step s is
// block s / 4, elements 64 (s % 4) .. + 63: the low (half 0) or high (half 1) nibbles of qs bytes 32 (s % 4) ..
// + 31, and for Q5_K bit 2 (s % 4) + half of each qh byte as the fifth bit.
template <int QT> struct FastAK4 {
    static constexpr bool kQ5 = QT == kQ5_K;
    static constexpr int kQs = kQ5 ? 48 : 16;
    struct Raw {
        uint4 hdr, q0, q1, h0, h1;  // h0, h1: Q5_K's qh (unused for Q4_K)
    };
    __device__ __forceinline__ static Raw load(const uint8_t* row, int unit, int s, int) {
        const uint8_t* blk = row + (s >> 2) * unit;
        const uint8_t* q = blk + kQs + 32 * (s & 3);
        Raw r;
        r.hdr = __ldg(reinterpret_cast<const uint4*>(blk));
        r.q0 = __ldg(reinterpret_cast<const uint4*>(q));
        r.q1 = __ldg(reinterpret_cast<const uint4*>(q + 16));
        if constexpr (kQ5) {
            r.h0 = __ldg(reinterpret_cast<const uint4*>(blk + 16));
            r.h1 = __ldg(reinterpret_cast<const uint4*>(blk + 32));
        }
        return r;
    }
    __device__ __forceinline__ static void store(const Raw& r, const uint8_t*, int, int s, int half, uint4* dst) {
        const __half2 dd = *reinterpret_cast<const __half2*>(&r.hdr.x);  // (d, dmin)
        const int sb = 2 * (s & 3) + half;
        int sc, m;
        k4_scale_min_words(r.hdr.y, r.hdr.z, r.hdr.w, sb, sc, m);
        const uint32_t ds = h2_bits(__float2half_rn(__low2float(dd) * static_cast<float>(sc)));
        const uint32_t ndm = h2_bits(__float2half_rn(-(__high2float(dd) * static_cast<float>(m))));
        const int sh = 4 * half;  // the high nibbles moved down
        store_half([&](int i, uint32_t* o) {
            const uint32_t v = (&(i < 4 ? r.q0 : r.q1).x)[i & 3] >> sh;
            uint32_t hb02 = 0, hb13 = 0;  // Q5_K: the fifth bits, at bit 4 of bytes 0 and 2
            if constexpr (kQ5) {
                const uint32_t h = (&(i < 4 ? r.h0 : r.h1).x)[i & 3] >> sb;
                hb02 = (h & 0x00010001u) << 4;
                hb13 = ((h >> 8) & 0x00010001u) << 4;
            }
            const uint32_t q02 = hsub2_u((v & 0x000F000Fu) | hb02 | kMagic, kMagic);          // (q0, q2) exactly
            const uint32_t q13 = hsub2_u(((v >> 8) & 0x000F000Fu) | hb13 | kMagic, kMagic);   // (q1, q3)
            o[0] = hfma2_u(q02, ds, ndm);  // fp16(q ds - dm), one rounding
            o[1] = hfma2_u(q13, ds, ndm);
        }, dst);
    }
};
template <> struct FastA<kQ4_K> : FastAK4<kQ4_K> {};
template <> struct FastA<kQ5_K> : FastAK4<kQ5_K> {};

// N aligned 32-bit words from the word holding p on (p 2-byte aligned: Q6_K blocks are 210 bytes); the bytes from
// p on are then funnel(w, i, 8 (p % 4)).
template <int N> __device__ __forceinline__ void load_words(const uint8_t* p, uint32_t (&w)[N]) {
    const uint32_t* a = reinterpret_cast<const uint32_t*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(3));
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = __ldg(a + i);
}
// The shift that takes the word holding p down to p's byte.
__device__ __forceinline__ int shift(const uint8_t* p) {
    return 8 * static_cast<int>(reinterpret_cast<uintptr_t>(p) & 3);
}
template <int N> __device__ __forceinline__ uint32_t funnel(const uint32_t (&w)[N], int i, int sh) {
    return __funnelshift_r(w[i], w[i + 1], sh);
}

// Q6_K: w = fp16((q - 32) ds), ds = fp16(d sc) of the element's 16-element sub-block. Step s is block s / 4,
// elements 64 (s % 4) .. + 63, which ggml's layout takes from the 128-element half n = (s % 4) / 2: element
// 128 n + 32 p + l (p = 2 ((s % 4) % 2) + half, l < 32) has its low 4 bits in ql[64 n + 32 (p % 2) + l] (nibble
// p / 2), its high 2 bits at bits 2p of qh[32 n + l] and its scale in sc[8 n + 2p + l / 16].
template <> struct FastA<kQ6_K> {
    struct Raw {
        uint32_t ql[9], qh[9], sc, d;
    };
    struct Where {  // byte addresses of a thread's step
        const uint8_t *ql, *qh, *sc, *d;
        int p;
        __device__ __forceinline__ Where(const uint8_t* row, int unit, int s, int half) {
            const uint8_t* blk = row + (s >> 2) * unit;
            const int n = (s & 3) >> 1;
            p = 2 * (s & 1) + half;
            ql = blk + 64 * n + 32 * half;
            qh = blk + 128 + 32 * n;
            sc = blk + 192 + 8 * n + 2 * p;
            d = blk + 208;
        }
    };
    __device__ __forceinline__ static Raw load(const uint8_t* row, int unit, int s, int half) {
        const Where at(row, unit, s, half);
        Raw r;
        load_words(at.ql, r.ql);
        load_words(at.qh, r.qh);
        r.sc = __ldg(reinterpret_cast<const uint32_t*>(reinterpret_cast<uintptr_t>(at.sc) & ~uintptr_t(3)));
        r.d = __ldg(reinterpret_cast<const uint32_t*>(reinterpret_cast<uintptr_t>(at.d) & ~uintptr_t(3)));
        return r;
    }
    __device__ __forceinline__ static void store(const Raw& r, const uint8_t* row, int unit, int s, int half,
                                                 uint4* dst) {
        constexpr uint32_t k1056 = 0x64206420u;  // fp16x2 (1024 + 32, 1024 + 32)
        const Where at(row, unit, s, half);
        const int sh_ql = shift(at.ql), sh_qh = shift(at.qh), nib = 4 * (s & 1), hsh = 2 * at.p;
        const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(r.d >> shift(at.d))));
        const uint32_t scw = r.sc >> shift(at.sc);
        const uint32_t ds0 = h2_bits(__float2half_rn(d * static_cast<float>(static_cast<int8_t>(scw & 0xFF))));
        const uint32_t ds1 = h2_bits(__float2half_rn(d * static_cast<float>(static_cast<int8_t>((scw >> 8) & 0xFF))));
        store_half([&](int i, uint32_t* o) {
            const uint32_t v = funnel(r.ql, i, sh_ql) >> nib, h = funnel(r.qh, i, sh_qh) >> hsh;
            const uint32_t q02 = hsub2_u((v & 0x000F000Fu) | ((h & 0x00030003u) << 4) | kMagic, k1056);  // q - 32
            const uint32_t q13 = hsub2_u(((v >> 8) & 0x000F000Fu) | (((h >> 8) & 0x00030003u) << 4) | kMagic, k1056);
            const uint32_t ds = i < 4 ? ds0 : ds1;  // elements l < 16: the first scale
            o[0] = hfma2_u(q02, ds, 0x80008000u);  // fp16((q - 32) ds), one rounding (+ -0 changes nothing)
            o[1] = hfma2_u(q13, ds, 0x80008000u);
        }, dst);
    }
};

// Q8_0: w = fp16(q d), the code exact in fp16, one rounding. Step s is blocks 2 (s % 4) and 2 (s % 4) + 1 of unit
// s / 4 (eight 34-byte blocks); a thread's half is one block, 2-byte aligned: its d, then its 32 codes from the word
// holding byte 2 on (the words of a block that starts on a word run one word into the next block, which then lies
// in the same unit: a unit's last block starts off a word, since a unit's 272 bytes start on one).
template <> struct FastA<kQ8_0> {
    struct Raw {
        uint32_t q[9], d;
    };
    __device__ __forceinline__ static const uint8_t* block(const uint8_t* row, int unit, int s, int half) {
        return row + (s >> 2) * unit + (2 * (s & 3) + half) * Block<kQ8_0>::kBytes;
    }
    __device__ __forceinline__ static Raw load(const uint8_t* row, int unit, int s, int half) {
        const uint8_t* b = block(row, unit, s, half);
        const uint32_t* q = reinterpret_cast<const uint32_t*>(reinterpret_cast<uintptr_t>(b + 2) & ~uintptr_t(3));
        Raw r;
#pragma unroll
        for (int i = 0; i < 8; ++i) r.q[i] = __ldg(q + i);
        r.q[8] = shift(b + 2) ? __ldg(q + 8) : 0u;  // within the unit (above)
        r.d = __ldg(reinterpret_cast<const uint32_t*>(reinterpret_cast<uintptr_t>(b) & ~uintptr_t(3)));
        return r;
    }
    __device__ __forceinline__ static void store(const Raw& r, const uint8_t* row, int unit, int s, int half,
                                                 uint4* dst) {
        constexpr uint32_t k1152 = 0x64806480u;  // fp16x2 (1024 + 128, 1024 + 128)
        const uint8_t* b = block(row, unit, s, half);
        const int sh = shift(b + 2);
        const uint32_t d2 = h2_bits(__ushort_as_half(static_cast<unsigned short>(r.d >> shift(b))));
        store_half([&](int i, uint32_t* o) {
            const uint32_t v = funnel(r.q, i, sh) ^ 0x80808080u;  // each code + 128, as an unsigned byte
            const uint32_t q02 = hsub2_u((v & 0x00FF00FFu) | kMagic, k1152);         // (q0, q2) exactly
            const uint32_t q13 = hsub2_u(((v >> 8) & 0x00FF00FFu) | kMagic, k1152);  // (q1, q3)
            o[0] = hfma2_u(q02, d2, 0x80008000u);  // fp16(q d), one rounding (+ -0 changes nothing)
            o[1] = hfma2_u(q13, d2, 0x80008000u);
        }, dst);
    }
};

// The dense path's first half (OPENJET_PREFILL_GEMM=dense, dense_gemm.cuh): W as fp16 rows [n, k], each weight
// exactly as the fast kernel's A tile holds it (FastA, the pack's element order). Thread i = (row, 32-element half
// step) makes the 64 bytes at 64 i of w16 (row k + 32 half-steps = 32 i halves), so a warp's output is 2 KB in one
// piece: its 32 pieces meet in shared memory and leave as 16-byte stores of consecutive lanes, 512 contiguous bytes
// a store instruction. (Each thread storing its own 64 bytes, 32 pieces 64 bytes apart an instruction, ran at ~1.9
// TB/s: H200, a 4,096-row chunk of the 27B, ncu: the FFN gate's Q4_K 121 -> 58 us, its Q6_K down 112 -> 71, the
// prefill 8,306 -> 8,548 tok/s, bench/results/engine-full-h200-e792017-*.json.)
// ld16: halves from one output row to the next (k: rows packed, the warp's 2 KB in one piece; 2k: every other row,
// launch_gate_up_pack_t's interleaving), a thread's 64 bytes always within one row (k % 256 == 0).
template <int QT>
__global__ void __launch_bounds__(256) dequant_f16_kernel(const uint8_t* __restrict__ w, long long row_bytes, int n,
                                                          int k, __half* __restrict__ w16, long long ld16,
                                                          bool tiled) {
    using A = FastA<QT>;
    __shared__ uint4 stage[256 / 32][32 * 4];  // a warp's 32 x 64 bytes
    pdl_start();  // w16 may still be read by the GEMM before this kernel (the previous projection's)
    const long long halves_per_row = k / 32, total = halves_per_row * n;
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int row = 0, hs = 0;
    if (i < total) {
        row = static_cast<int>(i / halves_per_row), hs = static_cast<int>(i % halves_per_row);
        const int s = hs >> 1, half = hs & 1;
        const WeightSteps step(row_bytes, unit_bytes_of<QT>(), tiled, row);  // either layout (weight_layout.cuh)
        const uint8_t* wrow = w + step.start;
        A::store(A::load(wrow, step.unit, s, half), wrow, step.unit, s, half, &stage[warp][4 * lane]);
    }
    __syncwarp();
    const long long first = i - lane;  // the warp's first thread
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int c = 32 * j + lane, owner = c / 4;  // 16-byte piece c % 4 of lane owner's 64 bytes
        const int orow = __shfl_sync(0xffffffffu, row, owner), ohs = __shfl_sync(0xffffffffu, hs, owner);
        if (first + owner < total)
            reinterpret_cast<uint4*>(w16 + orow * ld16 + 32 * ohs)[c % 4] = stage[warp][c];
    }
}

// W into a.dense as fp16 rows, ld16 halves apart (a.k: packed rows).
template <int QT> cudaError_t launch_dequant_t(const GemvArgs& a, cudaStream_t stream, long long ld16) {
    const long long threads = static_cast<long long>(a.n) * (a.k / 32);
    if (a.tiled) count_launch(Counted::kTiledWeights);
    return launch_kernel(dequant_f16_kernel<QT>, dim3(static_cast<unsigned>((threads + 255) / 256)), 256, 0, stream,
                         static_cast<const uint8_t*>(a.w), row_bytes_of<QT>(a.k), a.n, a.k, a.dense, ld16,
                         a.tiled);
}


// kSwiglu (launch_ffn_gate_up_pack): w the FFN's gate, w_up its up (one type and shape, n rows each) and the
// tile's rows the two interleaved in groups of 8: tile row r is gate row (r / 16) 8 + r % 8 where r % 16 < 8, else
// that up row. An mma's C fragment holds rows g and g + 8 of its 16, so each thread holds the gate output of an
// (output row, token) and its up output, and writes y[t, n] = swiglu1(gate, up) of the two products as
// launch_prefill_gemm stores them: the bits of the two GEMMs and launch_swiglu_pack's swiglu.
template <int QT, int BN, bool kSwiglu>
__global__ void __launch_bounds__(kThreads, BN == 128 ? 2 : 3)
prefill_gemm_kernel(const uint8_t* __restrict__ w, const uint8_t* __restrict__ w_up, long long row_bytes, int n,
                    int k, ActPack x, int t, float* __restrict__ y, bool tiled) {
    using A = FastA<QT>;
    using S = FastShape<BN>;
    constexpr int kTileHalves = S::kATile;
    extern __shared__ uint4 smem[];
    __half* as = reinterpret_cast<__half*>(smem);  // [2][kBM][kLd]
    __half* bs = as + 2 * kTileHalves;             // [kStagesB][BN][kLd]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int col0 = blockIdx.x * BN, row0 = blockIdx.y * kBM;  // consecutive blocks share the weight tile
    const int steps = k / kBK;

    const int arow = tid >> 1, ahalf = tid & 1;  // this thread's A row half
    const int r = row0 + arow, wr = kSwiglu ? (r >> 4) * 8 + (r & 7) : r;  // its row of w (or of w_up)
    const WeightSteps step(row_bytes, unit_bytes_of<QT>(), tiled, wr < n ? wr : 0);  // either layout
    const uint8_t* wrow = (kSwiglu && (r & 8) ? w_up : w) + step.start;
    const int unit = step.unit;
    __half* adst = as + arow * kLd + 32 * ahalf;
    const auto store_a = [&](const typename A::Raw& r, int s) {
        A::store(r, wrow, unit, s, ahalf, reinterpret_cast<uint4*>(adst + (s & 1) * kTileHalves));
    };
    const auto load_b = [&](int s) {  // BN tokens x 64 halves: BN * 8 chunks of 16 bytes
        __half* stage = bs + (s % kStagesB) * S::kBTile;
#pragma unroll
        for (int i = 0; i < (S::kChunksB + kThreads - 1) / kThreads; ++i) {
            const int c = tid + kThreads * i, r = c >> 3, part = c & 7;
            if (S::kChunksB % kThreads != 0 && c >= S::kChunksB) break;  // BN = 16: half the threads copy
            const long long tok = min(col0 + r, t - 1);
            cp_async16(stage + r * kLd + 8 * part, x.h + tok * k + static_cast<long long>(s) * kBK + 8 * part);
        }
    };

    pdl_start();  // pdl.cuh: the activations are the previous kernel's
#pragma unroll
    for (int s = 0; s < kStagesB - 1; ++s) {
        if (s < steps) load_b(s);
        cp_async_commit();
    }
    typename A::Raw raw = A::load(wrow, unit, 0, ahalf);
    store_a(raw, 0);
    if (steps > 1) raw = A::load(wrow, unit, 1, ahalf);

    const int wm = warp / S::kWarpsN, wn = warp % S::kWarpsN;  // warp tile: rows kWarpRows wm.., tokens kWarpToks wn..
    float acc[S::kMt][S::kNt][4] = {};
    // ldmatrix rows: A lanes 0-15 rows 0-15 at k 0, lanes 16-31 the same rows at k 8; B lanes 0-7 tokens 0-7 at
    // k 0, 8-15 tokens 0-7 at k 8, 16-23 tokens 8-15 at k 0, 24-31 tokens 8-15 at k 8.
    const int a_off = (S::kWarpRows * wm + (lane & 15)) * kLd + 8 * (lane >> 4);
    const int b_off = (S::kWarpToks * wn + (lane & 7) + 8 * (lane >> 4)) * kLd + 8 * ((lane >> 3) & 1);
#pragma unroll 1
    for (int s = 0; s < steps; ++s) {
        cp_async_wait<kStagesB - 2>();
        __syncthreads();  // A tile s and B stage s are complete; every warp is past step s - 1's reads
        if (s + kStagesB - 1 < steps) load_b(s + kStagesB - 1);
        cp_async_commit();
        const __half* at = as + (s & 1) * kTileHalves + a_off;
        const __half* bt = bs + (s % kStagesB) * S::kBTile + b_off;
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
            uint32_t a[S::kMt][4], b[S::kNt / 2][4];
#pragma unroll
            for (int mt = 0; mt < S::kMt; ++mt) ldmatrix_x4(a[mt], at + mt * 16 * kLd + 16 * kk);
#pragma unroll
            for (int np = 0; np < S::kNt / 2; ++np) ldmatrix_x4(b[np], bt + np * 16 * kLd + 16 * kk);
#pragma unroll
            for (int mt = 0; mt < S::kMt; ++mt)
#pragma unroll
                for (int nt = 0; nt < S::kNt; ++nt) {
                    const uint32_t bb[2] = {b[nt >> 1][2 * (nt & 1)], b[nt >> 1][2 * (nt & 1) + 1]};
                    mma_16816(acc[mt][nt], a[mt], bb);
                }
        }
        if (s + 1 < steps) {  // the other A buffer: every warp finished reading it (step s - 1) at the barrier
            store_a(raw, s + 1);
            if (s + 2 < steps) raw = A::load(wrow, unit, s + 2, ahalf);
        }
    }
    cp_async_wait<0>();

#pragma unroll
    for (int mt = 0; mt < S::kMt; ++mt)
#pragma unroll
        for (int nt = 0; nt < S::kNt; ++nt)
#pragma unroll
            for (int c = 0; c < (kSwiglu ? 2 : 4); ++c) {
                const int tile_row = row0 + S::kWarpRows * wm + 16 * mt;  // a multiple of 16
                const int row = kSwiglu ? tile_row / 2 + g : tile_row + g + 8 * (c >> 1);
                const int tok = col0 + S::kWarpToks * wn + 8 * nt + 2 * tq + (c & 1);
                if (row < n && tok < t) {
                    const float inv = x.inv[tok];
                    y[static_cast<long long>(tok) * n + row] =
                        kSwiglu ? swiglu1(__fmul_rn(acc[mt][nt][c], inv), __fmul_rn(acc[mt][nt][c + 2], inv))
                                : __fmul_rn(acc[mt][nt][c], inv);
                }
            }
}

// Tile rows of the call: n (kSwiglu: 2 n, gate and up interleaved).
template <int QT, int BN, bool kSwiglu>
cudaError_t launch_prefill_gemm_bn(const GemvArgs& a, const void* w_up, long long row_blocks, cudaStream_t stream) {
    using S = FastShape<BN>;
    if (const cudaError_t e = smem_opted_in<prefill_gemm_kernel<QT, BN, kSwiglu>, S::kSmemBytes>()) return e;
    const long long row_bytes = row_bytes_of<QT>(a.k);
    if (a.tiled) count_launch(Counted::kTiledWeights);
    return launch_kernel(prefill_gemm_kernel<QT, BN, kSwiglu>,
                         dim3((a.t + BN - 1) / BN, static_cast<unsigned>(row_blocks)), kThreads, S::kSmemBytes, stream,
                         static_cast<const uint8_t*>(a.w), static_cast<const uint8_t*>(w_up), row_bytes, a.n, a.k,
                         a.x, a.t, a.y, a.tiled);
}

// Where the caller gave scratch, the call has kDenseMinRows rows or more and the dense GEMM takes W
// (prefill_dense_takes): dequantise, then the dense GEMM.
// Otherwise 16-token tiles for calls of up to 16 rows, 64 for up to 64 rows or where 128-token tiles do not fill one wave
// of 2 blocks per SM (the 64-token kernel's 63 KB of shared memory fit 3): n = 5120 or 6144 at 512 rows; else
// 128. An output's bits do not depend on the tile (the same chain over k).
// kSwiglu: the tile rows of gate (a) and up (w_up) interleaved, y = swiglu of the two (the kernel above).
template <int QT, bool kSwiglu = false>
cudaError_t launch_fast_t(const GemvArgs& a, const void* w_up, cudaStream_t stream) {
    const long long row_blocks = ((kSwiglu ? 2LL : 1LL) * a.n + kBM - 1) / kBM;
    if (row_blocks > 65535) return cudaErrorInvalidValue;  // gridDim.y
    int sms = 0;
    if (const cudaError_t e = device_attribute(cudaDevAttrMultiProcessorCount, &sms)) return e;
    if (a.t <= 16) return launch_prefill_gemm_bn<QT, 16, kSwiglu>(a, w_up, row_blocks, stream);
    if (a.t <= 64 || row_blocks * ((a.t + 127) / 128) < 2LL * sms)
        return launch_prefill_gemm_bn<QT, 64, kSwiglu>(a, w_up, row_blocks, stream);
    return launch_prefill_gemm_bn<QT, 128, kSwiglu>(a, w_up, row_blocks, stream);
}

// The dense path: W's fp16 rows kept by the engine (a.w16), or W dequantised into a.dense first; then the dense GEMM
// (dense_gemm.cuh), adding to y where a.add_to_y.
template <int QT> cudaError_t launch_prefill_gemm_t(const GemvArgs& a, cudaStream_t stream) {
    if (a.dense && a.t >= kDenseMinRows && prefill_dense_takes(QT, a.n, a.k)) {
        const __half* w16 = a.dense;
        if (a.w16 && a.ld16 == a.k) {  // kept by the engine: no dequantisation
            count_launch(Counted::kPrefillF16Kept);
            w16 = a.w16;
        } else if (const cudaError_t e = launch_dequant_t<QT>(a, stream, a.k)) {
            return e;
        }
        return a.add_to_y ? launch_dense_gemm_add(w16, a.n, a.k, a.x, a.t, a.y, stream)
                          : launch_dense_gemm(w16, a.n, a.k, a.x, a.t, a.y, stream);
    }
    if (a.add_to_y) return cudaErrorInvalidValue;  // only the dense GEMM adds (prefill_gemm_adds)
    return launch_fast_t<QT>(a, nullptr, stream);
}

// OPENJET_PREFILL_FFN_FUSED: unset or 1 (the default), a prefill's gate and up in one GEMM; 0: two.
bool gate_up_in_one_gemm() {
    const char* v = std::getenv("OPENJET_PREFILL_FFN_FUSED");
    return !(v && std::strcmp(v, "0") == 0);
}

// --------------------------------------------------------------------------------------- the FFN's bounded form
// (its row scales: row_bound.cuh)
// launch_gate_up_pack_order's swap, a block per quad q of pair slots: slots 4q + 1 and 4q + 2 exchanged.
__global__ void __launch_bounds__(256) gate_up_pack_order_kernel(__half* w16, int k) {
    __half2* quad = reinterpret_cast<__half2*>(w16 + 4LL * blockIdx.x * 2 * k);  // 4 slots of 2k halves: k half2 each
    for (long long i = threadIdx.x; i < k; i += 256) {
        const __half2 a = quad[k + i];
        quad[k + i] = quad[2LL * k + i];
        quad[2LL * k + i] = a;
    }
}

// launch_ffn_gate_up_pack's one GEMM for one weight type.
template <int QT>
cudaError_t launch_gate_up_pack_t(const GemvArgs& gate, const GemvArgs& up, const ActPack& out, cudaStream_t stream,
                                  const FfnHalfOut* half, bool* wrote_half) {
    const int n = gate.n, k = gate.k, t = gate.t;
    const PrefillSwiglu mode = prefill_swiglu();
    // the kept rows' bounded form: its row scales first, for every size of call (a row's bits its own)
    const bool bounded = half && gate.w16 && gate.w16_norms && mode == PrefillSwiglu::kEpilogue;
    if (bounded)
        if (const cudaError_t e = launch_ffn_row_scale(gate.x, k, t, gate.w16_norms, half->s, half->inv, stream))
            return e;
    GemvArgs both = gate;  // gate and up as one [2n, k] matrix
    both.n = 2 * n;
    if (prefill_dense_runs(both)) {
        // One [2n, k] fp16 matrix: with the swiglu epilogue gate and up rows interleaved (gate row j at 2j, up's at
        // 2j + 1) for one GEMM that writes silu(g) u into y [t, n], then the pack of those rows; else [gate; up] for
        // one GEMM into y [t, 2n] and the swiglu pack over its halves.
        // The interleaved matrix kept by the engine (GemvArgs::w16, in the pack's order with its norms) takes the
        // fp16 form where the caller gave its destination; otherwise the rows are dequantised here.
        const bool epilogue = mode == PrefillSwiglu::kEpilogue || mode == PrefillSwiglu::kEpilogueF32;
        if (bounded && half->direct && gate.ld16 == 2LL * k && up.w16 == gate.w16 + k && up.ld16 == 2LL * k) {
            count_launch(Counted::kPrefillF16Kept);
            if (const cudaError_t e =
                    launch_dense_gemm_swiglu_half(gate.w16, n, k, gate.x, t, half->s, half->h, stream))
                return e;
            *wrote_half = true;
            return cudaSuccess;
        }
        for (const GemvArgs* m : {&gate, &up}) {  // the kept rows are in the pack's order: the other forms' own
            GemvArgs d = *m;
            d.dense = gate.dense + (m == &up ? (epilogue ? k : static_cast<long long>(n) * k) : 0);
            if (const cudaError_t e = launch_dequant_t<QT>(d, stream, epilogue ? 2LL * k : k)) return e;
        }
        if (epilogue) {
            if (const cudaError_t e = launch_dense_gemm_swiglu(gate.dense, n, k, gate.x, t, gate.y, stream)) return e;
            return launch_pack_rows_streamed(gate.y, t, n, out, stream, bounded ? half->s : nullptr);
        }
        if (const cudaError_t e = launch_dense_gemm(gate.dense, 2 * n, k, gate.x, t, gate.y, stream)) return e;
        return launch_swiglu_pack(gate.y, gate.y + n, t, n, out, stream, 2LL * n);
    }
    if (const cudaError_t e = launch_fast_t<QT, true>(gate, up.w, stream)) return e;
    if (bounded) return launch_pack_rows_streamed(gate.y, t, n, out, stream, half->s);
    return launch_pack_act(gate.y, t, n, nullptr, 0.0f, out, stream);
}

}  // namespace

bool prefill_gemm_takes(int qtype) {
    return qtype == kQ4_K || qtype == kQ5_K || qtype == kQ6_K || qtype == kQ8_0;
}

bool prefill_dense_takes(int qtype, int n, int k) {
    return prefill_gemm_takes(qtype) && k % kGemvUnit == 0 && dense_gemm_shape_ok(n, k) && dense_gemm_available();
}

cudaError_t launch_dequant_f16(const GemvArgs& a, __half* w16, long long ld16, cudaStream_t stream) {
    if (!prefill_gemm_takes(a.qtype) || !a.w || !w16 || a.n < 1 || a.k < 1 || a.k % kGemvUnit || ld16 < a.k ||
        (a.tiled && !tile_layout_fits(a.qtype, a.n, a.k)))
        return cudaErrorInvalidValue;
    GemvArgs d = a;
    d.dense = w16;
    switch (a.qtype) {
        case kQ4_K: return launch_dequant_t<kQ4_K>(d, stream, ld16);
        case kQ5_K: return launch_dequant_t<kQ5_K>(d, stream, ld16);
        case kQ6_K: return launch_dequant_t<kQ6_K>(d, stream, ld16);
        default: return launch_dequant_t<kQ8_0>(d, stream, ld16);
    }
}

cudaError_t launch_ffn_gate_up_pack(const GemvArgs& gate, const GemvArgs& up, const ActPack& out,
                                    cudaStream_t stream, const FfnHalfOut* half, bool* wrote_half) {
    bool ignored = false;
    if (!wrote_half) wrote_half = &ignored;
    *wrote_half = false;
    // one GEMM: prefill rows (checked first: a decode step reads no environment here), one type and shape the
    // prefill GEMM takes, its numerics, the switch
    const bool one = gate.prefill && up.prefill && gate.qtype == up.qtype && prefill_gemm_takes(gate.qtype) &&
                     gate.n == up.n && gate.k == up.k && gate.t == up.t && gate.tiled == up.tiled &&
                     gate.x.h == up.x.h && gate.x.inv == up.x.inv && gate.k % kGemvUnit == 0 && gate.t >= 1 &&
                     gate.t <= gate.x.rows && gate.x.h && gate.x.inv && gate.y && gate.w && up.w &&
                     prefill_numerics_own() && gate_up_in_one_gemm();
    if (!one) {
        if (const cudaError_t e = launch_gemv_pair(gate, up, stream)) return e;
        return launch_swiglu_pack(gate.y, up.y, gate.t, gate.n, out, stream);
    }
    if (!act_pack_plain(out)) return cudaErrorNotSupported;  // (the one GEMM's pack has no integer twin)
    count_launch(Counted::kPrefillGateUp);
    switch (gate.qtype) {
        case kQ4_K: return launch_gate_up_pack_t<kQ4_K>(gate, up, out, stream, half, wrote_half);
        case kQ5_K: return launch_gate_up_pack_t<kQ5_K>(gate, up, out, stream, half, wrote_half);
        case kQ6_K: return launch_gate_up_pack_t<kQ6_K>(gate, up, out, stream, half, wrote_half);
        default: return launch_gate_up_pack_t<kQ8_0>(gate, up, out, stream, half, wrote_half);
    }
}

bool prefill_dense_runs(const GemvArgs& a) {  // the cheap tests first: a decode call reads no environment
    return a.dense && a.t >= kDenseMinRows && (a.prefill || a.t > kActRows) && prefill_gemm_dense() &&
           prefill_dense_takes(a.qtype, a.n, a.k);
}

cudaError_t launch_gate_up_pack_order(__half* w16, int n, int k, float* norms, cudaStream_t stream) {
    if (!w16 || !norms || n < 4 || n % 4 || k < 2 || k % 2) return cudaErrorInvalidValue;
    for (int m = 0; m < 2; ++m)  // gate's rows (slots' first halves), then up's: the largest is the same in any order
        if (const cudaError_t e = launch_row_norm_max(w16 + m * k, n, k, 2LL * k, norms + m, stream)) return e;
    return launch_kernel(gate_up_pack_order_kernel, n / 4, 256, 0, stream, w16, k);
}

cudaError_t launch_prefill_gemm(const GemvArgs& a, cudaStream_t stream) {
    if (!prefill_gemm_takes(a.qtype) || a.t < 1 || a.t > a.x.rows || a.k % kGemvUnit || !a.x.h || !a.x.inv || !a.y ||
        (a.tiled && !tile_layout_fits(a.qtype, a.n, a.k)))
        return cudaErrorInvalidValue;
    switch (a.qtype) {
        case kQ4_K: return launch_prefill_gemm_t<kQ4_K>(a, stream);
        case kQ5_K: return launch_prefill_gemm_t<kQ5_K>(a, stream);
        case kQ6_K: return launch_prefill_gemm_t<kQ6_K>(a, stream);
        default: return launch_prefill_gemm_t<kQ8_0>(a, stream);
    }
}

}  // namespace openjet
