// tf32 tensor-core pieces (sm_80+): the m16n8k8 mma with fp32 accumulation and the 3xTF32 product, which keeps
// about fp32's accuracy (each operand split as big + small, both tf32; the small x small term, ~2^-22 of the product,
// dropped), for fp32 work that must stay fp32-accurate: the chunked GDN's state steps (gdn_chunk.cu).
//
// Fragments of mma.sync m16n8k8 tf32 (lane = (g, tq) = (lane / 4, lane % 4)): A rows g (a[0], a[2]) and g + 8 (a[1],
// a[3]) x k columns tq (a[0], a[1]) and tq + 4 (a[2], a[3]); B column g x k rows tq (b[0]) and tq + 4 (b[1]); C rows
// g (c[0], c[1]) and g + 8 (c[2], c[3]) x columns 2tq, 2tq + 1.
#pragma once

#include <cstdint>

namespace openjet {

__device__ __forceinline__ void mma_1688_tf32(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t tf32_rna(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}

// x = big + small to ~2^-22 relative: big = x rounded to tf32, small = the remainder rounded to tf32.
struct Tf32Pair {
    uint32_t big, small;
};
__device__ __forceinline__ Tf32Pair tf32_split(float x) {
    const uint32_t big = tf32_rna(x);
    return {big, tf32_rna(__fsub_rn(x, __uint_as_float(big)))};
}

// c += a b in 3xTF32: the cross terms first (the smaller values), then big x big.
template <int kA, int kB>
__device__ __forceinline__ void mma_1688_3xtf32(float c[4], const Tf32Pair (&a)[kA], const Tf32Pair (&b)[kB]) {
    static_assert(kA == 4 && kB == 2, "an m16n8k8 A and B fragment");
    const uint32_t ab[4] = {a[0].big, a[1].big, a[2].big, a[3].big}, as[4] = {a[0].small, a[1].small, a[2].small,
                                                                              a[3].small};
    const uint32_t bb[2] = {b[0].big, b[1].big}, bs[2] = {b[0].small, b[1].small};
    mma_1688_tf32(c, as, bb);
    mma_1688_tf32(c, ab, bs);
    mma_1688_tf32(c, ab, bb);
}

}  // namespace openjet
