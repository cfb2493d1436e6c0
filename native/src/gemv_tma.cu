// The decode GEMV with a producer warp (sm_90a): gemv_mma_kernel's tiles, units, quarter split and sums, so the same
// bits, with the weights brought in by the TMA unit instead of each warp's cp.async ring.
//
// A block is resident for the whole call and takes 16-row tiles in turn; one thread of its producer warp keeps every
// consumer warp's ring of kRing units full across tiles with one bulk copy a unit (in the tile layout a unit of a
// 16-row group is one contiguous piece of 16 x tile_pitch bytes), and the four consumer warps only compute. Alone it
// streams no faster than the cp.async kernel (Nsight Compute, bench/results/ncu-gemv-tma-h200-3514538.txt); in the
// step it is faster (the 27B on the H200: T=1 9.45 -> 9.06 ms, T=5 11.39 -> 10.43) because under PDL its rings fill
// while the kernel before still runs (pdl.cuh: weights may be read before the wait), ~110 KB a SM at Q4_K, where a
// block-per-tile grid's first blocks have two units a warp in flight.
//
// A tile's consumer warp i takes units [nu i / 4, nu (i + 1) / 4) in order with UnitMma, warp 0 sums the four
// partials in order and stores (tile_sum_store): gemv_mma_kernel's sequence of operations for every output.
#include "gemv_tma.cuh"

#include "device_attr.cuh"
#include "gemv_mma.cuh"
#include "launch_count.h"
#include "mbarrier.cuh"
#include "weight_layout.cuh"

namespace openjet {
namespace {

constexpr int kConsumerWarps = kGemvWarps;
constexpr int kTmaThreads = (kConsumerWarps + 1) * 32;
constexpr long long kPrefetchXBytes = 48 << 10;  // t rows of x beyond this are not prefetched (what L1 may keep)

__device__ __forceinline__ void prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }

// The consumer threads' L1 prefetches of [p, p + bytes), a 128-byte line each in turn.
__device__ __forceinline__ void prefetch_l1_range(const void* p, long long bytes) {
    const char* c = static_cast<const char*>(p);
#pragma unroll 1
    for (long long o = 128LL * threadIdx.x; o < bytes; o += 128LL * kConsumerWarps * 32) prefetch_l1(c + o);
}

// kRows: rows per tile, 16 or 8 (a half tile: the first or second 8 rows of a group's unit piece, contiguous too).
template <int QT, int kRing, int kRows = kMmaRows> struct TmaShape {
    static constexpr int kPitch = tile_pitch(unit_bytes_of<QT>());
    static constexpr int kGroupChunk = kTileLayoutRows * kPitch;  // one unit of a 16-row group: contiguous
    static constexpr int kChunk = kRows * kPitch;                   // what one copy brings: the tile's rows of a unit
    static_assert(kChunk % 16 == 0, "bulk copies move 16-byte multiples");
    static constexpr int kSmemBytes = kConsumerWarps * kRing * kChunk + 16;  // +16: a word read past a row's end
};

// kRing: units in flight per consumer warp; kMinBlocks: blocks per SM the registers are cut for (3: 128, the
// cp.async kernel's budget; 4: 96, where Q4_K, Q6_K and Q8_0 do not spill on sm_90a and Q5_K does, 20 bytes).
// kRows = 8: half tiles (the cp.async kernel's 8-row form: UnitMma's kHalves = 1, row g of each mma only; the
// same bits), twice the tiles for the calls whose 16-row tiles leave resident blocks idle. kPrefetchX: the consumers
// first ask L1 for the call's activation rows (kPrefetchXBytes at most), which every tile reads again.
template <int QT, int kRing, int kMinBlocks, int kRows = kMmaRows, bool kPrefetchX = false>
__global__ void __launch_bounds__(kTmaThreads, kMinBlocks)
gemv_tma_kernel(const uint8_t* __restrict__ w, int n, int k, ActPack x, int t, float* __restrict__ y,
                GemvSecond second, int tiles) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Sh = TmaShape<QT, kRing, kRows>;
    constexpr int kPerGroup = kTileLayoutRows / kRows;  // tiles a 16-row group holds
    extern __shared__ __align__(128) uint8_t ring[];
    __shared__ __align__(8) uint64_t bars[2][kConsumerWarps][kRing];  // [0]: full, [1]: empty
    __shared__ float part[2][kGemvWarps][1][32][4];                    // double-buffered: one barrier a tile
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const auto own = [&](int tile) { return tile < second.from ? tile : tile - second.from; };  // tile in its matrix
    const auto bar = [&](int which, int q, int slot) {
        return static_cast<uint32_t>(__cvta_generic_to_shared(&bars[which][q][slot]));
    };
    if (threadIdx.x < kConsumerWarps * kRing) {
        const int q = threadIdx.x / kRing, slot = threadIdx.x % kRing;
        mbar_init(bar(0, q, slot), 1);  // the producer's arrival (with the bytes it expects)
        mbar_init(bar(1, q, slot), 1);  // the consumer warp's lane 0
    }
    mbar_init_fence();
    __syncthreads();  // the barriers initialised; the only block-wide barrier
    pdl_launch_dependents();
    const int nu = k / kUnitElems;
    const uint32_t ring0 = static_cast<uint32_t>(__cvta_generic_to_shared(ring));

