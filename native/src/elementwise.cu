// launch_add_norm_pack, launch_swiglu_pack (elementwise.cuh): a decode row on a cluster of kPackCluster blocks (sm_90+,
// the default; OPENJET_PACK_CLUSTER=0: not), else one block of kPackThreads per row; launch_pack_act_cluster: the same
// for launch_pack_act's decode rows (the default too; OPENJET_PACK_CLUSTER=1 leaves them on one block), and
// launch_mtp_input_pack: the MTP head's embedding, input norms and pack of a decode row on one cluster (likewise).
#include <cooperative_groups.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cp_async.cuh"
#include "device_attr.cuh"
#include "elementwise.cuh"
#include "env_setting.h"
#include "embed.cuh"
#include "gemv_imma.cuh"  // pack_block_imma: the integer twin (ActPack::imma)
#include "launch_count.h"
#include "openjet.h"
#include "pdl.cuh"

namespace openjet {
namespace {

template <bool kStaged, int kThreads = kPackThreads, int kCached = kPackCached, bool kStageW = true>
__global__ void __launch_bounds__(kThreads)
add_norm_pack_kernel(float* __restrict__ h, const float* __restrict__ delta, const float* __restrict__ w, int k,
                     float eps, float* __restrict__ a_out, ActPack p) {
    extern __shared__ float staged[];  // kStaged: [k] the row after the add, [k] w (kStageW)
    pdl_start();  // pdl.cuh
    add_norm_pack_row<kStaged, kThreads, kCached, kStageW>(h, delta, w, k, eps, a_out, p, blockIdx.x, staged);
}

template <int kThreads = kPackThreads, int kCached = kPackCached>
__global__ void __launch_bounds__(kThreads)
swiglu_pack_kernel(const float* __restrict__ gate, const float* __restrict__ up, int k, ActPack p, long long ld) {
    pdl_start();  // pdl.cuh
    swiglu_pack_row<kThreads, kCached>(gate, up, k, p, blockIdx.x, ld);
}

// ------------------------------------------------------------------------------------------ a prefill's swiglu
// A prefill's swiglu pack in two streaming passes (OPENJET_PREFILL_SWIGLU, elementwise.cuh). The one-pass kernel keeps
// a row's 17,408 values in registers until its maximum is known (~70 KB a row: two rows per SM at a time), which left
// it at ~1.1 TB/s (H200, ncu: 619 us of a 4,096-row chunk's FFN). Pass 1, blocks of kSplitCols columns of a row:
// v = swiglu1(g, u) over gate's own cells, and the block's max |v| into the first up cell of its columns (read
// before by this block alone, dead after); pass 2, a block a row: the row's maximum from those cells, then v packed
// 32-block by 32-block (pack_block). The same values, maximum and packing as pack_act_row: the same bits. H200,
// 4,096 rows of 17,408: 201 us (86% of DRAM's rate) + 158 (issue-bound: pack_block's sums; pack_blocks4 since, its
// share of the gain not measured apart) against 619.
constexpr int kSplitThreads = 256, kSplitPer = 8, kSplitCols = kSplitThreads * kSplitPer;

__global__ void __launch_bounds__(kSplitThreads) swiglu_values_kernel(float* __restrict__ gate, float* __restrict__ up,
                                                                      int k, long long ld) {
    pdl_start();  // pdl.cuh
    const int row = blockIdx.y, c0 = blockIdx.x * kSplitCols;
    float* g = gate + row * ld;
    float* u = up + row * ld;
    float gv[kSplitPer], uv[kSplitPer];
#pragma unroll
    for (int j = 0; j < kSplitPer; ++j) {
        const int i = c0 + j * kSplitThreads + threadIdx.x;
        gv[j] = i < k ? g[i] : 0.0f;
        uv[j] = i < k ? u[i] : 0.0f;
    }
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < kSplitPer; ++j) {
        const int i = c0 + j * kSplitThreads + threadIdx.x;
        if (i < k) {
            const float v = swiglu1(gv[j], uv[j]);
            g[i] = v;
            m = fmaxf(m, fabsf(v));
        }
    }
    const float bm = block_amax<kSplitThreads>(m);  // its barrier: every thread has read its up cells
    if (threadIdx.x == 0) u[c0] = bm;
}

// The second pass, a block a row: v [t, k] (rows ld floats apart, 16-byte aligned) into the pack. The row's maximum
// from the first pass's block maxima (maxima: its cells kSplitCols apart), or where maxima is null (v written by the
// GEMM's swiglu epilogue, launch_pack_rows_streamed) by a pass over the row of its own; the pack reads the row again
// then (from L2: a block's 70 KB row was just read). Where scales is given, the row's scale is scales[row] (a power
// of two: prefill_gemm.cu's bounded form) and no maximum is taken.
__global__ void __launch_bounds__(kSplitThreads) pack_values_kernel(const float* __restrict__ v,
                                                                    const float* __restrict__ maxima, int k,
                                                                    ActPack p, long long ld,
                                                                    const float* __restrict__ scales) {
    pdl_start();  // pdl.cuh
    const int row = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float* vr = v + row * ld;
    float amax = 0.0f;
    if (maxima) {
        for (int c0 = 0; c0 < k; c0 += kSplitCols) amax = fmaxf(amax, maxima[row * ld + c0]);
    } else if (!scales) {
        const float4* v4 = reinterpret_cast<const float4*>(vr);  // k % 256 == 0 (act_pack_fits): whole float4s
        float m = 0.0f;
#pragma unroll 4
        for (int i = threadIdx.x; i < k / 4; i += kSplitThreads) {
            const float4 q = v4[i];
            m = fmaxf(m, fmaxf(fmaxf(fabsf(q.x), fabsf(q.y)), fmaxf(fabsf(q.z), fabsf(q.w))));
        }
        amax = block_amax<kSplitThreads>(m);
    }
    const ActRow r = scales ? act_row_scaled(p, row, k, scales[row]) : act_row(p, row, k, amax);
    const int nb = k / kActBlock;
    constexpr int kWarps = kSplitThreads / 32, kAhead = 4;  // 32-blocks a warp loads before packing them
    for (int b0 = warp; b0 < nb; b0 += kWarps * kAhead) {
        float x[kAhead];
#pragma unroll
        for (int q = 0; q < kAhead; ++q) {
            const int b = b0 + kWarps * q;
            x[q] = b < nb ? vr[b * kActBlock + lane] : 0.0f;
        }
        static_assert(kAhead == 4, "pack_blocks4");
        const int b4[4] = {b0, b0 + kWarps, b0 + 2 * kWarps, b0 + 3 * kWarps};
        pack_blocks4(x, r.s, b4, nb, r.h, r.sum);
    }
    if (threadIdx.x == 0) p.inv[row] = r.inv;
}

// ------------------------------------------------------------------------------------------ a prefill's rows
// More than a decode step's rows: row_pack_threads (act_pack.cuh) threads a row, each keeping its share of a 27B
// row in registers (add-norm 5,120; swiglu 17,408: at 256 threads 68 values, 99 registers, two rows per SM, which
// made the FFN of a 2,048-row chunk 150 -> 163 ms on the H200 at 96e5d47; at 512, 34 values, 60 registers: 147).
// The add-norm stages its row only (the norm weights, read by every block, stay in L1): 20 KB a block at 27B, so
// registers (40 a thread at 256) set the blocks per SM, not the 40 KB of the row and the weights.
template <int kThreads, int kCached>
cudaError_t launch_add_norm_rows(float* h, const float* delta, const float* w, int t, int k, float eps, float* a_out,
                                 const ActPack& p, cudaStream_t stream) {
    if (k <= kAddNormStagedMax)
        return launch_kernel(add_norm_pack_kernel<true, kThreads, kCached, false>, t, kThreads, sizeof(float) * k,
                             stream, h, delta, w, k, eps, a_out, p);
    return launch_kernel(add_norm_pack_kernel<false, kThreads, kCached>, t, kThreads, 0, stream, h, delta, w, k, eps,
                         a_out, p);
}

// ------------------------------------------------------------------------------------------ cluster packs
// A decode step's rows are one block each above: on one SM, a 17,408-element swiglu row takes ~19 us (ncu,
// cold) and an add-norm row ~8, ~190 launches per step. Here a row is split over a cluster of kPackCluster
// blocks (sm_90+: thread-block clusters): block r takes 32-blocks [r nb / C, (r + 1) nb / C) of the row's nb,
// each warp its 32-blocks warp, warp + 8, ... (lane = element, as pack_block wants), values in registers.
// The row's max |value| (order-free, so exact) meets in distributed shared memory, and the add-norm's sum of
// squares reads the whole row there in row_rms_scale's order: every block computes the bits the one-block
// kernel computes. Measured in the 27B's step on the H200 (2026-12-03, tile layout): T=1 9.97 -> 9.44 ms, T=4 11.32
// -> 10.79 (bench/results/engine-full-h200-b1c5c47-cluster-*.json): the default since.
constexpr int kPackCluster = 8;                // blocks per row
constexpr int kPackClusterThreads = 256;       // row_rms_scale's kRowThreads: its order needs exactly these
constexpr int kPackClusterCached = 12;         // 32-blocks per warp kept in registers: rows up to 24,576
static_assert(kPackClusterThreads == kRowThreads, "the add-norm cluster pack sums squares as row_rms_scale");
constexpr int kPackClusterWarps = kPackClusterThreads / 32;
constexpr int kPackClusterMaxK = kPackCluster * kPackClusterWarps * kPackClusterCached * kActBlock;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define OPENJET_PACK_CLUSTER_ARCH 1  // the device code of the cluster packs (empty kernels below sm_90: not launched)

// The row's max |v| over the cluster: this thread's m, reduced in the block, exchanged through each block's
// block_max (the caller's __shared__ float), then the max over the blocks; ends with a cluster barrier after
// which every block_max may be rewritten.
__device__ __forceinline__ float cluster_row_max(float m, float* block_max) {
    namespace cg = cooperative_groups;
    const float bm = block_amax<kPackClusterThreads>(m);
    if (threadIdx.x == 0) *block_max = bm;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every block's block_max is written
    float amax = 0.0f;
#pragma unroll
    for (int r = 0; r < kPackCluster; ++r) amax = fmaxf(amax, *cluster.map_shared_rank(block_max, r));
    cluster.sync();  // every block has read them
    return amax;
}

// The pack of this block's 32-blocks b0 + warp + 8 j (values v[j]) for the row's max |x| amax, and the row's inv
// (rank 0); where the pack has an integer twin (ActPack::imma), that row too, under the row's scale.
__device__ __forceinline__ void cluster_pack_slice(const float (&v)[kPackClusterCached], int b0, int b1, float amax,
                                                   int k, const ActPack& p, int row, int rank) {
    const int warp = threadIdx.x >> 5;
    const ActRow r = act_row(p, row, k, amax);
#pragma unroll
    for (int j = 0; j < kPackClusterCached; ++j) {
        const int b = b0 + warp + kPackClusterWarps * j;
        if (b < b1) pack_block(v[j], r.s, b, r.h, r.sum);
    }
    if (rank == 0 && threadIdx.x == 0) p.inv[row] = r.inv;
    if (p.imma) {
        const ActPackI q = act_pack_imma_of(p, k);
        const ImmaScale sc = imma_scale(amax);
#pragma unroll
        for (int j = 0; j < kPackClusterCached; ++j) {
            const int b = b0 + warp + kPackClusterWarps * j;
            if (b < b1) pack_block_imma(v[j], sc.s, b, k, q, row);
        }
        if (rank == 0) imma_store_row_inv(q, row, k, sc.inv, threadIdx.x, kPackClusterThreads);
    }
}
#endif

// The pack of x (kSwiglu: of silu(x) * up) over a cluster per row: the bits of pack_act_kernel's (swiglu_pack_kernel's)
// one-block row.
template <bool kSwiglu>
__global__ void __launch_bounds__(kPackClusterThreads)
pack_cluster_kernel(const float* __restrict__ x, const float* __restrict__ up, int k, ActPack p) {
#ifdef OPENJET_PACK_CLUSTER_ARCH
    __shared__ float block_max;
    pdl_start();  // pdl.cuh
    const int rank = static_cast<int>(cooperative_groups::this_cluster().block_rank()), row = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nb = k / kActBlock;
    const int b0 = nb * rank / kPackCluster, b1 = nb * (rank + 1) / kPackCluster;
    const float* g = x + static_cast<long long>(row) * k;
    const float* u = kSwiglu ? up + static_cast<long long>(row) * k : nullptr;
    float v[kPackClusterCached], m = 0.0f;
    float gv[kPackClusterCached], uv[kPackClusterCached];
#pragma unroll
    for (int j = 0; j < kPackClusterCached; ++j) {  // every load first, then the values
        const int b = b0 + warp + kPackClusterWarps * j, i = b * kActBlock + lane;
        gv[j] = b < b1 ? g[i] : 0.0f;
        if (kSwiglu) uv[j] = b < b1 ? u[i] : 0.0f;
    }
    // (the loads stay above, all in flight at once: without this nvcc sank each pair into its element's branch, and
    // swiglu1's reciprocal branch then serialized a round trip per element: ~18 a thread, by the SASS; not yet timed)
    asm volatile("" ::: "memory");
#pragma unroll
    for (int j = 0; j < kPackClusterCached; ++j) {
        const int b = b0 + warp + kPackClusterWarps * j;
        v[j] = b < b1 ? (kSwiglu ? swiglu1(gv[j], uv[j]) : gv[j]) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kPackClusterCached; ++j) m = fmaxf(m, fabsf(v[j]));
    cluster_pack_slice(v, b0, b1, cluster_row_max(m, &block_max), k, p, row, rank);
#endif
}

#ifdef OPENJET_PACK_CLUSTER_ARCH
// Whether est, the row's max |value| known up to a relative 4 u (u = 2^-24; add_norm_pack_cluster_kernel's product
// bound), pins the binade act_pack_shift takes from the exact max: est normal and finite, and more than 2^-20
// (relative) inside its binade's ends, so the exact max lies in the same binade and gets the same shift.
__device__ __forceinline__ bool binade_pinned(float est) {
    if (!(est >= 0x1p-100f && est <= 0x1p100f)) return false;  // (NaN too)
    int e = 0;
    const float f = frexpf(est, &e);  // est = f 2^e, f in [0.5, 1)
    return f > 0.5f + 0x1p-21f && f < 1.0f - 0x1p-20f;
}
#endif

// h += delta (this block's part), a = rms(h) * w, packed; nb % kPackCluster == 0 (equal parts: the owner of
// element i is i / part_elems). max_est (the default; OPENJET_ADD_NORM_MAX_EST=0 off: the same bits): the pack's scale
// from a bound instead of the values' max where the bound pins it. Each value is fl(fl(h s) w) with s the row's
// rms scale, so max |value| lies within a relative 4 u of est = fl(s P), P = max fl(|h w|), which the blocks exchange
// with the row itself before the rms; where est pins act_pack_shift's binade (binade_pinned: every block decides
// alike, from the same s and P), the max's own cluster exchange (a block reduction and two cluster barriers) is
// skipped, and the blocks only wait at the end for the others' reads of their shared memory.
__global__ void __launch_bounds__(kPackClusterThreads)
add_norm_pack_cluster_kernel(float* __restrict__ h, const float* __restrict__ delta, const float* __restrict__ w,
                             int k, float eps, float* __restrict__ a_out, ActPack p, int max_est) {
#ifdef OPENJET_PACK_CLUSTER_ARCH
    namespace cg = cooperative_groups;
    extern __shared__ float hs[];  // this block's part of the row after the add
    __shared__ float block_max;
    __shared__ float warp_hw[kPackClusterWarps];  // max_est: each warp's max |h w|
    __shared__ float row_hw;                      // max_est: the row's, over the cluster
    __shared__ float ws[kPackClusterCached * kPackClusterThreads];  // the thread's norm weights, [j][thread]
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = static_cast<int>(cluster.block_rank()), row = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nb = k / kActBlock;
    const int part_blocks = nb / kPackCluster, part_elems = part_blocks * kActBlock;
    const int b0 = part_blocks * rank, b1 = b0 + part_blocks;
    float* hr = h + static_cast<long long>(row) * k;
    const float* dr = delta ? delta + static_cast<long long>(row) * k : nullptr;
    float x[kPackClusterCached], hv[kPackClusterCached], dv[kPackClusterCached];
    // The norm weights (immutable: pdl.cuh lets them be read before the wait) are copied in while the kernel before
    // still runs, so their trip from DRAM (a step's weight stream evicts them from L2) is off the row's critical path.
    // As cp.async copies: ptxas keeps those before the wait, where it moved plain loads after it (the SASS).
#pragma unroll
    for (int j = 0; j < kPackClusterCached; ++j) {
        const int b = b0 + warp + kPackClusterWarps * j;
        if (b < b1) cp_async4(&ws[j * kPackClusterThreads + threadIdx.x], w + b * kActBlock + lane);
    }
    cp_async_commit();
    pdl_start();  // pdl.cuh
#pragma unroll
    for (int j = 0; j < kPackClusterCached; ++j) {  // h and delta loads first (the stores to h below would keep the
        // compiler from issuing the next element's loads before them)
        const int b = b0 + warp + kPackClusterWarps * j, i = b * kActBlock + lane;
        hv[j] = b < b1 ? hr[i] : 0.0f;
        dv[j] = dr && b < b1 ? dr[i] : 0.0f;
    }
    asm volatile("" ::: "memory");
#pragma unroll
    for (int j = 0; j < kPackClusterCached; ++j) {
        const int b = b0 + warp + kPackClusterWarps * j, i = b * kActBlock + lane;
        x[j] = 0.0f;
        if (b < b1) {
            x[j] = dr ? __fadd_rn(hv[j], dv[j]) : hv[j];
            if (dr) hr[i] = x[j];
            hs[i - b0 * kActBlock] = x[j];
        }
    }
    if (max_est) {
        cp_async_wait<0>();  // the weights (each thread reads only those it copied: no barrier)
        float hw = 0.0f;
#pragma unroll
        for (int j = 0; j < kPackClusterCached; ++j)
            if (b0 + warp + kPackClusterWarps * j < b1)
                hw = fmaxf(hw, fabsf(__fmul_rn(x[j], ws[j * kPackClusterThreads + threadIdx.x])));
#pragma unroll
        for (int o = 16; o >= 1; o >>= 1) hw = fmaxf(hw, __shfl_xor_sync(0xffffffffu, hw, o));
        if (lane == 0) warp_hw[warp] = hw;
    }
    cluster.sync();  // every part of the row (and with max_est each warp's max |h w|) is in its block's shared memory
    const float scale = row_rms_scale_of(
        [&](int i) { return *cluster.map_shared_rank(hs + i % part_elems, i / part_elems); }, k, eps);
    float est = 0.0f;
    bool pinned = false;
    if (max_est) {
        if (warp == 0) {  // the row's max |h w|: the cluster's 64 warps' maxima
            float hw = 0.0f;
            for (int q = lane; q < kPackCluster * kPackClusterWarps; q += 32)
                hw = fmaxf(hw, *cluster.map_shared_rank(warp_hw + q % kPackClusterWarps, q / kPackClusterWarps));
#pragma unroll
            for (int o = 16; o >= 1; o >>= 1) hw = fmaxf(hw, __shfl_xor_sync(0xffffffffu, hw, o));
            if (lane == 0) row_hw = hw;
        }
        __syncthreads();
        est = __fmul_rn(scale, row_hw);
        pinned = binade_pinned(est);
        // This block's reads of the others' shared memory are done: arrive now, wait only before leaving (the max's
        // barriers, which keep shared memory alive otherwise, are skipped).
        if (pinned) asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    }
    float* copy = a_out ? a_out + static_cast<long long>(row) * k : nullptr;
    float m = 0.0f;
    cp_async_wait<0>();  // the weights (each thread reads only those it copied: no barrier)
#pragma unroll
    for (int j = 0; j < kPackClusterCached; ++j) {
        const int b = b0 + warp + kPackClusterWarps * j, i = b * kActBlock + lane;
        x[j] = b < b1 ? __fmul_rn(__fmul_rn(x[j], scale), ws[j * kPackClusterThreads + threadIdx.x]) : 0.0f;
        m = fmaxf(m, fabsf(x[j]));
        if (copy && b < b1) copy[i] = x[j];
    }
    if (pinned) {  // the shift est's binade gives (act_row takes only the binade): the exact max's
        cluster_pack_slice(x, b0, b1, est, k, p, row, rank);
        asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
        return;
    }
    // cluster_row_max's barriers also keep hs alive for the other blocks' reads above
    cluster_pack_slice(x, b0, b1, cluster_row_max(m, &block_max), k, p, row, rank);
#endif
}

// The MTP head's input rows (engine.cu mtp_rows), row `row` of cat = [rms(E[id]) * enorm | rms(hidden) * hnorm]
// packed as one row of 2 dim: launch_embed's values, launch_rmsnorm's for each half (its scale from row_rms_scale's
// order over the half, read from the half's blocks' shared memory) and launch_pack_act's pack (the row's max |v| over
// both halves), so the bits of those four launches, in one. Ranks 0 .. kPackCluster / 2 - 1 take the embedding half,
// the others the hidden one, each a quarter of its half (dim % 256 == 0: whole 32-blocks). Neither half is stored:
// the pack is what the head's eh_proj reads. hidden row 0 is hs0, row r > 0 hs1 + (r - 1) dim.
__global__ void __launch_bounds__(kPackClusterThreads)
mtp_input_pack_cluster_kernel(const uint8_t* __restrict__ table, int vocab, const int32_t* __restrict__ ids,
                              const float* __restrict__ hs0, const float* __restrict__ hs1,
                              const float* __restrict__ enorm, const float* __restrict__ hnorm, int dim, float eps,
                              ActPack p) {
#ifdef OPENJET_PACK_CLUSTER_ARCH
    namespace cg = cooperative_groups;
    constexpr int kHalfRanks = kPackCluster / 2;
    extern __shared__ float part[];  // this block's quarter of its half, before the norm
    __shared__ float block_max;
    pdl_start();  // pdl.cuh
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = static_cast<int>(cluster.block_rank()), row = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool hidden = rank >= kHalfRanks;
    const int half_blocks = dim / kActBlock, part_blocks = half_blocks / kHalfRanks;
    const int part_elems = part_blocks * kActBlock;
    const int hb0 = part_blocks * (rank % kHalfRanks);  // this block's first 32-block within its half
    const float* hr = hidden ? (row == 0 ? hs0 : hs1 + static_cast<long long>(row - 1) * dim) : nullptr;
    const float* w = hidden ? hnorm : enorm;
    const int id = ids[row];
    const bool valid = id >= 0 && id < vocab;  // (launch_embed's zeros otherwise)
    const uint8_t* er = table + static_cast<long long>(valid ? id : 0) * (dim / 256) * Block<kQ4_K>::kBytes;
    // Every load first, then the values (a round trip each otherwise): the hidden row's floats, or the embedding's
    // super-block heads and qs bytes, and the norm weights.
    float x[kPackClusterCached], wv[kPackClusterCached];
    Q4kElem q[kPackClusterCached];
#pragma unroll
    for (int j = 0; j < kPackClusterCached; ++j) {
        const int b = hb0 + warp + kPackClusterWarps * j, i = b * kActBlock + lane;
        const bool mine = b < hb0 + part_blocks;
        x[j] = hidden && mine ? hr[i] : 0.0f;
        q[j] = !hidden && mine && valid ? q4_k_load(er, i) : Q4kElem{};
        wv[j] = mine ? w[i] : 0.0f;
    }
    asm volatile("" ::: "memory");
#pragma unroll
    for (int j = 0; j < kPackClusterCached; ++j) {
        const int b = hb0 + warp + kPackClusterWarps * j, i = b * kActBlock + lane;
        if (b < hb0 + part_blocks) {
            if (!hidden && valid) x[j] = q4_k_value(q[j], i);  // (an id outside the vocabulary: zeros, as launch_embed)
            part[(b - hb0) * kActBlock + lane] = x[j];
        }
    }
    cluster.sync();  // every quarter of both halves is in its block's shared memory
    const int first_rank = hidden ? kHalfRanks : 0;
    const float scale = row_rms_scale_of(
        [&](int i) { return *cluster.map_shared_rank(part + i % part_elems, first_rank + i / part_elems); }, dim, eps);
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < kPackClusterCached; ++j) {
        const int b = hb0 + warp + kPackClusterWarps * j;
        x[j] = b < hb0 + part_blocks ? __fmul_rn(__fmul_rn(x[j], scale), wv[j]) : 0.0f;
        m = fmaxf(m, fabsf(x[j]));
    }
    // In the packed row of 2 dim this block's 32-blocks are b0 + warp + 8 j, as cluster_pack_slice takes them; its
    // cluster_row_max's barriers also keep `part` alive for the other blocks' reads above.
    const int b0 = (hidden ? half_blocks : 0) + hb0;
    cluster_pack_slice(x, b0, b0 + part_blocks, cluster_row_max(m, &block_max), 2 * dim, p, row, rank);
#endif
}

