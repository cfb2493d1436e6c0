// Power-of-two row scales for a prefill's bounded packs (issue 8): where a GEMM's output is packed as fp16 for the next
// GEMM, the pack's scale only has to keep every value inside fp16's range. A bound known before the values (Cauchy-
// Schwarz over the input row x and the weights' largest row norm) gives a scale s = 2^shift with every |v| s below
// 2^15, so the kernel that makes the values can pack them itself, without writing them out and reading them back for
// the row's maximum. Where v s is a normal fp16 number the packed value is the maximum-scaled pack's times a power of
// two, which the consuming GEMM's row factor 1 / s undoes exactly (the same bits); values under 2^-14 / s round as
// subnormals (numerics of their own, declared: docs/ENGINE.md).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "act_pack.cuh"

namespace openjet {

// The FFN's (prefill_gemm.cuh, launch_ffn_gate_up_pack's bounded form): |silu(g) u| <= max(||x|| G, 0.2785) ||x|| U for
// g, u the gate and up outputs of the pack x's rows (G, U = norms[0], norms[1]: the largest row norms of gate and up);
// s [t] and inv [t] = 1 / s. k % 8 == 0.
cudaError_t launch_ffn_row_scale(const ActPack& x, int k, int t, const float* norms, float* s, float* inv,
                                 cudaStream_t stream);

// The GDN output's (launch_gdn_step's bounded pack): its gated RMSNorm o r w silu(z) has |o r| <= sqrt(128) within a
// 128-wide head and |z| <= ||x|| z_max (z_max the largest row norm of the z projection W_z, whose output z is, from the
// layer's input pack x), so |y| <= max(||x|| z_max, 0.2785) sqrt(128) w_max (w_max = max |norm weight|); s [t].
cudaError_t launch_gdn_out_scale(const ActPack& x, int k, int t, float z_max, float w_max, float* s,
                                 cudaStream_t stream);

// OPENJET_GDN_PACK_BOUND (read at each call): unset or 1 (the default since 2026-12-04, a declared numerics change), a
// prefill's GDN output packed under launch_gdn_out_scale's row scales where the engine keeps W_z's fp16 rows (H200,
// the 27B at 4,096 tokens: gdn.out_proj 22.6 -> 19.3 ms, gdn.step 57.7 -> 58.4); 0, the gated norm's y and the pack
// of its rows' maxima (the bits of before).
bool gdn_pack_bound();

// out[0] = the largest Euclidean norm of w16's n rows of k fp16 values (ld halves apart; fp32 sums), for the bounds
// above. k % 2 == 0, ld % 2 == 0.
cudaError_t launch_row_norm_max(const __half* w16, int n, int k, long long ld, float* out, cudaStream_t stream);

}  // namespace openjet
