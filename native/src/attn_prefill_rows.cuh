// The pieces of the flash prefill attention that both of its kernels share (attn_prefill.cu: mma.sync;
// attn_prefill_wgmma.cu: Hopper's warpgroup MMA): the tile and q loads, a warp's online softmax over one tile of S,
// the probabilities as the next product's A fragments, and the output o / l * sigmoid(gate). A warp's 16 rows hold
// S and O in mma.sync m16n8k16 C fragments (mma_f16.cuh) in either kernel (a wgmma m64nNk16 accumulator gives each
// of its four warps the same fragments for its 16 rows), so both kernels run this code and get the same bits.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "attn_prefill.cuh"
#include "cp_async.cuh"

namespace openjet {
namespace prefill_rows {

constexpr int D = kAttnHeadDim;
constexpr int kRowChunks = D * 2 / 16;             // 16-byte chunks of an fp16 row: 32
constexpr float kScale = 0.0625f * kLog2e;        // 1 / sqrt(256), exp2 domain: decode's score_scale

// An fp16 K or V tile (16 or 32 KB), a Q8_0 stage of K and V raw rows (17 or 34 KB).
template <int kKeys> __host__ __device__ constexpr int tile_bytes() { return kKeys * D * 2; }
template <int kKeys> __host__ __device__ constexpr int raw_bytes() { return 2 * kKeys * KvQ8_0::kRowBytes; }

// mma.sync's tiles: rows of 512 bytes, 16-byte chunk c of row r at c ^ (r % 8) (each ldmatrix's 8 rows on 8 bank
// groups).
struct RowSwizzle {
    static __device__ __forceinline__ int at(int r, int c) { return r * (2 * D) + ((c ^ (r & 7)) << 4); }
};

// wgmma's 128-byte swizzle (SW128) for a tile of kRows rows: four blocks of 64 dims, each kRows rows x 128 bytes,
// chunk c % 8 of row r at (c % 8) ^ (r % 8). On a 1,024-byte aligned base it is both the K-major layout (Q, K: 8-row
// groups 1,024 bytes apart) and the MN-major one (V: 8 keys 1,024 bytes apart, 64-dim blocks kRows x 128 apart).
template <int kRows> struct Sw128 {
    static __device__ __forceinline__ int at(int r, int c) {
        return (c >> 3) * (kRows * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4);
    }
};

// A block's q head, its kv head, its first row, the keys its last row sees (0 .. n_keys - 1) and their tiles. Grid
// (q heads, query tiles): blocks start in linear order, so every head's longest (latest) query tiles start before any
// shorter one, the long blocks first across the whole grid, not only within each head (grid (query tiles, q heads)
// started the last heads' longest blocks near the end).
struct BlockRows {
    int h, kv, q0, n_keys, n_tiles;
};
template <int kRows, int kKeys> __device__ __forceinline__ BlockRows block_rows(const AttnDecodeArgs& a) {
    const int h = blockIdx.x, q0 = (gridDim.y - 1 - blockIdx.y) * kRows;
    const int n_keys = a.n_past + min(a.t, q0 + kRows);
    return {h, h / (a.n_head / a.n_kv), q0, n_keys, (n_keys + kKeys - 1) / kKeys};
}

__device__ __forceinline__ uint32_t h2_bits(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
}

// Starts copying rows key0 .. key0 + kKeys - 1 of kv head kv of one F16 cache (a.k_cache or a.v_cache; rows >= n_keys:
// zeros) into a tile laid out by L; the caller commits.
template <int kThreads, int kKeys, class L>
__device__ __forceinline__ void issue_f16_rows(const AttnDecodeArgs& a, const char* cache, int kv, int key0,
                                               int n_keys, char* dst) {
    constexpr int kPieces = KvF16::kRowBytes / 16;
    const char* base = cache + (static_cast<size_t>(kv) * a.capacity + key0) * KvF16::kRowBytes;
    for (int i = threadIdx.x; i < kKeys * kPieces; i += kThreads) {
        const int j = i / kPieces, c = i % kPieces;
        char* d = dst + L::at(j, c);
        if (key0 + j < n_keys)
            cp_async16(d, base + static_cast<size_t>(j) * KvF16::kRowBytes + 16 * c);
        else
            *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
    }
}

// Copies rows key0 .. key0 + kKeys - 1 of kv head kv's K and V (rows >= n_keys: zeros) to dst: F16 into [K | V]
// tiles laid out by L, Q8_0 as raw rows [K rows | V rows].
template <class Fmt, int kThreads, int kKeys, class L>
__device__ __forceinline__ void issue_tile(const AttnDecodeArgs& a, int kv, int key0, int n_keys, char* dst) {
    if constexpr (Fmt::kType == kKvF16) {
        issue_f16_rows<kThreads, kKeys, L>(a, a.k_cache, kv, key0, n_keys, dst);
        issue_f16_rows<kThreads, kKeys, L>(a, a.v_cache, kv, key0, n_keys, dst + tile_bytes<kKeys>());
    } else {
        constexpr int kPieces = Fmt::kRowBytes / 16;
        const size_t base = (static_cast<size_t>(kv) * a.capacity + key0) * Fmt::kRowBytes;
        for (int i = threadIdx.x; i < 2 * kKeys * kPieces; i += kThreads) {
            const int which = i / (kKeys * kPieces), j = i / kPieces % kKeys, c = i % kPieces;
            char* d = dst + (which * kKeys + j) * Fmt::kRowBytes + 16 * c;
            if (key0 + j < n_keys)
                cp_async16(d, (which ? a.v_cache : a.k_cache) + base + static_cast<size_t>(j) * Fmt::kRowBytes +
                                  16 * c);
            else
                *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
        }
    }
    cp_async_commit();
}

// The block's kRows q rows of head h from row q0 on (a.work, fp32 after the prep) as fp16, laid out by L; rows past
// t are zeros; tid: this thread among the kThreads that load.
// Four chunks a thread are loaded before any is stored: four loads in flight, not one.
template <int kRows, int kThreads, class L>
__device__ __forceinline__ void load_q(const AttnDecodeArgs& a, int q0, int h, char* q_s, int tid) {
    constexpr int kBatch = 4;
    static_assert(kRows * kRowChunks % (kBatch * kThreads) == 0, "whole batches");
#pragma unroll 1
    for (int i0 = tid; i0 < kRows * kRowChunks; i0 += kBatch * kThreads) {
        float4 x[kBatch][2];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
            const int i = i0 + j * kThreads, r = i / kRowChunks, c = i % kRowChunks;
            x[j][0] = x[j][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (q0 + r < a.t) {
                const float4* src = reinterpret_cast<const float4*>(
                    a.work + (static_cast<size_t>(q0 + r) * a.n_head + h) * D + 8 * c);
                x[j][0] = __ldg(src), x[j][1] = __ldg(src + 1);
            }
        }
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
            const int i = i0 + j * kThreads, r = i / kRowChunks, c = i % kRowChunks;
            const float4 x0 = x[j][0], x1 = x[j][1];  // rows past t: zeros
            *reinterpret_cast<uint4*>(q_s + L::at(r, c)) =
                make_uint4(h2_bits(x0.x, x0.y), h2_bits(x0.z, x0.w), h2_bits(x1.x, x1.y), h2_bits(x1.z, x1.w));
        }
    }
}

// A warp's online softmax over one tile of S (s[nt]: rows (g, g + 8) x keys key0 + 8 nt + 2 tq + (0, 1), raw
// scores in; the probabilities out, exactly 0 for masked keys): this lane's kKeys / 4 keys of rows lo (c = 0, 1) and
// hi (c = 2, 3), the quad holding a row's kKeys; the running maxima and partial sums updated and O rescaled.
// unmasked: every key of the tile at or before the warp's first row. A tile with no key for the warp's rows leaves
// m_run, l_run and O as they were (alpha exactly 1, the sums + 0) and gives probabilities 0.
template <int kKeys>
__device__ __forceinline__ void softmax_tile(float (&s)[kKeys / 8][4], float (&o)[D / 8][4], float (&m_run)[2],
                                             float (&l_run)[2], bool unmasked, int key0, int tq, int pos_lo,
                                             int pos_hi) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int key = key0 + 8 * nt + 2 * tq + (c & 1);
            const float x = unmasked || key <= (c < 2 ? pos_lo : pos_hi) ? s[nt][c] * kScale : -INFINITY;
            s[nt][c] = x;
            mx[c >> 1] = fmaxf(mx[c >> 1], x);
        }
    float alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        const float m_new = fmaxf(m_run[i], mx[i]);
        alpha[i] = m_new == -INFINITY ? 1.0f : exp2f(m_run[i] - m_new);
        mx[i] = m_new;  // the exponent's offset for this tile
        m_run[i] = m_new;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const float p = s[nt][c] == -INFINITY ? 0.0f : exp2f(s[nt][c] - mx[c >> 1]);
            s[nt][c] = p;
            sum[c >> 1] += p;
        }
