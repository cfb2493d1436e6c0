// launch_gemv: the dispatcher of the decode GEMV family (the k-quant tensor-core kernels are in
// gemv_mma_<type>.cu) and the F32 small projection (ssm_alpha / ssm_beta, [48, 5120]).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "gemv.cuh"
#include "gemv_imma.cuh"
#include "gemv_mma.cuh"
#include "launch_count.h"
#include "pdl.cuh"

namespace openjet {
namespace {

// y[t, n] = W[n, :] . x[t, :] for F32 W: one block per row and group of T token rows (blockIdx.y: prefill
// takes every full group of 8 in one launch), 128 threads, float4 loads, fixed-order sums (f32_dot_lanes,
// gemv.cuh): a row's bits do not depend on T or on the group.
template <int T>
__global__ void __launch_bounds__(128) gemv_f32_kernel(const float* __restrict__ w, const float* __restrict__ x,
                                                       int n, int k, float* __restrict__ y) {
    __shared__ float part[4][T];
    pdl_start();  // pdl.cuh
    const int row = blockIdx.x;
    x += static_cast<long long>(blockIdx.y) * T * k;
    y += static_cast<long long>(blockIdx.y) * T * n;
    float acc[T];
    f32_dot_lanes<T>(w + static_cast<long long>(row) * k, x, k, threadIdx.x, acc);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int t = 0; t < T; ++t) {
        const float v = f32_warp_sum(acc[t]);
        if (lane == 0) part[warp][t] = v;
    }
    __syncthreads();
    if (threadIdx.x < T) {
        const int t = threadIdx.x;
        y[(long long)t * n + row] = f32_warps_total(part[0][t], part[1][t], part[2][t], part[3][t]);
    }
}

// Prefill's full groups of 8 token rows: one block per group of kF32Rows weight rows and group of 8 token rows,
// each x chunk loaded once for the kF32Rows rows (the one-row blocks above read every token row from L2 once per
// weight row: ~550 MB of L2 reads for the 27B's [48, 5120] at 512 rows, ~70 us). Each (row, token) dot is
// f32_dot_lanes' chain over the same lanes' float4 chunks in the same order, summed as gemv_f32_kernel sums:
// the same bits.
constexpr int kF32Rows = 8;
__global__ void __launch_bounds__(128) gemv_f32_rows_kernel(const float* __restrict__ w, const float* __restrict__ x,
                                                            int n, int k, float* __restrict__ y) {
    constexpr int T = kActRows, RB = kF32Rows;
    __shared__ float part[4][RB][T];
    pdl_start();  // pdl.cuh
    const int r0 = blockIdx.x * RB, rows = min(RB, n - r0);
    x += static_cast<long long>(blockIdx.y) * T * k;
    y += static_cast<long long>(blockIdx.y) * T * n;
    float acc[RB][T];
#pragma unroll
    for (int r = 0; r < RB; ++r)
#pragma unroll
        for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;
#pragma unroll 1
    for (int j = threadIdx.x; j < k / 4; j += 128) {
        float4 b[T];
#pragma unroll
        for (int t = 0; t < T; ++t)
            b[t] = __ldg(reinterpret_cast<const float4*>(x + static_cast<long long>(t) * k) + j);
#pragma unroll
        for (int r = 0; r < RB; ++r) {
            if (r >= rows) break;  // the same for the whole block
            const float4 a = reinterpret_cast<const float4*>(w + static_cast<long long>(r0 + r) * k)[j];
#pragma unroll
            for (int t = 0; t < T; ++t) acc[r][t] = f32_fma4(a, b[t], acc[r][t]);
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < RB; ++r)
#pragma unroll
        for (int t = 0; t < T; ++t) {
            const float v = f32_warp_sum(acc[r][t]);
            if (lane == 0) part[warp][r][t] = v;
        }
    __syncthreads();
    if (threadIdx.x < RB * T) {
        const int r = threadIdx.x / T, t = threadIdx.x % T;
        if (r < rows)
            y[(long long)t * n + r0 + r] = f32_warps_total(part[0][r][t], part[1][r][t], part[2][r][t], part[3][r][t]);
    }
}

// Prefill's F32 projections in tiles of 16 weight rows x 16 token rows: four 128-thread groups, each the 8 x 8 of
// gemv_f32_rows_kernel (the same chains and sums: the same bits), the two groups of a row half reading the same
// weight chunks and the two of a token half the same x chunks at about the same time, so that L1 serves half of
// the loads (the rows kernel takes every chunk from L2 once per 8 x 8: ~1 GB of L2 reads a call for the 27B's
// [48, 5120] at 4,096 rows, 133 us on the H200, L2-bound). Where two matrices of the same shape read the same x
// (a GDN layer's beta and alpha), one launch takes both: blockIdx.x past w0's row blocks is w1's.
constexpr int kF32TileRows = 2 * kF32Rows, kF32TileTokens = 2 * kActRows;
__global__ void __launch_bounds__(512) gemv_f32_tile_kernel(const float* __restrict__ w0, float* __restrict__ y0,
                                                            const float* __restrict__ w1, float* __restrict__ y1,
                                                            int n, int k, const float* __restrict__ x) {
    constexpr int T = kActRows, RB = kF32Rows;
    __shared__ float part[4][4][RB][T];  // [group][warp][row][token]
    pdl_start();  // pdl.cuh
    const int blocks_per_w = (n + kF32TileRows - 1) / kF32TileRows;
    const bool second = blockIdx.x >= blocks_per_w;
    const float* w = second ? w1 : w0;
    float* y = second ? y1 : y0;
    const int group = threadIdx.x >> 7, i = threadIdx.x & 127;
    const int r0 = (blockIdx.x - (second ? blocks_per_w : 0)) * kF32TileRows + (group & 1) * RB;
    const int rows = max(0, min(RB, n - r0));
    const long long t0 = static_cast<long long>(blockIdx.y) * kF32TileTokens + (group >> 1) * T;
    x += t0 * k;
    y += t0 * n;
    float acc[RB][T];
#pragma unroll
    for (int r = 0; r < RB; ++r)
#pragma unroll
        for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;
#pragma unroll 1
    for (int j = i; j < k / 4; j += 128) {
        float4 b[T];
#pragma unroll
        for (int t = 0; t < T; ++t)
            b[t] = __ldg(reinterpret_cast<const float4*>(x + static_cast<long long>(t) * k) + j);
#pragma unroll
        for (int r = 0; r < RB; ++r) {
            if (r >= rows) break;  // the same for the whole group
            const float4 a = __ldg(reinterpret_cast<const float4*>(w + static_cast<long long>(r0 + r) * k) + j);
#pragma unroll
            for (int t = 0; t < T; ++t) acc[r][t] = f32_fma4(a, b[t], acc[r][t]);
        }
    }
    const int lane = threadIdx.x & 31, warp = i >> 5;
#pragma unroll
    for (int r = 0; r < RB; ++r)
#pragma unroll
        for (int t = 0; t < T; ++t) {
            const float v = f32_warp_sum(acc[r][t]);
            if (lane == 0) part[group][warp][r][t] = v;
        }
    __syncthreads();
    if (i < RB * T) {
        const int r = i / T, t = i % T;
        const float* p = &part[group][0][r][t];
        constexpr int kWarpStride = RB * T;
        if (r < rows)
            y[(long long)t * n + r0 + r] = f32_warps_total(p[0], p[kWarpStride], p[2 * kWarpStride], p[3 * kWarpStride]);
    }
}

template <int T>
cudaError_t launch_gemv_f32_t(const GemvArgs& a, cudaStream_t stream, int groups = 1) {
    return launch_kernel(gemv_f32_kernel<T>, dim3(a.n, groups), 128, 0, stream, static_cast<const float*>(a.w), a.xf,
                         a.n, a.k, a.y);
}

cudaError_t launch_gemv_f32_rows(const GemvArgs& a, cudaStream_t stream) {
    switch (a.t) {
        case 1: return launch_gemv_f32_t<1>(a, stream);
        case 2: return launch_gemv_f32_t<2>(a, stream);
        case 3: return launch_gemv_f32_t<3>(a, stream);
        case 4: return launch_gemv_f32_t<4>(a, stream);
        case 5: return launch_gemv_f32_t<5>(a, stream);
        case 6: return launch_gemv_f32_t<6>(a, stream);
        case 7: return launch_gemv_f32_t<7>(a, stream);
        case 8: return launch_gemv_f32_t<8>(a, stream);
        default: return cudaErrorInvalidValue;
    }
}

// Token rows from..t of a: every full group of 8 in one launch of gemv_f32_rows_kernel (before: one launch of 48
// blocks per group, 104 us for a 128-row chunk on the H200), then the rest.
cudaError_t launch_gemv_f32_rest(const GemvArgs& a, int from, cudaStream_t stream) {
    GemvArgs part = a;
    part.t = a.t - from;
    part.xf = a.xf + static_cast<long long>(from) * a.k;
    part.y = a.y + static_cast<long long>(from) * a.n;
    const int full = part.t / kActRows, rest = part.t % kActRows;
    if (full > 65535) return cudaErrorInvalidValue;  // gridDim.y
    if (full > 0) {
        const cudaError_t e = launch_kernel(gemv_f32_rows_kernel, dim3((a.n + kF32Rows - 1) / kF32Rows, full), 128, 0,
                                           stream, static_cast<const float*>(a.w), part.xf, a.n, a.k, part.y);
        if (e != cudaSuccess || rest == 0) return e;
    }
    part.t = rest;  // > 0: from < a.t
    part.xf += static_cast<long long>(full) * kActRows * a.k;
    part.y += static_cast<long long>(full) * kActRows * a.n;
    return launch_gemv_f32_rows(part, stream);
}

bool f32_args_ok(const GemvArgs& a) {
    return a.k % 4 == 0 && a.xf && !((reinterpret_cast<uintptr_t>(a.w) | reinterpret_cast<uintptr_t>(a.xf)) & 15);
}

// a, and b where given (the same n, k, t and x: launch_gemv_pair), over all their token rows: the full tiles of 16
// in one launch of gemv_f32_tile_kernel for both, then launch_gemv_f32_rest for each. Every row has the bits a
// decode call gives it, whichever kernel takes it.
cudaError_t launch_gemv_f32(const GemvArgs& a, const GemvArgs* b, cudaStream_t stream) {
    if (!f32_args_ok(a) || (b && !f32_args_ok(*b))) return cudaErrorInvalidValue;
    const int tiles = a.t / kF32TileTokens;
    if (tiles > 65535) return cudaErrorInvalidValue;  // gridDim.y
    if (tiles > 0) {
        const int blocks = (a.n + kF32TileRows - 1) / kF32TileRows * (b ? 2 : 1);
        const cudaError_t e = launch_kernel(gemv_f32_tile_kernel, dim3(blocks, tiles), 512, 0, stream,
                                            static_cast<const float*>(a.w), a.y,
                                            b ? static_cast<const float*>(b->w) : nullptr, b ? b->y : nullptr, a.n,
                                            a.k, a.xf);
        if (e != cudaSuccess) return e;
    }
    const int from = tiles * kF32TileTokens;
    if (from == a.t) return cudaSuccess;
    const cudaError_t e = launch_gemv_f32_rest(a, from, stream);
    return e != cudaSuccess || !b ? e : launch_gemv_f32_rest(*b, from, stream);
}

// OPENJET_GEMV_HALF, read at the first decode call (a decode launch reads no environment after that) and set by
// tests and benchmarks: a GemvHalfTiles value, or kFromEnv (read the environment again at the next call).
constexpr int kFromEnv = -1;
std::atomic<int> g_half_tiles{kFromEnv};

int half_tiles_from_env() {
    const char* e = std::getenv("OPENJET_GEMV_HALF");
    return static_cast<int>(e && std::strcmp(e, "1") == 0   ? GemvHalfTiles::kAlways
                            : e && std::strcmp(e, "0") == 0 ? GemvHalfTiles::kNever
                                                            : GemvHalfTiles::kAuto);
}

}  // namespace

GemvHalfTiles gemv_half_tiles() {
    int v = g_half_tiles.load(std::memory_order_relaxed);
    if (v == kFromEnv) {
        g_half_tiles.compare_exchange_strong(v, half_tiles_from_env());
        v = g_half_tiles.load(std::memory_order_relaxed);
    }
    return static_cast<GemvHalfTiles>(v);
}
void set_gemv_half_tiles(int mode) { g_half_tiles.store(mode >= 0 && mode <= 2 ? mode : kFromEnv); }

bool prefill_gemm_dense() { return prefill_gemm_choice() == PrefillGemm::kDense; }

bool prefill_numerics_own() { return prefill_choice_own(prefill_gemm_choice()); }

// The 16-row shape (decode may run 8-row tiles of the same bits: gemv_half_tiles).
cudaError_t gemv_launch_shape(int qtype, int n, int k, int* rows_per_block, int* warps_per_block, int* blocks) {
    if (n <= 0 || k <= 0) return cudaErrorInvalidValue;
    if (qtype == kF32) {
        if (k % 4) return cudaErrorInvalidValue;
        *rows_per_block = 1;
        *warps_per_block = 4;
        *blocks = n;
        return cudaSuccess;
    }
    if (block_elems(qtype) == 0 || k % kUnitElems) return cudaErrorInvalidValue;
    *rows_per_block = kMmaRows;
    *warps_per_block = kGemvWarps;
    *blocks = (n + kMmaRows - 1) / kMmaRows;
    return cudaSuccess;
}

// The arguments' checks (launch_gemv_f32 checks F32's own).
static cudaError_t check_gemv(const GemvArgs& a) {
    int r = 0, wpb = 0, blocks = 0;
    const cudaError_t e = gemv_launch_shape(a.qtype, a.n, a.k, &r, &wpb, &blocks);
    if (e != cudaSuccess) return e;
    if (!a.w || !a.y || a.t < 1 || a.t > kGemvMaxT) return cudaErrorInvalidValue;
    if (a.tiled && !tile_layout_fits(a.qtype, a.n, a.k)) return cudaErrorInvalidValue;  // F32 included
    if (a.qtype == kF32) return cudaSuccess;
    if (!act_pack_fits(a.x, a.t, a.k) || (reinterpret_cast<uintptr_t>(a.w) | reinterpret_cast<uintptr_t>(a.x.h) |
                                          reinterpret_cast<uintptr_t>(a.x.sum)) & 15)
        return cudaErrorInvalidValue;
    return cudaSuccess;
}

// Whether a call runs on the integer GEMV (GemvArgs::xi).
static bool takes_imma(const GemvArgs& a) {
    return a.xi && !a.prefill && gemv_imma_supports(a.qtype) && a.t <= kImmaMaxT && a.t <= a.x.rows;
}

// The integer GEMV of a call that takes it; pack: make its pack from a.x first (a pair's second call reads the
// first's). A persistent grid at 3 cp.async stages: the fastest form of the decode mix on the H200 at T = 1 and 4
// (bench_gemv_imma.py --tiled, NOTES_gemv.md 2026-12-03), and in the 27B's step faster than a block per tile
// (T=1 9.39 against 9.57 ms under OPENJET_GEMV_INT=1, c033274).
static cudaError_t launch_imma(const GemvArgs& a, bool pack, cudaStream_t stream) {
    const ActPackI p = act_pack_imma_view(a.xi, kImmaMaxT, a.k);
    if (pack)
        if (const cudaError_t e = launch_pack_act_imma_from_half(a.x, a.t, a.k, p, stream)) return e;
    count_launch(Counted::kGemvInt);
    return launch_gemv_imma(a.qtype, a.w, a.n, a.k, p, a.t, a.y, stream, 3, true, a.tiled);
}

cudaError_t launch_gemv_pair(const GemvArgs& a, const GemvArgs& b, cudaStream_t stream) {
    static const bool pairs = [] {
        const char* v = std::getenv("OPENJET_GEMV_PAIRS");
        return !(v && std::strcmp(v, "0") == 0);
    }();
    const bool same_x = a.k == b.k && a.t == b.t && a.x.h == b.x.h && a.x.sum == b.x.sum && a.x.inv == b.x.inv;
    const bool shared = pairs && same_x && a.qtype == b.qtype && a.qtype != kF32 && a.tiled == b.tiled &&
                        a.t <= kActRows &&
                        !(a.prefill && fast_prefill_call(a, prefill_gemm_choice()));  // each its own GEMM
    if (a.qtype == kF32 && b.qtype == kF32 && a.xf == b.xf && a.n == b.n && a.k == b.k && a.t == b.t) {
        for (const GemvArgs* g : {&a, &b})  // the same x: one launch for both's full tiles
            if (const cudaError_t e = check_gemv(*g)) return e;
        return launch_gemv_f32(a, &b, stream);
    }
    if (same_x && a.xi == b.xi && takes_imma(a) && takes_imma(b)) {  // one integer pack for both
        for (const GemvArgs* g : {&a, &b})
            if (const cudaError_t e = check_gemv(*g)) return e;
        const cudaError_t e = launch_imma(a, true, stream);
        return e != cudaSuccess ? e : launch_imma(b, false, stream);
    }
    if (!shared || takes_imma(a) || takes_imma(b)) {
        const cudaError_t e = launch_gemv(a, stream);
        return e != cudaSuccess ? e : launch_gemv(b, stream);
    }
    for (const GemvArgs* g : {&a, &b}) {
        const cudaError_t e = check_gemv(*g);
        if (e != cudaSuccess) return e;
    }
    switch (a.qtype) {
        case kQ4_K: return launch_gemv_mma_pair<kQ4_K>(a, b, stream);
        case kQ5_K: return launch_gemv_mma_pair<kQ5_K>(a, b, stream);
        case kQ6_K: return launch_gemv_mma_pair<kQ6_K>(a, b, stream);
        case kQ8_0: return launch_gemv_mma_pair<kQ8_0>(a, b, stream);
        default: return cudaErrorInvalidValue;
    }
}

cudaError_t launch_gemv(const GemvArgs& a, cudaStream_t stream) {
    const cudaError_t e = check_gemv(a);
    if (e != cudaSuccess) return e;
    if (a.qtype == kF32) return launch_gemv_f32(a, nullptr, stream);
    if (takes_imma(a)) return launch_imma(a, true, stream);
    switch (a.qtype) {
        case kQ4_K: return launch_gemv_mma<kQ4_K>(a, stream);
        case kQ5_K: return launch_gemv_mma<kQ5_K>(a, stream);
        case kQ6_K: return launch_gemv_mma<kQ6_K>(a, stream);
        case kQ8_0: return launch_gemv_mma<kQ8_0>(a, stream);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace openjet
