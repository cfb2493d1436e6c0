// openjet_test_*: the test-only C API (include/openjet_test.h) over the kernel families' launchers.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "api_common.cuh"
#include "elementwise.cuh"
#include "embed.cuh"
#include "sample_top.cuh"
#include "topk.cuh"
#include "gemv.cuh"
#include "gemv_tma.cuh"
#include "gemv_fold.cuh"
#include "weight_layout.cuh"
#include "gemv_imma.cuh"
#include "kquant.cuh"
#include "openjet_test.h"
#include "dense_gemm.cuh"
#include "ffn_persistent.cuh"
#include "launch_count.h"
#include "prefill_gemm.cuh"
#include "act_pack.cuh"
#include "pdl.cuh"
#include "rmsnorm.cuh"

namespace {

using namespace openjet;

constexpr auto& fail = fail_in<Api::kTest>;

int cuda_fail(cudaError_t e, const char* what) {
    return cuda_fail_in<Api::kTest>(e, what, "shape, type, t or alignment");
}

int check_t(int t) {
    if (t < 1 || t > kGemvMaxT) return fail(OPENJET_ERR_INVALID_ARGUMENT, "t = %d: token rows must be 1..%d", t, kGemvMaxT);
    return OPENJET_OK;
}

int check_weights(int qtype, int n, int k) {
    const int elems = block_elems(qtype);
    if (elems == 0) return fail(OPENJET_ERR_INVALID_ARGUMENT, "qtype %d: not a type the GEMV reads (0, 8, 12, 13, 14)", qtype);
    const int unit = qtype == kF32 ? 4 : kGemvUnit;
    if (n < 1 || k < unit || k % unit)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "n = %d, k = %d: k must be a positive multiple of %d", n, k, unit);
    return OPENJET_OK;
}

size_t weight_bytes(int qtype, int n, int k) {
    return static_cast<size_t>(n) * (k / block_elems(qtype)) * block_bytes(qtype);
}

// A benchmark's activations: n fixed pseudo-random floats (never zeros) in device memory.
cudaError_t upload_pseudo_random(DevBuf& dx, size_t n) {
    std::vector<float> x(n);
    fill_pseudo_random(x);
    return dx.upload(x.data(), sizeof(float) * n);
}

// `copies` device copies of the host weights w (wb bytes each) that a benchmark's calls rotate through, so that L2
// cannot hold them.
cudaError_t upload_copies(std::vector<DevBuf>& dw, const void* w, size_t wb) {
    for (auto& b : dw)
        if (cudaError_t e = b.alloc(wb)) return e;
    if (cudaError_t e = cudaMemcpy(dw[0].p, w, wb, cudaMemcpyHostToDevice)) return e;
    for (size_t i = 1; i < dw.size(); ++i)
        if (cudaError_t e = cudaMemcpy(dw[i].p, dw[0].p, wb, cudaMemcpyDeviceToDevice)) return e;
    return cudaSuccess;
}

}  // namespace

// One message for the whole test API (openjet_test_*, openjet_test_gdn_*, openjet_test_attn_*).
extern "C" OPENJET_API const char* openjet_test_last_error(void) { return last_error<Api::kTest>().c_str(); }

// A pack in device memory for t rows of k: t rounded up to whole groups of 8 rows, as the engine's.
struct DevPack {
    DevBuf h, sum, inv;
    int rows = 0;
    cudaError_t alloc(int t, int k) {
        rows = (t + kActRows - 1) / kActRows * kActRows;
        cudaError_t e = h.alloc(sizeof(__half) * rows * k);
        if (e == cudaSuccess) e = sum.alloc(sizeof(__half) * rows * (k / kActBlock) * 2);
        if (e == cudaSuccess) e = inv.alloc(sizeof(float) * rows);
        return e;
    }
    ActPack view() { return ActPack{h.as<__half>(), sum.as<__half>(), inv.as<float>(), rows}; }
    // Every byte 0xFF (NaN halves and floats), so that a row its maker skips cannot pass for a made one.
    cudaError_t poison(int k) {
        cudaError_t e = cudaMemset(h.p, 0xFF, sizeof(__half) * rows * k);
        if (e == cudaSuccess) e = cudaMemset(sum.p, 0xFF, sizeof(__half) * rows * (k / kActBlock) * 2);
        return e == cudaSuccess ? cudaMemset(inv.p, 0xFF, sizeof(float) * rows) : e;
    }
    // Rows 0..t-1 of a pack of k-element rows to the host (the GPU's work before synchronised).
    cudaError_t download(int t, int k, uint16_t* xh, uint16_t* xsum, float* xinv) const {
        cudaError_t e = cudaDeviceSynchronize();
        if (e == cudaSuccess) e = cudaMemcpy(xh, h.p, sizeof(uint16_t) * t * k, cudaMemcpyDeviceToHost);
        if (e == cudaSuccess)
            e = cudaMemcpy(xsum, sum.p, sizeof(uint16_t) * t * (k / kActBlock) * 2, cudaMemcpyDeviceToHost);
        if (e == cudaSuccess) e = cudaMemcpy(xinv, inv.p, sizeof(float) * t, cudaMemcpyDeviceToHost);
        return e;
    }
};

extern "C" OPENJET_API int openjet_test_pack_act(const float* x, int t, int k, const float* norm_w, float eps,
                                                 uint16_t* xh, uint16_t* xsum, float* xinv) {
    if (!x || !xh || !xsum || !xinv || t < 1 || t > kActMaxRows || k < kActUnit || k % kActUnit)
        return fail(OPENJET_ERR_INVALID_ARGUMENT,
                    "pack_act: null pointer, t (%d) not in 1..%d or k (%d) not a multiple of %d", t, kActMaxRows, k,
                    kActUnit);
    DevBuf dx, dw;
    DevPack p;
    CHECK(dx.upload(x, sizeof(float) * t * k));
    CHECK(p.alloc(t, k));
    if (norm_w) CHECK(dw.upload(norm_w, sizeof(float) * k));
    CHECK(launch_pack_act(dx.as<float>(), t, k, dw.as<float>(), eps, p.view(), 0));
    CHECK(p.download(t, k, xh, xsum, xinv));
    return OPENJET_OK;
}