    if (warp == kConsumerWarps) {  // the producer: weights only (immutable: no pdl_wait needed)
        if (lane != 0) return;
        const uint64_t policy = l2_policy_evict_first();  // weights are read once a step: leave L2 to the rest
        int issued[kConsumerWarps] = {};
        const int per_quarter = (nu + kConsumerWarps - 1) / kConsumerWarps;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            const int in = own(tile);  // its 16-row group: in / kPerGroup
            const uint8_t* group = (tile < second.from ? w : second.w) +
                                   static_cast<long long>(in / kPerGroup) * nu * Sh::kGroupChunk +
                                   in % kPerGroup * Sh::kChunk;
            // round-robin over the warps, so that each warp's ring fills as the warp drains it
            for (int j = 0; j < per_quarter; ++j) {
#pragma unroll
                for (int q = 0; q < kConsumerWarps; ++q) {
                    const int u = quarter_begin(nu, q) + j;
                    if (u >= quarter_begin(nu, q + 1)) continue;
                    const int slot = issued[q] % kRing;
                    mbar_wait(bar(1, q, slot), ((issued[q] / kRing) & 1) ^ 1);  // a fresh slot passes at once
                    mbar_arrive_expect_tx(bar(0, q, slot), Sh::kChunk);
                    bulk_copy_g2s(ring0 + (q * kRing + slot) * Sh::kChunk,
                                  group + static_cast<long long>(u) * Sh::kGroupChunk, Sh::kChunk, bar(0, q, slot),
                                  policy);
                    ++issued[q];
                }
            }
        }
        return;
    }

    // a consumer warp: quarter `warp` of each of the block's tiles
    const int g = lane >> 2, tq = lane & 3, kb = k / kActBlock;
    const int u0 = quarter_begin(nu, warp), u1 = quarter_begin(nu, warp + 1);
    pdl_wait();  // the activations and outputs are another kernel's (pdl.cuh)
    if constexpr (kPrefetchX) {  // every tile reads all of x: ask for it at once, not a unit's worth at a time
        const long long h_bytes = 2LL * t * k, sum_bytes = 4LL * t * kb;
        if (h_bytes + sum_bytes <= kPrefetchXBytes)
            prefetch_l1_range(x.h, h_bytes), prefetch_l1_range(x.sum, sum_bytes);
    }
    const long long col = min(g, t - 1);  // lanes past t read row t - 1 (UnitX)
    const __half* xh = x.h + col * k;
    const __half* xs = x.sum + col * kb * 2;
    int used = 0, buf = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, buf ^= 1) {
        float acc[1][4] = {};
        for (int u = u0; u < u1; ++u, ++used) {
            const int slot = used % kRing;
            mbar_wait(bar(0, warp, slot), (used / kRing) & 1);
            const uint8_t* stage = ring + (warp * kRing + slot) * Sh::kChunk;
            const uint8_t* r[2] = {stage + g * Sh::kPitch, stage + (kRows == 8 ? g : g + 8) * Sh::kPitch};
            UnitX ux[1];
            ux[0].col = xh + u * kUnitElems;
            ux[0].sum = xs + u * 16;
            UnitMma<QT, 1, false, kRows / 8>::run(r, ux, tq, acc);
            __syncwarp();
            if (lane == 0) mbar_arrive(bar(1, warp, slot));  // every lane's reads of the slot are done
        }
#pragma unroll
        for (int c = 0; c < 4; ++c) part[buf][warp][0][lane][c] = acc[0][c];
        named_bar_sync(1, kConsumerWarps * 32);  // (part[buf ^ 1] was read by warp 0 before it arrived here)
        if (warp == 0) {
            const bool first = tile < second.from;
            tile_sum_store<1, kRows>(part[buf], lane, own(tile) * kRows, 0, first ? n : second.n, t, x.inv,
                                     first ? y : second.y);
        }
    }
