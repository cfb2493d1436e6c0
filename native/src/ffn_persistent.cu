// launch_ffn_persistent (ffn_persistent.cuh): the default's bits but slower on the H200 at 83ed0d8 (T=1 13.2 against
// 10.4 ms a step; docs/MEGAKERNEL.md says what to profile).
//
// Block = kTeams teams of 4 warps; a team does what one decode GEMV block does (a 16-row tile, warp i over k
// quarter i, its warp 0 adding the quarters in order), synced by a named barrier of its own. Phases:
//   1. blocks 0..t-1: row b's add-norm pack (h += mix_in; rms; the pack's rows 0..t-1)      -> counters[0] += 1
//   2. every team: gate tiles, then up tiles, grid-strided; each waits (after its first weight copies) until
//      counters[0] == t                                                                       -> counters[1] += tiles
//   3. blocks 0..t-1: wait for all gate/up tiles; row b's swiglu pack (into the pack's rows kActRows.., which no
//      block read in this launch: the activations are read through the non-coherent path)    -> counters[2] += 1
//   4. every team: down tiles, waiting (after their first weight copies) until counters[2] == t.
// Cooperative launch: every block is resident, so the spinning cannot deadlock; counters are released with a
// fence after each writer's stores and acquired by one lane per warp. The same device functions as the separate
// launches (add_norm_pack_row, gemv_tile_warp + tile_sum_store, swiglu_pack_row), so the same bits.
#include <algorithm>

#include "device_attr.cuh"
#include "elementwise.cuh"
#include "ffn_persistent.cuh"
#include "gemv_mma.cuh"
#include "launch_count.h"

namespace openjet {
namespace {

__device__ __forceinline__ int load_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Every thread's stores so far are published with counter += add (one thread adds, after the block's barrier).
__device__ __forceinline__ void block_release(int* counter, int add) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0 && add) atomicAdd(counter, add);
}

// gemv_tile_warp's wait: lane 0 of each warp spins until the counter reaches `target`, then the warp goes on.
struct CounterWait {
    const int* counter;
    int target;
    __device__ __forceinline__ void operator()() const {
        if ((threadIdx.x & 31) == 0)
            while (load_acquire(counter) < target) __nanosleep(32);
        __syncwarp();
    }
};

// Tiles team `team_id` of `n_teams` takes of `tiles`, grid-strided.
__host__ __device__ inline int team_tiles(int team_id, int n_teams, int tiles) {
    return team_id < tiles ? (tiles - team_id + n_teams - 1) / n_teams : 0;
}

template <int QG, int QD> __host__ __device__ constexpr int warp_words() {
    return MmaShape<QG>::kWarpWords > MmaShape<QD>::kWarpWords ? MmaShape<QG>::kWarpWords : MmaShape<QD>::kWarpWords;
}

// Dynamic shared memory: the teams' cp.async stages, or add_norm_pack_row's staged row and weights.
template <int QG, int QD, int kTeams> size_t smem_bytes(int n_embd) {
    return std::max<size_t>(sizeof(uint4) * kTeams * kGemvWarps * warp_words<QG, QD>(), sizeof(float) * 2 * n_embd);
}

// Values a thread of the packs keeps in registers: few, so that the packs fit the GEMV phases' registers (the
// 17,408-element swiglu row computes its values twice; the same bits).
constexpr int kPackCachedHere = 10;

