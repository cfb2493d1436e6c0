// launch_gdn_chunk (gdn_chunk.cuh): one block per value head and kGdnChunkCols state columns walks the call's rows
// in chunks of C = kGdnChunk tokens. Per chunk, with q̂, k̂ the chunk's normalised rows, γ the cumulative log
// decays inside the chunk (Γ = γ of its last token) and S the state's columns:
//   A = strictly lower β_i (k̂_i·k̂_j) e^(γ_i - γ_j),   Aq = lower (q̂_i·k̂_j) e^(γ_i - γ_j) (diagonal included),
//   (I + A) [U | W] = [β v | β e^γ k̂]                  (forward substitution, one thread per column),
//   V' = U - W S,   o = e^γ (q̂ S) + Aq V',   S <- e^Γ S + Σ_i k̂_i e^(Γ - γ_i) V'_i.
// Every value in fp32; the state never leaves shared memory between chunks. Rows past the call's end are zeros
// with β = g = 0, which leaves the state as it is. The conv, L2 norms and gates are gdn_step_head's operations,
// each block doing them for the q and k channels it reads and its own v columns.
// Checked before any GPU run (2026-12-02) by a per-thread transcription of this kernel's index arithmetic to
// Python in float64 (kept out of the tree): o and the state within 1.3e-15 of the reference recurrence, the conv
// state equal (1 and 2 key heads, 2 and 6 value heads, 40 and 70 rows: partial last chunks).
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "cp_async.cuh"
#include "device_attr.cuh"
#include "gdn_chunk.cuh"
#include "launch_count.h"
#include "mma_f16.cuh"
#include "mma_tf32.cuh"
#include "pdl.cuh"