// launch_add_norm_pack on t rows: h [t, k] + delta [t, k] (null: none) -> h_out, a = rms(h) * w -> a_out, and the
// pack (xh, xsum, xinv as openjet_test_pack_act gives them). The kernel the engine's decode rows take (the cluster
// pack on 9.0+ where k fits it; OPENJET_ADD_NORM_MAX_EST as the first call read it or set_add_norm_max_est set it).
extern "C" OPENJET_API int openjet_test_add_norm_pack(const float* h, const float* delta, const float* w, int t, int k,
                                                      float eps, float* h_out, float* a_out, uint16_t* xh,
                                                      uint16_t* xsum, float* xinv) {
    if (!h || !w || !h_out || !a_out || !xh || !xsum || !xinv || t < 1 || t > OPENJET_ENGINE_MAX_T || k < kActUnit ||
        k % kActUnit)
        return fail(OPENJET_ERR_INVALID_ARGUMENT,
                    "add_norm_pack: null pointer, t (%d) not in 1..%d or k (%d) not a multiple of %d", t,
                    OPENJET_ENGINE_MAX_T, k, kActUnit);
    DevBuf dh, dd, dw, da;
    DevPack p;
    CHECK(dh.upload(h, sizeof(float) * t * k));
    if (delta) CHECK(dd.upload(delta, sizeof(float) * t * k));
    CHECK(dw.upload(w, sizeof(float) * k));
    CHECK(da.alloc(sizeof(float) * t * k));
    CHECK(p.alloc(t, k));
    CHECK(launch_add_norm_pack(dh.as<float>(), dd.as<float>(), dw.as<float>(), t, k, eps, da.as<float>(), p.view(),
                               0));
    CHECK(p.download(t, k, xh, xsum, xinv));
    CHECK(cudaMemcpy(h_out, dh.p, sizeof(float) * t * k, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(a_out, da.p, sizeof(float) * t * k, cudaMemcpyDeviceToHost));
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_test_rmsnorm(const float* x, int t, int k, const float* w, float eps, float* y) {
    if (!x || !w || !y || t < 1 || k < 1) return fail(OPENJET_ERR_INVALID_ARGUMENT, "rmsnorm: null pointer or bad shape");
    DevBuf dx, dw, dy;
    CHECK(dx.upload(x, sizeof(float) * t * k));
    CHECK(dw.upload(w, sizeof(float) * k));
    CHECK(dy.alloc(sizeof(float) * t * k));
    CHECK(launch_rmsnorm(dx.as<float>(), dw.as<float>(), t, k, eps, dy.as<float>(), 0));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(y, dy.p, sizeof(float) * t * k, cudaMemcpyDeviceToHost));
    return OPENJET_OK;
}

namespace {

// Under OPENJET_PREFILL_GEMM=dense (the default where it runs), the scratch the engine gives a prefill's calls
// (GemvArgs::dense): calls of more than 8 rows take the dense path, decode-sized ones stay decode's.
cudaError_t dense_scratch(GemvArgs& a, DevBuf& buf) {
    if (!prefill_gemm_dense() || !prefill_dense_takes(a.qtype, a.n, a.k)) return cudaSuccess;
    if (const cudaError_t e = buf.alloc(sizeof(__half) * a.n * a.k)) return e;
    a.dense = buf.as<__half>();
    return cudaSuccess;
}

// Whether W (qtype, n, k) has a tile layout; else the failure's status.
int check_tiled(const char* what, int qtype, int n, int k) {
    if (!tile_layout_fits(qtype, n, k))
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "%s: no tile layout for qtype %d, n %d, k %d (a k-quant type, n %% %d "
                    "== 0)", what, qtype, n, k, kTileLayoutRows);
    return OPENJET_OK;
}

// dst <- W (row layout, already on the device) in the tile layout; + 16: a unit's copy may read 16 bytes past the end.
cudaError_t tile_copy(DevBuf& dst, const DevBuf& rows, int qtype, int n, int k) {
    if (cudaError_t e = dst.alloc(tile_layout_bytes(qtype, n, k) + 16)) return e;
    return launch_tile_layout(rows.p, dst.p, qtype, n, k, 0);
}

// W (row layout, host) on the device, in the tile layout when asked (moved there on the device).
cudaError_t upload_weights(DevBuf& dw, const void* w, size_t wb, int qtype, int n, int k, bool tiled) {
    if (!tiled) return dw.upload(w, wb);
    DevBuf rows;
    if (cudaError_t e = rows.upload(w, wb)) return e;
    if (cudaError_t e = tile_copy(dw, rows, qtype, n, k)) return e;
    return cudaDeviceSynchronize();
}

// The benchmarks' weight copies (rotated through, to exceed L2), each in the tile layout when asked (one row-layout
// buffer moved into each).
cudaError_t upload_copies_in_layout(std::vector<DevBuf>& dw, const void* w, int qtype, int n, int k, bool tiled) {
    if (!tiled) return upload_copies(dw, w, weight_bytes(qtype, n, k));
    DevBuf rows;
    if (cudaError_t e = rows.upload(w, weight_bytes(qtype, n, k))) return e;
    for (auto& b : dw)
        if (cudaError_t e = tile_copy(b, rows, qtype, n, k)) return e;
    return cudaDeviceSynchronize();
}

// Shared body of the GEMV entry points: x (float; packed on the device) or a pack given by the host; tiled: W moved
// into the tile layout first; tma: GemvArgs::tma (0 the cp.async kernels; -1 the producer-warp GEMV's default form,
// 1 or 2 one of its forms: openjet_test_gemv_tma, and then the call must have taken it).
int run_gemv(int qtype, const void* w, int n, int k, const float* x, const uint16_t* xh, const uint16_t* xsum,
             const float* xinv, int t, float* y, bool tiled = false, int tma = 0) {
    if (int s = check_t(t)) return s;
    if (int s = check_weights(qtype, n, k)) return s;
    if (tiled)
        if (int s = check_tiled("gemv_tiled", qtype, n, k)) return s;
    if (!w || !y || (!x && !xh) || (xh && (!xsum || !xinv))) return fail(OPENJET_ERR_INVALID_ARGUMENT, "gemv: null pointer");
    const size_t wb = weight_bytes(qtype, n, k);
    DevBuf dw, dx, dy;
    DevPack p;
    CHECK(upload_weights(dw, w, wb, qtype, n, k, tiled));
    CHECK(dy.alloc(sizeof(float) * t * n));
    CHECK(cudaMemset(dy.p, 0xFF, sizeof(float) * t * n));  // NaN poison: every output must be written
    GemvArgs a{qtype, dw.p, n, k, t, ActPack{}, nullptr, dy.as<float>()};
    a.tiled = tiled;
    a.tma = tma;
    DevBuf dense;
    CHECK(dense_scratch(a, dense));
    if (qtype == kF32) {
        if (!x) return fail(OPENJET_ERR_INVALID_ARGUMENT, "gemv: F32 weights take float activations");
        CHECK(dx.upload(x, sizeof(float) * t * k));
        a.xf = dx.as<float>();
    } else {
        CHECK(p.alloc(t, k));
        CHECK(cudaMemset(p.h.p, 0xFF, sizeof(__half) * p.rows * k));  // NaN in rows >= t: must not leak
        CHECK(cudaMemset(p.sum.p, 0xFF, sizeof(__half) * p.rows * (k / kActBlock) * 2));
        CHECK(cudaMemset(p.inv.p, 0xFF, sizeof(float) * p.rows));
        if (xh) {
            CHECK(cudaMemcpy(p.h.p, xh, sizeof(uint16_t) * t * k, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(p.sum.p, xsum, sizeof(uint16_t) * t * (k / kActBlock) * 2, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(p.inv.p, xinv, sizeof(float) * t, cudaMemcpyHostToDevice));
        } else {
            CHECK(dx.upload(x, sizeof(float) * t * k));
            CHECK(launch_pack_act(dx.as<float>(), t, k, nullptr, 0.0f, p.view(), 0));
        }
        a.x = p.view();
    }
    const long long before = launch_count(Counted::kGemvTma);
    CHECK(launch_gemv(a, 0));
    if (tma != 0 && launch_count(Counted::kGemvTma) == before)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "gemv_tma: launch_gemv did not take the producer-warp GEMV");
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(y, dy.p, sizeof(float) * t * n, cudaMemcpyDeviceToHost));
    return OPENJET_OK;
}

}  // namespace

extern "C" OPENJET_API int openjet_test_gemv(int qtype, const void* w, int n, int k, const float* x, int t, float* y) {
    if (!x) return fail(OPENJET_ERR_INVALID_ARGUMENT, "gemv: x is null");
    return run_gemv(qtype, w, n, k, x, nullptr, nullptr, nullptr, t, y);
}

// A prefill's launch_gemv_pair arguments for two F32 matrices of one shape (a GDN layer's beta and alpha) over x.
static void f32_pair_args(const DevBuf& w0, const DevBuf& w1, const DevBuf& x, const DevBuf& y0, const DevBuf& y1,
                          int n, int k, int t, GemvArgs& a, GemvArgs& b) {
    a = GemvArgs{kF32, w0.p, n, k, t, ActPack{}, x.as<float>(), y0.as<float>()};
    a.prefill = true;
    b = a;
    b.w = w1.p, b.y = y1.as<float>();
}

