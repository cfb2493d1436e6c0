// Hopper's pieces of a warp-specialised pipeline (sm_90a only; attn_prefill_wgmma_ws.cu): shared-memory mbarriers
// with phase parity, cp.async copies that arrive on one when they land, named barriers over a subset of the block's
// warps and setmaxnreg. Everything here compiles only where __CUDA_ARCH_FEAT_SM90_ALL (a 90a target), as wgmma.cuh.
//
// An mbarrier counts arrivals against the count it was initialised with; the last one completes the current phase and
// starts the next (phases alternate parity 0, 1, 0, ...). mbar_wait(bar, p) returns once the phase of parity p has
// completed, and at once for p = 1 on a fresh barrier (the phase before phase 0 counts as complete), so a ring's
// "empty" barriers let the producer fill each stage once before any consumer has released it. Arrivals release and
// the completed wait acquires (PTX's defaults, .release / .acquire at .cta scope): what a thread wrote before its
// arrival is visible to the threads whose wait then returns.
#pragma once

#include <cstdint>

namespace openjet {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred p;\nWAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra WAIT;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

// mbar_wait by a whole warp, the spin on a vote: a branch the compiler sees as warp-uniform, so that the code after it
// keeps its uniform registers (with mbar_wait's per-thread branch, ptxas re-made the global-load descriptor before each
// load of a decode GEMV's unit: 18 of its ~350 instructions).
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    return done != 0;
}
__device__ __forceinline__ void mbar_wait_warp(uint32_t bar, uint32_t parity) {
    while (!__all_sync(0xffffffffu, mbar_try_wait(bar, parity))) {
    }
}

// An arrival on bar once every cp.async this thread issued before it has landed, without raising the pending count
// (.noinc): the barrier's count includes these arrivals.
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// A 16-byte cp.async of src_bytes (16, or 0: 16 zero bytes, nothing read, src still a valid address) to the shared
// address dst: zero rows of a tile tracked by the same arrival as the copied ones, not plain stores beside them.
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, uint32_t src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// The fresh barriers' initialisation, visible to the async proxy (the bulk copies' completions) before any use.
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// This thread's arrival on bar, and `bytes` more bytes the current phase waits for (bulk copies' complete_tx).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// A bulk copy (the TMA unit) of `bytes` (a multiple of 16; both addresses 16-byte aligned) from global src to the
// shared address dst, counted against bar's expected bytes when it lands; policy: an L2 cache policy
// (createpolicy), e.g. evict_first for weights streamed once.
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                              uint64_t policy) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], "
        "%4;\n" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar), "l"(policy)
        : "memory");
}
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}

// This thread's shared-memory accesses in the generic proxy (plain loads and stores, cp.async) ordered with the async
// proxy's (bulk copies, wgmma's operand reads): PTX orders the two proxies only through this fence, and an mbarrier's
// release or a block barrier orders the generic proxy alone. Stores then a wgmma reading them: the writers fence
// before the barrier (wgmma.cuh). A ring slot read with plain loads, then handed back to a producer that refills it
// with a bulk copy: the readers fence before the hand-back, or the copy may land under their reads (tma_ring.cuh).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// bar.sync on barrier id (1 .. 15; 0 is __syncthreads') for n_threads threads (a multiple of 32).
__device__ __forceinline__ void named_bar_sync(uint32_t id, uint32_t n_threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n_threads) : "memory");
}

// The warpgroup's per-thread register ceiling lowered to, or raised to (waiting for other warpgroups to lower theirs),
// N (a multiple of 8 in 24 .. 256); every warp of the warpgroup executes the same one.
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace openjet
