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
#include <cstdlib>
#include <cstring>

#include "device_attr.cuh"
#include "gdn_chunk.cuh"
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
    // The block's state columns: element e of sm.s (row e / kCols, column e % kCols) is S[h][e / kCols][c0 + e % kCols].
    const auto state_at = [&](int e) { return (size_t)h * D * D + (size_t)(e / kCols) * D + c0 + e % kCols; };
    for (int e = tid; e < D * kCols; e += kThreads) (&sm.s[0][0])[e] = a.state[state_at(e)];
    for (int ch = tid; ch < kChannels; ch += kThreads) {
        const int c = channel(ch);
        sm.conv_w[ch] = make_float4(a.conv_w[c * 4 + 0], a.conv_w[c * 4 + 1], a.conv_w[c * 4 + 2], a.conv_w[c * 4 + 3]);
#pragma unroll
        for (int i = 0; i < 3; ++i) sm.conv_x[i][ch] = a.conv_state_in[(size_t)i * conv_dim + c];
    }
    const float ssm_a = a.ssm_a[h], dt_bias = a.dt_bias[h];
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
            const int stride = ch < 2 * D ? kRowPad : kCols;
            float xin[C];  // every load in flight at once
#pragma unroll
            for (int t = 0; t < C; ++t) xin[t] = t < n ? a.qkv[(size_t)(t0 + t) * conv_dim + c] : 0.0f;
