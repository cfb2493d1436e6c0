// L2 warm-up (issue 7's "L2 prefetch of the next phase's first reads"): a latency-bound kernel of the decode step
// (the GDN step, attention's prep, a one-block pack) leaves the memory system idle; its threads can issue L2
// prefetches for the weights the next GEMV streams, so that GEMV finds them in L2. Prefetches are hints: they change
// no value and no bit, and they may be issued before pdl_wait() (weights are immutable: pdl.cuh's rule).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace openjet {

// The bytes to warm: [p, p + bytes) of one weight tensor (nothing where p is null).
struct L2Next {
    const void* p = nullptr;
    size_t bytes = 0;
};

// Every thread of the grid issues the prefetches of its share of the range's 128-byte lines.
__device__ __forceinline__ void l2_prefetch(const L2Next& next) {
    if (!next.p || !next.bytes) return;
    const uintptr_t first = reinterpret_cast<uintptr_t>(next.p) & ~uintptr_t(127);
    const uintptr_t end = reinterpret_cast<uintptr_t>(next.p) + next.bytes;
    const size_t lines = (end - first + 127) / 128;
    const size_t threads =
        static_cast<size_t>(gridDim.x) * gridDim.y * gridDim.z * blockDim.x * blockDim.y * blockDim.z;
    const size_t block = (static_cast<size_t>(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    const size_t tid = block * blockDim.x * blockDim.y * blockDim.z +
                       (static_cast<size_t>(threadIdx.z) * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    for (size_t i = tid; i < lines; i += threads)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(first + 128 * i));
}

}  // namespace openjet
