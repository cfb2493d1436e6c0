// Token embedding: rows of a Q4_K table [vocab, dim] gathered by token id and dequantised to float32,
// with ggml's float steps ((d * sc) * q - dmin * m, no fused multiply-add) so rows equal ggml's bit for bit;
// and the same gather without dequantisation (rows of a quantised matrix copied as they are).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kquant.cuh"

namespace openjet {

// What element e of a Q4_K row needs from memory: its super-block's first 16 bytes (d, dmin, the 12 scale bytes) and
// its qs byte (byte 32*(s/2) + e%32 of the qs, s = (e%256)/32). Loaded apart from q4_k_value so that a kernel can
// issue every element's loads before the first value (one round trip for all of them).
struct Q4kElem {
    uint4 head;
    int qs;
};

// row: the row's first super-block, 16-byte aligned (as every block of a table allocated by the engine).
__device__ __forceinline__ Q4kElem q4_k_load(const uint8_t* __restrict__ row, int e) {
    const uint8_t* p = row + (e / 256) * Block<kQ4_K>::kBytes;
    return Q4kElem{*reinterpret_cast<const uint4*>(p), p[16 + 32 * ((e % 256) / 32 / 2) + e % 32]};
}

// Element e's value with ggml's float steps ((d * sc) * q - dmin * m, no fused multiply-add): rows equal ggml's.
__device__ __forceinline__ float q4_k_value(const Q4kElem& x, int e) {
    const int s = (e % 256) / 32;
    int sc, m;
    k4_scale_min_words(x.head.y, x.head.z, x.head.w, s, sc, m);
    const int q = (s & 1) ? x.qs >> 4 : x.qs & 0x0F;
    const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(x.head.x & 0xFFFFu)));
    const float dmin = __half2float(__ushort_as_half(static_cast<unsigned short>(x.head.x >> 16)));
    const float ds = __fmul_rn(d, static_cast<float>(sc));
    const float dm = __fmul_rn(dmin, static_cast<float>(m));
    return __fsub_rn(__fmul_rn(ds, static_cast<float>(q)), dm);
}

// out [n_ids, dim] = table[ids[i], :]. ids must lie in [0, vocab) (the caller checks; the kernel writes
// zeros for an id outside it rather than read beyond the table). qtype: kQ4_K only.
cudaError_t launch_embed(int qtype, const void* table, int vocab, int dim, const int32_t* ids, int n_ids,
                         float* out, cudaStream_t stream);

// dst row dst_row0 + i = src row ids[i] (rows of row_bytes in the row layout, copied as they are: any block type),
// i < n. ids must lie in [0, n_src) (the caller checks). unit_bytes 0: src and dst in the row layout; else both in the
// tile layout (weight_layout.cuh) with units of unit_bytes, dst's groups of 16 counted from its row 0 (dst_row0 may
// fall inside one; the padding bytes of its pitch are left as they are). The MTP head's draft rows of the lm_head
// (issue 7's draft vocabulary).
cudaError_t launch_gather_rows(const void* src, size_t row_bytes, int unit_bytes, const int32_t* ids, int n, void* dst,
                               int dst_row0, cudaStream_t stream);

}  // namespace openjet
