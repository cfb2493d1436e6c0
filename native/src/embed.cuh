// Token embedding: rows of a Q4_K table [vocab, dim] gathered by token id and dequantised to float32,
// with ggml's float steps ((d * sc) * q - dmin * m, no fused multiply-add) so rows equal ggml's bit for bit;
// and the same gather without dequantisation (rows of a quantised matrix copied as they are).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kquant.cuh"

namespace openjet {

// Element e of a Q4_K row (row: its first super-block; 16-byte aligned): byte 32*(s/2) + e%32 of the super-block's
// qs, low nibble for even s = (e%256)/32, with ggml's float steps. launch_embed's and launch_mtp_input_pack's value.
__device__ __forceinline__ float q4_k_row_value(const uint8_t* __restrict__ row, int e) {
    const uint8_t* p = row + (e / 256) * Block<kQ4_K>::kBytes;
    const int s = (e % 256) / 32;
    int sc, m;
    const uint32_t* sw = reinterpret_cast<const uint32_t*>(p + 4);  // blocks are 16-byte aligned
    k4_scale_min_words(sw[0], sw[1], sw[2], s, sc, m);
    const int byte = p[16 + 32 * (s / 2) + e % 32];
    const int q = (s & 1) ? byte >> 4 : byte & 0x0F;
    const float ds = __fmul_rn(f16_at(p), static_cast<float>(sc));
    const float dm = __fmul_rn(f16_at(p + 2), static_cast<float>(m));
    return __fsub_rn(__fmul_rn(ds, static_cast<float>(q)), dm);
}

// out [n_ids, dim] = table[ids[i], :]. ids must lie in [0, vocab) (the caller checks; the kernel writes
// zeros for an id outside it rather than read beyond the table). qtype: kQ4_K only.
cudaError_t launch_embed(int qtype, const void* table, int vocab, int dim, const int32_t* ids, int n_ids,
                         float* out, cudaStream_t stream);

// dst row i = src row ids[i] (rows of row_bytes, copied as they are: any block type), i < n. ids must lie in
// [0, n_src) (the caller checks). unit_bytes 0: src in the row layout; else in the tile layout (weight_layout.cuh)
// with units of unit_bytes; dst is in the row layout either way. The MTP head's draft rows of the lm_head (issue 7's
// draft vocabulary).
cudaError_t launch_gather_rows(const void* src, size_t row_bytes, int unit_bytes, const int32_t* ids, int n, void* dst,
                               cudaStream_t stream);

}  // namespace openjet
