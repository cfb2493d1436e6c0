// launch_attn_prefill (attn_prefill.cuh): attn_decode.cuh's prep, then one flash-attention kernel.
//
// Block = kWarps x 16 query rows of one q head (64 rows, or 128 where shared memory holds them: one K/V tile then
// serves twice the rows, and a Q8_0 tile's conversion is shared by twice the threads); grid (q heads, query tiles),
// the longest tiles first. Per tile of kKeys = 32 or 64 keys (K and V of the head's kv head, fp16, in shared memory; 64
// by default with 128-row blocks where shared memory holds them: half the barriers, waits and softmax reductions per
// key, and twice the independent accumulators of S per warp):
//   S = Q K^T     warp: its 16 rows x kKeys keys over 256 dims, 2 kKeys mma (Q and K by ldmatrix);
//   softmax       online, per row in fp32 (exp2 domain); the probabilities are rounded to fp16 in the
//                 registers that held S (an m16n8k16 C fragment pair is the next mma's A fragment);
//   O += P V      16 rows x 256 dims over the tile's keys, 2 kKeys mma (V by ldmatrix.trans).
// O stays in registers (128 floats a thread); the row sum is a per-lane partial until the end. Tiles are rows of
// 512 bytes whose 16-byte chunks are XOR-swizzled by row (chunk c of row r at c ^ (r % 8)), so each ldmatrix's 8
// rows fall on 8 different bank groups. F16 cache: two K/V stages filled by cp.async. Q8_0 cache: two stages of its
// raw rows (272 bytes) by cp.async, each turned into fp16 values (code * d, one rounding) in one K/V tile before use.
// (Or, by default, OPENJET_ATTN_PREFILL_F16 unset or 1: the layer's Q8_0 rows turned into fp16 rows once per call,
// then the F16 kernel: the same tiles; launch_fmt. And, by default where it runs, OPENJET_ATTN_PREFILL_WGMMA: the F16
// kernel's 128 x 64 shape on Hopper's warpgroup MMA, the same bits; launch_tiles: by default warp-specialised,
// attn_prefill_wgmma_ws.cu, or with value 1 attn_prefill_wgmma.cu.)
// A row's arithmetic is the same for either block size: a warp's 16 rows see the same tiles in the same order. Two
// shortcuts keep every bit: a tile wholly before the warp's rows skips the causal mask (no key is masked), and a
// tile that raises no row's maximum skips rescaling O (alpha is exactly 1).
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "attn_prefill.cuh"
#include "attn_prefill_rows.cuh"
#include "cp_async.cuh"
#include "device_attr.cuh"
#include "launch_count.h"
#include "mma_f16.cuh"
#include "pdl.cuh"

