// Grid-wide phase boundaries inside one resident launch: warps publish their stores with a counter (warp_arrive) and
// wait for a count (warp_wait). The persistent FFN's phases (ffn_persistent.cu) pass them; bench_boundary.cu times one
// round of them alone.
#pragma once

namespace openjet {

__device__ __forceinline__ int load_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned long long load_acquire(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void store_relaxed(unsigned long long* p, unsigned long long v) {
    asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// A wait this long means a block never came (a grid the GPU could not hold, a bug): the kernel traps, so the call
// fails with an error instead of hanging the process (a decode FFN takes ~0.1 ms).
constexpr unsigned long long kWaitLimitNs = 10'000'000'000ULL;

// This thread spins until done(the word, read with acquire) holds; past kWaitLimitNs it traps.
template <class Word, class Done>
__device__ __forceinline__ void spin_until(const Word* word, const Done& done) {
    if (done(load_acquire(word))) return;
    const unsigned long long start = global_ns();
    while (!done(load_acquire(word))) {
        __nanosleep(32);
        if (global_ns() - start > kWaitLimitNs) __trap();
    }
}

// A phase-word meeting (the GDN step's own pack, the attention combine's): each block writes its max |x| of a row with
// its launch's phase in one 64-bit word, phase << 32 | the max's bits, with no fence (the word carries its own data),
// and the blocks that need the row's max take every such word once it carries the launch's phase.
__device__ __forceinline__ void publish_phase_max(unsigned long long* word, unsigned phase, float max) {
    store_relaxed(word, static_cast<unsigned long long>(phase) << 32 | __float_as_uint(max));
}
// This thread's wait for one block's word of the launch's phase, its max folded into *row_max (maxima >= 0: their bits
// order as the floats). A block that never came traps (spin_until).
__device__ __forceinline__ void take_phase_max(const unsigned long long* word, unsigned phase, unsigned* row_max) {
    unsigned long long got = 0;
    spin_until(word, [phase, &got](unsigned long long w) {
        got = w;
        return static_cast<unsigned>(w >> 32) == phase;
    });
    atomicMax(row_max, static_cast<unsigned>(got));
}

// Lane 0 spins until the counter reaches `target`, then the warp goes on.
__device__ __forceinline__ void warp_wait(const int* counter, int target) {
    if ((threadIdx.x & 31) == 0) spin_until(counter, [target](int v) { return v >= target; });
    __syncwarp();
}

struct NothingAfter {
    __device__ void operator()(int) const {}
};

// The warp's stores so far are published with counter += add (lane 0 adds, then passes `after` the counter's value
// before its add).
template <class After = NothingAfter>
__device__ __forceinline__ void warp_arrive(int* counter, int add, const After& after = {}) {
    __threadfence();
    __syncwarp();
    if ((threadIdx.x & 31) == 0) after(atomicAdd(counter, add));
}

}  // namespace openjet
