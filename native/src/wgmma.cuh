// Warpgroup MMA (sm_90a: wgmma.mma_async) pieces for the prefill GEMM's Hopper kernels (prefill_gemm.cu). Compiled
// only where the architecture-specific target is built (OPENJET_CUDA_ARCHITECTURES=90a-real, which defines
// __CUDA_ARCH_FEAT_SM90_ALL); elsewhere the functions are empty and the host never launches their kernels
// (prefill_wgmma_available).
//
// Operands in shared memory, K-major, no swizzle: 8 x 8 fp16 "core matrices" (8 rows of 16 bytes, 128 bytes each);
// a descriptor gives the start, the byte distance between core matrices adjacent in k (LBO) and in rows (SBO).
// The accumulator of m64nNk16 (fp32): warp w of the warpgroup holds rows 16 w + (g, g + 8), g = lane / 4; d[4 j + c]
// is row g + 8 (c / 2), column 8 j + 2 (lane % 4) + c % 2 (mma.sync's C layout, once per 8 columns).
#pragma once

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define OPENJET_WGMMA_ARCH 1
#endif

namespace openjet {

// Descriptor of a K-major, unswizzled operand tile at p (16-byte aligned shared memory).
__device__ __forceinline__ uint64_t wgmma_desc(const void* p, uint32_t lbo, uint32_t sbo) {
    const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
    return static_cast<uint64_t>((a & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
           (static_cast<uint64_t>(sbo >> 4) << 32);
}

// This thread's generic-proxy writes to shared memory (st.shared, cp.async) made visible to the tensor cores' reads.
__device__ __forceinline__ void fence_proxy_async_shared() {
#ifdef OPENJET_WGMMA_ARCH
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_fence() {
#ifdef OPENJET_WGMMA_ARCH
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef OPENJET_WGMMA_ARCH
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N of this warpgroup's committed groups are still running.
template <int N> __device__ __forceinline__ void wgmma_wait() {
#ifdef OPENJET_WGMMA_ARCH
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// d[64] += A[64 x 16] B[16 x 128] (fp16 in, fp32 accumulators), both operands from shared memory.
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
#ifdef OPENJET_WGMMA_ARCH
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(1));  // p: D = A B + D
#endif
}

}  // namespace openjet
