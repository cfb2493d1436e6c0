// launch_topk (topk.cuh): two passes of bitonic sorts in shared memory over 64-bit keys that order by value
// (descending) then id (ascending), so the result is deterministic and equals a stable sort's prefix.
//   pass 1: one block per (chunk of 4096 logits, row) sorts its chunk and keeps its first 32 keys;
//   pass 2: one block per row sorts the chunks' survivors (<= 64 chunks x 32) and writes the first k.
// k = 1 takes a min-reduction in both passes instead; for k > 1 the bitonic top-k (least_keys; OPENJET_TOPK=sort the
// full sorts). Both give
// the same keys. launch_argmax (a draft step's pick over a draft vocabulary's rows) is one block's min-reduction.
#include "topk.cuh"

#include <cstdlib>
#include <cstring>

#include "pdl.cuh"

namespace openjet {
namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 4096;                    // logits per pass-1 block (16 per thread)
constexpr int kMaxChunks = 64;                  // pass 2 sorts kMaxChunks * 32 keys: n <= 262,144
constexpr unsigned long long kNone = ~0ull;     // sorts last: padding, beyond n

// Ascending in v as unsigned: flip all bits of negatives, set the sign bit of positives.
__device__ __forceinline__ uint32_t orderable(float v) {
    const uint32_t b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float from_orderable(uint32_t o) {
    return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}
// Ascending key = descending value, then ascending id.
__device__ __forceinline__ unsigned long long make_key(float v, int id) {
    if (v == 0.0f) v = 0.0f;  // -0 ties with +0, as in numpy's comparisons
    return (static_cast<unsigned long long>(~orderable(v)) << 32) | static_cast<uint32_t>(id);
}

// The key of logit v of id: kNone for an id outside [0, n_valid) (the argmax's past-the-row entries pass -1).
__device__ __forceinline__ unsigned long long valid_key(float v, int id, int n_valid) {
    return id >= 0 && id < n_valid ? make_key(v, id) : kNone;
}

// Entry pos's key: its logit and id (row_ids[pos], or pos), kNone past the row or for an id outside [0, n_valid).
__device__ __forceinline__ unsigned long long entry_key(const float* xr, int pos, int n, int n_valid,
                                                        const int32_t* row_ids) {
    if (pos >= n) return kNone;
    const int id = row_ids ? row_ids[pos] : pos;
    return valid_key(xr[pos], id, n_valid);
}

// Sorts s[0, n) ascending (n a power of two), every thread of the block taking part.
__device__ void bitonic_sort(unsigned long long* s, int n) {
    for (int k = 2; k <= n; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                const int ixj = i ^ j;
                if (ixj > i) {
                    const unsigned long long a = s[i], b = s[ixj];
                    if ((a > b) == ((i & k) == 0)) {
                        s[i] = b;
                        s[ixj] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
}

// The kTopKMax least keys of s[0, n) (n = kTopKMax * 2^r), ascending, into s[0, kTopKMax); every thread of the block
// (kThreads) takes part. The bitonic top-k: runs of kTopKMax sorted ascending (sort_runs; else they are already), then
// rounds that keep, in place of each pair of runs a and b, the least kTopKMax of the two, min(a[i], b[kTopKMax-1-i]) (a
// bitonic run holding exactly those), sorted again by a bitonic merge. The same keys in the same order as
// bitonic_sort's first kTopKMax, for ~4x less work (the runs' sort is 15 of the full sort's 78 stages over 4,096 keys,
// and each round works on half the keys of the one before). The default (OPENJET_TOPK).
__device__ void least_keys(unsigned long long* s, int n, bool sort_runs) {
    constexpr int R = kTopKMax;
    const auto exchange = [&](int i, int ixj, bool up) {  // the compare-exchange of the network, ixj > i
        const unsigned long long a = s[i], b = s[ixj];
        if ((a > b) == up) s[i] = b, s[ixj] = a;
    };
    if (sort_runs) {
        for (int k = 2; k <= R; k <<= 1) {
            for (int j = k >> 1; j > 0; j >>= 1) {
                for (int i = threadIdx.x; i < n; i += kThreads)
                    if ((i ^ j) > i) exchange(i, i ^ j, k == R || (i & k) == 0);  // the last stage: every run up
                __syncthreads();
            }
        }
    }
    // Round by round the kept runs lie `stride` apart: the pair (2 stride q, 2 stride q + stride) keeps its least in
    // the first (each position is read and written by one thread: no barrier between).
    for (int stride = R; stride < n; stride <<= 1) {
        const int kept = n / (2 * stride) * R;  // keys kept this round
        for (int i = threadIdx.x; i < kept; i += kThreads) {
            const int base = 2 * stride * (i / R), p = i % R;
            s[base + p] = min(s[base + p], s[base + stride + R - 1 - p]);
        }
        __syncthreads();
        for (int j = R >> 1; j > 0; j >>= 1) {  // each kept run, bitonic, ascending
            for (int i = threadIdx.x; i < kept; i += kThreads) {
                const int base = 2 * stride * (i / R), p = i % R;
                if ((p ^ j) > p) exchange(base + p, base + (p ^ j), true);
            }
            __syncthreads();
        }
    }
}

// OPENJET_TOPK (read at each call: tests switch it): unset or "least", least_keys (the default since 2026-12-05: on the
// H200 at 499afb1 the k = 32 top-k of a T=1 step 0.160 -> 0.089 ms, decode_top 8.673 -> 8.513 ms); "sort", the full
// bitonic sorts (the same output).
bool topk_least() {
    const char* v = std::getenv("OPENJET_TOPK");
    return !(v && std::strcmp(v, "sort") == 0);
}

__global__ void __launch_bounds__(kThreads) penalise_kernel(float* x, int n, const int32_t* ids,
                                                            const float* deltas, int n_pen) {
    pdl_start();  // pdl.cuh
    float* row = x + static_cast<long long>(blockIdx.y) * n;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_pen; i += gridDim.x * blockDim.x)
        row[ids[i]] = __fsub_rn(row[ids[i]], deltas[i]);
}

template <bool kLeast>
__global__ void __launch_bounds__(kThreads) topk_chunk_kernel(const float* __restrict__ x, int n, int n_valid,
                                                              const int32_t* __restrict__ row_ids,
                                                              unsigned long long* __restrict__ out, int n_chunks) {
    __shared__ unsigned long long s[kChunk];
    pdl_start();  // pdl.cuh
    const int chunk = blockIdx.x, row = blockIdx.y;
    const float* xr = x + static_cast<long long>(row) * n;
    for (int i = threadIdx.x; i < kChunk; i += kThreads)
        s[i] = entry_key(xr, chunk * kChunk + i, n, n_valid, row_ids);
    __syncthreads();
    if constexpr (kLeast) least_keys(s, kChunk, true);
    else bitonic_sort(s, kChunk);
    if (threadIdx.x < kTopKMax)
        out[(static_cast<long long>(row) * n_chunks + chunk) * kTopKMax + threadIdx.x] = s[threadIdx.x];
}

template <bool kLeast>
__global__ void __launch_bounds__(kThreads) topk_merge_kernel(const unsigned long long* __restrict__ in, int n_chunks,
                                                              int k, float* __restrict__ values,
                                                              int32_t* __restrict__ ids) {
    __shared__ unsigned long long s[kMaxChunks * kTopKMax];
    pdl_start();  // pdl.cuh
    const int row = blockIdx.x;
    int m = kTopKMax;
    while (m < n_chunks * kTopKMax) m <<= 1;  // a power of two
    const unsigned long long* r = in + static_cast<long long>(row) * n_chunks * kTopKMax;
    for (int i = threadIdx.x; i < m; i += kThreads) s[i] = i < n_chunks * kTopKMax ? r[i] : kNone;
    __syncthreads();
    if constexpr (kLeast) least_keys(s, m, false);  // each chunk's keys came sorted
    else bitonic_sort(s, m);
    if (threadIdx.x < k) {
        const unsigned long long key = s[threadIdx.x];
        values[static_cast<long long>(row) * k + threadIdx.x] = from_orderable(~static_cast<uint32_t>(key >> 32));
        const int32_t id = key == kNone ? -1 : static_cast<int32_t>(key & 0xffffffffu);  // fewer valid than k
        ids[static_cast<long long>(row) * k + threadIdx.x] = id;
    }
}

int n_chunks_for(int n) { return (n + kChunk - 1) / kChunk; }

// The least of the block's keys (every thread gets it): a min is a min in any order, so this is the first of the
// bitonic sort's order without the sort. warp_least: kThreads / 32 slots of shared memory.
template <int kBlock> __device__ unsigned long long block_least(unsigned long long v, unsigned long long* warp_least) {
    for (int m = 16; m >= 1; m >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, m));
    if ((threadIdx.x & 31) == 0) warp_least[threadIdx.x >> 5] = v;
    __syncthreads();
    v = kNone;
#pragma unroll
    for (int i = 0; i < kBlock / 32; ++i) v = min(v, warp_least[i]);
    return v;
}

// k = 1 (greedy's argmax): pass 1 keeps each chunk's least key (slot 0 of its kTopKMax), pass 2 the least of those.
__global__ void __launch_bounds__(kThreads) topk_least_chunk_kernel(const float* __restrict__ x, int n, int n_valid,
                                                                    const int32_t* __restrict__ row_ids,
                                                                    unsigned long long* __restrict__ out,
                                                                    int n_chunks) {
    __shared__ unsigned long long warp_least[kThreads / 32];
    pdl_start();
    const int chunk = blockIdx.x, row = blockIdx.y;
    const float* xr = x + static_cast<long long>(row) * n;
    unsigned long long v = kNone;
    for (int i = threadIdx.x; i < kChunk; i += kThreads)
        v = min(v, entry_key(xr, chunk * kChunk + i, n, n_valid, row_ids));
    v = block_least<kThreads>(v, warp_least);
    if (threadIdx.x == 0) out[(static_cast<long long>(row) * n_chunks + chunk) * kTopKMax] = v;
}

__global__ void __launch_bounds__(kThreads) topk_least_merge_kernel(const unsigned long long* __restrict__ in,
                                                                    int n_chunks, float* __restrict__ values,
                                                                    int32_t* __restrict__ ids) {
    __shared__ unsigned long long warp_least[kThreads / 32];
    pdl_start();
    const int row = blockIdx.x;
    const unsigned long long* r = in + static_cast<long long>(row) * n_chunks * kTopKMax;
    unsigned long long v = kNone;
    for (int c = threadIdx.x; c < n_chunks; c += kThreads) v = min(v, r[c * kTopKMax]);
    v = block_least<kThreads>(v, warp_least);
    if (threadIdx.x == 0) {  // without row_ids, launch_topk's k <= n_valid: a valid key exists
        values[row] = from_orderable(~static_cast<uint32_t>(v >> 32));
        ids[row] = v == kNone ? -1 : static_cast<int32_t>(v & 0xffffffffu);
    }
}

// launch_argmax: one block; the least make_key over the row (the first of launch_topk's order), its id mapped.
constexpr int kArgmaxThreads = 1024;
__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const float* __restrict__ x, int n,
                                                                 const int32_t* __restrict__ row_ids, int n_valid,
                                                                 int32_t* id_out, float* value_out, int32_t* id_copy) {
    __shared__ unsigned long long warp_least[kArgmaxThreads / 32];
    pdl_start();
    unsigned long long v = kNone;
    // entry_key's keys, kBatch entries' loads (id and logit, both read wherever the entry is in the row) in flight
    // before the first key (a draft vocabulary's 32,768 rows: 2 round trips a thread instead of 32 pairs of them; 4
    // with 8 entries, before 2026-12-07); the least key does not depend on the order, so neither do the bits.
    constexpr int kBatch = 16;
    for (int i0 = threadIdx.x; i0 < n; i0 += kBatch * kArgmaxThreads) {
        int id[kBatch];
        float xv[kBatch];
#pragma unroll
        for (int q = 0; q < kBatch; ++q) {
            const int pos = i0 + q * kArgmaxThreads;
            id[q] = pos >= n ? -1 : row_ids ? row_ids[pos] : pos;
            xv[q] = pos >= n ? 0.0f : x[pos];
        }
        asm volatile("" ::: "memory");
#pragma unroll
        for (int q = 0; q < kBatch; ++q) v = min(v, valid_key(xv[q], id[q], n_valid));
    }
    v = block_least<kArgmaxThreads>(v, warp_least);
    if (threadIdx.x) return;
    // No candidate (every id >= n_valid): id 0 at -inf, what ranking the whole row padded with -inf gives.
    const int id = v == kNone ? 0 : static_cast<int>(static_cast<uint32_t>(v));
    *id_out = id;
    const float minus_inf = __uint_as_float(0xff800000u);
    if (value_out) *value_out = v == kNone ? minus_inf : from_orderable(~static_cast<uint32_t>(v >> 32));
    if (id_copy) *id_copy = id;
}

}  // namespace

cudaError_t launch_argmax(const float* x, int n, const int32_t* row_ids, int n_valid, int32_t* id_out,
                          float* value_out, int32_t* id_copy, cudaStream_t stream) {
    if (!x || !id_out || n < 1 || n_valid < 1) return cudaErrorInvalidValue;
    return launch_kernel(argmax_kernel, 1, kArgmaxThreads, 0, stream, x, n, row_ids, n_valid, id_out, value_out,
                         id_copy);
}

size_t topk_work_bytes(int rows, int n) {
    return sizeof(unsigned long long) * static_cast<size_t>(rows) * n_chunks_for(n) * kTopKMax;
}

cudaError_t launch_topk(float* x, int rows, int n, int n_valid, int k, const int32_t* pen_ids,
                        const float* pen_deltas, int n_pen, float* values, int32_t* ids, void* work,
                        cudaStream_t stream, const int32_t* row_ids) {
    const int n_chunks = n_chunks_for(n);
    // Without row_ids k must leave no padding key in the output: at least k valid ids. Penalties index the row by
    // id, so they take no row_ids.
    if (!x || !values || !ids || !work || rows < 1 || rows > 65535 || n < 1 || n_chunks > kMaxChunks ||
        k < 1 || k > kTopKMax || n_valid < (row_ids ? 1 : k) || n_pen < 0 || (n_pen > 0 && (!pen_ids || !pen_deltas)) ||
        (n_pen > 0 && row_ids))
        return cudaErrorInvalidValue;
    if (n_pen > 0) {
        if (cudaError_t e = launch_kernel(penalise_kernel, dim3((n_pen + kThreads - 1) / kThreads, rows), kThreads, 0,
                                          stream, x, n, pen_ids, pen_deltas, n_pen))
            return e;
    }
    auto* keys = static_cast<unsigned long long*>(work);
    if (k == 1) {  // the argmax: a reduction per chunk and per row instead of two sorts (the same key wins)
        if (cudaError_t e = launch_kernel(topk_least_chunk_kernel, dim3(n_chunks, rows), kThreads, 0, stream, x, n,
                                          n_valid, row_ids, keys, n_chunks))
            return e;
        return launch_kernel(topk_least_merge_kernel, rows, kThreads, 0, stream, keys, n_chunks, values, ids);
    }
    const bool least = topk_least();
    if (cudaError_t e = launch_kernel(least ? topk_chunk_kernel<true> : topk_chunk_kernel<false>, dim3(n_chunks, rows),
                                      kThreads, 0, stream, x, n, n_valid,
                                      row_ids, keys, n_chunks))
        return e;
    return launch_kernel(least ? topk_merge_kernel<true> : topk_merge_kernel<false>, rows, kThreads, 0, stream, keys,
                         n_chunks, k, values, ids);
}

}  // namespace openjet