namespace openjet {
namespace {

using namespace prefill_rows;  // attn_prefill_rows.cuh: tiles, softmax and output, shared with the wgmma kernel
static_assert(KvQ8_0::kRowBytes % 16 == 0, "Q8_0 rows copy in 16-byte pieces");

// Shared memory: q (kWarps x 16 rows: 32 or 64 KB), then F16: two stages of [K | V]; Q8_0: one [K | V] and two raw
// stages. 64 rows x 32 keys: ~98 KB, under the 99 KB of sm_86/89/120; 128 x 32: ~130 KB, 128 x 64: ~196 KB
// (sm_90/100).
template <class Fmt, int kWarps, int kKeys> constexpr int smem_bytes() {
    constexpr int q_bytes = 16 * kWarps * D * 2;
    return Fmt::kType == kKvF16 ? q_bytes + 2 * 2 * tile_bytes<kKeys>()
                                : q_bytes + 2 * tile_bytes<kKeys>() + 2 * raw_bytes<kKeys>();
}

// Byte offset of 16-byte chunk c of row r in a tile of 512-byte rows.
__device__ __forceinline__ int swz(int r, int c) { return RowSwizzle::at(r, c); }

// Values 8 m .. 8 m + 7 of a Q8_0 block (codes q, scale d in both halves of d2) as fp16: q * d, the code exact in
// fp16, one rounding of the product. The one conversion of both Q8_0 paths (q8_0_to_tiles, q8_0_rows_to_f16_kernel).
__device__ __forceinline__ uint4 q8_0_chunk_f16(const uint16_t* q, __half2 d2, int m) {
    uint32_t w[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const uint32_t codes = h2_of_s8x2(q[4 * m + e]);
        const __half2 v = __hmul2(*reinterpret_cast<const __half2*>(&codes), d2);
        w[e] = *reinterpret_cast<const uint32_t*>(&v);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// Q8_0 raw rows -> fp16 [K | V] tiles: block b of a row (fp16 d, int8 q[32]) becomes chunks 4b .. 4b + 3 of the row.
template <int kThreads, int kKeys> __device__ __forceinline__ void q8_0_to_tiles(const char* raw, char* tiles) {
    constexpr int kTileBytes = tile_bytes<kKeys>();
    for (int i = threadIdx.x; i < 2 * kKeys * 8; i += kThreads) {
        const int which = i / (kKeys * 8), j = i / 8 % kKeys, b = i % 8;
        const char* blk = raw + (which * kKeys + j) * KvQ8_0::kRowBytes + 34 * b;
        const __half2 d2 = __half2half2(*reinterpret_cast<const __half*>(blk));
        const uint16_t* q = reinterpret_cast<const uint16_t*>(blk + 2);
        char* row = tiles + which * kTileBytes;
#pragma unroll
        for (int m = 0; m < 4; ++m) *reinterpret_cast<uint4*>(row + swz(j, 4 * b + m)) = q8_0_chunk_f16(q, d2, m);
    }
}

// a.f16_rows (OPENJET_ATTN_PREFILL_F16, default on): rows 0 .. n_rows - 1 of every kv head's Q8_0 K and V as fp16
// rows, [K | V][kv head][f16_capacity][256], the values q8_0_to_tiles makes. A thread per 16-byte chunk of a row.
__global__ void __launch_bounds__(256) q8_0_rows_to_f16_kernel(const AttnDecodeArgs a, int n_rows) {
    pdl_start();  // pdl.cuh: the prep kernel appended the call's rows; the previous projection may still read f16_rows
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    const long long per_head = static_cast<long long>(n_rows) * kRowChunks;
    if (i >= 2 * a.n_kv * per_head) return;
    const int head = static_cast<int>(i / per_head);  // which * n_kv + kv
    const int row = static_cast<int>(i % per_head / kRowChunks), c = static_cast<int>(i % kRowChunks);
    const int which = head / a.n_kv, kv = head % a.n_kv;
    const char* blk = (which ? a.v_cache : a.k_cache) +
                      (static_cast<long long>(kv) * a.capacity + row) * KvQ8_0::kRowBytes + 34 * (c / 4);
    const __half2 d2 = __half2half2(*reinterpret_cast<const __half*>(blk));
    *reinterpret_cast<uint4*>(a.f16_rows + (static_cast<long long>(head) * a.f16_capacity + row) * KvF16::kRowBytes +
                              16 * c) = q8_0_chunk_f16(reinterpret_cast<const uint16_t*>(blk + 2), d2, c % 4);
}

template <class Fmt, int kWarps, int kKeys>
__global__ void __launch_bounds__(32 * kWarps, 8 / kWarps) attn_prefill_kernel(const AttnDecodeArgs a) {
    constexpr int kRows = 16 * kWarps, kThreads = 32 * kWarps, kTileBytes = tile_bytes<kKeys>();
    constexpr int kRawBytes = raw_bytes<kKeys>();
    extern __shared__ __align__(16) char smem[];
    char* q_s = smem;
    char* kv_s = smem + kRows * D * 2;  // F16: stage s at kv_s + 2 s kTileBytes; Q8_0: the tiles, then raw stages
    char* raw_s = kv_s + 2 * kTileBytes;
    const auto [h, kv, q0, n_keys, n_tiles] = block_rows<kRows, kKeys>(a);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
    pdl_start();  // pdl.cuh: q comes from the prep kernel, the caches were written by it

    issue_tile<Fmt, kThreads, kKeys, RowSwizzle>(a, kv, 0, n_keys, Fmt::kType == kKvF16 ? kv_s : raw_s);
    load_q<kRows, kThreads, RowSwizzle>(a, q0, h, q_s, tid);

    const int wrow0 = q0 + 16 * warp;                   // the warp's first row
    const int pos_lo = a.n_past + wrow0 + g, pos_hi = pos_lo + 8;  // positions of this lane's rows g, g + 8
    const bool warp_live = wrow0 < a.t;
    float o[D / 8][4] = {};
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

    for (int it = 0; it < n_tiles; ++it) {
        cp_async_wait<0>();
        __syncthreads();  // tile it landed; every warp is done with the buffers tile it + 1 will overwrite
        const char* k_t;
        const int next0 = (it + 1) * kKeys;
        if constexpr (Fmt::kType == kKvF16) {
            if (it + 1 < n_tiles)
                issue_tile<Fmt, kThreads, kKeys, RowSwizzle>(a, kv, next0, n_keys,
                                                             kv_s + ((it + 1) & 1) * 2 * kTileBytes);
            k_t = kv_s + (it & 1) * 2 * kTileBytes;
        } else {
            if (it + 1 < n_tiles)
                issue_tile<Fmt, kThreads, kKeys, RowSwizzle>(a, kv, next0, n_keys, raw_s + ((it + 1) & 1) * kRawBytes);
            q8_0_to_tiles<kThreads, kKeys>(raw_s + (it & 1) * kRawBytes, kv_s);
            __syncthreads();
            k_t = kv_s;
        }
        const char* v_t = k_t + kTileBytes;
        const int key0 = it * kKeys;
        if (!warp_live || key0 > a.n_past + wrow0 + 15) continue;  // no key of this tile for any row of the warp

        // S = Q K^T: s[nt]: rows (g, g + 8) x keys key0 + 8 nt + 2 tq + (0, 1).
        float s[kKeys / 8][4] = {};
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t qa[4];
            ldmatrix_x4(qa, q_s + swz(16 * warp + (lane & 15), 2 * kk + (lane >> 4)));
#pragma unroll
            for (int np = 0; np < kKeys / 16; ++np) {
                uint32_t kb[4];
                ldmatrix_x4(kb, k_t + swz(16 * np + (lane & 7) + 8 * (lane >> 4), 2 * kk + ((lane >> 3) & 1)));
                mma_16816(s[2 * np], qa, kb);
                mma_16816(s[2 * np + 1], qa, kb + 2);
            }
        }

        const bool unmasked = key0 + kKeys - 1 <= a.n_past + wrow0;  // every key at or before the warp's first row
        softmax_tile<kKeys>(s, o, m_run, l_run, unmasked, key0, tq, pos_lo, pos_hi);

        // O += P V: keys 16 ks .. + 15.
#pragma unroll
        for (int ks = 0; ks < kKeys / 16; ++ks) {
            uint32_t pa[4];
            p_fragment<kKeys>(s, ks, pa);
#pragma unroll
            for (int np = 0; np < D / 16; ++np) {
                uint32_t vb[4];
                ldmatrix_x4_trans(vb, v_t + swz(16 * ks + (lane & 7) + 8 * ((lane >> 3) & 1), 2 * np + (lane >> 4)));
                mma_16816(o[2 * np], pa, vb);
                mma_16816(o[2 * np + 1], pa, vb + 2);
            }
        }
    }
    store_rows(a, o, l_run, wrow0, h, g, tq);
}

template <class Fmt, int kWarps, int kKeys> cudaError_t launch_rows(const AttnDecodeArgs& a, cudaStream_t stream) {
    constexpr int kRows = 16 * kWarps, kSmem = smem_bytes<Fmt, kWarps, kKeys>();
    if (const cudaError_t e = smem_opted_in<attn_prefill_kernel<Fmt, kWarps, kKeys>, kSmem>()) return e;
    return launch_kernel(attn_prefill_kernel<Fmt, kWarps, kKeys>, dim3(a.n_head, (a.t + kRows - 1) / kRows),
                         32 * kWarps, kSmem, stream, a);
}

bool smem_holds(int need) {
    int optin = 0;
    return device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, &optin) == cudaSuccess && need <= optin;
}

// The flash kernel over caches in format F at a tile shape: 128-row blocks (8 warps) where wide, else 64; `keys`
// keys per tile.
template <class F> cudaError_t launch_tiles(const AttnDecodeArgs& a, bool wide, int keys, cudaStream_t stream) {
    const int wgmma = F::kType == kKvF16 && wide && keys == 64 ? attn_prefill_wgmma_switch() : 0;
    if (wgmma && attn_prefill_wgmma_available()) {
        const cudaError_t e = wgmma == 2 && attn_prefill_wgmma_ws_available()
                                  ? launch_attn_prefill_wgmma_ws(a, stream)  // warp-specialised (the default)
                                  : launch_attn_prefill_wgmma(a, stream);    // the same tiles on warpgroup MMA
        if (e == cudaSuccess) count_launch(Counted::kAttnPrefillWgmma);
        return e;
    }
    if (wide) return keys == 64 ? launch_rows<F, 8, 64>(a, stream) : launch_rows<F, 8, 32>(a, stream);
    return keys == 64 ? launch_rows<F, 4, 64>(a, stream) : launch_rows<F, 4, 32>(a, stream);
}

// Rows and keys: asked for, else the most that shared memory holds, rows first (the same bits either way); 64 keys
// by default only with 128 rows (H200, 2,048 rows after 30,720: 64 rows x 64 keys 12.99 ms a layer against 10.40 for
// 64 x 32; 128 x 64 8.13 against 9.17 for 128 x 32, F16; attn-prefill-h200-875b97a.json).
// The prep, then the flash kernel on the caches in format Fmt, or (a Q8_0 cache with a.f16_rows that hold the call's
// keys) the cache converted to fp16 rows once and the F16 kernel on them, at the tile shape the Q8_0 kernel would
// take: the same fp16 tiles, so the same bits, without converting every tile again in each of the ~100 blocks that
// read it (16 query tiles x 6 q heads of a kv head at 2,048 rows).
template <class Fmt> cudaError_t launch_fmt(const AttnDecodeArgs& a, cudaStream_t stream) {
    const bool wide = a.prefill_rows == 128 || (a.prefill_rows == 0 && smem_holds(smem_bytes<Fmt, 8, 32>()));
    const int keys = a.prefill_keys ? a.prefill_keys : wide && smem_holds(smem_bytes<Fmt, 8, 64>()) ? 64 : 32;
    if (keys == 64 && !smem_holds(wide ? smem_bytes<Fmt, 8, 64>() : smem_bytes<Fmt, 4, 64>()))
        return cudaErrorInvalidValue;  // asked for tiles this device cannot hold
    if (const cudaError_t e = launch_attn_prep(a, stream)) return e;
    const int n_rows = a.n_past + a.t;
    if (Fmt::kType == kKvQ8_0 && a.f16_rows && n_rows <= a.f16_capacity) {
        const long long chunks = 2LL * a.n_kv * n_rows * kRowChunks;
        if (const cudaError_t e = launch_kernel(q8_0_rows_to_f16_kernel,
                                                dim3(static_cast<unsigned>((chunks + 255) / 256)), 256, 0, stream, a,
                                                n_rows))
            return e;
        count_launch(Counted::kAttnPrefillF16Rows);
        AttnDecodeArgs f = a;  // an F16 cache of f16_capacity rows (smem_bytes<KvF16> <= <KvQ8_0>: it fits)
        f.kv_type = kKvF16, f.capacity = a.f16_capacity, f.k_cache = a.f16_rows;
        f.v_cache = a.f16_rows + static_cast<size_t>(a.n_kv) * a.f16_capacity * KvF16::kRowBytes;
        return launch_tiles<KvF16>(f, wide, keys, stream);
    }
    return launch_tiles<Fmt>(a, wide, keys, stream);
}

}  // namespace

bool attn_prefill_fits(int kv_type) {
    return smem_holds(kv_type == kKvF16 ? smem_bytes<KvF16, 4, 32>() : smem_bytes<KvQ8_0, 4, 32>());
}

bool attn_prefill_f16_switch() {
    const char* v = std::getenv("OPENJET_ATTN_PREFILL_F16");
    return !v || std::strcmp(v, "0") != 0;
}

int attn_prefill_wgmma_switch() {
    const char* v = std::getenv("OPENJET_ATTN_PREFILL_WGMMA");
    return !v ? 2 : std::strcmp(v, "0") == 0 ? 0 : std::strcmp(v, "1") == 0 ? 1 : 2;
}

int attn_prefill_keys_switch() {
    const char* v = std::getenv("OPENJET_ATTN_PREFILL_KEYS");
    if (!v) return 0;
    return std::strcmp(v, "32") == 0 ? 32 : std::strcmp(v, "64") == 0 ? 64 : -1;
}

cudaError_t launch_attn_prefill(const AttnDecodeArgs& a, cudaStream_t stream) {
    if (a.pos ||  // (a graph's launch: its length on the device; the prefill kernels take it from n_past)
        a.n_head < 1 || a.n_kv < 1 || a.n_head % a.n_kv || a.n_head > 65535 || a.t < 1 || a.t > 65535 ||
        a.n_past < 0 || a.capacity < a.n_past + a.t || a.n_rot < 2 || a.n_rot % 2 || a.n_rot > kAttnHeadDim ||
        !a.qproj || !a.k || !a.v || !a.q_norm || !a.k_norm || !a.k_cache || !a.v_cache || !a.o || !a.work ||
        (a.prefill_rows != 0 && a.prefill_rows != 64 && a.prefill_rows != 128) ||
        (a.prefill_keys != 0 && a.prefill_keys != 32 && a.prefill_keys != 64) || a.f16_capacity < 0 ||
        (a.f16_rows && reinterpret_cast<uintptr_t>(a.f16_rows) % 16))
        return cudaErrorInvalidValue;
    if (a.kv_type == kKvF16) return launch_fmt<KvF16>(a, stream);
    if (a.kv_type == kKvQ8_0) return launch_fmt<KvQ8_0>(a, stream);
    return cudaErrorInvalidValue;
}

}  // namespace openjet
