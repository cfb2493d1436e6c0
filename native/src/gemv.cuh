// The decode GEMV family: y[t, n] = sum_k W[n, k] * x[t, k] for t <= 8 token rows sharing one read of W;
// prefill passes up to 2048 rows (a chunk), computed as groups of 8 whose blocks run next to each other so that W comes
// from L2 after the first group (a GEMM whose every group does exactly a decode step's arithmetic).
// k-quant W (Q4_K, Q5_K, Q6_K, Q8_0) stays in its GGUF blocks and meets fp16 activations (act_pack.cuh) on
// tensor cores (gemv_mma.cuh); F32 W (the small ssm_alpha / ssm_beta projections) reads float activations.
// The arithmetic of an output row never depends on t or on the GPU: row r of a t-row call is bit-identical
// to a 1-row call on the same x row, on any SM count (speculative decoding relies on it, and prefill leaves
// bit for bit the state that decoding its tokens one by one would under OPENJET_PREFILL_GEMM=exact; by default
// a prefill's Q4_K/Q5_K/Q6_K rows take prefill_gemm.cuh's numerics instead).
#pragma once

#include <cuda_runtime.h>

#include "act_pack.cuh"

namespace openjet {

constexpr int kGemvMaxT = kActMaxRows;  // token rows per call (decode: 1 + drafts <= 8; prefill: a chunk)
constexpr int kGemvUnit = 256;       // k of a k-quant GEMV is a multiple of this (one super-block)

struct GemvArgs {
    int qtype;        // GGML type id (kquant.cuh)
    const void* w;    // n rows of k elements in GGUF blocks, 16-byte aligned, readable 16 bytes past the end
    int n, k, t;      // t <= x.rows (k-quant) or <= kGemvMaxT (F32)
    ActPack x;        // k-quant W
    const float* xf;  // [t, k] float activations (F32 W)
    float* y;         // [t, n]
    bool prefill = false;  // rows of a prefill chunk (t <= 8 too): the fast prefill GEMM takes them all
    __half* dense = nullptr;  // OPENJET_PREFILL_GEMM=dense: n k halves of scratch for W as fp16 (prefill_gemm.cuh)
    bool tiled = false;       // w in the tile layout (weight_layout.cuh; the engine's default for k-quant W)
    // W as the dense path's fp16 rows, kept on the device (the engine's OPENJET_PREFILL_F16_WEIGHTS), ld16 halves
    // from one row to the next, or null: a prefill call on the dense path then multiplies them without dequantising.
    const __half* w16 = nullptr;
    long long ld16 = 0;
    // The FFN's gate kept with its up (w16 interleaved, ld16 = 2k) in the pack's order of their outputs, with the
    // largest row norms of gate and up (two floats: launch_gate_up_pack_order), or null: launch_ffn_gate_up_pack's
    // fp16 form multiplies such rows only.
    const float* w16_norms = nullptr;
    // y += W x instead of y = W x: y holds the residual stream, added to in the GEMM's epilogue. Only a prefill call
    // that the dense GEMM multiplies takes it (prefill_gemm_adds); launch_gemv refuses it anywhere else.
    bool add_to_y = false;
    // Scratch for the integer GEMV's pack (gemv_imma.cuh; act_pack_imma_bytes(kActRows, k) bytes, 16-byte aligned),
    // or null. Set: a decode call (not prefill, t <= 8) of a type that GEMV reads (Q4_K, Q6_K) runs on it, its pack
    // made from x first (launch_pack_act_imma_from_half), every t the same way: the engine's OPENJET_GEMV_INT sets it
    // per weight type.
    void* xi = nullptr;
    // A decode call on the producer-warp GEMV where it runs (gemv_tma.cuh; the engine's OPENJET_GEMV_TMA), with the
    // cp.async kernels' bits: 0 no, -1 its default form for t, 1 .. kGemvTmaForms one form. Its grid of resident blocks is sized
    // for at most grid_sms SMs (0: all of them; the engine's OPENJET_PERSISTENT_SMS, a smaller GPU emulated).
    int tma = 0;
    int grid_sms = 0;
};

// The launch shape for (qtype, n, k) and one group of 8 token rows: rows per block, warps per block, blocks
// (a t-row call launches ceil(t / 8) times as many). Invalid shapes:
// cudaErrorInvalidValue (k must be a multiple of 256 for the k-quants, of 4 for F32).
cudaError_t gemv_launch_shape(int qtype, int n, int k, int* rows_per_block, int* warps_per_block, int* blocks);

cudaError_t launch_gemv(const GemvArgs& a, cudaStream_t stream);

// a and b (two projections of the same activations, e.g. FFN gate and up) in one launch where they can share
// it: the same k-quant type, k, t <= 8 and pack, or two F32 matrices of one shape over the same float x (a GDN
// layer's beta and alpha: a prefill's rows of both in one launch of prefill_f32.cu's GEMM where prefill_f32_own(),
// whatever OPENJET_GEMV_PAIRS says). Every output row gets the bits launch_gemv gives it; b's blocks fill the SMs
// a's last wave leaves idle, and one launch is saved. Otherwise (or OPENJET_GEMV_PAIRS=0 in the environment at the
// first call) two launch_gemv calls.
cudaError_t launch_gemv_pair(const GemvArgs& a, const GemvArgs& b, cudaStream_t stream);

// Decode calls in 16-row or 8-row ("half") tiles: the same bits, a different speed. By default (auto) half tiles
// where they fit one wave of the GPU and help there (gemv_mma.cuh, decode_half_tiles: Q6_K and small grids; the
// 27B's T=1 step 10.69 -> 10.27 ms on the H200, bench/results/engine-full-h200-13e6b67-half-auto.json);
// OPENJET_GEMV_HALF in the environment at the first call: 0 always 16-row tiles, 1 always half tiles.
enum class GemvHalfTiles { kAuto, kNever, kAlways };  // this order: openjet_test_set_gemv_half's 0, 1, 2
GemvHalfTiles gemv_half_tiles();
// Tests and benchmarks compare the shapes in one process: a GemvHalfTiles value, or -1 for the environment's
// choice again.
void set_gemv_half_tiles(int mode);

// Whether a prefill takes numerics of its own (OPENJET_PREFILL_GEMM unset or "fast", read at each call): then the
// prefill's other forms of its own (the single-fp16 attention, OPENJET_PREFILL_ATTN; the opt-in chunked GDN,
// OPENJET_GDN_CHUNKED) apply too; under "exact" a prefill leaves decode's bits and none of them does.
bool prefill_numerics_own();

// prefill_f32.cu: the F32 projections of a prefill with numerics of their own, a and b (where given: the same n, k, t
// and x) in one launch; launch_gemv takes them for a prefill's rows where prefill_f32_own(): OPENJET_PREFILL_F32 unset
// or tf32x3 (read at each call; rows: decode's kernels) and the prefill's own numerics (prefill_numerics_own).
// Takes calls with k % 64 == 0 and 16-byte aligned w and xf.
bool prefill_f32_own();

// Whether a call with GemvArgs::add_to_y (y += W x) is taken: OPENJET_PREFILL_RESIDUAL unset or 1 (the default; read at
// each call; 0: never) and a prefill call that the dense GEMM multiplies
// (OPENJET_PREFILL_GEMM dense, scratch given, prefill_gemm.cuh's kDenseMinRows rows or more, a type and shape it
// takes). The engine then adds a mixer's or the FFN's output projection to the residual stream in the GEMM's
// epilogue (launch_dense_gemm_add: the same bits as the next add-norm's h + delta), the delta neither written nor
// read back.
bool prefill_gemm_adds(const GemvArgs& a);
bool prefill_f32_takes(const GemvArgs& a);
// The W rows a block of OPENJET_PREFILL_F32=tf32x3 takes for a call of t rows x n (of `matrices` matrices) on a GPU
// of `sms` multiprocessors whose blocks may opt in to `optin` bytes of shared memory: 48 or 16 (the same bits).
int prefill_f32_block_rows(int t, int n, int matrices, int sms, int optin);
cudaError_t launch_prefill_f32(const GemvArgs& a, const GemvArgs* b, cudaStream_t stream);

// Whether OPENJET_PREFILL_GEMM=dense (read at each call): prefill calls given scratch dequantise and multiply densely.
bool prefill_gemm_dense();

// One k-quant weight type (gemv_mma_<type>.cu: the types compile in parallel).
template <int QT> cudaError_t launch_gemv_mma(const GemvArgs& a, cudaStream_t stream);
template <int QT> cudaError_t launch_gemv_mma_pair(const GemvArgs& a, const GemvArgs& b, cudaStream_t stream);

// One float4 chunk into a chain: s + a.x b.x + a.y b.y + a.z b.z + a.w b.w, in that order.
__device__ __forceinline__ float f32_fma4(const float4& a, const float4& b, float s) {
    s = __fmaf_rn(a.x, b.x, s);
    s = __fmaf_rn(a.y, b.y, s);
    s = __fmaf_rn(a.z, b.z, s);
    return __fmaf_rn(a.w, b.w, s);
}

// The F32 projection's order (gemv.cu; the GDN step's fused beta/alpha too): thread i of 128 fma-chains float4
// i, i + 128, ... of the row with each of the T token rows (x, y, z, w in turn); the 128 parts are then summed
// lanes first (f32_warp_sum), then the four warps as ((w0 + w1) + w2) + w3. k % 4 == 0, rows 16-byte aligned.
// kUnroll: how far the loop over j is unrolled (0: 4; the order of the sums is the same whatever it is).
template <int T, int kUnroll = 0>
__device__ __forceinline__ void f32_dot_lanes(const float* __restrict__ w_row, const float* __restrict__ x, int k,
                                              int i, float (&acc)[T]) {
    const float4* wr = reinterpret_cast<const float4*>(w_row);
#pragma unroll
    for (int t = 0; t < T; ++t) acc[t] = 0.0f;
#pragma unroll(kUnroll > 0 ? kUnroll : 4)
    for (int j = i; j < k / 4; j += 128) {
        const float4 a = wr[j];
#pragma unroll
        for (int t = 0; t < T; ++t) {
            const float4 b = __ldg(reinterpret_cast<const float4*>(x + static_cast<long long>(t) * k) + j);
            acc[t] = f32_fma4(a, b, acc[t]);
        }
    }
}

__device__ __forceinline__ float f32_warp_sum(float v) {
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

// The four warps' f32_warp_sum results, in the F32 projection's order.
__device__ __forceinline__ float f32_warps_total(float w0, float w1, float w2, float w3) {
    return ((w0 + w1) + w2) + w3;
}

}  // namespace openjet