namespace openjet {
namespace {

constexpr int D = kGdnHeadDim;
constexpr int C = kGdnChunk;
constexpr int kCols = kGdnChunkCols;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChannels = 2 * D + kCols;  // conv channels of a block: q, k (all 128) and its v columns
constexpr int kRowPad = D + 4;            // q̂ / k̂ rows padded to 528 bytes: 8 rows' 16-byte loads at one d hit 8
                                          // different 16-byte bank groups (the lane-varying loads of step 3)
static_assert(kCols == 32 && C == 32 && C % kWarps == 0 && D % kWarps == 0, "lane = column, warp = row group");
static_assert(kCols + D <= kThreads, "a thread per column of [U | W]");
static_assert(2 * D == kThreads, "two phases: a thread per column of U and of W, all 128 of each");

// f(e) for this thread's items e = threadIdx.x + i kThreads of kItems (the 16-byte pieces of a copy), unrolled: each
// item's offsets fold into immediates on a few base registers (a loop from threadIdx.x in steps of kThreads compiled
// to a general loop with 64-bit address arithmetic per piece: about half of the tf32 state phase's instructions per
// chunk).
template <int kItems, class F> __device__ __forceinline__ void for_block_items(const F& f) {
    static_assert(kItems % kThreads == 0, "whole rounds of the block");
#pragma unroll
    for (int i = 0; i < kItems / kThreads; ++i) f(static_cast<int>(threadIdx.x) + i * kThreads);
}

// Shared-memory traffic sets this kernel's speed (the first version, one output a thread with both operands read
// from shared memory at each step, took 58 us a chunk on the H200: slower than the recurrence). So every product
// reads its warp-uniform operand as 16-byte broadcasts and keeps its lane's operand in registers for 4 outputs.
struct ChunkSmem {
    float4 conv_w[kChannels];       // the block's conv taps (tap 3: the current token)
    float conv_x[3][kChannels];     // each channel's last three raw inputs
    alignas(16) float q[C][kRowPad];
    alignas(16) float k[C][kRowPad];
    float v[C][kCols];
    alignas(16) float w[C][D];      // W
    float u[C][kCols];              // U, then V'
    float s[D][kCols];              // S[k][column]
    alignas(16) float a[C][C];
    alignas(16) float aq[C][C];
    float beta[C], gamma[C], e_gamma[C], e_rest[C];  // β, γ, e^γ, e^(Γ - γ)
};

// out[m] = Σ_k rows[warp + 8 m][k] · cols[k][lane] over k < K (rows kLd floats apart, cols kCols): the lane's column
// of the right operand 4 rows at a time in registers, the warp's rows as 16-byte broadcasts.
template <int K, int kLd>
__device__ __forceinline__ void warp_rows_times_lane_column(const float* rows, const float* cols, int warp, int lane,
                                                            float (&out)[C / kWarps]) {
#pragma unroll
    for (int m = 0; m < C / kWarps; ++m) out[m] = 0.0f;
#pragma unroll 4
    for (int k = 0; k < K; k += 4) {
        const float4 cv = make_float4(cols[k * kCols + lane], cols[(k + 1) * kCols + lane],
                                      cols[(k + 2) * kCols + lane], cols[(k + 3) * kCols + lane]);
#pragma unroll
        for (int m = 0; m < C / kWarps; ++m)
            out[m] = f32_fma4(*reinterpret_cast<const float4*>(rows + (warp + kWarps * m) * kLd + k), cv, out[m]);
    }
}

// SiLU of the causal conv at one channel: inputs x_{-3}, x_{-2}, x_{-1}, x_0 and the taps (gdn_step_head's order).
__device__ __forceinline__ float conv_silu(float x0, float x1, float x2, float xt, float4 cw) {
    return gdn_silu(__fadd_rn(__fadd_rn(__fadd_rn(__fmul_rn(x0, cw.x), __fmul_rn(x1, cw.y)), __fmul_rn(x2, cw.z)),
                              __fmul_rn(xt, cw.w)));
}

// Block (value head h, state columns c0 .. c0 + kCols - 1): element e of s (row e / kCols, column e % kCols) is
// S[h][e / kCols][c0 + e % kCols]. In from a.state; out to a.state_out where set, else back to a.state.
__device__ __forceinline__ size_t state_col_at(int h, int c0, int e) {
    return (size_t)h * D * D + (size_t)(e / kCols) * D + c0 + e % kCols;
}
__device__ __forceinline__ void load_state_columns(const GdnStepArgs& a, int h, int c0, float (*s)[kCols]) {
    for (int e = threadIdx.x; e < D * kCols; e += kThreads) (&s[0][0])[e] = a.state[state_col_at(h, c0, e)];
}
__device__ __forceinline__ void store_state_columns_to(float* so, int h, int c0, const float (*s)[kCols]) {
    for (int e = threadIdx.x; e < D * kCols; e += kThreads) so[state_col_at(h, c0, e)] = (&s[0][0])[e];
}
__device__ __forceinline__ void store_state_columns(const GdnStepArgs& a, int h, int c0, const float (*s)[kCols]) {
    store_state_columns_to(a.state_out ? a.state_out : a.state, h, c0, s);
}

// One channel's conv outputs for the chunk's rows t0 .. t0 + C - 1 into dst (stride floats apart; zeros past n),
// x0 .. x2 the three raw inputs before the chunk on entry and the last three on return (gdn_step_head's order).
__device__ __forceinline__ void conv_chunk_channel(const GdnStepArgs& a, int conv_dim, int c, int t0, int n,
                                                   float4 cw, float& x0, float& x1, float& x2, float* dst,
                                                   int stride) {
    float xin[C];  // every load in flight at once
#pragma unroll
    for (int t = 0; t < C; ++t) xin[t] = t < n ? a.qkv[(size_t)(t0 + t) * conv_dim + c] : 0.0f;
#pragma unroll
    for (int t = 0; t < C; ++t) {
        float out = 0.0f;
        if (t < n) {
            out = conv_silu(x0, x1, x2, xin[t], cw);
            x0 = x1, x1 = x2, x2 = xin[t];
        }
        dst[t * stride] = out;
    }
}

// Row `row`'s β and g for value head h (both 0 where !live: such a row leaves the state as it is).
__device__ __forceinline__ void chunk_gates(const GdnStepArgs& a, int h, int row, bool live, float* beta, float* g) {
    *beta = 0.0f, *g = 0.0f;
    if (live) {
        *beta = gdn_sigmoid(a.b[row * a.n_v + h]);
        *g = __fmul_rn(a.ssm_a[h], gdn_softplus(__fadd_rn(a.alpha[row * a.n_v + h], a.dt_bias[h])));
    }
}

// Step 2: q <- x rsqrt(sum x^2 + eps) / sqrt(128), k <- x rsqrt(sum x^2 + eps), a warp per row (zero rows stay
// zero); gamma <- its running sum (one thread, in order).
__device__ __forceinline__ void chunk_norms(float (*q)[kRowPad], float (*k)[kRowPad], float* gamma, float eps, int tid,
                                            int warp, int lane) {
    if (tid == 0) {
        float acc = 0.0f;
        for (int t = 0; t < C; ++t) gamma[t] = acc = __fadd_rn(acc, gamma[t]);
    }
    for (int rw = warp; rw < 2 * C; rw += kWarps) {
        float* row = (rw & 1) ? k[rw >> 1] : q[rw >> 1];
        const float inv = __frcp_rn(__fsqrt_rn(__fadd_rn(gdn_warp_sumsq(row, lane), eps)));
        const float scale = (rw & 1) ? 1.0f : 0.08838834764831845f;  // float32(1/sqrt(128))
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float x = __fmul_rn(row[lane + 32 * i], inv);
            row[lane + 32 * i] = (rw & 1) ? x : __fmul_rn(x, scale);
        }
    }
}

// Step 3's decays e^gamma and e^(Gamma - gamma), a thread a row.
__device__ __forceinline__ void chunk_decay_vectors(const float* gamma, float* e_gamma, float* e_rest, int tid) {
    if (tid < C) {
        e_gamma[tid] = expf(gamma[tid]);
        e_rest[tid] = expf(__fsub_rn(gamma[C - 1], gamma[tid]));
    }
}

// Step 3's entry (i, j) of A and Aq from the products kk = k_i . k_j and qk = q_i . k_j: masked (A strictly below the
// diagonal, Aq on and below it) and decayed by e^(gamma_i - gamma_j), A's also scaled by beta_i.
__device__ __forceinline__ void chunk_decay_entry(int i, int j, float kk, float qk, const float* gamma,
                                                  const float* beta, float (*am)[C], float (*aq)[C]) {
    const float dec = j <= i ? expf(__fsub_rn(gamma[i], gamma[j])) : 0.0f;  // masked before the exp
    am[i][j] = j < i ? __fmul_rn(__fmul_rn(beta[i], kk), dec) : 0.0f;
    aq[i][j] = j <= i ? __fmul_rn(qk, dec) : 0.0f;
}

// Step 3: A and Aq, entries (i, j = lane) for rows i = warp + 8 m (k_j in 16-byte steps, the rows' k_i, q_i
// broadcast); the decays e^gamma and e^(Gamma - gamma).
__device__ __forceinline__ void chunk_decays(const float (*q)[kRowPad], const float (*k)[kRowPad], const float* gamma,
                                             const float* beta, float* e_gamma, float* e_rest, float (*am)[C],
                                             float (*aq)[C], int tid, int warp, int lane) {
    chunk_decay_vectors(gamma, e_gamma, e_rest, tid);
    constexpr int M = C / kWarps;
    float kk[M] = {}, qk[M] = {};
#pragma unroll 4
    for (int d = 0; d < D; d += 4) {
        const float4 kj = *reinterpret_cast<const float4*>(&k[lane][d]);
#pragma unroll
        for (int m = 0; m < M; ++m) {
            kk[m] = f32_fma4(*reinterpret_cast<const float4*>(&k[warp + kWarps * m][d]), kj, kk[m]);
            qk[m] = f32_fma4(*reinterpret_cast<const float4*>(&q[warp + kWarps * m][d]), kj, qk[m]);
        }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) chunk_decay_entry(warp + kWarps * m, lane, kk[m], qk[m], gamma, beta, am, aq);
}

// chunk_decays with A's and Aq's products (K K^T, Q K^T over the 128 dimensions) as single tf32 tensor-core passes
// (m16n8k8, each operand rounded as it is loaded; gdn_chunk_local_kernel's kTcDecays, the default): warp w the
// 16 x 8 tile (rows 16 (w % 2), columns 8 (w / 2)) of both, then chunk_decays' masks and decays on the tile's
// elements. Numerics of their own: emulated on the CPU (emulate_gdn_tf32.py, 4,096 tokens) the prefill's o moves
// from 4.2e-4 to 4.8e-4 of the float64 recurrence; on the H200 y within 2.8e-4 .. 1.1e-3 of it (the tests' 5e-3).
// Those products were ~1,300 of a thread's FMA-form instructions; here ~350 a warp.
__device__ __forceinline__ void chunk_decays_tc(const float (*q)[kRowPad], const float (*k)[kRowPad],
                                                const float* gamma, const float* beta, float* e_gamma, float* e_rest,
                                                float (*am)[C], float (*aq)[C], int tid, int warp, int lane) {
    chunk_decay_vectors(gamma, e_gamma, e_rest, tid);
    const int g = lane >> 2, tq = lane & 3, r0 = 16 * (warp & 1), n0 = 8 * (warp >> 1);
    float kk[4] = {}, qk[4] = {};
#pragma unroll 4
    for (int d0 = 0; d0 < D; d0 += 8) {  // B = K^T: b[0] = k[n0 + g][d0 + tq], b[1] = k[n0 + g][d0 + tq + 4]
        const uint32_t b[2] = {tf32_rna(k[n0 + g][d0 + tq]), tf32_rna(k[n0 + g][d0 + tq + 4])};
        const uint32_t ak[4] = {tf32_rna(k[r0 + g][d0 + tq]), tf32_rna(k[r0 + g + 8][d0 + tq]),
                                tf32_rna(k[r0 + g][d0 + tq + 4]), tf32_rna(k[r0 + g + 8][d0 + tq + 4])};
        const uint32_t aqf[4] = {tf32_rna(q[r0 + g][d0 + tq]), tf32_rna(q[r0 + g + 8][d0 + tq]),
                                 tf32_rna(q[r0 + g][d0 + tq + 4]), tf32_rna(q[r0 + g + 8][d0 + tq + 4])};
        mma_1688_tf32(kk, ak, b);
        mma_1688_tf32(qk, aqf, b);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e)
        chunk_decay_entry(r0 + g + 8 * (e >> 1), n0 + 2 * tq + (e & 1), kk[e], qk[e], gamma, beta, am, aq);
}

// Step 4 for one column: (I + A) x = rhs by forward substitution (rhs(i): row i's right-hand side). A column
// reads only its own earlier rows.
template <class Rhs>
__device__ __forceinline__ void chunk_solve_column(const float (*am)[C], const Rhs& rhs, float (&x)[C]) {
#pragma unroll
    for (int i = 0; i < C; ++i) x[i] = 0.0f;  // zeros ahead of row i: A is zero there too, so the 16-byte steps
#pragma unroll                                 // past j = i - 1 add nothing
    for (int i = 0; i < C; ++i) {
        float acc = rhs(i);
#pragma unroll
        for (int j = 0; j < i; j += 4) {
            const float4 av = *reinterpret_cast<const float4*>(&am[i][j]);
            acc = __fmaf_rn(-av.x, x[j], acc);
            acc = __fmaf_rn(-av.y, x[j + 1], acc);
            acc = __fmaf_rn(-av.z, x[j + 2], acc);
            acc = __fmaf_rn(-av.w, x[j + 3], acc);
        }
        x[i] = acc;
    }
}

// Steps 5-7 on a block's kCols state columns s[D][kCols], given the chunk's W [C][D], q and k rows, U [C][kCols]
// (replaced by V'), Aq and decays: V' = U - W S; o = e^gamma (q S) + Aq V' for rows < n to y_row(i); S <- e^Gamma S
// + sum_i k_i (e^(Gamma - gamma_i) V'_i). Barriers between the steps (and none at the end).
template <class Out>
__device__ __forceinline__ void chunk_state_steps(float (*s)[kCols], const float (*w)[D], const float (*q)[kRowPad],
                                                  const float (*k)[kRowPad], float (*u)[kCols], const float (*aq)[C],
                                                  const float* gamma, const float* e_gamma, const float* e_rest, int n,
                                                  const Out& out, int warp, int lane) {
    constexpr int M = C / kWarps;
    {
        float ws[M];
        warp_rows_times_lane_column<D, D>(&w[0][0], &s[0][0], warp, lane, ws);
#pragma unroll
        for (int m = 0; m < M; ++m) {
            const int i = warp + kWarps * m;
            u[i][lane] = __fsub_rn(u[i][lane], ws[m]);
        }
    }
    __syncthreads();
    {
        float qs[M], av[M];
        warp_rows_times_lane_column<D, kRowPad>(&q[0][0], &s[0][0], warp, lane, qs);
        warp_rows_times_lane_column<C, C>(&aq[0][0], &u[0][0], warp, lane, av);
#pragma unroll
        for (int m = 0; m < M; ++m) {
            const int i = warp + kWarps * m;
            if (i < n) out(i, __fmaf_rn(e_gamma[i], qs[m], av[m]));
        }
    }
    __syncthreads();  // S is read above and rewritten below
    {
        constexpr int R = D / kWarps;
        const float e_all = expf(gamma[C - 1]);
        const int r0 = R * warp;
        float acc[R] = {};
#pragma unroll 4
        for (int i = 0; i < C; ++i) {
            const float vp = __fmul_rn(u[i][lane], e_rest[i]);
#pragma unroll
            for (int q4 = 0; q4 < R / 4; ++q4) {
                const float4 kv = *reinterpret_cast<const float4*>(&k[i][r0 + 4 * q4]);
                acc[4 * q4 + 0] = __fmaf_rn(kv.x, vp, acc[4 * q4 + 0]);
                acc[4 * q4 + 1] = __fmaf_rn(kv.y, vp, acc[4 * q4 + 1]);
                acc[4 * q4 + 2] = __fmaf_rn(kv.z, vp, acc[4 * q4 + 2]);
                acc[4 * q4 + 3] = __fmaf_rn(kv.w, vp, acc[4 * q4 + 3]);
            }
        }
#pragma unroll
        for (int m = 0; m < R; ++m) s[r0 + m][lane] = __fmaf_rn(e_all, s[r0 + m][lane], acc[m]);
    }
}

__global__ void __launch_bounds__(kThreads, 1) gdn_chunk_kernel(const GdnStepArgs a) {
    extern __shared__ float4 smem_raw[];
    ChunkSmem& sm = *reinterpret_cast<ChunkSmem*>(smem_raw);
    pdl_start();  // pdl.cuh
    constexpr int kSplits = D / kCols;
    const int h = blockIdx.x / kSplits, c0 = blockIdx.x % kSplits * kCols;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kh = h % a.n_k;  // tiled pairing: value head h reads key head h mod n_k
    const int key_dim = a.n_k * D, value_dim = a.n_v * D, conv_dim = 2 * key_dim + value_dim;
    const auto channel = [&](int ch) {  // the block's channel ch in the qkv row
        return ch < D       ? kh * D + ch
               : ch < 2 * D ? key_dim + kh * D + (ch - D)
                            : 2 * key_dim + h * D + c0 + (ch - 2 * D);
    };
    load_state_columns(a, h, c0, sm.s);
    for (int ch = tid; ch < kChannels; ch += kThreads) {
        const int c = channel(ch);
        sm.conv_w[ch] = make_float4(a.conv_w[c * 4 + 0], a.conv_w[c * 4 + 1], a.conv_w[c * 4 + 2], a.conv_w[c * 4 + 3]);
#pragma unroll
        for (int i = 0; i < 3; ++i) sm.conv_x[i][ch] = a.conv_state_in[(size_t)i * conv_dim + c];
    }
    __syncthreads();

#pragma unroll 1
    for (int t0 = 0; t0 < a.t; t0 += C) {
        const int n = min(C, a.t - t0);
        // 1. Causal conv and SiLU of the chunk's rows per channel (zeros past n), as gdn_step_head; the gates.
        for (int ch = tid; ch < kChannels; ch += kThreads) {
            const int c = channel(ch);
            const float4 cw = sm.conv_w[ch];
            float x0 = sm.conv_x[0][ch], x1 = sm.conv_x[1][ch], x2 = sm.conv_x[2][ch];
            float* dst = ch < D ? &sm.q[0][ch] : ch < 2 * D ? &sm.k[0][ch - D] : &sm.v[0][ch - 2 * D];
            conv_chunk_channel(a, conv_dim, c, t0, n, cw, x0, x1, x2, dst, ch < 2 * D ? kRowPad : kCols);
            sm.conv_x[0][ch] = x0, sm.conv_x[1][ch] = x1, sm.conv_x[2][ch] = x2;
            // The call's last rows: q/k channels are written by the one block with h < n_k and c0 = 0.
            if (t0 + n == a.t && (ch >= 2 * D || (h == kh && c0 == 0))) {
                a.conv_state_out[c] = x0;
                a.conv_state_out[conv_dim + c] = x1;
                a.conv_state_out[2 * conv_dim + c] = x2;
            }
        }
        if (tid < C) chunk_gates(a, h, t0 + tid, tid < n, &sm.beta[tid], &sm.gamma[tid]);  // past n: zeros
        __syncthreads();

        // 2, 3. The norms and γ; A, Aq and the decays.
        chunk_norms(sm.q, sm.k, sm.gamma, a.eps, tid, warp, lane);
        __syncthreads();
        chunk_decays(sm.q, sm.k, sm.gamma, sm.beta, sm.e_gamma, sm.e_rest, sm.a, sm.aq, tid, warp, lane);
        __syncthreads();

        // 4. (I + A) [U | W] = [β v | β e^γ k̂] by forward substitution: thread c < kCols solves U's column c,
        // thread kCols + d W's column d; a column only reads its own earlier rows, so no barrier inside.
        if (tid < kCols + D) {
            const bool is_u = tid < kCols;
            const int c = is_u ? tid : tid - kCols;
            float x[C];
            chunk_solve_column(sm.a, [&](int i) {
                return is_u ? __fmul_rn(sm.beta[i], sm.v[i][c]) : __fmul_rn(__fmul_rn(sm.beta[i], sm.e_gamma[i]), sm.k[i][c]);
            }, x);
#pragma unroll
            for (int i = 0; i < C; ++i) {
                if (is_u) sm.u[i][c] = x[i];
                else sm.w[i][c] = x[i];
            }
        }
        __syncthreads();

        // 5-7. V' = U - W S; o rows < n to y (the gated RMSNorm's launch reads them there); the state.
        chunk_state_steps(sm.s, sm.w, sm.q, sm.k, sm.u, sm.aq, sm.gamma, sm.e_gamma, sm.e_rest, n,
                          [&](int i, float o) { a.y[(size_t)(t0 + i) * value_dim + h * D + c0 + lane] = o; }, warp,
                          lane);
        __syncthreads();  // the next chunk rewrites q, k, v, u
    }

    store_state_columns(a, h, c0, sm.s);
}

// ------------------------------------------------------------------------------------------ two phases (=2)
// OPENJET_GDN_CHUNKED=2: the same chunks and the same arithmetic as gdn_chunk_kernel (so the same bits), in two
// launches. Phase 1, one block per (value head, chunk), all chunks at once: conv, gates, norms, A, Aq and the
// solve for all 128 columns of U and W (the chunk-local work, which gdn_chunk_kernel redoes in each of a head's 4
// column blocks, one chunk after another), into scratch (ChunkScratch). Phase 2, one block per (value head, 32
// state columns): per chunk only steps 5-7 (V' = U - W S, o, the state), its operands read from scratch.
struct ChunkScratch {  // [head][padded row][...]: a (head, chunk)'s rows contiguous
    float *q, *k;              // [n_k][R][D]   normalised q (1/sqrt(128) included) and k
    float *u, *w;              // [n_v][R][D]   U and W
    float* aq;                 // [n_v][R][C]   Aq's rows
    float *gamma, *e_gamma, *e_rest;  // [n_v][R]
    __host__ __device__ ChunkScratch(float* base, int n_k, int n_v, int rows) {
        const size_t r = (rows + C - 1) / C * C;
        q = base, k = q + (size_t)n_k * r * D, u = k + (size_t)n_k * r * D, w = u + (size_t)n_v * r * D;
        aq = w + (size_t)n_v * r * D, gamma = aq + (size_t)n_v * r * C, e_gamma = gamma + n_v * r;
        e_rest = e_gamma + n_v * r;
    }
    __host__ __device__ static size_t floats(int n_k, int n_v, int rows) {
        const size_t r = (rows + C - 1) / C * C;
        return r * ((size_t)2 * n_k * D + (size_t)n_v * (2 * D + C + 3));
    }
};

struct Phase1Smem {
    alignas(16) float q[C][kRowPad];
    alignas(16) float k[C][kRowPad];
    float v[C][D];
    alignas(16) float a[C][C];
    alignas(16) float aq[C][C];
    float beta[C], gamma[C], e_gamma[C], e_rest[C];
};

// Three blocks per SM where three fit (sm_90's 228 KB: 3 x 59 KB; 80 registers, no spills): H200, a 4,096-row call
// at 27B widths (ncu), 531 us at two blocks (128 registers) -> 432. The 100 KB SMs of sm_86/89/120 hold one block
// whatever the registers, so they keep 128 (at 80, sm_120 spilled 8 bytes). (An L2 prefetch of the next chunk's
// operands in the state phase below changed nothing, 632 us either way: that phase waits on its own chain of
// products and barriers.)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
constexpr int kLocalBlocksPerSm = 3;
#else
constexpr int kLocalBlocksPerSm = 1;
#endif
// kTf32Operands (the default state phase, gdn_chunk_state_tf32_kernel): q, k, W and Aq go out rounded to tf32 once
// (the rounding every warp of the state phase would otherwise apply to each fragment it loads), and each chunk's k
// transposed ([D][C] per key head and chunk: k^T is step 7's A operand); U stays fp32 (V' = U - W S is fp32).
// kTcDecays (with kTf32Operands only): A and Aq by chunk_decays_tc (the default; OPENJET_GDN_LOCAL_TC=0 turns it off).
template <bool kTf32Operands, bool kTcDecays>
__global__ void __launch_bounds__(kThreads, kLocalBlocksPerSm) gdn_chunk_local_kernel(const GdnStepArgs a) {
    static_assert(kTf32Operands || !kTcDecays, "the tensor-core decays go with the tf32 state phase");
    extern __shared__ float4 smem_raw[];
    Phase1Smem& sm = *reinterpret_cast<Phase1Smem*>(smem_raw);
    pdl_start();  // pdl.cuh
    // Blocks in chunk order, a chunk's value heads together: the blocks that read the same q and k rows (value heads
    // kh, kh + n_k, ...: the 27B's three a key head) run at the same time, so those rows mostly come from L2, not
    // three times from memory.
    const int h = blockIdx.x % a.n_v, t0 = blockIdx.x / a.n_v * C, n = min(C, a.t - t0);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kh = h % a.n_k;  // tiled pairing: value head h reads key head h mod n_k
    const int key_dim = a.n_k * D, conv_dim = 2 * key_dim + a.n_v * D;
    const auto channel = [&](int ch) {  // the block's channel ch: q, k of its key head, v of its value head
        return ch < D ? kh * D + ch : ch < 2 * D ? key_dim + kh * D + (ch - D) : 2 * key_dim + h * D + (ch - 2 * D);
    };
    // 1. Conv and SiLU per channel: the three raw inputs before the chunk from qkv (or, before row 0, the conv
    // state), then gdn_chunk_kernel's loop over the chunk's rows; the gates.
    for (int ch = tid; ch < 3 * D; ch += kThreads) {
        const int c = channel(ch);
        const float4 cw = make_float4(a.conv_w[c * 4 + 0], a.conv_w[c * 4 + 1], a.conv_w[c * 4 + 2], a.conv_w[c * 4 + 3]);
        float x[3];
#pragma unroll
        for (int i = 0; i < 3; ++i) {
            const int row = t0 - 3 + i;
            x[i] = row < 0 ? a.conv_state_in[(size_t)(row + 3) * conv_dim + c] : a.qkv[(size_t)row * conv_dim + c];
        }
        if (a.snap_conv && t0 == a.snap_row && (ch >= 2 * D || h == kh))  // the conv state before the snapshot row
            for (int i = 0; i < 3; ++i) a.snap_conv[(size_t)i * conv_dim + c] = x[i];
        float x0 = x[0], x1 = x[1], x2 = x[2];
        float* dst = ch < D ? &sm.q[0][ch] : ch < 2 * D ? &sm.k[0][ch - D] : &sm.v[0][ch - 2 * D];
        conv_chunk_channel(a, conv_dim, c, t0, n, cw, x0, x1, x2, dst, ch < 2 * D ? kRowPad : D);
        if (t0 + n == a.t && (ch >= 2 * D || h == kh)) {  // the call's last rows: q/k channels by value head kh
            a.conv_state_out[c] = x0;
            a.conv_state_out[conv_dim + c] = x1;
            a.conv_state_out[2 * conv_dim + c] = x2;
        }
    }
    if (tid < C) chunk_gates(a, h, t0 + tid, tid < n, &sm.beta[tid], &sm.gamma[tid]);
    __syncthreads();
    // 2, 3.
    chunk_norms(sm.q, sm.k, sm.gamma, a.eps, tid, warp, lane);
    __syncthreads();
    if constexpr (kTcDecays)
        chunk_decays_tc(sm.q, sm.k, sm.gamma, sm.beta, sm.e_gamma, sm.e_rest, sm.a, sm.aq, tid, warp, lane);
    else
        chunk_decays(sm.q, sm.k, sm.gamma, sm.beta, sm.e_gamma, sm.e_rest, sm.a, sm.aq, tid, warp, lane);
    __syncthreads();
    // 4. Thread c < D solves U's column c, thread D + d W's column d; then everything the state steps need goes out.
    const ChunkScratch cs(a.chunk_scratch, a.n_k, a.n_v, a.t);
    const size_t r_pad = (size_t)(a.t + C - 1) / C * C;
    const auto operand = [](float x) { return kTf32Operands ? __uint_as_float(tf32_rna(x)) : x; };
    {
        const bool is_u = tid < D;
        const int c = is_u ? tid : tid - D;
        float x[C];
        chunk_solve_column(sm.a, [&](int i) {
            return is_u ? __fmul_rn(sm.beta[i], sm.v[i][c]) : __fmul_rn(__fmul_rn(sm.beta[i], sm.e_gamma[i]), sm.k[i][c]);
        }, x);
        float* dst = (is_u ? cs.u : cs.w) + ((size_t)h * r_pad + t0) * D + c;
#pragma unroll
        for (int i = 0; i < C; ++i) dst[(size_t)i * D] = is_u ? x[i] : operand(x[i]);
    }
    if (h == kh)
        for (int e = tid; e < C * D; e += kThreads) {
            const int i = e / D, d = e % D;
            cs.q[((size_t)kh * r_pad + t0 + i) * D + d] = operand(sm.q[i][d]);
            if constexpr (kTf32Operands) {  // k^T: element e is (d, i) = (e / C, e % C)
                cs.k[((size_t)kh * r_pad + t0) * D + e] = operand(sm.k[e % C][e / C]);
            } else {
                cs.k[((size_t)kh * r_pad + t0 + i) * D + d] = sm.k[i][d];
            }
        }
    for (int e = tid; e < C * C; e += kThreads)
        cs.aq[((size_t)h * r_pad + t0) * C + e] = operand((&sm.aq[0][0])[e]);
    if (tid < C) {
        const size_t at = (size_t)h * r_pad + t0 + tid;
        cs.gamma[at] = sm.gamma[tid], cs.e_gamma[at] = sm.e_gamma[tid], cs.e_rest[at] = sm.e_rest[tid];
    }
}

// A chunk's operands of phase 2 in shared memory, rows kLd* floats apart (every array 16-byte aligned: cp.async
// pieces).
template <int kLdQ, int kLdK, int kLdW, int kLdU, int kLdAq> struct ChunkOperands {
    alignas(16) float q[C][kLdQ];
    alignas(16) float k[C][kLdK];
    alignas(16) float w[C][kLdW];
    alignas(16) float u[C][kLdU];
    alignas(16) float aq[C][kLdAq];
    alignas(16) float gamma[C];
    alignas(16) float e_gamma[C];
    alignas(16) float e_rest[C];
};
// The FMA state phase's shared memory (75 KB, two blocks per SM on the 228 KB SMs).
struct Phase2Smem {
    float s[D][kCols];
    ChunkOperands<kRowPad, kRowPad, D, kCols, C> c;
};

// The lane's cp.async pieces of chunk t0's q and W rows into b (a thread's share of 2 x 1,024 pieces); Buf: a
// ChunkOperands.
template <class Buf>
__device__ __forceinline__ void copy_chunk_qw(const ChunkScratch& cs, size_t r_pad, int h, int kh, int t0, Buf& b) {
    const float* q = cs.q + ((size_t)kh * r_pad + t0) * D;
    const float* w = cs.w + ((size_t)h * r_pad + t0) * D;
    for_block_items<C * D / 4>([&](int e) {  // 16-byte pieces of the chunk's rows
        const int i = e / (D / 4), d = 4 * (e % (D / 4));
        cp_async16(&b.q[i][d], q + 4 * e);
        cp_async16(&b.w[i][d], w + 4 * e);
    });
}

// Chunk t0's U columns, Aq rows and decays for block (h, c0) (256, 256 and 24 pieces).
template <class Buf>
__device__ __forceinline__ void copy_chunk_u_aq_decays(const ChunkScratch& cs, size_t r_pad, int h, int c0, int t0,
                                                       Buf& b) {
    static_assert(C == kCols, "U's columns and Aq's rows copy in the same pieces");
    const float* u = cs.u + ((size_t)h * r_pad + t0) * D + c0;
    const float* aq = cs.aq + ((size_t)h * r_pad + t0) * C;
    for_block_items<C * kCols / 4>([&](int e) {  // U's columns c0 .. c0 + 31 of each row; Aq's rows
        const int i = e / (kCols / 4), j = 4 * (e % (kCols / 4));
        cp_async16(&b.u[i][j], u + i * D + j);
        cp_async16(&b.aq[i][j], aq + i * C + j);
    });
    if (threadIdx.x < 3 * C / 4) {
        const int part = threadIdx.x / (C / 4), j = 4 * (threadIdx.x % (C / 4));
        const size_t at = (size_t)h * r_pad + t0 + j;
        float* dst = part == 0 ? b.gamma : part == 1 ? b.e_gamma : b.e_rest;
        cp_async16(dst + j, (part == 0 ? cs.gamma : part == 1 ? cs.e_gamma : cs.e_rest) + at);
    }
}

// The rest of chunk t0's operands for block (h, c0): k's rows (1,024 pieces), then copy_chunk_u_aq_decays.
template <class Buf>
__device__ __forceinline__ void copy_chunk_rest(const ChunkScratch& cs, size_t r_pad, int h, int kh, int c0, int t0,
                                                Buf& b) {
    const float* k = cs.k + ((size_t)kh * r_pad + t0) * D;
    for_block_items<C * D / 4>([&](int e) {
        const int i = e / (D / 4), d = 4 * (e % (D / 4));
        cp_async16(&b.k[i][d], k + 4 * e);
    });
    copy_chunk_u_aq_decays(cs, r_pad, h, c0, t0, b);
}

// All of chunk t0's operands for block (h, c0) into b.
template <class Buf>
__device__ __forceinline__ void copy_chunk_operands(const ChunkScratch& cs, size_t r_pad, int h, int kh, int c0,
                                                    int t0, Buf& b) {
    copy_chunk_qw(cs, r_pad, h, kh, t0, b);
    copy_chunk_rest(cs, r_pad, h, kh, c0, t0, b);
}

// Two blocks per SM (<= 128 registers, 2 x 75 KB), so the 27B's 192 blocks are all resident on 96 or more SMs (at
// one block per SM the H200's 132 ran them in two waves: 1,022 us of a 2,048-row call, Nsight at 0e2ffe7).
__global__ void __launch_bounds__(kThreads, 2) gdn_chunk_state_kernel(const GdnStepArgs a) {
    extern __shared__ float4 smem_raw[];
    Phase2Smem& sm = *reinterpret_cast<Phase2Smem*>(smem_raw);
    pdl_start();  // pdl.cuh
    constexpr int kSplits = D / kCols;
    const int h = blockIdx.x / kSplits, c0 = blockIdx.x % kSplits * kCols;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kh = h % a.n_k, value_dim = a.n_v * D;
    load_state_columns(a, h, c0, sm.s);
    const ChunkScratch cs(a.chunk_scratch, a.n_k, a.n_v, a.t);
    const size_t r_pad = (size_t)(a.t + C - 1) / C * C;
#pragma unroll 1
    for (int t0 = 0; t0 < a.t; t0 += C) {
        const int n = min(C, a.t - t0);
        if (a.snap_state && t0 == a.snap_row) store_state_columns_to(a.snap_state, h, c0, sm.s);  // before row t0
        copy_chunk_operands(cs, r_pad, h, kh, c0, t0, sm.c);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        chunk_state_steps(sm.s, sm.c.w, sm.c.q, sm.c.k, sm.c.u, sm.c.aq, sm.c.gamma, sm.c.e_gamma, sm.c.e_rest, n,
                          [&](int i, float o) { a.y[(size_t)(t0 + i) * value_dim + h * D + c0 + lane] = o; }, warp,
                          lane);
        __syncthreads();  // the next chunk's operands overwrite these
    }
    store_state_columns(a, h, c0, sm.s);
}

// ------------------------------------------------------------------------- the state phase on tensor cores
// OPENJET_GDN_STATE_TC (the default; 0: the FMA form above): phase 2's steps 5-7 as m16n8k8 products in one tf32
// pass (the default) or in 3xTF32 (mma_tf32.cuh: about fp32's accuracy); the sums run in another order than the FMA
// chains, so numerics of their own. The FMA form is issue-bound (~2,800 instructions a thread per chunk; 1,130 us
// of a 2,048-row call at 27B widths on the H200, 897 here in 3xTF32); a warp issues 156 mma (3xTF32) and ~1,000
// other instructions a chunk. Per chunk and block
// (32 state columns): warp w's tile (rows 16 (w % 2), columns 8 (w / 2)) of W S and q S (steps 5, 6a), then of Aq V'
// (6b); warp w also holds S's rows 16 w .. 16 w + 15 (all 32 columns) in registers as step 7's accumulators, in fp32
// from the call's start to its end, and writes them to shared memory for the next chunk's products. Rows are padded
// so that every fragment load hits 32 different banks (A row-major: 4 words; B and k read transposed: 8).
constexpr int kTcPadA = D + 4;      // q and W rows (A of steps 5, 6a)
constexpr int kTcPadKT = D + 8;     // k rows (A of step 7, transposed)
constexpr int kTcPadB = kCols + 8;  // S rows and U / V' rows (B)
constexpr int kTcPadAq = C + 4;     // Aq rows (A of step 6b)
struct Phase2TcSmem {
    alignas(16) float s[D][kTcPadB];
    ChunkOperands<kTcPadA, kTcPadKT, kTcPadA, kTcPadB, kTcPadAq> c;
};

// f(j, e, row, column) for the lane's elements of S in step 7's C fragments: rows 16 warp + g (+ 8), columns
// 8 j + 2 tq (+ 1) of the block's 32.
template <class F> __device__ __forceinline__ void for_state_fragment(int warp, int g, int tq, const F& f) {
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) f(j, e, 16 * warp + g + 8 * (e >> 1), 8 * j + 2 * tq + (e & 1));
}

