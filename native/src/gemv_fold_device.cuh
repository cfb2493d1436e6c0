// The fold's device code (gemv_fold.cuh: an add-norm pack made by the GEMVs around it), shared by the producer-warp
// GEMV (gemv_tma.cu: A's tile epilogue, B's own pack at t = 1) and the fold's pack launch (gemv_fold.cu, t > 1): one
// copy of the arithmetic, so a row's bits are the same whichever makes its pack.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "act_pack.cuh"
#include "elementwise.cuh"
#include "gemv_fold.cuh"
#include "gemv_mma.cuh"
#include "grid_sync.cuh"
#include "mbarrier.cuh"
#include "tma_ring.cuh"

namespace openjet {

// The fold's reading side (gemv_fold.cuh) makes its row's pack in shared memory past the ring: k up to kFoldMaxK, fp16
// values and 32-block sums.
constexpr int kFoldRowBytes = kFoldMaxK * 2 + (kFoldMaxK / kActBlock) * 2 * 2;
constexpr int kFoldThreads = kTmaConsumerWarps * 32;  // the threads that make a row's pack (their order is the rule's)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// The fold's row scale (gemv_fold.cuh) from a row's partials part [k / 16], by kFoldThreads threads (named barrier
// 1), in the fixed order every maker of the row's pack shares: thread i takes the 32-blocks b = i, i + 128 (q_2b +
// q_2b+1 added to its sum, the max of m_2b, m_2b+1), then the warp's xor butterfly (16 .. 1), then the four warps' in
// order; r = rsqrtf(Q / k + eps), the shift from the bound fl(fl(r P) (1 + 2^-10)), c = r 2^shift. sv[j]: the thread's
// s_2b + s_2b+1 of its 32-blocks (the pack's sums). A caller taking rows one after another passes a barrier
// between them (the next row's reduction rewrites red).
constexpr int kFoldPer = (kFoldMaxK / kActBlock + kFoldThreads - 1) / kFoldThreads;  // 32-blocks a thread, at most
struct FoldScale {
    float r, c, inv;
};
__device__ __forceinline__ FoldScale fold_row_scale(const float4* __restrict__ part, int k, float eps,
                                                    float (&sv)[kFoldPer]) {
    __shared__ float red[kTmaConsumerWarps][2];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nb = k / kActBlock;
    float q = 0.0f, m = 0.0f;
#pragma unroll
    for (int j = 0; j < kFoldPer; ++j) {
        const int b = tid + j * kFoldThreads;
        sv[j] = 0.0f;
        if (b < nb) {
            const float4 p0 = __ldg(part + 2 * b), p1 = __ldg(part + 2 * b + 1);
            q = __fadd_rn(q, __fadd_rn(p0.x, p1.x));
            m = fmaxf(m, fmaxf(p0.y, p1.y));
            sv[j] = __fadd_rn(p0.z, p1.z);
        }
    }
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) {
        q += __shfl_xor_sync(0xffffffffu, q, o);
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    }
    if (lane == 0) red[warp][0] = q, red[warp][1] = m;
    named_bar_sync(1, kFoldThreads);
    float qs = red[0][0], pm = red[0][1];
#pragma unroll
    for (int w = 1; w < kTmaConsumerWarps; ++w) qs = __fadd_rn(qs, red[w][0]), pm = fmaxf(pm, red[w][1]);
    const float r = rsqrtf(__fdiv_rn(qs, static_cast<float>(k)) + eps);
    const int sh = act_pack_shift(__fmul_rn(__fmul_rn(r, pm), 1.0f + 0x1p-10f));
    return {r, __fmul_rn(r, ldexpf(1.0f, sh)), ldexpf(1.0f, -sh)};
}

// A 32-block's sum in the pack (act_sum_pos's hi / lo halves of S / 32) from s2 = s_2b + s_2b+1 of its partials,
// under the row's c: t32 = fl(fl(c s2) / 32), the division exact. Into sum and, where given, copy.
__device__ __forceinline__ void fold_block_sum(float c, float s2, int b, __half* sum, __half* copy = nullptr) {
    act_store_sum(__fmul_rn(c, s2), b, sum, copy);
}

