// launch_ffn_persistent (ffn_persistent.cuh), in two forms with the same phases and bits: the team kernel below
// (measured on the H200: the default's bits, slower at every level, its tiles streaming at ~64% of the standalone
// GEMV's rate: docs/MEGAKERNEL.md, "Step 2 measured") and the producer-warp form further down (ffn_tma_kernel,
// OPENJET_FFN_TMA: the tail, the FFN, the next norm and the next layer's input projections on the decode default's
// block shape; not yet run).
//
// The team kernel's block = kTeams teams of 4 warps; a team does what one decode GEMV block does (a 16-row tile, warp
// i over k quarter i, its warp 0 adding the quarters in order), synced by a named barrier of its own. Phases:
//   0. with a tail only: every warp, the mixer output's pack, 32-blocks grid-strided, in two steps (each block's
//      max |y| folded into its row's; once all are, the pack into rows past the swiglu rows: tail_row0)
//                                                                                          -> kTailPacked += n
//      every team: the out projection's tiles into mix_in, waiting until every 32-block is packed
//                                                                                          -> kOutTiles += 1
//   1. warps 0..8t-1 of the grid: the post-attention add-norm pack (with a tail, once every out tile is stored), a
//      token row split over 8 warps as row_rms_scale splits its sum (add_norm_pack_part)   -> kNormPacked += 1
//   2. every team: gate tiles, then up tiles, grid-strided; each waits (after its first weight copies) until all
//      8t parts are packed. Whichever team stores the second tile of a (gate, up) pair of 16 rows turns them
//      into silu(gate) * up in place and folds each token row's max |v| into kSwigluMax (swiglu_pair)
//                                                                                          -> kGateUpTiles += 1
//   3. every warp: the swiglu pack's 32-blocks, grid-strided, once every tile is stored (into the pack's rows
//      kActRows.., which no block read in this launch: the activations are read through the non-coherent path)
//                                                                                          -> kSwigluPacked += n
//   4. every team: down tiles, waiting (after their first weight copies) until every 32-block is packed.
//                                                                                          -> kDownTiles += 1
//   5. with a next norm only: warps 0..8t-1, the next layer's input norm (or the output norm) as in phase 1, once
//      every down tile is stored; its rows also copied as floats (the GDN step's fused projections read them)
//                                                                                          -> kNextNormPacked += 1
//   6. with the next layer's input projections only: every team, their tiles, waiting until the norm is packed
// A warp's part of phase 0 (1, 3) runs inside the wait of its first out (gate / up, down) tile, after that tile's
// first weight copies, or after the loop where it has no such tile: weights before flags for the packs too.
// Launch: a grid no larger than the GPU holds at once (the occupancy API's blocks per SM x SMs), through
// launch_kernel (PDL: it may start while the kernel before ends and issue its first weight copies then). Every block
// gets an SM as soon as the kernel before frees one, and the next kernel is let in only once every block is past its
// last wait, so the spinning cannot deadlock. Counters are released with a fence after each writer's stores and
// acquired by one lane per warp; the last block out zeroes them for the next launch. The arithmetic of every value is
// the separate launches' (add_norm_pack_row with row_rms_scale's order, gemv_tile_warp + tile_sum_store, swiglu1,
// pack_block) and a pack's only cross-block value, the row's max |v|, is exact in any order: the same bits.
#include <algorithm>

#include "device_attr.cuh"
#include "elementwise.cuh"
#include "ffn_persistent.cuh"
#include "gemv_mma.cuh"
#include "gemv_tma.cuh"
#include "grid_sync.cuh"
#include "launch_count.h"
#include "pdl.cuh"
#include "tma_ring.cuh"

