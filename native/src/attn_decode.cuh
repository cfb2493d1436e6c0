// Gated full-attention decode (qwen38.md §3.2) over a KV cache, for T <= 8 query rows (a verify step: row t
// sits at position n_past + t and attends to the cache and rows 0..t of this step), or up to 64 of a prefill.
//
// Design (T-invariant split-K flash decoding):
//   1. attn_prep_row: one block per (row t, q head or kv head): RMSNorm (row_rms_scale), partial NeoX RoPE on
//      dims 0..n_rot-1 at position n_past + t; q rows go to a float workspace, k (normed, rotated) and raw v
//      are appended to the cache at n_past + t, as F16 or as ggml Q8_0 blocks (Fmt, a template parameter).
//   2. attn_chunk: one block per (context chunk, kv head) serves all n_head/n_kv q heads x T rows of that kv
//      head (<= 64 rows), so K and V are read from memory once. Tiles of 32 keys go through a 2-stage
//      cp.async pipeline. Scores and P V run on tensor cores (mma m16n8k16, fp32 accumulation): the cache's
//      codes enter exactly (F16 values, or Q8_0 int8 codes with the block scale applied in fp32), q and the
//      probabilities as hi + lo fp16 pairs (~22 bits), so the result stays within ~1e-6 of fp32 arithmetic;
//      per row an online softmax in fp32 (exp2 domain) gives (max, sum, o[256]).
//   3. attn_combine_row: per (t, q head) the chunks' partials are merged in chunk order, divided by the sum
//      and multiplied by sigmoid(gate).
// T-invariance: the chunk size depends on n_past, n_kv and the SM count (attn_chunk_keys), never on T; tile
// boundaries are fixed relative to the chunk start; every dot product and every per-row reduction runs in an
// order that depends on the row's own data alone. Extra keys or chunks that a larger T brings are masked for
// row t, and their updates (o * 1 + 0 * v, l * 1 + 0) are exact, so row t is bit-identical for every T.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "act_pack.cuh"
#include "cp_async.cuh"
#include "mma_f16.cuh"
#include "rmsnorm.cuh"
#include "rope.cuh"

namespace openjet {

constexpr int kAttnHeadDim = 256;          // qwen35 head_dim; one thread per dim
constexpr int kAttnThreads = 256;
constexpr int kAttnTile = 32;              // keys per shared-memory tile: one per lane in the score stage
constexpr int kAttnMinChunk = 64;          // keys (2 tiles): below this the partials cost more than the K/V they save
constexpr int kAttnMaxT = 8;              // query rows of a decode or verify step
constexpr int kAttnMaxCallT = 64;         // query rows one call takes (a prefill merges sub-steps of 8 whose split
                                          // agrees: attn_chunk_keys; the chunk blocks take them MAXR rows at a time)
constexpr int kAttnMaxRows = 64;           // (n_head / n_kv) * T rows per chunk block
constexpr int kKvF16 = 1;                  // GGML type ids of the cache formats
constexpr int kKvQ8_0 = 8;
constexpr float kLog2e = 1.4426950408889634f;

// F16 cache: a row is 256 halves (512 B). Shared rows padded to 528 B: lanes reading 16 B of different keys
// at the same dims then fall in distinct banks per quarter warp.
struct KvF16 {
    static constexpr int kType = kKvF16, kRowBytes = 512, kSmemStride = 528, kCopyBytes = 16;
    static __device__ __forceinline__ void store(char* row, int d, float y) {
        reinterpret_cast<__half*>(row)[d] = __float2half_rn(y);
    }
    // Score A fragments of keys key0 + (g, g + 8) over dims d0 .. d0 + 63 (4 k-steps): the values themselves.
    static __device__ __forceinline__ void key_frags(const char* k_s, int key0, int d0, int g, int tq,
                                                     uint32_t ka[4][4], float (&)[2][2]) {
        const char* r0 = k_s + (key0 + g) * kSmemStride + 2 * (d0 + 2 * tq);
        const char* r1 = r0 + 8 * kSmemStride;
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
            ka[ks][0] = *reinterpret_cast<const uint32_t*>(r0 + 32 * ks);
            ka[ks][1] = *reinterpret_cast<const uint32_t*>(r1 + 32 * ks);
            ka[ks][2] = *reinterpret_cast<const uint32_t*>(r0 + 32 * ks + 16);
            ka[ks][3] = *reinterpret_cast<const uint32_t*>(r1 + 32 * ks + 16);
        }
    }
    // P V B fragments of dims 32 blk + 8 nt + g (n-tile nt) over the tile's keys (2 k-steps of 16).
    static __device__ __forceinline__ void value_frags(const char* v_s, int blk, int g, int tq, uint32_t vb[2][4][2],
                                                       float (&)[2][4]) {
#pragma unroll
        for (int ks = 0; ks < 2; ++ks)
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                for (int hf = 0; hf < 2; ++hf) {
                    const char* p = v_s + (16 * ks + 8 * hf + 2 * tq) * kSmemStride + 2 * (32 * blk + 8 * nt + g);
                    vb[ks][nt][hf] = __byte_perm(*reinterpret_cast<const uint16_t*>(p),
                                                 *reinterpret_cast<const uint16_t*>(p + kSmemStride), 0x5410);
                }
    }
};