#pragma unroll
            for (int t = 0; t < C; ++t) {
                float out = 0.0f;
                if (t < n) {
                    const float xt = xin[t];
                    out = gdn_silu(__fadd_rn(__fadd_rn(__fadd_rn(__fmul_rn(x0, cw.x), __fmul_rn(x1, cw.y)),
                                                       __fmul_rn(x2, cw.z)),
                                             __fmul_rn(xt, cw.w)));
                    x0 = x1, x1 = x2, x2 = xt;
                }
                dst[t * stride] = out;
            }
            sm.conv_x[0][ch] = x0, sm.conv_x[1][ch] = x1, sm.conv_x[2][ch] = x2;
            // The call's last rows: q/k channels are written by the one block with h < n_k and c0 = 0.
            if (t0 + n == a.t && (ch >= 2 * D || (h == kh && c0 == 0))) {
                a.conv_state_out[c] = x0;
                a.conv_state_out[conv_dim + c] = x1;
                a.conv_state_out[2 * conv_dim + c] = x2;
            }
        }
        if (tid < C) {
            float beta = 0.0f, g = 0.0f;  // past n: the state is left as it is
            if (tid < n) {
                const int row = t0 + tid;
                beta = gdn_sigmoid(a.b[row * a.n_v + h]);
                g = __fmul_rn(ssm_a, gdn_softplus(__fadd_rn(a.alpha[row * a.n_v + h], dt_bias)));
            }
            sm.beta[tid] = beta;
            sm.gamma[tid] = g;
        }
        __syncthreads();

        // 2. q ← x·rsqrt(Σx² + eps)/√128, k ← x·rsqrt(Σx² + eps), one warp per row (zero rows stay zero);
        // γ = the running sum of g (one thread, in order).
        if (tid == 0) {
            float acc = 0.0f;
            for (int t = 0; t < C; ++t) sm.gamma[t] = acc = __fadd_rn(acc, sm.gamma[t]);
        }
        for (int rw = warp; rw < 2 * C; rw += kWarps) {
            float* row = (rw & 1) ? sm.k[rw >> 1] : sm.q[rw >> 1];
            const float inv = __frcp_rn(__fsqrt_rn(__fadd_rn(gdn_warp_sumsq(row, lane), a.eps)));
            const float scale = (rw & 1) ? 1.0f : 0.08838834764831845f;  // float32(1/sqrt(128))
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float x = __fmul_rn(row[lane + 32 * i], inv);
                row[lane + 32 * i] = (rw & 1) ? x : __fmul_rn(x, scale);
            }
        }
        __syncthreads();

        // 3. A and Aq: entries (i, j = lane) for rows i = warp + 8 m (k̂_j in 16-byte steps, the rows' k̂_i, q̂_i
        // broadcast); the decays e^γ and e^(Γ - γ).
        if (tid < C) {
            sm.e_gamma[tid] = expf(sm.gamma[tid]);
            sm.e_rest[tid] = expf(__fsub_rn(sm.gamma[C - 1], sm.gamma[tid]));
        }
        {
            constexpr int M = C / kWarps;
            float kk[M] = {}, qk[M] = {};
#pragma unroll 4
            for (int d = 0; d < D; d += 4) {
                const float4 kj = *reinterpret_cast<const float4*>(&sm.k[lane][d]);
#pragma unroll
                for (int m = 0; m < M; ++m) {
                    kk[m] = f32_fma4(*reinterpret_cast<const float4*>(&sm.k[warp + kWarps * m][d]), kj, kk[m]);
                    qk[m] = f32_fma4(*reinterpret_cast<const float4*>(&sm.q[warp + kWarps * m][d]), kj, qk[m]);
                }
            }
#pragma unroll
            for (int m = 0; m < M; ++m) {
                const int i = warp + kWarps * m, j = lane;
                const float dec = j <= i ? expf(__fsub_rn(sm.gamma[i], sm.gamma[j])) : 0.0f;  // masked before the exp
                sm.a[i][j] = j < i ? __fmul_rn(__fmul_rn(sm.beta[i], kk[m]), dec) : 0.0f;
                sm.aq[i][j] = j <= i ? __fmul_rn(qk[m], dec) : 0.0f;
            }
        }
        __syncthreads();

        // 4. (I + A) [U | W] = [β v | β e^γ k̂] by forward substitution: thread c < kCols solves U's column c,
        // thread kCols + d W's column d; a column only reads its own earlier rows, so no barrier inside.
        if (tid < kCols + D) {
            const bool is_u = tid < kCols;
            const int c = is_u ? tid : tid - kCols;
            float x[C];  // zeros ahead of row i: A is zero there too, so the 16-byte steps past j = i - 1 add nothing
#pragma unroll
            for (int i = 0; i < C; ++i) x[i] = 0.0f;
#pragma unroll
            for (int i = 0; i < C; ++i) {
                float acc = is_u ? __fmul_rn(sm.beta[i], sm.v[i][c])
                                 : __fmul_rn(__fmul_rn(sm.beta[i], sm.e_gamma[i]), sm.k[i][c]);
#pragma unroll
                for (int j = 0; j < i; j += 4) {
                    const float4 av = *reinterpret_cast<const float4*>(&sm.a[i][j]);
                    acc = __fmaf_rn(-av.x, x[j], acc);
                    acc = __fmaf_rn(-av.y, x[j + 1], acc);
                    acc = __fmaf_rn(-av.z, x[j + 2], acc);
                    acc = __fmaf_rn(-av.w, x[j + 3], acc);
                }
                x[i] = acc;
            }
#pragma unroll
            for (int i = 0; i < C; ++i) {
                if (is_u) sm.u[i][c] = x[i];
                else sm.w[i][c] = x[i];
            }
        }
        __syncthreads();

        // 5. V' = U - W S, in place of U: entries (i, lane), rows i = warp + 8 m (each read and written by one thread).
        {
            constexpr int M = C / kWarps;
            float ws[M];
            warp_rows_times_lane_column<D, D>(&sm.w[0][0], &sm.s[0][0], warp, lane, ws);
#pragma unroll
            for (int m = 0; m < M; ++m) {
                const int i = warp + kWarps * m;
                sm.u[i][lane] = __fsub_rn(sm.u[i][lane], ws[m]);
            }
        }
        __syncthreads();

        // 6. o = e^γ (q̂ S) + Aq V' (Aq is zero above the diagonal), rows < n written to y (the gated RMSNorm's
        // launch reads them there).
        {
            constexpr int M = C / kWarps;
            float qs[M], av[M];
            warp_rows_times_lane_column<D, kRowPad>(&sm.q[0][0], &sm.s[0][0], warp, lane, qs);
            warp_rows_times_lane_column<C, C>(&sm.aq[0][0], &sm.u[0][0], warp, lane, av);
#pragma unroll
            for (int m = 0; m < M; ++m) {
                const int i = warp + kWarps * m;
                if (i < n) a.y[(size_t)(t0 + i) * value_dim + h * D + c0 + lane] = __fmaf_rn(sm.e_gamma[i], qs[m], av[m]);
            }
        }
        __syncthreads();  // S is read above and rewritten below

        // 7. S ← e^Γ S + Σ_i k̂_i (e^(Γ - γ_i) V'_i): entries (r, lane), the warp's 16 rows r = 16 warp + m (their k̂
        // values of token i: four 16-byte broadcasts).
        {
            constexpr int R = D / kWarps;
            const float e_all = expf(sm.gamma[C - 1]);
            const int r0 = R * warp;
            float acc[R] = {};
#pragma unroll 4
            for (int i = 0; i < C; ++i) {
                const float vp = __fmul_rn(sm.u[i][lane], sm.e_rest[i]);
#pragma unroll
                for (int q4 = 0; q4 < R / 4; ++q4) {
                    const float4 kv = *reinterpret_cast<const float4*>(&sm.k[i][r0 + 4 * q4]);
                    acc[4 * q4 + 0] = __fmaf_rn(kv.x, vp, acc[4 * q4 + 0]);
                    acc[4 * q4 + 1] = __fmaf_rn(kv.y, vp, acc[4 * q4 + 1]);
                    acc[4 * q4 + 2] = __fmaf_rn(kv.z, vp, acc[4 * q4 + 2]);
                    acc[4 * q4 + 3] = __fmaf_rn(kv.w, vp, acc[4 * q4 + 3]);
                }
            }
#pragma unroll
            for (int m = 0; m < R; ++m) sm.s[r0 + m][lane] = __fmaf_rn(e_all, sm.s[r0 + m][lane], acc[m]);
        }
        __syncthreads();  // the next chunk rewrites q, k, v, u
    }

    float* so = a.state_out ? a.state_out : a.state;
    for (int e = tid; e < D * kCols; e += kThreads) so[state_at(e)] = (&sm.s[0][0])[e];
}

}  // namespace

bool gdn_chunked(const GdnStepArgs& a) {
    if (a.w_beta || a.t <= kGdnMaxT) return false;
    const char* v = std::getenv("OPENJET_GDN_CHUNKED");
    return v && std::strcmp(v, "1") == 0 && prefill_numerics_own();
}

cudaError_t launch_gdn_chunk(const GdnStepArgs& a, cudaStream_t stream, bool* launched) {
    *launched = false;
    int optin = 0;
    if (cudaError_t e = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, &optin)) return e;
    if (static_cast<int>(sizeof(ChunkSmem)) > optin) return cudaSuccess;
    static const cudaError_t opted =
        cudaFuncSetAttribute(gdn_chunk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, sizeof(ChunkSmem));
    if (opted != cudaSuccess) return opted;
    *launched = true;
    return launch_kernel(gdn_chunk_kernel, a.n_v * (D / kCols), kThreads, sizeof(ChunkSmem), stream, a);
}

}  // namespace openjet