// Whether the cluster packs take a row of k for a pack of `level` (1: add-norm and swiglu, 2: the mixers' output
// packs): OPENJET_PACK_CLUSTER (read once) at least that level (unset: 2; 0: none), sm_90+, and k in equal parts
// of whole 32-blocks that the registers hold.
bool pack_cluster_takes(int k, int level = 1) {
    static const int asked = [] {
        const char* v = std::getenv("OPENJET_PACK_CLUSTER");
        return v && std::strcmp(v, "0") == 0 ? 0 : v && std::strcmp(v, "1") == 0 ? 1 : 2;
    }();
    // the kernels' code, not only the GPU, must be sm_90+ (below it they compile empty: a build for older
    // architectures run through PTX on a newer GPU must not take them)
    static const bool built = [] {
        cudaFuncAttributes a{};
        const bool ok = cudaFuncGetAttributes(&a, pack_cluster_kernel<true>) == cudaSuccess && a.ptxVersion >= 90;
        cudaGetLastError();  // not sticky
        return ok;
    }();
    int major = 0;
    return asked >= level && built && k % (kActBlock * kPackCluster) == 0 && k <= kPackClusterMaxK &&
           device_attribute(cudaDevAttrComputeCapabilityMajor, &major) == cudaSuccess && major >= 9;
}

