// The integer-tensor-core decode GEMV and its activation pack (gemv_imma.cuh has the numerics).
//
// Shape, as the fp16 GEMV's: a block is one 16-row tile, its four warps the four k quarters; a warp streams its
// rows' super-blocks global -> shared with cp.async (TileCopy, gemv_mma.cuh) and multiplies each with mma.sync
// m16n8k32 (Q4_K: one 32-element sub-block) or m16n8k16 (Q6_K: one 16-element sub-block), u8 codes x s8 digits.
// The mma's 8 columns are (token, digit) pairs: column 2 j + d is digit d of token j, so tokens 0..3 take one mma
// per sub-block and tokens 4..7 a second. Lane (g, tq) holds C rows g, g + 8 x columns 2 tq, 2 tq + 1: both
// digits of token tq, combined in the lane.
// Which elements a lane's k slots hold is free inside a sub-block (an integer sum has no order): Q4_K lane tq
// takes elements 8 tq .. 8 tq + 7 of every sub-block (one 8-byte load of codes per row and two sub-blocks, one of
// digits per sub-block); Q6_K elements 4 tq .. 4 tq + 3 (one 4-byte load each).
#include "gemv_imma.cuh"
#include "gemv_imma_unit.cuh"

#include <cuda_runtime.h>

#include <algorithm>

#include "cp_async.cuh"
#include "device_attr.cuh"
#include "gemv_mma.cuh"
#include "gemv_tma.cuh"
#include "kquant.cuh"
#include "pdl.cuh"
#include "tma_ring.cuh"
#include "weight_layout.cuh"

namespace openjet {
namespace {

constexpr int kImmaWarps = 4;   // k quarters: the sum order is fixed on every GPU
constexpr int kImmaStagesDefault = 4;

// ------------------------------------------------------------------------------------------ the pack

// One block per (256-block, token row), a thread per element. kFromHalf: the values are the fp16 pack's h (x s,
// each exact in fp32) instead of floats x, and the block's inv is multiplied by the row's 1 / s (act_pack.cuh).
template <bool kFromHalf>
__global__ void __launch_bounds__(256) pack_act_imma_kernel(const float* __restrict__ x, ActPack xh, int k,
                                                            ActPackI p) {
    __shared__ float wmax[8];
    pdl_start();  // pdl.cuh: it reads the pack or floats the kernel before wrote
    const int b = blockIdx.x, row = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int e = b * 256 + threadIdx.x;
    const float v = kFromHalf ? __half2float(xh.h[static_cast<long long>(row) * k + act_quad_pos(e)])
                              : x[static_cast<long long>(row) * k + e];
    float m = fabsf(v);
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) wmax[warp] = m;
    __syncthreads();
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, wmax[i]);
    const ImmaScale sc = imma_scale(amax);
    pack_block_imma(v, sc.s, e / 32, k, p, row);
    if (threadIdx.x == 0)
        p.inv[static_cast<long long>(row) * (k / 256) + b] = kFromHalf ? __fmul_rn(sc.inv, xh.inv[row]) : sc.inv;
}

// ------------------------------------------------------------------------------------------ the kernel

// Warp 0's sum of a tile's k-quarter partials (part[warp][lane][2 s + i]: rows g + 8 i, token 4 s + tq), in order,
// into y from row row0: every form's sum, so every form's bits.
template <int NS>
__device__ __forceinline__ void imma_tile_store(const float (&part)[kImmaWarps][32][2 * NS], int lane, int row0, int n,
                                                int t, float* __restrict__ y) {
    const int g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int c = 0; c < 2 * NS; ++c) {
        float v = part[0][lane][c];
#pragma unroll
        for (int i = 1; i < kImmaWarps; ++i) v = __fadd_rn(v, part[i][lane][c]);
        const int row = row0 + g + 8 * (c & 1), tok = 4 * (c >> 1) + tq;
        if (row < n && tok < t) y[static_cast<long long>(tok) * n + row] = v;
    }
}

// Blocks per SM the registers are cut for: Q4_K at t <= 4 fits 4 (<= 128 registers); its t <= 8 form spilled there.
template <int QT, int NS> constexpr int imma_min_blocks() { return QT == kQ6_K || NS == 2 ? 3 : 4; }