// Q8_0 cache as ggml: 8 blocks of {fp16 d, int8 q[32]} (34 B) per row, 272 B. Blocks sit at 2-byte alignment,
// so tiles are copied in 4-byte pieces into rows of 276 B (69 words: odd, so 32 keys hit 32 banks).
// Quantisation as ggml's quantize_row_q8_0: d = amax/127, q = roundf(x * (1/d)), d stored as fp16.
// kStride: the row's bytes in shared memory. KvQ8_0 (276: rows padded, copied in 4-byte pieces) is the format every
// kernel takes by default; KvQ8_0Wide (272: rows as the cache has them, whole 16-byte copies, a quarter of the copy
// instructions) the chunk kernel's planned form (AttnDecodeArgs::pipe). The fragments read the same bytes either way.
template <int kStride>
struct KvQ8_0Rows {
    static constexpr int kType = kKvQ8_0, kRowBytes = 272, kSmemStride = kStride;
    static constexpr int kCopyBytes = kStride % 16 == 0 ? 16 : 4;
    // Every lane of the warp must call it (warp w writes block w of the row).
    static __device__ __forceinline__ void store(char* row, int d, float y) {
        float amax = fabsf(y);
#pragma unroll
        for (int m = 16; m >= 1; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
        const float dq = amax / 127.0f;
        const float id = dq != 0.0f ? 1.0f / dq : 0.0f;
        char* blk = row + 34 * (d >> 5);
        blk[2 + (d & 31)] = static_cast<char>(static_cast<int>(roundf(y * id)));
        if ((d & 31) == 0) *reinterpret_cast<__half*>(blk) = __float2half_rn(dq);
    }
    // Score A fragments of keys key0 + (g, g + 8) over dims d0 .. d0 + 63 (blocks d0 / 32 and d0 / 32 + 1): the
    // int8 codes, exact in fp16; kd[b][i]: the scale of block b for key g (i = 0) and g + 8 (i = 1).
    static __device__ __forceinline__ void key_frags(const char* k_s, int key0, int d0, int g, int tq,
                                                     uint32_t ka[4][4], float (&kd)[2][2]) {
        const char* r0 = k_s + (key0 + g) * kSmemStride + 34 * (d0 >> 5);
        const char* r1 = r0 + 8 * kSmemStride;
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
            const int o = 34 * (ks >> 1) + 2 + 16 * (ks & 1) + 2 * tq;
            ka[ks][0] = h2_of_s8x2(*reinterpret_cast<const uint16_t*>(r0 + o));
            ka[ks][1] = h2_of_s8x2(*reinterpret_cast<const uint16_t*>(r1 + o));
            ka[ks][2] = h2_of_s8x2(*reinterpret_cast<const uint16_t*>(r0 + o + 8));
            ka[ks][3] = h2_of_s8x2(*reinterpret_cast<const uint16_t*>(r1 + o + 8));
        }
#pragma unroll
        for (int b = 0; b < 2; ++b) {
            kd[b][0] = __half2float(*reinterpret_cast<const __half*>(r0 + 34 * b));
            kd[b][1] = __half2float(*reinterpret_cast<const __half*>(r1 + 34 * b));
        }
    }
    // P V B fragments of dims 32 blk + 8 nt + g (n-tile nt: all in block blk) over the tile's keys (2 k-steps of
    // 16): the int8 codes; vd[ks][j]: block blk's scale for key 16 ks + 2 tq + (0, 1, 8, 9)[j].
    static __device__ __forceinline__ void value_frags(const char* v_s, int blk, int g, int tq, uint32_t vb[2][4][2],
                                                       float (&vd)[2][4]) {
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const char* row = v_s + (16 * ks + 8 * hf + 2 * tq) * kSmemStride + 34 * blk;
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) {
                    const uint32_t q0 = *reinterpret_cast<const uint8_t*>(row + 2 + 8 * nt + g);
                    const uint32_t q1 = *reinterpret_cast<const uint8_t*>(row + kSmemStride + 2 + 8 * nt + g);
                    vb[ks][nt][hf] = h2_of_s8_bytes02(__byte_perm(q0, q1, 0x5410));
                }
                vd[ks][2 * hf] = __half2float(*reinterpret_cast<const __half*>(row));
                vd[ks][2 * hf + 1] = __half2float(*reinterpret_cast<const __half*>(row + kSmemStride));
            }
        }
    }
};

using KvQ8_0 = KvQ8_0Rows<276>;
using KvQ8_0Wide = KvQ8_0Rows<272>;

struct AttnDecodeArgs {
    int kv_type;             // kKvF16 or kKvQ8_0
    int n_head, n_kv;        // q heads, kv heads (n_head % n_kv == 0)
    int t;                   // query rows this step, 1..kAttnMaxCallT
    int n_past;              // cache length before the step; row t is at position n_past + t
    // With pos (a launch captured into a CUDA graph, replayed at other positions: engine.cu's graphs), the kernels take
    // the cache length as *pos + pos_delta, read on the device; n_past is then the length the launch was made for: its
    // checks and its chunk size, which every length it runs at shares (attn_chunk_keys; the grid holds their chunks).
    const int* pos = nullptr;
    int pos_delta = 0;
    int capacity;            // cache rows per kv head (>= n_past + t)
    int n_rot;               // rotated dims (64), even, <= 256
    float eps, rope_base;    // 1e-6, 1e7
    const float* qproj;      // [t, n_head * 512]: per head [query 256 | gate 256]
    const float* k;          // [t, n_kv * 256] k projection
    const float* v;          // [t, n_kv * 256] v projection
    const float* q_norm;     // [256]
    const float* k_norm;     // [256]
    char* k_cache;           // [n_kv, capacity, row bytes]
    char* v_cache;
    float* o;                // [t, n_head * 256] = attention * sigmoid(gate)
    float* work;             // attn_decode_work_floats() floats
    int sm_count;            // multiprocessors; <= 0: read from the current device
    int rope_offset;         // RoPE position = cache row + rope_offset (0 for the trunk; the MTP head's cache
                             // row r holds the token at position r + 1)
    int pipe = 0;            // the chunk blocks' tile pipeline (OPENJET_ATTN_PIPE; blocks of <= 48 rows): 0 two
                             // stages, each tile's copies issued by a loop over its pieces; 1 the planned form
                             // (attn_issue_tile_planned, Q8_0 in 16-byte pieces) with `stages` stages (0: the most
                             // that keep the SM's chunk blocks). The same bits: the same tiles, in the same order
    int stages = 0;          // 2..kAttnMaxStages, or 0 (pipe 1 only)
    bool hi_only = false;    // q and the probabilities as one fp16 each, one mma where decode takes two (a prefill's
                             // numerics of its own unless OPENJET_PREFILL_ATTN=pairs: the engine sets it)
    int prefill_rows = 0;    // launch_attn_prefill's query rows per block: 64, 128, or 0 (128 where shared memory
                             // holds them); the same bits either way
    int prefill_keys = 0;    // launch_attn_prefill's keys per tile: 32, 64, or 0 (64 with 128 rows where shared memory
                             // holds them); numerics of their own (attn_prefill.cuh)
    char* f16_rows = nullptr;  // launch_attn_prefill with a Q8_0 cache: where set (16-byte aligned) and the call's
    int f16_capacity = 0;      // n_past + t keys fit f16_capacity, 2 x n_kv x f16_capacity x 512 bytes where the
                               // cache's rows are converted to fp16 once, then read by the F16 kernel (the same bits)
    // The out projection's pack of o made by the combine itself (OPENJET_ATTN_OWN_PACK: launch_attn_decode fills
    // pack_out where pack_sync is set, the call has at most kAttnMaxT rows, n_head <= kAttnPackMaxHeads and the GPU
    // holds every combine block at once; else it is ignored and the caller packs): each block gives its (head, row)'s
    // max |o| to the row's other heads through pack_sync (AttnPackSync, zeroed once, never reset by the host) and packs
    // its head's 8 32-blocks of the row under the row's max, as launch_pack_act packs o: the same bits, one launch
    // fewer. launch_attn_decode_packed says whether it did.
    ActPack pack_out{nullptr, nullptr, nullptr, 0};
    unsigned* pack_sync = nullptr;
};

