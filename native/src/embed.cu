// launch_embed: one block per token; each thread dequantises elements e = threadIdx.x + 256 i of its row.
#include "embed.cuh"
#include "kquant.cuh"
#include "launch_count.h"
#include "pdl.cuh"
#include "weight_layout.cuh"

namespace openjet {
namespace {

constexpr int kEmbedThreads = 256;

__global__ void __launch_bounds__(kEmbedThreads) embed_q4_k_kernel(const uint8_t* __restrict__ table, int vocab,
                                                                   int dim, const int32_t* __restrict__ ids,
                                                                   float* __restrict__ out) {
    pdl_start();  // pdl.cuh
    const int id = ids[blockIdx.x];
    float* o = out + (long long)blockIdx.x * dim;
    if (id < 0 || id >= vocab) {
        for (int e = threadIdx.x; e < dim; e += kEmbedThreads) o[e] = 0.0f;
        return;
    }
    const uint8_t* row = table + (long long)id * (dim / 256) * Block<kQ4_K>::kBytes;
    for (int e = threadIdx.x; e < dim; e += kEmbedThreads) o[e] = q4_k_value(q4_k_load(row, e), e);
}

}  // namespace

cudaError_t launch_embed(int qtype, const void* table, int vocab, int dim, const int32_t* ids, int n_ids,
                         float* out, cudaStream_t stream) {
    if (qtype != kQ4_K || !table || !ids || !out || vocab < 1 || dim < 256 || dim % 256 || n_ids < 0)
        return cudaErrorInvalidValue;
    if (n_ids == 0) return cudaSuccess;
    return launch_kernel(embed_q4_k_kernel, n_ids, kEmbedThreads, 0, stream, static_cast<const uint8_t*>(table),
                         vocab, dim, ids, out);
}

namespace {

// unit_bytes 0: src and dst in the row layout; else both in the tile layout (weight_layout.cuh), a row's units
// unit_bytes long. Block i copies src row ids[i] to dst row dst_row0 + i.
__global__ void __launch_bounds__(kEmbedThreads) gather_rows_kernel(const uint8_t* __restrict__ src, size_t row_bytes,
                                                                    int unit_bytes, const int32_t* __restrict__ ids,
                                                                    uint8_t* __restrict__ dst, int dst_row0) {
    pdl_start();  // pdl.cuh
    const int ub = unit_bytes ? unit_bytes : static_cast<int>(row_bytes);  // bytes a piece (row layout: the row)
    const auto rb = static_cast<long long>(row_bytes);
    const bool tiled = unit_bytes != 0;
    const WeightSteps from(rb, ub, tiled, ids[blockIdx.x]), to(rb, ub, tiled, dst_row0 + blockIdx.x);
    const uint8_t* s = src + from.start;
    uint8_t* d = dst + to.start;
    for (size_t b = threadIdx.x; b < row_bytes; b += kEmbedThreads) {
        const size_t u = b / ub, i = b % ub;
        d[u * to.unit + i] = s[u * from.unit + i];
    }
}

}  // namespace

cudaError_t launch_gather_rows(const void* src, size_t row_bytes, int unit_bytes, const int32_t* ids, int n, void* dst,
                               int dst_row0, cudaStream_t stream) {
    if (!src || !ids || !dst || n < 0 || dst_row0 < 0 || row_bytes == 0 || row_bytes > 0x7fffffff || unit_bytes < 0 ||
        (unit_bytes && row_bytes % unit_bytes))
        return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    if (unit_bytes) count_launch(Counted::kTiledWeights);
    return launch_kernel(gather_rows_kernel, n, kEmbedThreads, 0, stream, static_cast<const uint8_t*>(src), row_bytes,
                         unit_bytes, ids, static_cast<uint8_t*>(dst), dst_row0);
}

}  // namespace openjet