// A block takes tiles blockIdx.x, blockIdx.x + gridDim.x, ... (one each when the grid has a block per tile; fewer
// blocks, "persistent": every SM's blocks stream tile after tile without a new block's ramp, the cp.async ring
// running on across tile boundaries). Warp i takes units [nu i / 4, nu (i + 1) / 4) of every tile; per tile, warp 0
// adds the four partials in order. NS: sets of 4 tokens (1: t <= 4, 2: t <= 8). The bits do not depend on the grid.
template <int QT, int NS, int kStages>
__global__ void __launch_bounds__(kImmaWarps * 32, imma_min_blocks<QT, NS>())
gemv_imma_kernel(const uint8_t* __restrict__ w, long long row_bytes, int n, int k, ActPackI p, int t,
                 float* __restrict__ y, bool tiled) {
    using S = MmaShape<QT>;
    extern __shared__ uint4 smem[];
    __shared__ float part[2][kImmaWarps][32][2 * NS];  // two: a tile's sums are read while the next tile's land
    pdl_launch_dependents();  // pdl_wait() below, after the first weight copies
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const int nu = k / kGemvUnit, tiles = (n + kMmaRows - 1) / kMmaRows;
    const int u0 = nu * warp / kImmaWarps, nuw = nu * (warp + 1) / kImmaWarps - u0;
    const int my_tiles = (tiles - 1 - static_cast<int>(blockIdx.x)) / static_cast<int>(gridDim.x) + 1;
    const int steps = my_tiles * nuw;  // this warp's units, tile after tile
    // Either layout (weight_layout.cuh): a tile's unit u at w + tile * tile_bytes + u * unit_step, its rows row_step
    // apart (the tile layout: a 16-row group's pieces of a unit contiguous, tile_pitch bytes each).
    const WeightSteps step(row_bytes, S::kUnitBytes, tiled, 0);
    const int row_step = step.row, unit_step = step.unit;  // (ints: 64-bit steps cost sm_120a spills)
    const long long tile_bytes = tiled ? nu * unit_step : kMmaRows * row_bytes;
    const uintptr_t w0 = reinterpret_cast<uintptr_t>(w) + u0 * unit_step;
    // Rows past n are never copied: TileCopy's plan is per tile's row count, so the last tile gets its own.
    const TileCopy<QT> copy_full(row_step, kMmaRows, 0, lane), copy_last(row_step, n - (tiles - 1) * kMmaRows, 0, lane);
    uint4* wsm = smem + warp * kStages * S::kStageWords;
    // The copy pointer of step `is`, kept incrementally: (tile index, unit within the quarter).
    int issue_tile = blockIdx.x, issue_u = 0;
    auto issue = [&](int is) {
        if (is < steps) {
            const uintptr_t a = w0 + issue_tile * tile_bytes + issue_u * unit_step;
            uint4* dst = wsm + is % kStages * S::kStageWords;
            if (issue_tile == tiles - 1) copy_last.issue(a, dst, lane);  // two call sites: no object in local memory
            else copy_full.issue(a, dst, lane);
            if (++issue_u == nuw) issue_u = 0, issue_tile += gridDim.x;
        }
        cp_async_commit();
    };
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) issue(s);
    pdl_wait();  // pdl.cuh: the weights' first copies are in flight; the pack and y belong to the stream

    int col_tok[NS];
    ImmaX<NS> x;
#pragma unroll
    for (int s = 0; s < NS; ++s) {
        col_tok[s] = min(4 * s + (g >> 1), t - 1);
        x.tok[s] = min(4 * s + tq, t - 1);
    }
    float acc[NS][2] = {};
    int is = 0, parity = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
#pragma unroll
        for (int s = 0; s < NS; ++s) x.col[s] = p.dig + (2LL * col_tok[s] + (g & 1)) * k + u0 * kGemvUnit;
        for (int uq = 0; uq < nuw; ++uq, ++is) {  // a warp may have no unit (k < 1024): it still joins the sums
            cp_async_wait<kStages - 2>();
            __syncwarp();
            const uint8_t* r[2];
            const uintptr_t a = w0 + tile * tile_bytes + uq * unit_step;
            tile_unit_rows<QT>(wsm + is % kStages * S::kStageWords, a, row_step, g, r);
            UnitImma<QT, NS>::run(r, x, p, u0 + uq, k, tq, acc);
#pragma unroll
            for (int s = 0; s < NS; ++s) x.col[s] += kGemvUnit;
            __syncwarp();
            issue(is + kStages - 1);
        }
        // the tile's quarters are done: their partials to shared memory, warp 0 adds the four in order