namespace openjet {
namespace {

// The launch's scratch (ints of device memory, zero between launches): where each part starts.
constexpr int kNormParts = kRowThreads / 32;  // a row's add-norm pack split as row_rms_scale's warps split its sum
constexpr int kNormPacked = 0;                // add-norm parts packed (8t when phase 1 is done)
constexpr int kGateUpTiles = 1;               // gate and up tiles stored, with their pairs' swiglu values
constexpr int kSwigluPacked = 2;              // swiglu 32-blocks packed (t n_ff / 32 when phase 3 is done)
constexpr int kBlocksDone = 3;                // blocks finished: the last one zeroes the scratch for the next launch
constexpr int kTailMaxDone = 4;               // the tail's 32-blocks whose max |y| is folded in
constexpr int kTailPacked = 5;                // the tail's 32-blocks packed
constexpr int kOutTiles = 6;                  // out projection tiles stored (mix_in complete at n_embd / kHalfRows;
                                              // the producer-warp form's at n_embd / 16)
constexpr int kDownTiles = 7;                 // down tiles stored (mix_out complete at n_embd / 16)
constexpr int kNextNormPacked = 8;            // the next norm's parts packed (phase 5)
constexpr int kNextTiles = 9;                 // the next layer's input projection tiles stored (phase 6)
constexpr int kSwigluMax = 12;                         // [kActRows]: the swiglu row's max |v|, as the bits of a float
constexpr int kTailMax = kSwigluMax + kActRows;        // [kActRows]: the tail row's max |y|, likewise
// An add-norm's row scratch (add_norm_pack_part): per token row, its parts whose sum of squares is written, its
// parts whose max |v| is folded in, its max |v|, and the parts' sums of squares (floats).
constexpr int kNormSquaresDone = 0, kNormMaxDone = kActRows, kNormMax = 2 * kActRows, kNormSquares = 3 * kActRows;
constexpr int kNormScratch = 3 * kActRows + kActRows * kNormParts;
constexpr int kNorm1 = kTailMax + kActRows;   // phase 1's (the post-attention norm)
constexpr int kNorm2 = kNorm1 + kNormScratch;  // phase 5's (the next layer's norm)
constexpr int kPairs = kNorm2 + kNormScratch;  // [n_ff / 16]: tiles of a (gate, up) pair stored
// Where the tail's pack rows start (in rows of k_out): past every byte of the swiglu rows (kActRows.. at n_ff a row)
// and on a 32-row boundary, so that its values, sums and inv entries share no 128-byte line with theirs. Phase 0's
// tiles read the tail's rows through the SM's L1 (__ldg), and phase 3 writes the swiglu rows that phase 4 reads the
// same way: a shared line could be stale in an SM's L1 by then (L1s are not coherent within a launch).
__host__ __device__ constexpr long long round_up32(long long rows) { return (rows + 31) / 32 * 32; }

__host__ __device__ inline int tail_row0(int n_ff, int k_out) {
    return static_cast<int>(round_up32((2LL * kActRows * n_ff + k_out - 1) / k_out));
}

// ffn_next_pack_row0 (ffn_persistent.cuh): past the tail's rows (or the swiglu rows), in rows of n_embd: past their
// bytes, and past their row indices too (inv is indexed by row whatever the width: a width smaller than the tail's
// could otherwise put both groups' inv entries on the same rows).
__host__ __device__ inline int next_row0(const FfnPersistentArgs& a) {
    if (!a.next_w[0]) return 0;
    const int rows_end = a.out_w ? tail_row0(a.n_ff, a.k_out) + kActRows : 2 * kActRows;
    const long long end = a.out_w ? static_cast<long long>(rows_end) * a.k_out : 2LL * kActRows * a.n_ff;  // halves
    const long long past = (end + a.n_embd - 1) / a.n_embd;
    return static_cast<int>(round_up32(past > rows_end ? past : rows_end));
}

// The team kernel's out and next input projections' tiles are half tiles (8 rows, gemv_tile_warp's same bits): with a
// third tile type in the kernel, 16-row tiles (Q5_K's takes 128 registers in the decode GEMV alone) spilled there. (The
// producer-warp form takes 16-row tiles throughout: a ring unit is a 16-row group's.)
constexpr int kHalfRows = 8;
static_assert(kPairs == kFfnScratchFixedInts, "ffn_persistent.cuh's count of the fixed part");

// warp_arrive (grid_sync.cuh). Where `profile` is set and this release completes its phase (the counter reaches
// `target`), the time since the launch's first block started is added to profile[at]: when each phase ended, summed
// over launches (taken at releases only, outside the tiles' pipelines).
__device__ __forceinline__ void warp_release(int* counter, int add, int target = 0,
                                             unsigned long long* profile = nullptr, int at = 0) {
    warp_arrive(counter, add, [=](int before) {
        if (profile && before + add == target) {
            const unsigned long long start = __ldcg(profile + kProfStartMin);  // ~0: no block's start recorded yet
            if (start != ~0ULL) atomicAdd(profile + at, global_ns() - start);
        }
    });
}

__device__ __forceinline__ float warp_max(float m) {
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    return m;
}

// max |v| folded into a row's maximum: non-negative floats order as their bits (m comes from fmaxf chains that start
// at 0, which drop NaNs as the one-block pack's does).
__device__ __forceinline__ void fold_max(int* row_max, float m) {
    atomicMax(reinterpret_cast<unsigned*>(row_max), __float_as_uint(m));
}

__device__ __forceinline__ float read_max(const int* row_max) {
    return __uint_as_float(__ldcg(reinterpret_cast<const unsigned*>(row_max)));
}

// Part `part` of token row r's add-norm pack, by one warp: the elements i = 32 part + lane + 256 j, which are
// those row_rms_scale's warp `part` sums and the pack's 32-blocks part + 8 j. Three steps, each after the row's
// other parts have done the one before: h += delta and the part's sum of squares (row_rms_scale's fma chain and
// butterfly); the scale from the parts in warp order (its total), the values' max |v|; the pack of the part's
// blocks at the row's scale (and the values as floats into copy_rows where set). add_norm_pack_row's arithmetic, so
// its bits. norm: this add-norm's row scratch (kNormScratch ints); packed: released once the part is packed. (Not
// inlined, like the other packs: it runs inside a tile's wait, where the tile's registers are live.)
__device__ __noinline__ void add_norm_pack_part(float* h_rows, const float* delta, const float* w, int k, float eps,
                                                ActPack x, float* copy_rows, int* norm, int* packed, int t, int r,
                                                int part, unsigned long long* profile, int at) {
    const int lane = threadIdx.x & 31;
    float* hr = h_rows + static_cast<long long>(r) * k;
    const float* dr = delta + static_cast<long long>(r) * k;
    float sq = 0.0f;
#pragma unroll 4
    for (int i = kActBlock * part + lane; i < k; i += kRowThreads) {
        const float v = __fadd_rn(hr[i], __ldcg(dr + i));  // delta: written in this launch (a tail's mix_in, mix_out)
        hr[i] = v;
        sq = __fmaf_rn(v, v, sq);
    }
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, m);
    float* squares = reinterpret_cast<float*>(norm + kNormSquares) + r * kNormParts;
    if (lane == 0) squares[part] = sq;
    warp_release(norm + kNormSquaresDone + r, 1);
    warp_wait(norm + kNormSquaresDone + r, kNormParts);
    float total = 0.0f;
#pragma unroll
    for (int p = 0; p < kNormParts; ++p) total += __ldcg(squares + p);
    const float scale = rsqrtf(__fdiv_rn(total, static_cast<float>(k)) + eps);

    float m = 0.0f;
#pragma unroll 4
    for (int i = kActBlock * part + lane; i < k; i += kRowThreads)
        m = fmaxf(m, fabsf(__fmul_rn(__fmul_rn(hr[i], scale), w[i])));
    m = warp_max(m);
    if (lane == 0) fold_max(norm + kNormMax + r, m);
    warp_release(norm + kNormMaxDone + r, 1);
    warp_wait(norm + kNormMaxDone + r, kNormParts);

