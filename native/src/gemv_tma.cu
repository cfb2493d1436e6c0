// The decode GEMV with a producer warp (sm_90a): gemv_mma_kernel's tiles, units, quarter split and sums, so the same
// bits, with the weights brought in by the TMA unit instead of each warp's cp.async ring.
//
// A block is resident for the whole call and takes 16-row tiles in turn; one thread of its producer warp keeps every
// consumer warp's ring of kRing units full across tiles with one bulk copy a unit (in the tile layout a unit of a
// 16-row group is one contiguous piece of 16 x tile_pitch bytes), and the four consumer warps only compute. Alone it
// streams no faster than the cp.async kernel (Nsight Compute, bench/results/ncu-gemv-tma-h200-3514538.txt); in the
// step it is faster (the 27B on the H200 at fd3d8d8: T=1 9.45 -> 9.06 ms, T=5 11.39 -> 10.43; with the leaner unit
// loops of 3e2051f T=1 9.00 -> 8.50 against the cp.async kernels of the same run) because under PDL its rings fill
// while the kernel before still runs (pdl.cuh: weights may be read before the wait), ~110 KB a SM at Q4_K, where a
// block-per-tile grid's first blocks have two units a warp in flight.
//
// A tile's consumer warp i takes units [nu i / 4, nu (i + 1) / 4) in order with UnitMma, warp 0 sums the four
// partials in order and stores (tile_sum_store_by): gemv_mma_kernel's sequence of operations for every output.
// kLastSum (forms 3 and 4, an experiment): no barrier at the tile's end; the last of the four warps to store its
// partial sums them (in the same order) and stores, and the others go on to their next tile's units.
#include "gemv_tma.cuh"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "device_attr.cuh"
#include "gemv_fold_device.cuh"
#include "gemv_mma.cuh"
#include "launch_count.h"
#include "tma_ring.cuh"

