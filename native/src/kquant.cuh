// GGUF block layouts (ggml-common.h) as the kernels read them, and the device helpers every weight reader
// shares. Byte offsets are those of openjet_launcher/model/quants.py's table:
//   Q8_0  32 elem  34 B  d | q[32] int8
//   Q4_K 256 elem 144 B  d | dmin | scales[12] (6-bit sc,m x8) | qs[128] 4-bit
//   Q5_K 256 elem 176 B  d | dmin | scales[12] | qh[32] bit 4 | qs[128]
//   Q6_K 256 elem 210 B  ql[128] low 4 | qh[64] high 2 | sc[16] int8 | d
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace openjet {

// GGML type ids (ggml.h enum ggml_type): the C API takes these numbers.
enum GgmlType : int { kF32 = 0, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14 };

template <int QT> struct Block;
template <> struct Block<kQ8_0> { static constexpr int kElems = 32, kBytes = 34; };
template <> struct Block<kQ4_K> { static constexpr int kElems = 256, kBytes = 144; };
template <> struct Block<kQ5_K> { static constexpr int kElems = 256, kBytes = 176; };
template <> struct Block<kQ6_K> { static constexpr int kElems = 256, kBytes = 210; };

// Bytes of one weight row of k elements (k a multiple of the block's).
template <int QT> __host__ __device__ constexpr long long row_bytes_of(int k) {
    return static_cast<long long>(k / Block<QT>::kElems) * Block<QT>::kBytes;
}

// Bytes of one 256-weight unit (a k-quant super-block; eight Q8_0 blocks): the step of the tile layout's pieces.
template <int QT> __host__ __device__ constexpr int unit_bytes_of() { return static_cast<int>(row_bytes_of<QT>(256)); }

// Host-side view of the same table; 0 for a type we do not read.
inline int block_elems(int qtype) {
    switch (qtype) {
        case kQ8_0: return 32;
        case kQ4_K: case kQ5_K: case kQ6_K: return 256;
        case kF32: return 1;
        default: return 0;
    }
}
inline int block_bytes(int qtype) {
    switch (qtype) {
        case kQ8_0: return 34;
        case kQ4_K: return 144;
        case kQ5_K: return 176;
        case kQ6_K: return 210;
        case kF32: return 4;
        default: return 0;
    }
}

__device__ __forceinline__ float f16_at(const uint8_t* p) {  // p is 2-byte aligned
    return __half2float(*reinterpret_cast<const __half*>(p));
}

// ggml get_scale_min_k4: the 6-bit scale and min of sub-block j (0..7) from Q4_K/Q5_K's 12 scale bytes, held as
// three words (s03 = bytes 0-3, s47 = 4-7, s8b = 8-11). A warp whose j < 4 differs between lanes takes both paths.
__device__ __forceinline__ void k4_scale_min_words(uint32_t s03, uint32_t s47, uint32_t s8b, int j, int& sc, int& m) {
    const int sh = 8 * (j & 3);
    if (j < 4) {
        sc = (s03 >> sh) & 63;
        m = (s47 >> sh) & 63;
    } else {
        sc = ((s8b >> sh) & 0x0F) | (((s03 >> sh) >> 6 & 3) << 4);
        m = ((s8b >> sh) >> 4 & 0x0F) | (((s47 >> sh) >> 6 & 3) << 4);
    }
}

}  // namespace openjet