// Two F32 matrices of one shape over the same x in one launch_gemv_pair, as a prefill projects a GDN layer's beta and
// alpha (GemvArgs::prefill set: prefill_f32.cu's GEMM where prefill_f32_own(), whatever t; else decode's kernels).
extern "C" OPENJET_API int openjet_test_gemv_f32_pair(const float* w0, const float* w1, int n, int k, const float* x,
                                                      int t, float* y0, float* y1) {
    if (int s = check_t(t)) return s;
    if (int s = check_weights(kF32, n, k)) return s;
    if (!w0 || !w1 || !x || !y0 || !y1) return fail(OPENJET_ERR_INVALID_ARGUMENT, "gemv_f32_pair: null pointer");
    const size_t wb = weight_bytes(kF32, n, k), yb = sizeof(float) * t * n;
    DevBuf dw0, dw1, dx, dy0, dy1;
    CHECK(dw0.upload(w0, wb));
    CHECK(dw1.upload(w1, wb));
    CHECK(dx.upload(x, sizeof(float) * t * k));
    for (DevBuf* d : {&dy0, &dy1}) {
        CHECK(d->alloc(yb));
        CHECK(cudaMemset(d->p, 0xFF, yb));  // NaN poison: every output must be written
    }
    GemvArgs a, b;
    f32_pair_args(dw0, dw1, dx, dy0, dy1, n, k, t, a, b);
    CHECK(launch_gemv_pair(a, b, 0));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(y0, dy0.p, yb, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(y1, dy1.p, yb, cudaMemcpyDeviceToHost));
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_test_gemv_tiled(int qtype, const void* w, int n, int k, const float* x, int t,
                                                   float* y) {
    if (!x) return fail(OPENJET_ERR_INVALID_ARGUMENT, "gemv_tiled: x is null");
    return run_gemv(qtype, w, n, k, x, nullptr, nullptr, nullptr, t, y, true);
}

// The decode GEMV on the producer-warp kernel (gemv_tma.cu: the engine's default on a 9.0 GPU with a 90a build), W
// moved into the tile layout first; form -1 its default's choice for t, 1 or 2 one of its forms. Refused where it
// cannot run (another GPU or build) or where launch_gemv took another kernel.
extern "C" OPENJET_API int openjet_test_gemv_tma(int qtype, const void* w, int n, int k, const float* x, int t, int form,
                                                 float* y) {
    if (!x) return fail(OPENJET_ERR_INVALID_ARGUMENT, "gemv_tma: x is null");
    if (form != -1 && form != 1 && form != 2)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "gemv_tma: form %d (-1, 1 or 2)", form);
    if (!gemv_tma_available())
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "gemv_tma: the producer-warp GEMV needs a 90a build on a 9.0 GPU");
    return run_gemv(qtype, w, n, k, x, nullptr, nullptr, nullptr, t, y, true, form);
}

extern "C" OPENJET_API int openjet_test_tile_layout(int qtype, const void* w, int n, int k, void* out) {
    if (int s = check_weights(qtype, n, k)) return s;
    if (int s = check_tiled("tile_layout", qtype, n, k)) return s;
    if (!w || !out) return fail(OPENJET_ERR_INVALID_ARGUMENT, "tile_layout: null pointer");
    const size_t wb = weight_bytes(qtype, n, k);
    DevBuf dw;
    CHECK(upload_weights(dw, w, wb, qtype, n, k, true));
    CHECK(cudaMemcpy(out, dw.p, tile_layout_bytes(qtype, n, k), cudaMemcpyDeviceToHost));
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_test_gemv_packed(int qtype, const void* w, int n, int k, const uint16_t* xh,
                                                    const uint16_t* xsum, const float* xinv, int t, float* y) {
    if (qtype == kF32) return fail(OPENJET_ERR_INVALID_ARGUMENT, "gemv_packed: F32 weights take float activations");
    if (!xh || !xsum || !xinv) return fail(OPENJET_ERR_INVALID_ARGUMENT, "gemv_packed: xh, xsum or xinv is null");
    return run_gemv(qtype, w, n, k, nullptr, xh, xsum, xinv, t, y);
}

extern "C" OPENJET_API int openjet_test_prefill_gate_up(int qtype, const void* w_gate, const void* w_up, int n, int k,
                                                        const float* x, int t, uint16_t* xh, uint16_t* xsum,
                                                        float* xinv) {
    if (int s = check_t(t)) return s;
    if (int s = check_weights(qtype, n, k)) return s;
    if (!prefill_gemm_takes(qtype))
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "prefill_gate_up: qtype %d: only Q4_K, Q5_K, Q6_K, Q8_0", qtype);
    if (!w_gate || !w_up || !x || !xh || !xsum || !xinv)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "prefill_gate_up: null pointer");
    if (n % kActUnit)  // the output is the down projection's pack
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "prefill_gate_up: n = %d is not a multiple of %d", n, kActUnit);
    const size_t wb = weight_bytes(qtype, n, k);
    DevBuf dg, du, dx, dy, dense;
    DevPack in, out;
    CHECK(dg.upload(w_gate, wb));
    CHECK(du.upload(w_up, wb));
    CHECK(dx.upload(x, sizeof(float) * t * k));
    CHECK(dy.alloc(sizeof(float) * 2 * t * n));
    CHECK(cudaMemset(dy.p, 0xFF, sizeof(float) * 2 * t * n));  // NaN poison
    CHECK(in.alloc(t, k));
    CHECK(out.alloc(t, n));
    CHECK(launch_pack_act(dx.as<float>(), t, k, nullptr, 0.0f, in.view(), 0));
    GemvArgs g{qtype, dg.p, n, k, t, in.view(), nullptr, dy.as<float>(), true};
    GemvArgs u = g;
    u.w = du.p, u.y = dy.as<float>() + static_cast<long long>(t) * n;
    if (prefill_gemm_dense() && prefill_dense_takes(qtype, 2 * n, k)) {  // the engine's scratch: [gate; up] as fp16
        CHECK(dense.alloc(sizeof(__half) * 2 * n * k));
        g.dense = dense.as<__half>(), u.dense = g.dense;
    }
    CHECK(launch_ffn_gate_up_pack(g, u, out.view(), 0));
    CHECK(out.download(t, n, xh, xsum, xinv));
    return OPENJET_OK;
}