    const int sh = act_pack_shift(read_max(norm + kNormMax + r));
    const float sc = ldexpf(1.0f, sh);
    __half* h = x.h + static_cast<long long>(r) * k;
    __half* sum = x.sum + static_cast<long long>(r) * (k / kActBlock) * 2;
    float* copy = copy_rows ? copy_rows + static_cast<long long>(r) * k : nullptr;
    for (int b = part; b < k / kActBlock; b += kNormParts) {
        const int i = b * kActBlock + lane;
        const float v = __fmul_rn(__fmul_rn(hr[i], scale), w[i]);
        if (copy) copy[i] = v;
        pack_block(v, sc, b, h, sum);
    }
    if (part == 0 && lane == 0) x.inv[r] = ldexpf(1.0f, -sh);
    warp_release(packed, 1, kNormParts * t, profile, at);
}

// A pack of rows v [t, k] spread over the grid's warps, a 32-block (an item: row item / (k / 32), block item % (k /
// 32)) per warp at a time: items grid_warp, grid_warp + grid_warps, ... Two steps with the pack_act_row arithmetic:
// fold_items folds each item's max |v| into row_max[row]; once every item's is, pack_items packs them at their rows'
// scales into p. Each releases `done` by the warp's item count (none: nothing to release) and returns the count.
__device__ __noinline__ int fold_items(const float* v, int t, int k, int* row_max, int grid_warp, int grid_warps,
                                       int* done, unsigned long long* profile, int at) {
    const int lane = threadIdx.x & 31, nb = k / kActBlock;
    int items = 0;
    for (int item = grid_warp; item < t * nb; item += grid_warps, ++items) {
        const float m = warp_max(fmaxf(0.0f, fabsf(__ldcg(v + static_cast<long long>(item) * kActBlock + lane))));
        if (lane == 0) fold_max(row_max + item / nb, m);
    }
    if (items) warp_release(done, items, t * nb, profile, at);
    return items;
}

__device__ __noinline__ int pack_items(const float* v, int t, int k, const int* row_max, ActPack p, int grid_warp,
                                       int grid_warps, int* done, unsigned long long* profile, int at) {
    const int lane = threadIdx.x & 31, nb = k / kActBlock;
    int items = 0;
    for (int item = grid_warp; item < t * nb; item += grid_warps, ++items) {
        const int r = item / nb, b = item % nb;
        const int sh = act_pack_shift(read_max(row_max + r));
        pack_block(__ldcg(v + static_cast<long long>(item) * kActBlock + lane), ldexpf(1.0f, sh), b,
                   p.h + static_cast<long long>(r) * k, p.sum + static_cast<long long>(r) * nb * 2);
        if (b == 0 && lane == 0) p.inv[r] = ldexpf(1.0f, -sh);
    }
    if (items) warp_release(done, items, t * nb, profile, at);
    return items;
}

// After this warp stored one tile of the (gate, up) pair of rows row0..row0+15 (tile_sum_store's lanes): the warp
// that stores the pair's second tile turns its 16 x t values into silu(gate) * up, in place in g_out, and folds
// each token row's max |v| into kSwigluMax.
__device__ __forceinline__ void swiglu_pair(const FfnPersistentArgs& a, int* s, int row0) {
    const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    __threadfence();  // this tile's stores, before the pair's count
    __syncwarp();
    int second = 0;
    if (lane == 0) second = atomicAdd(s + kPairs + row0 / kMmaRows, 1) == 1;
    if (!__shfl_sync(0xffffffffu, second, 0)) return;
    __threadfence();  // the other tile's stores, published before its count, are seen from here
    float m[2] = {0.0f, 0.0f};
#pragma unroll
    for (int c = 0; c < 4; ++c) {  // tile_sum_store's (row, token row) of this lane
        const int row = row0 + g + 8 * (c >> 1), col = 2 * tq + (c & 1);
        if (row < a.n_ff && col < a.t) {
            const long long i = static_cast<long long>(col) * a.n_ff + row;
            const float v = swiglu1(__ldcg(a.g_out + i), __ldcg(a.u_out + i));
            a.g_out[i] = v;
            m[c & 1] = fmaxf(m[c & 1], fabsf(v));
        }
    }
#pragma unroll
    for (int o = 4; o <= 16; o <<= 1)  // over g: the lanes of one tq hold the same token rows
        for (int c = 0; c < 2; ++c) m[c] = fmaxf(m[c], __shfl_xor_sync(0xffffffffu, m[c], o));
    if (g == 0)
        for (int c = 0; c < 2; ++c)
            if (2 * tq + c < a.t) fold_max(s + kSwigluMax + 2 * tq + c, m[c]);
}

// The next layer's input projections' tiles of `rows` rows (the team kernel's half tiles, the producer-warp form's
// 16-row ones), the matrices' in turn (selects, not indexing: a dynamic index into the parameter arrays put them on
// the stack).
__host__ __device__ inline int next_tile_count(const FfnPersistentArgs& a, int rows) {
    if (!a.next_w[0]) return 0;
    return a.next_n[0] / rows + (a.next_w[1] ? a.next_n[1] / rows : 0) + (a.next_w[2] ? a.next_n[2] / rows : 0);
}
struct NextTile {
    const uint8_t* w;  // its matrix
    int n, row0;       // the matrix's rows, the tile's first
    float* y;
    bool q6;           // Q6_K, else Q4_K
};
__device__ __forceinline__ NextTile next_tile(const FfnPersistentArgs& a, int i, int rows) {
    const int t0 = a.next_n[0] / rows, t1 = a.next_w[1] ? a.next_n[1] / rows : 0;
    const int m = i < t0 ? 0 : i < t0 + t1 ? 1 : 2, r = i - (m == 0 ? 0 : m == 1 ? t0 : t0 + t1);
    NextTile nt;
    nt.w = static_cast<const uint8_t*>(m == 0 ? a.next_w[0] : m == 1 ? a.next_w[1] : a.next_w[2]);
    nt.n = m == 0 ? a.next_n[0] : m == 1 ? a.next_n[1] : a.next_n[2];
    nt.row0 = r * rows;
    nt.y = m == 0 ? a.next_y[0] : m == 1 ? a.next_y[1] : a.next_y[2];
    nt.q6 = (m == 0 ? a.next_type[0] : m == 1 ? a.next_type[1] : a.next_type[2]) == kQ6_K;
    return nt;
}

// A launch's end, by every thread of each block once all its warps are past their last wait: the next kernel may
// launch once every block is here (the team kernel's rule; the producer-warp form lets it in at its down phase, once
// every block is resident). The last block out zeroes the scratch (no memset between launches, which would
// break the PDL chain; the next launch reads it after its pdl_wait, so after this kernel has finished) and closes
// the profile's launch. grid_warps: the warps that took work (the profile's count).
__device__ __forceinline__ void launch_done(const FfnPersistentArgs& a, int grid_warps) {
    __syncthreads();
    pdl_launch_dependents();
    int* s = a.counters;
    __shared__ bool last;
    if (threadIdx.x == 0) {
        if (a.profile) atomicMax(a.profile + kProfEndMax, global_ns());
        __threadfence();
        last = atomicAdd(s + kBlocksDone, 1) == static_cast<int>(gridDim.x) - 1;
    }
    __syncthreads();
    if (!last) return;
    for (int i = threadIdx.x; i < ffn_persistent_scratch_ints(a.n_ff); i += blockDim.x) __stcg(s + i, 0);
    if (a.profile && threadIdx.x == 0) {  // every block's start and end are in (atomics before their count)
        __threadfence();
        unsigned long long* p = a.profile;
        const unsigned long long start = __ldcg(p + kProfStartMin);
        // (~0: every block started before the previous launch's reset, possible under PDL: no span this time)
        if (start != ~0ULL) p[kProfSpanNs] += __ldcg(p + kProfEndMax) - start;
        p[kProfLaunches] += 1;
        p[kProfWarps] += static_cast<unsigned long long>(grid_warps);
        p[kProfStartMin] = ~0ULL;
        p[kProfEndMax] = 0;
    }
}

// A warp's cp.async stages: for the largest of the FFN's tiles and the tail's (Q4_K or Q5_K half tiles).
template <int QG, int QD> __host__ __device__ constexpr int warp_words() {
    constexpr int ffn = MmaShape<QG>::kWarpWords > MmaShape<QD>::kWarpWords ? MmaShape<QG>::kWarpWords
                                                                           : MmaShape<QD>::kWarpWords;
    constexpr int tail = MmaShape<kQ5_K, kHalfRows>::kWarpWords;
    return ffn > tail ? ffn : tail;
}

// Dynamic shared memory: the teams' cp.async stages.
template <int QG, int QD, int kTeams> constexpr size_t smem_bytes() {
    return sizeof(uint4) * kTeams * kGemvWarps * warp_words<QG, QD>();
}

template <int QG, int QD, int kTeams>
__global__ void __launch_bounds__(kTeams * kGemvWarps * 32, 1) ffn_persistent_kernel(const FfnPersistentArgs a) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900 || __CUDA_ARCH__ >= 1200)
    if constexpr (kTeams > 2) return;  // launch_types: only the 227 KB SMs of sm_90 / sm_100 hold four teams