// The words through which a combine launch's blocks meet for its own pack (AttnDecodeArgs::pack_sync), as the GDN
// step's GdnPackSync: block (h, t) writes its max |o| of row t with its phase (its launches so far, counted in
// phase_of[t][h], which only it reads) in one 64-bit word, row_word[t][h] = phase << 32 | the max's bits; the row's
// blocks take each other's words once their phase is the launch's. Every launch with more than t rows runs each of
// row t's blocks once, so their phases agree. Zeroed once; no host reset.
constexpr int kAttnPackMaxHeads = 64;
struct AttnPackSync {
    unsigned phase_of[kAttnMaxT][kAttnPackMaxHeads];
    unsigned long long row_word[kAttnMaxT][kAttnPackMaxHeads];
};

// Keys per chunk: about one chunk block per SM at this context, a power of two >= kAttnMinChunk, so it changes
// only when n_past crosses a power-of-two boundary (then row t of a T-row step and the 1-row step at
// n_past + t differ in rounding only).
__host__ __device__ inline int attn_chunk_keys(int n_past, int n_kv, int sm_count) {
    const int target = sm_count > n_kv ? (sm_count + n_kv - 1) / n_kv : 1;
    const int want = (n_past + target) / target;  // ceil((n_past + 1) / target)
    int c = kAttnMinChunk;
    while (c < want) c <<= 1;
    return c;
}

__host__ __device__ inline int attn_n_chunks(int n_past, int t, int chunk_keys) {
    return (n_past + t + chunk_keys - 1) / chunk_keys;
}

// The longest cache length whose chunk size is chunk_keys (attn_chunk_keys' inverse: want <= chunk_keys).
__host__ __device__ inline int attn_chunk_keys_last(int chunk_keys, int n_kv, int sm_count) {
    const int target = sm_count > n_kv ? (sm_count + n_kv - 1) / n_kv : 1;
    return chunk_keys * target - 1;
}

// The cache length a launch runs at (AttnDecodeArgs::pos).
__device__ __forceinline__ int attn_cache_len(const AttnDecodeArgs& a) {
    return a.pos ? *a.pos + a.pos_delta : a.n_past;
}

// Workspace: q rows [t, n_head, 256], partial outputs [n_chunks, t, n_head, 256], (max, sum) [n_chunks, t, n_head].
__host__ __device__ inline size_t attn_decode_work_floats(int n_head, int t, int n_chunks) {
    return static_cast<size_t>(t) * n_head * kAttnHeadDim * (1 + n_chunks) + 2ull * n_chunks * t * n_head;
}

// Shared memory of a chunk block of max_rows rows: `stages` (2) stages of K and V tiles, q as fp16 hi and lo, the
// score partials of the 4 dim quarters (the probabilities overwrite quarter 0's), the rescales. Score and
// probability rows are padded to whole 16-row mma tiles; q rows are 16 B apart and shifted by 4 banks.
constexpr int kAttnQStride = kAttnHeadDim + 8;  // halves per q row
constexpr int kAttnSStride = kAttnTile + 4;     // floats per score row: the score mma's stores hit 32 banks
__host__ __device__ constexpr int attn_rows_padded(int max_rows) { return (max_rows + 15) / 16 * 16; }
constexpr int kAttnMaxStages = 4;  // the planned form's deepest ring
__host__ __device__ constexpr size_t attn_chunk_smem_bytes(int max_rows, int smem_stride, int stages = 2) {
    return 2ull * stages * kAttnTile * smem_stride + 2ull * 2 * max_rows * kAttnQStride +
           4ull * attn_rows_padded(max_rows) * (4 * kAttnSStride + 1);
}

// ------------------------------------------------------------------------------------------ 1. prep

