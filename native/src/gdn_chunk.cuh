// The chunked WY Gated DeltaNet for a prefill call's rows (qwen38.md 3.4; openjet_launcher/reference/gdn.py,
// delta_rule_chunked, is its numpy oracle): the same map as gdn_decode.cuh's token-by-token recurrence, kGdnChunk
// tokens at a time, so a chunk costs a few small matrix products and ~7 barriers instead of one barrier and two
// 128-row reductions per token. Numerics of its own (the sums run in another order): the default prefill form is 2
// (two phases, the state phase's products on tensor cores in one tf32 pass, OPENJET_GDN_STATE_TC: 3xtf32 or 0 the
// FMA form; H200, 2,048 rows at 27B widths: 1,994 us a layer for the recurrence, 635 for form 2, 889 in 3xTF32,
// 1,081 with its FMA state phase; 4,096 rows since 2026-12-04: 989 us for form 2, its state phase on operands
// rounded once, gdn_chunk.cu), 1 (one kernel, form 2's bits with the FMA state phase, 1,832 us) and 0 (the
// recurrence) through OPENJET_GDN_CHUNKED. A call's chunks start at its first row, so a row's bits depend on where
// its call began modulo kGdnChunk: the engine's prefill chunks are multiples of it, and a resumed prompt starts at a
// chunk boundary (CudaEngine.prefill rewinds to one).
#pragma once

#include <cuda_runtime.h>

#include "gdn_decode.cuh"

namespace openjet {

constexpr int kGdnChunk = 32;      // tokens per chunk (C)
constexpr int kGdnChunkCols = 32;  // state columns per block: 4 blocks per value head

// Whether a call takes the chunked form: no fused projections, prefill numerics of its own (not under
// OPENJET_PREFILL_GEMM=exact, whose prefill leaves decode's bits: gemv.cuh, prefill_numerics_own), and form 2 with
// its scratch (every prefill call, however few its rows: a chunk's bits must not depend on its call's length) or
// form 1 on more than kGdnMaxT rows.
bool gdn_chunked(const GdnStepArgs& a);

// OPENJET_GDN_CHUNKED's form (read at each call): 0 off, 1 one kernel (gdn_chunk_kernel), 2 or unset (the default)
// two phases (every chunk's local work at once, then the state; the same bits as 1; needs
// GdnStepArgs::chunk_scratch, which the engine gives prefill calls only, else the recurrence runs).
int gdn_chunked_form();

// Whether a prefill call's GDN takes form 2 here (the switch, prefill numerics of its own, the device's shared
// memory; the caller also gives it scratch): then GdnStepArgs::snap_* can ask it for the state at a chunk boundary.
bool gdn_two_phase_runs();

// Floats of scratch form 2 needs for a call of `rows` rows (~18 K a row at 27B: 148 MB for 2,048 rows).
size_t gdn_chunk_scratch_floats(int n_k, int n_v, int rows);

// The conv, norms, gates and delta rule of a's rows for every value head, its o rows written to a.y (the gated
// RMSNorm is the caller's next launch, as for the column split), a's state and conv state updated. *launched stays
// false where the device's shared memory per block cannot hold a block's working set (the caller then takes the
// recurrence).
cudaError_t launch_gdn_chunk(const GdnStepArgs& a, cudaStream_t stream, bool* launched);

}  // namespace openjet
