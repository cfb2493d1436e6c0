// cp.async helpers (sm_80+): global -> shared copies that bypass the registers, grouped and waited on, so a
// warp streams the next tiles in while it computes on the current one. Shared by the GEMV and attention.
#pragma once

#include <cstdint>

namespace openjet {

__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src) {  // L1 bypassed
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem_src));
}
__device__ __forceinline__ void cp_async4(void* smem_dst, const void* gmem_src) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem_src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// mbarriers in shared memory (sm_80+): a phase completes when `count` arrivals (and the cp.async copies tracked
// by mbar_arrive_on_copies) have happened; waiters name the parity of the phase they wait for. A freshly
// initialised barrier is in phase 0, and waiting for parity 1 returns at once (the phase before it counts as done).
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(bar));
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(s), "r"(count) : "memory");
}
// The initialisations above made visible to the block's other threads (before a __syncthreads).
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(bar));
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(s) : "memory");  // no token: waits go by parity
}
// The barrier's current phase also waits for this thread's cp.async copies issued so far (no arrival of its own).
__device__ __forceinline__ void mbar_arrive_on_copies(uint64_t* bar) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(bar));
    asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];\n" ::"r"(s) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(bar));
    unsigned done = 0;
    while (!done)
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(s), "r"(parity)
            : "memory");
}

}  // namespace openjet
