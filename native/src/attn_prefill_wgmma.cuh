// The two products of a warpgroup's 64 rows in the prefill attention on warpgroup MMA, shared by its two kernels
// (attn_prefill_wgmma.cu: two warpgroups in lockstep; attn_prefill_wgmma_ws.cu: warp-specialised), so that both issue
// the same wgmma chains in the same order: the mma.sync kernel's bits. Tiles in Sw128 (attn_prefill_rows.cuh) at
// shared addresses on 1,024-byte boundaries; the device code compiles only where wgmma.cuh's does (sm_90a).
#pragma once

#include <cstdint>

#include "attn_prefill_rows.cuh"
#include "pdl.cuh"
#include "wgmma.cuh"

namespace openjet {

// Whether this build (a 90a target: OPENJET_HAVE_SM90A) and device (compute capability 9.0) run a wgmma kernel of
// smem_bytes of dynamic shared memory.
bool attn_prefill_wgmma_fits(int smem_bytes);

// kKernel over the grid (q heads, query tiles of kRows rows), kThreads threads and kSmem bytes of dynamic shared
// memory a block (asked for at its first launch).
template <void (*kKernel)(AttnDecodeArgs), int kRows, int kThreads, int kSmem>
cudaError_t launch_wgmma_rows(const AttnDecodeArgs& a, cudaStream_t stream) {
    if (const cudaError_t e = smem_opted_in<kKernel, kSmem>()) return e;
    return launch_kernel(kKernel, dim3(a.n_head, (a.t + kRows - 1) / kRows), kThreads, kSmem, stream, a);
}

namespace prefill_rows {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// S = Q K^T into s (zeroed): s[nt]: rows (g, g + 8) x keys 8 nt + 2 tq + (0, 1) of the tile; q_wg: the warpgroup's
// rows in each 64-dim block of a kQRows-row q tile, k: a kKeys-key K tile. k16 step kk: dims 16 kk .. + 15, 32 bytes
// into the 128-byte rows of 64-dim block kk / 4. Issued, not waited for.
template <int kQRows, int kKeys>
__device__ __forceinline__ void wgmma_issue_s(float (&s)[kKeys / 8][4], uint32_t q_wg, uint32_t k) {
    fence_operands(s);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t step = (kk & 3) * 32;
        wgmma_m64n64k16_ss(s, sw128_desc(q_wg + (kk >> 2) * (kQRows * 128) + step, 16, 1024),
                           sw128_desc(k + (kk >> 2) * (kKeys * 128) + step, 16, 1024));
    }
    wgmma_commit();
}

// O += P V, pa the probabilities' A fragments (p_fragment), v a kKeys-key V tile: keys 16 ks .. + 15 are V's rows
// 16 ks .., 2 groups of 8 rows of 128 bytes (1,024 bytes apart) per 64-dim block (kKeys x 128 bytes apart). Issued,
// not waited for; the caller fences o and pa first.
template <int kKeys>
__device__ __forceinline__ void wgmma_issue_pv(float (&o)[D / 8][4], const uint32_t (&pa)[kKeys / 16][4], uint32_t v) {
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks)
        wgmma_m64n256k16_rs_tb(o, pa[ks], sw128_desc(v + ks * 16 * 128, kKeys * 128, 1024));
    wgmma_commit();
}

// One tile's softmax over the warp's rows (softmax_tile: keys key0 .., the warp's first row at position first) and its
// probabilities as the A fragments of O += P V, fenced with O for the wgmma that reads them.
template <int kKeys>
__device__ __forceinline__ void softmax_to_p(float (&s)[kKeys / 8][4], float (&o)[D / 8][4], float (&m_run)[2],
                                             float (&l_run)[2], int key0, int first, int tq, int pos_lo, int pos_hi,
                                             uint32_t (&pa)[kKeys / 16][4]) {
    const bool unmasked = key0 + kKeys - 1 <= first;  // every key at or before the warp's first row
    softmax_tile<kKeys>(s, o, m_run, l_run, unmasked, key0, tq, pos_lo, pos_hi);
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks) p_fragment<kKeys>(s, ks, pa[ks]);
    fence_operands(pa);
    fence_operands(o);
}

// S of the next tile becomes this tile's (registers: the compiler renames what it can).
template <int kKeys>
__device__ __forceinline__ void take_next(float (&s)[kKeys / 8][4], const float (&s_next)[kKeys / 8][4]) {
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) s[nt][c] = s_next[nt][c];
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace prefill_rows
}  // namespace openjet