// Block (t, i) of blockDim 256: i < n_head: q head i -> work q rows; else kv head i - n_head -> cache.
template <class Fmt>
__device__ __forceinline__ void attn_prep_row(const AttnDecodeArgs& a, int t, int i) {
    __shared__ float y[kAttnHeadDim];
    const int d = threadIdx.x;
    const bool is_q = i < a.n_head;
    const float* x = is_q ? a.qproj + (static_cast<size_t>(t) * a.n_head + i) * 2 * kAttnHeadDim
                          : a.k + (static_cast<size_t>(t) * a.n_kv + (i - a.n_head)) * kAttnHeadDim;
    const float* w = is_q ? a.q_norm : a.k_norm;
    const float scale = row_rms_scale(x, kAttnHeadDim, a.eps);
    y[d] = __fmul_rn(__fmul_rn(x[d], scale), w[d]);
    __syncthreads();
    const int pos = attn_cache_len(a) + t;
    const float r = rope_neox_dim(y, d, pos + a.rope_offset, a.n_rot, a.rope_base);
    __syncthreads();  // y may be reused by a persistent caller's next row
    if (is_q) {
        a.work[(static_cast<size_t>(t) * a.n_head + i) * kAttnHeadDim + d] = r;
    } else {
        const int kv = i - a.n_head;
        const size_t row = (static_cast<size_t>(kv) * a.capacity + pos) * Fmt::kRowBytes;
        Fmt::store(a.k_cache + row, d, r);
        Fmt::store(a.v_cache + row, d, a.v[(static_cast<size_t>(t) * a.n_kv + kv) * kAttnHeadDim + d]);
    }
}

// attn_prep_row's work for every head of row t by one block of kAttnThreads (a prefill call's rows: attn_prep_rows):
// warp w takes heads w, w + 8, ... (attn_prep_row's numbering), lane l the dims l + 32 j. The same bits: dim d is
// row_rms_scale's thread d (warp d / 32), so each j's butterfly is that warp's and the 8 sums are added in warp order;
// a row's RoPE cos / sin (double arithmetic, ~28x fewer for the row's 28 heads at 27B) are computed once into shared
// memory; a Q8_0 block's maximum is the warp's, as Fmt::store takes it. Why: a block per (row, head) spent ~275 us on
// a 4,096-row call of the 27B (H200, ncu at 54793b6) for ~200 MB of traffic.
template <class Fmt>
__device__ __forceinline__ void attn_prep_heads_of_row(const AttnDecodeArgs& a, int t) {
    static_assert(kAttnThreads == kRowThreads && kAttnHeadDim == kRowThreads, "dim d is row_rms_scale's thread d");
    constexpr int kWarps = kAttnThreads / 32, kPer = kAttnHeadDim / 32;
    __shared__ float rot[2][kAttnHeadDim / 2];   // cos, sin of pair i < n_rot / 2
    __shared__ float ys[kWarps][kAttnHeadDim];  // a warp's head after the norm
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, pos = attn_cache_len(a) + t, heads = a.n_head + a.n_kv;
    for (int i = threadIdx.x; i < a.n_rot / 2; i += kAttnThreads)
        rope_cos_sin(pos + a.rope_offset, i, a.n_rot, a.rope_base, rot[0][i], rot[1][i]);
    __syncthreads();
    const auto input = [&](int i) {
        return i < a.n_head ? a.qproj + (static_cast<size_t>(t) * a.n_head + i) * 2 * kAttnHeadDim
                            : a.k + (static_cast<size_t>(t) * a.n_kv + (i - a.n_head)) * kAttnHeadDim;
    };
    float x[kPer];
    if (warp < heads)
#pragma unroll
        for (int j = 0; j < kPer; ++j) x[j] = input(warp)[lane + 32 * j];
    for (int i = warp; i < heads; i += kWarps) {
        float next[kPer];  // the warp's next head, in flight while this one is worked
        if (i + kWarps < heads)
#pragma unroll
            for (int j = 0; j < kPer; ++j) next[j] = input(i + kWarps)[lane + 32 * j];
        const bool is_q = i < a.n_head;
        float total = 0.0f;
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
            float s = __fmaf_rn(x[j], x[j], 0.0f);
#pragma unroll
            for (int m = 16; m >= 1; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
            total += s;
        }
        const float scale = rsqrtf(__fdiv_rn(total, static_cast<float>(kAttnHeadDim)) + a.eps);
        const float* w = is_q ? a.q_norm : a.k_norm;
        float* y = ys[warp];
#pragma unroll
        for (int j = 0; j < kPer; ++j) y[lane + 32 * j] = __fmul_rn(__fmul_rn(x[j], scale), w[lane + 32 * j]);
        __syncwarp();
        const size_t row = is_q ? 0 : (static_cast<size_t>(i - a.n_head) * a.capacity + pos) * Fmt::kRowBytes;
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
            const int d = lane + 32 * j, p = d < a.n_rot / 2 ? d : d - a.n_rot / 2;
            const float r = d < a.n_rot ? rope_neox_rotated(y, d, a.n_rot, rot[0][p], rot[1][p]) : y[d];
            if (is_q) {
                a.work[(static_cast<size_t>(t) * a.n_head + i) * kAttnHeadDim + d] = r;
            } else {
                Fmt::store(a.k_cache + row, d, r);
                Fmt::store(a.v_cache + row, d,
                           a.v[(static_cast<size_t>(t) * a.n_kv + (i - a.n_head)) * kAttnHeadDim + d]);
            }
        }
        __syncwarp();  // y is rewritten for the warp's next head
        if (i + kWarps < heads)
#pragma unroll
            for (int j = 0; j < kPer; ++j) x[j] = next[j];
    }
}

// ------------------------------------------------------------------------------------------ 2. chunks