// launch_ffn_gate_up_pack's fp16 form against the fp32 epilogue on the same rows: gate and up dequantised into one
// interleaved [2n, k] fp16 matrix as the engine keeps it, the plain fp32 swiglu epilogue's v [t, n] first
// (launch_dense_gemm_swiglu), then the matrix put in the pack's order (launch_gate_up_pack_order: norms [2]) and
// the fp16 form: h [t, n] (fp16 bits) and its row factors inv [t]. The dense GEMM only (a 90a build on sm_90).
extern "C" OPENJET_API int openjet_test_prefill_gate_up_half(int qtype, const void* w_gate, const void* w_up, int n,
                                                             int k, const float* x, int t, float* v, uint16_t* h,
                                                             float* inv, float* norms) {
    if (int s = check_t(t)) return s;
    if (int s = check_weights(qtype, n, k)) return s;
    if (!prefill_gemm_dense() || !prefill_dense_takes(qtype, 2 * n, k))
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "prefill_gate_up_half: no dense GEMM here for qtype %d, %d x %d",
                    qtype, n, k);
    if (!w_gate || !w_up || !x || !v || !h || !inv || !norms)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "prefill_gate_up_half: null pointer");
    if (n % kActUnit || t < kDenseMinRows)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "prefill_gate_up_half: n = %d not a multiple of %d or t = %d < %d", n,
                    kActUnit, t, kDenseMinRows);
    const size_t wb = weight_bytes(qtype, n, k);
    DevBuf dg, du, dx, dv, dh, dw16, dscale, dnorms;
    DevPack in;
    CHECK(dg.upload(w_gate, wb));
    CHECK(du.upload(w_up, wb));
    CHECK(dx.upload(x, sizeof(float) * t * k));
    CHECK(dv.alloc(sizeof(float) * t * n));
    CHECK(dh.alloc(sizeof(__half) * t * n));
    CHECK(cudaMemset(dh.p, 0xFF, sizeof(__half) * t * n));  // NaN poison
    CHECK(dw16.alloc(sizeof(__half) * 2 * n * k));
    CHECK(dscale.alloc(sizeof(float) * 2 * t));
    CHECK(dnorms.alloc(sizeof(float) * 2));
    CHECK(in.alloc(t, k));
    CHECK(launch_pack_act(dx.as<float>(), t, k, nullptr, 0.0f, in.view(), 0));
    GemvArgs g{qtype, dg.p, n, k, t, in.view(), nullptr, dv.as<float>(), true};
    GemvArgs u = g;
    u.w = du.p;
    __half* w16 = dw16.as<__half>();
    CHECK(launch_dequant_f16(g, w16, 2LL * k, 0));
    CHECK(launch_dequant_f16(u, w16 + k, 2LL * k, 0));
    CHECK(launch_dense_gemm_swiglu(w16, n, k, in.view(), t, dv.as<float>(), 0));
    CHECK(launch_gate_up_pack_order(w16, n, k, dnorms.as<float>(), 0));
    g.dense = w16, u.dense = w16;  // scratch the fp16 form does not touch
    g.w16 = w16, g.ld16 = 2LL * k, g.w16_norms = dnorms.as<float>();
    u.w16 = w16 + k, u.ld16 = 2LL * k;
    const FfnHalfOut half{dh.as<__half>(), dscale.as<float>(), dscale.as<float>() + t, true};
    bool wrote = false;
    DevPack unused;
    CHECK(unused.alloc(t, n));
    CHECK(launch_ffn_gate_up_pack(g, u, unused.view(), 0, &half, &wrote));
    CHECK(cudaDeviceSynchronize());
    if (!wrote) return fail(OPENJET_ERR_INVALID_ARGUMENT, "prefill_gate_up_half: the fp16 form did not run");
    CHECK(cudaMemcpy(v, dv.p, sizeof(float) * t * n, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(h, dh.p, sizeof(uint16_t) * t * n, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(inv, half.inv, sizeof(float) * t, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(norms, dnorms.p, sizeof(float) * 2, cudaMemcpyDeviceToHost));
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_test_mtp_input_pack(const void* table, int vocab, int dim, const int32_t* ids, int t,
                                                       const float* hs, const float* enorm, const float* hnorm,
                                                       float eps, uint16_t* xh, uint16_t* xsum, float* xinv) {
    if (!table || !ids || !hs || !enorm || !hnorm || !xh || !xsum || !xinv || vocab < 1 || dim < 256 || dim % 256 ||
        t < 1 || t > kActRows)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "mtp_input_pack: null pointer, dim (%d) not a multiple of 256 or t "
                    "(%d) not in 1..%d", dim, t, kActRows);
    const int k = 2 * dim;
    DevBuf dt, di, dh, de, dn;
    DevPack p;
    CHECK(dt.upload(table, weight_bytes(kQ4_K, vocab, dim)));
    CHECK(di.upload(ids, sizeof(int32_t) * t));
    CHECK(dh.upload(hs, sizeof(float) * t * dim));
    CHECK(de.upload(enorm, sizeof(float) * dim));
    CHECK(dn.upload(hnorm, sizeof(float) * dim));
    CHECK(p.alloc(t, k));
    const float* h = dh.as<float>();
    const cudaError_t err = launch_mtp_input_pack(kQ4_K, dt.p, vocab, di.as<int32_t>(), h, h + dim, de.as<float>(),
                                                  dn.as<float>(), t, dim, eps, p.view(), 0);
    if (err == cudaErrorNotSupported)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "mtp_input_pack: not taken here (a GPU or build below 9.0, or "
                    "OPENJET_PACK_CLUSTER below 2)");
    CHECK(err);
    CHECK(p.download(t, k, xh, xsum, xinv));
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_test_embed(int qtype, const void* table, int vocab, int dim, const int32_t* ids,
                                              int n_ids, float* out) {
    if (qtype != kQ4_K) return fail(OPENJET_ERR_INVALID_ARGUMENT, "embed: qtype %d: only Q4_K (12) is supported", qtype);
    if (!table || !ids || !out || vocab < 1 || dim < 256 || dim % 256 || n_ids < 1)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "embed: null pointer, or dim (%d) not a multiple of 256", dim);
    for (int i = 0; i < n_ids; ++i)
        if (ids[i] < 0 || ids[i] >= vocab)
            return fail(OPENJET_ERR_INVALID_ARGUMENT, "embed: ids[%d] = %d is outside the vocabulary [0, %d)", i, ids[i], vocab);
    const size_t tb = weight_bytes(kQ4_K, vocab, dim);
    DevBuf dt, di, dout;
    CHECK(dt.upload(table, tb));
    CHECK(di.upload(ids, sizeof(int32_t) * n_ids));
    CHECK(dout.alloc(sizeof(float) * n_ids * dim));
    CHECK(launch_embed(qtype, dt.p, vocab, dim, di.as<int32_t>(), n_ids, dout.as<float>(), 0));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(out, dout.p, sizeof(float) * n_ids * dim, cudaMemcpyDeviceToHost));
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_test_topk(const float* x, int rows, int n, int n_valid, int k,
                                              const int32_t* pen_ids, const float* pen_deltas, int n_pen,
                                              float* values, int32_t* ids) {
    if (!x || !values || !ids || rows < 1 || n < 1 || n_pen < 0 || (n_pen && (!pen_ids || !pen_deltas)))
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "topk: null pointer or bad shape");
    if (k < 1 || k > kTopKMax || n_valid < k || n_valid > n)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "topk: k = %d not in 1..%d, or n_valid = %d not in k..n", k, kTopKMax,
                    n_valid);
    if (const char* why = n_pen ? penalty_list_problem(pen_ids, n_pen, n_valid) : nullptr)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "topk: %s", why);
    DevBuf dx, dpi, dpd, dv, di, dw;
    CHECK(dx.upload(x, sizeof(float) * rows * n));
    if (n_pen) {
        CHECK(dpi.upload(pen_ids, sizeof(int32_t) * n_pen));
        CHECK(dpd.upload(pen_deltas, sizeof(float) * n_pen));
    }
    CHECK(dv.alloc(sizeof(float) * rows * k));
    CHECK(di.alloc(sizeof(int32_t) * rows * k));
    CHECK(dw.alloc(topk_work_bytes(rows, n)));
    CHECK(launch_topk(dx.as<float>(), rows, n, n_valid, k, dpi.as<int32_t>(), dpd.as<float>(), n_pen, dv.as<float>(),
                      di.as<int32_t>(), dw.p, 0));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(values, dv.p, sizeof(float) * rows * k, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(ids, di.p, sizeof(int32_t) * rows * k, cudaMemcpyDeviceToHost));
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_test_sample_top(const float* x, int n, const int32_t* row_ids, int n_valid, int k,
                                                   double temperature, double top_p, double min_p, double u,
                                                   int32_t* pick, int32_t* q_ids, double* q_probs, int* q_len) {
    if (!x || !pick || !q_ids || !q_probs || !q_len || n < 1 || k < 1 || k > kTopKMax || n_valid < 1 ||
        !(u >= 0.0 && u < 1.0))
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "sample_top: null pointer, bad shape, k or u");
    DevBuf dx, dr, dv, di, dw, du, dp, dqi, dqp, dql;
    CHECK(dx.upload(x, sizeof(float) * n));
    if (row_ids) CHECK(dr.upload(row_ids, sizeof(int32_t) * n));
    CHECK(du.upload(&u, sizeof(double)));
    CHECK(dv.alloc(sizeof(float) * k));
    CHECK(di.alloc(sizeof(int32_t) * k));
    CHECK(dw.alloc(topk_work_bytes(1, n)));
    CHECK(dp.alloc(sizeof(int32_t)));
    CHECK(dqi.alloc(sizeof(int32_t) * k));
    CHECK(dqp.alloc(sizeof(double) * k));
    CHECK(dql.alloc(sizeof(int)));
    CHECK(launch_topk(dx.as<float>(), 1, n, n_valid, k, nullptr, nullptr, 0, dv.as<float>(), di.as<int32_t>(), dw.p, 0,
                      row_ids ? dr.as<int32_t>() : nullptr));
    CHECK(launch_sample_top(dv.as<float>(), di.as<int32_t>(), k, SampleTransform{temperature, top_p, min_p},
                            static_cast<const double*>(du.p), dp.as<int32_t>(), nullptr, dqi.as<int32_t>(),
                            static_cast<double*>(dqp.p), static_cast<int*>(dql.p), 0));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(pick, dp.p, sizeof(int32_t), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(q_len, dql.p, sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(q_ids, dqi.p, sizeof(int32_t) * k, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(q_probs, dqp.p, sizeof(double) * k, cudaMemcpyDeviceToHost));
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_test_gemv_shape(int qtype, int n, int k, int* rows_per_block, int* warps_per_block,
                                                   int* blocks) {
    if (!rows_per_block || !warps_per_block || !blocks) return fail(OPENJET_ERR_INVALID_ARGUMENT, "gemv_shape: null pointer");
    CHECK(gemv_launch_shape(qtype, n, k, rows_per_block, warps_per_block, blocks));
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_test_set_add_norm_max_est(int mode) {
    if (mode < -1 || mode > 1)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "set_add_norm_max_est: mode must be -1, 0 or 1");
    set_add_norm_max_est(mode);  // -1: the environment's choice
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_test_set_gemv_half(int mode) {
    if (mode < -1 || mode > 2) return fail(OPENJET_ERR_INVALID_ARGUMENT, "set_gemv_half: mode must be -1, 0, 1 or 2");
    set_gemv_half_tiles(mode);  // -1: the environment's choice; 0 .. 2: GemvHalfTiles' order
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_test_dense_gemm_available(void) { return dense_gemm_available() ? 1 : 0; }

extern "C" OPENJET_API int openjet_test_gemv_tma_available(void) { return gemv_tma_available() ? 1 : 0; }

extern "C" OPENJET_API int openjet_test_launch_count(int what, long long* out) {
    if (what < 0 || what >= static_cast<int>(Counted::kCount) || !out)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "launch_count: what = %d is not 0..%d, or out is null", what,
                    static_cast<int>(Counted::kCount) - 1);
    *out = launch_count(static_cast<Counted>(what));
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_test_prefill_f32_block_rows(int t, int n, int matrices, int sms, int optin,
                                                              int* rows) {
    if (!rows || t < 1 || n < 1 || matrices < 1 || matrices > 2 || sms < 1 || optin < 0)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "prefill_f32_block_rows: t = %d, n = %d, matrices = %d, sms = %d, "
                    "optin = %d (t, n, sms >= 1, 1 or 2 matrices, optin >= 0), or rows is null", t, n, matrices, sms,
                    optin);
    *rows = prefill_f32_block_rows(t, n, matrices, sms, optin);
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_test_ffn_pack_rows(int n_embd, int n_ff, int k_out, int next_proj, int* rows) {
    if (!rows || n_embd < kActUnit || n_ff < kActUnit || k_out < 0 || n_embd % kActUnit || n_ff % kActUnit ||
        k_out % kActUnit)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "ffn_pack_rows: n_embd = %d, n_ff = %d, k_out = %d: multiples of %d "
                    "(k_out 0: no tail), or rows is null", n_embd, n_ff, k_out, kActUnit);
    static const char weights = 0;  // only whether a tail and next projections exist matters here
    FfnPersistentArgs a;
    a.n_embd = n_embd, a.n_ff = n_ff, a.k_out = k_out;
    if (k_out) a.out_w = &weights;
    if (next_proj) a.next_w[0] = &weights;
    rows[0] = ffn_tail_pack_row0(a);
    rows[1] = ffn_next_pack_row0(a);
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_test_ffn_scratch(int n_ff, int* ints, int* profile_slots) {
    if (!ints || !profile_slots || n_ff < kActUnit || n_ff % kActUnit)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "ffn_scratch: n_ff = %d (a multiple of %d), or a null pointer", n_ff,
                    kActUnit);
    *ints = ffn_persistent_scratch_ints(n_ff);
    *profile_slots = kFfnProfileSlots;
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_test_bench_gemv_layout(int qtype, const void* w, int n, int k, int t, int tiled,
                                                          int copies, int reps, int runs, float* us_out) {
    if (int s = check_t(t)) return s;
    if (int s = check_weights(qtype, n, k)) return s;
    if (tiled)
        if (int s = check_tiled("bench_gemv_layout", qtype, n, k)) return s;
    if (!w || !us_out || copies < 1 || reps < 1 || runs < 1)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "bench_gemv: null pointer or copies/reps/runs < 1");
    std::vector<DevBuf> dw(copies);
    CHECK(upload_copies_in_layout(dw, w, qtype, n, k, tiled != 0));
    DevBuf dx, dy;
    DevPack p;
    CHECK(upload_pseudo_random(dx, static_cast<size_t>(t) * k));  // packed once below
    CHECK(p.alloc(t, k));
    CHECK(dy.alloc(sizeof(float) * t * n));
    CHECK(launch_pack_act(dx.as<float>(), t, k, nullptr, 0.0f, p.view(), 0));
    GemvArgs a{qtype, nullptr, n, k, t, p.view(), dx.as<float>(), dy.as<float>()};
    a.tiled = tiled != 0;
    DevBuf dense;
    CHECK(dense_scratch(a, dense));
    std::string failed;
    const auto launch = [&](int i, cudaStream_t stream) {
        a.w = dw[i % copies].p;
        return launch_gemv(a, stream);
    };
    if (cudaError_t e = time_graph_replays("launch_gemv", copies, reps, runs, us_out, launch, &failed))
        return cuda_fail(e, failed.c_str());
    return OPENJET_OK;
}

namespace {

// bench_pack_chain's middles that do nothing: the rule of pdl.cuh and no work (one block, or a cluster's eight).
__global__ void empty_middle_kernel() { pdl_start(); }

constexpr int kChainModes = 8;

}  // namespace

// What sits between two decode GEMVs costs in a CUDA graph of such chains (a boundary of the step, the work at its
// edges included, apart from the step's other launches): rep i is GEMV A (k x k, weight copy 2i) -> the middle ->
// GEMV B (copy 2i + 1, reading the pack the middle makes, else one made before), the middle by mode: 0 none, 1 the
// add-norm pack of A's output into B's input (the engine's launch_add_norm_pack: a cluster of blocks per row on 9.0+),
// 2 a kernel of one block with no work, 3 eight such blocks as one cluster, 4 eight blocks, no cluster, 5 none: the
// fold (gemv_fold.cuh, on 9.0), A's tiles end with the add and the norm's partials and B makes its pack of them (T=1
// in its blocks, more rows in a pack launch); its halves alone (timings only, B's input not A's output): 6 A's
// epilogue, B on its pack; 7 A plain, B reading the fold's buffers (as a setup's first fold left them). Producer-warp
// GEMVs where they run (the engine's default, tile layout). us_out[r]: microseconds per rep of run r.
extern "C" OPENJET_API int openjet_test_bench_pack_chain(int qtype, const void* w, int k, int t, int mode, int copies,
                                                         int reps, int runs, float* us_out) {
    if (int s = check_t(t)) return s;
    if (int s = check_weights(qtype, k, k)) return s;
    if (int s = check_tiled("bench_pack_chain", qtype, k, k)) return s;
    if (!w || !us_out || mode < 0 || mode >= kChainModes || copies < 2 || reps < 1 || runs < 1 ||
        k % (kActBlock * 8) != 0)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "bench_pack_chain: null pointer, mode not 0..%d, copies < 2, "
                    "reps / runs < 1, or k not a multiple of %d", kChainModes - 1, kActBlock * 8);
    std::vector<DevBuf> dw(copies);
    CHECK(upload_copies_in_layout(dw, w, qtype, k, k, true));
    DevBuf dx, h, norm_w, ya, yb, hf, uf, pf;
    DevPack pa, pb;
    CHECK(upload_pseudo_random(dx, static_cast<size_t>(t) * k));  // A's input, packed once
    CHECK(upload_pseudo_random(h, static_cast<size_t>(t) * k));   // the residual stream the pack adds A's output to
    CHECK(upload_pseudo_random(norm_w, k));
    CHECK(ya.alloc(sizeof(float) * t * k));
    CHECK(yb.alloc(sizeof(float) * t * k));
    CHECK(pa.alloc(t, k));
    CHECK(pb.alloc(t, k));
    CHECK(launch_pack_act(dx.as<float>(), t, k, nullptr, 0.0f, pa.view(), 0));
    CHECK(launch_pack_act(dx.as<float>(), t, k, nullptr, 0.0f, pb.view(), 0));  // B's input where no pack is made
    GemvArgs a{qtype, nullptr, k, k, t, pa.view(), dx.as<float>(), ya.as<float>()};
    a.tiled = true;
    a.tma = -1;  // the producer-warp GEMV's default form where it runs (else the cp.async kernels)
    GemvArgs b = a;
    b.x = pb.view();
    b.y = yb.as<float>();
    GemvFold fold;
    if (mode >= 5) {
        if (!gemv_fold_takes(a, true))
            return fail(OPENJET_ERR_INVALID_ARGUMENT, "bench_pack_chain: the fold does not run here");
        CHECK(hf.alloc(sizeof(float) * t * k));
        CHECK(uf.alloc(sizeof(float) * t * k));
        CHECK(pf.alloc(sizeof(float4) * t * (k / 16)));
        fold = GemvFold{h.as<float>(), hf.as<float>(), norm_w.as<float>(), uf.as<float>(), pf.as<float4>(),
                        uf.as<float>(), pf.as<float4>(), 1e-6f, nullptr};
        if (mode == 7) {  // B's buffers, once
            a.w = dw[0].p;
            CHECK(launch_gemv_fold(a, nullptr, fold, false, true, 0));
            CHECK(cudaDeviceSynchronize());
        }
    }
    std::string failed;
    const auto launch = [&](int i, cudaStream_t stream) {
        a.w = dw[(2 * i) % copies].p;
        b.w = dw[(2 * i + 1) % copies].p;
        if (mode >= 5) {
            const cudaError_t e =
                mode == 7 ? launch_gemv(a, stream) : launch_gemv_fold(a, nullptr, fold, false, true, stream);
            if (e != cudaSuccess) return e;
            return mode == 6 ? launch_gemv(b, stream) : launch_gemv_fold(b, nullptr, fold, true, false, stream);
        }
        if (cudaError_t e = launch_gemv(a, stream)) return e;
        cudaError_t e = cudaSuccess;
        switch (mode) {
            case 1: e = launch_add_norm_pack(h.as<float>(), ya.as<float>(), norm_w.as<float>(), t, k, 1e-6f, nullptr,
                                             pb.view(), stream); break;
            case 2: e = launch_kernel(empty_middle_kernel, 1, 256, 0, stream); break;
            case 3: e = launch_kernel_cluster(empty_middle_kernel, 8, 256, 0, stream, 8); break;
            case 4: e = launch_kernel(empty_middle_kernel, 8, 256, 0, stream); break;
            default: break;
        }
        return e != cudaSuccess ? e : launch_gemv(b, stream);
    };
    if (cudaError_t e = time_graph_replays("bench_pack_chain", copies, reps, runs, us_out, launch, &failed))
        return cuda_fail(e, failed.c_str());
    return OPENJET_OK;
}

// The fold's A side of t rows of n in device memory (openjet_test_gemv_fold, openjet_test_gemv_swiglu_rows): the
// residual h and the norm's weights uploaded; h_out, u and part (NaN-poisoned: every partial must be written) made.
struct FoldASide {
    DevBuf h, nw, h_out, u, part;
    cudaError_t make(const float* h_host, const float* norm_w, int t, int n) {
        cudaError_t e = h.upload(h_host, sizeof(float) * t * n);
        if (!e) e = nw.upload(norm_w, sizeof(float) * n);
        if (!e) e = h_out.alloc(sizeof(float) * t * n);
        if (!e) e = u.alloc(sizeof(float) * t * n);
        if (!e) e = part.alloc(sizeof(float4) * t * (n / 16));
        return e ? e : cudaMemset(part.p, 0xFF, sizeof(float4) * t * (n / 16));
    }
    GemvFold fold() const {  // A's side of a GemvFold
        GemvFold f;
        f.h = h.as<float>(), f.h_out = h_out.as<float>(), f.w = nw.as<float>(), f.u = u.as<float>();
        f.part = part.as<float4>();
        return f;
    }
    cudaError_t download(float* h_out_host, float* u_host, float* part_host, int t, int n) const {
        cudaError_t e = cudaMemcpy(h_out_host, h_out.p, sizeof(float) * t * n, cudaMemcpyDeviceToHost);
        if (!e) e = cudaMemcpy(u_host, u.p, sizeof(float) * t * n, cudaMemcpyDeviceToHost);
        return e ? e : cudaMemcpy(part_host, part.p, sizeof(float4) * t * (n / 16), cudaMemcpyDeviceToHost);
    }
};

// The fold (gemv_fold.cuh) between two decode GEMVs, both in the tile layout: A [n, ka] over x [t, ka] (packed as
// launch_pack_act packs it) with the fold's epilogue over h [t, n] and norm_w [n], then B [nb, n] reading what A left:
// h_out and u [t, n], part [t, n / 16, 4], B's y [t, nb] and its rows' (c, inv) in scales [t, 2]; what B leaves for
// the kernels after it (GemvFold::a_out, pack_out): the normed rows a_out [t, n] and its pack (xh, xsum, xinv as
// openjet_test_pack_act gives them). rows (t > 1): B's first t blocks make the rows' pack (GemvFold::rows,
// OPENJET_FOLD_ROWS) instead of launch_fold_pack; grid_sms: both GEMVs' grids sized for that many SMs (0: all).
extern "C" OPENJET_API int openjet_test_gemv_fold(int qtype, const void* wa, int n, int ka, const void* wb, int nb,
                                                  const float* x, int t, const float* h, const float* norm_w, float eps,
                                                  float* h_out, float* u, float* part, float* y, float* scales,
                                                  float* a_out, uint16_t* xh, uint16_t* xsum, float* xinv, int rows,
                                                  int grid_sms) {
    if (int s = check_t(t)) return s;
    if (int s = check_weights(qtype, n, ka)) return s;
    if (int s = check_weights(qtype, nb, n)) return s;
    if (int s = check_tiled("gemv_fold", qtype, n, ka)) return s;
    if (int s = check_tiled("gemv_fold", qtype, nb, n)) return s;
    if (!wa || !wb || !x || !h || !norm_w || !h_out || !u || !part || !y || !scales || !a_out || !xh || !xsum || !xinv)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "gemv_fold: null pointer");
    if (grid_sms < 0) return fail(OPENJET_ERR_INVALID_ARGUMENT, "gemv_fold: grid_sms (%d) < 0", grid_sms);
    DevBuf dwa, dwb, dx, dy, dscales, da, drows;
    DevPack pa, pb;  // A's input; B's where t > 1 (launch_fold_pack)
    FoldASide side;
    CHECK(upload_weights(dwa, wa, weight_bytes(qtype, n, ka), qtype, n, ka, true));
    CHECK(upload_weights(dwb, wb, weight_bytes(qtype, nb, n), qtype, nb, n, true));
    CHECK(dx.upload(x, sizeof(float) * t * ka));
    CHECK(side.make(h, norm_w, t, n));
    CHECK(dy.alloc(sizeof(float) * t * nb));
    CHECK(dscales.alloc(sizeof(float2) * t));
    CHECK(da.alloc(sizeof(float) * t * n));
    CHECK(cudaMemset(dy.p, 0xFF, sizeof(float) * t * nb));  // NaN poison: every output must be written
    CHECK(cudaMemset(dscales.p, 0xFF, sizeof(float2) * t));
    CHECK(cudaMemset(da.p, 0xFF, sizeof(float) * t * n));
    CHECK(pa.alloc(t, ka));
    CHECK(pb.alloc(t, n));
    CHECK(pb.poison(n));
    CHECK(launch_pack_act(dx.as<float>(), t, ka, nullptr, 0.0f, pa.view(), 0));
    GemvArgs a{qtype, dwa.p, n, ka, t, pa.view(), nullptr, nullptr};
    a.tiled = true;
    a.tma = -1;  // the producer-warp GEMV's default forms: the fold's home
    a.grid_sms = grid_sms;
    GemvArgs b{qtype, dwb.p, nb, n, t, pb.view(), nullptr, dy.as<float>()};
    b.tiled = true;
    b.tma = -1;
    b.grid_sms = grid_sms;
    if (!gemv_fold_takes(a, false) || !gemv_fold_takes(b, true))
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "gemv_fold: the fold does not run here (a 90a build on 9.0, Q4_K, "
                    "Q5_K or Q6_K, t <= %d, k <= %d)", kActRows, kFoldMaxK);
    GemvFold fold = side.fold();
    fold.u_in = side.u.as<float>(), fold.part_in = side.part.as<float4>(), fold.eps = eps;
    fold.scales = dscales.as<float2>(), fold.a_out = da.as<float>(), fold.pack_out = pb.view();
    if (rows) {
        CHECK(drows.alloc(sizeof(FoldRowsSync)));
        CHECK(cudaMemset(drows.p, 0, sizeof(FoldRowsSync)));
        fold.rows = drows.as<FoldRowsSync>();
    }
    CHECK(launch_gemv_fold(a, nullptr, fold, false, true, 0));
    CHECK(launch_gemv_fold(b, nullptr, fold, true, false, 0));
    CHECK(cudaDeviceSynchronize());
    CHECK(side.download(h_out, u, part, t, n));
    CHECK(cudaMemcpy(y, dy.p, sizeof(float) * t * nb, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(scales, dscales.p, sizeof(float2) * t, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(a_out, da.p, sizeof(float) * t * n, cudaMemcpyDeviceToHost));
    CHECK(pb.download(t, n, xh, xsum, xinv));
    return OPENJET_OK;
}

// The down projection's side of OPENJET_SWIGLU_ROWS (gemv_fold.cuh SwigluRowsSync): A [n, ka] in the tile layout
// with the fold's epilogue over h [t, n] and norm_w [n], its input the swiglu pack of g and up [t, ka] made by
// launch_swiglu_pack before it (rows 0) or by A's own first blocks (rows 1, t > 1); grid_sms as openjet_test_gemv_fold's.
// Out: A's h_out and u_out [t, n], part [t, n / 16, 4], and the pack A read (xh, xsum, xinv as openjet_test_pack_act).
extern "C" OPENJET_API int openjet_test_gemv_swiglu_rows(int qtype, const void* wa, int n, int ka, const float* g,
                                                         const float* up, int t, const float* h, const float* norm_w,
                                                         int rows, int grid_sms, float* h_out, float* u_out,
                                                         float* part, uint16_t* xh, uint16_t* xsum, float* xinv) {
    if (int s = check_t(t)) return s;
    if (int s = check_weights(qtype, n, ka)) return s;
    if (int s = check_tiled("gemv_swiglu_rows", qtype, n, ka)) return s;
    if (!wa || !g || !up || !h || !norm_w || !h_out || !u_out || !part || !xh || !xsum || !xinv)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "gemv_swiglu_rows: null pointer");
    if (grid_sms < 0 || (rows && t < 2))
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "gemv_swiglu_rows: grid_sms (%d) < 0, or rows at t = %d (the "
                    "launch makes its pack only at t > 1)", grid_sms, t);
    DevBuf dwa, dg, dup, dsync;
    DevPack pa;
    FoldASide side;
    CHECK(upload_weights(dwa, wa, weight_bytes(qtype, n, ka), qtype, n, ka, true));
    CHECK(dg.upload(g, sizeof(float) * t * ka));
    CHECK(dup.upload(up, sizeof(float) * t * ka));
    CHECK(side.make(h, norm_w, t, n));
    CHECK(pa.alloc(t, ka));
    CHECK(pa.poison(ka));  // (the pack's maker must write every row)
    GemvArgs a{qtype, dwa.p, n, ka, t, pa.view(), nullptr, nullptr};
    a.tiled = true;
    a.tma = -1;
    a.grid_sms = grid_sms;
    if (!gemv_fold_takes(a, false))
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "gemv_swiglu_rows: the fold does not run here (a 90a build on 9.0, "
                    "Q4_K, Q5_K or Q6_K, t <= %d)", kActRows);
    GemvFold fold = side.fold();
    if (rows) {
        CHECK(dsync.alloc(sizeof(SwigluRowsSync)));
        CHECK(cudaMemset(dsync.p, 0, sizeof(SwigluRowsSync)));
        fold.swiglu_g = dg.as<float>(), fold.swiglu_u = dup.as<float>(), fold.swiglu_rows = dsync.as<SwigluRowsSync>();
    } else {
        CHECK(launch_swiglu_pack(dg.as<float>(), dup.as<float>(), t, ka, pa.view(), 0));
    }
    CHECK(launch_gemv_fold(a, nullptr, fold, false, true, 0));
    CHECK(cudaDeviceSynchronize());
    CHECK(side.download(h_out, u_out, part, t, n));
    CHECK(pa.download(t, ka, xh, xsum, xinv));
    return OPENJET_OK;
}

