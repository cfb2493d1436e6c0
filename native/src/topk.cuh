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
// 0). x is modified in place by the penalties. row_ids (optional, no penalties then): entry i of a row is token
// row_ids[i] (a draft vocabulary's rows), ranked and filtered (< n_valid) by that id; where fewer than k entries
// are valid the rest of the row's output has id -1. Bad arguments: cudaErrorInvalidValue.
cudaError_t launch_topk(float* x, int rows, int n, int n_valid, int k, const int32_t* pen_ids,
                        const float* pen_deltas, int n_pen, float* values, int32_t* ids, void* work,
                        cudaStream_t stream, const int32_t* row_ids = nullptr);

// The first of launch_topk's order (k = 1) of one row x [n], for a greedy draft chained on the device: entry i has
// id row_ids[i] (the draft vocabulary's rows; null: i), ids >= n_valid are skipped, and the id goes to *id_out and,
// where set, *id_copy (the next draft step's input), its value to *value_out (where set). One block (a draft
// vocabulary's ~32K rows; the whole vocabulary is a slower fallback). None valid: id 0 at -inf.
cudaError_t launch_argmax(const float* x, int n, const int32_t* row_ids, int n_valid, int32_t* id_out,
                          float* value_out, int32_t* id_copy, cudaStream_t stream);

}  // namespace openjet