#endif
    constexpr int kWarps = kTeams * kGemvWarps;
    extern __shared__ uint4 smem[];
    // Two per team: warp 0 sums a tile's partials from one while the team's other warps, past the tile's barrier,
    // already write the next tile's into the other (no second barrier waiting on warp 0's store).
    __shared__ float part[2][kTeams][kGemvWarps][1][32][4];
    int parity = 0;
    const int team = threadIdx.x / (kGemvWarps * 32), warp = (threadIdx.x >> 5) % kGemvWarps, lane = threadIdx.x & 31;
    const int team_id = blockIdx.x * kTeams + team, n_teams = gridDim.x * kTeams;
    const int grid_warp = blockIdx.x * kWarps + (threadIdx.x >> 5), grid_warps = gridDim.x * kWarps;
    uint4* team_smem = smem + team * kGemvWarps * warp_words<QG, QD>();
    int* s = a.counters;
    const ActPack xs = a.x.from_row(kActRows, a.n_ff);  // the swiglu rows
    if (a.profile && threadIdx.x == 0) atomicMin(a.profile + kProfStartMin, global_ns());

    // A team's tile: rows row0.. of w (n rows, k columns) into y; each warp calls ready() after its first weight
    // copies (gemv_tile_warp's wait: it returns once the input pack xin is complete); warp 0, which stores the tile,
    // then runs stored().
    const auto tile = [&](auto qt, auto rows, const void* w, int n, int k, int row0, const ActPack& xin, float* y,
                          const auto& ready, auto stored) {
        constexpr int QT = decltype(qt)::value, kRows = decltype(rows)::value;
        const int nu = k / kUnitElems;
        float acc[1][4] = {};
        gemv_tile_warp<QT, 1, kRows>(static_cast<const uint8_t*>(w), row_bytes_of<QT>(k), n, row0,
                                     quarter_begin(nu, warp), quarter_begin(nu, warp + 1), xin, k, a.t, 0,
                                     team_smem + warp * MmaShape<QT, kRows>::kWarpWords, acc, ready, a.tiled);
#pragma unroll
        for (int c = 0; c < 4; ++c) part[parity][team][warp][0][lane][c] = acc[0][c];
        asm volatile("bar.sync %0, %1;" ::"r"(1 + team), "r"(kGemvWarps * 32) : "memory");
        // part[parity] is written again two tiles on, after the next tile's barrier, which warp 0 reaches only once
        // this store is done
        if (warp == 0) {
            tile_sum_store<1, kRows>(part[parity][team], lane, row0, 0, n, a.t, xin.inv, y);
            stored();
        }
        parity ^= 1;
    };

    // Each warp's pack work runs inside the wait of its first tile of the next phase, after that tile's first weight
    // copies are issued (weights before flags), or after the phase's loop where it has no tile there.
    // 0. the tail: the mixer's output pack, a 32-block per warp at a time in two steps over the same blocks (each
    //    block's max |y| folded into its row's, then, once every block's is, the pack), then the out projection
    const bool tail = a.out_w != nullptr;
    const int o_tiles = (a.n_embd + kHalfRows - 1) / kHalfRows, nb_y = a.k_out / kActBlock;
    const ActPack xy = a.x.from_row(tail ? tail_row0(a.n_ff, a.k_out) : 0, a.k_out);
    bool tail_left = tail;
    const auto tail_pack = [&] {
        pdl_wait();  // the kernels before have finished: y_in, h, mix_in, and this scratch, zeroed by the last launch
        if (!tail_left) return;
        tail_left = false;
        if (!fold_items(a.y_in, a.t, a.k_out, s + kTailMax, grid_warp, grid_warps, s + kTailMaxDone, a.profile,
                        kProfAtTailMax))
            return;
        warp_wait(s + kTailMaxDone, a.t * nb_y);
        pack_items(a.y_in, a.t, a.k_out, s + kTailMax, xy, grid_warp, grid_warps, s + kTailPacked, a.profile,
                   kProfAtTailPacked);
    };
    // 1. the post-attention add-norm pack: warps 0..8t-1 (the launcher's grid has them), once mix_in is complete
    bool norm_left = grid_warp < kNormParts * a.t;
    const auto norm_pack = [&] {
        tail_pack();  // (its pdl_wait, where this warp has done its tail already or there is none)
        if (norm_left) {
            if (tail) warp_wait(s + kOutTiles, o_tiles);
            add_norm_pack_part(a.h, a.mix_in, a.post_norm, a.n_embd, a.eps, a.x, nullptr, s + kNorm1, s + kNormPacked,
                               a.t, grid_warp / kNormParts, grid_warp % kNormParts, a.profile, kProfAtNormPacked);
        }
        norm_left = false;
    };
    // 3. the swiglu pack, a 32-block per warp at a time, once every gate and up tile is stored
    const int g_tiles = (a.n_ff + kMmaRows - 1) / kMmaRows, nb = a.n_ff / kActBlock;
    bool swiglu_left = true;
    const auto swiglu_pack = [&] {
        if (!swiglu_left) return;
        swiglu_left = false;
        if (grid_warp >= a.t * nb) return;  // no items
        warp_wait(s + kGateUpTiles, 2 * g_tiles);
        pack_items(a.g_out, a.t, a.n_ff, s + kSwigluMax, xs, grid_warp, grid_warps, s + kSwigluPacked, a.profile,
                   kProfAtSwigluPacked);
    };

    // 0. the out projection's tiles into mix_in, where there is a tail (its type chosen at run time: Q5_K for
    //    ssm_out, Q4_K for attn_output)
    for (int i = tail ? team_id : o_tiles; i < o_tiles; i += n_teams) {
        const auto out_tile = [&](auto qt) {
            tile(qt, std::integral_constant<int, kHalfRows>{}, a.out_w, a.n_embd, a.k_out, i * kHalfRows, xy,
                 a.mix_in,
                 [&] {
                     tail_pack();
                     warp_wait(s + kTailPacked, a.t * nb_y);
                 },
                 [&] { warp_release(s + kOutTiles, 1, o_tiles, a.profile, kProfAtOutTiles); });
        };
        if (a.out_type == kQ5_K) out_tile(std::integral_constant<int, kQ5_K>{});
        else out_tile(std::integral_constant<int, kQ4_K>{});
    }
    tail_pack();

    // 2. gate, then up
    for (int i = team_id; i < 2 * g_tiles; i += n_teams) {
        const bool up = i >= g_tiles;
        const int row0 = (up ? i - g_tiles : i) * kMmaRows;
        tile(std::integral_constant<int, QG>{}, std::integral_constant<int, kMmaRows>{}, up ? a.up : a.gate, a.n_ff,
             a.n_embd, row0, a.x, up ? a.u_out : a.g_out,
             [&] {
                 norm_pack();
                 warp_wait(s + kNormPacked, kNormParts * a.t);
             },
             [&] {
                 swiglu_pair(a, s, row0);
                 warp_release(s + kGateUpTiles, 1, 2 * g_tiles, a.profile, kProfAtGateUp);
             });
    }
    norm_pack();

    // 4. down
    const int d_tiles = (a.n_embd + kMmaRows - 1) / kMmaRows;
    for (int i = team_id; i < d_tiles; i += n_teams)
        tile(std::integral_constant<int, QD>{}, std::integral_constant<int, kMmaRows>{}, a.down, a.n_embd, a.n_ff,
             i * kMmaRows, xs, a.mix_out,
             [&] {
                 swiglu_pack();
                 warp_wait(s + kSwigluPacked, a.t * nb);
             },
             [&] { warp_release(s + kDownTiles, 1, d_tiles, a.profile, kProfAtDown); });
    swiglu_pack();

    // 5. the next norm (the next layer's input norm, or the output norm), where asked: h += mix_out, packed into the
    //    norm's rows (rows of its own where phase 6 follows: next_row0) and copied as floats to next_a, by warps
    //    0..8t-1 once every down tile is stored
    const ActPack xn = a.x.from_row(next_row0(a), a.n_embd);
    if (a.next_norm && grid_warp < kNormParts * a.t) {
        warp_wait(s + kDownTiles, d_tiles);
        add_norm_pack_part(a.h, a.mix_out, a.next_norm, a.n_embd, a.eps, xn, a.next_a, s + kNorm2,
                           s + kNextNormPacked, a.t, grid_warp / kNormParts, grid_warp % kNormParts, a.profile,
                           kProfAtNextNorm);
    }

    // 6. the next layer's input projections, where asked: every team, tiles of the (up to three) matrices in turn,
    //    waiting (after their first weight copies) until the next norm is packed
    const int next_tiles = next_tile_count(a, kHalfRows);
    for (int i = team_id; i < next_tiles; i += n_teams) {
        const NextTile nt = next_tile(a, i, kHalfRows);
        const auto proj_tile = [&](auto qt) {  // half tiles, as the tail's (registers)
            tile(qt, std::integral_constant<int, kHalfRows>{}, nt.w, nt.n, a.n_embd, nt.row0, xn, nt.y,
                 [&] { warp_wait(s + kNextNormPacked, kNormParts * a.t); },
                 [&] { warp_release(s + kNextTiles, 1, next_tiles, a.profile, kProfAtNextProj); });
        };
        if (nt.q6) proj_tile(std::integral_constant<int, kQ6_K>{});
        else proj_tile(std::integral_constant<int, kQ4_K>{});
    }

    launch_done(a, grid_warps);
}
// The producer-warp form (FfnPersistentArgs::tma; sm_90a): the FFN (with the tail, the next norm and the next layer's
// input projections where asked) on blocks of four consumer warps fed by one producer thread's bulk copies
// (tma_ring.cuh, the decode default's way of streaming: gemv_tma.cu). The producer walks the block's out tiles (with a
// tail), its gate / up tiles, its down tiles, then its next projections' tiles (16-row tiles throughout, as the
// default's GEMVs), and never waits on a counter, only on its rings' empty slots, so a phase's first weights are in
// shared memory before its input is ready: the weights-before-flags of docs/MEGAKERNEL.md with no pipeline to drain
// at a boundary. The consumer warps do what the team kernel's warps do between tiles (the tail's pack items, the
// add-norm parts, the swiglu pair, the swiglu pack items, the next norm) and each tile as gemv_tma_kernel does it (a k
// quarter each, warp 0 summing in order: tile_sum_store): the same bits.
// Every value a consumer reads that this launch wrote is read from L2 or lies in lines no SM read earlier in the
// launch, as in the team kernel (the norm rows at 0.., the swiglu rows at kActRows.., the tail's at tail_row0, the
// next norm's at next_row0 where the next projections read them here).
constexpr int kTmaRing = 4;       // units in flight per consumer warp
constexpr int kTmaMinBlocks = 3;  // blocks per SM the registers are cut for (128 a thread)

