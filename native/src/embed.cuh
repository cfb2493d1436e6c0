// Token embedding: rows of a Q4_K table [vocab, dim] gathered by token id and dequantised to float32,
// with ggml's float steps ((d * sc) * q - dmin * m, no fused multiply-add) so rows equal ggml's bit for bit;
// and the same gather without dequantisation (rows of a quantised matrix copied as they are).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace openjet {

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