namespace openjet {
namespace {

constexpr int kConsumerWarps = kTmaConsumerWarps;

constexpr int cmax(int a, int b) { return a > b ? a : b; }

// kFold & 1: past the ring, the fold's row pack (gemv_fold_device.cuh). QT2, QT3: the other matrices' types of a
// group launch (launch_gemv_tma_group), whose slots take the largest of their units.
template <int QT, int kRing, int kFold = 0, int QT2 = QT, int QT3 = QT> struct TmaShape {
    // a ring slot: one unit of a 16-row tile, one bulk copy
    static constexpr int kChunk = cmax(TmaUnit<QT>::kChunk, cmax(TmaUnit<QT2>::kChunk, TmaUnit<QT3>::kChunk));
    static constexpr int kRingBytes = (kConsumerWarps * kRing * kChunk + 16 + 15) / 16 * 16;  // +16: a word past a row
    static constexpr int kSmemBytes = kRingBytes + (kFold & 1 ? kFoldRowBytes : 0);
};

// The kernel's fold argument: the fold's pointers for its forms, nothing for the default's (kFold = 0), whose launches
// (some 250 a decode step) then carry no more parameter bytes than they did before the fold.
struct NoFold {};
template <int kFold> using FoldParam = std::conditional_t<kFold == 0, NoFold, GemvFold>;
template <int kFold> FoldParam<kFold> fold_param(const GemvFold& f) {
    if constexpr (kFold == 0) return {};
    else return f;
}

// A group launch's third matrix (its one extra kernel argument), or none.
__device__ __forceinline__ GemvSecond group_third() { return {}; }
__device__ __forceinline__ GemvSecond group_third(const GemvSecond& third) { return third; }

// kRing: units in flight per consumer warp; kMinBlocks: blocks per SM the registers are cut for (3: 128, the
// cp.async kernel's budget; 4: 96, where Q6_K and Q8_0 do not spill on sm_90a, Q5_K does (so it keeps 3), and Q4_K
// spills 20 bytes around the tile's end, the ring's slot and phase, outside the unit loop).
// kFold (gemv_fold.cuh): bit 0 (t = 1), x is the fold's u and partials (fold.u_in, fold.part_in), made into the row's
// pack in shared memory first (fold_pack_row), instead of a pack; bit 1, the outputs go through the fold's epilogue
// (fold.h .. fold.part) instead of y; bit 2, the swiglu's own pack (launch_gemv_swiglu: the matrix and its second
// in tile pairs, v into y, then the blocks' meeting and the pack into fold.swiglu_pack); bit 3 (t > 1, alone), x is
// the fold's rows made by the launch's first t blocks (fold_rows_make) instead of a pack launch's; bit 4 (t > 1, with
// bit 1 or alone), x is the swiglu pack made by the launch's first blocks (swiglu_rows_make) instead of a pack
// launch's.
// kNoMath: OPENJET_BENCH_GEMV_NO_MATH (bench_gemv_no_math), a measurement with WRONG outputs.
// A group (launch_gemv_tma_group: QT2 != QT, or a third matrix, Third = GemvSecond): the tiles of up to three matrices
// of one input, of at most two types, second's of type QT2 from second.from, the third's of QT3 from third.from; each
// tile computed as its own type's launch computes it (the same bits), one launch instead of two or three.
template <int QT, int kRing, int kMinBlocks, bool kLastSum, int kFold = 0, bool kNoMath = false, int QT2 = QT,
          int QT3 = QT, class... Third>
__global__ void __launch_bounds__(kTmaThreads, kMinBlocks)
gemv_tma_kernel(const uint8_t* __restrict__ w, int n, int k, ActPack x, int t, float* __restrict__ y,
                GemvSecond second, int tiles, FoldParam<kFold> fold, Third... third) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Sh = TmaShape<QT, kRing, kFold, QT2, QT3>;
    constexpr bool kPairs = (kFold & 4) != 0;  // gate tile j then up tile j in one block (the swiglu's own pack)
    static_assert(!kPairs || (!kLastSum && !(kFold & 2)), "the swiglu's pack: warp 0 sums every tile, no fold out");
    constexpr bool kThird = sizeof...(Third) == 1;
    constexpr bool kGroup = QT2 != QT || kThird;
    constexpr int QB = QT2 != QT ? QT2 : QT3;  // the group's other type (QT where it has one)
    constexpr bool kRowsT = (kFold & 8) != 0;  // B's rows at t > 1 made by blocks 0..t-1 (GemvFold::rows)
    static_assert(!kRowsT || kFold == 8, "B's rows made by its blocks: no other fold part");
    constexpr bool kSwigluRows = (kFold & 16) != 0;  // the swiglu pack at t > 1 made by the first blocks (swiglu_rows)
    static_assert(!kSwigluRows || (kFold & ~2) == 16, "the swiglu's rows: with A's epilogue at most");
    static_assert(!kGroup || (!kLastSum && (kFold & ~9) == 0), "a group: warp 0 sums every tile, B's pack at most");
    static_assert(!kThird || QT3 == QT || QT3 == QB, "a group: two types at most");
    const GemvSecond more = group_third(third...);  // (from: none, where there is no third)
    // a group's tile: its matrix m, its weights' type (QB or not), its row tile within the matrix
    const auto mat = [&](int tile) { return tile < second.from ? 0 : tile < more.from ? 1 : 2; };
    const auto as_qb = [&](int m) { return QB != QT && (m == 1 ? QT2 == QB : m == 2 && QT3 == QB); };
    const auto mat_tile = [&](int tile, int m) { return tile - (m == 0 ? 0 : m == 1 ? second.from : more.from); };
    extern __shared__ __align__(128) uint8_t ring[];
    __shared__ __align__(8) uint64_t bar_words[TmaBars<kRing>::kBytes / 8];  // full, then empty (tma_ring.cuh)
    __shared__ float part[2][kGemvWarps][1][32][4];  // double-buffered: one barrier a tile
    __shared__ float inv_s[kActRows];
    __shared__ int arrived[2], summed[2];  // kLastSum: per buffer, partials stored and sums done (counted up)
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    // a block's tiles: blockIdx.x, + gridDim.x, ...; in pairs (kPairs) 2 p, 2 p + 1 for p = blockIdx.x, + gridDim.x...
    const auto in_first = [&](int tile) { return kPairs ? (tile & 1) == 0 : tile < second.from; };
    const auto own = [&](int tile) { return kPairs ? tile >> 1 : tile < second.from ? tile : tile - second.from; };
    const int tile0 = kPairs ? 2 * static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x);
    const auto next = [&](int tile) {
        return kPairs ? (tile & 1 ? tile - 1 + 2 * static_cast<int>(gridDim.x) : tile + 1)
                      : tile + static_cast<int>(gridDim.x);
    };
    const TmaBars<kRing> bars{static_cast<uint32_t>(__cvta_generic_to_shared(bar_words))};
    bars.init();
    if (threadIdx.x < 2) arrived[threadIdx.x] = 0, summed[threadIdx.x] = 0;
    mbar_init_fence();
    __syncthreads();  // the barriers initialised; the only block-wide barrier
    pdl_launch_dependents();
    const int nu = k / kUnitElems;
    const uint32_t ring0 = static_cast<uint32_t>(__cvta_generic_to_shared(ring));