// A tensor-core state-phase block (value head h, state columns c0 .. c0 + kCols - 1, key head kh), the lane's place
// in it, and the lane's elements of the block's state as step 7's C fragments (for_state_fragment), in fp32 registers
// from the call's start to its end: read from a.state at construction, written out by store_to.
struct StateBlock {
    int h, c0, kh, lane, warp, g, tq;
    size_t head;  // the value head's [D][D] state in an [n_v][D][D] array
    float st[kCols / 8][4];
    __device__ __forceinline__ explicit StateBlock(const GdnStepArgs& a)
        : h(blockIdx.x / (D / kCols)), c0(blockIdx.x % (D / kCols) * kCols), kh(h % a.n_k), lane(threadIdx.x & 31),
          warp(threadIdx.x >> 5), g(lane >> 2), tq(lane & 3), head((size_t)h * D * D) {
        for_state_fragment(warp, g, tq,
                           [&](int j, int e, int row, int col) { st[j][e] = a.state[head + row * D + c0 + col]; });
    }
    // The state into s (a snapshot before a chunk, or the call's end).
    __device__ __forceinline__ void store_to(float* s) const {
        for_state_fragment(warp, g, tq,
                           [&](int j, int e, int row, int col) { s[head + row * D + c0 + col] = st[j][e]; });
    }
    // Step 7's first half: S <- e^Gamma S.
    __device__ __forceinline__ void decay(float e_all) {
#pragma unroll
        for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) st[j][e] = __fmul_rn(e_all, st[j][e]);
    }
};

