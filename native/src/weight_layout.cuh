// The tile layout of a k-quant matrix: how the engine stores every GEMV weight that has one (engine.cu, at load).
//
// The GGUF stores a matrix row by row. A decode warp reads 16 rows x one 256-weight unit at a time (gemv_mma.cuh),
// i.e. 16 pieces of 144-210 bytes one row apart; on the H200 that pattern alone, with no arithmetic, reads a 50 MB
// matrix at ~64% of the copy rate, against ~79% when a tile's 16 pieces of a unit are contiguous
// (native/bench/read_patterns.cu, bench/results/read-patterns-h200-92e1d8e.txt). The tile layout stores each group
// of 16 rows unit by unit: byte b of unit u of row 16 g + r at ((g * units + u) * 16 + r) * pitch + b, pitch the
// unit's bytes rounded up to 4 (tile_pitch). A decode GEMV reads it with other strides and the same arithmetic: the
// same bits. Every reader of a k-quant GEMV weight (the decode and exact prefill GEMVs, the fast prefill GEMM and
// its dense dequantisation, the persistent FFN, the draft-row gather) addresses units through WeightSteps, so
// it reads either layout; GemvArgs::tiled says which one a matrix is in.
#pragma once

#include <cuda_runtime.h>

namespace openjet {

constexpr int kTileLayoutRows = 16;  // rows per group: the decode GEMV's tile (a half tile is half a group)

// Bytes a row's unit takes in the tile layout: its own, rounded up to 4 (Q6_K: 210 -> 212, zeros after), so that every
// piece is 4-byte aligned and the Q6_K GEMV takes its aligned form for every unit (with 210-byte pieces rows alternate
// alignment inside a warp, which takes the funnel-shift form throughout: measured slower on the H200, 0ffbe6a).
__host__ __device__ constexpr int tile_pitch(int unit_bytes) { return (unit_bytes + 3) / 4 * 4; }

// Where a row's units are, in either layout: unit u of row r0 + rr at start + u * unit + rr * row, for the rows
// of r0's group (rr < 16 - r0 % 16 in the tile layout; any rr in the row layout). unit_bytes: the type's bytes per
// 256 weights (a compile-time constant in the kernels, so the tiled branch costs a select).
struct WeightSteps {
    long long start;  // bytes from the matrix to unit 0 of row r0
    int row, unit;    // bytes from a row to the next within a unit, from a unit to the next within a row
    __host__ __device__ __forceinline__ WeightSteps(long long row_bytes, int unit_bytes, bool tiled, long long r0) {
        if (tiled) {
            const int pitch = tile_pitch(unit_bytes);
            row = pitch;
            unit = kTileLayoutRows * pitch;
            start = (r0 / kTileLayoutRows) * (row_bytes / unit_bytes) * unit + (r0 % kTileLayoutRows) * pitch;
        } else {
            row = static_cast<int>(row_bytes);
            unit = unit_bytes;
            start = r0 * row_bytes;
        }
    }
};

// Bytes of one 256-weight unit of qtype in the row layout (0: not a k-quant type, or one we do not read).
int unit_bytes(int qtype);

// Bytes of an n x k matrix of qtype in the tile layout (0 where it has none).
long long tile_layout_bytes(int qtype, int n, int k);

// Whether (qtype, n, k) has a tile layout: a k-quant type the decode GEMV reads, whole units, whole groups.
bool tile_layout_fits(int qtype, int n, int k);

// dst (tile_layout_bytes) = src (n x k of qtype, row layout) in the tile layout, padding zeroed; distinct buffers.
// Groups are independent: rows [16 g, 16 (g + m)) of the row layout move to tile_layout_bytes(qtype, 16 m, k) bytes
// at g's place, so a matrix can be moved in chunks of whole groups (the engine's load does).
cudaError_t launch_tile_layout(const void* src, void* dst, int qtype, int n, int k, cudaStream_t stream);

}  // namespace openjet