template <int QG, int QD, int kTeams>
__global__ void __launch_bounds__(kTeams * kGemvWarps * 32, 1) ffn_persistent_kernel(const FfnPersistentArgs a) {
    constexpr int kThreads = kTeams * kGemvWarps * 32;
    extern __shared__ uint4 smem[];
    __shared__ float part[kTeams][kGemvWarps][1][32][4];
    const int team = threadIdx.x / (kGemvWarps * 32), warp = (threadIdx.x >> 5) % kGemvWarps, lane = threadIdx.x & 31;
    const int team_id = blockIdx.x * kTeams + team, n_teams = gridDim.x * kTeams;
    uint4* team_smem = smem + team * kGemvWarps * warp_words<QG, QD>();
    int* ctr = a.counters;
    const ActPack xs = a.x.from_row(kActRows, a.n_ff);  // the swiglu rows

    // A team's tile: rows row0.. of w (n rows, k columns) into y, its input pack xin ready when `ready` holds.
    const auto tile = [&](auto qt, const void* w, int n, int k, int row0, const ActPack& xin, float* y,
                          CounterWait ready) {
        constexpr int QT = decltype(qt)::value;
        const int nu = k / kUnitElems;
        float acc[1][4] = {};
        gemv_tile_warp<QT, 1>(static_cast<const uint8_t*>(w), row_bytes_of<QT>(k), n, row0, nu * warp / kGemvWarps,
                              nu * (warp + 1) / kGemvWarps, xin, k, a.t, 0,
                              team_smem + warp * MmaShape<QT>::kWarpWords, acc, ready, a.tiled);
#pragma unroll
        for (int c = 0; c < 4; ++c) part[team][warp][0][lane][c] = acc[0][c];
        asm volatile("bar.sync %0, %1;" ::"r"(1 + team), "r"(kGemvWarps * 32) : "memory");
        if (warp == 0) tile_sum_store<1, kMmaRows>(part[team], lane, row0, 0, n, a.t, xin.inv, y);
        asm volatile("bar.sync %0, %1;" ::"r"(1 + team), "r"(kGemvWarps * 32) : "memory");  // part is free again
    };

    // 1. the post-attention add-norm pack
    if (blockIdx.x < a.t) {
        float* staged = reinterpret_cast<float*>(smem);  // the teams' stages are not in use yet
        if (a.n_embd <= kAddNormStagedMax)
            add_norm_pack_row<true, kThreads, kPackCachedHere>(a.h, a.mix_in, a.post_norm, a.n_embd, a.eps, nullptr,
                                                               a.x, blockIdx.x, staged);
        else
            add_norm_pack_row<false, kThreads, kPackCachedHere>(a.h, a.mix_in, a.post_norm, a.n_embd, a.eps, nullptr,
                                                                a.x, blockIdx.x, staged);
        block_release(&ctr[0], 1);
    }

    // 2. gate, then up
    const int g_tiles = (a.n_ff + kMmaRows - 1) / kMmaRows;
    for (int i = team_id; i < 2 * g_tiles; i += n_teams) {
        const bool up = i >= g_tiles;
        tile(std::integral_constant<int, QG>{}, up ? a.up : a.gate, a.n_ff, a.n_embd,
             (up ? i - g_tiles : i) * kMmaRows, a.x, up ? a.u_out : a.g_out, CounterWait{&ctr[0], a.t});
    }
    int mine = 0;
    for (int tm = 0; tm < kTeams; ++tm) mine += team_tiles(blockIdx.x * kTeams + tm, n_teams, 2 * g_tiles);
    block_release(&ctr[1], mine);

    // 3. the swiglu pack
    if (blockIdx.x < a.t) {
        if (threadIdx.x == 0)
            while (load_acquire(&ctr[1]) < 2 * g_tiles) __nanosleep(32);
        __syncthreads();
        swiglu_pack_row<kThreads, kPackCachedHere>(a.g_out, a.u_out, a.n_ff, xs, blockIdx.x);
        block_release(&ctr[2], 1);
    }

    // 4. down
    const int d_tiles = (a.n_embd + kMmaRows - 1) / kMmaRows;
    for (int i = team_id; i < d_tiles; i += n_teams)
        tile(std::integral_constant<int, QD>{}, a.down, a.n_embd, a.n_ff, i * kMmaRows, xs, a.mix_out,
             CounterWait{&ctr[2], a.t});
}

