// A prefill's F32 projections (a GDN layer's ssm_beta and ssm_alpha, [48, 5120] at 27B) with numerics of their own,
// where the prefill has its own numerics (OPENJET_PREFILL_GEMM unset, fast or dense) and OPENJET_PREFILL_F32 (read at
// each call) is unset, tf32x3 (the default since 2026-12-04) or tf32x3-rna (split_operand); `rows`: decode's kernels
// and bits (gemv.cu), whose order (128 lanes' chains a row, summed by shuffles) must hold 128 partial sums for every
// (row, token) pair and so reads each weight chunk from L2 once per 8 tokens: 290 us for both matrices at 4,096 rows
// on the H200, ~14 ms of a 4,096-token prefill for the 48 layers, bound by those L2 reads.
//
// Here the products run on tensor cores in 3xTF32 (mma_tf32.cuh: each operand split into two tf32 parts), 32 tokens x
// 48 rows a block (16 rows where 48 would leave multiprocessors without a block or its shared memory does not fit:
// the same bits), 8 warps = 2 token halves x 4 k slices, k in 64-value chunks through a 4-stage cp.async ring. Each
// chunk's products go into a fresh fragment added to the slice's sum in fp32 (the mma's own accumulation truncates:
// all 5,120 k through one accumulator measured 4.5e-5 against float64), the slices summed in order: 3e-7 against
// float64, and a row's values depend on x's row and W's row only (the chunk sizes' invariance). Both matrices, H200
// (bench_prefill_f32.py, 2026-12-04, gemv-f32-prefill-h200-b620470.json): 8 to 512 rows 38 us (rows: 34-47), 2,048
// 79 (165), 4,096 121 (290); the 27B's gdn.in_proj at 4,096 tokens 64.2 -> 56.5 ms. With split_operand's cheaper
// split (95b8ed0): 2,048 rows 58.1 us, 4,096 94.7. (An fp32 FMA GEMM of 64 tokens x
// 48 rows a block, `simt` until 2026-12-04, was slower at every size: 135-167 us; removed.)
//
// OPENJET_PREFILL_GEMM=exact (or shared, grouped) keeps decode's bits whatever the form: gemv.cu's kernels.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cp_async.cuh"
#include "device_attr.cuh"
#include "gemv.cuh"
#include "mma_tf32.cuh"
#include "pdl.cuh"

