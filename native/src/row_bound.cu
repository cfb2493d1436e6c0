// row_bound.cuh's scales and norms.
#include <cstdlib>
#include <cstring>

#include "pdl.cuh"
#include "row_bound.cuh"

namespace openjet {
namespace {

// ||x|| of pack row `row` (its values h / s_x: fp32 sums of the fp16 h, times the pack's exact 1 / s_x), in every lane
// of the calling warp. k % 8 == 0.
__device__ __forceinline__ float pack_row_norm(const ActPack& x, int row, int k, int lane) {
    const uint4* h = reinterpret_cast<const uint4*>(x.h + static_cast<long long>(row) * k);
    float sum = 0.0f;
    for (int i = lane; i < k / 8; i += 32) {
        const uint4 q = h[i];
        const __half2* p = reinterpret_cast<const __half2*>(&q);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float2 f = __half22float2(p[j]);
            sum = fmaf(f.x, f.x, fmaf(f.y, f.y, sum));
        }
    }
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    return sqrtf(sum) * x.inv[row];
}

// The scale for a bound: one sixteenth more covers the fp32 sums (each within ~k 2^-24 of exact);
// s = 2^act_pack_shift puts bound s in [2^14, 2^15). Not finite: x itself overflowed (2^-100, as the pack's clamp).
__device__ __forceinline__ int bound_shift(float bound) {
    bound *= 1.0625f;
    return bound <= 3.0e38f ? act_pack_shift(bound) : -100;
}

// silu(g) lies in [-0.2785, max(g, 0)]: its minimum -0.27846 at g = -1.2785.
constexpr float kSiluFloor = 0.2785f;

// A warp a row.
__global__ void __launch_bounds__(256) ffn_row_scale_kernel(ActPack x, int k, int t, const float* __restrict__ norms,
                                                            float* __restrict__ s, float* __restrict__ inv) {
    pdl_start();  // pdl.cuh: x is the previous kernel's
    const int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= t) return;
    const float nx = pack_row_norm(x, row, k, lane);
    if (lane == 0) {
        const int sh = bound_shift(fmaxf(nx * norms[0], kSiluFloor) * (nx * norms[1]));
        s[row] = ldexpf(1.0f, sh);
        inv[row] = ldexpf(1.0f, -sh);
    }
}

__global__ void __launch_bounds__(256) gdn_out_scale_kernel(ActPack x, int k, int t, float z_max, float w_max,
                                                            float* __restrict__ s) {
    pdl_start();
    const int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= t) return;
    const float nx = pack_row_norm(x, row, k, lane);
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

}  // namespace

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
