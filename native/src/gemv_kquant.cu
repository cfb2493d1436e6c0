// launch_gemv: the dispatcher of the decode GEMV family (k-quant kernels in gemv_kquant_<type>.cu), the
// launch shape sized from the device, and the F32 small projection (ssm_alpha / ssm_beta, [48, 5120]).
#include "gemv_kquant.cuh"

namespace openjet {
namespace {

int sm_count_of_current_device() {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 0;
    return sms;
}

// y[t, n] = W[n, :] . x[t, :] for F32 W: one block per row, 128 threads, float4 loads, fixed-order sums.
template <int T>
__global__ void __launch_bounds__(128) gemv_f32_kernel(const float* __restrict__ w, const float* __restrict__ x,
                                                       int n, int k, float* __restrict__ y) {
    __shared__ float part[4][T];
    const int row = blockIdx.x, k4 = k / 4;
    const float4* wr = reinterpret_cast<const float4*>(w + (long long)row * k);
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; ++t) acc[t] = 0.0f;
    for (int i = threadIdx.x; i < k4; i += 128) {
        const float4 a = wr[i];
#pragma unroll
        for (int t = 0; t < T; ++t) {
            const float4 b = __ldg(reinterpret_cast<const float4*>(x + (long long)t * k) + i);
            float s = acc[t];
            s = __fmaf_rn(a.x, b.x, s);
            s = __fmaf_rn(a.y, b.y, s);
            s = __fmaf_rn(a.z, b.z, s);
            acc[t] = __fmaf_rn(a.w, b.w, s);
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int t = 0; t < T; ++t) {
        float v = acc[t];
#pragma unroll
        for (int m = 16; m >= 1; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
        if (lane == 0) part[warp][t] = v;
    }
    __syncthreads();
    if (threadIdx.x < T) {
        const int t = threadIdx.x;
        y[(long long)t * n + row] = ((part[0][t] + part[1][t]) + part[2][t]) + part[3][t];
    }
}

template <int T>
cudaError_t launch_gemv_f32_t(const GemvArgs& a, cudaStream_t stream) {
    gemv_f32_kernel<T><<<a.n, 128, 0, stream>>>(static_cast<const float*>(a.w), a.xf, a.n, a.k, a.y);
    return cudaGetLastError();
}

cudaError_t launch_gemv_f32(const GemvArgs& a, cudaStream_t stream) {
    if (a.k % 4 || !a.xf || (reinterpret_cast<uintptr_t>(a.w) | reinterpret_cast<uintptr_t>(a.xf)) & 15)
        return cudaErrorInvalidValue;
    switch (a.t) {
        case 1: return launch_gemv_f32_t<1>(a, stream);
        case 2: return launch_gemv_f32_t<2>(a, stream);
        case 3: return launch_gemv_f32_t<3>(a, stream);
        case 4: return launch_gemv_f32_t<4>(a, stream);
        case 5: return launch_gemv_f32_t<5>(a, stream);
        case 6: return launch_gemv_f32_t<6>(a, stream);
        case 7: return launch_gemv_f32_t<7>(a, stream);
        case 8: return launch_gemv_f32_t<8>(a, stream);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace

// Rows per warp: 4 shares each activation load among 4 weight rows (at T = 8 the activation bytes read
// from L1 are 3T/R times the weight bytes), as long as the grid still gives every SM >= 8 warps; fewer
// rows per warp for small n. Warps per block: 4, halved while the grid would leave SMs without 2 blocks.
// Neither depends on T, and a row's arithmetic depends on neither (see gemv_kquant.cuh).
cudaError_t gemv_launch_shape(int qtype, int n, int k, int t, int* rows_per_warp, int* warps_per_block,
                              int* blocks) {
    const int elems = block_elems(qtype);
    if (elems == 0 || n <= 0 || k <= 0 || k % elems || k % kQ8Block || t < 1 || t > kGemvMaxT)
        return cudaErrorInvalidValue;
    const int sms = sm_count_of_current_device();
    if (sms <= 0) return cudaErrorNoDevice;
    if (qtype == kF32) {
        *rows_per_warp = 1;
        *warps_per_block = 4;
        *blocks = n;
        return cudaSuccess;
    }
    int r = 4;
    while (r > 1 && (n + r - 1) / r < 8 * sms) r /= 2;
    const int warps = (n + r - 1) / r;
    int wpb = kGemvMaxWarpsPerBlock;
    while (wpb > 1 && (warps + wpb - 1) / wpb < 2 * sms) wpb /= 2;
    *rows_per_warp = r;
    *warps_per_block = wpb;
    *blocks = (warps + wpb - 1) / wpb;
    return cudaSuccess;
}

cudaError_t launch_gemv(const GemvArgs& a, cudaStream_t stream) {
    int r = 0, wpb = 0, blocks = 0;
    const cudaError_t e = gemv_launch_shape(a.qtype, a.n, a.k, a.t, &r, &wpb, &blocks);
    if (e != cudaSuccess) return e;
    if (!a.w || !a.y) return cudaErrorInvalidValue;
    if (a.qtype == kF32) return launch_gemv_f32(a, stream);
    if (!a.xq || !a.xds || (reinterpret_cast<uintptr_t>(a.w) | reinterpret_cast<uintptr_t>(a.xq)) & 15)
        return cudaErrorInvalidValue;
    switch (a.qtype) {
        case kQ4_K: return launch_gemv_type<kQ4_K>(a, r, wpb, stream);
        case kQ5_K: return launch_gemv_type<kQ5_K>(a, r, wpb, stream);
        case kQ6_K: return launch_gemv_type<kQ6_K>(a, r, wpb, stream);
        case kQ8_0: return launch_gemv_type<kQ8_0>(a, r, wpb, stream);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace openjet
