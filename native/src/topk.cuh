// The top k <= 32 logits of each row, on the device: what the sampler needs (sampling.py keeps at most the
// top 32 on the GPU engine) and greedy's argmax (k = 1), so a step copies 32 values per row to the host
// instead of the whole vocabulary. Order: by decreasing value, ties by lower id (np.argsort(-z, stable)),
// the host sampler's order; ids >= n_valid (padding rows of the vocabulary) are never returned.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace openjet {

constexpr int kTopKMax = 32;

// Device scratch (bytes) the two passes need for `rows` rows of n logits.
size_t topk_work_bytes(int rows, int n);

// x [rows, n] float32; values / ids [rows, k]. Before ranking, z[pen_ids[i]] -= pen_deltas[i] in float32
// for every row (presence and frequency penalties, computed on the host as sampling.py does; n_pen may be
// 0). x is modified in place by the penalties. Bad arguments: cudaErrorInvalidValue.
cudaError_t launch_topk(float* x, int rows, int n, int n_valid, int k, const int32_t* pen_ids,
                        const float* pen_deltas, int n_pen, float* values, int32_t* ids, void* work,
                        cudaStream_t stream);

}  // namespace openjet