#pragma unroll
        for (int s = 0; s < NS; ++s)
#pragma unroll
            for (int i = 0; i < 2; ++i) part[parity][warp][lane][2 * s + i] = acc[s][i], acc[s][i] = 0.0f;
        __syncthreads();
        if (warp == 0) imma_tile_store<NS>(part[parity], lane, tile * kMmaRows, n, t, y);
        parity ^= 1;
    }
    cp_async_wait<0>();
}

// ------------------------------------------------------------------------------------------ the producer-warp form

// The integer GEMV on the producer-warp GEMV's shape (gemv_tma.cu, sm_90a, the tile layout): four consumer warps, one
// a k quarter of every tile as above, each unit from its ring of kRing slots that one producer thread fills with bulk
// copies (tma_ring.cuh) instead of its own cp.async; a block takes tiles blockIdx.x, + gridDim.x, ... (a grid of the
// blocks the GPU holds). The same units, the same per-warp order and the same sum of the four partials as
// gemv_imma_kernel: the same bits. The engine's integer GEMV under OPENJET_GEMV_INT=3 (gemv.cu launch_imma, on the
// pack's integer twin).
template <int QT> __host__ __device__ constexpr int tma_imma_ring() { return QT == kQ6_K ? 3 : 4; }  // (as gemv_tma)

template <int QT, int NS>
__global__ void __launch_bounds__(kTmaThreads, 3)
gemv_tma_imma_kernel(const uint8_t* __restrict__ w, int n, int k, ActPackI p, int t, float* __restrict__ y) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int kRing = tma_imma_ring<QT>(), kChunk = TmaUnit<QT>::kChunk, kPitch = TmaUnit<QT>::kPitch;
    extern __shared__ __align__(128) uint8_t ring[];
    __shared__ __align__(8) uint64_t bar_words[TmaBars<kRing>::kBytes / 8];  // full, then empty (tma_ring.cuh)
    __shared__ float part[2][kImmaWarps][32][2 * NS];  // double-buffered: one barrier a tile
    static_assert(kTmaConsumerWarps == kImmaWarps, "a consumer warp a k quarter, as the cp.async form's warps");
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int tiles = n / kMmaRows, nu = k / kGemvUnit;
    const TmaBars<kRing> bars{static_cast<uint32_t>(__cvta_generic_to_shared(bar_words))};
    bars.init();
    mbar_init_fence();
    __syncthreads();  // the barriers initialised; the only block-wide barrier
    pdl_launch_dependents();

    if (warp == kTmaConsumerWarps) {  // the producer: weights only (immutable: no pdl_wait needed)
        if (lane != 0) return;
        const uint64_t policy = l2_policy_evict_first();
        const uint32_t ring0 = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
        int issued[kTmaConsumerWarps] = {};
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x)
            tma_produce_tile<QT, kRing, kChunk>(bars, ring0, w + static_cast<long long>(tile) * nu * kChunk, nu, issued,
                                                policy);
        return;
    }

    // a consumer warp: quarter `warp` of each of the block's tiles
    const int g = lane >> 2, tq = lane & 3;
    const int u0 = quarter_begin(nu, warp), u1 = quarter_begin(nu, warp + 1);
    const uint32_t full0 = bars.full(warp, 0);
    const uint8_t* const ring_w = ring + warp * kRing * kChunk;
    pdl_wait();  // the pack and y belong to the stream (pdl.cuh)
    int col_tok[NS];
    ImmaX<NS> x;
