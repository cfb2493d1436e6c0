// Prefill GEMM with the weights decoded once per block into shared memory (Q4_K, Q5_K; opt-in for now:
// OPENJET_PREFILL_GEMM=staged). Included by gemv_mma.cuh after the pieces it reuses; NOT yet run on a GPU.
//
// Why: prefill_mma_kernel decodes each unit's A fragments in every warp for only 4 token groups (~9.6 SASS
// instructions per mma; NOTES_gemv.md). Here a block of 8 warps takes 4 tiles (64 rows) x 8 groups (64 tokens):
// per unit the warps first decode the 4 tiles' 16 A fragments per lane (each warp half a tile) into an A stage,
// then every warp runs LDS + mma for its tile (warp % 4) and 4 groups (warp / 4), each A fragment meeting 4
// groups. Each group's operations are unit_mma_k4's in the same order (the same A and B operands per mma, the
// four wd chains, their fold, d and the min term) and the four k quarters are summed apart as in the decode
// kernel, so every output bit equals the decode GEMV's (prefill == decode, as the other prefill kernels).
//
// Pipeline per unit u (one barrier): wait for unit u + 1's copies (raw weights and activations, one cp.async
// group per unit, 3 stages), barrier, issue unit u + 2's copies, decode unit u + 1 into A stage (u + 1) % 2, mma
// unit u from A stage u % 2.
#pragma once

namespace openjet {

constexpr int kStagedWarps = 8;
constexpr int kStagedTiles = 4;                         // 16-row tiles per block
constexpr int kStagedGroups = 8;                        // groups of 8 token rows per block
constexpr int kStagedWarpGroups = kStagedGroups * kStagedTiles / kStagedWarps;  // groups per warp: 4
constexpr int kStagedCopyStages = 3;                    // raw weights + activations
constexpr int kStagedSteps = 16;                        // A fragments per unit and lane: (hv, nb, wd)
constexpr int kStagedSlots = kStagedSteps + 2;          // + the min term's A and the rows' d, dmin * 32

template <int QT> struct StagedShape {
    using S = MmaShape<QT>;
    static constexpr int kRawStageWords = kStagedTiles * S::kStageWords;      // uint4
    static constexpr int kBStageHalves = kStagedGroups * kBGroupHalves;
    static constexpr int kAStageWords = kStagedTiles * kStagedSlots * 32;    // uint4
    static constexpr int kRawBytes = kStagedCopyStages * kRawStageWords * 16;
    static constexpr int kBBytes = kStagedCopyStages * kBStageHalves * 2;
    static constexpr int kABytes = 2 * kAStageWords * 16;
    static constexpr int kSmemBytes = kRawBytes + kABytes + kBBytes;
};

// Unit u's A fragments of tile `tile` for scale word hv (the 8 steps (hv, nb, wd)), and with hv = 0 also the
// min term's A and the rows' d, dm32, from the raw rows r[0], r[1] (g, g + 8) into the A stage: exactly the
// values unit_mma_k4 builds in registers.
template <int QT>
__device__ __forceinline__ void staged_decode(const uint8_t* const r[2], int hv, int tq, uint4* a_tile, int lane) {
    constexpr int kQs = QT == kQ4_K ? 16 : 48;
    const K4Header hdr[2] = {K4Header(r[0]), K4Header(r[1])};
    if (hv == 0) {
        uint32_t m[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) m[i] = h2_of_bytes((tq >> 1) ? hdr[i].mn[1] : hdr[i].mn[0], 2 * (tq & 1));
        a_tile[kStagedSteps * 32 + lane] = make_uint4(m[0], m[1], m[0], m[1]);
        a_tile[(kStagedSteps + 1) * 32 + lane] =
            make_uint4(__float_as_uint(hdr[0].d), __float_as_uint(hdr[1].d), __float_as_uint(hdr[0].dm32),
                       __float_as_uint(hdr[1].dm32));
    }
    uint4 qh[2];
    if constexpr (QT == kQ5_K) {
#pragma unroll
        for (int i = 0; i < 2; ++i) qh[i] = *reinterpret_cast<const uint4*>(r[i] + 16 + 16 * (tq & 1));
    }
    const int jj = (tq >> 1) + 2 * hv;
    uint4 q[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) q[i] = *reinterpret_cast<const uint4*>(r[i] + kQs + 16 * (tq + 4 * hv));
#pragma unroll
    for (int nb = 0; nb < 2; ++nb) {
        uint32_t sc2[2], nsc2[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const uint32_t sc = hv ? hdr[i].sc[1] : hdr[i].sc[0];  // hv is not a constant here: no array index
            if (nb) k4_scale_pair<1>(sc, tq, sc2[i], nsc2[i]);
            else k4_scale_pair<0>(sc, tq, sc2[i], nsc2[i]);
        }
#pragma unroll
        for (int wd = 0; wd < 4; ++wd) {
            uint32_t a[4];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const uint32_t w = (&q[i].x)[wd], hb = QT == kQ5_K ? (&qh[i].x)[wd] >> (2 * jj + nb) : 0u;
                if (nb) k4_a_regs<QT, 1>(w, hb, sc2[i], nsc2[i], a[i], a[2 + i]);
                else k4_a_regs<QT, 0>(w, hb, sc2[i], nsc2[i], a[i], a[2 + i]);
            }
            a_tile[(8 * hv + 4 * nb + wd) * 32 + lane] = make_uint4(a[0], a[1], a[2], a[3]);
        }
    }
}