// A ring slot: the largest unit of the types a launch may stream (Q4_K and Q5_K tails, Q4_K gate / up, Q4_K or Q6_K
// down and next projections), Q6_K's.
constexpr int kTmaSlot = TmaUnit<kQ6_K>::kChunk;
static_assert(kTmaSlot >= TmaUnit<kQ5_K>::kChunk && kTmaSlot >= TmaUnit<kQ4_K>::kChunk, "Q6_K's unit the largest");
constexpr int kTmaSmemBytes = kTmaConsumerWarps * kTmaRing * kTmaSlot + 16;  // +16: a word read past a row's end

template <int QD>
__global__ void __launch_bounds__(kTmaThreads, kTmaMinBlocks) ffn_tma_kernel(const FfnPersistentArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(128) uint8_t ring[];
    __shared__ __align__(8) uint64_t bar_words[TmaBars<kTmaRing>::kBytes / 8];
    __shared__ float part[2][kGemvWarps][1][32][4];  // double-buffered: one barrier a tile
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const TmaBars<kTmaRing> bars{static_cast<uint32_t>(__cvta_generic_to_shared(bar_words))};
    bars.init();
    mbar_init_fence();
    __syncthreads();  // the barriers initialised
    if (a.profile && threadIdx.x == 0) atomicMin(a.profile + kProfStartMin, global_ns());
    const int t = a.t, g_tiles = a.n_ff / kMmaRows, gu_tiles = 2 * g_tiles, d_tiles = a.n_embd / kMmaRows;
    const int nu_gu = a.n_embd / kUnitElems, nu_d = a.n_ff / kUnitElems;
    const int grid_warps = gridDim.x * kTmaConsumerWarps;
    const bool tail = a.out_w != nullptr, q5 = a.out_type == kQ5_K;  // the out projection's type: Q5_K or Q4_K
    const int o_tiles = tail ? a.n_embd / kMmaRows : 0, nu_o = a.k_out / kUnitElems;
    const int next_tiles = next_tile_count(a, kMmaRows);

    if (warp == kTmaConsumerWarps) {  // the producer: weights only (immutable: no pdl_wait needed)
        if (lane == 0) {
            const uint32_t ring0 = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
            const uint64_t policy = l2_policy_evict_first();  // read once a step: leave L2 to the rest
            int issued[kTmaConsumerWarps] = {};
            const uint8_t* out_w = static_cast<const uint8_t*>(a.out_w);
            for (int i = blockIdx.x; i < o_tiles; i += gridDim.x) {
                if (q5)
                    tma_produce_tile<kQ5_K, kTmaRing, kTmaSlot>(
                        bars, ring0, out_w + static_cast<long long>(i) * nu_o * TmaUnit<kQ5_K>::kChunk, nu_o, issued,
                        policy);
                else
                    tma_produce_tile<kQ4_K, kTmaRing, kTmaSlot>(
                        bars, ring0, out_w + static_cast<long long>(i) * nu_o * TmaUnit<kQ4_K>::kChunk, nu_o, issued,
                        policy);
            }
            for (int i = blockIdx.x; i < gu_tiles; i += gridDim.x) {
                const bool up = i >= g_tiles;
                const uint8_t* w = static_cast<const uint8_t*>(up ? a.up : a.gate);
                tma_produce_tile<kQ4_K, kTmaRing, kTmaSlot>(
                    bars, ring0, w + static_cast<long long>(up ? i - g_tiles : i) * nu_gu * TmaUnit<kQ4_K>::kChunk,
                    nu_gu, issued, policy);
            }
            for (int i = blockIdx.x; i < d_tiles; i += gridDim.x)
                tma_produce_tile<QD, kTmaRing, kTmaSlot>(
                    bars, ring0,
                    static_cast<const uint8_t*>(a.down) + static_cast<long long>(i) * nu_d * TmaUnit<QD>::kChunk, nu_d,
                    issued, policy);
            for (int i = blockIdx.x; i < next_tiles; i += gridDim.x) {
                const NextTile nt = next_tile(a, i, kMmaRows);
                const long long units0 = static_cast<long long>(nt.row0 / kMmaRows) * nu_gu;  // the tile's first unit
                if (nt.q6)
                    tma_produce_tile<kQ6_K, kTmaRing, kTmaSlot>(bars, ring0, nt.w + units0 * TmaUnit<kQ6_K>::kChunk,
                                                                nu_gu, issued, policy);
                else
                    tma_produce_tile<kQ4_K, kTmaRing, kTmaSlot>(bars, ring0, nt.w + units0 * TmaUnit<kQ4_K>::kChunk,
                                                                nu_gu, issued, policy);
            }
        }
        __syncwarp();
        pdl_wait();  // (pdl.cuh's rule: launch_done's last block writes the scratch with every thread, these too)
    } else {
        int* s = a.counters;
        const int grid_warp = blockIdx.x * kTmaConsumerWarps + warp, g = lane >> 2, tq = lane & 3;
        const long long col = min(g, t - 1);  // lanes past t read row t - 1 (UnitX)
        const uint32_t full0 = bars.full(warp, 0);
        const uint8_t* const ring_w = ring + warp * kTmaRing * kTmaSlot;
        int slot = 0, buf = 0;
        uint32_t phase = 0;
        // A tile of the block: this warp's k quarter of its units from the ring, the four partials summed in order
        // by warp 0, which stores the tile and runs stored().
        const auto tile = [&](auto qt, int nu, const ActPack& xin, int k, int n, int row0, float* y, auto stored) {
            constexpr int QT = decltype(qt)::value;
            float acc[1][4] = {};
            tma_consume_units<QT, kTmaRing, kTmaSlot>(full0, ring_w, quarter_begin(nu, warp),
                                                      quarter_begin(nu, warp + 1), xin.h + col * k,
                                                      xin.sum + col * (k / kActBlock) * 2, lane, g, tq, slot, phase,
                                                      acc);
#pragma unroll
            for (int c = 0; c < 4; ++c) part[buf][warp][0][lane][c] = acc[0][c];
            named_bar_sync(1, kTmaConsumerWarps * 32);  // (part[buf ^ 1] was read by warp 0 before it arrived here)
            if (warp == 0) {
                tile_sum_store<1, kMmaRows>(part[buf], lane, row0, 0, n, t, xin.inv, y);
                stored();
            }
            buf ^= 1;
        };
        pdl_wait();  // the kernels before have finished: y_in, h, mix_in, and this scratch, zeroed by the last launch

        // 0. the tail: the mixer output's pack (a 32-block per warp at a time, in two steps over the same blocks: each
        //    block's max |y| folded into its row's, then, once every block's is, the pack into rows past the swiglu
        //    rows), then the out projection's tiles into mix_in
        if (tail) {
            const ActPack xy = a.x.from_row(tail_row0(a.n_ff, a.k_out), a.k_out);
            const int nb_y = a.k_out / kActBlock;
            if (fold_items(a.y_in, t, a.k_out, s + kTailMax, grid_warp, grid_warps, s + kTailMaxDone, a.profile,
                           kProfAtTailMax)) {
                warp_wait(s + kTailMaxDone, t * nb_y);
                pack_items(a.y_in, t, a.k_out, s + kTailMax, xy, grid_warp, grid_warps, s + kTailPacked, a.profile,
                           kProfAtTailPacked);
            }
            if (static_cast<int>(blockIdx.x) < o_tiles) warp_wait(s + kTailPacked, t * nb_y);
            const auto out_stored = [&] { warp_release(s + kOutTiles, 1, o_tiles, a.profile, kProfAtOutTiles); };
            for (int i = blockIdx.x; i < o_tiles; i += gridDim.x) {
                if (q5)
                    tile(std::integral_constant<int, kQ5_K>{}, nu_o, xy, a.k_out, a.n_embd, i * kMmaRows, a.mix_in,
                         out_stored);
                else
                    tile(std::integral_constant<int, kQ4_K>{}, nu_o, xy, a.k_out, a.n_embd, i * kMmaRows, a.mix_in,
                         out_stored);
            }
        }
        // 1. the post-attention add-norm pack: warps 0..8t-1 (the launcher's grid has them), once mix_in is complete
        if (grid_warp < kNormParts * t) {
            if (tail) warp_wait(s + kOutTiles, o_tiles);
            add_norm_pack_part(a.h, a.mix_in, a.post_norm, a.n_embd, a.eps, a.x, nullptr, s + kNorm1, s + kNormPacked,
                               t, grid_warp / kNormParts, grid_warp % kNormParts, a.profile, kProfAtNormPacked);
        }
        // 2. gate, then up, once the pack is complete; the warp storing a pair's second tile makes its swiglu values
        if (static_cast<int>(blockIdx.x) < gu_tiles) warp_wait(s + kNormPacked, kNormParts * t);
        for (int i = blockIdx.x; i < gu_tiles; i += gridDim.x) {
            const bool up = i >= g_tiles;
            const int row0 = (up ? i - g_tiles : i) * kMmaRows;
            tile(std::integral_constant<int, kQ4_K>{}, nu_gu, a.x, a.n_embd, a.n_ff, row0, up ? a.u_out : a.g_out, [&] {
                swiglu_pair(a, s, row0);
                warp_release(s + kGateUpTiles, 1, gu_tiles, a.profile, kProfAtGateUp);
            });
        }
        // 3. the swiglu pack, a 32-block per warp at a time, once every gate and up tile is stored
        const ActPack xs = a.x.from_row(kActRows, a.n_ff);
        const int nb = a.n_ff / kActBlock;
        if (grid_warp < t * nb) {
            warp_wait(s + kGateUpTiles, gu_tiles);
            pack_items(a.g_out, t, a.n_ff, s + kSwigluMax, xs, grid_warp, grid_warps, s + kSwigluPacked, a.profile,
                       kProfAtSwigluPacked);
        }
        // The next kernel may launch now, while down streams (its blocks take the room 3 of these leave on an SM and
        // fill their rings, as a GEMV after the default's down GEMV does): the launch waits for every block of this
        // grid to get here or end, so all of them are resident by then and none can be kept off an SM by it. (And
        // every read of the rows at 0.. through L1 is done by then: block 0's warps all have pack items, so it gets
        // here only after every gate / up tile is stored; what this launch still reads through L1 after it, the
        // swiglu rows, h and the next norm's rows, no later kernel writes before this one has ended.)
        pdl_launch_dependents();
        // 4. down, once every 32-block is packed
        if (static_cast<int>(blockIdx.x) < d_tiles) warp_wait(s + kSwigluPacked, t * nb);
        for (int i = blockIdx.x; i < d_tiles; i += gridDim.x)
            tile(std::integral_constant<int, QD>{}, nu_d, xs, a.n_ff, a.n_embd, i * kMmaRows, a.mix_out,
                 [&] { warp_release(s + kDownTiles, 1, d_tiles, a.profile, kProfAtDown); });
        // 5. the next norm where asked (the next layer's input norm, or the output norm): h += mix_out, packed into
        //    rows 0.. (read by the kernels after this one; rows of their own, next_row0, where phase 6 reads them
        //    here) and copied as floats to next_a, by warps 0..8t-1 once every down tile is stored
        const ActPack xn = a.x.from_row(next_row0(a), a.n_embd);
        if (a.next_norm && grid_warp < kNormParts * t) {
            warp_wait(s + kDownTiles, d_tiles);
            add_norm_pack_part(a.h, a.mix_out, a.next_norm, a.n_embd, a.eps, xn, a.next_a, s + kNorm2,
                               s + kNextNormPacked, t, grid_warp / kNormParts, grid_warp % kNormParts, a.profile,
                               kProfAtNextNorm);
        }
        // 6. the next layer's input projections where asked, once the next norm is packed
        if (static_cast<int>(blockIdx.x) < next_tiles) warp_wait(s + kNextNormPacked, kNormParts * t);
        for (int i = blockIdx.x; i < next_tiles; i += gridDim.x) {
            const NextTile nt = next_tile(a, i, kMmaRows);
            const auto stored = [&] { warp_release(s + kNextTiles, 1, next_tiles, a.profile, kProfAtNextProj); };
            if (nt.q6)
                tile(std::integral_constant<int, kQ6_K>{}, nu_gu, xn, a.n_embd, nt.n, nt.row0, nt.y, stored);
            else
                tile(std::integral_constant<int, kQ4_K>{}, nu_gu, xn, a.n_embd, nt.n, nt.row0, nt.y, stored);
        }
    }
    launch_done(a, grid_warps);
#endif
}

