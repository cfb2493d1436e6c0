// The tile layout of a k-quant matrix (an experiment for the decode GEMV, issue 6; test API only so far).
//
// The GGUF stores a matrix row by row. A decode warp reads 16 rows x one 256-weight unit at a time (gemv_mma.cuh),
// i.e. 16 pieces of 144-210 bytes one row apart; on the H200 that pattern alone, with no arithmetic, reads a 50 MB
// matrix at ~64% of the copy rate, against ~79% when a tile's 16 pieces of a unit are contiguous
// (native/bench/read_patterns.cu, bench/results/read-patterns-h200-92e1d8e.txt). The tile layout stores each group
// of 16 rows unit by unit: byte b of unit u of row 16 g + r at ((g * units + u) * 16 + r) * pitch + b, pitch the
// unit's bytes rounded up to 4 (tile_pitch). A decode GEMV reads it with other strides and the same arithmetic: the
// same bits.
#pragma once

#include <cuda_runtime.h>

namespace openjet {

constexpr int kTileLayoutRows = 16;  // rows per group: the decode GEMV's tile (a half tile is half a group)

// Bytes a row's unit takes in the tile layout: its own, rounded up to 4 (Q6_K: 210 -> 212, zeros after), so that every
// piece is 4-byte aligned and the Q6_K GEMV takes its aligned form for every unit (with 210-byte pieces rows alternate
// alignment inside a warp, which takes the funnel-shift form throughout: measured slower on the H200, 0ffbe6a).
__host__ __device__ constexpr int tile_pitch(int unit_bytes) { return (unit_bytes + 3) / 4 * 4; }

// Bytes of an n x k matrix of qtype in the tile layout (0 where it has none).
long long tile_layout_bytes(int qtype, int n, int k);

// Whether (qtype, n, k) has a tile layout: a k-quant type the decode GEMV reads, whole units, whole groups.
bool tile_layout_fits(int qtype, int n, int k);

// dst (tile_layout_bytes) = src (n x k of qtype, row layout) in the tile layout, padding zeroed; distinct buffers.
cudaError_t launch_tile_layout(const void* src, void* dst, int qtype, int n, int k, cudaStream_t stream);

}  // namespace openjet
