// A decode row's add-norm made inside the GEMV that reads its pack (NormFold, gemv.cuh; the producer-warp GEMV's
// consumer warps, gemv_tma.cu), instead of a pack launch before it. Each resident block builds the whole pack in its
// shared memory (one row of k <= kFoldMaxK: 40 values a thread in registers, ~60 KB of L2 reads a block), so the GEMV
// waits for the projection before it, not for a pack kernel that waits for that projection in turn: one launch and one
// grid-completion hop fewer per boundary. OPENJET_BENCH_SKIP_NORM_PACKS=2 bounded what the 128 add-norms of the 27B's
// T=1 step cost: 8.577 -> 7.518 ms on the H200 (bench/results/engine-full-h200-499afb1-*.json).
//
// The bits of launch_add_norm_pack: h + delta per element; row_rms_scale's 256 chains (chain c the squares of elements
// c, c + 256, ... in order; here a thread runs chains tid and tid + 128), its butterflies and its warp sums 0..7 in
// order; the values (x scale) w; the pack's maximum (exact in any order) and each 32-block by one warp in lane order
// (pack_blocks4).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "act_pack.cuh"
#include "gemv.cuh"  // NormFold
#include "mbarrier.cuh"  // named_bar_sync
#include "rmsnorm.cuh"

namespace openjet {

constexpr int kFoldThreads = 128;                   // the threads that make it: two of row_rms_scale's chains each
constexpr int kFoldCached = 40;                     // values a thread keeps
constexpr int kFoldMaxK = kFoldThreads * kFoldCached;  // 5,120: the 27B's n_embd
constexpr int kFoldSmemBytes = kFoldMaxK * 2 + kFoldMaxK / kActBlock * 2 * 2;  // the pack's halves and sums
static_assert(2 * kFoldThreads == kRowThreads, "row_rms_scale's chains, two a thread");
static_assert(kFoldCached % 8 == 0, "the chains take values in pairs, the pack four 32-blocks at a time");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // (its one caller, and named barriers: mbarrier.cuh)

// The add-norm of f for one token row of k elements (k % 256 == 0, k <= kFoldMaxK) by threads 0 .. kFoldThreads - 1
// of the block (named barrier `bar` among them), its pack into (ph, ps) in shared memory (a pack row's layout: k
// halves, k / 16 halves of sums). writer: also h_out, a_out (where set) and the pack to x's row 0 (global). Returns
// the pack's inv (1 / s). Call once per kernel (its shared scratch is not reused).
__device__ __forceinline__ float fold_add_norm_pack(const NormFold& f, int k, __half* ph, __half* ps, bool writer,
                                                    const ActPack& x, uint32_t bar) {
    __shared__ float chain_sums[kRowThreads / 32];
    __shared__ float warp_max[kFoldThreads / 32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    // v[j]: element tid + 128 j, of 32-block warp + 4 j at lane `lane`
    float v[kFoldCached];
#pragma unroll
    for (int j = 0; j < kFoldCached; ++j) {
        const int i = tid + kFoldThreads * j;
        float xi = 0.0f;
        if (i < k) {  // (another kernel's output: read from L2)
            xi = __ldcg(f.h + i);
            if (f.delta) xi = __fadd_rn(xi, __ldcg(f.delta + i));
        }
        v[j] = xi;
    }
    float s0 = 0.0f, s1 = 0.0f;  // chains tid (v[0], v[2], ...) and tid + 128 (v[1], v[3], ...)
#pragma unroll
    for (int j = 0; j < kFoldCached; j += 2) {
        if (tid + kFoldThreads * j < k) s0 = __fmaf_rn(v[j], v[j], s0);
        if (tid + kFoldThreads * (j + 1) < k) s1 = __fmaf_rn(v[j + 1], v[j + 1], s1);
    }
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) {
        s0 += __shfl_xor_sync(0xffffffffu, s0, m);
        s1 += __shfl_xor_sync(0xffffffffu, s1, m);
    }
    if (lane == 0) chain_sums[warp] = s0, chain_sums[warp + kFoldThreads / 32] = s1;
    named_bar_sync(bar, kFoldThreads);
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kRowThreads / 32; ++w) total += chain_sums[w];
    const float scale = rms_scale_of_total(total, k, f.eps);
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < kFoldCached; ++j) {
        const int i = tid + kFoldThreads * j;
        float a = 0.0f;
        if (i < k) {
            a = __fmul_rn(__fmul_rn(v[j], scale), __ldg(f.w + i));
            if (writer) {
                f.h_out[i] = v[j];
                if (f.a_out) f.a_out[i] = a;
            }
        }
        v[j] = a;
        m = fmaxf(m, fabsf(a));
    }
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) warp_max[warp] = m;
    named_bar_sync(bar, kFoldThreads);
    float amax = 0.0f;
#pragma unroll
    for (int w = 0; w < kFoldThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
    const ActRow r = act_row(ActPack{ph, ps, nullptr, 1}, 0, k, amax);
    const int nb = k / kActBlock;
#pragma unroll
    for (int j = 0; j < kFoldCached; j += 4) {
        const float v4[4] = {v[j], v[j + 1], v[j + 2], v[j + 3]};
        int b4[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) b4[q] = warp + kFoldThreads / 32 * (j + q);
        if (b4[0] < nb) pack_blocks4(v4, r.s, b4, nb, r.h, r.sum);  // (warp-uniform)
    }
    named_bar_sync(bar, kFoldThreads);  // the pack is whole
    if (writer) {  // the global pack, for the calls after this one that read x
        const uint4* hs = reinterpret_cast<const uint4*>(ph);
        uint4* hd = reinterpret_cast<uint4*>(x.h);
        for (int i = tid; i < k / 8; i += kFoldThreads) hd[i] = hs[i];
        const uint4* ss = reinterpret_cast<const uint4*>(ps);
        uint4* sd = reinterpret_cast<uint4*>(x.sum);
        for (int i = tid; i < k / 128; i += kFoldThreads) sd[i] = ss[i];
        if (tid == 0) x.inv[0] = r.inv;
    }
    return r.inv;
}

#endif

}  // namespace openjet