// acc[j] += unit_mma_k4's result for group j, from the A stage of this warp's tile and the B stage.
__device__ __forceinline__ void staged_mma(const uint4* a_tile, const __half* b, const int (&bcol)[kStagedWarpGroups],
                                           const int (&bsum)[kStagedWarpGroups], int tq, int lane,
                                           float (&acc)[kStagedWarpGroups][4]) {
    constexpr int NG = kStagedWarpGroups;
    float mins[NG][4] = {};
    const uint4 mv = a_tile[kStagedSteps * 32 + lane], dv = a_tile[(kStagedSteps + 1) * 32 + lane];
    {
        const uint32_t a[4] = {mv.x, mv.y, mv.z, mv.w};
#pragma unroll
        for (int j = 0; j < NG; ++j) {
            uint32_t bb[2];
            load_b<true>(b + bsum[j], 4 * tq, bb);
            mma_16816(mins[j], a, bb);
        }
    }
    const float d[2] = {__uint_as_float(dv.x), __uint_as_float(dv.y)};
    const float dm32[2] = {__uint_as_float(dv.z), __uint_as_float(dv.w)};
    float u[NG][4][4] = {};
#pragma unroll
    for (int hv = 0; hv < 2; ++hv)
#pragma unroll
        for (int nb = 0; nb < 2; ++nb) {
            const int e0 = 64 * (tq >> 1) + 16 * (tq & 1) + 128 * hv + 32 * nb;
#pragma unroll
            for (int wd = 0; wd < 4; ++wd) {
                const uint4 av = a_tile[(8 * hv + 4 * nb + wd) * 32 + lane];
                const uint32_t a[4] = {av.x, av.y, av.z, av.w};
#pragma unroll
                for (int j = 0; j < NG; ++j) {
                    uint32_t bb[2];
                    load_b<true>(b + bcol[j], e0 + 4 * wd, bb);
                    mma_16816(u[j][wd], a, bb);
                }
            }
        }
#pragma unroll
    for (int j = 0; j < NG; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const float uc = __fadd_rn(__fadd_rn(u[j][0][c], u[j][1][c]), __fadd_rn(u[j][2][c], u[j][3][c]));
            acc[j][c] = __fmaf_rn(d[c >> 1], uc, __fmaf_rn(-dm32[c >> 1], mins[j][c], acc[j][c]));
        }
}

