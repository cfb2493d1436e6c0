// launch_topk (topk.cuh): two passes over 64-bit keys that order by value (descending) then id (ascending), so the
// result is deterministic and equals a stable sort's prefix.
//   pass 1: one block per (chunk of 4096 logits, row) keeps its chunk's first 32 keys;
//   pass 2: one block per row ranks the chunks' survivors (<= 64 chunks x 32) and writes the first k.
// k = 1 takes a min-reduction in both passes instead; for k > 1 the networks on shuffles over each warp's candidates
// (warp_least_keys; OPENJET_TOPK=least the bitonic top-k in shared memory, least_keys, =sort the full sorts). Each
// gives the same keys. launch_argmax (a draft step's pick over a draft vocabulary's rows) is one block's
// min-reduction.
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

// Entry pos's logit and id as entry_key reads them; past the row, id -1 (valid_key's kNone). For the kernels that
// issue every entry's loads before they make the first key (argmax_kernel, topk_warp_chunk_kernel).
__device__ __forceinline__ void load_entry(const float* xr, int pos, int n, const int32_t* row_ids, float& v, int& id) {
    id = pos >= n ? -1 : row_ids ? row_ids[pos] : pos;
    v = pos >= n ? 0.0f : xr[pos];
}

// Entry pos's key: its logit and id (row_ids[pos], or pos), kNone past the row or for an id outside [0, n_valid).
__device__ __forceinline__ unsigned long long entry_key(const float* xr, int pos, int n, int n_valid,
                                                        const int32_t* row_ids) {
    if (pos >= n) return kNone;
    const int id = row_ids ? row_ids[pos] : pos;
    return valid_key(xr[pos], id, n_valid);
}

// A ranked key into a top-k output: its logit and its id (-1 for kNone: fewer valid entries than k).
__device__ __forceinline__ void store_key(unsigned long long key, float* value, int32_t* id) {
    *value = from_orderable(~static_cast<uint32_t>(key >> 32));
    *id = key == kNone ? -1 : static_cast<int32_t>(key & 0xffffffffu);
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

// OPENJET_TOPK (read at each call: tests switch it): unset or "warp", warp_least_keys (below; the default since
// 2026-12-07: on the H100 at d6801d2 the k = 32 top-k's two launches 83 -> 11 us past the lm_head at T = 1, 81 -> 21 at
// T = 5); "least", least_keys (the default from 2026-12-05: on the H200 at 499afb1 the top-k of a T=1 step 0.160 ->
// 0.089 ms against "sort"); "sort", the full bitonic sorts. The same output from each.
enum class TopkForm { kSort, kLeast, kWarp };
TopkForm topk_form() {
    const char* v = std::getenv("OPENJET_TOPK");
    if (v && std::strcmp(v, "sort") == 0) return TopkForm::kSort;
    if (v && std::strcmp(v, "least") == 0) return TopkForm::kLeast;
    return TopkForm::kWarp;
}

// The warp form (OPENJET_TOPK=warp, the default). least_keys' rounds are shared-memory compare-exchanges between block
// barriers, ~57 of them over a 4,096-key chunk: on the H100 at f96c0f1 the k = 32 top-k took ~75 us from the lm_head's
// end to its chunks' end, at T = 1 and T = 5 alike (a chunk's latency, not the GPU's throughput). Here each warp keeps
// its 32 least keys so far in registers, one per lane, ascending, and the networks run on shuffles with no barrier: a
// batch of 32 keys is sorted (warp_sort32, 15 steps) and merged in (warp_merge32, 6 steps). Keys not below the warp's
// current 32nd least cannot be among the chunk's 32 least, so only the others (candidates) are gathered, in shared
// memory, and merged 32 at a time: for keys in random order ~4 merges of a warp's 512 instead of 16. Then the warps'
// runs merge in a tree. The 32 least keys are one set in one order whatever the network (the keys are distinct but
// for kNone), so the output is least_keys'.
using Key = unsigned long long;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kWarps = kThreads / 32;

// The warp's 32 keys (one a lane) sorted ascending by lane: the bitonic network on shuffles.
__device__ __forceinline__ Key warp_sort32(Key v) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int k = 2; k <= 32; k <<= 1) {
#pragma unroll
        for (int j = k >> 1; j > 0; j >>= 1) {
            const Key o = __shfl_xor_sync(kFull, v, j);
            const bool up = (lane & k) == 0, lower = (lane & j) == 0;  // (k = 32: every lane up)
            v = lower == up ? min(v, o) : max(v, o);
        }
    }
    return v;
}

// The 32 least of two ascending runs a and b (a key a lane each), ascending: min(a[i], b[31 - i]) is a bitonic run
// holding exactly them, which a bitonic merge sorts.
__device__ __forceinline__ Key warp_merge32(Key a, Key b) {
    const int lane = threadIdx.x & 31;
    Key v = min(a, __shfl_sync(kFull, b, 31 - lane));
#pragma unroll
    for (int j = 16; j > 0; j >>= 1) {
        const Key o = __shfl_xor_sync(kFull, v, j);
        v = (lane & j) == 0 ? min(v, o) : max(v, o);
    }
    return v;
}

struct WarpLeastSmem {
    Key candidates[kWarps][64];  // a warp's gathered candidates: fewer than 32 between merges, plus one batch
    Key runs[kWarps][32];        // the warps' runs, merged in a tree
};