// A prefill's add-norm on the fold's numerics (launch_fold_add_norm_pack) over t rows of k (up to 2,048 rows): h plus
// delta (null: h is the sum) into h_out, with u, part, the normed rows a_out and the pack (xh, xsum, xinv) as
// openjet_test_gemv_fold gives them.
extern "C" OPENJET_API int openjet_test_fold_add_norm_pack(const float* h, const float* delta, const float* norm_w,
                                                           int t, int k, float eps, float* h_out, float* u, float* part,
                                                           float* a_out, uint16_t* xh, uint16_t* xsum, float* xinv) {
    if (!h || !norm_w || !h_out || !u || !part || !a_out || !xh || !xsum || !xinv || t < 1 || t > kActMaxRows ||
        k < kGemvUnit || k % kGemvUnit || k > kFoldMaxK)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "fold_add_norm_pack: null pointer, t (%d) not in 1..%d or k (%d) "
                    "not a multiple of %d up to %d", t, kActMaxRows, k, kGemvUnit, kFoldMaxK);
    if (!gemv_tma_available())
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "fold_add_norm_pack: the fold runs on a 90a build on 9.0 only");
    DevBuf dh, dd, dw, du, dpart, da;
    DevPack p;
    CHECK(dh.upload(h, sizeof(float) * t * k));
    if (delta) CHECK(dd.upload(delta, sizeof(float) * t * k));
    CHECK(dw.upload(norm_w, sizeof(float) * k));
    CHECK(du.alloc(sizeof(float) * t * k));
    CHECK(dpart.alloc(sizeof(float4) * t * (k / 16)));
    CHECK(da.alloc(sizeof(float) * t * k));
    CHECK(p.alloc(t, k));
    CHECK(launch_fold_add_norm_pack(dh.as<float>(), delta ? dd.as<float>() : nullptr, dw.as<float>(), t, k, eps,
                                    dh.as<float>(), du.as<float>(), dpart.as<float4>(), da.as<float>(), p.view(), 0));
    CHECK(p.download(t, k, xh, xsum, xinv));  // (synchronises)
    CHECK(cudaMemcpy(h_out, dh.p, sizeof(float) * t * k, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(u, du.p, sizeof(float) * t * k, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(part, dpart.p, sizeof(float4) * t * (k / 16), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(a_out, da.p, sizeof(float) * t * k, cudaMemcpyDeviceToHost));
    return OPENJET_OK;
}

// Microseconds per launch_gemv_pair of two F32 [n, k] matrices over t prefill rows (a GDN layer's beta and alpha, as
// openjet_test_gemv_f32_pair calls it; OPENJET_PREFILL_F32 picks the kernel), pseudo-random weights and x.
extern "C" OPENJET_API int openjet_test_bench_gemv_f32_pair(int n, int k, int t, int reps, int runs, float* us_out) {
    if (int s = check_t(t)) return s;
    if (int s = check_weights(kF32, n, k)) return s;
    if (!us_out || reps < 1 || runs < 1)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "bench_gemv_f32_pair: null output or reps/runs < 1");
    DevBuf dw0, dw1, dx, dy0, dy1;
    CHECK(upload_pseudo_random(dw0, static_cast<size_t>(n) * k));
    CHECK(upload_pseudo_random(dw1, static_cast<size_t>(n) * k));
    CHECK(upload_pseudo_random(dx, static_cast<size_t>(t) * k));
    CHECK(dy0.alloc(sizeof(float) * t * n));
    CHECK(dy1.alloc(sizeof(float) * t * n));
    GemvArgs a, b;
    f32_pair_args(dw0, dw1, dx, dy0, dy1, n, k, t, a, b);
    std::string failed;
    const auto launch = [&](int, cudaStream_t stream) { return launch_gemv_pair(a, b, stream); };
    if (cudaError_t e = time_graph_replays("launch_gemv_pair", 1, reps, runs, us_out, launch, &failed))
        return cuda_fail(e, failed.c_str());
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_test_bench_gemv(int qtype, const void* w, int n, int k, int t, int copies,
                                                   int reps, int runs, float* us_out) {
    return openjet_test_bench_gemv_layout(qtype, w, n, k, t, 0, copies, reps, runs, us_out);
}

extern "C" OPENJET_API int openjet_test_bench_copy(size_t bytes, int reps, int runs, float* gbps_out) {
    if (bytes < 16 || reps < 1 || runs < 1 || !gbps_out)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "bench_copy: bytes < 16, reps/runs < 1 or null output");
    DevBuf a, b;
    CHECK(a.alloc(bytes));
    CHECK(b.alloc(bytes));
    CHECK(cudaMemset(a.p, 0x5A, bytes));
    CHECK(cudaMemcpy(b.p, a.p, bytes, cudaMemcpyDeviceToDevice));  // warm-up
    Event e0, e1;
    CHECK(cudaEventCreate(&e0.e));
    CHECK(cudaEventCreate(&e1.e));
    for (int r = 0; r < runs; ++r) {
        CHECK(cudaEventRecord(e0.e, 0));
        for (int i = 0; i < reps; ++i) CHECK(cudaMemcpyAsync(i % 2 ? a.p : b.p, i % 2 ? b.p : a.p, bytes, cudaMemcpyDeviceToDevice, 0));
        CHECK(cudaEventRecord(e1.e, 0));
        CHECK(cudaEventSynchronize(e1.e));
        float ms = 0.0f;
        CHECK(cudaEventElapsedTime(&ms, e0.e, e1.e));
        gbps_out[r] = static_cast<float>(2.0 * bytes * reps / (ms * 1e-3) / 1e9);
    }
    return OPENJET_OK;
}

// ------------------------------------------------------------------------------ the integer GEMV (experiment)

namespace {

// A pack of the integer GEMV in one device buffer: digits, 16-block sums, 32-block sums, inv (each part's start
// aligned for the kernels' 16- and 8-byte loads: every part's size is a multiple of 16 bytes but inv's).
struct DevPackI {
    DevBuf buf;
    ActPackI p;
    cudaError_t alloc(int rows, int k) {
        if (cudaError_t e = buf.alloc(act_pack_imma_bytes(rows, k))) return e;
        p = act_pack_imma_view(buf.p, rows, k);
        return cudaSuccess;
    }
};

int check_imma(int qtype, int n, int k, int t, int stages) {
    if (t < 1 || t > kImmaMaxT) return fail(OPENJET_ERR_INVALID_ARGUMENT, "t = %d: token rows must be 1..%d", t, kImmaMaxT);
    if (!gemv_imma_supports(qtype)) return fail(OPENJET_ERR_INVALID_ARGUMENT, "qtype %d: the integer GEMV reads Q4_K (12), Q5_K (13) and Q6_K (14)", qtype);
    if (stages != 0 && stages != 2 && stages != 3 && stages != 4 && stages != 6)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "stages = %d: 0 (default), 2, 3, 4 or 6", stages);
    return check_weights(qtype, n, k);
}

}  // namespace

