// Gated full-attention decode (qwen38.md §3.2) over a KV cache, for T <= 8 query rows (a verify step: row t
// sits at position n_past + t and attends to the cache and rows 0..t of this step), or up to 64 of a prefill.
//
// Design (T-invariant split-K flash decoding):
//   1. attn_prep_row: one block per (row t, q head or kv head): RMSNorm (row_rms_scale), partial NeoX RoPE on
//      dims 0..n_rot-1 at position n_past + t; q rows go to a float workspace, k (normed, rotated) and raw v
//      are appended to the cache at n_past + t, as F16 or as ggml Q8_0 blocks (Fmt, a template parameter).
//   2. attn_chunk: one block per (context chunk, kv head) serves all n_head/n_kv q heads x T rows of that kv
//      head (<= 64 rows), so K and V are read from memory once. Tiles of 32 keys go through a 2-stage
//      cp.async pipeline; per row an online softmax in fp32 (exp2 domain) gives (max, sum, o[256]).
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

#include "cp_async.cuh"
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
    static __device__ __forceinline__ void load8(const char* s, int d0, float out[8]) {
        const uint4 u = *reinterpret_cast<const uint4*>(s + 2 * d0);
        const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 f = __half22float2(h[i]);
            out[2 * i] = f.x;
            out[2 * i + 1] = f.y;
        }
    }
    static __device__ __forceinline__ float load1(const char* s, int d) {
        return __half2float(reinterpret_cast<const __half*>(s)[d]);
    }
};

// Q8_0 cache as ggml: 8 blocks of {fp16 d, int8 q[32]} (34 B) per row, 272 B. Blocks sit at 2-byte alignment,
// so tiles are copied in 4-byte pieces into rows of 276 B (69 words: odd, so 32 keys hit 32 banks).
// Quantisation as ggml's quantize_row_q8_0: d = amax/127, q = roundf(x * (1/d)), d stored as fp16.
struct KvQ8_0 {
    static constexpr int kType = kKvQ8_0, kRowBytes = 272, kSmemStride = 276, kCopyBytes = 4;
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
    static __device__ __forceinline__ void load8(const char* s, int d0, float out[8]) {
        const char* blk = s + 34 * (d0 >> 5);
        const float sc = __half2float(*reinterpret_cast<const __half*>(blk));
        const short* qs = reinterpret_cast<const short*>(blk + 2 + (d0 & 31));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int v = qs[i];
            out[2 * i] = static_cast<float>(static_cast<int8_t>(v & 0xff)) * sc;  // int8 * fp16: exact in fp32
            out[2 * i + 1] = static_cast<float>(static_cast<int8_t>(v >> 8)) * sc;
        }
    }
    static __device__ __forceinline__ float load1(const char* s, int d) {
        const char* blk = s + 34 * (d >> 5);
        return static_cast<float>(static_cast<int8_t>(blk[2 + (d & 31)])) *
               __half2float(*reinterpret_cast<const __half*>(blk));
    }
};