// Issues the copy of keys key0..key0+31 of kv head kv (K then V) into stage; keys >= valid are zero-filled.
template <class Fmt>
__device__ __forceinline__ void attn_issue_tile(const AttnDecodeArgs& a, int kv, int key0, int valid, char* stage) {
    constexpr int kPieces = Fmt::kRowBytes / Fmt::kCopyBytes;
    const size_t base = (static_cast<size_t>(kv) * a.capacity + key0) * Fmt::kRowBytes;
    for (int idx = threadIdx.x; idx < 2 * kAttnTile * kPieces; idx += kAttnThreads) {
        const int which = idx / (kAttnTile * kPieces);
        const int rem = idx - which * (kAttnTile * kPieces);
        const int j = rem / kPieces, piece = rem - j * kPieces;
        char* dst = stage + (which * kAttnTile + j) * Fmt::kSmemStride + piece * Fmt::kCopyBytes;
        const char* src = (which ? a.v_cache : a.k_cache) + base + static_cast<size_t>(j) * Fmt::kRowBytes +
                          piece * Fmt::kCopyBytes;
        if (j < valid) {
            if constexpr (Fmt::kCopyBytes == 16) cp_async16(dst, src);
            else cp_async4(dst, src);
        } else {
            if constexpr (Fmt::kCopyBytes == 16) *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
            else *reinterpret_cast<uint32_t*>(dst) = 0u;
        }
    }
    cp_async_commit();
}

// attn_issue_tile's copies with the loop unrolled over a thread's pieces (a compile-time count: Q8_0Wide 4-5 of 16
// bytes, F16 8). A tile's K rows (and its V rows) are contiguous in the cache, so piece idx of a half is at 16 idx
// there, and in shared memory too where rows are not padded (Q8_0Wide): no division, and a key past `valid` is
// zero-filled by the copy itself (no branch). The loop form spent ~32 instructions a 4-byte piece, ~550 a Q8_0 tile
// per thread, about half of the chunk kernel's instructions (sm_90a SASS, 2026-12-05). The same bytes to the same
// places.
template <class Fmt>
__device__ __forceinline__ void attn_issue_tile_planned(const AttnDecodeArgs& a, int kv, int key0, int valid,
                                                        char* stage) {
    constexpr int kPieces = Fmt::kRowBytes / 16, kHalf = kAttnTile * kPieces, kTotal = 2 * kHalf;
    constexpr int kCopies = (kTotal + kAttnThreads - 1) / kAttnThreads;
    static_assert(Fmt::kCopyBytes == 16 && Fmt::kRowBytes % 16 == 0 && Fmt::kSmemStride % 16 == 0,
                  "whole 16-byte pieces on both sides");
    const size_t base = (static_cast<size_t>(kv) * a.capacity + key0) * Fmt::kRowBytes;
    const char* const k_tile = a.k_cache + base;
    const char* const v_tile = a.v_cache + base;
    const int lim = valid * kPieces;  // a half's pieces of keys < valid
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
        const int idx = threadIdx.x + i * kAttnThreads;
        if (i >= kTotal / kAttnThreads && idx >= kTotal) break;  // (only a last, partial round checks)
        const bool is_v = idx >= kHalf;
        const int h = is_v ? idx - kHalf : idx;  // piece of the half: key h / kPieces
        char* dst = stage + 16 * idx;
        if constexpr (Fmt::kSmemStride != Fmt::kRowBytes) dst += (Fmt::kSmemStride - Fmt::kRowBytes) * (idx / kPieces);
        cp_async16_or_zero(dst, (is_v ? v_tile : k_tile) + 16 * (h < lim ? h : 0), h < lim);
    }
    cp_async_commit();
}

// cp.async.wait_group n for a run-time n in 0..kMax (an immediate in the instruction).
template <int kMax> __device__ __forceinline__ void cp_async_wait_upto(int n) {
    if constexpr (kMax == 0) {
        cp_async_wait<0>();
    } else {
        if (n >= kMax) cp_async_wait<kMax>();
        else cp_async_wait_upto<kMax - 1>(n);
    }
}

