// launch_prefill_gemm_q4_k (prefill_gemm.cuh): the fp16-dequantised-weight GEMM of a prefill chunk.
//
// Block = kBM weight rows x kBN tokens, 8 warps as 2 (rows) x 4 (tokens), warp tile 64 x 32 (4 x 4 mma tiles,
// 64 fp32 accumulators a thread); k in steps of kBK = 64. Per step:
// - A: thread (row, half) holds the raw bytes of its row's next step in registers (loaded a step ahead: the
//   block header and the step's 32 code bytes) and dequantises the 32 weights of one Q4_K sub-block (the low or
//   the high nibbles of those bytes) into the shared tile, double-buffered;
// - B: the tokens' 64 activations of the step arrive by cp.async, kStagesB deep;
// - each warp runs ldmatrix + 64 mma.
// Both tiles keep the pack's element order (each aligned quad stored 0, 2, 1, 3: act_pack.cuh), so the k slots
// of A and B match without a permutation; rows are kLd = 72 halves apart, so ldmatrix's 8 rows of 16 bytes
// fall on 8 different bank groups. Rows past n read row 0 and tokens past t read token t - 1; neither is stored.
#include <cstdint>

#include "cp_async.cuh"
#include "kquant.cuh"
#include "mma_f16.cuh"
#include "pdl.cuh"
#include "prefill_gemm.cuh"