template <int QT>
__global__ void __launch_bounds__(kStagedWarps * 32, 1)
prefill_staged_kernel(const uint8_t* __restrict__ w, long long row_bytes, int n, int k, ActPack x, int t,
                      int blocks_per_rows, float* __restrict__ y) {
    using S = MmaShape<QT>;
    using P = StagedShape<QT>;
    extern __shared__ uint4 smem[];
    pdl_start();  // pdl.cuh (its first copies include activations)
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const int tile = warp % kStagedTiles, half = warp / kStagedTiles;  // mma: tile x groups of `half`; decode: hv
    const int grp0 = blockIdx.x % blocks_per_rows * kStagedGroups;
    const int block_row0 = blockIdx.x / blocks_per_rows * kStagedTiles * kMmaRows;
    const int row0 = block_row0 + tile * kMmaRows;
    const int nu = k / kUnitElems;
    uint4* raw = smem;                                                          // [3][4 tiles][kStageWords]
    uint4* astage = smem + kStagedCopyStages * P::kRawStageWords;               // [2][4 tiles][18][32]
    __half* bsm = reinterpret_cast<__half*>(astage + 2 * P::kAStageWords);      // [3][8 groups]
    const uintptr_t tile0 = reinterpret_cast<uintptr_t>(w) + static_cast<long long>(row0) * row_bytes;
    const TileCopy<QT> copy(row_bytes, n, row0, lane);  // warps of half 0 copy their tile's weights
    const ActCopy<kStagedGroups, kStagedWarps * 32> act(k, t, grp0);

    auto issue = [&](int u) {
        if (u < nu) {
            const int s = u % kStagedCopyStages;
            if (half == 0) copy.issue(tile0 + u * S::kUnitBytes, raw + s * P::kRawStageWords + tile * S::kStageWords, lane);
            act.issue(x, u, bsm + s * P::kBStageHalves);
        }
        cp_async_commit();
    };
    auto decode = [&](int u) {  // unit u's A stage: this warp decodes scale word `half` of its tile
        if (u >= nu) return;
        const int s = u % kStagedCopyStages;
        const uint8_t* r[2];
        tile_unit_rows<QT>(raw + s * P::kRawStageWords + tile * S::kStageWords, tile0 + u * S::kUnitBytes, row_bytes,
                           g, r);
        staged_decode<QT>(r, half, tq, astage + (u & 1) * P::kAStageWords + tile * kStagedSlots * 32, lane);
    };

    // This lane's token row of its group j (groups 4 half + j of the block) in a B stage: past t, row t - 1.
    int bcol[kStagedWarpGroups], bsum[kStagedWarpGroups];
#pragma unroll
    for (int j = 0; j < kStagedWarpGroups; ++j) {
        const int gj = half * kStagedWarpGroups + j;
        const int row = min((grp0 + gj) * kActRows + g, t - 1) - grp0 * kActRows;
        const int grp = row / kActRows, rr = row % kActRows;
        bcol[j] = grp * kBGroupHalves + rr * kBRowHalves;
        bsum[j] = grp * kBGroupHalves + kActRows * kBRowHalves + rr * 16;
    }

    issue(0);
    issue(1);
    cp_async_wait<1>();
    __syncthreads();
    decode(0);
    float total[kStagedWarpGroups][4] = {};
    int u = 0;
#pragma unroll 1
    for (int q = 0; q < kGemvWarps; ++q) {  // the decode kernel's k quarters, each summed from zero
        float acc[kStagedWarpGroups][4] = {};
        for (const int u1 = nu * (q + 1) / kGemvWarps; u < u1; ++u) {
            cp_async_wait<0>();  // unit u + 1's copies (u's landed one iteration earlier)
            __syncthreads();     // ... from every thread; unit u's A stage written; stage u - 1 free
            issue(u + 2);
            decode(u + 1);
            staged_mma(astage + (u & 1) * P::kAStageWords + tile * kStagedSlots * 32,
                       bsm + (u % kStagedCopyStages) * P::kBStageHalves, bcol, bsum, tq, lane, acc);
        }
#pragma unroll
        for (int j = 0; j < kStagedWarpGroups; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) total[j][c] = q == 0 ? acc[j][c] : __fadd_rn(total[j][c], acc[j][c]);
    }
    cp_async_wait<0>();
#pragma unroll
    for (int j = 0; j < kStagedWarpGroups; ++j) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int row = row0 + g + 8 * (c >> 1);
            const int col = (grp0 + half * kStagedWarpGroups + j) * kActRows + 2 * tq + (c & 1);
            if (row < n && col < t) y[static_cast<long long>(col) * n + row] = __fmul_rn(total[j][c], x.inv[col]);
        }
    }
}

// The staged kernel for Q4_K / Q5_K where its shared memory fits a block (sm_90/100: ~210 KB); *launched stays
// false otherwise (the caller takes another kernel).
template <int QT>
cudaError_t launch_prefill_staged(const GemvArgs& a, cudaStream_t stream, bool* launched) {
    *launched = false;
    if constexpr (QT != kQ4_K && QT != kQ5_K) {
        return cudaSuccess;
    } else {
        using P = StagedShape<QT>;
        int optin = 0;
        if (const cudaError_t e = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, &optin); e != cudaSuccess)
            return e;
        if (P::kSmemBytes > optin) return cudaSuccess;
        const long long row_bytes = static_cast<long long>(a.k / Block<QT>::kElems) * Block<QT>::kBytes;
        if (!tile_offsets_fit(row_bytes)) return cudaErrorInvalidValue;
        if (static_cast<long long>(a.t) * a.k > 0x7fffffffLL) return cudaSuccess;  // ActCopy's int offsets
        const int groups = (a.t + kActRows - 1) / kActRows, per_rows = (groups + kStagedGroups - 1) / kStagedGroups;
        const long long row_blocks = (a.n + kStagedTiles * kMmaRows - 1) / (kStagedTiles * kMmaRows);
        if (row_blocks * per_rows > 0x7fffffffLL) return cudaErrorInvalidValue;
        auto kernel = prefill_staged_kernel<QT>;
        static const cudaError_t opted =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, P::kSmemBytes);
        if (opted != cudaSuccess) return opted;
        *launched = true;
        return launch_kernel(kernel, static_cast<unsigned>(row_blocks * per_rows), kStagedWarps * 32, P::kSmemBytes,
                             stream, static_cast<const uint8_t*>(a.w), row_bytes, a.n, a.k, a.x, a.t, per_rows, a.y);
    }
}

}  // namespace openjet
