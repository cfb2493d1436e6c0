// row_bound.cuh's scales and norms.
#include <cstdlib>
#include <cstring>

#include "elementwise.cuh"  // swiglu1
#include "pdl.cuh"
#include "row_bound.cuh"

namespace openjet {
namespace {

// A warp a row.
__global__ void __launch_bounds__(256) ffn_row_scale_kernel(ActPack x, int k, int t, const float* __restrict__ norms,
                                                            float* __restrict__ s, float* __restrict__ inv) {
    pdl_start();  // pdl.cuh: x is the previous kernel's
    const int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= t) return;
    const float nx = pack_row_norm(x.h + static_cast<long long>(row) * k, k, lane) * x.inv[row];
    if (lane == 0) {
        const int sh = ffn_bound_shift(nx, norms[0], norms[1]);
        s[row] = ldexpf(1.0f, sh);
        inv[row] = ldexpf(1.0f, -sh);
    }
}

__global__ void __launch_bounds__(256) gdn_out_scale_kernel(ActPack x, int k, int t, float z_max, float w_max,
                                                            float* __restrict__ s) {
    pdl_start();
    const int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= t) return;
    const float nx = pack_row_norm(x.h + static_cast<long long>(row) * k, k, lane) * x.inv[row];
    if (lane == 0) s[row] = ldexpf(1.0f, bound_shift(fmaxf(nx * z_max, kSiluFloor) * (11.3137085f * w_max)));
}

// A block a row, the largest by atomicMax on the non-negative floats' bits.
__global__ void __launch_bounds__(256) row_norm_max_kernel(const __half* __restrict__ w16, int k, long long ld,
                                                           float* out) {
    __shared__ float part[8];
    const __half2* row = reinterpret_cast<const __half2*>(w16 + blockIdx.x * ld);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < k / 2; i += 256) {
        const float2 f = __half22float2(row[i]);
        sum = fmaf(f.x, f.x, fmaf(f.y, f.y, sum));
    }
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int w = 0; w < 8; ++w) total += part[w];
        atomicMax(reinterpret_cast<int*>(out), __float_as_int(sqrtf(total)));
    }
}

// A block a row: warp 0 the row's scale, then each warp 32-blocks w, w + 8, ... (lane: the block's element).
__global__ void __launch_bounds__(256) swiglu_bound_pack_kernel(const float* __restrict__ gate,
                                                                const float* __restrict__ up, long long ld, int n,
                                                                ActPack x, int k, float g_max, float u_max,
                                                                ActPack out) {
    pdl_start();
    __shared__ float row_s;
    const int r = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp == 0) {
        const float nx = pack_row_norm(x.h + static_cast<long long>(r) * k, k, lane) * x.inv[r];
        const int sh = ffn_bound_shift(nx, g_max, u_max);
        if (lane == 0) {
            row_s = ldexpf(1.0f, sh);
            out.inv[r] = ldexpf(1.0f, -sh);
        }
    }
    __syncthreads();  // (x's row read before any warp writes out's)
    const float s = row_s;
    const float* g = gate + static_cast<long long>(r) * ld;
    const float* u = up + static_cast<long long>(r) * ld;
    __half* const h = out.h + static_cast<long long>(r) * n;
    __half* const sums = out.sum + static_cast<long long>(r) * (n / kActBlock) * 2;
    for (int b = warp; b < n / kActBlock; b += 8) {
        const int i = b * kActBlock + lane;
        const __half hv = __float2half_rn(__fmul_rn(swiglu1(__ldg(g + i), __ldg(u + i)), s));
        h[act_quad_pos(i)] = hv;
        float v = __half2float(hv);
        v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 8));  // rows e and e + 8 of the 16-row tile
#pragma unroll
        for (int o = 1; o <= 4; o <<= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
        const float other = __shfl_xor_sync(0xffffffffu, v, 16);
        if (lane == 0) act_store_sum(__fadd_rn(v, other), b, sums);  // (v: the first half's)
    }
}

}  // namespace

cudaError_t launch_swiglu_bound_pack(const float* gate, const float* up, long long ld, int t, int n, const ActPack& x,
                                     int k, float g_max, float u_max, const ActPack& out, cudaStream_t stream) {
    if (!gate || !up || !x.h || !x.inv || !out.h || !out.sum || !out.inv || t < 1 || t > out.rows || t > x.rows ||
        n < kActBlock || n % kActBlock || (ld && ld < n) || k < 8 || k % 8 || !(g_max > 0.0f) || !(u_max > 0.0f))
        return cudaErrorInvalidValue;
    if (!act_pack_plain(out)) return cudaErrorNotSupported;  // (it writes no integer twin)
    return launch_kernel(swiglu_bound_pack_kernel, t, 256, 0, stream, gate, up, ld ? ld : n, n, x, k, g_max, u_max,
                         out);
}

bool gdn_pack_bound() {
    const char* v = std::getenv("OPENJET_GDN_PACK_BOUND");
    return !v || std::strcmp(v, "0") != 0;
}

cudaError_t launch_ffn_row_scale(const ActPack& x, int k, int t, const float* norms, float* s, float* inv,
                                 cudaStream_t stream) {
    if (!x.h || !x.inv || !norms || !s || !inv || t < 1 || k < 8 || k % 8) return cudaErrorInvalidValue;
    return launch_kernel(ffn_row_scale_kernel, (t + 7) / 8, 256, 0, stream, x, k, t, norms, s, inv);
}

cudaError_t launch_gdn_out_scale(const ActPack& x, int k, int t, float z_max, float w_max, float* s,
                                 cudaStream_t stream) {
    if (!x.h || !x.inv || !s || t < 1 || k < 8 || k % 8 || !(z_max >= 0.0f) || !(w_max >= 0.0f))
        return cudaErrorInvalidValue;
    return launch_kernel(gdn_out_scale_kernel, (t + 7) / 8, 256, 0, stream, x, k, t, z_max, w_max, s);
}

cudaError_t launch_row_norm_max(const __half* w16, int n, int k, long long ld, float* out, cudaStream_t stream) {
    if (!w16 || !out || n < 1 || k < 2 || k % 2 || ld < k || ld % 2) return cudaErrorInvalidValue;
    if (const cudaError_t e = cudaMemsetAsync(out, 0, sizeof(float), stream)) return e;
    return launch_kernel(row_norm_max_kernel, n, 256, 0, stream, w16, k, ld, out);
}

}  // namespace openjet