#pragma unroll
    for (int s = 0; s < NS; ++s) {
        col_tok[s] = min(4 * s + (g >> 1), t - 1);
        x.tok[s] = min(4 * s + tq, t - 1);
    }
    int slot = 0, buf = 0;
    uint32_t phase = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, buf ^= 1) {
        float acc[NS][2] = {};
#pragma unroll
        for (int s = 0; s < NS; ++s) x.col[s] = p.dig + (2LL * col_tok[s] + (g & 1)) * k + u0 * kGemvUnit;
        for (int u = u0; u < u1; ++u) {
            mbar_wait_warp(full0 + 8 * slot, phase);
            const uint8_t* stage = ring_w + slot * kChunk;
            const uint8_t* r[2] = {stage + g * kPitch, stage + (g + 8) * kPitch};
            if constexpr (QT == kQ6_K) unit_imma_q6_k<true, NS>(r, x, p, u, k, tq, acc);  // (every row 4-byte aligned)
            else UnitImma<QT, NS>::run(r, x, p, u, k, tq, acc);
#pragma unroll
            for (int s = 0; s < NS; ++s) x.col[s] += kGemvUnit;
            tma_release_slot<kRing>(full0, lane, slot, phase);
        }
        // the tile's quarters are done: their partials to shared memory, warp 0 adds the four in order
#pragma unroll
        for (int s = 0; s < NS; ++s)
#pragma unroll
            for (int i = 0; i < 2; ++i) part[buf][warp][lane][2 * s + i] = acc[s][i];
        named_bar_sync(1, kTmaConsumerWarps * 32);  // (part[buf ^ 1] was read by warp 0 before it arrived here)
        if (warp == 0) imma_tile_store<NS>(part[buf], lane, tile * kMmaRows, n, t, y);
    }
#endif
}

template <int QT, int NS>
cudaError_t launch_tma_ns(const uint8_t* w, int n, int k, const ActPackI& p, int t, float* y, cudaStream_t stream) {
    constexpr int kSmem = kTmaConsumerWarps * tma_imma_ring<QT>() * TmaUnit<QT>::kChunk;
    constexpr auto kKernel = gemv_tma_imma_kernel<QT, NS>;
    const int per_sm = resident_per_sm<kKernel, kTmaThreads, kSmem>();
    int sms = 0;
    if (cudaError_t e = device_attribute(cudaDevAttrMultiProcessorCount, &sms)) return e;
    if (per_sm <= 0) return cudaErrorNotSupported;
    const int grid = std::min(n / kMmaRows, per_sm * sms);
    return launch_kernel(kKernel, grid, kTmaThreads, kSmem, stream, w, n, k, p, t, y);
}

template <int QT>
cudaError_t launch_tma_type(const uint8_t* w, int n, int k, const ActPackI& p, int t, float* y, cudaStream_t stream) {
    return t <= 4 ? launch_tma_ns<QT, 1>(w, n, k, p, t, y, stream) : launch_tma_ns<QT, 2>(w, n, k, p, t, y, stream);
}

template <int QT, int NS, int kStages>
cudaError_t launch_stages(const uint8_t* w, int n, int k, const ActPackI& p, int t, float* y, cudaStream_t stream,
                          bool persistent, bool tiled) {
    const long long row_bytes = row_bytes_of<QT>(k);
    if (!tile_offsets_fit(row_bytes)) return cudaErrorInvalidValue;
    const int smem = kImmaWarps * kStages * MmaShape<QT>::kStageWords * 16 + 16;
    auto* kern = gemv_imma_kernel<QT, NS, kStages>;
    static int resident = 0;  // blocks the whole GPU holds at once (per instance: its smem and registers)
    if (!resident) {
        if (cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)) return e;
        int per_sm = 0, sms = 0;
        if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, kImmaWarps * 32, smem)) return e;
        if (cudaError_t e = device_attribute(cudaDevAttrMultiProcessorCount, &sms)) return e;
        resident = per_sm * sms;
    }
    const int tiles = (n + kMmaRows - 1) / kMmaRows;
    const int grid = persistent ? std::min(tiles, resident) : tiles;
    return launch_kernel(kern, grid, kImmaWarps * 32, smem, stream, w, row_bytes, n, k, p, t, y, tiled);
}