// OPENJET_ADD_NORM_MAX_EST (on unless "0"; T=1 8.99 -> 8.80 ms with the GDN step's own pack on the H100 at
// 17de1b0), read at the first call (a decode step's 129 launches read no environment) unless a test set it.
int max_est_from_env() {
    const char* e = std::getenv("OPENJET_ADD_NORM_MAX_EST");
    return e && std::strcmp(e, "0") == 0 ? 0 : 1;
}
EnvSetting g_add_norm_max_est{max_est_from_env};

}  // namespace

void set_add_norm_max_est(int mode) { g_add_norm_max_est.set(mode, 1); }

bool pack_cluster_writes_imma(int k) { return pack_cluster_takes(k, 2); }

cudaError_t launch_add_norm_pack(float* h, const float* delta, const float* w, int t, int k, float eps,
                                 float* a_out, const ActPack& p, cudaStream_t stream) {
    if (!h || !w || !act_pack_fits(p, t, k)) return cudaErrorInvalidValue;
    // (only the cluster pack writes the integer twin: every other form refuses a pack that has one)
    if (t > OPENJET_ENGINE_MAX_T && !act_pack_plain(p)) return cudaErrorNotSupported;
    if (t > OPENJET_ENGINE_MAX_T) switch (row_pack_threads(RowPack::kAddNorm)) {
        case 1024: return launch_add_norm_rows<1024, kPackCached>(h, delta, w, t, k, eps, a_out, p, stream);
        case 512: return launch_add_norm_rows<512, 12>(h, delta, w, t, k, eps, a_out, p, stream);
        default: return launch_add_norm_rows<256, 20>(h, delta, w, t, k, eps, a_out, p, stream);
        }
    if (pack_cluster_takes(k)) {
        count_launch(Counted::kPackCluster);
        return launch_kernel_cluster(add_norm_pack_cluster_kernel, dim3(kPackCluster, t), kPackClusterThreads,
                                     sizeof(float) * (k / kPackCluster), stream, kPackCluster, h, delta, w, k, eps,
                                     a_out, p, g_add_norm_max_est.get());
    }
    if (!act_pack_plain(p)) return cudaErrorNotSupported;
    if (k <= kAddNormStagedMax)
        return launch_kernel(add_norm_pack_kernel<true>, t, kPackThreads, sizeof(float) * 2 * k, stream, h, delta, w,
                             k, eps, a_out, p);
    return launch_kernel(add_norm_pack_kernel<false>, t, kPackThreads, 0, stream, h, delta, w, k, eps, a_out, p);
}