// kPasses = 1 (the default): each operand rounded once to tf32's 10-bit mantissa, big x big alone; 3
// (OPENJET_GDN_STATE_TC=3xtf32): 3xTF32, an operand as big + small, three times the products.
template <int kPasses> __device__ __forceinline__ Tf32Pair tf32_operand(float x) {
    if constexpr (kPasses == 3) return tf32_split(x);
    else return {tf32_rna(x), 0u};
}
template <int kPasses>
__device__ __forceinline__ void mma_tf32_passes(float c[4], const Tf32Pair (&a)[4], const Tf32Pair (&b)[2]) {
    static_assert(kPasses == 1 || kPasses == 3, "one tf32 product or 3xTF32");
    if constexpr (kPasses == 3) {
        mma_1688_3xtf32(c, a, b);
    } else {
        const uint32_t ab[4] = {a[0].big, a[1].big, a[2].big, a[3].big}, bb[2] = {b[0].big, b[1].big};
        mma_1688_tf32(c, ab, bb);
    }
}

// The A fragment of rows r, r + 8 and columns k0 + tq, k0 + tq + 4 of a row-major matrix (ld floats a row), split.
template <int kPasses>
__device__ __forceinline__ void a_fragment(const float* m, int ld, int r, int k0, int tq, Tf32Pair (&a)[4]) {
    a[0] = tf32_operand<kPasses>(m[r * ld + k0 + tq]), a[1] = tf32_operand<kPasses>(m[(r + 8) * ld + k0 + tq]);
    a[2] = tf32_operand<kPasses>(m[r * ld + k0 + tq + 4]);
    a[3] = tf32_operand<kPasses>(m[(r + 8) * ld + k0 + tq + 4]);
}