#pragma unroll
    for (int i = 0; i < 2; ++i) l_run[i] = fmaf(l_run[i], alpha[i], sum[i]);
    if (!__all_sync(0xffffffffu, alpha[0] == 1.0f && alpha[1] == 1.0f)) {  // o * 1 is o: skip it
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            o[n][0] *= alpha[0], o[n][1] *= alpha[0];
            o[n][2] *= alpha[1], o[n][3] *= alpha[1];
        }
    }
}

// The probabilities of keys 16 ks .. + 15 as fp16, the A fragment of O += P V: S's n-tiles 2 ks, 2 ks + 1, whose C
// fragments are the A fragment's halves.
template <int kKeys>
__device__ __forceinline__ void p_fragment(const float (&s)[kKeys / 8][4], int ks, uint32_t (&pa)[4]) {
    pa[0] = h2_bits(s[2 * ks][0], s[2 * ks][1]), pa[1] = h2_bits(s[2 * ks][2], s[2 * ks][3]);
    pa[2] = h2_bits(s[2 * ks + 1][0], s[2 * ks + 1][1]), pa[3] = h2_bits(s[2 * ks + 1][2], s[2 * ks + 1][3]);
}

// o / l * sigmoid(gate) of this lane's rows wrow0 + g, + 8 (those before t), as attn_combine_row ends; the quad's
// partial sums added in one order for every row.
__device__ __forceinline__ void store_rows(const AttnDecodeArgs& a, float (&o)[D / 8][4], float (&l_run)[2],
                                           int wrow0, int h, int g, int tq) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 1);
        l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 2);
    }
    // The gates of 8 column pairs are loaded before any of their outputs is stored (o and qproj might alias for
    // all the compiler knows, so a load after a store waits for it): 4 round trips to memory a row, not 32.
    constexpr int kBatch = 8;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = wrow0 + g + 8 * i;
        if (r >= a.t) continue;
        const float* gate = a.qproj + (static_cast<size_t>(r) * a.n_head + h) * 2 * D + D;
        float* dst = a.o + (static_cast<size_t>(r) * a.n_head + h) * D;