namespace {

// Shared body of the integer GEMV's entry points: y = W x with x packed on the device, either straight from the floats
// (launch_pack_act_imma, then launch_gemv_imma at `stages` and `persistent`) or, from_pack, through the engine's own
// dispatch: the fp16 pack, then launch_gemv with GemvArgs::xi set (gemv.cu launch_imma makes the integer pack and
// picks the grid; stages and persistent unused), refused if the integer GEMV did not run there.
// persistent 2: the producer-warp form (launch_gemv_tma_imma; tiled only, stages unused).
int check_imma_form(const char* what, int qtype, int n, int k, int persistent, int tiled) {
    if (persistent < 0 || persistent > 2)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "%s: persistent = %d: 0, 1 or 2 (the producer-warp form)", what,
                    persistent);
    if (persistent == 2 && !tiled)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "%s: the producer-warp form reads the tile layout (tiled = 1)", what);
    if (tiled)
        if (int s = check_tiled(what, qtype, n, k)) return s;
    return OPENJET_OK;
}

// The integer GEMV of one form: 0 a block a tile, 1 persistent (cp.async, `stages` deep), 2 the producer-warp form.
cudaError_t launch_imma_form(int qtype, const void* w, int n, int k, const ActPackI& p, int t, float* y,
                             cudaStream_t stream, int stages, int persistent, bool tiled) {
    if (persistent == 2) return launch_gemv_tma_imma(qtype, w, n, k, p, t, y, stream);
    return launch_gemv_imma(qtype, w, n, k, p, t, y, stream, stages, persistent != 0, tiled);
}