template <int kPasses>
__global__ void __launch_bounds__(kThreads, 2) gdn_chunk_state_tc_kernel(const GdnStepArgs a) {
    extern __shared__ float4 smem_raw[];
    Phase2TcSmem& sm = *reinterpret_cast<Phase2TcSmem*>(smem_raw);
    pdl_start();  // pdl.cuh
    StateBlock sb(a);
    const int h = sb.h, c0 = sb.c0, kh = sb.kh, warp = sb.warp, g = sb.g, tq = sb.tq, value_dim = a.n_v * D;
    auto& st = sb.st;
    const int r = 16 * (warp & 1) + g, cc = 8 * (warp >> 1);  // steps 5, 6: the tile's rows r, r + 8, columns cc ..
    const ChunkScratch cs(a.chunk_scratch, a.n_k, a.n_v, a.t);
    const size_t r_pad = (size_t)(a.t + C - 1) / C * C;
    // The operands arrive while the chunk before computes: a chunk's q and W (steps 5, 6a) during the previous
    // chunk's steps 6b and 7, which no longer read them; its k, U, Aq and decays during its own steps 5 and 6a (the
    // same shared memory; H200, 27B, a 4,096-token prefill in one run, A/B/A: gdn.step 64.5 / 62.4 / 63.7 ms).
    copy_chunk_qw(cs, r_pad, h, kh, 0, sm.c);
    cp_async_commit();
#pragma unroll 1
    for (int t0 = 0; t0 < a.t; t0 += C) {
        const int n = min(C, a.t - t0);
        if (a.snap_state && t0 == a.snap_row) sb.store_to(a.snap_state);  // the state before row t0
        for_state_fragment(warp, g, tq, [&](int j, int e, int row, int col) { sm.s[row][col] = st[j][e]; });
        __syncthreads();  // every warp is done with the previous chunk's k, U, Aq and decays
        copy_chunk_rest(cs, r_pad, h, kh, c0, t0, sm.c);
        cp_async_commit();
        cp_async_wait<1>();  // this chunk's q and W (the group before)
        __syncthreads();
        // 5, 6a: W S and q S on the warp's tile; V' = U - W S there.
        float ws[4] = {}, qs[4] = {};
#pragma unroll 4
        for (int k0 = 0; k0 < D; k0 += 8) {
            const Tf32Pair b[2] = {tf32_operand<kPasses>(sm.s[k0 + tq][cc + g]),
                                   tf32_operand<kPasses>(sm.s[k0 + tq + 4][cc + g])};
            Tf32Pair af[4];
            a_fragment<kPasses>(&sm.c.w[0][0], kTcPadA, r, k0, tq, af);
            mma_tf32_passes<kPasses>(ws, af, b);
            a_fragment<kPasses>(&sm.c.q[0][0], kTcPadA, r, k0, tq, af);
            mma_tf32_passes<kPasses>(qs, af, b);
        }
        cp_async_wait<0>();
        __syncthreads();  // U, k, Aq and the decays whole; every warp is done with q and W
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float& u = sm.c.u[r + 8 * (e >> 1)][cc + 2 * tq + (e & 1)];
            u = __fsub_rn(u, ws[e]);
        }
        __syncthreads();  // V' whole; S is not read again this chunk
        if (t0 + C < a.t) copy_chunk_qw(cs, r_pad, h, kh, t0 + C, sm.c);
        cp_async_commit();
        // 6b: o = e^gamma (q S) + Aq V' on the warp's tile.
        float av[4] = {};
#pragma unroll
        for (int k0 = 0; k0 < C; k0 += 8) {
            const Tf32Pair b[2] = {tf32_operand<kPasses>(sm.c.u[k0 + tq][cc + g]),
                                   tf32_operand<kPasses>(sm.c.u[k0 + tq + 4][cc + g])};
            Tf32Pair af[4];
            a_fragment<kPasses>(&sm.c.aq[0][0], kTcPadAq, r, k0, tq, af);
            mma_tf32_passes<kPasses>(av, af, b);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = r + 8 * (e >> 1);
            if (i < n)
                a.y[(size_t)(t0 + i) * value_dim + h * D + c0 + cc + 2 * tq + (e & 1)] =
                    __fmaf_rn(sm.c.e_gamma[i], qs[e], av[e]);
        }
        // 7: S <- e^Gamma S + k^T (e^(Gamma - gamma) V') on the warp's rows of S.
        sb.decay(expf(sm.c.gamma[C - 1]));
#pragma unroll
        for (int k0 = 0; k0 < C; k0 += 8) {
            const int m0 = 16 * warp;
            const float(*k)[kTcPadKT] = sm.c.k;  // k^T's fragment: k rows k0 + tq (+ 4), columns m0 + g (+ 8)
            const Tf32Pair af[4] = {tf32_operand<kPasses>(k[k0 + tq][m0 + g]),
                                    tf32_operand<kPasses>(k[k0 + tq][m0 + g + 8]),
                                    tf32_operand<kPasses>(k[k0 + tq + 4][m0 + g]),
                                    tf32_operand<kPasses>(k[k0 + tq + 4][m0 + g + 8])};
            const float er0 = sm.c.e_rest[k0 + tq], er1 = sm.c.e_rest[k0 + tq + 4];
#pragma unroll
            for (int j = 0; j < kCols / 8; ++j) {
                const Tf32Pair b[2] = {tf32_operand<kPasses>(__fmul_rn(sm.c.u[k0 + tq][8 * j + g], er0)),
                                       tf32_operand<kPasses>(__fmul_rn(sm.c.u[k0 + tq + 4][8 * j + g], er1))};
                mma_tf32_passes<kPasses>(st[j], af, b);
            }
        }
    }
    sb.store_to(a.state_out ? a.state_out : a.state);
}

