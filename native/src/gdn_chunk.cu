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
constexpr int kRowPad = D + 1;            // q̂ / k̂ rows padded: a warp reading 32 rows at one d hits 32 banks
static_assert(kCols == 32 && C == 32 && C % kWarps == 0 && D % kWarps == 0, "lane = column, warp = row group");
static_assert(kCols + D <= kThreads, "a thread per column of [U | W]");

struct ChunkSmem {
    float4 conv_w[kChannels];       // the block's conv taps (tap 3: the current token)
    float conv_x[3][kChannels];     // each channel's last three raw inputs
    float q[C][kRowPad], k[C][kRowPad];
    float v[C][kCols];
    float w[C][D];                  // W
    float u[C][kCols];              // U, then V'
    float s[D][kCols];              // S[k][column]
    float a[C][C], aq[C][C];
    float beta[C], gamma[C], e_gamma[C], e_rest[C];  // β, γ, e^γ, e^(Γ - γ)
};

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
        return ch < D ? kh * D + ch : ch < 2 * D ? key_dim + kh * D + (ch - D) : 2 * key_dim + h * D + c0 + (ch - 2 * D);
    };
    const size_t s0 = (size_t)h * D * D + c0;  // S[h][r][c0 + c] at s0 + r * D + c

    for (int e = tid; e < D * kCols; e += kThreads) sm.s[e / kCols][e % kCols] = a.state[s0 + (size_t)(e / kCols) * D + e % kCols];
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
#pragma unroll 4
            for (int t = 0; t < C; ++t) {
                float out = 0.0f;
                if (t < n) {
                    const float xt = a.qkv[(size_t)(t0 + t) * conv_dim + c];
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

        // 3. A and Aq: entry (i, j = lane) for rows i = warp + 8 m; the decays e^γ and e^(Γ - γ).
        if (tid < C) {
            sm.e_gamma[tid] = expf(sm.gamma[tid]);
            sm.e_rest[tid] = expf(__fsub_rn(sm.gamma[C - 1], sm.gamma[tid]));
        }
#pragma unroll 1
        for (int m = 0; m < C / kWarps; ++m) {
            const int i = warp + kWarps * m, j = lane;
            float kk = 0.0f, qk = 0.0f, dec = 0.0f;
            if (j <= i) {
#pragma unroll 8
                for (int d = 0; d < D; ++d) {
                    kk = __fmaf_rn(sm.k[i][d], sm.k[j][d], kk);
                    qk = __fmaf_rn(sm.q[i][d], sm.k[j][d], qk);
                }
                dec = expf(__fsub_rn(sm.gamma[i], sm.gamma[j]));  // <= 1: masked before the exp
            }
            sm.a[i][j] = j < i ? __fmul_rn(__fmul_rn(sm.beta[i], kk), dec) : 0.0f;
            sm.aq[i][j] = __fmul_rn(qk, dec);
        }
        __syncthreads();

        // 4. (I + A) [U | W] = [β v | β e^γ k̂] by forward substitution: thread c < kCols solves U's column c,
        // thread kCols + d W's column d; a column only reads its own earlier rows, so no barrier inside.
        if (tid < kCols + D) {
            const bool is_u = tid < kCols;
            const int c = is_u ? tid : tid - kCols;
            float x[C];
#pragma unroll
            for (int i = 0; i < C; ++i) {
                float acc = is_u ? __fmul_rn(sm.beta[i], sm.v[i][c])
                                 : __fmul_rn(__fmul_rn(sm.beta[i], sm.e_gamma[i]), sm.k[i][c]);
#pragma unroll
                for (int j = 0; j < i; ++j) acc = __fmaf_rn(-sm.a[i][j], x[j], acc);
                x[i] = acc;
            }
#pragma unroll
            for (int i = 0; i < C; ++i) {
                if (is_u) sm.u[i][c] = x[i];
                else sm.w[i][c] = x[i];
            }
        }
        __syncthreads();

        // 5. V' = U - W S, in place of U: entry (i, lane), rows i = warp + 8 m (each read and written by one thread).
#pragma unroll
        for (int m = 0; m < C / kWarps; ++m) {
            const int i = warp + kWarps * m;
            float ws = 0.0f;
#pragma unroll 8
            for (int d = 0; d < D; ++d) ws = __fmaf_rn(sm.w[i][d], sm.s[d][lane], ws);
            sm.u[i][lane] = __fsub_rn(sm.u[i][lane], ws);
        }
        __syncthreads();

        // 6. o = e^γ (q̂ S) + Aq V', rows < n written to y (the gated RMSNorm's launch reads them there).
#pragma unroll 1
        for (int m = 0; m < C / kWarps; ++m) {
            const int i = warp + kWarps * m;
            if (i >= n) continue;
            float qs = 0.0f, av = 0.0f;
#pragma unroll 8
            for (int d = 0; d < D; ++d) qs = __fmaf_rn(sm.q[i][d], sm.s[d][lane], qs);
            for (int j = 0; j <= i; ++j) av = __fmaf_rn(sm.aq[i][j], sm.u[j][lane], av);
            a.y[(size_t)(t0 + i) * value_dim + (size_t)h * D + c0 + lane] = __fmaf_rn(sm.e_gamma[i], qs, av);
        }
        __syncthreads();  // S is read above and rewritten below

        // 7. S ← e^Γ S + Σ_i k̂_i e^(Γ - γ_i) V'_i: entry (r, lane), rows r = warp + 8 m.
        const float e_all = expf(sm.gamma[C - 1]);
#pragma unroll 2
        for (int m = 0; m < D / kWarps; ++m) {
            const int r = warp + kWarps * m;
            float acc = 0.0f;
#pragma unroll 8
            for (int i = 0; i < C; ++i) acc = __fmaf_rn(__fmul_rn(sm.k[i][r], sm.e_rest[i]), sm.u[i][lane], acc);
            sm.s[r][lane] = __fmaf_rn(e_all, sm.s[r][lane], acc);
        }
        __syncthreads();  // the next chunk rewrites q, k, v, u
    }

    float* so = a.state_out ? a.state_out : a.state;
    for (int e = tid; e < D * kCols; e += kThreads) so[s0 + (size_t)(e / kCols) * D + e % kCols] = sm.s[e / kCols][e % kCols];
}

}  // namespace

bool gdn_chunked(const GdnStepArgs& a) {
    if (a.w_beta || a.t <= kGdnMaxT) return false;
    const char* v = std::getenv("OPENJET_GDN_CHUNKED");
    return v && std::strcmp(v, "1") == 0;
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