cudaError_t launch_swiglu_pack(float* gate, float* up, int t, int k, const ActPack& p, cudaStream_t stream,
                               long long ld) {
    if (!gate || !up || !act_pack_fits(p, t, k) || (ld && ld < k)) return cudaErrorInvalidValue;
    // (only the cluster pack writes the integer twin: every other form refuses a pack that has one)
    if (t > OPENJET_ENGINE_MAX_T && !act_pack_plain(p)) return cudaErrorNotSupported;
    if (t > OPENJET_ENGINE_MAX_T && prefill_swiglu() != PrefillSwiglu::kRows) {  // two streaming passes
        const long long stride = ld ? ld : k;
        if (const cudaError_t e = launch_kernel(swiglu_values_kernel, dim3((k + kSplitCols - 1) / kSplitCols, t),
                                                kSplitThreads, 0, stream, gate, up, k, stride))
            return e;
        count_launch(Counted::kSwigluSplit);
        return launch_kernel(pack_values_kernel, t, kSplitThreads, 0, stream, gate, up, k, p, stride, nullptr);
    }
    if (t > OPENJET_ENGINE_MAX_T) switch (row_pack_threads(RowPack::kSwiglu)) {
        case 1024: return launch_kernel(swiglu_pack_kernel<>, t, kPackThreads, 0, stream, gate, up, k, p, ld);
        case 256: return launch_kernel(swiglu_pack_kernel<256, 68>, t, 256, 0, stream, gate, up, k, p, ld);
        default: return launch_kernel(swiglu_pack_kernel<512, 34>, t, 512, 0, stream, gate, up, k, p, ld);
        }
    if (pack_cluster_takes(k) && (!ld || ld == k)) {
        count_launch(Counted::kPackCluster);
        return launch_kernel_cluster(pack_cluster_kernel<true>, dim3(kPackCluster, t), kPackClusterThreads, 0,
                                     stream, kPackCluster, gate, up, k, p);
    }
    if (!act_pack_plain(p)) return cudaErrorNotSupported;
    return launch_kernel(swiglu_pack_kernel<>, t, kPackThreads, 0, stream, gate, up, k, p, ld);
}