// ------------------------------------------------------------- the default state phase: operands rounded once
// gdn_chunk_state_tc_kernel<1>'s products in its order, so its bits, on operands already rounded to tf32: the local
// phase rounds q, W, Aq and k (k transposed per chunk: step 7's A operand is k^T), and this kernel rounds S, V' and
// e^(Γ - γ) V' once per chunk into shared memory, stored transposed where they are B operands, instead of each of
// its 8 warps converting every fragment element it loads. Every fragment then comes in by ldmatrix (8 rows of 16
// bytes per matrix: a 32-bit element is a pair of b16, so thread (g, tq) gets element (g, tq) of each 8 x 4 block,
// an m16n8k8 tf32 fragment's layout): H200, a 4,096-row call at 27B widths, 1,107 -> 1,067 us with the phase alone
// 628 -> 533 us (ncu), the same bits.
constexpr int kT32PadRow = D + 4;    // S^T, q and W rows: pitches of 4 words mod 32 put the 8 rows of an ldmatrix
constexpr int kT32PadChunk = C + 4;  // k^T, Aq, V'^T and (e V')^T rows    on 8 different 16-byte bank groups
struct Phase2Tf32Smem {
    alignas(16) float st[kCols][kT32PadRow];     // S^T, rounded
    alignas(16) float q[C][kT32PadRow];
    alignas(16) float w[C][kT32PadRow];
    alignas(16) float kt[D][kT32PadChunk];
    alignas(16) float u[C][kTcPadB];             // U (fp32)
    alignas(16) float aq[C][kT32PadChunk];
    alignas(16) float vt[kCols][kT32PadChunk];   // V'^T, rounded
    alignas(16) float vet[kCols][kT32PadChunk];  // (e^(Γ - γ) V')^T, rounded
    alignas(16) float gamma[C];
    alignas(16) float e_gamma[C];
    alignas(16) float e_rest[C];
};