    if (warp == kConsumerWarps) {  // the producer: weights only (immutable: no pdl_wait needed)
        if (lane != 0) return;
        const uint64_t policy = l2_policy_evict_first();  // weights are read once a step: leave L2 to the rest
        int issued[kConsumerWarps] = {};
        for (int tile = tile0; tile < tiles; tile = next(tile)) {
            if constexpr (kGroup) {
                const int m = mat(tile);
                const uint8_t* w_m = m == 0 ? w : m == 1 ? second.w : more.w;
                const long long units = static_cast<long long>(mat_tile(tile, m)) * nu;  // before the tile's first
                if (!as_qb(m))
                    tma_produce_tile<QT, kRing, Sh::kChunk>(bars, ring0, w_m + units * TmaUnit<QT>::kChunk, nu, issued,
                                                            policy);
                else if constexpr (QB != QT)
                    tma_produce_tile<QB, kRing, Sh::kChunk>(bars, ring0, w_m + units * TmaUnit<QB>::kChunk, nu, issued,
                                                            policy);
                continue;
            }
            const uint8_t* unit0 =
                (in_first(tile) ? w : second.w) + static_cast<long long>(own(tile)) * nu * Sh::kChunk;
            tma_produce_tile<QT, kRing, Sh::kChunk>(bars, ring0, unit0, nu, issued, policy);
        }
        return;
    }

