// A one-row decode projection's next add-norm, made by the projection's last block (NormTail, gemv.cuh; the
// producer-warp GEMV's four consumer warps, gemv_tma.cu) instead of a pack launch after it: one launch and one
// grid-completion hop fewer per boundary, and the next projection (launched early under PDL) fills its weight rings
// while this call's tail runs. OPENJET_BENCH_SKIP_NORM_PACKS=2 bounded what the 128 add-norms of the 27B's T=1 step
// cost: 8.577 -> 7.518 ms on the H200 (499afb1), 9.443 -> 7.482 with the swiglu packs too on the H100 (bec77ae).
// (OPENJET_NORM_FOLD, which made the pack in every block of the GEMV that reads it, kept the bits and lost:
// NOTES_gemv.md, 2026-12-05.)
//
// The bits of launch_add_norm_pack: h + delta per element; row_rms_scale's 256 chains (chain c the squares of elements
// c, c + 256, ... in order; here a thread runs chains tid and tid + 128), its butterflies and its warp sums 0..7 in
// order; the values (x scale) w; the pack's maximum (exact in any order) and each 32-block by one warp in lane order
// (pack_blocks4: pack_block's bits).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "act_pack.cuh"
#include "cp_async.cuh"  // prefetch_l2
#include "gemv.cuh"      // NormTail
#include "mbarrier.cuh"  // named_bar_sync
#include "rmsnorm.cuh"

namespace openjet {

constexpr int kTailThreads = 128;                       // two of row_rms_scale's chains a thread
constexpr int kTailCached = kNormTailMaxK / kTailThreads;  // values a thread keeps
constexpr int kTailBatch = 8;                               // loads in flight a thread
static_assert(kTailCached % kTailBatch == 0, "whole batches");
static_assert(2 * kTailThreads == kRowThreads, "row_rms_scale's chains, two a thread");
static_assert(kTailCached % 8 == 0, "the chains take values in pairs, the pack four 32-blocks at a time");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // (its one caller, and named barriers: mbarrier.cuh)

// The add-norm of f for a row of k elements (k % 32 == 0, k <= kNormTailMaxK) whose delta is `delta` (other blocks'
// outputs: read from L2), by threads 0 .. kTailThreads - 1 of the block (named barrier `bar` among them): h, a_out and
// the pack of f.x's row 0 written.
__device__ __forceinline__ void tail_add_norm_pack(const NormTail& f, const float* delta, int k, uint32_t bar) {
    __shared__ float chain_sums[kRowThreads / 32];
    __shared__ float warp_max[kTailThreads / 32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const auto stamp = [&](int i) {  // (f.clocks: the test API's phase clocks)
        if (f.clocks && tid == 0) f.clocks[i] = clock64();
    };
    stamp(0);
    // The norm weights are read last but are cold (the step's weight streams pass through L2 in between): their lines
    // asked for now arrive under the loads and the chains below. A warp's 32 elements of row j are one 128-byte line:
    // lane j asks for row j's (and lane j - 32 for row j's past 32), two instructions a warp.
#pragma unroll
    for (int j = lane; j < kTailCached; j += 32)
        if (32 * warp + kTailThreads * j < k)
            prefetch_l2(f.w + 32 * warp + kTailThreads * j);
    // v[j]: element tid + 128 j, of 32-block warp + 4 j at lane `lane`. The loads go out kTailBatch at a time before
    // their first use (a warp issues in order: with a load, an add and a branch per element, each element's L2 round
    // trip was waited for in turn: 2.7 us of the H100's 13 us tail at adc8550, the w loop below 7.6 us).
    float v[kTailCached];
#pragma unroll
    for (int j0 = 0; j0 < kTailCached; j0 += kTailBatch) {
        float hv[kTailBatch], dv[kTailBatch];
#pragma unroll
        for (int q = 0; q < kTailBatch; ++q) {
            const int i = min(tid + kTailThreads * (j0 + q), k - 1);  // (a clamped read instead of a branch)
            hv[q] = __ldcg(f.h + i);
            dv[q] = __ldcg(delta + i);
        }
#pragma unroll
        for (int q = 0; q < kTailBatch; ++q)
            v[j0 + q] = tid + kTailThreads * (j0 + q) < k ? __fadd_rn(hv[q], dv[q]) : 0.0f;
    }
    float s0 = 0.0f, s1 = 0.0f;  // chains tid (v[0], v[2], ...) and tid + 128 (v[1], v[3], ...)
#pragma unroll
    for (int j = 0; j < kTailCached; j += 2) {
        if (tid + kTailThreads * j < k) s0 = __fmaf_rn(v[j], v[j], s0);
        if (tid + kTailThreads * (j + 1) < k) s1 = __fmaf_rn(v[j + 1], v[j + 1], s1);
    }
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) {
        s0 += __shfl_xor_sync(0xffffffffu, s0, m);
        s1 += __shfl_xor_sync(0xffffffffu, s1, m);
    }
    if (lane == 0) chain_sums[warp] = s0, chain_sums[warp + kTailThreads / 32] = s1;
    stamp(1);
    named_bar_sync(bar, kTailThreads);
    stamp(2);
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kRowThreads / 32; ++w) total += chain_sums[w];
    const float scale = rms_scale_of_total(total, k, f.eps);
    float m = 0.0f;
#pragma unroll
    for (int j0 = 0; j0 < kTailCached; j0 += kTailBatch) {
        float wv[kTailBatch];  // (loaded before the stores below, which the compiler may not move them past)
#pragma unroll
        for (int q = 0; q < kTailBatch; ++q) wv[q] = __ldg(f.w + min(tid + kTailThreads * (j0 + q), k - 1));
#pragma unroll
        for (int q = 0; q < kTailBatch; ++q) {
            const int j = j0 + q, i = tid + kTailThreads * j;
            float a = 0.0f;
            if (i < k) {
                a = __fmul_rn(__fmul_rn(v[j], scale), wv[q]);
                f.h[i] = v[j];
                if (f.a_out) f.a_out[i] = a;
            }
            v[j] = a;
            m = fmaxf(m, fabsf(a));
        }
    }
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) warp_max[warp] = m;
    stamp(3);
    named_bar_sync(bar, kTailThreads);
    stamp(4);
    float amax = 0.0f;
#pragma unroll
    for (int w = 0; w < kTailThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
    const ActRow r = act_row(f.x, 0, k, amax);
    const int nb = k / kActBlock;
#pragma unroll
    for (int j = 0; j < kTailCached; j += 4) {
        const float v4[4] = {v[j], v[j + 1], v[j + 2], v[j + 3]};
        int b4[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) b4[q] = warp + kTailThreads / 32 * (j + q);
        if (b4[0] < nb) pack_blocks4(v4, r.s, b4, nb, r.h, r.sum);  // (warp-uniform)
    }
    if (tid == 0) f.x.inv[0] = r.inv;
    stamp(5);
}

#endif

}  // namespace openjet