__device__ __forceinline__ float tf32_rounded(float x) { return __uint_as_float(tf32_rna(x)); }

// An A fragment (rows r0 .. r0 + 15, k columns k0 .. k0 + 7) of a row-major matrix m (kLd floats a row).
template <int kLd>
__device__ __forceinline__ void ldmatrix_a(uint32_t (&a)[4], const float (*m)[kLd], int r0, int k0, int lane) {
    const int mi = lane >> 3;
    ldmatrix_x4(a, &m[r0 + (lane & 7) + 8 * (mi & 1)][k0 + 4 * (mi >> 1)]);
}
// B fragments of columns n0 .. n0 + 7 from a transposed store bt[column][k] (kLd floats a column): k rows k0 .. k0 + 7
// in b[0], b[1] and k0 + 8 .. k0 + 15 in b[2], b[3].
template <int kLd>
__device__ __forceinline__ void ldmatrix_b_k16(uint32_t (&b)[4], const float (*bt)[kLd], int n0, int k0, int lane) {
    ldmatrix_x4(b, &bt[n0 + (lane & 7)][k0 + 4 * (lane >> 3)]);
}
// B fragments of k rows k0 .. k0 + 7: columns n0 .. n0 + 7 in b[0], b[1] and n0 + 8 .. n0 + 15 in b[2], b[3].
template <int kLd>
__device__ __forceinline__ void ldmatrix_b_n16(uint32_t (&b)[4], const float (*bt)[kLd], int n0, int k0, int lane) {
    const int mi = lane >> 3;
    ldmatrix_x4(b, &bt[n0 + (lane & 7) + 8 * (mi >> 1)][k0 + 4 * (mi & 1)]);
}

// acc[m][j] += A_m B over k0 .. k0 + 15 for each matrix A_m of a (rows r0 .. r0 + 15, row-major) and each of the
// warp's kTiles 8-column tiles j of B (columns cc + 8 j .., stored transposed as bt): each B fragment loaded once for
// every A_m, and each accumulator's k0 product before its k0 + 8 one.
template <int kMats, int kTiles, int kLdA, int kLdB>
__device__ __forceinline__ void mma_rows_k16(float (&acc)[kMats][kTiles][4], const float (*const (&a)[kMats])[kLdA],
                                             const float (*bt)[kLdB], int r0, int cc, int k0, int lane) {
    uint32_t lo[kMats][4], hi[kMats][4];
#pragma unroll
    for (int m = 0; m < kMats; ++m) {
        ldmatrix_a(lo[m], a[m], r0, k0, lane);
        ldmatrix_a(hi[m], a[m], r0, k0 + 8, lane);
    }
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
        uint32_t b[4];
        ldmatrix_b_k16(b, bt, cc + 8 * j, k0, lane);
        const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
#pragma unroll
        for (int m = 0; m < kMats; ++m) mma_1688_tf32(acc[m][j], lo[m], b0);
#pragma unroll
        for (int m = 0; m < kMats; ++m) mma_1688_tf32(acc[m][j], hi[m], b1);
    }
}

// Chunk t0's k^T ([D][C] in scratch, gdn_chunk_local_kernel<true>), U columns, Aq rows and decays for block (h, c0).
__device__ __forceinline__ void copy_chunk_rest_kt(const ChunkScratch& cs, size_t r_pad, int h, int kh, int c0,
                                                   int t0, Phase2Tf32Smem& b) {
    const float* kt = cs.k + ((size_t)kh * r_pad + t0) * D;
    for_block_items<C * D / 4>([&](int e) {
        const int d = e / (C / 4), i = 4 * (e % (C / 4));
        cp_async16(&b.kt[d][i], kt + 4 * e);
    });
    copy_chunk_u_aq_decays(cs, r_pad, h, c0, t0, b);
}

// Steps 5 and 6 (W S, q S, Aq V') on warps 0-3, two 8-column tiles each on 16 rows, while warps 4-7 wait; all 8
// update the state. The phase is bound by shared-memory reads (ncu at 22c568a, a tile a warp as the <1> kernel: 519
// us of a 4,096-row call, 18.6% of issue slots busy, stalls short scoreboard 4.6, wait 2.0, MIO throttle 1.8 per
// instruction): with a tile a warp each W and q row block is loaded by 4 warps and each S^T column block by 2, ~160 KB
// of fragments a block and chunk for 5 and 6a; two tiles a warp load ~96 KB (ncu at 0dd9760: 466 us; bench_gdn.py, a
// 4,096-row call: 989 against 1,048 us). Each output is the same chain of products in k order, so the same bits.
__global__ void __launch_bounds__(kThreads, 2) gdn_chunk_state_tf32_kernel(const GdnStepArgs a) {
    constexpr int kTiles = 2;  // a product warp's 8-column tiles
    extern __shared__ float4 smem_raw[];
    Phase2Tf32Smem& sm = *reinterpret_cast<Phase2Tf32Smem*>(smem_raw);
    pdl_start();  // pdl.cuh
    StateBlock sb(a);
    const int h = sb.h, c0 = sb.c0, kh = sb.kh, lane = sb.lane, warp = sb.warp, g = sb.g, tq = sb.tq;
    const int value_dim = a.n_v * D;
    auto& st = sb.st;
    const bool products = warp < kWarps / kTiles;  // steps 5, 6: the warp's rows r0 .., columns cc .. cc + 8 kTiles
    const int r0 = 16 * (warp & 1), cc = 8 * kTiles * (warp >> 1);
    const ChunkScratch cs(a.chunk_scratch, a.n_k, a.n_v, a.t);
    const size_t r_pad = (size_t)(a.t + C - 1) / C * C;
    copy_chunk_qw(cs, r_pad, h, kh, 0, sm);  // as the <1> kernel: q and W a chunk ahead, the rest during 5, 6a
    cp_async_commit();
#pragma unroll 1
    for (int t0 = 0; t0 < a.t; t0 += C) {
        const int n = min(C, a.t - t0);
        if (a.snap_state && t0 == a.snap_row) sb.store_to(a.snap_state);  // the state before row t0
        for_state_fragment(warp, g, tq,
                           [&](int j, int e, int row, int col) { sm.st[col][row] = tf32_rounded(st[j][e]); });
        __syncthreads();  // every warp is done with the previous chunk's k^T, U, Aq, V' and decays
        copy_chunk_rest_kt(cs, r_pad, h, kh, c0, t0, sm);
        cp_async_commit();
        cp_async_wait<1>();  // this chunk's q and W (the group before)
        __syncthreads();
        // 5, 6a: W S and q S on the warp's tiles, 16 k at a time (each accumulator in k order).
        float wq[2][kTiles][4] = {};  // W S, q S
        const float(*const wq_rows[2])[kT32PadRow] = {sm.w, sm.q};
        if (products)
#pragma unroll
            for (int k0 = 0; k0 < D; k0 += 16) mma_rows_k16(wq, wq_rows, sm.st, r0, cc, k0, lane);
        cp_async_wait<0>();
        __syncthreads();  // U, k^T, Aq and the decays whole; every warp is done with q, W and S^T
        // V' = U - W S on the warp's tiles, kept rounded for 6b and, times e^(Γ - γ), for step 7.
        if (products)
#pragma unroll
            for (int j = 0; j < kTiles; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = r0 + g + 8 * (e >> 1), c = cc + 8 * j + 2 * tq + (e & 1);
                    const float v = __fsub_rn(sm.u[i][c], wq[0][j][e]);
                    sm.vt[c][i] = tf32_rounded(v);
                    sm.vet[c][i] = tf32_rounded(__fmul_rn(v, sm.e_rest[i]));
                }
        __syncthreads();  // V' whole
        if (t0 + C < a.t) copy_chunk_qw(cs, r_pad, h, kh, t0 + C, sm);
        cp_async_commit();
        // 6b: o = e^gamma (q S) + Aq V' on the warp's tiles.
        if (products) {
            float av[1][kTiles][4] = {};
            const float(*const aq_rows[1])[kT32PadChunk] = {sm.aq};
#pragma unroll
            for (int k0 = 0; k0 < C; k0 += 16) mma_rows_k16(av, aq_rows, sm.vt, r0, cc, k0, lane);
#pragma unroll
            for (int j = 0; j < kTiles; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = r0 + g + 8 * (e >> 1);
                    if (i < n)
                        a.y[(size_t)(t0 + i) * value_dim + h * D + c0 + cc + 8 * j + 2 * tq + (e & 1)] =
                            __fmaf_rn(sm.e_gamma[i], wq[1][j][e], av[0][j][e]);
                }
        }
        // 7: S <- e^Gamma S + k^T (e^(Gamma - gamma) V') on the warp's rows of S.
        sb.decay(expf(sm.gamma[C - 1]));
#pragma unroll
        for (int k0 = 0; k0 < C; k0 += 8) {
            uint32_t ak[4];
            ldmatrix_a(ak, sm.kt, 16 * warp, k0, lane);
#pragma unroll
            for (int j = 0; j < kCols / 8; j += 2) {
                uint32_t b[4];
                ldmatrix_b_n16(b, sm.vet, 8 * j, k0, lane);
                const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
                mma_1688_tf32(st[j], ak, b0);
                mma_1688_tf32(st[j + 1], ak, b1);
            }
        }
    }
    sb.store_to(a.state_out ? a.state_out : a.state);
}