template <int QT, int NS>
cudaError_t launch_ns(const uint8_t* w, int n, int k, const ActPackI& p, int t, float* y, cudaStream_t stream,
                      int stages, bool persistent, bool tiled) {
    switch (stages) {
        case 2: return launch_stages<QT, NS, 2>(w, n, k, p, t, y, stream, persistent, tiled);
        case 3: return launch_stages<QT, NS, 3>(w, n, k, p, t, y, stream, persistent, tiled);
        case 4: return launch_stages<QT, NS, 4>(w, n, k, p, t, y, stream, persistent, tiled);
        case 6: return launch_stages<QT, NS, 6>(w, n, k, p, t, y, stream, persistent, tiled);
        default: return cudaErrorInvalidValue;
    }
}

template <int QT>
cudaError_t launch_type(const uint8_t* w, int n, int k, const ActPackI& p, int t, float* y, cudaStream_t stream,
                        int stages, bool persistent, bool tiled) {
    return t <= 4 ? launch_ns<QT, 1>(w, n, k, p, t, y, stream, stages, persistent, tiled)
                  : launch_ns<QT, 2>(w, n, k, p, t, y, stream, stages, persistent, tiled);
}

}  // namespace

cudaError_t launch_pack_act_imma(const float* x, int t, int k, const ActPackI& p, cudaStream_t stream) {
    if (!x || !p.dig || !p.s32 || !p.s16 || !p.inv || t < 1 || t > p.rows || k < 256 || k % 256)
        return cudaErrorInvalidValue;
    return launch_kernel(pack_act_imma_kernel<false>, dim3(k / 256, t), 256, 0, stream, x, ActPack{}, k, p);
}

cudaError_t launch_pack_act_imma_from_half(const ActPack& x, int t, int k, const ActPackI& p, cudaStream_t stream) {
    if (!x.h || !x.inv || !p.dig || !p.s32 || !p.s16 || !p.inv || t < 1 || t > p.rows || t > x.rows || k < 256 ||
        k % 256)
        return cudaErrorInvalidValue;
    return launch_kernel(pack_act_imma_kernel<true>, dim3(k / 256, t), 256, 0, stream, nullptr, x, k, p);
}

bool gemv_imma_supports(int qtype) { return qtype == kQ4_K || qtype == kQ5_K || qtype == kQ6_K; }

cudaError_t launch_gemv_tma_imma(int qtype, const void* w, int n, int k, const ActPackI& x, int t, float* y,
                                 cudaStream_t stream) {
    if (!w || !y || n < kMmaRows || n % kMmaRows || k < kGemvUnit || k % kGemvUnit || t < 1 || t > kImmaMaxT ||
        t > x.rows || reinterpret_cast<uintptr_t>(w) % 16)
        return cudaErrorInvalidValue;
    if (!gemv_tma_available()) return cudaErrorNotSupported;
    const auto* wb = static_cast<const uint8_t*>(w);
    switch (qtype) {
        case kQ4_K: return launch_tma_type<kQ4_K>(wb, n, k, x, t, y, stream);
        case kQ5_K: return launch_tma_type<kQ5_K>(wb, n, k, x, t, y, stream);
        case kQ6_K: return launch_tma_type<kQ6_K>(wb, n, k, x, t, y, stream);
        default: return cudaErrorInvalidValue;
    }
}

cudaError_t launch_gemv_imma(int qtype, const void* w, int n, int k, const ActPackI& x, int t, float* y,
                             cudaStream_t stream, int stages, bool persistent, bool tiled) {
    if (!w || !y || n < 1 || k < kGemvUnit || k % kGemvUnit || t < 1 || t > kImmaMaxT || t > x.rows ||
        reinterpret_cast<uintptr_t>(w) % 16 || (tiled && !tile_layout_fits(qtype, n, k)))
        return cudaErrorInvalidValue;
    if (stages == 0) stages = kImmaStagesDefault;
    const auto* wb = static_cast<const uint8_t*>(w);
    switch (qtype) {
        case kQ4_K: return launch_type<kQ4_K>(wb, n, k, x, t, y, stream, stages, persistent, tiled);
        case kQ5_K: return launch_type<kQ5_K>(wb, n, k, x, t, y, stream, stages, persistent, tiled);
        case kQ6_K: return launch_type<kQ6_K>(wb, n, k, x, t, y, stream, stages, persistent, tiled);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace openjet
