// launch_tile_layout (weight_layout.cuh): the row layout's bytes moved into the tile layout, two bytes a thread
// (every unit's byte count and pitch is even: Q4_K 144, Q5_K 176, Q6_K 210 in 212, Q8_0 272).
#include <cstdint>

#include "kquant.cuh"
#include "weight_layout.cuh"

namespace openjet {

constexpr int kUnitWeights = 256;

int unit_bytes(int qtype) {
    const int e = block_elems(qtype);
    return qtype == kF32 || e == 0 ? 0 : kUnitWeights / e * block_bytes(qtype);
}

namespace {

// Thread i writes half-word i of dst: (group, unit, row in group, half-word in its piece) from i, read from the row
// layout, or zero past the unit's bytes.
__global__ void tile_layout_kernel(const uint16_t* __restrict__ src, uint16_t* __restrict__ dst, long long total,
                                   int units, int unit_halves, int pitch_halves) {
    const long long row_halves = static_cast<long long>(units) * unit_halves;
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        const int b = static_cast<int>(i % pitch_halves);
        const long long piece = i / pitch_halves;  // (group * units + u) * 16 + r
        const int r = static_cast<int>(piece % kTileLayoutRows);
        const long long gu = piece / kTileLayoutRows;
        const int u = static_cast<int>(gu % units);
        const long long row = gu / units * kTileLayoutRows + r;
        dst[i] = b < unit_halves ? src[row * row_halves + static_cast<long long>(u) * unit_halves + b] : 0;
    }
}

}  // namespace

long long tile_layout_bytes(int qtype, int n, int k) {
    if (!tile_layout_fits(qtype, n, k)) return 0;
    return static_cast<long long>(n) * (k / kUnitWeights) * tile_pitch(unit_bytes(qtype));
}

bool tile_layout_fits(int qtype, int n, int k) {
    return unit_bytes(qtype) > 0 && n > 0 && k > 0 && n % kTileLayoutRows == 0 && k % kUnitWeights == 0;
}

cudaError_t launch_tile_layout(const void* src, void* dst, int qtype, int n, int k, cudaStream_t stream) {
    if (!tile_layout_fits(qtype, n, k) || !src || !dst || src == dst) return cudaErrorInvalidValue;
    const int units = k / kUnitWeights, unit_halves = unit_bytes(qtype) / 2;
    const long long total = tile_layout_bytes(qtype, n, k) / 2;
    const long long blocks = (total + 255) / 256;
    tile_layout_kernel<<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(
        static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), total, units, unit_halves,
        tile_pitch(unit_bytes(qtype)) / 2);
    return cudaGetLastError();
}

}  // namespace openjet