int run_imma(const char* what, int qtype, const void* w, int n, int k, const float* x, int t, int stages,
             int persistent, bool tiled, bool from_pack, float* y) {
    if (int s = check_imma(qtype, n, k, t, stages)) return s;
    if (int s = check_imma_form(what, qtype, n, k, persistent, tiled)) return s;
    if (!w || !x || !y) return fail(OPENJET_ERR_INVALID_ARGUMENT, "%s: null pointer", what);
    DevBuf dw, dx, dy;
    DevPackI p;
    DevPack ph;
    CHECK(upload_weights(dw, w, weight_bytes(qtype, n, k), qtype, n, k, tiled));
    CHECK(dx.upload(x, sizeof(float) * t * k));
    CHECK(dy.alloc(sizeof(float) * t * n));
    CHECK(cudaMemset(dy.p, 0xFF, sizeof(float) * t * n));  // NaN poison: every output must be written
    if (from_pack) {
        CHECK(p.alloc(kImmaMaxT, k));
        CHECK(ph.alloc(t, k));
        CHECK(launch_pack_act(dx.as<float>(), t, k, nullptr, 0.0f, ph.view(), 0));
        GemvArgs a{qtype, dw.p, n, k, t, ph.view(), nullptr, dy.as<float>()};
        a.tiled = tiled, a.xi = p.buf.p;
        const long long before = launch_count(Counted::kGemvInt);
        CHECK(launch_gemv(a, 0));
        if (launch_count(Counted::kGemvInt) == before)
            return fail(OPENJET_ERR_INVALID_ARGUMENT, "%s: launch_gemv did not take the integer GEMV", what);
    } else {
        CHECK(p.alloc(t, k));
        CHECK(launch_pack_act_imma(dx.as<float>(), t, k, p.p, 0));
        CHECK(launch_imma_form(qtype, dw.p, n, k, p.p, t, dy.as<float>(), 0, stages, persistent, tiled));
    }
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(y, dy.p, sizeof(float) * t * n, cudaMemcpyDeviceToHost));
    return OPENJET_OK;
}

}  // namespace