// The kTopKMax least of the block's keys, ascending, in warp 0's lanes (every thread of the block, kThreads, takes
// part). keys[j] is lane's key of batch w + kWarps j of warp w (kNone where there is none); kSortedBatches: each
// batch's 32 keys come ascending (the chunks' runs), so a batch is merged whole where it holds a candidate.
template <int kPer, bool kSortedBatches>
__device__ __forceinline__ Key warp_least_keys(const Key (&keys)[kPer], WarpLeastSmem& sm) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    Key best = kNone, bound = kNone;  // bound: the warp's 32nd least so far (lane 31's)
    Key* cand = sm.candidates[w];
    int fill = 0;  // candidates gathered, warp-uniform
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        const Key v = keys[j];
        if constexpr (kSortedBatches) {
            if (__any_sync(kFull, v < bound)) {
                best = warp_merge32(best, v);
                bound = __shfl_sync(kFull, best, 31);
            }
        } else {
            const unsigned is = __ballot_sync(kFull, v < bound);
            if (v < bound) cand[fill + __popc(is & ((1u << lane) - 1u))] = v;
            fill += __popc(is);
            if (fill >= 32) {
                __syncwarp();
                best = warp_merge32(best, warp_sort32(cand[lane]));
                bound = __shfl_sync(kFull, best, 31);
                fill -= 32;
                const Key rest = lane < fill ? cand[32 + lane] : kNone;
                __syncwarp();
                if (lane < fill) cand[lane] = rest;
                __syncwarp();
            }
        }
    }
    if (!kSortedBatches && fill > 0) {
        __syncwarp();
        best = warp_merge32(best, warp_sort32(lane < fill ? cand[lane] : kNone));
    }
    sm.runs[w][lane] = best;
    __syncthreads();
#pragma unroll
    for (int half = kWarps / 2; half >= 1; half >>= 1) {
        if (w < half) {
            best = warp_merge32(best, sm.runs[w + half][lane]);
            sm.runs[w][lane] = best;
        }
        __syncthreads();
    }
    return best;
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
    const long long o = static_cast<long long>(row) * k + threadIdx.x;
    if (threadIdx.x < k) store_key(s[threadIdx.x], values + o, ids + o);
}

// The warp form's passes (warp_least_keys): the same chunks and the same work layout as topk_chunk_kernel /
// topk_merge_kernel. A warp's keys are batches w, w + kWarps, ... of 32, all loaded before the first merge.
__global__ void __launch_bounds__(kThreads) topk_warp_chunk_kernel(const float* __restrict__ x, int n, int n_valid,
                                                                   const int32_t* __restrict__ row_ids,
                                                                   Key* __restrict__ out, int n_chunks) {
    __shared__ WarpLeastSmem sm;
    pdl_start();
    const int chunk = blockIdx.x, row = blockIdx.y, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const float* xr = x + static_cast<long long>(row) * n;
    constexpr int kPer = kChunk / kThreads;
    float xv[kPer];  // (entry_key's values, every load in flight before the first key: argmax_kernel's loop)
    int id[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j)
        load_entry(xr, chunk * kChunk + (w + kWarps * j) * 32 + lane, n, row_ids, xv[j], id[j]);
    Key keys[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) keys[j] = valid_key(xv[j], id[j], n_valid);
    const Key best = warp_least_keys<kPer, false>(keys, sm);
    if (w == 0) out[(static_cast<long long>(row) * n_chunks + chunk) * kTopKMax + lane] = best;
}

__global__ void __launch_bounds__(kThreads) topk_warp_merge_kernel(const Key* __restrict__ in, int n_chunks, int k,
                                                                   float* __restrict__ values,
                                                                   int32_t* __restrict__ ids) {
    __shared__ WarpLeastSmem sm;
    pdl_start();
    const int row = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const Key* r = in + static_cast<long long>(row) * n_chunks * kTopKMax;
    constexpr int kPer = kMaxChunks / kWarps;  // a chunk's run is one batch
    Key keys[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        const int c = w + kWarps * j;
        keys[j] = c < n_chunks ? r[c * kTopKMax + lane] : kNone;
    }
    const Key best = warp_least_keys<kPer, true>(keys, sm);
    const long long o = static_cast<long long>(row) * k + lane;
    if (w == 0 && lane < k) store_key(best, values + o, ids + o);
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
    if (threadIdx.x == 0) store_key(v, values + row, ids + row);
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
        for (int q = 0; q < kBatch; ++q) load_entry(x, i0 + q * kArgmaxThreads, n, row_ids, xv[q], id[q]);
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
    const TopkForm form = topk_form();
    if (form == TopkForm::kWarp) {
        if (cudaError_t e = launch_kernel(topk_warp_chunk_kernel, dim3(n_chunks, rows), kThreads, 0, stream, x, n,
                                          n_valid, row_ids, keys, n_chunks))
            return e;
        return launch_kernel(topk_warp_merge_kernel, rows, kThreads, 0, stream, keys, n_chunks, k, values, ids);
    }
    const bool least = form == TopkForm::kLeast;
    if (cudaError_t e = launch_kernel(least ? topk_chunk_kernel<true> : topk_chunk_kernel<false>, dim3(n_chunks, rows),
                                      kThreads, 0, stream, x, n, n_valid,
                                      row_ids, keys, n_chunks))
        return e;
    return launch_kernel(least ? topk_merge_kernel<true> : topk_merge_kernel<false>, rows, kThreads, 0, stream, keys,
                         n_chunks, k, values, ids);
}

}  // namespace openjet