template <int QG, int QD, int kTeams>
cudaError_t launch_teams(const FfnPersistentArgs& a, cudaStream_t stream) {
    constexpr auto kKernel = ffn_persistent_kernel<QG, QD, kTeams>;
    constexpr size_t kSmem = smem_bytes<QG, QD, kTeams>();
    constexpr int kThreads = kTeams * kGemvWarps * 32;
    // (asked once a kernel: the attribute and occupancy calls cost the host microseconds each, and this runs once per
    // layer of a decode step; the first GPU run, 83ed0d8, asked them on every launch)
    const int per_sm = resident_per_sm<kKernel, kThreads, kSmem>();
    int sms = 0;
    if (cudaError_t e = device_attribute(cudaDevAttrMultiProcessorCount, &sms)) return e;
    if (per_sm < 1) return cudaErrorNotSupported;
    const int tiles = std::max({2 * ((a.n_ff + kMmaRows - 1) / kMmaRows), (a.n_embd + kMmaRows - 1) / kMmaRows,
                                a.out_w ? a.n_embd / kHalfRows : 0, next_tile_count(a, kHalfRows)});  // a team each
    const int least = (kNormParts * a.t + kTeams * kGemvWarps - 1) / (kTeams * kGemvWarps);  // phase 1's warps
    const int blocks =
        std::max(least, std::min(grid_sm_count(sms, a.grid_sms) * per_sm, (tiles + kTeams - 1) / kTeams));
    if (blocks > sms * per_sm) return cudaErrorNotSupported;  // every block must be resident
    return launch_kernel(kKernel, dim3(blocks), dim3(kThreads), kSmem, stream, a);
}