// Blocks of the kernel resident per SM with `smem` bytes of dynamic shared memory, asked once per (kernel, size):
// the attribute and occupancy calls cost the host microseconds each, and this runs once per layer of a decode step
// (64 times a step at 27B; the first GPU run, 83ed0d8, asked them on every launch).
template <int QG, int QD, int kTeams> cudaError_t resident_blocks(size_t smem, int* per_sm) {
    auto kernel = ffn_persistent_kernel<QG, QD, kTeams>;
    constexpr int threads = kTeams * kGemvWarps * 32;
    static size_t cached_smem = 0;  // one pair per instantiation, i.e. per kernel
    static int cached = 0;
    if (cached_smem != smem) {
        if (cudaError_t e =
                cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)))
            return e;
        if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&cached, kernel, threads, smem)) return e;
        cached_smem = smem;
    }
    *per_sm = cached;
    return cudaSuccess;
}

template <int QG, int QD, int kTeams>
cudaError_t launch_teams(const FfnPersistentArgs& a, cudaStream_t stream) {
    auto kernel = ffn_persistent_kernel<QG, QD, kTeams>;
    const size_t smem = smem_bytes<QG, QD, kTeams>(a.n_embd);
    int sms = 0, per_sm = 0;
    if (cudaError_t e = device_attribute(cudaDevAttrMultiProcessorCount, &sms)) return e;
    if (cudaError_t e = resident_blocks<QG, QD, kTeams>(smem, &per_sm)) return e;
    if (per_sm < 1) return cudaErrorNotSupported;
    const int tiles = std::max(2 * ((a.n_ff + kMmaRows - 1) / kMmaRows), (a.n_embd + kMmaRows - 1) / kMmaRows);
    const int blocks = std::max(a.t, std::min(sms * per_sm, (tiles + kTeams - 1) / kTeams));
    if (blocks > sms * per_sm) return cudaErrorNotSupported;  // every block must be resident
    if (cudaError_t e = cudaMemsetAsync(a.counters, 0, sizeof(int) * kFfnCounters, stream)) return e;
    FfnPersistentArgs args = a;
    void* params[] = {&args};
    return cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(blocks),
                                       dim3(kTeams * kGemvWarps * 32), params, smem, stream);
}

// Four teams where shared memory holds them (sm_90: 110-172 KB), else two (the 100 KB SMs of sm_86/89/120).
template <int QG, int QD> cudaError_t launch_types(const FfnPersistentArgs& a, cudaStream_t stream) {
    int optin = 0;
    static cudaFuncAttributes attr{};  // the 4-team kernel's static shared memory, asked once
    static const cudaError_t asked = cudaFuncGetAttributes(&attr, ffn_persistent_kernel<QG, QD, 4>);
    if (asked != cudaSuccess) return asked;
    if (cudaError_t e = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, &optin)) return e;
    if (attr.sharedSizeBytes + smem_bytes<QG, QD, 4>(a.n_embd) <= static_cast<size_t>(optin))
        return launch_teams<QG, QD, 4>(a, stream);
    return launch_teams<QG, QD, 2>(a, stream);
}

}  // namespace

bool ffn_persistent_takes(const FfnPersistentArgs& a) {
    return a.gu_type == kQ4_K && (a.down_type == kQ4_K || a.down_type == kQ6_K) && a.t >= 1 && a.t <= kActRows &&
           a.x.rows >= 2 * kActRows && a.n_embd % kGemvUnit == 0 && a.n_ff % kGemvUnit == 0 && a.n_ff >= a.n_embd;
}

cudaError_t launch_ffn_persistent(const FfnPersistentArgs& a, cudaStream_t stream) {
    if (!ffn_persistent_takes(a) || !a.h || !a.mix_in || !a.post_norm || !a.gate || !a.up || !a.down || !a.g_out ||
        !a.u_out || !a.mix_out || !a.counters)
        return cudaErrorInvalidValue;
    count_launch(Counted::kFfnPersistent);
    return a.down_type == kQ6_K ? launch_types<kQ4_K, kQ6_K>(a, stream) : launch_types<kQ4_K, kQ4_K>(a, stream);
}

}  // namespace openjet