// OPENJET_GDN_STATE_TC (read at each call): unset, 1 or `tf32` (the default since 2026-12-03) the state phase on
// tensor cores, each product one tf32 mma of operands rounded once (numerics of their own, the same 10-bit mantissa
// as the fp16 operands of every prefill GEMM; within 5e-4 of the float64 recurrence, issue 6's KL bar in the
// engine), since 2026-12-04 by gdn_chunk_state_tf32_kernel on operands the local phase rounded; `tf32-cvt` the same
// products and bits by gdn_chunk_state_tc_kernel<1>, which rounds each fragment as it loads it (to compare);
// `3xtf32` the same products in 3xTF32 (<3>, about fp32's accuracy; the default from 5cc0ff2 to 2026-12-03); 0 the
// FMA form. H200, a 4,096-row call at 27B widths: 1,247 us (tf32-cvt) against 1,756 (3xtf32) and 2,137 (FMA); the
// state phase alone 628 against 1,133 us (ncu).
enum class StateForm { kFma, kTf32, kTf32Cvt, k3xTf32 };
StateForm gdn_state_form() {
    const char* v = std::getenv("OPENJET_GDN_STATE_TC");
    if (!v) return StateForm::kTf32;
    return std::strcmp(v, "0") == 0          ? StateForm::kFma
           : std::strcmp(v, "3xtf32") == 0   ? StateForm::k3xTf32
           : std::strcmp(v, "tf32-cvt") == 0 ? StateForm::kTf32Cvt
                                             : StateForm::kTf32;
}

// OPENJET_GDN_LOCAL_TC (read at each call): unset or 1 (the default since 2026-12-04, a declared numerics change) the
// local phase's A and Aq on tensor cores (chunk_decays_tc) where the tf32 state phase runs; 0 the FMA products (the
// bits of before, which tf32-cvt's state phase reproduces). H200, a 4,096-row call at 27B widths: 960 us against 989.
bool gdn_local_tc() {
    const char* v = std::getenv("OPENJET_GDN_LOCAL_TC");
    return !v || std::strcmp(v, "0") != 0;
}

// gdn_chunk_local_kernel<kTf32Operands, kTcDecays> over a's (chunk, value head) blocks.
template <bool kTf32Operands, bool kTcDecays> cudaError_t launch_local(const GdnStepArgs& a, cudaStream_t stream) {
    if (const cudaError_t e = smem_opted_in<gdn_chunk_local_kernel<kTf32Operands, kTcDecays>, sizeof(Phase1Smem)>())
        return e;
    return launch_kernel(gdn_chunk_local_kernel<kTf32Operands, kTcDecays>, a.n_v * ((a.t + C - 1) / C), kThreads,
                         sizeof(Phase1Smem), stream, a);
}

// Form 2's two launches: the local phase, then the state phase of `form` (where its shared memory fits the device's
// opt-in limit; the 3xTF32 and tf32 forms fall back to the FMA one elsewhere).
cudaError_t launch_two_phases(const GdnStepArgs& a, cudaStream_t stream, int optin) {
    const StateForm form = gdn_state_form();
    const bool rounded = form == StateForm::kTf32 && static_cast<int>(sizeof(Phase2Tf32Smem)) <= optin;
    const bool tc = form != StateForm::kFma && static_cast<int>(sizeof(Phase2TcSmem)) <= optin;
    const int state_blocks = a.n_v * (D / kCols);
    const bool local_tc = rounded && gdn_local_tc();
    if (const cudaError_t e = local_tc  ? launch_local<true, true>(a, stream)
                              : rounded ? launch_local<true, false>(a, stream)
                                        : launch_local<false, false>(a, stream))
        return e;
    if (local_tc) count_launch(Counted::kGdnLocalTensorCores);
    count_launch(Counted::kGdnTwoPhase);
    if (a.snap_state) count_launch(Counted::kGdnSnapshot);
    if (rounded) {
        if (const cudaError_t e = smem_opted_in<gdn_chunk_state_tf32_kernel, sizeof(Phase2Tf32Smem)>()) return e;
        count_launch(Counted::kGdnStateTensorCores);
        count_launch(Counted::kGdnStateRounded);
        return launch_kernel(gdn_chunk_state_tf32_kernel, state_blocks, kThreads, sizeof(Phase2Tf32Smem), stream, a);
    }
    if (tc) {
        const bool three = form == StateForm::k3xTf32;
        if (const cudaError_t e = three ? smem_opted_in<gdn_chunk_state_tc_kernel<3>, sizeof(Phase2TcSmem)>()
                                        : smem_opted_in<gdn_chunk_state_tc_kernel<1>, sizeof(Phase2TcSmem)>())
            return e;
        count_launch(Counted::kGdnStateTensorCores);
        return launch_kernel(three ? gdn_chunk_state_tc_kernel<3> : gdn_chunk_state_tc_kernel<1>, state_blocks,
                             kThreads, sizeof(Phase2TcSmem), stream, a);
    }
    if (const cudaError_t e = smem_opted_in<gdn_chunk_state_kernel, sizeof(Phase2Smem)>()) return e;
    return launch_kernel(gdn_chunk_state_kernel, state_blocks, kThreads, sizeof(Phase2Smem), stream, a);
}

}  // namespace

int gdn_chunked_form() {
    const char* v = std::getenv("OPENJET_GDN_CHUNKED");
    if (!v || !*v) return 2;
    return (v[0] == '0' || v[0] == '1' || v[0] == '2') && v[1] == 0 ? v[0] - '0' : 2;
}

// Shared memory a block of either phase of form 2 asks for.
constexpr int kTwoPhaseSmem = static_cast<int>(sizeof(Phase1Smem) > sizeof(Phase2Smem) ? sizeof(Phase1Smem)
                                                                                        : sizeof(Phase2Smem));

bool gdn_two_phase_runs() {
    int optin = 0;
    return gdn_chunked_form() == 2 && prefill_numerics_own() &&
           device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, &optin) == cudaSuccess && kTwoPhaseSmem <= optin;
}

bool gdn_chunked(const GdnStepArgs& a) {
    if (a.w_beta || !prefill_numerics_own()) return false;
    const int form = gdn_chunked_form();
    return form == 2 ? a.chunk_scratch != nullptr : form == 1 && a.t > kGdnMaxT;
}

size_t gdn_chunk_scratch_floats(int n_k, int n_v, int rows) { return ChunkScratch::floats(n_k, n_v, rows); }

cudaError_t launch_gdn_chunk(const GdnStepArgs& a, cudaStream_t stream, bool* launched) {
    *launched = false;
    int optin = 0;
    if (cudaError_t e = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, &optin)) return e;
    if (gdn_chunked_form() == 2 && a.chunk_scratch) {  // two phases: every chunk's local work at once, then the state
        if (kTwoPhaseSmem > optin) return cudaSuccess;  // (a snapshot request was refused before: gdn_two_phase_runs)
        *launched = true;
        return launch_two_phases(a, stream, optin);
    }
    if (static_cast<int>(sizeof(ChunkSmem)) > optin) return cudaSuccess;
    if (const cudaError_t e = smem_opted_in<gdn_chunk_kernel, sizeof(ChunkSmem)>()) return e;
    *launched = true;
    return launch_kernel(gdn_chunk_kernel, a.n_v * (D / kCols), kThreads, sizeof(ChunkSmem), stream, a);
}

}  // namespace openjet