struct AttnDecodeArgs {
    int kv_type;             // kKvF16 or kKvQ8_0
    int n_head, n_kv;        // q heads, kv heads (n_head % n_kv == 0)
    int t;                   // query rows this step, 1..kAttnMaxCallT
    int n_past;              // cache length before the step; row t is at position n_past + t
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

// Workspace: q rows [t, n_head, 256], partial outputs [n_chunks, t, n_head, 256], (max, sum) [n_chunks, t, n_head].
__host__ __device__ inline size_t attn_decode_work_floats(int n_head, int t, int n_chunks) {
    return static_cast<size_t>(t) * n_head * kAttnHeadDim * (1 + n_chunks) + 2ull * n_chunks * t * n_head;
}

// Shared memory of a chunk block of max_rows rows: q rows, probabilities, rescales, two stages of K and V tiles.
__host__ __device__ constexpr size_t attn_chunk_smem_bytes(int max_rows, int smem_stride) {
    return sizeof(float) * max_rows * (kAttnHeadDim + kAttnTile + 1) + 4ull * kAttnTile * smem_stride;
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
    const int pos = a.n_past + t;
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

// Chunk c of kv head kv: per row r = t * group + g (q head kv * group + g) writes (max, sum) in the exp2
// domain and the unnormalised o[256], for rows row0 .. row0 + MAXR - 1 of the group's t * group (a block takes
// them all where shared memory allows; each row's arithmetic is its own, so the split changes no bit).
// smem: attn_chunk_smem_bytes(MAXR, Fmt::kSmemStride) bytes, 16-aligned.
template <class Fmt, int MAXR>
__device__ __forceinline__ void attn_chunk(const AttnDecodeArgs& a, int chunk_keys, int c, int kv, int row0,
                                           char* smem) {
    constexpr int kRowsPerWarp = MAXR / 8;
    float* q_s = reinterpret_cast<float*>(smem);                 // [MAXR][256]
    float* p_s = q_s + MAXR * kAttnHeadDim;                      // [MAXR][32] probabilities of the tile
    float* alpha_s = p_s + MAXR * kAttnTile;                     // [MAXR] rescale of o for the tile
    char* stages = reinterpret_cast<char*>(alpha_s + MAXR);      // [2][K, V][32][stride]
    constexpr int kStage = 2 * kAttnTile * Fmt::kSmemStride;

    const int group = a.n_head / a.n_kv, n_rows = min(MAXR, group * a.t - row0);  // local rows r: row0 + r
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int c0 = c * chunk_keys, c1 = min(c0 + chunk_keys, a.n_past + a.t);
    const int n_tiles = (c1 - c0 + kAttnTile - 1) / kAttnTile;

    attn_issue_tile<Fmt>(a, kv, c0, min(kAttnTile, c1 - c0), stages);
    for (int idx = tid; idx < n_rows * kAttnHeadDim; idx += kAttnThreads) {
        const int r = idx / kAttnHeadDim, d = idx - r * kAttnHeadDim;
        const int t = (row0 + r) / group, h = kv * group + (row0 + r - t * group);
        q_s[idx] = a.work[(static_cast<size_t>(t) * a.n_head + h) * kAttnHeadDim + d];
    }

    float m_run[kRowsPerWarp], l_run[kRowsPerWarp], o[MAXR];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) m_run[i] = -INFINITY, l_run[i] = 0.0f;
#pragma unroll
    for (int r = 0; r < MAXR; ++r) o[r] = 0.0f;
    const float score_scale = rsqrtf(static_cast<float>(kAttnHeadDim)) * kLog2e;  // 1/16 * log2(e)

    for (int it = 0; it < n_tiles; ++it) {
        const int key0 = c0 + it * kAttnTile;
        if (it + 1 < n_tiles) {
            const int next0 = key0 + kAttnTile;
            attn_issue_tile<Fmt>(a, kv, next0, min(kAttnTile, c1 - next0), stages + ((it + 1) & 1) * kStage);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const char* k_s = stages + (it & 1) * kStage;
        const char* v_s = k_s + kAttnTile * Fmt::kSmemStride;

        // Scores: lane = key, warp w = rows w, w + 8, ...; each dot product in dim order by one thread.
        float acc[kRowsPerWarp];
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) acc[i] = 0.0f;
        const char* k_row = k_s + lane * Fmt::kSmemStride;
#pragma unroll 2
        for (int d0 = 0; d0 < kAttnHeadDim; d0 += 8) {
            float kf[8];
            Fmt::load8(k_row, d0, kf);
#pragma unroll
            for (int i = 0; i < kRowsPerWarp; ++i) {
                const int r = warp + 8 * i;
                if (r < n_rows) {
                    const float4 qa = *reinterpret_cast<const float4*>(q_s + r * kAttnHeadDim + d0);
                    const float4 qb = *reinterpret_cast<const float4*>(q_s + r * kAttnHeadDim + d0 + 4);
                    float s = acc[i];
                    s = fmaf(qa.x, kf[0], s); s = fmaf(qa.y, kf[1], s); s = fmaf(qa.z, kf[2], s);
                    s = fmaf(qa.w, kf[3], s); s = fmaf(qb.x, kf[4], s); s = fmaf(qb.y, kf[5], s);
                    s = fmaf(qb.z, kf[6], s); s = fmaf(qb.w, kf[7], s);
                    acc[i] = s;
                }
            }
        }
        // Online softmax per row over the tile's 32 keys (one per lane), exp2 domain.
        const int pos = key0 + lane;
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) {
            const int r = warp + 8 * i;
            if (r < n_rows) {
                const int t = (row0 + r) / group;
                const bool valid = pos < c1 && pos <= a.n_past + t;  // causal inside the step
                const float s = valid ? acc[i] * score_scale : -INFINITY;
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
                p_s[r * kAttnTile + lane] = p;
                if (lane == 0) alpha_s[r] = alpha;
            }
        }
        __syncthreads();

        // o[r][d] = o[r][d] * alpha[r] + sum_j p[r][j] v[j][d]: thread = dim d, keys in order.
        const int d = tid;
#pragma unroll
        for (int r = 0; r < MAXR; ++r)
            if (r < n_rows) o[r] *= alpha_s[r];
#pragma unroll 2
        for (int j0 = 0; j0 < kAttnTile; j0 += 4) {
            float vv[4];
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) vv[jj] = Fmt::load1(v_s + (j0 + jj) * Fmt::kSmemStride, d);
#pragma unroll
            for (int r = 0; r < MAXR; ++r) {
                if (r < n_rows) {
                    const float4 p = *reinterpret_cast<const float4*>(p_s + r * kAttnTile + j0);
                    float acc_o = o[r];
                    acc_o = fmaf(p.x, vv[0], acc_o); acc_o = fmaf(p.y, vv[1], acc_o);
                    acc_o = fmaf(p.z, vv[2], acc_o); acc_o = fmaf(p.w, vv[3], acc_o);
                    o[r] = acc_o;
                }
            }
        }
        __syncthreads();  // the next iteration's copy overwrites this stage
    }

    // Partials: row (t, h) of chunk c.
    float* o_part = a.work + static_cast<size_t>(a.t) * a.n_head * kAttnHeadDim;
    float2* ml = reinterpret_cast<float2*>(o_part + static_cast<size_t>(attn_n_chunks(a.n_past, a.t, chunk_keys)) *
                                                        a.t * a.n_head * kAttnHeadDim);