// The fold's pack of one token row (gemv_fold.cuh), by kFoldThreads threads (named barrier 1): from u [k] and its
// partials part [k / 16], the row's fp16 values into h (the pack's order: each quad 0, 2, 1, 3), its k / 32 sums into
// sum (act_sum_pos's layout) and (c, inv) into c_inv. The row's u is loaded whole with the partials (kQuads float4 a
// thread, all in flight together) through the read-only path, as the GEMVs read their packs: the blocks an SM holds
// read the same row, so L1 can serve all but the first (H100, bench_pack_chain at T=1: 15.12 us a chain, against
// 18.37 with L2-only loads at 1f37765 and 15.48 with no middle). The scale by fold_row_scale. h and sum may be shared
// memory (B's staged row) or a pack in global memory (launch_fold_pack): the same bits either way. copy (optional):
// the row again for the kernels after B (GemvFold::a_out, pack_out): a = fl(u r) in copy.a, and the same fp16 values
// and sums in copy.h, copy.sum (each null: not written).
struct FoldRowCopy {
    float* a = nullptr;
    __half* h = nullptr;
    __half* sum = nullptr;
};
__device__ __forceinline__ void fold_pack_row(const float* __restrict__ u, const float4* __restrict__ part, int k,
                                              float eps, __half* h, __half* sum, float2* c_inv,
                                              FoldRowCopy copy = {}) {
    constexpr int kQuads = kFoldMaxK / 4 / kFoldThreads;
    const int tid = threadIdx.x, nb = k / kActBlock;
    float4 uq[kQuads];
#pragma unroll
    for (int j = 0; j < kQuads; ++j) {
        const int i = tid + j * kFoldThreads;
        if (4 * i < k) uq[j] = __ldg(reinterpret_cast<const float4*>(u) + i);
    }
    float sv[kFoldPer];
    const FoldScale fs = fold_row_scale(part, k, eps, sv);
    const float r = fs.r, c = fs.c;
    if (tid == 0) *c_inv = make_float2(c, fs.inv);
#pragma unroll
    for (int j = 0; j < kFoldPer; ++j) {
        const int b = tid + j * kFoldThreads;
        if (b < nb) fold_block_sum(c, sv[j], b, sum, copy.sum);
    }
#pragma unroll
    for (int j = 0; j < kQuads; ++j) {
        const int i = tid + j * kFoldThreads;
        if (4 * i < k) {
            const __half2 lo = __floats2half2_rn(__fmul_rn(uq[j].x, c), __fmul_rn(uq[j].z, c));
            const __half2 hi = __floats2half2_rn(__fmul_rn(uq[j].y, c), __fmul_rn(uq[j].w, c));
            const uint2 v = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
            *reinterpret_cast<uint2*>(h + 4 * i) = v;
            if (copy.h) *reinterpret_cast<uint2*>(copy.h + 4 * i) = v;
            if (copy.a)
                reinterpret_cast<float4*>(copy.a)[i] =
                    make_float4(__fmul_rn(uq[j].x, r), __fmul_rn(uq[j].y, r), __fmul_rn(uq[j].z, r),
                                __fmul_rn(uq[j].w, r));
        }
    }
    named_bar_sync(1, kFoldThreads);  // the row's pack before any thread reads it
}

// B's rows at t > 1 made by its own blocks (GemvFold::rows, FoldRowsSync), by each block's kFoldThreads consumer
// threads after the kernel's PDL wait: block b makes token rows b, b + gridDim.x, ... < t (one each where the grid
// holds t blocks) in x, with the normed rows in f.a_out and the rows' (c, inv) in f.scales where given, as
// fold_pack_kernel does, counting each; every block waits until all t rows are counted. x is then read as any pack
// (through the read-only path: thread 0's acquire invalidates the SM's L1 after the rows' stores, and no warp reads x
// before it).
__device__ __forceinline__ void fold_rows_make(const GemvFold& f, const ActPack& x, int k, int t) {
    __shared__ float2 c_inv;
    for (int c = blockIdx.x; c < t; c += gridDim.x) {  // (fold_pack_row's closing barrier parts two rows)
        const long long at = static_cast<long long>(c) * k;
        const FoldRowCopy copy{f.a_out ? f.a_out + at : nullptr, nullptr, nullptr};
        fold_pack_row(f.u_in + at, f.part_in + static_cast<long long>(c) * (k / kMmaRows), k, f.eps, x.h + at,
                      x.sum + static_cast<long long>(c) * (k / kActBlock) * 2, &c_inv, copy);
        if (threadIdx.x == 0) {
            x.inv[c] = c_inv.y;
            if (f.scales) f.scales[c] = c_inv;
            __threadfence();  // the row's stores (every thread's, before fold_pack_row's closing barrier) first
            atomicAdd(&f.rows->ready, 1);
        }
    }
    if (threadIdx.x == 0) spin_until(&f.rows->ready, [t](int v) { return v >= t; });  // (a row never made: trap)
    named_bar_sync(1, kFoldThreads);
}