extern "C" OPENJET_API int openjet_test_gemv_imma(int qtype, const void* w, int n, int k, const float* x, int t,
                                                  int stages, int persistent, int tiled, float* y) {
    return run_imma("gemv_imma", qtype, w, n, k, x, t, stages, persistent, tiled != 0, false, y);
}

extern "C" OPENJET_API int openjet_test_gemv_imma_from_pack(int qtype, const void* w, int n, int k, const float* x, int t,
                                                            int tiled, float* y) {
    return run_imma("gemv_imma_from_pack", qtype, w, n, k, x, t, 0, 0, tiled != 0, true, y);
}

extern "C" OPENJET_API int openjet_test_bench_gemv_imma(int qtype, const void* w, int n, int k, int t, int stages,
                                                        int persistent, int tiled, int copies, int reps, int runs,
                                                        float* us_out) {
    if (int s = check_imma(qtype, n, k, t, stages)) return s;
    if (int s = check_imma_form("bench_gemv_imma", qtype, n, k, persistent, tiled)) return s;
    if (!w || !us_out || copies < 1 || reps < 1 || runs < 1)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "bench_gemv_imma: null pointer or copies/reps/runs < 1");
    std::vector<DevBuf> dw(copies);
    CHECK(upload_copies_in_layout(dw, w, qtype, n, k, tiled != 0));
    DevBuf dx, dy;
    DevPackI p;
    CHECK(upload_pseudo_random(dx, static_cast<size_t>(t) * k));
    CHECK(p.alloc(t, k));
    CHECK(dy.alloc(sizeof(float) * t * n));
    CHECK(launch_pack_act_imma(dx.as<float>(), t, k, p.p, 0));
    std::string failed;
    const auto launch = [&](int i, cudaStream_t stream) {
        return launch_imma_form(qtype, dw[i % copies].p, n, k, p.p, t, dy.as<float>(), stream, stages, persistent,
                                tiled != 0);
    };
    if (cudaError_t e = time_graph_replays("launch_gemv_imma", copies, reps, runs, us_out, launch, &failed))
        return cuda_fail(e, failed.c_str());
    return OPENJET_OK;
}