#pragma unroll
        for (int n0 = 0; n0 < D / 8; n0 += kBatch) {
            float2 gt[kBatch];
#pragma unroll
            for (int j = 0; j < kBatch; ++j)
                gt[j] = __ldg(reinterpret_cast<const float2*>(gate + 8 * (n0 + j) + 2 * tq));
#pragma unroll
            for (int j = 0; j < kBatch; ++j) {
                const int n = n0 + j;
                *reinterpret_cast<float2*>(dst + 8 * n + 2 * tq) =
                    make_float2(o[n][2 * i] / l_run[i] * (1.0f / (1.0f + expf(-gt[j].x))),
                                o[n][2 * i + 1] / l_run[i] * (1.0f / (1.0f + expf(-gt[j].y))));
            }
        }
    }
}

}  // namespace prefill_rows

// attn_prefill_wgmma.cu's launch: an F16 cache (or fp16 rows) at 128 rows x 64 keys, the prep already run; only where
// attn_prefill_wgmma_available().
cudaError_t launch_attn_prefill_wgmma(const AttnDecodeArgs& a, cudaStream_t stream);

// The same warp-specialised (attn_prefill_wgmma_ws.cu, OPENJET_ATTN_PREFILL_WGMMA unset or 2): only where
// attn_prefill_wgmma_ws_available() (a 90a build, compute capability 9.0 with its 227 KB of shared memory a block).
bool attn_prefill_wgmma_ws_available();
cudaError_t launch_attn_prefill_wgmma_ws(const AttnDecodeArgs& a, cudaStream_t stream);

}  // namespace openjet