// Whether this block is the last of its launch out (by thread 0, past its wait; left: the launch's count of those):
// its caller then zeroes the launch's words for the next launch (fold_rows_leave, swiglu_rows_leave).
__device__ __forceinline__ bool last_block_out(int* left) {
    return threadIdx.x == 0 && atomicAdd(left, 1) == static_cast<int>(gridDim.x) - 1;
}

// The end of a block of fold_rows_make's launch: the last block out zeroes the words.
__device__ __forceinline__ void fold_rows_leave(const GemvFold& f) {
    if (last_block_out(&f.rows->left)) {
        atomicExch(&f.rows->ready, 0);
        atomicExch(&f.rows->left, 0);
    }
}

// The swiglu pack of t rows of k made by the first packers of the GEMV that reads it (GemvFold::swiglu_rows,
// SwigluRowsSync), by each block's kFoldThreads consumer threads after the kernel's PDL wait; every block waits until
// the whole pack is in. The values, maxima and pack_block's stores as every swiglu pack's, so the same bits.
__device__ __forceinline__ void swiglu_rows_make(const GemvFold& f, const ActPack& x, int k, int t) {
    SwigluRowsSync* const s = f.swiglu_rows;
    const int packers = min(static_cast<int>(gridDim.x), kSwigluPackers);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nb = k / kActBlock;
    const int b0 = static_cast<int>(blockIdx.x) + packers * warp, step = packers * kTmaConsumerWarps;
    const auto v_at = [&](int c, int b) {  // (g and u are the kernel before's: read-only here)
        const long long i = static_cast<long long>(c) * k + b * kActBlock + lane;
        return swiglu1(__ldg(f.swiglu_g + i), __ldg(f.swiglu_u + i));
    };
    if (static_cast<int>(blockIdx.x) < packers) {
        __shared__ float warp_max_of[kTmaConsumerWarps][kActRows];
        __shared__ float row_max[kActRows];
        for (int c = 0; c < t; ++c) {  // this block's max |v| of each row
            float m = 0.0f;
            for (int b = b0; b < nb; b += step) m = fmaxf(m, fabsf(v_at(c, b)));
#pragma unroll
            for (int o = 16; o >= 1; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            if (lane == 0) warp_max_of[warp][c] = m;
        }
        named_bar_sync(1, kFoldThreads);
        if (tid < t) {
            float m = warp_max_of[0][tid];
#pragma unroll
            for (int w = 1; w < kTmaConsumerWarps; ++w) m = fmaxf(m, warp_max_of[w][tid]);
            atomicMax(&s->row_max[tid], __float_as_uint(m));
        }
        named_bar_sync(1, kFoldThreads);  // the block's maxima in before thread 0 counts them
        if (tid == 0) {
            __threadfence();
            atomicAdd(&s->maxed, 1);
            spin_until(&s->maxed, [packers](int v) { return v >= packers; });
        }
        named_bar_sync(1, kFoldThreads);
        if (tid < t) row_max[tid] = __uint_as_float(__ldcg(&s->row_max[tid]));  // (after thread 0's acquire)
        named_bar_sync(1, kFoldThreads);
        for (int c = 0; c < t; ++c) {  // this block's 32-blocks of each row, under the row's exact max
            const ActRow r = act_row(x, c, k, row_max[c]);
            for (int b = b0; b < nb; b += step) pack_block(v_at(c, b), r.s, b, r.h, r.sum);
            if (blockIdx.x == 0 && tid == 0) x.inv[c] = r.inv;
        }
        named_bar_sync(1, kFoldThreads);  // the block's share in before thread 0 counts it
        if (tid == 0) {
            __threadfence();
            atomicAdd(&s->ready, 1);
        }
    }
    if (tid == 0) spin_until(&s->ready, [packers](int v) { return v >= packers; });
    named_bar_sync(1, kFoldThreads);
}

// The end of a block of swiglu_rows_make's launch: the last block out zeroes the words.
__device__ __forceinline__ void swiglu_rows_leave(const GemvFold& f) {
    SwigluRowsSync* const s = f.swiglu_rows;
    if (last_block_out(&s->left)) {
#pragma unroll
        for (int c = 0; c < kActRows; ++c) atomicExch(&s->row_max[c], 0u);
        atomicExch(&s->maxed, 0);
        atomicExch(&s->ready, 0);
        atomicExch(&s->left, 0);
    }
}

// The fold's epilogue inputs of a tile, loaded by warp 0 before the tile's units (they are the kernel before's, read
// after the PDL wait, and the norm's weights), so that its stores wait for no load: the lane's residual values h of
// token rows 2 tq + cc (cc = 0, 1) at rows g and g + 8 (hr = 0, 1), and the norm's weights of those rows.
struct FoldTileIn {
    float h[2][2], w[2];
    __device__ __forceinline__ void load(const GemvFold& f, int lane, int tile, int n, int t) {
        const int g = lane >> 2, tq = lane & 3;
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int row = tile * kMmaRows + g + 8 * hr;
            w[hr] = __ldg(f.w + row);
#pragma unroll
            for (int cc = 0; cc < 2; ++cc) {
                const int col = 2 * tq + cc;
                h[cc][hr] = col < t ? f.h[static_cast<long long>(col) * n + row] : 0.0f;
            }
        }
    }
};

