// openjet_test_gdn_*: the test-only C API of the GDN decode step (include/openjet_test_gdn.h).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "api_common.cuh"
#include "gdn_chunk.cuh"
#include "gdn_decode.cuh"
#include "openjet_test_gdn.h"

namespace {

using namespace openjet;

constexpr auto& fail = fail_in<Api::kTest>;

int cuda_fail(cudaError_t e, const char* what) {
    return cuda_fail_in<Api::kTest>(e, what, "shape, t, or overlapping buffers");
}

int check_dims(int n_k, int n_v, int t) {
    if (t < 1 || t > kGdnMaxRows)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "t = %d: token rows must be 1..%d", t, kGdnMaxRows);
    if (n_k < 1 || n_v < n_k || n_v % n_k)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "n_k = %d, n_v = %d: n_v must be a positive multiple of n_k", n_k, n_v);
    return OPENJET_OK;
}

// Device copies of the step's inputs and outputs.
struct GdnDev {
    DevBuf qkv, z, b, alpha, conv_w, cs_in, cs_out, ssm_a, dt_bias, norm_w, state, y, chunk;
    cudaError_t alloc(int n_k, int n_v, int t) {
        if (gdn_chunked_form() == 2)  // the chunked GDN's two-phase scratch, as the engine makes it (the default)
            if (cudaError_t e = chunk.alloc(sizeof(float) * gdn_chunk_scratch_floats(n_k, n_v, t))) return e;
        const size_t conv_dim = (size_t)(2 * n_k + n_v) * kGdnHeadDim, vd = (size_t)n_v * kGdnHeadDim;
        const size_t sizes[] = {t * conv_dim, t * vd, (size_t)t * n_v, (size_t)t * n_v, 4 * conv_dim, 3 * conv_dim,
                                3 * conv_dim, (size_t)n_v, (size_t)n_v, kGdnHeadDim, vd * kGdnHeadDim, t * vd};
        DevBuf* bufs[] = {&qkv, &z, &b, &alpha, &conv_w, &cs_in, &cs_out, &ssm_a, &dt_bias, &norm_w, &state, &y};
        for (int i = 0; i < 12; ++i)
            if (cudaError_t e = bufs[i]->alloc(sizeof(float) * sizes[i])) return e;
        return cudaSuccess;
    }
    GdnStepArgs args(int n_k, int n_v, int t, float eps) const {
        const auto f = [](const DevBuf& d) { return d.as<float>(); };
        GdnStepArgs a{n_k, n_v, t, eps, f(qkv), f(z), f(b), f(alpha), f(conv_w), f(cs_in), f(cs_out),
                      f(ssm_a), f(dt_bias), f(norm_w), f(state), f(y)};
        a.chunk_scratch = f(chunk);  // null unless form 2 (OPENJET_GDN_CHUNKED unset or 2) at alloc
        return a;
    }
};

// The step's inputs uploaded into d (allocated here), its outputs poisoned with NaN: every element must be written
// (conv_state_out: all channels, y: all rows).
cudaError_t upload_step(GdnDev& d, int n_k, int n_v, int t, const float* qkv, const float* z, const float* b,
                        const float* alpha, const float* conv_w, const float* conv_state_in, const float* ssm_a,
                        const float* dt_bias, const float* norm_w, const float* state) {
    const size_t conv_dim = (size_t)(2 * n_k + n_v) * kGdnHeadDim, vd = (size_t)n_v * kGdnHeadDim;
    if (cudaError_t e = d.alloc(n_k, n_v, t)) return e;
    const std::pair<const DevBuf*, std::pair<const float*, size_t>> parts[] = {
        {&d.qkv, {qkv, t * conv_dim}},
        {&d.z, {z, t * vd}},
        {&d.b, {b, (size_t)t * n_v}},
        {&d.alpha, {alpha, (size_t)t * n_v}},
        {&d.conv_w, {conv_w, 4 * conv_dim}},
        {&d.cs_in, {conv_state_in, 3 * conv_dim}},
        {&d.ssm_a, {ssm_a, (size_t)n_v}},
        {&d.dt_bias, {dt_bias, (size_t)n_v}},
        {&d.norm_w, {norm_w, (size_t)kGdnHeadDim}},
        {&d.state, {state, vd * kGdnHeadDim}}};
    for (const auto& [dst, src] : parts)
        if (cudaError_t e = cudaMemcpy(dst->p, src.first, sizeof(float) * src.second, cudaMemcpyHostToDevice)) return e;
    if (cudaError_t e = cudaMemset(d.cs_out.p, 0xFF, sizeof(float) * 3 * conv_dim)) return e;
    return cudaMemset(d.y.p, 0xFF, sizeof(float) * t * vd);
}

}  // namespace

