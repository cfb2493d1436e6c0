// fp16 tensor-core pieces shared by the GEMV (gemv_mma.cuh) and attention (attn_decode.cuh): the m16n8k16 mma
// with fp32 accumulation, and exact ways into its fp16 operands.
//
// Fragments of mma.sync m16n8k16 (lane = (g, tq) = (lane / 4, lane % 4)): A rows g and g + 8, k columns
// (2tq, 2tq + 1) in a[0] / a[1] and (2tq + 8, 2tq + 9) in a[2] / a[3]; B column g, k rows (2tq, 2tq + 1) in
// b[0] and (2tq + 8, 2tq + 9) in b[1]; C rows g (c[0], c[1]) and g + 8 (c[2], c[3]) x columns 2tq, 2tq + 1.
// In each 32-bit register the lower half holds the lower k index.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace openjet {

__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Four 8x8 fp16 matrices from shared memory, matrix i's 8 rows of 16 bytes at the addresses of lanes 8i .. 8i + 7:
// r[i] holds row g, elements (2tq, 2tq + 1) of matrix i, an A or B fragment register. _trans: column g, rows
// (2tq, 2tq + 1), a B register from a matrix stored k-major (attention's V rows).
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* p) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* p) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

constexpr uint32_t kMagic = 0x64006400u;  // fp16x2 (1024, 1024): (kMagic | q) is the fp16 1024 + q, q < 1024

__device__ __forceinline__ uint32_t hsub2_u(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ uint32_t hfma2_u(uint32_t a, uint32_t b, uint32_t c) {  // a * b + c, one rounding
    uint32_t d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// fp16x2 of the int8 values in bytes 0 (low half) and 2 (high half) of v, the other bytes zero, exactly:
// (0x64 << 8 | (q ^ 0x80)) is the fp16 1024 + 128 + q.
__device__ __forceinline__ uint32_t h2_of_s8_bytes02(uint32_t v) {
    constexpr uint32_t k1152 = 0x64806480u;  // fp16x2 (1152, 1152)
    return hsub2_u(v ^ k1152, k1152);
}

// The int8 pair (byte 0, byte 1) of v as fp16x2, exactly.
__device__ __forceinline__ uint32_t h2_of_s8x2(uint32_t v) { return h2_of_s8_bytes02(__byte_perm(v, 0u, 0x4140)); }

// (x, y) as hi + lo fp16x2 pairs: hi = fp16(x), lo = fp16(x - hi); hi + lo holds ~22 bits of x, so an mma over
// hi and then lo keeps near-fp32 accuracy for an operand that is not exact in fp16.
__device__ __forceinline__ void split_h2(float x, float y, uint32_t& hi, uint32_t& lo) {
    const __half2 h = __floats2half2_rn(x, y);
    const float2 hf = __half22float2(h);
    const __half2 l = __floats2half2_rn(x - hf.x, y - hf.y);
    hi = *reinterpret_cast<const uint32_t*>(&h);
    lo = *reinterpret_cast<const uint32_t*>(&l);
}

}  // namespace openjet