// Four teams where shared memory holds them (sm_90: 110-172 KB), else two (the 100 KB SMs of sm_86/89/120). The
// four-team kernel is compiled empty for the architectures of 100 KB SMs, below sm_90 and from sm_120 on (ptxVersion
// says what its code was built for), where it could never be launched and where 128 registers spilled.
template <int QG, int QD> cudaError_t launch_types(const FfnPersistentArgs& a, cudaStream_t stream) {
    int optin = 0;
    static cudaFuncAttributes attr{};  // the 4-team kernel's static shared memory, asked once
    static const cudaError_t asked = cudaFuncGetAttributes(&attr, ffn_persistent_kernel<QG, QD, 4>);
    if (asked != cudaSuccess) return asked;
    if (cudaError_t e = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, &optin)) return e;
    if (attr.ptxVersion >= 90 && attr.ptxVersion < 120 &&
        attr.sharedSizeBytes + smem_bytes<QG, QD, 4>() <= static_cast<size_t>(optin))
        return launch_teams<QG, QD, 4>(a, stream);
    return launch_teams<QG, QD, 2>(a, stream);
}

// The producer-warp form's launch: resident blocks (the occupancy API's, asked once, after the shared-memory opt-in)
// x the SMs (or grid_sms), at most a block per gate / up tile and at least phase 1's 8t warps.
template <int QD> cudaError_t launch_tma(const FfnPersistentArgs& a, cudaStream_t stream) {
    constexpr auto kKernel = ffn_tma_kernel<QD>;
    constexpr int kSmem = kTmaSmemBytes;
    // The most shared memory an SM can take, asked for: the occupancy API counts with it, and a grid of spinning
    // blocks must all be resident (with the driver's own choice, an SM configured for one or two blocks, e.g. after
    // the GEMV before, could leave blocks unscheduled: the waits would trap after kWaitLimitNs).
    const int per_sm = resident_per_sm<kKernel, kTmaThreads, kSmem>(true);
    int sms = 0;
    if (cudaError_t e = device_attribute(cudaDevAttrMultiProcessorCount, &sms)) return e;
    if (per_sm < 1) return cudaErrorNotSupported;
    const int tiles = 2 * (a.n_ff / kMmaRows);  // the largest phase (n_ff >= n_embd: ffn_persistent_takes)
    const int least = (kNormParts * a.t + kTmaConsumerWarps - 1) / kTmaConsumerWarps;  // phase 1's warps
    const int blocks = std::max(least, std::min(grid_sm_count(sms, a.grid_sms) * per_sm, tiles));
    if (blocks > sms * per_sm) return cudaErrorNotSupported;  // every block must be resident
    count_launch(Counted::kFfnPersistentTma);
    return launch_kernel(kKernel, dim3(blocks), dim3(kTmaThreads), kSmem, stream, a);
}

}  // namespace