extern "C" OPENJET_API int openjet_test_gdn_step(int n_k, int n_v, int t, float eps, const float* qkv, const float* z,
                                                 const float* b, const float* alpha, const float* conv_w,
                                                 const float* conv_state_in, float* conv_state_out,
                                                 const float* ssm_a, const float* dt_bias, const float* norm_w,
                                                 float* state, float* y) {
    if (int s = check_dims(n_k, n_v, t)) return s;
    if (!qkv || !z || !b || !alpha || !conv_w || !conv_state_in || !conv_state_out || !ssm_a || !dt_bias || !norm_w ||
        !state || !y)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "gdn_step: null pointer");
    const size_t conv_dim = (size_t)(2 * n_k + n_v) * kGdnHeadDim, vd = (size_t)n_v * kGdnHeadDim;
    GdnDev d;
    CHECK(upload_step(d, n_k, n_v, t, qkv, z, b, alpha, conv_w, conv_state_in, ssm_a, dt_bias, norm_w, state));
    CHECK(launch_gdn_step(d.args(n_k, n_v, t, eps), 0));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(conv_state_out, d.cs_out.p, sizeof(float) * 3 * conv_dim, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(state, d.state.p, sizeof(float) * vd * kGdnHeadDim, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(y, d.y.p, sizeof(float) * t * vd, cudaMemcpyDeviceToHost));
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_test_gdn_step_replay(int n_k, int n_v, int replay, int t, int commit, float eps,
                                                        const float* qkv, const float* z, const float* b,
                                                        const float* alpha, const float* conv_w,
                                                        const float* conv_state_in, float* conv_state_out,
                                                        const float* ssm_a, const float* dt_bias, const float* norm_w,
                                                        float* state, float* y) {
    if (int s = check_dims(n_k, n_v, t)) return s;
    if (t > kGdnMaxT || replay < 0 || replay > kGdnMaxT || commit < -1 || commit > replay + t)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "gdn_step_replay: t = %d, replay = %d, commit = %d (t 1..%d, replay "
                    "0..%d, commit -1..replay + t)", t, replay, commit, kGdnMaxT, kGdnMaxT);
    if (!qkv || !z || !b || !alpha || !conv_w || !conv_state_in || !conv_state_out || !ssm_a || !dt_bias || !norm_w ||
        !state || !y)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "gdn_step_replay: null pointer");
    const size_t conv_dim = (size_t)(2 * n_k + n_v) * kGdnHeadDim, vd = (size_t)n_v * kGdnHeadDim;
    GdnDev d;  // the own rows as openjet_test_gdn_step's; the replay rows in a ring of their own
    CHECK(upload_step(d, n_k, n_v, t, qkv + replay * conv_dim, z, b + replay * n_v, alpha + replay * n_v, conv_w,
                      conv_state_in, ssm_a, dt_bias, norm_w, state));
    DevBuf ring_qkv, ring_b, ring_alpha;
    GdnStepArgs a = d.args(n_k, n_v, t, eps);
    a.chunk_scratch = nullptr;  // a decode or verify step's call: whole-head blocks
    a.replay = replay, a.commit = commit;
    if (replay) {
        CHECK(ring_qkv.alloc(sizeof(float) * replay * conv_dim));
        CHECK(ring_b.alloc(sizeof(float) * replay * n_v));
        CHECK(ring_alpha.alloc(sizeof(float) * replay * n_v));
        CHECK(cudaMemcpy(ring_qkv.p, qkv, sizeof(float) * replay * conv_dim, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(ring_b.p, b, sizeof(float) * replay * n_v, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(ring_alpha.p, alpha, sizeof(float) * replay * n_v, cudaMemcpyHostToDevice));
        a.replay_qkv = ring_qkv.as<float>(), a.replay_b = ring_b.as<float>(), a.replay_alpha = ring_alpha.as<float>();
    }
    CHECK(cudaMemcpy(d.cs_out.p, conv_state_out, sizeof(float) * 3 * conv_dim, cudaMemcpyHostToDevice));
    CHECK(launch_gdn_step(a, 0));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(conv_state_out, d.cs_out.p, sizeof(float) * 3 * conv_dim, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(state, d.state.p, sizeof(float) * vd * kGdnHeadDim, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(y, d.y.p, sizeof(float) * t * vd, cudaMemcpyDeviceToHost));
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_test_gdn_step_bounded_pack(int n_k, int n_v, int t, float eps, const float* qkv,
                                                              const float* z, const float* b, const float* alpha,
                                                              const float* conv_w, const float* conv_state_in,
                                                              const float* ssm_a, const float* dt_bias,
                                                              const float* norm_w, const float* state,
                                                              const float* scales, uint16_t* h, uint16_t* sum,
                                                              float* inv) {
    if (int s = check_dims(n_k, n_v, t)) return s;
    if (!qkv || !z || !b || !alpha || !conv_w || !conv_state_in || !ssm_a || !dt_bias || !norm_w || !state ||
        !scales || !h || !sum || !inv)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "gdn_step_bounded_pack: null pointer");
    const size_t vd = (size_t)n_v * kGdnHeadDim;
    if (t > kActMaxRows || vd % kActUnit || gdn_chunked_form() != 2)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "gdn_step_bounded_pack: t = %d > %d, n_v * 128 not a multiple of "
                    "%d, or not the two-phase chunked form (OPENJET_GDN_CHUNKED)", t, kActMaxRows, kActUnit);
    GdnDev d;
    CHECK(upload_step(d, n_k, n_v, t, qkv, z, b, alpha, conv_w, conv_state_in, ssm_a, dt_bias, norm_w, state));
    DevBuf ph, psum, pinv, dscales;
    CHECK(ph.alloc(sizeof(__half) * t * vd));
    CHECK(psum.alloc(sizeof(__half) * t * (vd / kActBlock) * 2));
    CHECK(pinv.alloc(sizeof(float) * t));
    CHECK(dscales.alloc(sizeof(float) * t));
    CHECK(cudaMemcpy(dscales.p, scales, sizeof(float) * t, cudaMemcpyHostToDevice));
    const ActPack pack{ph.as<__half>(), psum.as<__half>(), pinv.as<float>(), t};
    bool packed = false;
    CHECK(launch_gdn_step(d.args(n_k, n_v, t, eps), 0, &pack, &packed, dscales.as<float>()));
    CHECK(cudaDeviceSynchronize());
    if (!packed) return fail(OPENJET_ERR_INVALID_ARGUMENT, "gdn_step_bounded_pack: the bounded pack did not run");
    CHECK(cudaMemcpy(h, ph.p, sizeof(uint16_t) * t * vd, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(sum, psum.p, sizeof(uint16_t) * t * (vd / kActBlock) * 2, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(inv, pinv.p, sizeof(float) * t, cudaMemcpyDeviceToHost));
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_test_bench_gdn(int n_k, int n_v, int t, int copies, int reps, int runs,
                                                  float* us_out) {
    if (int s = check_dims(n_k, n_v, t)) return s;
    if (!us_out || copies < 1 || reps < 1 || runs < 1)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "bench_gdn: null output or copies/reps/runs < 1");
    const size_t conv_dim = (size_t)(2 * n_k + n_v) * kGdnHeadDim, vd = (size_t)n_v * kGdnHeadDim;
    // Pseudo-random inputs in sensible ranges (never zeros); every copy starts from the same values.
    uint32_t seed = 12345u;
    const auto rnd = [&seed](float lo, float hi) {
        seed = seed * 1664525u + 1013904223u;
        return lo + (hi - lo) * static_cast<float>(seed >> 8) / static_cast<float>(1 << 24);
    };
    const auto fill = [&](size_t n, float lo, float hi) {
        std::vector<float> v(n);
        for (auto& x : v) x = rnd(lo, hi);
        return v;
    };
    const std::vector<float> h_qkv = fill(t * conv_dim, -2.f, 2.f), h_z = fill(t * vd, -2.f, 2.f),
                             h_b = fill((size_t)t * n_v, -2.f, 2.f), h_alpha = fill((size_t)t * n_v, -2.f, 2.f),
                             h_w = fill(4 * conv_dim, -0.5f, 0.5f), h_cs = fill(3 * conv_dim, -2.f, 2.f),
                             h_a = fill(n_v, -2.f, -0.1f), h_dt = fill(n_v, -1.f, 1.f), h_nw = fill(kGdnHeadDim, 0.5f, 1.5f),
                             h_s = fill(vd * kGdnHeadDim, -0.1f, 0.1f);
    GdnDev d;
    CHECK(d.alloc(n_k, n_v, t));
    const auto up = [](const DevBuf& dst, const std::vector<float>& src) {
        return cudaMemcpy(dst.p, src.data(), sizeof(float) * src.size(), cudaMemcpyHostToDevice);
    };
    CHECK(up(d.qkv, h_qkv)); CHECK(up(d.z, h_z)); CHECK(up(d.b, h_b)); CHECK(up(d.alpha, h_alpha));
    CHECK(up(d.conv_w, h_w)); CHECK(up(d.ssm_a, h_a)); CHECK(up(d.dt_bias, h_dt)); CHECK(up(d.norm_w, h_nw));
    // Per copy: its own S and conv state pair (the per-layer state a real step touches).
    std::vector<DevBuf> st(copies), cin(copies), cout(copies);
    for (int i = 0; i < copies; ++i) {
        CHECK(st[i].alloc(sizeof(float) * vd * kGdnHeadDim));
        CHECK(cin[i].alloc(sizeof(float) * 3 * conv_dim));
        CHECK(cout[i].alloc(sizeof(float) * 3 * conv_dim));
        CHECK(up(st[i], h_s));
        CHECK(up(cin[i], h_cs));
    }
    GdnStepArgs a = d.args(n_k, n_v, t, 1e-6f);
    const auto set = [&](int i) {
        a.state = st[i % copies].as<float>();
        a.conv_state_in = cin[i % copies].as<float>();
        a.conv_state_out = cout[i % copies].as<float>();
    };
    std::string failed;
    const auto launch = [&](int i, cudaStream_t stream) {
        set(i);
        return launch_gdn_step(a, stream);
    };
    if (cudaError_t e = time_graph_replays("launch_gdn_step", copies, reps, runs, us_out, launch, &failed))
        return cuda_fail(e, failed.c_str());
    // The states must still be finite after all those steps (a NaN would make the timing meaningless).
    std::vector<float> back(vd * kGdnHeadDim);
    CHECK(cudaMemcpy(back.data(), st[0].p, sizeof(float) * back.size(), cudaMemcpyDeviceToHost));
    for (float x : back)
        if (!std::isfinite(x)) return fail(OPENJET_ERR_INTERNAL, "bench_gdn: the state became non-finite");
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_test_gdn_probe(int blocks, int points, long long* clock, unsigned long long* ns,
                                                  unsigned* sm) {
    if (blocks < 1 || blocks > kGdnPackMaxBlocks || points != kGdnProbePoints || !clock || !ns || !sm)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "gdn_probe: blocks = %d (1..%d), points = %d (must be %d), or a null "
                    "output", blocks, kGdnPackMaxBlocks, points, static_cast<int>(kGdnProbePoints));
    GdnProbe p;
    if (const cudaError_t e = gdn_probe_read(&p)) return cuda_fail(e, "gdn_probe");
    for (int b = 0; b < blocks; ++b) {
        for (int i = 0; i < points; ++i) clock[b * points + i] = p.clock[b][i];
        ns[2 * b] = p.ns[b][0], ns[2 * b + 1] = p.ns[b][1];
        sm[b] = p.sm[b];
    }
    return OPENJET_OK;
}