// A 16-row tile's partials of one token row {q, m, s, 0} (gemv_fold.cuh) from a warp whose lane 4 g + tq holds the
// row's values at rows g and g + 8 of the tile (hn: after the add, uu = hn w): the lane's pair first, then the xor
// butterfly over g (lanes 4, 8, 16 apart), so lanes g = 0 hold the tile's. One tree for A's epilogue and the prefill's
// fold rows (fold_rows_kernel), whatever tq holds.
__device__ __forceinline__ float4 fold_tile_partials(const float (&hn)[2], const float (&uu)[2]) {
    float q = __fmaf_rn(hn[0], hn[0], __fmul_rn(hn[1], hn[1]));
    float m = fmaxf(fabsf(uu[0]), fabsf(uu[1]));
    float s = __fadd_rn(uu[0], uu[1]);
#pragma unroll
    for (int o = 4; o <= 16; o <<= 1) {
        q += __shfl_xor_sync(0xffffffffu, q, o);
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        s += __shfl_xor_sync(0xffffffffu, s, o);
    }
    return make_float4(q, m, s, 0.0f);
}

// A tile's outputs with the fold's epilogue (gemv_fold.cuh) in place of tile_sum_store_by's stores, by warp 0: the
// same sums and y, then hn = y + h -> h_out, u = hn w -> u (h and w: in, loaded before the tile's units), and the
// tile's partials of each token row (fold_tile_partials).
template <class InvOf>
__device__ __forceinline__ void fold_tile_store(const float (&part)[kGemvWarps][1][32][4], int lane, int tile, int n,
                                                int t, const InvOf& inv_of, const FoldTileIn& in, const GemvFold& f) {
    const int g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {  // token row 2 tq + cc
        const int col = 2 * tq + cc;
        float hn[2] = {0.0f, 0.0f}, uu[2] = {0.0f, 0.0f};
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {  // rows g, g + 8: fragment element 2 hr + cc
            const float v = tile_quarters_sum(part, 0, lane, 2 * hr + cc);
            const int row = tile * kMmaRows + g + 8 * hr;
            if (col < t) {
                const long long at = static_cast<long long>(col) * n + row;
                hn[hr] = __fadd_rn(__fmul_rn(v, inv_of(cc, col)), in.h[cc][hr]);
                uu[hr] = __fmul_rn(hn[hr], in.w[hr]);
                f.h_out[at] = hn[hr];
                f.u[at] = uu[hr];
            }
        }
        const float4 p = fold_tile_partials(hn, uu);
        if (g == 0 && col < t) f.part[static_cast<long long>(col) * (n / kMmaRows) + tile] = p;
    }
}

// ------------------------------------------------------------------------------ the swiglu's own pack
// launch_gemv_swiglu (gemv_fold.cuh): warp 0's state across a block's tile pairs: the gate tile's y values of the
// lane's fragment (rows g, g + 8 of token rows 2 tq, 2 tq + 1, tile_sum_store_by's order) until the up tile's epilogue,
// and the block's max |v| of the lane's two token rows.
struct SwigluTiles {
    float g[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float m[2] = {0.0f, 0.0f};
};

// A tile pair's epilogue, by warp 0 (first: the gate tile, whose y it keeps; else the up tile): the sums and
// y = fl(sum inv) as tile_sum_store_by makes them, then at the up tile v = swiglu1(g, u) into y [t, n] (gate's) and
// max |v| into st.m. The bits of the gate / up GEMVs' y and launch_swiglu_pack's values.
template <class InvOf>
__device__ __forceinline__ void swiglu_tile_store(const float (&part)[kGemvWarps][1][32][4], int lane, int tile, int n,
                                                  int t, const InvOf& inv_of, bool first, SwigluTiles& st,
                                                  float* __restrict__ y) {
    const int g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const float v = tile_quarters_sum(part, 0, lane, c);
        const int row = tile * kMmaRows + g + 8 * (c >> 1), col = 2 * tq + (c & 1);
        if (col >= t) continue;
        const float yv = __fmul_rn(v, inv_of(c & 1, col));
        if (first) {
            st.g[c] = yv;
        } else {
            const float sv = swiglu1(st.g[c], yv);
            y[static_cast<long long>(col) * n + row] = sv;
            st.m[c & 1] = fmaxf(st.m[c & 1], fabsf(sv));
        }
    }
}

