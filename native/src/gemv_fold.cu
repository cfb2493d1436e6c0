// The fold (gemv_fold.cuh): which calls take it, its pack launch for more than one token row, and its dispatch over the
// producer-warp GEMV's fold forms (gemv_tma.cu launch_gemv_tma_fold).
#include "gemv_fold.cuh"

#include "gemv_fold_device.cuh"
#include "gemv_tma.cuh"
#include "launch_count.h"
#include "pdl.cuh"

namespace openjet {
namespace {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// launch_fold_pack's kernel: block c packs token row c (fold_pack_row).
__global__ void __launch_bounds__(kFoldThreads) fold_pack_kernel(GemvFold f, int k, ActPack p) {
    pdl_launch_dependents();
    pdl_wait();  // u and its partials are the kernel before's
    const int c = blockIdx.x, nt = k / kMmaRows;
    __shared__ float2 c_inv;
    const FoldRowCopy copy{f.a_out ? f.a_out + static_cast<long long>(c) * k : nullptr, nullptr, nullptr};
    fold_pack_row(f.u_in + static_cast<long long>(c) * k, f.part_in + static_cast<long long>(c) * nt, k, f.eps,
                  p.h + static_cast<long long>(c) * k, p.sum + static_cast<long long>(c) * (k / kActBlock) * 2,
                  &c_inv, copy);
    if (threadIdx.x == 0) {
        p.inv[c] = c_inv.y;
        if (f.scales) f.scales[c] = c_inv;
    }
}

// launch_fold_add_norm_pack's first kernel: block c makes token row c's h_out, u and partials with A's epilogue
// arithmetic (hn = fl(delta + h), u = fl(hn w), fold_tile_partials), warp w taking the row's tiles w, w + 4, ...
__global__ void __launch_bounds__(kFoldThreads) fold_rows_kernel(const float* h, const float* __restrict__ delta,
                                                                 const float* __restrict__ w, int k, float* h_out,
                                                                 float* __restrict__ u, float4* __restrict__ part) {
    pdl_launch_dependents();
    pdl_wait();  // h and the delta are the kernels' before
    const int lane = threadIdx.x & 31, g = lane >> 2, nt = k / kMmaRows;
    const long long row = static_cast<long long>(blockIdx.x) * k;
    for (int tile = threadIdx.x >> 5; tile < nt; tile += kFoldThreads / 32) {
        float hn[2], uu[2];
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int i = tile * kMmaRows + g + 8 * hr;
            hn[hr] = delta ? __fadd_rn(delta[row + i], h[row + i]) : h[row + i];
            uu[hr] = __fmul_rn(hn[hr], __ldg(w + i));
        }
        const float4 p = fold_tile_partials(hn, uu);  // (every lane's reads before any write: h_out may be h)
        if ((lane & 3) == 0) {
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const int i = tile * kMmaRows + g + 8 * hr;
                if (delta) h_out[row + i] = hn[hr];
                u[row + i] = uu[hr];
            }
        }
        if (lane == 0) part[static_cast<long long>(blockIdx.x) * nt + tile] = p;
    }
}
#else
__global__ void fold_pack_kernel(GemvFold, int, ActPack) {}
__global__ void fold_rows_kernel(const float*, const float*, const float*, int, float*, float*, float4*) {}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace

bool gemv_fold_takes(const GemvArgs& a, bool in) {
    return (a.qtype == kQ4_K || a.qtype == kQ5_K || a.qtype == kQ6_K) && gemv_tma_takes(a, nullptr) &&
           (!in || a.k <= kFoldMaxK);
}

cudaError_t launch_fold_pack(const GemvFold& f, int t, int k, const ActPack& p, cudaStream_t stream) {
    if (t < 1 || t > p.rows || k % kUnitElems || k > kFoldMaxK || !f.u_in || !f.part_in || !(f.eps >= 0.0f) ||
        !gemv_tma_available())
        return cudaErrorInvalidValue;
    if (!act_pack_plain(p)) return cudaErrorNotSupported;  // (it writes no integer twin)
    return launch_kernel(fold_pack_kernel, t, kFoldThreads, 0, stream, f, k, p);
}

cudaError_t launch_fold_add_norm_pack(const float* h, const float* delta, const float* w, int t, int k, float eps,
                                      float* h_out, float* u, float4* part, float* a_out, const ActPack& p,
                                      cudaStream_t stream) {
    if (!h || !w || !u || !part || (delta && !h_out) || t < 1 || t > p.rows || k % kUnitElems || k > kFoldMaxK)
        return cudaErrorInvalidValue;
    count_launch(Counted::kFoldAddNorm);
    if (const cudaError_t e = launch_kernel(fold_rows_kernel, t, kFoldThreads, 0, stream, h, delta, w, k, h_out, u,
                                           part))
        return e;
    GemvFold f;
    f.u_in = u, f.part_in = part, f.eps = eps, f.a_out = a_out;
    return launch_fold_pack(f, t, k, p, stream);
}

bool gemv_swiglu_takes(const GemvArgs& a, const GemvArgs& b) {
    return a.qtype == kQ4_K && a.t == 1 && b.n == a.n && gemv_tma_takes(a, &b);
}