// Chunk c of kv head kv: per row r = t * group + g (q head kv * group + g) writes (max, sum) in the exp2
// domain and the unnormalised o[256], for rows row0 .. row0 + MAXR - 1 of the group's t * group (a block takes
// them all where shared memory allows; each row's arithmetic is its own, so the split changes no bit: an mma's
// output element depends only on its own row of A and column of B).
// smem: attn_chunk_smem_bytes(MAXR, Fmt::kSmemStride) bytes, 16-aligned. kHiOnly (AttnDecodeArgs::hi_only): q
// and the probabilities rounded once to fp16, the lo halves' mma left out (half the tensor-core work).
// kPlanned (AttnDecodeArgs::pipe 1): a ring of `stages` (2..kAttnMaxStages) tiles, stages - 1 in flight while one is
// worked on, filled by attn_issue_tile_planned; smem then attn_chunk_smem_bytes(MAXR, Fmt::kSmemStride, stages). The
// tiles, their order and every operation on them are the two-stage form's: the same bits.
template <class Fmt, int MAXR, bool kHiOnly = false, bool kPlanned = false>
__device__ __forceinline__ void attn_chunk(const AttnDecodeArgs& a, int chunk_keys, int c, int kv, int row0,
                                           char* smem, int stages = 2) {
    static_assert(MAXR % 8 == 0 && MAXR <= 64, "score n-tiles: 8 rows each, one per warp at most");
    constexpr int kRowsPerWarp = MAXR / 8, kNTiles = MAXR / 8;  // softmax rows per warp; score row tiles
    constexpr int kRowsPad = attn_rows_padded(MAXR), kMTiles = kRowsPad / 16;
    constexpr int kStage = 2 * kAttnTile * Fmt::kSmemStride;
    constexpr int kQuarter = kRowsPad * kAttnSStride;  // floats of one dim quarter's score partials
    const int n_stages = kPlanned ? stages : 2;
    char* ring = smem;                                                             // [n_stages][K, V][32][stride]
    __half* qhi_s = reinterpret_cast<__half*>(ring + n_stages * kStage);           // [MAXR][kAttnQStride]
    __half* qlo_s = qhi_s + MAXR * kAttnQStride;
    float* part_s = reinterpret_cast<float*>(qlo_s + MAXR * kAttnQStride);         // [4][kRowsPad][kAttnSStride]
    float* p_s = part_s;                                    // probabilities: over quarter 0, element by element
    float* alpha_s = part_s + 4 * kQuarter;                 // [kRowsPad] rescale of o for the tile

    const int n_past = attn_cache_len(a);
    const int c0 = c * chunk_keys, c1 = min(c0 + chunk_keys, n_past + a.t);
    if (c0 >= c1) return;  // (a graph's grid holds the chunks of its longest length: none of this one's)
    const int group = a.n_head / a.n_kv, n_rows = min(MAXR, group * a.t - row0);  // local rows r: row0 + r
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int n_tiles = (c1 - c0 + kAttnTile - 1) / kAttnTile;

    if constexpr (kPlanned) {  // tiles 0 .. n_stages - 2 in flight
        for (int s = 0; s < n_stages - 1 && s < n_tiles; ++s) {
            const int k0 = c0 + s * kAttnTile;
            attn_issue_tile_planned<Fmt>(a, kv, k0, min(kAttnTile, c1 - k0), ring + s * kStage);
        }
    } else {
        attn_issue_tile<Fmt>(a, kv, c0, min(kAttnTile, c1 - c0), ring);
    }
    for (int idx = tid; idx < MAXR * kAttnHeadDim / 4; idx += kAttnThreads) {  // 4 dims per thread and load
        const int r = idx / (kAttnHeadDim / 4), d = 4 * (idx - r * (kAttnHeadDim / 4));
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < n_rows) {
            const int t = (row0 + r) / group, h = kv * group + (row0 + r - t * group);
            x = *reinterpret_cast<const float4*>(a.work + (static_cast<size_t>(t) * a.n_head + h) * kAttnHeadDim + d);
        }
        uint32_t hi[2], lo[2];
        split_h2(x.x, x.y, hi[0], lo[0]);
        split_h2(x.z, x.w, hi[1], lo[1]);
        *reinterpret_cast<uint2*>(qhi_s + r * kAttnQStride + d) = make_uint2(hi[0], hi[1]);
        *reinterpret_cast<uint2*>(qlo_s + r * kAttnQStride + d) = make_uint2(lo[0], lo[1]);
    }
    for (int idx = tid; idx < kQuarter; idx += kAttnThreads) p_s[idx] = 0.0f;  // rows >= n_rows stay 0
    for (int idx = tid; idx < kRowsPad; idx += kAttnThreads) alpha_s[idx] = 1.0f;

    float m_run[kRowsPerWarp], l_run[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) m_run[i] = -INFINITY, l_run[i] = 0.0f;
    float o[kMTiles][4][4];  // C fragments: rows 16 mt + (g, g + 8), dims 32 warp + 8 nt + 2 tq + (0, 1)
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) o[mt][nt][i] = 0.0f;
    const float score_scale = rsqrtf(static_cast<float>(kAttnHeadDim)) * kLog2e;  // 1/16 * log2(e)
    constexpr bool kScaled = Fmt::kType == kKvQ8_0;  // codes times a per-32-dim block scale

    int read_stage = 0;  // kPlanned: tile it's stage, it mod n_stages
    for (int it = 0; it < n_tiles; ++it) {
        const int key0 = c0 + it * kAttnTile;
        const char* k_s;
        if constexpr (kPlanned) {
            // tile it + n_stages - 1 into the stage tile it - 1 left (every thread passed the barrier that ended it)
            const int ahead = it + n_stages - 1;
            if (ahead < n_tiles) {
                const int k0 = c0 + ahead * kAttnTile;
                const int write_stage = read_stage == 0 ? n_stages - 1 : read_stage - 1;
                attn_issue_tile_planned<Fmt>(a, kv, k0, min(kAttnTile, c1 - k0), ring + write_stage * kStage);
            }
            cp_async_wait_upto<kAttnMaxStages - 1>(min(n_stages - 1, n_tiles - 1 - it));  // tile it's group landed
            k_s = ring + read_stage * kStage;
            read_stage = read_stage + 1 == n_stages ? 0 : read_stage + 1;
        } else {
            if (it + 1 < n_tiles) {
                const int next0 = key0 + kAttnTile;
                attn_issue_tile<Fmt>(a, kv, next0, min(kAttnTile, c1 - next0), ring + ((it + 1) & 1) * kStage);
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            k_s = ring + (it & 1) * kStage;
        }
        __syncthreads();
        const char* v_s = k_s + kAttnTile * Fmt::kSmemStride;

        // Scores: warp w takes keys 16 (w & 1) .. + 15 over dims 64 (w >> 1) .. + 63 for every row: A = the keys,
        // B = q hi then lo per k-step (Q8_0: each 32-dim block's sum times the key's scale, in block order). The
        // quarter's partial goes to part_s; the softmax adds the 4 quarters in order.
        {
            const int mt = warp & 1, dq = warp >> 1;
            uint32_t ka[4][4];
            float kd[2][2];
            Fmt::key_frags(k_s, 16 * mt, 64 * dq, g, tq, ka, kd);
            float* part = part_s + dq * kQuarter;
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt) {
                if (8 * nt >= n_rows) break;
                const int qo = (8 * nt + g) * kAttnQStride + 64 * dq + 2 * tq;
                float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int blk = 0; blk < 2; ++blk) {
                    float u[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    float(&acc)[4] = kScaled ? u : s;
#pragma unroll
                    for (int ks = 2 * blk; ks < 2 * blk + 2; ++ks) {
                        const uint32_t bh[2] = {*reinterpret_cast<const uint32_t*>(qhi_s + qo + 16 * ks),
                                                *reinterpret_cast<const uint32_t*>(qhi_s + qo + 16 * ks + 8)};
                        mma_16816(acc, ka[ks], bh);
                        if constexpr (!kHiOnly) {
                            const uint32_t bl[2] = {*reinterpret_cast<const uint32_t*>(qlo_s + qo + 16 * ks),
                                                    *reinterpret_cast<const uint32_t*>(qlo_s + qo + 16 * ks + 8)};
                            mma_16816(acc, ka[ks], bl);
                        }
                    }
                    if constexpr (kScaled) {
                        s[0] = fmaf(u[0], kd[blk][0], s[0]);
                        s[1] = fmaf(u[1], kd[blk][0], s[1]);
                        s[2] = fmaf(u[2], kd[blk][1], s[2]);
                        s[3] = fmaf(u[3], kd[blk][1], s[3]);
                    }
                }
                const int r = 8 * nt + 2 * tq, key = 16 * mt + g;  // s: (key, r), (key, r + 1), (key + 8, ...)
                if (r < n_rows) part[r * kAttnSStride + key] = s[0], part[r * kAttnSStride + key + 8] = s[2];
                if (r + 1 < n_rows)
                    part[(r + 1) * kAttnSStride + key] = s[1], part[(r + 1) * kAttnSStride + key + 8] = s[3];
            }
        }
        __syncthreads();

        // Online softmax per row over the tile's 32 keys (one per lane), exp2 domain; warp w: rows w, w + 8, ...
        const int pos = key0 + lane;
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) {
            const int r = warp + 8 * i;
            if (r < n_rows) {
                const int t = (row0 + r) / group;
                const float* pr = part_s + r * kAttnSStride + lane;
                const float dot = ((pr[0] + pr[kQuarter]) + pr[2 * kQuarter]) + pr[3 * kQuarter];
                const bool valid = pos < c1 && pos <= n_past + t;  // causal inside the step
                const float s = valid ? dot * score_scale : -INFINITY;
                float mt = s;
#pragma unroll
                for (int m = 16; m >= 1; m >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, m));
                const float m_new = fmaxf(m_run[i], mt);
                float p = 0.0f, alpha = 1.0f;
                if (m_new != -INFINITY) {
                    p = exp2f(s - m_new);
                    alpha = exp2f(m_run[i] - m_new);
                }
                float sum = p;
#pragma unroll
                for (int m = 16; m >= 1; m >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, m);
                l_run[i] = fmaf(l_run[i], alpha, sum);
                m_run[i] = m_new;
                p_s[r * kAttnSStride + lane] = p;
                if (lane == 0) alpha_s[r] = alpha;
            }
        }
        __syncthreads();

        // o = o * alpha + P V: warp w owns dims 32 w .. + 31 (Q8_0: block w) for every row; A = the tile's
        // probabilities (Q8_0: times the key's scale of block w) as hi + lo fp16, B = the values' codes.
        {
            uint32_t vb[2][4][2];
            float vd[2][4];
            Fmt::value_frags(v_s, warp, g, tq, vb, vd);
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
                if (16 * mt >= n_rows) break;
                const float al0 = alpha_s[16 * mt + g], al1 = alpha_s[16 * mt + g + 8];
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) {
                    o[mt][nt][0] *= al0, o[mt][nt][1] *= al0;
                    o[mt][nt][2] *= al1, o[mt][nt][3] *= al1;
                }