#pragma unroll
    for (int r = 0; r < MAXR; ++r) {
        if (r < n_rows) {
            const int t = (row0 + r) / group, h = kv * group + (row0 + r - t * group);
            o_part[((static_cast<size_t>(c) * a.t + t) * a.n_head + h) * kAttnHeadDim + tid] = o[r];
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
// chunks that hold keys of row t (0 .. ceil((n_past + t + 1) / chunk) - 1), in chunk order.
__device__ __forceinline__ void attn_combine_row(const AttnDecodeArgs& a, int chunk_keys, int t, int h) {
    const int d = threadIdx.x;
    const int n_chunks = attn_n_chunks(a.n_past, a.t, chunk_keys);
    const int n_mine = (a.n_past + t + chunk_keys) / chunk_keys;
    const float* o_part = a.work + static_cast<size_t>(a.t) * a.n_head * kAttnHeadDim;
    const float2* ml = reinterpret_cast<const float2*>(o_part + static_cast<size_t>(n_chunks) * a.t * a.n_head *
                                                                    kAttnHeadDim);
    float m_max = -INFINITY;
    for (int c = 0; c < n_mine; ++c) m_max = fmaxf(m_max, ml[(static_cast<size_t>(c) * a.t + t) * a.n_head + h].x);
    float acc = 0.0f, l_sum = 0.0f;
    for (int c = 0; c < n_mine; ++c) {
        const size_t row = (static_cast<size_t>(c) * a.t + t) * a.n_head + h;
        const float2 v = ml[row];
        if (v.x == -INFINITY) continue;  // no key of row t in this chunk
        const float w = exp2f(v.x - m_max);
        l_sum = fmaf(w, v.y, l_sum);
        acc = fmaf(w, o_part[row * kAttnHeadDim + d], acc);
    }
    const float gate = a.qproj[(static_cast<size_t>(t) * a.n_head + h) * 2 * kAttnHeadDim + kAttnHeadDim + d];
    const float sig = 1.0f / (1.0f + expf(-gate));
    a.o[(static_cast<size_t>(t) * a.n_head + h) * kAttnHeadDim + d] = acc / l_sum * sig;
}

// Standalone launches: prep, chunks, combine on one stream. Returns cudaErrorInvalidValue on bad arguments.
cudaError_t launch_attn_decode(const AttnDecodeArgs& a, cudaStream_t stream);

// Chunk size and count the launch uses on the current device.
cudaError_t attn_decode_split(int n_past, int n_kv, int t, int* chunk_keys, int* n_chunks, int* sm_count);

}  // namespace openjet