    // a consumer warp: quarter `warp` of each of the block's tiles, unit by unit from its ring (tma_consume_units)
    const int g = lane >> 2, tq = lane & 3, kb = k / kActBlock;
    const int u0 = quarter_begin(nu, warp), u1 = quarter_begin(nu, warp + 1);
    const uint32_t full0 = bars.full(warp, 0);
    const uint8_t* const ring_w = ring + warp * kRing * Sh::kChunk;
    pdl_wait();  // the activations and outputs are another kernel's (pdl.cuh)
    const long long col = min(g, t - 1);  // lanes past t read row t - 1 (UnitX)
    const __half* xh = x.h + col * k;
    const __half* xs = x.sum + col * kb * 2;
    __half* const fold_h = reinterpret_cast<__half*>(ring + Sh::kRingBytes);  // kFold & 1: the row's pack
    __half* const fold_sum = fold_h + kFoldMaxK;
    if constexpr (kFold & 1) {
        __shared__ float2 fold_c_inv;  // the row's (c, inv)
        // block 0 also leaves the row for the kernels after (GemvFold::a_out, pack_out)
        const FoldRowCopy copy{fold.a_out, fold.pack_out.h, fold.pack_out.sum};
        fold_pack_row(fold.u_in, fold.part_in, k, fold.eps, fold_h, fold_sum, &fold_c_inv,
                      blockIdx.x == 0 ? copy : FoldRowCopy{});
        if (threadIdx.x == 0) {
            inv_s[0] = fold_c_inv.y;
            if (blockIdx.x == 0 && fold.pack_out.inv) fold.pack_out.inv[0] = fold_c_inv.y;
            if (fold.scales && blockIdx.x == 0) fold.scales[0] = fold_c_inv;
        }
    } else {
        if constexpr (kRowsT) fold_rows_make(fold, x, k, t);
        if constexpr (kSwigluRows) swiglu_rows_make(fold, x, k, t);
        // The pack's row scales, read from L2 once a call instead of once a tile (warp 0's lanes write them; the first
        // tile's barrier, or in forms 3/4 warp 0's first arrival, orders that before any warp's reads).
        if (warp == 0 && lane < t) inv_s[lane] = __ldcg(x.inv + lane);
    }
    int meet_gen = 0;  // kPairs: the meeting's release word as this launch found it (thread 0's)
    if constexpr (kPairs)
        if (threadIdx.x == 0) meet_gen = load_acquire(&fold.meet->release);
    SwigluTiles swiglu;  // kPairs: warp 0's gate values across a pair, its maxima
    int slot = 0;
    uint32_t phase = 0;
    int buf = 0, round = 0;  // round: this warp's earlier uses of part[buf]
    for (int tile = tile0; tile < tiles; tile = next(tile), round += buf, buf ^= 1) {
        float acc[1][4] = {};
        FoldTileIn fold_in;  // kFold & 2: warp 0's epilogue inputs, in flight during the units
        if constexpr (kFold & 2)
            if (warp == 0) fold_in.load(fold, lane, own(tile), in_first(tile) ? n : second.n, t);
        if constexpr (kGroup) {  // (B's own pack: one token row)
            constexpr bool kSmemX = (kFold & 1) != 0;
            const __half* gx = kSmemX ? fold_h : xh;
            const __half* gs = kSmemX ? fold_sum : xs;
            if (!as_qb(mat(tile)))
                tma_consume_units<QT, kRing, Sh::kChunk, kSmemX, kNoMath>(full0, ring_w, u0, u1, gx, gs, lane, g, tq,
                                                                          slot, phase, acc);
            else if constexpr (QB != QT)
                tma_consume_units<QB, kRing, Sh::kChunk, kSmemX, kNoMath>(full0, ring_w, u0, u1, gx, gs, lane, g, tq,
                                                                          slot, phase, acc);
        } else if constexpr (kFold & 1) {  // (one token row)
            tma_consume_units<QT, kRing, Sh::kChunk, true, kNoMath>(full0, ring_w, u0, u1, fold_h, fold_sum, lane, g,
                                                                    tq, slot, phase, acc);
        } else {
            tma_consume_units<QT, kRing, Sh::kChunk, false, kNoMath>(full0, ring_w, u0, u1, xh, xs, lane, g, tq, slot,
                                                                     phase, acc);
        }
        const bool first = in_first(tile);
        const auto sum_store = [&] {
            const auto inv_of = [&](int, int c) { return inv_s[c]; };
            if constexpr (kGroup) {
                const int m = mat(tile);
                tile_sum_store_by<1, kMmaRows>(part[buf], lane, mat_tile(tile, m) * kMmaRows, 0,
                                               m == 0 ? n : m == 1 ? second.n : more.n, t, inv_of,
                                               m == 0 ? y : m == 1 ? second.y : more.y);
            } else if constexpr (kPairs)
                swiglu_tile_store(part[buf], lane, own(tile), n, t, inv_of, first, swiglu, y);
            else if constexpr (kFold & 2)
                fold_tile_store(part[buf], lane, own(tile), first ? n : second.n, t, inv_of, fold_in, fold);
            else tile_sum_store_by<1, kMmaRows>(part[buf], lane, own(tile) * kMmaRows, 0, first ? n : second.n, t,
                                                inv_of, first ? y : second.y);
        };
        if constexpr (kLastSum) {
            // part[buf] is free once its previous use's sum is done (only a warp two tiles ahead waits here).
            if (lane == 0) {
                while (*static_cast<volatile int*>(&summed[buf]) < round) __nanosleep(32);  // leave the issue slots
                __threadfence_block();  // the summing warp's reads of part[buf] before this warp's writes
            }
            __syncwarp();  // (orders memory among the warp's lanes, where a shuffle would not)
#pragma unroll
            for (int c = 0; c < 4; ++c) part[buf][warp][0][lane][c] = acc[0][c];
            __syncwarp();  // every lane's partials before lane 0's arrival (fences are cumulative)
            int last = 0;
            if (lane == 0) {
                __threadfence_block();
                last = atomicAdd(&arrived[buf], 1) % kConsumerWarps == kConsumerWarps - 1;
                __threadfence_block();
            }
            if (__shfl_sync(0xffffffffu, last, 0)) {  // the tile's fourth partial: sum the four, in order
                __syncwarp();  // lane 0's acquire (the fence after its atomic) before every lane's reads
                sum_store();
                __syncwarp();  // every lane's reads of part[buf] before it is handed back
                if (lane == 0) {
                    __threadfence_block();
                    atomicAdd(&summed[buf], 1);
                }
            }
        } else {
#pragma unroll
            for (int c = 0; c < 4; ++c) part[buf][warp][0][lane][c] = acc[0][c];
            named_bar_sync(1, kConsumerWarps * 32);  // (part[buf ^ 1] was read by warp 0 before it arrived here)
            if (warp == 0) sum_store();
        }
    }
    if constexpr (kPairs) swiglu_meet_and_pack(swiglu, meet_gen, y, n, t, fold.meet, fold.swiglu_pack);
    if constexpr (kRowsT) fold_rows_leave(fold);
    if constexpr (kSwigluRows) swiglu_rows_leave(fold);
#endif
}

// OPENJET_GEMV_CARVEOUT=max (an experiment, read at a form's first call; the same bits: a host-side hint): the forms
// ask for the largest shared-memory carveout. By default the driver picks an SM's carveout per kernel, keeping room
// to run beside kernels already launched where it can, so under PDL a form's blocks may start on SMs configured for
// the kernel before (a Q6_K form at 3 blocks needs ~176 KB of the H100's / H200's 228): fewer resident blocks than the
// occupancy API counts. Whether that costs the step is what the switch measures.
bool carveout_max() {
    static const bool on = [] {
        const char* v = std::getenv("OPENJET_GEMV_CARVEOUT");
        return v && std::strcmp(v, "max") == 0;
    }();
    return on;
}