#pragma unroll
                for (int ks = 0; ks < 2; ++ks) {
                    const float* p0 = p_s + (16 * mt + g) * kAttnSStride + 16 * ks + 2 * tq;  // row g
                    const float* p1 = p0 + 8 * kAttnSStride;                                   // row g + 8
                    float2 x[4] = {*reinterpret_cast<const float2*>(p0), *reinterpret_cast<const float2*>(p1),
                                   *reinterpret_cast<const float2*>(p0 + 8), *reinterpret_cast<const float2*>(p1 + 8)};
                    if constexpr (kScaled) {
#pragma unroll
                        for (int j = 0; j < 4; ++j) {  // x[j]: keys 2 tq (+ 8 for j >= 2), + 1
                            x[j].x *= vd[ks][j & 2];
                            x[j].y *= vd[ks][(j & 2) + 1];
                        }
                    }
                    uint32_t ah[4], al[4];
#pragma unroll
                    for (int j = 0; j < 4; ++j) split_h2(x[j].x, x[j].y, ah[j], al[j]);
#pragma unroll
                    for (int nt = 0; nt < 4; ++nt) {
                        mma_16816(o[mt][nt], ah, vb[ks][nt]);
                        if constexpr (!kHiOnly) mma_16816(o[mt][nt], al, vb[ks][nt]);
                    }
                }
            }
        }
        __syncthreads();  // the next iteration's copy overwrites this stage, its scores part_s
    }

    // Partials: row (t, h) of chunk c.
    float* o_part = a.work + static_cast<size_t>(a.t) * a.n_head * kAttnHeadDim;
    float2* ml = reinterpret_cast<float2*>(o_part + static_cast<size_t>(attn_n_chunks(n_past, a.t, chunk_keys)) *
                                                        a.t * a.n_head * kAttnHeadDim);
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const int r = 16 * mt + 8 * hf + g;
            if (r < n_rows) {
                const int t = (row0 + r) / group, h = kv * group + (row0 + r - t * group);
                float* dst = o_part + ((static_cast<size_t>(c) * a.t + t) * a.n_head + h) * kAttnHeadDim + 32 * warp +
                             2 * tq;
#pragma unroll
                for (int nt = 0; nt < 4; ++nt)
                    *reinterpret_cast<float2*>(dst + 8 * nt) = make_float2(o[mt][nt][2 * hf], o[mt][nt][2 * hf + 1]);
            }
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) {
            const int r = warp + 8 * i;
            if (r < n_rows) {
                const int t = (row0 + r) / group, h = kv * group + (row0 + r - t * group);
                ml[(static_cast<size_t>(c) * a.t + t) * a.n_head + h] = make_float2(m_run[i], l_run[i]);
            }
        }
    }
}