PrefillSwiglu prefill_swiglu() {
    const char* v = std::getenv("OPENJET_PREFILL_SWIGLU");
    return v && std::strcmp(v, "rows") == 0           ? PrefillSwiglu::kRows
           : v && std::strcmp(v, "split") == 0        ? PrefillSwiglu::kSplit
           : v && std::strcmp(v, "epilogue-f32") == 0 ? PrefillSwiglu::kEpilogueF32
                                                      : PrefillSwiglu::kEpilogue;
}

cudaError_t launch_pack_rows_streamed(const float* v, int t, int k, const ActPack& p, cudaStream_t stream,
                                      const float* scales) {
    if (!v || reinterpret_cast<uintptr_t>(v) % 16 || !act_pack_fits(p, t, k)) return cudaErrorInvalidValue;
    if (!act_pack_plain(p)) return cudaErrorNotSupported;  // (it writes no integer twin)
    return launch_kernel(pack_values_kernel, t, kSplitThreads, 0, stream, v, nullptr, k, p, static_cast<long long>(k),
                         scales);
}

cudaError_t launch_mtp_input_pack(int qtype, const void* table, int vocab, const int32_t* ids, const float* hs0,
                                  const float* hs1, const float* enorm, const float* hnorm, int t, int dim, float eps,
                                  const ActPack& p, cudaStream_t stream) {
    constexpr int kHalfRanks = kPackCluster / 2;
    if (!table || !ids || !hs0 || (t > 1 && !hs1) || !enorm || !hnorm || vocab < 1 || dim < 256 || dim % 256 ||
        t < 1 || !act_pack_fits(p, t, 2 * dim))
        return cudaErrorInvalidValue;
    const int part_blocks = dim / kActBlock / kHalfRanks;  // (dim % 256 == 0: whole 32-blocks a quarter)
    if (qtype != kQ4_K || t > OPENJET_ENGINE_MAX_T || !pack_cluster_takes(2 * dim, 2) ||
        part_blocks > kPackClusterWarps * kPackClusterCached)
        return cudaErrorNotSupported;
    count_launch(Counted::kMtpInputPack);
    return launch_kernel_cluster(mtp_input_pack_cluster_kernel, dim3(kPackCluster, t), kPackClusterThreads,
                                 sizeof(float) * part_blocks * kActBlock, stream, kPackCluster,
                                 static_cast<const uint8_t*>(table), vocab, ids, hs0, hs1, enorm, hnorm, dim, eps, p);
}

cudaError_t launch_pack_act_cluster(const float* x, int t, int k, const ActPack& p, cudaStream_t stream) {
    if (!x || !act_pack_fits(p, t, k) || t > OPENJET_ENGINE_MAX_T || !pack_cluster_takes(k, 2))
        return cudaErrorNotSupported;
    count_launch(Counted::kPackCluster);
    return launch_kernel_cluster(pack_cluster_kernel<false>, dim3(kPackCluster, t), kPackClusterThreads, 0, stream,
                                 kPackCluster, x, nullptr, k, p);
}

}  // namespace openjet