namespace openjet {
namespace {

constexpr int kBM = 128, kBN = 128, kBK = 64;  // block tile: weight rows, tokens, k per step
constexpr int kThreads = 256;                  // 8 warps; thread = (A row, half) of the dequantisation
constexpr int kStagesB = 3;
constexpr int kLd = kBK + 8;                   // halves per tile row in shared memory
constexpr int kTileHalves = kBM * kLd;         // one A or B tile (kBM == kBN)
constexpr int kSmemBytes = (2 + kStagesB) * kTileHalves * 2;  // 92,160: 2 blocks per SM on sm_90, 1 on 100 KB SMs
static_assert(kBM == kBN && kThreads == 2 * kBM, "one thread per A row half; B tiles the size of A tiles");

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const __half* p) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

// The raw bytes a thread dequantises for one k step: its row's block header (d, dmin, 12 scale bytes) and the
// step's 32 code bytes (step s: block s / 4, bytes 32 (s % 4) .. + 31 of its qs).
struct RawStep {
    uint4 hdr, q0, q1;
};

__device__ __forceinline__ RawStep load_raw(const uint8_t* row, int s) {
    const uint8_t* blk = row + (s >> 2) * Block<kQ4_K>::kBytes;
    const int q = 16 + 32 * (s & 3);
    return {__ldg(reinterpret_cast<const uint4*>(blk)), __ldg(reinterpret_cast<const uint4*>(blk + q)),
            __ldg(reinterpret_cast<const uint4*>(blk + q + 16))};
}

// The 32 weights of sub-block 2 (s % 4) + half (elements 32 half .. 32 half + 31 of the step) in the pack's
// order, stored to dst (its 64 bytes): code word i (bytes 4i .. 4i + 3, elements 4i .. 4i + 3 of the nibble
// half) gives the fp16x2 words (w0, w2) and (w1, w3); two 16-byte stores per 4 code words.
__device__ __forceinline__ void dequant_half(const RawStep& r, int s, int half, uint4* dst) {
    constexpr uint32_t kMagic = 0x64006400u;  // fp16x2 (1024, 1024): (kMagic | q) is 1024 + q exactly
    const __half2 dd = *reinterpret_cast<const __half2*>(&r.hdr.x);  // (d, dmin)
    int sc, m;
    k4_scale_min_words(r.hdr.y, r.hdr.z, r.hdr.w, 2 * (s & 3) + half, sc, m);
    const __half2 ds = __half2half2(__float2half_rn(__low2float(dd) * static_cast<float>(sc)));
    const __half2 ndm = __half2half2(__float2half_rn(-(__high2float(dd) * static_cast<float>(m))));
    const uint32_t ds_u = *reinterpret_cast<const uint32_t*>(&ds), ndm_u = *reinterpret_cast<const uint32_t*>(&ndm);
    const int sh = 4 * half;  // the high nibbles moved down
#pragma unroll
    for (int hq = 0; hq < 2; ++hq) {
        const uint4 q = hq ? r.q1 : r.q0;
        uint32_t o[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t v = (&q.x)[i] >> sh;
            const uint32_t q02 = hsub2_u(((v & 0x000F000Fu) | kMagic), kMagic);         // (q0, q2) exactly
            const uint32_t q13 = hsub2_u((((v >> 8) & 0x000F000Fu) | kMagic), kMagic);  // (q1, q3)
            o[2 * i] = hfma2_u(q02, ds_u, ndm_u);  // fp16(q ds - dm), one rounding
            o[2 * i + 1] = hfma2_u(q13, ds_u, ndm_u);
        }
        dst[2 * hq] = make_uint4(o[0], o[1], o[2], o[3]);
        dst[2 * hq + 1] = make_uint4(o[4], o[5], o[6], o[7]);
    }
}

__global__ void __launch_bounds__(kThreads, 2)
prefill_gemm_q4_k_kernel(const uint8_t* __restrict__ w, long long row_bytes, int n, int k, ActPack x, int t,
                         float* __restrict__ y) {
    extern __shared__ uint4 smem[];
    __half* as = reinterpret_cast<__half*>(smem);  // [2][kBM][kLd]
    __half* bs = as + 2 * kTileHalves;             // [kStagesB][kBN][kLd]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int col0 = blockIdx.x * kBN, row0 = blockIdx.y * kBM;  // consecutive blocks share the weight tile
    const int steps = k / kBK;

    const int arow = tid >> 1, ahalf = tid & 1;  // this thread's A row half
    const uint8_t* wrow = w + static_cast<long long>(row0 + arow < n ? row0 + arow : 0) * row_bytes;
    __half* adst = as + arow * kLd + 32 * ahalf;
    const auto store_a = [&](const RawStep& r, int s) {
        dequant_half(r, s, ahalf, reinterpret_cast<uint4*>(adst + (s & 1) * kTileHalves));
    };
    const auto load_b = [&](int s) {  // 128 tokens x 64 halves: 1,024 chunks of 16 bytes, 4 a thread
        __half* stage = bs + (s % kStagesB) * kTileHalves;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int c = tid + kThreads * i, r = c >> 3, part = c & 7;
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
    RawStep raw = load_raw(wrow, 0);
    store_a(raw, 0);
    if (steps > 1) raw = load_raw(wrow, 1);

    const int wm = warp >> 2, wn = warp & 3;  // warp tile: rows 64 wm.., tokens 32 wn..
    float acc[4][4][4] = {};
    // ldmatrix rows: A lanes 0-15 rows 0-15 at k 0, lanes 16-31 the same rows at k 8; B lanes 0-7 tokens 0-7 at
    // k 0, 8-15 tokens 0-7 at k 8, 16-23 tokens 8-15 at k 0, 24-31 tokens 8-15 at k 8.
    const int a_off = (64 * wm + (lane & 15)) * kLd + 8 * (lane >> 4);
    const int b_off = (32 * wn + (lane & 7) + 8 * (lane >> 4)) * kLd + 8 * ((lane >> 3) & 1);
#pragma unroll 1
    for (int s = 0; s < steps; ++s) {
        cp_async_wait<kStagesB - 2>();
        __syncthreads();  // A tile s and B stage s are complete; every warp is past step s - 1's reads
        if (s + kStagesB - 1 < steps) load_b(s + kStagesB - 1);
        cp_async_commit();
        const __half* at = as + (s & 1) * kTileHalves + a_off;
        const __half* bt = bs + (s % kStagesB) * kTileHalves + b_off;
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
            uint32_t a[4][4], b[2][4];
#pragma unroll
            for (int mt = 0; mt < 4; ++mt) ldmatrix_x4(a[mt], at + mt * 16 * kLd + 16 * kk);
#pragma unroll
            for (int np = 0; np < 2; ++np) ldmatrix_x4(b[np], bt + np * 16 * kLd + 16 * kk);
#pragma unroll
            for (int mt = 0; mt < 4; ++mt)
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) {
                    const uint32_t bb[2] = {b[nt >> 1][2 * (nt & 1)], b[nt >> 1][2 * (nt & 1) + 1]};
                    mma_16816(acc[mt][nt], a[mt], bb);
                }
        }
        if (s + 1 < steps) {  // the other A buffer: every warp finished reading it (step s - 1) at the barrier
            store_a(raw, s + 1);
            if (s + 2 < steps) raw = load_raw(wrow, s + 2);
        }
    }
    cp_async_wait<0>();

#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int row = row0 + 64 * wm + 16 * mt + g + 8 * (c >> 1);
                const int tok = col0 + 32 * wn + 8 * nt + 2 * tq + (c & 1);
                if (row < n && tok < t)
                    y[static_cast<long long>(tok) * n + row] = __fmul_rn(acc[mt][nt][c], x.inv[tok]);
            }
}

}  // namespace

cudaError_t launch_prefill_gemm_q4_k(const GemvArgs& a, cudaStream_t stream) {
    if (a.qtype != kQ4_K || a.t < 1 || a.t > a.x.rows || a.k % Block<kQ4_K>::kElems || !a.x.h || !a.x.inv || !a.y)
        return cudaErrorInvalidValue;
    const long long row_blocks = (a.n + kBM - 1) / kBM;
    if (row_blocks > 65535) return cudaErrorInvalidValue;  // gridDim.y
    static const cudaError_t opted = cudaFuncSetAttribute(
        prefill_gemm_q4_k_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (opted != cudaSuccess) return opted;
    const long long row_bytes = static_cast<long long>(a.k / Block<kQ4_K>::kElems) * Block<kQ4_K>::kBytes;
    return launch_kernel(prefill_gemm_q4_k_kernel, dim3((a.t + kBN - 1) / kBN, static_cast<unsigned>(row_blocks)),
                         kThreads, kSmemBytes, stream, static_cast<const uint8_t*>(a.w), row_bytes, a.n, a.k, a.x,
                         a.t, a.y);
}

}  // namespace openjet