// ------------------------------------------------------------------------------------------ 3. combine

// Row t, q head h (blockDim 256): o = sum_c 2^(m_c - M) o_c / sum_c 2^(m_c - M) l_c * sigmoid(gate), over the
// chunks that hold keys of row t (0 .. ceil((n_past + t + 1) / chunk) - 1), in chunk order. The chunks' (max,
// sum) pairs are loaded by all threads at once (M: fmaxf is exact in any order) and each thread loads its dim
// of kBatch chunks' partials before it adds them, so the loads overlap instead of costing an L2 round trip per
// chunk; the sums are the chunk-ordered fma chains of one loop. The gate is read first and a thread's pair of the
// first batch kept from the max pass, so that only the partials' batches wait on L2 after it (32 a batch: 64 chunks,
// 4K keys, in two round trips instead of eight).
__device__ __forceinline__ float attn_combine_row(const AttnDecodeArgs& a, int chunk_keys, int t, int h) {
    constexpr int kBatch = 32;
    __shared__ float2 ml_s[kAttnThreads];
    __shared__ float max_s[kAttnThreads / 32];
    const int d = threadIdx.x, lane = d & 31, warp = d >> 5;
    const int n_past = attn_cache_len(a);
    const int n_chunks = attn_n_chunks(n_past, a.t, chunk_keys);
    const int n_mine = (n_past + t + chunk_keys) / chunk_keys;
    const float* o_part = a.work + static_cast<size_t>(a.t) * a.n_head * kAttnHeadDim;
    const float2* ml = reinterpret_cast<const float2*>(o_part + static_cast<size_t>(n_chunks) * a.t * a.n_head *
                                                                    kAttnHeadDim);
    const auto row_of = [&](int c) { return (static_cast<size_t>(c) * a.t + t) * a.n_head + h; };
    const float gate = a.qproj[(static_cast<size_t>(t) * a.n_head + h) * 2 * kAttnHeadDim + kAttnHeadDim + d];
    float2 mine = make_float2(-INFINITY, 0.0f);  // this thread's pair in the first batch (chunk d)
    float m_max = -INFINITY;
    for (int c = d; c < n_mine; c += kAttnThreads) {
        const float2 p = ml[row_of(c)];
        if (c == d) mine = p;
        m_max = fmaxf(m_max, p.x);
    }
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) m_max = fmaxf(m_max, __shfl_xor_sync(0xffffffffu, m_max, m));
    if (lane == 0) max_s[warp] = m_max;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kAttnThreads / 32; ++w) m_max = fmaxf(m_max, max_s[w]);
    float acc = 0.0f, l_sum = 0.0f;
    for (int c_base = 0; c_base < n_mine; c_base += kAttnThreads) {  // chunks in batches of the block's threads
        const int n_here = min(kAttnThreads, n_mine - c_base);
        __syncthreads();  // every thread is done with the previous batch's pairs
        if (d < n_here) ml_s[d] = c_base == 0 ? mine : ml[row_of(c_base + d)];
        __syncthreads();
        for (int c0 = 0; c0 < n_here; c0 += kBatch) {
            float ov[kBatch];
#pragma unroll
            for (int j = 0; j < kBatch; ++j)
                ov[j] = c0 + j < n_here ? o_part[row_of(c_base + c0 + j) * kAttnHeadDim + d] : 0.0f;
#pragma unroll
            for (int j = 0; j < kBatch; ++j) {
                if (c0 + j >= n_here) break;
                const float2 v = ml_s[c0 + j];
                if (v.x == -INFINITY) continue;  // no key of row t in this chunk
                const float w = exp2f(v.x - m_max);
                l_sum = fmaf(w, v.y, l_sum);
                acc = fmaf(w, ov[j], acc);
            }
        }
    }
    const float sig = 1.0f / (1.0f + expf(-gate));
    const float o = acc / l_sum * sig;
    a.o[(static_cast<size_t>(t) * a.n_head + h) * kAttnHeadDim + d] = o;
    return o;  // (thread d's: the own pack's value)
}

// Standalone launches: prep, chunks, combine on one stream. Returns cudaErrorInvalidValue on bad arguments.
cudaError_t launch_attn_decode(const AttnDecodeArgs& a, cudaStream_t stream);
// The same, and *packed: whether the combine packed o itself into a.pack_out (AttnDecodeArgs::pack_sync).
cudaError_t launch_attn_decode_packed(const AttnDecodeArgs& a, cudaStream_t stream, bool* packed);

// Step 1's cache stores alone (k normed and rotated, v raw, rows n_past .. n_past + t - 1; t < 65,536): what
// filling a cache needs when nothing attends (the MTP head's fill). Reads k, v, k_norm and the caches only.
cudaError_t launch_attn_store_kv(const AttnDecodeArgs& a, cudaStream_t stream);

// Step 1 alone for rows 0 .. a.t - 1 (t < 65,536): q rows (normed, rotated) to a.work [t, n_head, 256], k and v to
// the caches; the caller checked the arguments (launch_attn_decode, attn_prefill.cu).
cudaError_t launch_attn_prep(const AttnDecodeArgs& a, cudaStream_t stream);

// Chunk size and count the launch uses on the current device.
cudaError_t attn_decode_split(int n_past, int n_kv, int t, int* chunk_keys, int* n_chunks, int* sm_count);

// OPENJET_ATTN_PIPE / OPENJET_ATTN_STAGES as the engine reads them at create (AttnDecodeArgs::pipe, stages): unset or
// "1" the chunk blocks' planned tile pipeline with OPENJET_ATTN_STAGES stages ("2".."4"; unset or "auto": 0, the most
// that keep the SM's chunk blocks); "0": the two-stage loop form. (CudaEngine.load refuses other values.)
void attn_pipe_switch(int* pipe, int* stages);

}  // namespace openjet