cudaError_t launch_gemv_swiglu(const GemvArgs& a, const GemvArgs& b, const GemvFold& f, bool fold_in,
                               cudaStream_t stream) {
    if (!gemv_swiglu_takes(a, b) || !act_pack_plain(f.swiglu_pack)) return cudaErrorNotSupported;
    const ActPack& p = f.swiglu_pack;
    if (!f.meet || !p.h || !p.sum || !p.inv || a.t > p.rows || a.n % kActUnit ||
        (fold_in && (!f.u_in || !f.part_in || !(f.eps >= 0.0f))))
        return cudaErrorInvalidValue;
    if (fold_in && a.k > kFoldMaxK) return cudaErrorNotSupported;
    count_launch(Counted::kSwigluSelf);
    if (fold_in) count_launch(Counted::kGemvFold);
    return launch_gemv_tma_swiglu(a, b, f, fold_in, stream);
}

namespace {

// B's checks (a's GEMV reading the fold), launch_gemv_fold's and launch_gemv_fold_group's: cudaErrorNotSupported where
// the fold does not run for a (its packs have no integer twin), cudaErrorInvalidValue where the call lacks what B reads
// or puts B's pack anywhere but a.x (where the pack launch makes it at t > 1).
cudaError_t fold_in_checks(const GemvArgs& a, const GemvFold& f) {
    if (!gemv_fold_takes(a, true) || !act_pack_plain(f.pack_out) || !act_pack_plain(a.x)) return cudaErrorNotSupported;
    if (!f.u_in || !f.part_in || !(f.eps >= 0.0f) || (f.pack_out.h && f.pack_out.h != a.x.h))
        return cudaErrorInvalidValue;
    if (a.t > 1 && f.rows && !act_pack_fits(a.x, a.t, a.k)) return cudaErrorInvalidValue;  // (B's blocks write a.x)
    return cudaSuccess;
}

}  // namespace

cudaError_t launch_gemv_fold(const GemvArgs& a, const GemvArgs* b, const GemvFold& f, bool in, bool out,
                             cudaStream_t stream) {
    const cudaError_t in_ok = in ? fold_in_checks(a, f) : cudaSuccess;
    if (in_ok == cudaErrorNotSupported || (b && !gemv_tma_takes(a, b)) ||
        (!in && (!gemv_fold_takes(a, false) || !act_pack_plain(f.pack_out))))
        return cudaErrorNotSupported;
    if (in_ok != cudaSuccess || (out && (b || !f.h || !f.h_out || !f.w || !f.u || !f.part)) ||
        in == out)  // (a GEMV between two folds: none)
        return cudaErrorInvalidValue;
    if (f.swiglu_g || f.swiglu_u || f.swiglu_rows) {  // (A's first blocks make its input, the swiglu pack)
        if (!out || a.t < 2 || !f.swiglu_g || !f.swiglu_u || !f.swiglu_rows || !act_pack_fits(a.x, a.t, a.k))
            return cudaErrorInvalidValue;
        if (!act_pack_plain(a.x)) return cudaErrorNotSupported;
        count_launch(Counted::kSwigluRows);
    }
    count_launch(Counted::kGemvFold);
    if (in && a.t > 1 && f.rows) count_launch(Counted::kFoldRows);  // (B's first t blocks make the rows: below)
    if (in && a.t > 1 && !f.rows) {  // the rows' pack by its own launch, in the same arithmetic; then the GEMV on it
        if (const cudaError_t e = launch_fold_pack(f, a.t, a.k, a.x, stream)) return e;
        switch (a.qtype) {
            case kQ4_K: return launch_gemv_tma<kQ4_K>(a, b, stream);
            case kQ5_K: return launch_gemv_tma<kQ5_K>(a, b, stream);
            default: return launch_gemv_tma<kQ6_K>(a, b, stream);
        }
    }
    switch (a.qtype) {
        case kQ4_K: return launch_gemv_tma_fold<kQ4_K>(a, b, f, in, stream);
        case kQ5_K: return launch_gemv_tma_fold<kQ5_K>(a, b, f, in, stream);
        default: return launch_gemv_tma_fold<kQ6_K>(a, b, f, in, stream);
    }
}

cudaError_t launch_gemv_fold_group(const GemvArgs& a, const GemvArgs& b, const GemvArgs* c, const GemvFold& f,
                                   cudaStream_t stream) {
    const cudaError_t in_ok = fold_in_checks(a, f);
    if (in_ok == cudaErrorNotSupported || !gemv_tma_group_takes(a, b, c)) return cudaErrorNotSupported;
    if (in_ok != cudaSuccess) return in_ok;
    count_launch(Counted::kGemvFold);
    if (a.t > 1 && f.rows) count_launch(Counted::kFoldRows);  // (B's first t blocks make the rows)
    if (a.t > 1 && !f.rows) {  // the rows' pack by its own launch, as launch_gemv_fold's; then the group on it
        if (const cudaError_t e = launch_fold_pack(f, a.t, a.k, a.x, stream)) return e;
        return launch_gemv_tma_group(a, b, c, nullptr, stream);
    }
    return launch_gemv_tma_group(a, b, c, &f, stream);
}

}  // namespace openjet