namespace openjet {
namespace {

// A block: 32 tokens x kRows rows of one matrix, 8 warps = 2 token halves (one m16 tile each) x 4 k slices. k runs in
// 64-value chunks through a kStages-deep cp.async ring (a short call's few blocks must keep many loads in flight to
// stream their weights: ~0.5 MB a block at 16 rows); slice s takes k16 step s of every chunk.
constexpr int kTok = 32, kChunk = 64, kSlices = 4, kWarps = 2 * kSlices, kThreads = kWarps * 32, kStages = 4;
constexpr int kPitch = kChunk + 16;  // floats a staged row: a quarter warp's float4s (rows g, g + 1) on distinct banks
constexpr int kXLoads = kTok * kChunk / 4 / kThreads;
static_assert(kXLoads * kThreads * 4 == kTok * kChunk && 16 * kChunk / 4 % kThreads == 0, "whole loads");
static_assert(kChunk == 16 * kSlices, "a k16 step a slice");
// W rows a block: 48 (6 n8 tiles) where the call has enough token tiles to give every multiprocessor a block, else 16
// (three times the blocks for a short call). Each n8 tile's sums are its own, so the bits are the same either way.
constexpr int kRowsWide = 48, kRowsNarrow = 16;
template <int kRows>
constexpr int kStageFloats = (kTok + kRows) * kPitch;
template <int kRows>
constexpr size_t kSmemBytes = sizeof(float) * kStages * kStageFloats<kRows>;
static_assert(sizeof(float) * kSlices * kTok * (kRowsNarrow + 1) <= kSmemBytes<kRowsNarrow> &&
                  sizeof(float) * kSlices * kTok * (kRowsWide + 1) <= kSmemBytes<kRowsWide>,
              "the slices' sums fit where the chunks were staged");

// Chunk c of rows r0.. of m (k a row; rows from `valid` on: zeros), kLoads float4s a thread, into the stage dst.
template <int kLoads>
__device__ __forceinline__ void stage_rows(const float* __restrict__ m, int r0, int valid, int k, int c, float* dst) {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
        const int f = threadIdx.x + kThreads * i, row = f / (kChunk / 4), q = f % (kChunk / 4);
        float* d = dst + row * kPitch + 4 * q;
        if (r0 + row < valid)
            cp_async16(d, m + static_cast<long long>(r0 + row) * k + c * kChunk + 4 * q);
        else
            *reinterpret_cast<float4*>(d) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

// Chunk c of x's rows t0.. and W's rows r0.. (kRows of them) into a stage: x's 32 rows, then W's (past t or n: zeros).
template <int kRows>
__device__ __forceinline__ void stage_chunk(const float* __restrict__ x, const float* __restrict__ w, int t, int n,
                                            int k, int t0, int r0, int c, float* stage) {
    stage_rows<kXLoads>(x, t0, t, k, c, stage);
    stage_rows<kRows * kChunk / 4 / kThreads>(w, r0, n, k, c, stage + kTok * kPitch);
}

// x = big + small for the 3xTF32 products. kRoundSmall (OPENJET_PREFILL_F32=tf32x3-rna, the form before 2026-12-04):
// tf32_split, big and small each rounded by cvt.rna (7 instructions a value on sm_90: cvt.rna is a guard for Inf / NaN,
// a select and a mask). The default: big rounded by adding half a tf32 ulp to the bits and clearing the 13 below
// (round half away from zero, cvt.rna's value for every finite x), small the exact remainder handed to the mma as it
// is (the tensor core reads a tf32 operand's top 19 bits, so small is truncated: an error under 2^-21 |x| against
// 2^-22), 3 instructions; ncu at dc8e137: the loop is issue-bound (55% of issue slots, 464 instructions a warp and
// chunk, most of them these conversions). A NaN or Inf x may leave big wrong (Inf, or zero for an all-ones payload),
// but small = x - big is then NaN, so the product still is.
template <bool kRoundSmall>
__device__ __forceinline__ Tf32Pair split_operand(float x) {
    if constexpr (kRoundSmall) {
        return tf32_split(x);
    } else {
        const uint32_t big = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
        return {big, __float_as_uint(__fsub_rn(x, __uint_as_float(big)))};
    }
}

// Warp (half h, slice s): tokens t0 + 16 h .. + 15 (one m16 tile) x the block's kRows rows (kRows / 8 n8 tiles), over
// k16 step s of each chunk. A lane (g, tq) reads a float4 of k 4 tq .. 4 tq + 3 of each row it needs; mma k slots tq
// and tq + 4 take the first two of them, then the other two: A and B see the same slot-to-k map, so each product
// pairs x[t, k] with w[n, k] (a permutation of k inside a k16 step, the same for every row and call).
//
// The mma's own accumulation is not fp32's round-to-nearest (it truncates: measured 2026-12-04, 4.5e-5 relative
// error against float64 when all 5,120 k ran through one accumulator): each chunk's k16 step goes into a fresh
// fragment, added to the slice's sum with __fadd_rn. So y[t, n] = ((S0 + S1) + S2) + S3, S_s the slice's chunk
// partials summed in chunk order: it depends on x's row t and W's row n only.
template <int kRows, bool kRoundSmall>
__global__ void __launch_bounds__(kThreads)
    prefill_f32_tc_kernel(const float* __restrict__ w0, float* __restrict__ y0, const float* __restrict__ w1,
                          float* __restrict__ y1, int n, int k, int t, const float* __restrict__ x) {
    extern __shared__ __align__(16) float smem[];
    const float* w = blockIdx.z ? w1 : w0;
    float* y = blockIdx.z ? y1 : y0;
    const int r0 = blockIdx.x * kRows, t0 = blockIdx.y * kTok;
    constexpr int kTiles = kRows / 8;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
    const int half = warp & 1, slice = warp >> 1;
    float acc[kTiles][4];
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    pdl_start();  // x is the kernel before's output
    const int chunks = k / kChunk;
#pragma unroll
    for (int c = 0; c < kStages - 1; ++c) {
        if (c < chunks) stage_chunk<kRows>(x, w, t, n, k, t0, r0, c, smem + c * kStageFloats<kRows>);
        cp_async_commit();  // (empty groups past the last chunk: the waits below stay uniform)
    }
#pragma unroll 1
    for (int c = 0; c < chunks; ++c) {
        cp_async_wait<kStages - 2>();  // chunk c has landed (this thread's copies) ...
        __syncthreads();               // ... everyone's; and every warp is done with chunk c - 1's stage
        if (c + kStages - 1 < chunks)
            stage_chunk<kRows>(x, w, t, n, k, t0, r0, c + kStages - 1,
                               smem + (c + kStages - 1) % kStages * kStageFloats<kRows>);
        cp_async_commit();
        const float* stage = smem + c % kStages * kStageFloats<kRows>;
        const float* xa = stage + (16 * half + g) * kPitch + 16 * slice + 4 * tq;
        const float* wb = stage + (kTok + g) * kPitch + 16 * slice + 4 * tq;
        const float4 lo = *reinterpret_cast<const float4*>(xa);               // token row g
        const float4 hi = *reinterpret_cast<const float4*>(xa + 8 * kPitch);  // token row g + 8
        float4 bv[kTiles];
#pragma unroll
        for (int j = 0; j < kTiles; ++j) bv[j] = *reinterpret_cast<const float4*>(wb + 8 * j * kPitch);
        float part[kTiles][4] = {};
#pragma unroll
        for (int second = 0; second < 2; ++second) {
            const Tf32Pair a[4] = {
                split_operand<kRoundSmall>(second ? lo.z : lo.x), split_operand<kRoundSmall>(second ? hi.z : hi.x),
                split_operand<kRoundSmall>(second ? lo.w : lo.y), split_operand<kRoundSmall>(second ? hi.w : hi.y)};
#pragma unroll
            for (int j = 0; j < kTiles; ++j) {
                const Tf32Pair b[2] = {split_operand<kRoundSmall>(second ? bv[j].z : bv[j].x),
                                       split_operand<kRoundSmall>(second ? bv[j].w : bv[j].y)};
                mma_1688_3xtf32(part[j], a, b);
            }
        }
#pragma unroll
        for (int j = 0; j < kTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[j][e] = __fadd_rn(acc[j][e], part[j][e]);
    }
    cp_async_wait<0>();
    __syncthreads();  // the stages are free: the slices' sums go there
    // C fragment: tokens 16 h + g (acc[j][0..1]) and + 8 (acc[j][2..3]) x rows 8 j + 2 tq, + 1.
    constexpr int kSumPitch = kRows + 1;
    float* sums = smem + slice * kTok * kSumPitch;
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            sums[(16 * half + g + (e >> 1) * 8) * kSumPitch + 8 * j + 2 * tq + (e & 1)] = acc[j][e];
    __syncthreads();
    for (int e = threadIdx.x; e < kTok * kRows; e += kThreads) {
        const int tok = e / kRows, row = e % kRows;
        if (t0 + tok >= t || r0 + row >= n) continue;
        float v = smem[tok * kSumPitch + row];
#pragma unroll
        for (int s = 1; s < kSlices; ++s) v = __fadd_rn(v, smem[(s * kTok + tok) * kSumPitch + row]);
        y[static_cast<long long>(t0 + tok) * n + r0 + row] = v;
    }
}

template <int kRows, bool kRoundSmall>
cudaError_t launch(dim3 grid, cudaStream_t stream, const float* w0, float* y0, const float* w1, float* y1, int n,
                   int k, int t, const float* x) {
    constexpr auto kernel = prefill_f32_tc_kernel<kRows, kRoundSmall>;
    if (const cudaError_t e = smem_opted_in<kernel, kSmemBytes<kRows>>()) return e;
    return launch_kernel(kernel, grid, kThreads, kSmemBytes<kRows>, stream, w0, y0, w1, y1, n, k, t, x);
}

template <int kRows>
cudaError_t launch_rows(bool round_small, dim3 grid, cudaStream_t stream, const float* w0, float* y0, const float* w1,
                        float* y1, int n, int k, int t, const float* x) {
    return round_small ? launch<kRows, true>(grid, stream, w0, y0, w1, y1, n, k, t, x)
                       : launch<kRows, false>(grid, stream, w0, y0, w1, y1, n, k, t, x);
}

// OPENJET_PREFILL_F32 (read at each call): `rows` decode's kernels; `tf32x3-rna` the 3xTF32 GEMM with both parts
// rounded by cvt.rna (split_operand).
bool prefill_f32_is(const char* form) {
    const char* v = std::getenv("OPENJET_PREFILL_F32");
    return v && std::strcmp(v, form) == 0;
}
bool prefill_f32_rows() { return prefill_f32_is("rows"); }

}  // namespace

bool prefill_f32_own() { return !prefill_f32_rows() && prefill_numerics_own(); }

// Wide blocks where every multiprocessor gets one (the H200's 4,096-row chunk of the 27B: 256 for 132) and their
// 100 KB of shared memory fit a block (not the 99 KB of sm_86 / 89 / 120, where a 4090's 2,048-row chunk would ask
// for 128 blocks on 128 SMs); narrow ones (60 KB) otherwise: a short call, a 2,048-row chunk on a large GPU.
int prefill_f32_block_rows(int t, int n, int matrices, int sms, int optin) {
    const long long tok_tiles = (t + kTok - 1) / kTok;
    const bool wide = tok_tiles * ((n + kRowsWide - 1) / kRowsWide) * matrices >= sms &&
                      kSmemBytes<kRowsWide> <= static_cast<size_t>(optin);
    return wide ? kRowsWide : kRowsNarrow;
}

bool prefill_f32_takes(const GemvArgs& a) {
    return a.k % kChunk == 0 && a.t >= 1 && a.xf &&
           !((reinterpret_cast<uintptr_t>(a.w) | reinterpret_cast<uintptr_t>(a.xf)) & 15);
}

cudaError_t launch_prefill_f32(const GemvArgs& a, const GemvArgs* b, cudaStream_t stream) {
    if (!prefill_f32_takes(a) || (b && (!prefill_f32_takes(*b) || b->n != a.n || b->k != a.k || b->t != a.t ||
                                        b->xf != a.xf)))
        return cudaErrorInvalidValue;
    const float* w1 = b ? static_cast<const float*>(b->w) : nullptr;
    float* y1 = b ? b->y : nullptr;
    const int tok_tiles = (a.t + kTok - 1) / kTok;
    if (tok_tiles > 65535) return cudaErrorInvalidValue;  // gridDim.y
    const int matrices = b ? 2 : 1;
    int sms = 0, optin = 0;
    if (const cudaError_t e = device_attribute(cudaDevAttrMultiProcessorCount, &sms)) return e;
    if (const cudaError_t e = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, &optin)) return e;
    const int rows = prefill_f32_block_rows(a.t, a.n, matrices, sms, optin);
    const dim3 grid((a.n + rows - 1) / rows, tok_tiles, matrices);
    const auto* w0 = static_cast<const float*>(a.w);
    const bool rna = prefill_f32_is("tf32x3-rna");
    return rows == kRowsWide ? launch_rows<kRowsWide>(rna, grid, stream, w0, a.y, w1, y1, a.n, a.k, a.t, a.xf)
                             : launch_rows<kRowsNarrow>(rna, grid, stream, w0, a.y, w1, y1, a.n, a.k, a.t, a.xf);
}

}  // namespace openjet