// Resident blocks of a kernel (resident_grid) or a form (resident_blocks) for a call: its occupancy (asked once) x the
// SM count, or x grid_sms where that is smaller (a smaller GPU emulated); nothing about the GPU compiled in. 0: none
// fits. The forms whose blocks meet (kFold bit 2: every block must be resident at once) ask for the largest carveout,
// as the persistent FFN's producer-warp form does: an SM left configured for the kernel before would hold fewer of them
// than the occupancy counts.
template <auto kKernel, size_t kSmemBytes> int resident_grid(int grid_sms, bool max_carveout) {
    int sms = 0;
    if (device_attribute(cudaDevAttrMultiProcessorCount, &sms) != cudaSuccess) return 0;
    return resident_per_sm<kKernel, kTmaThreads, kSmemBytes>(max_carveout) * grid_sm_count(sms, grid_sms);
}
template <int QT, int kRing, int kMinBlocks, bool kLastSum, int kFold = 0> int resident_blocks(int grid_sms) {
    constexpr auto kKernel = gemv_tma_kernel<QT, kRing, kMinBlocks, kLastSum, kFold>;
    return resident_grid<kKernel, TmaShape<QT, kRing, kFold>::kSmemBytes>(grid_sms,
                                                                          carveout_max() || (kFold & 4) != 0);
}

// OPENJET_BENCH_GEMV_NO_MATH=1 (read once; a measurement, never for use: the outputs are WRONG): every producer-warp
// GEMV streams its weights through the rings as always and its consumers hand each unit back without computing it,
// on the grid the computing form has. The step's time then bounds what any cut of the units' arithmetic could give.
bool bench_gemv_no_math() {
    static const bool on = [] {
        const char* v = std::getenv("OPENJET_BENCH_GEMV_NO_MATH");
        return v && std::strcmp(v, "1") == 0;
    }();
    return on;
}

template <int QT, int kRing, int kMinBlocks, bool kLastSum, int kFold = 0, bool kNoMath = false>
cudaError_t launch_ring(const GemvArgs& a, const GemvArgs* b, cudaStream_t stream, const GemvFold& fold = {}) {
    if constexpr (!kNoMath)
        if (bench_gemv_no_math()) return launch_ring<QT, kRing, kMinBlocks, kLastSum, kFold, true>(a, b, stream, fold);
    using Sh = TmaShape<QT, kRing, kFold>;
    constexpr auto kKernel = gemv_tma_kernel<QT, kRing, kMinBlocks, kLastSum, kFold, kNoMath>;
    if (const cudaError_t e = smem_opted_in<kKernel, Sh::kSmemBytes>()) return e;
    const int slots = resident_blocks<QT, kRing, kMinBlocks, kLastSum, kFold>(a.grid_sms);  // (the computing form's)
    if (slots <= 0) return cudaErrorNotSupported;  // no block fits: the caller takes the cp.async kernel
    const int first = a.n / kMmaRows, tiles = first + (b ? b->n / kMmaRows : 0);
    const int blocks_of = (kFold & 4) ? tiles / 2 : tiles;  // (tile pairs: a block takes both of a pair)
    if ((kFold & 4) && (!b || b->n != a.n)) return cudaErrorInvalidValue;
    if ((kFold & 4) && (!fold.meet || std::min(blocks_of, slots) > kMeetMaxBlocks)) return cudaErrorInvalidValue;
    GemvSecond second;
    second.from = first;
    if (b) second.w = static_cast<const uint8_t*>(b->w), second.n = b->n, second.y = b->y;
    count_launch(Counted::kGemvTma);
    count_launch(Counted::kTiledWeights);
    return launch_kernel(kKernel, static_cast<unsigned>(std::min(blocks_of, slots)), kTmaThreads, Sh::kSmemBytes,
                         stream, static_cast<const uint8_t*>(a.w), a.n, a.k, a.x, a.t, a.y, second, tiles,
                         fold_param<kFold>(fold));
}

