// cp.async helpers (sm_80+): global -> shared copies that bypass the registers, grouped and waited on, so a
// warp streams the next tiles in while it computes on the current one. Shared by the GEMV and attention.
#pragma once

namespace openjet {

__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src) {  // L1 bypassed
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem_src));
}
// cp_async16 where `valid`, else the 16 bytes zero-filled (src-size 0: nothing is read), without a branch.
__device__ __forceinline__ void cp_async16_or_zero(void* smem_dst, const void* gmem_src, bool valid) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem_src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(void* smem_dst, const void* gmem_src) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem_src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Asks L2 for the 128-byte line holding p (global memory), without waiting: a later load of it then takes an L2 round
// trip instead of DRAM's. For a latency-bound loop whose loads a thread cannot all keep in registers at once.
__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(__cvta_generic_to_global(p)));
}

}  // namespace openjet