const char* ffn_profile_name(int slot) {
    static const char* const names[kFfnProfileSlots] = {
        "launches", "span_ns", "warps", "tail_max_at_ns", "tail_packed_at_ns", "out_tiles_at_ns", "norm_packed_at_ns",
        "gate_up_at_ns", "swiglu_packed_at_ns", "down_at_ns", "next_norm_at_ns", "next_proj_at_ns", "start_min_ns",
        "end_max_ns"};
    return slot >= 0 && slot < kFfnProfileSlots ? names[slot] : "?";
}

cudaError_t ffn_profile_reset(unsigned long long* profile, cudaStream_t stream) {
    if (cudaError_t e = cudaMemsetAsync(profile, 0, sizeof(unsigned long long) * kFfnProfileSlots, stream)) return e;
    return cudaMemsetAsync(profile + kProfStartMin, 0xff, sizeof(unsigned long long), stream);  // ~0: no start yet
}

int ffn_next_pack_row0(const FfnPersistentArgs& a) { return next_row0(a); }

int ffn_tail_pack_row0(const FfnPersistentArgs& a) { return a.out_w ? tail_row0(a.n_ff, a.k_out) : -1; }

bool ffn_persistent_takes(const FfnPersistentArgs& a) {
    bool next_ok = !a.next_w[0] || (a.next_norm != nullptr && a.x.rows >= next_row0(a) + kActRows);
    for (int m = 0; m < kFfnNextProjections && a.next_w[0]; ++m)
        next_ok = next_ok && (!a.next_w[m] || ((a.next_type[m] == kQ4_K || a.next_type[m] == kQ6_K) &&
                                               a.next_n[m] > 0 && a.next_n[m] % kHalfRows == 0 && a.next_y[m] &&
                                               (m == 0 || a.next_w[m - 1])));
    return a.gu_type == kQ4_K && (a.down_type == kQ4_K || a.down_type == kQ6_K) && a.t >= 1 && a.t <= kActRows &&
           a.x.rows >= 2 * kActRows && a.n_embd % kGemvUnit == 0 && a.n_ff % kGemvUnit == 0 && a.n_ff >= a.n_embd &&
           (!a.out_w || ((a.out_type == kQ4_K || a.out_type == kQ5_K) && a.y_in && a.k_out >= kGemvUnit &&
                         a.k_out % kGemvUnit == 0 && a.x.rows >= tail_row0(a.n_ff, a.k_out) + kActRows)) &&
           next_ok;
}

bool ffn_tma_takes(const FfnPersistentArgs& a) {
    bool whole_tiles = true;  // (16-row tiles: a ring unit is a 16-row group's)
    for (int m = 0; m < kFfnNextProjections; ++m) whole_tiles = whole_tiles && a.next_n[m] % kMmaRows == 0;
    return a.tma && whole_tiles && a.tiled && ffn_persistent_takes(a) && gemv_tma_available();
}

cudaError_t launch_ffn_persistent(const FfnPersistentArgs& a, cudaStream_t stream) {
    if (!ffn_persistent_takes(a) || !a.h || !a.mix_in || !a.post_norm || !a.gate || !a.up || !a.down || !a.g_out ||
        !a.u_out || !a.mix_out || !a.counters)
        return cudaErrorInvalidValue;
    if (!act_pack_plain(a.x)) return cudaErrorNotSupported;  // (its packs have no integer twin)
    count_launch(Counted::kFfnPersistent);
    if (ffn_tma_takes(a)) {
        const cudaError_t e = a.down_type == kQ6_K ? launch_tma<kQ6_K>(a, stream) : launch_tma<kQ4_K>(a, stream);
        if (e != cudaErrorNotSupported) return e;  // (nothing launched: the team kernel, the same bits)
    }
    return a.down_type == kQ6_K ? launch_types<kQ4_K, kQ6_K>(a, stream) : launch_types<kQ4_K, kQ4_K>(a, stream);
}

}  // namespace openjet
