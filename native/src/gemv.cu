// launch_gemv: the dispatcher of the decode GEMV family (the k-quant tensor-core kernels are in
// gemv_mma_<type>.cu) and the F32 small projection (ssm_alpha / ssm_beta, [48, 5120]).
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "env_setting.h"
#include "gemv.cuh"
#include "gemv_imma.cuh"
#include "gemv_mma.cuh"
#include "gemv_tma.cuh"  // gemv_tma_available: the integer GEMV's producer-warp form
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

// Every full group of 8 rows of a in one launch of gemv_f32_rows_kernel (before: one launch of 48 blocks per group,
// 104 us for a 128-row chunk on the H200), then the rest.
cudaError_t launch_gemv_f32_rows_of(const GemvArgs& a, cudaStream_t stream) {
    const int full = a.t / kActRows, rest = a.t % kActRows;
    if (full > 65535) return cudaErrorInvalidValue;  // gridDim.y
    if (full > 0) {
        const cudaError_t e = launch_kernel(gemv_f32_rows_kernel, dim3((a.n + kF32Rows - 1) / kF32Rows, full), 128, 0,
                                           stream, static_cast<const float*>(a.w), a.xf, a.n, a.k, a.y);
        if (e != cudaSuccess || rest == 0) return e;
    }
    GemvArgs part = a;
    part.t = rest;
    part.xf = a.xf + static_cast<long long>(full) * kActRows * a.k;
    part.y = a.y + static_cast<long long>(full) * kActRows * a.n;
    return launch_gemv_f32_rows(part, stream);
}

// a, and b where given (the same n, k, t and x: launch_gemv_pair). A prefill's rows take prefill_f32.cu's GEMM (both
// matrices in one launch) where prefill_f32_own(); every other call decode's bits.
cudaError_t launch_gemv_f32(const GemvArgs& a, const GemvArgs* b, cudaStream_t stream) {
    for (const GemvArgs* g : {&a, b})
        if (g && (g->k % 4 || !g->xf || (reinterpret_cast<uintptr_t>(g->w) | reinterpret_cast<uintptr_t>(g->xf)) & 15))
            return cudaErrorInvalidValue;
    if ((a.prefill || a.t > kActRows) && prefill_f32_own() && prefill_f32_takes(a) && (!b || prefill_f32_takes(*b)))
        return launch_prefill_f32(a, b, stream);
    const cudaError_t e = launch_gemv_f32_rows_of(a, stream);
    return e != cudaSuccess || !b ? e : launch_gemv_f32_rows_of(*b, stream);
}

// OPENJET_GEMV_HALF, read at the first decode call (a decode launch reads no environment after that) and set by
// tests and benchmarks (set_gemv_half_tiles).
int half_tiles_from_env() {
    const char* e = std::getenv("OPENJET_GEMV_HALF");
    return static_cast<int>(e && std::strcmp(e, "1") == 0   ? GemvHalfTiles::kAlways
                            : e && std::strcmp(e, "0") == 0 ? GemvHalfTiles::kNever
                                                            : GemvHalfTiles::kAuto);
}
EnvSetting g_half_tiles{half_tiles_from_env};

}  // namespace

GemvHalfTiles gemv_half_tiles() { return static_cast<GemvHalfTiles>(g_half_tiles.get()); }
void set_gemv_half_tiles(int mode) { g_half_tiles.set(mode, 2); }

bool prefill_gemm_dense() { return prefill_gemm_choice() == PrefillGemm::kDense; }

bool prefill_numerics_own() { return prefill_choice_own(prefill_gemm_choice()); }

bool prefill_gemm_adds(const GemvArgs& a) {
    if (!prefill_dense_runs(a)) return false;
    const char* v = std::getenv("OPENJET_PREFILL_RESIDUAL");
    return !(v && std::strcmp(v, "0") == 0);
}

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
    if (a.add_to_y && !prefill_gemm_adds(a)) return cudaErrorInvalidValue;  // only the dense GEMM adds
    if (a.qtype == kF32) return cudaSuccess;
    if (!act_pack_fits(a.x, a.t, a.k) || (reinterpret_cast<uintptr_t>(a.w) | reinterpret_cast<uintptr_t>(a.x.h) |
                                          reinterpret_cast<uintptr_t>(a.x.sum)) & 15)
        return cudaErrorInvalidValue;
    return cudaSuccess;
}

// Whether a call runs on the integer GEMV: on its own pack made from the fp16 one (GemvArgs::xi), or on the integer
// twin the pack's maker wrote (ActPack::imma).
static bool takes_imma(const GemvArgs& a) {
    return (a.xi || a.x.imma) && !a.prefill && gemv_imma_supports(a.qtype) && a.t <= kImmaMaxT && a.t <= a.x.rows;
}

// The integer GEMV of a call that takes it. On the maker's twin: the producer-warp form where it runs (the engine's
// GEMV), else the cp.async form below. On GemvArgs::xi (pack: make that pack from a.x first; a pair's second call
// reads the first's): a persistent grid at 3 cp.async stages, the fastest form of the decode mix on the H200 at T = 1
// and 4 (bench_gemv_imma.py --tiled, NOTES_gemv.md 2026-12-03), and in the 27B's step faster than a block per tile
// (T=1 9.39 against 9.57 ms under OPENJET_GEMV_INT=1, c033274).
static cudaError_t launch_imma(const GemvArgs& a, bool pack, cudaStream_t stream) {
    count_launch(Counted::kGemvInt);
    if (a.x.imma) {
        const ActPackI p = act_pack_imma_of(a.x, a.k);
        if (a.tiled && a.n % kMmaRows == 0 && gemv_tma_available())
            return launch_gemv_tma_imma(a.qtype, a.w, a.n, a.k, p, a.t, a.y, stream);
        return launch_gemv_imma(a.qtype, a.w, a.n, a.k, p, a.t, a.y, stream, 3, true, a.tiled);
    }
    const ActPackI p = act_pack_imma_view(a.xi, kImmaMaxT, a.k);
    if (pack)
        if (const cudaError_t e = launch_pack_act_imma_from_half(a.x, a.t, a.k, p, stream)) return e;
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
        for (const GemvArgs* g : {&a, &b})  // the same x: launch_gemv_f32 takes both (one launch where it can)
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