#endif
}

// Resident blocks of a form for a call: its occupancy (asked once) x the SM count, or x grid_sms where that is smaller
// (a smaller GPU emulated); nothing about the GPU compiled in. 0: none fits.
template <int QT, int kRing, int kMinBlocks, int kRows, bool kPrefetchX = false> int resident_blocks(int grid_sms) {
    struct Fit {
        int per_sm = 0, sms = 0;
    };
    static const Fit fit = [] {
        Fit f;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&f.per_sm,
                                                          gemv_tma_kernel<QT, kRing, kMinBlocks, kRows, kPrefetchX>,
                                                          kTmaThreads, TmaShape<QT, kRing, kRows>::kSmemBytes) !=
                cudaSuccess ||
            device_attribute(cudaDevAttrMultiProcessorCount, &f.sms) != cudaSuccess) {
            cudaGetLastError();
            return Fit{};
        }
        return f;
    }();
    return fit.per_sm * (grid_sms > 0 && grid_sms < fit.sms ? grid_sms : fit.sms);
}

template <int QT, int kRing, int kMinBlocks, int kRows = kMmaRows, bool kPrefetchX = false>
cudaError_t launch_ring(const GemvArgs& a, const GemvArgs* b, cudaStream_t stream) {
    using Sh = TmaShape<QT, kRing, kRows>;
    constexpr auto kKernel = gemv_tma_kernel<QT, kRing, kMinBlocks, kRows, kPrefetchX>;
    if (const cudaError_t e = smem_opted_in<kKernel, Sh::kSmemBytes>()) return e;
    const int slots = resident_blocks<QT, kRing, kMinBlocks, kRows, kPrefetchX>(a.grid_sms);
    if (slots <= 0) return cudaErrorNotSupported;  // no block fits: the caller takes the cp.async kernel
    const int first = a.n / kRows, tiles = first + (b ? b->n / kRows : 0);
    GemvSecond second;
    second.from = first;
    if (b) second.w = static_cast<const uint8_t*>(b->w), second.n = b->n, second.y = b->y;
    count_launch(Counted::kGemvTma);
    count_launch(Counted::kTiledWeights);
    return launch_kernel(kKernel, static_cast<unsigned>(tiles < slots ? tiles : slots), kTmaThreads, Sh::kSmemBytes,
                         stream, static_cast<const uint8_t*>(a.w), a.n, a.k, a.x, a.t, a.y, second, tiles);
}

}  // namespace

bool gemv_tma_available() {
#ifdef OPENJET_HAVE_SM90A
    static const bool device = [] {  // 90a code runs on 9.0 only
        int major = 0, minor = 0;
        return device_attribute(cudaDevAttrComputeCapabilityMajor, &major) == cudaSuccess &&
               device_attribute(cudaDevAttrComputeCapabilityMinor, &minor) == cudaSuccess && major == 9 && minor == 0;
    }();
    return device;
#else
    return false;
#endif
}

bool gemv_tma_takes(const GemvArgs& a, const GemvArgs* b) {
    const auto fits = [](const GemvArgs& g) { return g.tiled && g.n % kMmaRows == 0 && g.k % kUnitElems == 0; };
    return a.tma != 0 && a.tma <= kGemvTmaForms && !a.prefill && a.t >= 1 && a.t <= kActRows && fits(a) &&
           (!b || (fits(*b) && b->qtype == a.qtype && b->k == a.k && b->t == a.t)) && gemv_tma_available();
}

