// Small row ops of the decode step that sit between the GEMVs, each fused with the activation packing that
// the next GEMV needs (act_pack.cuh's format and arithmetic, bit for bit):
//   add_norm_pack: h += delta; a = rms(h) * w; (a written as float when asked); a -> the pack.
//   swiglu_pack:   a = silu(gate) * up -> the pack (the ffn_down input).
// One block of kPackThreads per token row, in a fixed order (the add, the squares of row_rms_scale, the
// packer's max and sums), so each row's arithmetic depends on that row alone: T rows give the bits of T
// one-row calls.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "act_pack.cuh"
#include "rmsnorm.cuh"

namespace openjet {

// silu(g) * u with the reference's steps: g * (1 / (1 + e^-g)), then * u.
__device__ __forceinline__ float swiglu1(float g, float u) {
    return __fmul_rn(__fmul_rn(g, __frcp_rn(__fadd_rn(1.0f, expf(-g)))), u);
}

// Rows add_norm_pack stages in shared memory (2 k floats within the 48 KiB a launch gets without opting in, beside
// the packer's and row_rms_scale's own 160 bytes): the 27B's 5,120.
constexpr int kAddNormStagedMax = 6016;

// Row `row` of add_norm_pack by the calling block of kThreads threads (its launch below: one block per row;
// ffn_persistent.cu: 512). kStaged (k <= kAddNormStagedMax): the summed row and the norm weights are staged in
// `staged` (2 k floats of shared memory) as they are written, so the sum of squares and the pack read them there
// instead of from L2 again (two round trips fewer per call, ~129 calls per 27B decode step); the same operations
// in the same order, so the same bits. kStageW false: the row alone (k floats; the weights from L1, where a prefill's
// thousands of blocks find them: more blocks per SM).
template <bool kStaged, int kThreads = kPackThreads, int kCached = kPackCached, bool kStageW = true>
__device__ __forceinline__ void add_norm_pack_row(float* __restrict__ h, const float* __restrict__ delta,
                                                  const float* __restrict__ w, int k, float eps,
                                                  float* __restrict__ a_out, const ActPack& p, int row,
                                                  float* staged) {
    float* hr = h + static_cast<long long>(row) * k;
    const float* dr = delta ? delta + static_cast<long long>(row) * k : nullptr;
    const float *xr = hr, *wr = w;  // where the norm and the pack read the row and the weights
    if constexpr (kStaged) {
        float* sh = staged;
        float* sw = staged + k;
#pragma unroll 4
        for (int i = threadIdx.x; i < k; i += kThreads) {
            const float x = dr ? __fadd_rn(hr[i], dr[i]) : hr[i];
            if (dr) hr[i] = x;
            sh[i] = x;
            if constexpr (kStageW) sw[i] = w[i];
        }
        xr = sh;
        if constexpr (kStageW) wr = sw;
    } else if (dr) {
#pragma unroll 4
        for (int i = threadIdx.x; i < k; i += kThreads) hr[i] = __fadd_rn(hr[i], dr[i]);
    }
    __syncthreads();
    const float scale = row_rms_scale(xr, k, eps);
    pack_act_row<kThreads, kCached>([&](int i) { return __fmul_rn(__fmul_rn(xr[i], scale), wr[i]); }, k, p, row,
                                    a_out ? a_out + static_cast<long long>(row) * k : nullptr);
}

// Row `row` of swiglu_pack by the calling block of kThreads threads; rows ld floats apart (0: k).
template <int kThreads = kPackThreads, int kCached = kPackCached>
__device__ __forceinline__ void swiglu_pack_row(const float* __restrict__ gate, const float* __restrict__ up, int k,
                                                const ActPack& p, int row, long long ld = 0) {
    const float* g = gate + static_cast<long long>(row) * (ld ? ld : k);
    const float* u = up + static_cast<long long>(row) * (ld ? ld : k);
    pack_act_row<kThreads, kCached>([&](int i) { return swiglu1(g[i], u[i]); }, k, p, row);
}

// h [t, k] += delta (nullptr: no add); a = rms(h) * w -> a_out [t, k] (nullptr: not written) and the pack.
// OPENJET_ADD_NORM_MAX_EST (on unless "0": the same bits; elementwise.cu add_norm_pack_cluster_kernel) is read at
// the first call; set_add_norm_max_est (tests) sets it: 0 or 1, or -1 to read the environment again at the next call.
void set_add_norm_max_est(int mode);
cudaError_t launch_add_norm_pack(float* h, const float* delta, const float* w, int t, int k, float eps,
                                 float* a_out, const ActPack& p, cudaStream_t stream);

// The MTP head's input pack for t <= OPENJET_ENGINE_MAX_T rows in one launch (a cluster a row): row r of the pack of
// 2 dim = [rmsnorm(embedding of ids[r]) * enorm | rmsnorm(hidden r) * hnorm], hidden row 0 at hs0, rows 1.. at hs1
// [t - 1, dim]; the bits of launch_embed, launch_rmsnorm on each half and launch_pack_act (elementwise.cu). Where the
// table is not Q4_K, t > OPENJET_ENGINE_MAX_T, OPENJET_PACK_CLUSTER is below 2 (0 or 1), or the GPU or its build has
// no clusters or 2 dim does not fit them: cudaErrorNotSupported and nothing launched (the caller launches those four).
cudaError_t launch_mtp_input_pack(int qtype, const void* table, int vocab, const int32_t* ids, const float* hs0,
                                  const float* hs1, const float* enorm, const float* hnorm, int t, int dim, float eps,
                                  const ActPack& p, cudaStream_t stream);

// launch_pack_act's decode rows without a norm (t <= OPENJET_ENGINE_MAX_T) on clusters of blocks, the bits of its
// one-block kernel, where OPENJET_PACK_CLUSTER allows (unset or 2: the mixers' output packs too) and the GPU and k do;
// otherwise cudaErrorNotSupported and nothing launched (launch_pack_act then launches its own kernel).
cudaError_t launch_pack_act_cluster(const float* x, int t, int k, const ActPack& p, cudaStream_t stream);

// Whether a decode step's packs of rows of k all run on the cluster kernels, the only makers that also write a pack's
// integer twin (ActPack::imma; the others refuse a pack that has one): OPENJET_PACK_CLUSTER unset or 2, sm_90+, k fits.
bool pack_cluster_writes_imma(int k);

// OPENJET_PREFILL_SWIGLU (read at each call): where a prefill's swiglu values are made. Unset or `epilogue`: by the
// dense gate-and-up GEMM's epilogue where that GEMM runs: as fp16 under a bound's row scale where the engine keeps the
// fp16 rows (prefill_gemm.cuh, launch_ffn_gate_up_pack's fp16 form: numerics of its own), else as `epilogue-f32`;
// `epilogue-f32`: fp32 values (launch_dense_gemm_swiglu), then launch_pack_rows_streamed, else as `split`; `split`: two
// streaming passes over the GEMM's [t, 2k] output (elementwise.cu); `rows`: the one-pass kernel that keeps a row in
// registers. The same bits every way but the fp16 form.
enum class PrefillSwiglu { kEpilogue, kEpilogueF32, kSplit, kRows };
PrefillSwiglu prefill_swiglu();

// The pack of v [t, k] (rows k floats apart; v 16-byte aligned, else cudaErrorInvalidValue) for a prefill's rows: a
// pass over each row for its maximum, then the pack from a second read (L2) of it. launch_pack_act's bits, without its
// rows in registers (a 17,408-element row at 512 threads: two rows an SM).
// scales (given): each row's power-of-two scale instead of its maximum's (prefill_gemm.cuh's bounded form).
cudaError_t launch_pack_rows_streamed(const float* v, int t, int k, const ActPack& p, cudaStream_t stream,
                                      const float* scales = nullptr);

// The pack <- silu(gate) * up, rows [t, k], ld floats apart in gate and up (0: k; the prefill's gate and up as the
// halves of one GEMM's [t, 2k] output: 2k). Both are scratch: a prefill's rows (t > OPENJET_ENGINE_MAX_T) leave
// silu(gate) * up in gate and partial maxima in up (elementwise.cu, OPENJET_PREFILL_SWIGLU).
cudaError_t launch_swiglu_pack(float* gate, float* up, int t, int k, const ActPack& p, cudaStream_t stream,
                               long long ld = 0);

}  // namespace openjet
