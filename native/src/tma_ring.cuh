// A block's weight rings fed by one producer thread's bulk copies (sm_90a): the two halves of the producer-warp decode
// GEMV (gemv_tma.cu) as device functions, shared with the persistent FFN's producer-warp form (ffn_persistent.cu),
// which streams its projections' tiles the same way, with UnitMma's arithmetic in the same order: the same bits.
//
// Block: kTmaConsumerWarps consumer warps, then one producer warp (only its lane 0 copies). Consumer warp q owns a ring
// of kRing slots of kSlot bytes; a slot holds one unit of a 16-row tile in the tile layout (weight_layout.cuh: 16 rows
// of tile_pitch bytes, contiguous, so one bulk copy), and has a "full" barrier (the producer's arrival with the bytes
// it expects) and an "empty" one (the consumer warp's lane 0). Both sides walk the same tiles in the same order and
// count their own units, so neither shares an index with the other.
#pragma once

#include <cstdint>

#include "gemv_mma.cuh"
#include "mbarrier.cuh"
#include "weight_layout.cuh"

namespace openjet {

constexpr int kTmaConsumerWarps = kGemvWarps;
constexpr int kTmaThreads = (kTmaConsumerWarps + 1) * 32;

// A unit of a 16-row tile of type QT in the tile layout: its rows' pitch and its bytes (one bulk copy).
template <int QT> struct TmaUnit {
    static constexpr int kPitch = tile_pitch(unit_bytes_of<QT>());
    static_assert(kPitch % 4 == 0, "rows of a slot 4-byte aligned (the Q6_K unit's aligned form)");
    static constexpr int kChunk = kTileLayoutRows * kPitch;
    static_assert(kChunk % 16 == 0, "bulk copies move 16-byte multiples");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// The block's barriers, full[q][slot] then empty[q][slot] (8 bytes each) from shared address `base`.
template <int kRing> struct TmaBars {
    uint32_t base;
    static constexpr uint32_t kEmpty = kTmaConsumerWarps * kRing * 8;  // from a full barrier to its empty one
    static constexpr int kBytes = 2 * kEmpty;
    __device__ __forceinline__ uint32_t full(int q, int slot) const { return base + 8 * (q * kRing + slot); }
    __device__ __forceinline__ uint32_t empty(int q, int slot) const { return full(q, slot) + kEmpty; }
    // Threads 0 .. 4 kRing - 1 initialise them (the caller then fences with mbar_init_fence and syncs the block).
    __device__ __forceinline__ void init() const {
        if (threadIdx.x < kTmaConsumerWarps * kRing) {
            const int q = threadIdx.x / kRing, slot = threadIdx.x % kRing;
            mbar_init(full(q, slot), 1);   // the producer's arrival (with the bytes it expects)
            mbar_init(empty(q, slot), 1);  // the consumer warp's lane 0
        }
    }
};

// The producer's part of one tile: its nu units of type QT, contiguous from unit0, into the rings (slot q kRing + s at
// ring0 + (q kRing + s) kSlot), quarter q's units to warp q, round-robin over the warps so that each ring fills as its
// warp drains it. issued[q]: units warp q's ring has taken so far (their count gives the slot and its phase).
template <int QT, int kRing, int kSlot>
__device__ __forceinline__ void tma_produce_tile(const TmaBars<kRing>& bars, uint32_t ring0, const uint8_t* unit0,
                                                 int nu, int (&issued)[kTmaConsumerWarps], uint64_t policy) {
    constexpr int kChunk = TmaUnit<QT>::kChunk;
    static_assert(kChunk <= kSlot, "a unit fits its slot");
    const int per_quarter = (nu + kTmaConsumerWarps - 1) / kTmaConsumerWarps;
    for (int j = 0; j < per_quarter; ++j) {
#pragma unroll
        for (int q = 0; q < kTmaConsumerWarps; ++q) {
            const int u = quarter_begin(nu, q) + j;
            if (u >= quarter_begin(nu, q + 1)) continue;
            const int slot = issued[q] % kRing;
            mbar_wait(bars.empty(q, slot), ((issued[q] / kRing) & 1) ^ 1);  // a fresh slot passes at once
            mbar_arrive_expect_tx(bars.full(q, slot), kChunk);
            bulk_copy_g2s(ring0 + (q * kRing + slot) * kSlot, unit0 + static_cast<long long>(u) * kChunk, kChunk,
                          bars.full(q, slot), policy);
            ++issued[q];
        }
    }
}

// A consumer warp's hand-back of ring slot `slot` (full0: the full barrier of its slot 0) once every lane has read it,
// then its next slot (and phase, on the ring's wrap). kFence: after a proxy fence (fence_proxy_async, mbarrier.cuh),
// since the slot's reads were plain loads and the producer refills it with a bulk copy, which could otherwise land
// under them; a consumer that read nothing (a measurement) needs none.
template <int kRing, bool kFence = true>
__device__ __forceinline__ void tma_release_slot(uint32_t full0, int lane, int& slot, uint32_t& phase) {
    if constexpr (kFence) fence_proxy_async();
    __syncwarp();
    if (lane == 0) mbar_arrive(full0 + TmaBars<kRing>::kEmpty + 8 * slot);  // every lane's reads of the slot are done
    if (++slot == kRing) slot = 0, phase ^= 1;
}

// A consumer warp's units [u0, u1) of one tile of type QT, from its ring (ring_w: its slot 0; full0: the full barrier
// of its slot 0, the next slot's 8 bytes on, its empty one kEmpty bytes on), into acc with UnitMma. xh, xs: the lane's
// activation column and pack sums at unit 0 (UnitX; in shared memory where kSmemX: the fold's own pack, gemv_tma.cu);
// g = lane / 4, tq = lane % 4. slot, phase: the warp's place in its ring, counted as it goes (no division per unit);
// it waits on a vote (mbar_wait_warp: the loads after it keep their uniform registers) and hands each slot back with
// tma_release_slot. (Slots handed back in pairs, one fence for two units, were slower: H100, 9034fa6, T=1 8.12 / 8.14
// ms against 8.01 / 8.06, T=5 10.50 / 10.51 against 10.34 / 10.48; a held slot leaves 3 of 4 units in flight.)
// kNoMath (a measurement with WRONG outputs, OPENJET_BENCH_GEMV_NO_MATH): the units are waited for and handed back,
// never computed.
template <int QT, int kRing, int kSlot, bool kSmemX = false, bool kNoMath = false>
__device__ __forceinline__ void tma_consume_units(uint32_t full0, const uint8_t* ring_w, int u0, int u1,
                                                  const __half* xh, const __half* xs, int lane, int g, int tq,
                                                  int& slot, uint32_t& phase, float (&acc)[1][4]) {
    constexpr int kPitch = TmaUnit<QT>::kPitch;
    for (int u = u0; u < u1; ++u) {
        mbar_wait_warp(full0 + 8 * slot, phase);
        const uint8_t* stage = ring_w + slot * kSlot;
        const uint8_t* r[2] = {stage + g * kPitch, stage + (g + 8) * kPitch};
        UnitX ux[1];
        ux[0].col = xh + u * kUnitElems;
        ux[0].sum = xs + u * 16;
        if constexpr (!kNoMath) {  // (the measurement hands the unit back uncomputed)
            if constexpr (QT == kQ6_K)  // every row of a ring slot is 4-byte aligned (tile_pitch): no vote on it
                unit_mma_q6_k<true, 1, kSmemX, 2>(r, ux, tq, acc);
            else
                UnitMma<QT, 1, kSmemX>::run(r, ux, tq, acc);
        }
        tma_release_slot<kRing, !kNoMath>(full0, lane, slot, phase);
    }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace openjet