// Its two forms: 1 a ring of 4 units a warp at 3 blocks per SM, 2 four blocks per SM (Q5_K: 3, it spills at 4; Q6_K: a
// ring of 3, what 4 blocks' shared memory holds). The default (GemvArgs::tma < 0) takes 1 for one token row and 2 for
// more, the faster of the two at each T in the 27B's step on the H200 (2026-12-04, against the cp.async kernels in the
// same run: T=1 9.275 -> 9.035 / 9.140 ms, T=4 10.774 -> 10.086 / 9.890, T=5 11.195 -> 10.316 / 10.208; an L2
// evict-normal policy instead of evict-first measured T=1 9.223 against 9.104, a ring of 8 at 2 blocks 9.992).
//
// 3 and 4 (NOT yet run on a GPU; written after the session's device time ran out): 3 is the default's choice, except
// that a call whose 16-row tiles are fewer than form 2's resident blocks (the n = 5,120 calls: ssm_out, attn_output,
// ffn_down, 320 tiles against 396-528 blocks on the H200, at 30-46% of DRAM; ncu-gemv-tma-h200-3514538.txt in
// bench/results) takes half tiles at 4 blocks per SM: twice the warps, each unit's decode for one row of the mma
// instead of two. 4 is the default's choice with the deepest rings its blocks per SM leave room for (the gain is the
// rings filling while the kernel before ends, so deeper rings may fill more; a ring of 8 lost at 9.992 ms because it
// cost blocks). 5 (NOT yet run either) is form 1 for every t, its consumers first prefetching the call's activation
// rows into L1 (kPrefetchX): under Nsight Compute the kernel's top stall is long_scoreboard (1.0-1.3 per instruction),
// likely the B loads of each unit missing L1 on a block's first tile (the n = 5,120 calls have about one tile a block).
template <int QT> cudaError_t launch_gemv_tma(const GemvArgs& a, const GemvArgs* b, cudaStream_t stream) {
    constexpr int kRing2 = QT == kQ6_K ? 3 : 4, kBlocks2 = QT == kQ5_K ? 3 : 4;
    if (a.tma == 3 && (a.n + (b ? b->n : 0)) / kMmaRows < resident_blocks<QT, kRing2, kBlocks2, kMmaRows>(a.grid_sms))
        return launch_ring<QT, 4, 4, 8>(a, b, stream);
    const int form = a.tma == 1 || a.tma == 2 ? a.tma : a.t == 1 ? 1 : 2;
    if (a.tma == 4) {  // 3 blocks: Q4_K / Q5_K 6, Q6_K 5, Q8_0 4; 4 blocks: Q4_K 5, Q6_K 3 (Q5_K 3 blocks, 6)
        constexpr int kDeep1 = QT == kQ6_K ? 5 : QT == kQ8_0 ? 4 : 6;
        constexpr int kDeep2 = QT == kQ4_K ? 5 : QT == kQ5_K ? 6 : kRing2;
        if (form == 2) return launch_ring<QT, kDeep2, kBlocks2>(a, b, stream);
        return launch_ring<QT, kDeep1, 3>(a, b, stream);
    }
    if (a.tma == 5) return launch_ring<QT, 4, 3, kMmaRows, true>(a, b, stream);  // (4 blocks' Q4_K spilled 4 bytes)
    if (form == 2) return launch_ring<QT, kRing2, kBlocks2>(a, b, stream);
    return launch_ring<QT, 4, 3>(a, b, stream);
}

template cudaError_t launch_gemv_tma<kQ4_K>(const GemvArgs&, const GemvArgs*, cudaStream_t);
template cudaError_t launch_gemv_tma<kQ5_K>(const GemvArgs&, const GemvArgs*, cudaStream_t);
template cudaError_t launch_gemv_tma<kQ6_K>(const GemvArgs&, const GemvArgs*, cudaStream_t);
template cudaError_t launch_gemv_tma<kQ8_0>(const GemvArgs&, const GemvArgs*, cudaStream_t);

}  // namespace openjet