// The meeting of a launch's blocks after their tiles (GridMeet), by each block's kFoldThreads consumer threads (named
// barrier 1): the block's stores so far published, then thread 0 arrives; the last block to arrive resets the arrivals
// and bumps the release word, the others wait for it to change from gen (the word as thread 0 read it after the
// kernel's PDL wait). Every block of the launch must be resident at once: the producer-warp grids are.
__device__ __forceinline__ void grid_meet(GridMeet* meet, int gen) {
    named_bar_sync(1, kFoldThreads);  // the block's stores, before thread 0's release
    if (threadIdx.x == 0) {
        __threadfence();  // (cumulative: the block's stores, seen through the barrier)
        const bool last = atomicAdd(&meet->arrive, 1) == static_cast<int>(gridDim.x) - 1;
        __threadfence();
        if (last) {  // every block has arrived: reset for the next launch, then release this one's
            atomicExch(&meet->arrive, 0);
            __threadfence();
            atomicExch(&meet->release, static_cast<int>(static_cast<unsigned>(gen) + 1u));  // (wraps: compared by !=)
        } else {  // (a block that never came: fail, not hang)
            spin_until(&meet->release, [gen](int v) { return v != gen; });
        }
    }
    named_bar_sync(1, kFoldThreads);  // every block's stores are in
}

// After a block's last tile pair, by its kFoldThreads consumer threads: warp 0 publishes the block's max |v| of each
// token row in meet->max_of[blockIdx.x] (its lanes g = 0 hold token rows 2 tq, 2 tq + 1, each lane's own tiles first:
// the butterfly over g), the meeting, then the rows' maxima over every block (exact in any order) and the block's
// share of the pack: 32-blocks blockIdx.x, + gridDim.x, ... of each token row, a warp each (v read back from L2: other
// blocks wrote it), under act_row's scale, as pack_cluster_kernel<true> packs them.
__device__ __forceinline__ void swiglu_meet_and_pack(const SwigluTiles& st, int gen, const float* v, int n, int t,
                                                     GridMeet* meet, const ActPack& p) {
    __shared__ float row_max[kActRows];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (warp == 0) {
        const int g = lane >> 2, tq = lane & 3;
        float m[2] = {st.m[0], st.m[1]};
#pragma unroll
        for (int cc = 0; cc < 2; ++cc)
#pragma unroll
            for (int o = 4; o <= 16; o <<= 1) m[cc] = fmaxf(m[cc], __shfl_xor_sync(0xffffffffu, m[cc], o));
        if (g == 0)
#pragma unroll
            for (int cc = 0; cc < 2; ++cc)
                if (2 * tq + cc < t) __stcg(&meet->max_of[blockIdx.x][2 * tq + cc], m[cc]);
    }
    grid_meet(meet, gen);
    for (int c = warp; c < t; c += kTmaConsumerWarps) {  // warp c % 4: row c's max over the blocks
        float r = 0.0f;
        for (int b = lane; b < static_cast<int>(gridDim.x); b += 32) r = fmaxf(r, __ldcg(&meet->max_of[b][c]));
#pragma unroll
        for (int o = 16; o >= 1; o >>= 1) r = fmaxf(r, __shfl_xor_sync(0xffffffffu, r, o));
        if (lane == 0) row_max[c] = r;
    }
    named_bar_sync(1, kFoldThreads);
    const int nb = n / kActBlock;
    for (int c = 0; c < t; ++c) {
        const ActRow r = act_row(p, c, n, row_max[c]);
        for (int b = blockIdx.x + static_cast<int>(gridDim.x) * warp; b < nb;
             b += static_cast<int>(gridDim.x) * kTmaConsumerWarps)
            pack_block(__ldcg(v + static_cast<long long>(c) * n + b * kActBlock + lane), r.s, b, r.h, r.sum);
        if (blockIdx.x == 0 && tid == 0) p.inv[c] = r.inv;
    }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace openjet