// A group's launch (launch_gemv_tma_group): a's, b's and (kThird) c's tiles, of types QT, QT2, QT3 (without a third: a
// pair of two types), on one grid of the form (kRing, kMinBlocks; kFold 1: B's own pack at one token row, 0: a.x).
template <int QT, int QT2, int QT3, bool kThird, int kRing, int kMinBlocks, int kFold, bool kNoMath = false>
cudaError_t launch_group(const GemvArgs& a, const GemvArgs& b, const GemvArgs* c, cudaStream_t stream,
                         const GemvFold& fold) {
    if constexpr (!kNoMath)
        if (bench_gemv_no_math())
            return launch_group<QT, QT2, QT3, kThird, kRing, kMinBlocks, kFold, true>(a, b, c, stream, fold);
    static_assert(kThird || QT2 != QT, "a pair of one type is launch_ring's");
    using Sh = TmaShape<QT, kRing, kFold, QT2, QT3>;
    constexpr auto kKernel = [] {  // (a third matrix: one more argument)
        if constexpr (kThird)
            return gemv_tma_kernel<QT, kRing, kMinBlocks, false, kFold, kNoMath, QT2, QT3, GemvSecond>;
        else
            return gemv_tma_kernel<QT, kRing, kMinBlocks, false, kFold, kNoMath, QT2, QT3>;
    }();
    if (const cudaError_t e = smem_opted_in<kKernel, Sh::kSmemBytes>()) return e;
    const int slots = resident_grid<kKernel, Sh::kSmemBytes>(a.grid_sms, carveout_max());
    if (slots <= 0) return cudaErrorNotSupported;  // no block fits: the caller launches them one by one
    const auto matrix = [](const GemvArgs& g, int from) {
        GemvSecond m;
        m.w = static_cast<const uint8_t*>(g.w), m.n = g.n, m.y = g.y, m.from = from;
        return m;
    };
    const int first = a.n / kMmaRows, second_end = first + b.n / kMmaRows;
    const int tiles = second_end + (kThird ? c->n / kMmaRows : 0);
    count_launch(Counted::kGemvTma);
    count_launch(Counted::kTiledWeights);
    count_launch(Counted::kGemvGroup);
    const auto launch = [&](auto... third) {
        return launch_kernel(kKernel, static_cast<unsigned>(std::min(tiles, slots)), kTmaThreads, Sh::kSmemBytes,
                             stream, static_cast<const uint8_t*>(a.w), a.n, a.k, a.x, a.t, a.y, matrix(b, first), tiles,
                             fold_param<kFold>(fold), third...);
    };
    if constexpr (kThird) return launch(matrix(*c, second_end));
    else return launch();
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
// same run: T=1 9.275 -> 9.035 / 9.140 ms, T=4 10.774 -> 10.086 / 9.890, T=5 11.195 -> 10.316 / 10.208). Measured
// slower and removed (NOTES_gemv.md): an L2 evict-normal policy (T=1 9.223 against 9.104), a ring of 8 at 2 blocks
// (9.992); on e420bb2 against the default's 8.973: half tiles for the calls of fewer tiles than resident blocks 9.563,
// the deepest rings the blocks leave room for 9.235, form 1 with the activations prefetched into L1 first 9.351.
// Forms 3 and 4 (an experiment; their bits checked on the H200; form 4 lost there at 499afb1, T=1 9.066 against 8.577
// ms): 1 and 2 with the last-arriver tile sum (kLastSum). (Forms 5 and 6, the activations prefetched into shared
// memory, lost: NOTES_gemv.md, 2026-12-05.)
// Form 2's ring and blocks a SM (Q5_K: 3 blocks, it spills at 4; Q6_K: a ring of 3, what 4 blocks' shared memory
// holds), for launch_gemv_tma, its fold forms, the group launches and the swiglu pairs alike.
template <int QT> struct Form2 {
    static constexpr int kRing = QT == kQ6_K ? 3 : 4, kBlocks = QT == kQ5_K ? 3 : 4;
};

namespace {
// The call's form: GemvArgs::tma where it names one, else the default's choice by t (1 at one row, 2 at more).
int tma_form(const GemvArgs& a) { return a.tma >= 1 && a.tma <= kGemvTmaForms ? a.tma : a.t == 1 ? 1 : 2; }
// Whether a call takes form 2's ring and blocks a SM rather than form 1's: forms 2 and 4 (4 adds launch_gemv_tma's
// last-arriver sum; the fold's, the group and the swiglu pairs' launches take only its blocks' shape). sm_90a: the
// pairs reading the fold's own pack (the default at one row) fit form 2's 96 registers with no spill; those reading a
// pack (the fold off) spill 64 bytes.
bool form2_blocks(const GemvArgs& a) { return tma_form(a) % 2 == 0; }
// e, the result of a launch in form 2's shape (two) or form 1's; one that ran in the shape t's choice would not take
// is counted (kGemvTmaFormForced), so that a test sees a forced form ran rather than a fallback.
cudaError_t forced_counted(const GemvArgs& a, bool two, cudaError_t e) {
    if (e == cudaSuccess && two != (a.t > 1)) count_launch(Counted::kGemvTmaFormForced);
    return e;
}
}  // namespace

template <int QT> cudaError_t launch_gemv_tma(const GemvArgs& a, const GemvArgs* b, cudaStream_t stream) {
    constexpr int kRing2 = Form2<QT>::kRing, kBlocks2 = Form2<QT>::kBlocks;
    const int form = tma_form(a);
    const auto launch = [&] {
        switch (form) {
            case 2: return launch_ring<QT, kRing2, kBlocks2, false>(a, b, stream);
            case 3: return launch_ring<QT, 4, 3, true>(a, b, stream);
            case 4: return launch_ring<QT, kRing2, kBlocks2, true>(a, b, stream);
            default: return launch_ring<QT, 4, 3, false>(a, b, stream);
        }
    };
    return forced_counted(a, form2_blocks(a), launch());
}

template cudaError_t launch_gemv_tma<kQ4_K>(const GemvArgs&, const GemvArgs*, cudaStream_t);
template cudaError_t launch_gemv_tma<kQ5_K>(const GemvArgs&, const GemvArgs*, cudaStream_t);
template cudaError_t launch_gemv_tma<kQ6_K>(const GemvArgs&, const GemvArgs*, cudaStream_t);
template cudaError_t launch_gemv_tma<kQ8_0>(const GemvArgs&, const GemvArgs*, cudaStream_t);

// The fold's forms of launch_gemv_tma's 1 (by default at one token row) and 2: the same rings and blocks a SM.
template <int QT>
cudaError_t launch_gemv_tma_fold(const GemvArgs& a, const GemvArgs* b, const GemvFold& f, bool in, cudaStream_t stream) {
    constexpr int kRing2 = Form2<QT>::kRing, kBlocks2 = Form2<QT>::kBlocks;
    const bool two = form2_blocks(a);
    if (in && a.t > 1) {  // (the rows made in a.x by the launch's first t blocks: f.rows)
        if (!f.rows) return cudaErrorInvalidValue;
        return forced_counted(a, two, two ? launch_ring<QT, kRing2, kBlocks2, false, 8>(a, b, stream, f)
                                          : launch_ring<QT, 4, 3, false, 8>(a, b, stream, f));
    }
    if (in)  // (t = 1: the row made in shared memory)
        return forced_counted(a, two, two ? launch_ring<QT, kRing2, kBlocks2, false, 1>(a, b, stream, f)
                                          : launch_ring<QT, 4, 3, false, 1>(a, b, stream, f));
    if (a.t > 1 && f.swiglu_rows)  // (its input the swiglu pack its first blocks make)
        return forced_counted(a, two, two ? launch_ring<QT, kRing2, kBlocks2, false, 18>(a, nullptr, stream, f)
                                          : launch_ring<QT, 4, 3, false, 18>(a, nullptr, stream, f));
    return forced_counted(a, two, two ? launch_ring<QT, kRing2, kBlocks2, false, 2>(a, nullptr, stream, f)
                                      : launch_ring<QT, 4, 3, false, 2>(a, nullptr, stream, f));
}

template cudaError_t launch_gemv_tma_fold<kQ4_K>(const GemvArgs&, const GemvArgs*, const GemvFold&, bool, cudaStream_t);
template cudaError_t launch_gemv_tma_fold<kQ5_K>(const GemvArgs&, const GemvArgs*, const GemvFold&, bool, cudaStream_t);
template cudaError_t launch_gemv_tma_fold<kQ6_K>(const GemvArgs&, const GemvArgs*, const GemvFold&, bool, cudaStream_t);

// The swiglu's own pack (gemv_fold.cuh launch_gemv_swiglu: one token row), Q4_K: form 1's ring and 3 blocks a SM, or
// form 2's 4 under OPENJET_GEMV_TMA=2 (fold_in: the fold's own pack; else x is a pack).
cudaError_t launch_gemv_tma_swiglu(const GemvArgs& a, const GemvArgs& b, const GemvFold& f, bool fold_in,
                                   cudaStream_t stream) {
    constexpr int kRing2 = Form2<kQ4_K>::kRing, kBlocks2 = Form2<kQ4_K>::kBlocks;
    const bool two = form2_blocks(a);
    if (fold_in)
        return forced_counted(a, two, two ? launch_ring<kQ4_K, kRing2, kBlocks2, false, 5>(a, &b, stream, f)
                                          : launch_ring<kQ4_K, 4, 3, false, 5>(a, &b, stream, f));
    return forced_counted(a, two, two ? launch_ring<kQ4_K, kRing2, kBlocks2, false, 4>(a, &b, stream, f)
                                      : launch_ring<kQ4_K, 4, 3, false, 4>(a, &b, stream, f));
}

// ------------------------------------------------------------------------------------------ group launches

namespace {

// The type triples a group takes: the Q4_K_M recipe's input projections that share an input but not a type (a GDN
// layer's Q6_K qkv beside its Q4_K z; QT3 unused) or come three to a layer (attention's Q4_K q and k with its Q4_K or
// Q6_K v).
enum class GroupTypes { kNone, kQ6Q4, kQ4Q4Q4, kQ4Q4Q6 };

GroupTypes group_types(const GemvArgs& a, const GemvArgs& b, const GemvArgs* c) {
    if (!c) return a.qtype == kQ6_K && b.qtype == kQ4_K ? GroupTypes::kQ6Q4 : GroupTypes::kNone;
    if (a.qtype != kQ4_K || b.qtype != kQ4_K) return GroupTypes::kNone;
    return c->qtype == kQ4_K ? GroupTypes::kQ4Q4Q4 : c->qtype == kQ6_K ? GroupTypes::kQ4Q4Q6 : GroupTypes::kNone;
}

// A group's forms, as launch_gemv_tma's and launch_gemv_tma_fold's for one type: B's own pack (fold, one token row),
// B's rows made by its first t blocks (fold at more rows: fold->rows) or a pack, on form 1's ring and blocks a SM (a
// ring of 4, 3 blocks; by default at one row) or form 2's (its types' smaller ring and blocks a SM; by default at more).
template <int QT, int QT2, int QT3, bool kThird>
cudaError_t group_forms(const GemvArgs& a, const GemvArgs& b, const GemvArgs* c, const GemvFold* fold,
                        cudaStream_t stream) {
    constexpr int kRing2 = std::min({Form2<QT>::kRing, Form2<QT2>::kRing, Form2<QT3>::kRing});
    constexpr int kBlocks2 = std::min({Form2<QT>::kBlocks, Form2<QT2>::kBlocks, Form2<QT3>::kBlocks});
    const bool two = form2_blocks(a);
    if (fold && a.t > 1)
        return forced_counted(a, two,
                              two ? launch_group<QT, QT2, QT3, kThird, kRing2, kBlocks2, 8>(a, b, c, stream, *fold)
                                  : launch_group<QT, QT2, QT3, kThird, 4, 3, 8>(a, b, c, stream, *fold));
    if (fold)
        return forced_counted(a, two,
                              two ? launch_group<QT, QT2, QT3, kThird, kRing2, kBlocks2, 1>(a, b, c, stream, *fold)
                                  : launch_group<QT, QT2, QT3, kThird, 4, 3, 1>(a, b, c, stream, *fold));
    return forced_counted(a, two, two ? launch_group<QT, QT2, QT3, kThird, kRing2, kBlocks2, 0>(a, b, c, stream, {})
                                      : launch_group<QT, QT2, QT3, kThird, 4, 3, 0>(a, b, c, stream, {}));
}

}  // namespace

bool gemv_tma_group_takes(const GemvArgs& a, const GemvArgs& b, const GemvArgs* c) {
    const auto same_input = [&a](const GemvArgs& g) {
        return g.k == a.k && g.t == a.t && g.x.h == a.x.h && g.x.sum == a.x.sum && g.x.inv == a.x.inv &&
               gemv_tma_takes(g, nullptr);
    };
    return group_types(a, b, c) != GroupTypes::kNone && gemv_tma_takes(a, nullptr) && same_input(b) &&
           (!c || same_input(*c));
}

cudaError_t launch_gemv_tma_group(const GemvArgs& a, const GemvArgs& b, const GemvArgs* c, const GemvFold* fold,
                                  cudaStream_t stream) {
    if (!gemv_tma_group_takes(a, b, c) || (fold && a.t != 1 && !fold->rows)) return cudaErrorInvalidValue;
    switch (group_types(a, b, c)) {
        case GroupTypes::kQ6Q4: return group_forms<kQ6_K, kQ4_K, kQ6_K, false>(a, b, nullptr, fold, stream);
        case GroupTypes::kQ4Q4Q4: return group_forms<kQ4_K, kQ4_K, kQ4_K, true>(a, b, c, fold, stream);
        case GroupTypes::kQ4Q4Q6: return group_forms<kQ4_K, kQ4_K, kQ6_K, true>(a, b, c, fold, stream);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace openjet
