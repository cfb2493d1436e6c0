// openjet_test_attn_*: the test-only C API (include/openjet_test_attn.h) over launch_attn_decode.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "api_common.cuh"
#include "attn_decode.cuh"
#include "attn_prefill.cuh"
#include "openjet_test_attn.h"

namespace {

using namespace openjet;

constexpr auto& fail = fail_in<Api::kTest>;

int cuda_fail(cudaError_t e, const char* what) {
    return cuda_fail_in<Api::kTest>(e, what, "shape, t, kv_type or capacity");
}

int row_bytes(int kv_type) { return kv_type == kKvF16 ? KvF16::kRowBytes : kv_type == kKvQ8_0 ? KvQ8_0::kRowBytes : 0; }

int check_shape(int kv_type, int n_head, int n_kv, int n_past, int t) {
    if (!row_bytes(kv_type)) return fail(OPENJET_ERR_INVALID_ARGUMENT, "kv_type %d: the cache is F16 (1) or Q8_0 (8)", kv_type);
    if (n_head < 1 || n_kv < 1 || n_head % n_kv)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "n_head = %d, n_kv = %d: n_head must be a positive multiple of n_kv", n_head, n_kv);
    if (t < 1 || t > kAttnMaxT || n_head / n_kv * t > kAttnMaxRows)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "t = %d: must be 1..%d with (n_head / n_kv) * t <= %d", t, kAttnMaxT, kAttnMaxRows);
    if (n_past < 0) return fail(OPENJET_ERR_INVALID_ARGUMENT, "n_past = %d is negative", n_past);
    return OPENJET_OK;
}

// Fills rows [n_kv * capacity] of a cache with pseudo-random values in [-1, 1) (never zeros).
template <class Fmt>
__global__ void fill_cache_kernel(char* cache, uint32_t seed) {
    uint32_t s = (blockIdx.x * 256u + threadIdx.x) * 2654435761u ^ seed;
    s ^= s >> 16; s *= 0x7feb352du; s ^= s >> 15; s *= 0x846ca68bu; s ^= s >> 16;
    const float y = static_cast<float>(s >> 8) / static_cast<float>(1 << 23) - 1.0f;
    Fmt::store(cache + static_cast<size_t>(blockIdx.x) * Fmt::kRowBytes, threadIdx.x, y);
}

// Device caches of n_past + t rows per kv head, NaN-poisoned (the rows a call must write), the host's n_past rows
// ([n_kv, n_past, rb], NULL when n_past == 0) copied in front.
int upload_caches(int kv_type, int n_kv, int n_past, int t, const void* k_in, const void* v_in, DevBuf& dkc,
                  DevBuf& dvc) {
    const size_t rb = row_bytes(kv_type), cap = static_cast<size_t>(n_past) + t;
    CHECK(dkc.alloc(rb * cap * n_kv));
    CHECK(dvc.alloc(rb * cap * n_kv));
    CHECK(cudaMemset(dkc.p, 0xFF, rb * cap * n_kv));
    CHECK(cudaMemset(dvc.p, 0xFF, rb * cap * n_kv));
    if (n_past > 0) {  // host [n_kv, n_past, rb] -> device [n_kv, cap, rb]
        CHECK(cudaMemcpy2D(dkc.p, cap * rb, k_in, n_past * rb, n_past * rb, n_kv, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy2D(dvc.p, cap * rb, v_in, n_past * rb, n_past * rb, n_kv, cudaMemcpyHostToDevice));
    }
    return OPENJET_OK;
}

// OPENJET_ATTN_PREFILL_KEYS as the engine reads it (attn_prefill.cuh): *keys 0 (unset), 32 or 64; an error for
// another value.
int prefill_keys_from_env(int* keys) {
    *keys = attn_prefill_keys_switch();
    if (*keys < 0)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "OPENJET_ATTN_PREFILL_KEYS=%s: must be 32 or 64",
                    std::getenv("OPENJET_ATTN_PREFILL_KEYS"));
    return OPENJET_OK;
}

// OPENJET_ATTN_PREFILL_F16 (default on) as the engine takes it: a Q8_0 cache's prefill gets fp16 rows for its
// n_past + t keys (buf holds them).
cudaError_t give_f16_rows(AttnDecodeArgs& a, DevBuf& buf) {
    if (!attn_prefill_f16_switch() || a.kv_type != kKvQ8_0) return cudaSuccess;
    if (cudaError_t e = buf.alloc(attn_prefill_f16_bytes(a.n_kv, a.n_past + a.t))) return e;
    a.f16_rows = buf.as<char>(), a.f16_capacity = a.n_past + a.t;
    return cudaSuccess;
}

// OPENJET_TEST_ATTN_CAPTURED_AT=L (tests only; a decode step): the launch made as a CUDA graph's is, for length L
// (its split and checks), the real length n_past read on the device (AttnDecodeArgs::pos): L must be 0..n_past with
// n_past's chunk size. -1 where unset; an error for another value.
int captured_at_from_env(int n_past, int n_kv, int sms, int* at) {
    *at = -1;
    const char* v = std::getenv("OPENJET_TEST_ATTN_CAPTURED_AT");
    if (!v) return OPENJET_OK;
    char* end = nullptr;
    const long l = std::strtol(v, &end, 10);
    if (end == v || *end || l < 0 || l > n_past ||
        attn_chunk_keys(static_cast<int>(l), n_kv, sms) != attn_chunk_keys(n_past, n_kv, sms))
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "OPENJET_TEST_ATTN_CAPTURED_AT=%s: must be a length 0..%d with the "
                    "chunk size of %d", v, n_past, n_past);
    *at = static_cast<int>(l);
    return OPENJET_OK;
}

// A step (prefill = false: launch_attn_decode, t = 1..8) or a prefill call (launch_attn_prefill, t = 1..4096) on
// device copies of the inputs; the outputs copied back.
int attn_call(bool prefill, int kv_type, int n_head, int n_kv, int n_past, int t, const float* qproj, const float* k,
              const float* v, const float* q_norm, const float* k_norm, float eps, float rope_base, int n_rot,
              const void* k_in, const void* v_in, void* k_out, void* v_out, float* o, int prefill_rows = 0) {
    if (int s = check_shape(kv_type, n_head, n_kv, n_past, prefill ? 1 : t)) return s;
    if (prefill && (t < 1 || t > 4096)) return fail(OPENJET_ERR_INVALID_ARGUMENT, "t = %d: must be 1..4096", t);
    if (!qproj || !k || !v || !q_norm || !k_norm || !o || (n_past > 0 && (!k_in || !v_in)))
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "attn_%s: null pointer", prefill ? "prefill" : "decode");
    const size_t rb = row_bytes(kv_type), cap = static_cast<size_t>(n_past) + t;
    const size_t n_q = static_cast<size_t>(t) * n_head * 2 * kAttnHeadDim, n_k = static_cast<size_t>(t) * n_kv * kAttnHeadDim;
    const size_t n_o = static_cast<size_t>(t) * n_head * kAttnHeadDim;
    int chunk_keys = 0, n_chunks = 0, sms = 0;
    if (!prefill) CHECK(attn_decode_split(n_past, n_kv, t, &chunk_keys, &n_chunks, &sms));
    const size_t work = prefill ? attn_prefill_work_floats(n_head, t) : attn_decode_work_floats(n_head, t, n_chunks);
    DevBuf dq, dk, dv, dqn, dkn, dkc, dvc, dout, dwork;
    CHECK(dq.upload(qproj, sizeof(float) * n_q));
    CHECK(dk.upload(k, sizeof(float) * n_k));
    CHECK(dv.upload(v, sizeof(float) * n_k));
    CHECK(dqn.upload(q_norm, sizeof(float) * kAttnHeadDim));
    CHECK(dkn.upload(k_norm, sizeof(float) * kAttnHeadDim));
    if (int s = upload_caches(kv_type, n_kv, n_past, t, k_in, v_in, dkc, dvc)) return s;
    CHECK(dout.alloc(sizeof(float) * n_o));
    CHECK(dwork.alloc(sizeof(float) * work));
    // NaN poison: the output
    CHECK(cudaMemset(dout.p, 0xFF, sizeof(float) * n_o));
    CHECK(cudaMemset(dwork.p, 0xFF, sizeof(float) * work));
    AttnDecodeArgs a{};
    a.kv_type = kv_type, a.n_head = n_head, a.n_kv = n_kv, a.t = t, a.n_past = n_past, a.capacity = static_cast<int>(cap);
    a.n_rot = n_rot, a.eps = eps, a.rope_base = rope_base;
    a.qproj = dq.as<float>(), a.k = dk.as<float>(), a.v = dv.as<float>(), a.q_norm = dqn.as<float>(), a.k_norm = dkn.as<float>();
    a.k_cache = dkc.as<char>(), a.v_cache = dvc.as<char>(), a.o = dout.as<float>(), a.work = dwork.as<float>();
    a.sm_count = sms, a.prefill_rows = prefill_rows;
    attn_pipe_switch(&a.pipe, &a.stages);  // as the engine: OPENJET_ATTN_PIPE / OPENJET_ATTN_STAGES
    if (int st = prefill_keys_from_env(&a.prefill_keys)) return st;
    DevBuf f16, pos;
    if (prefill) CHECK(give_f16_rows(a, f16));
    int captured_at = -1;
    if (!prefill) {
        if (int st = captured_at_from_env(n_past, n_kv, sms, &captured_at)) return st;
        if (captured_at >= 0) {
            CHECK(pos.upload(&n_past, sizeof(int)));
            a.n_past = captured_at, a.pos = pos.as<int>(), a.pos_delta = 0;
        }
    }
    CHECK(prefill ? launch_attn_prefill(a, 0) : launch_attn_decode(a, 0));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(o, dout.p, sizeof(float) * n_o, cudaMemcpyDeviceToHost));
    if (k_out) CHECK(cudaMemcpy(k_out, dkc.p, rb * cap * n_kv, cudaMemcpyDeviceToHost));
    if (v_out) CHECK(cudaMemcpy(v_out, dvc.p, rb * cap * n_kv, cudaMemcpyDeviceToHost));
    return OPENJET_OK;
}

}  // namespace

extern "C" OPENJET_API int openjet_test_attn_prefill_wgmma_available() {
    return attn_prefill_wgmma_available() ? 1 : 0;
}

extern "C" OPENJET_API int openjet_test_attn_split(int n_past, int n_kv, int t, int* chunk_keys, int* n_chunks,
                                                   int* sm_count) {
    if (!chunk_keys || !n_chunks || !sm_count) return fail(OPENJET_ERR_INVALID_ARGUMENT, "attn_split: null pointer");
    CHECK(attn_decode_split(n_past, n_kv, t, chunk_keys, n_chunks, sm_count));
    return OPENJET_OK;
}

extern "C" OPENJET_API int openjet_test_attn_decode(int kv_type, int n_head, int n_kv, int n_past, int t,
                                                    const float* qproj, const float* k, const float* v,
                                                    const float* q_norm, const float* k_norm, float eps,
                                                    float rope_base, int n_rot, const void* k_in, const void* v_in,
                                                    void* k_out, void* v_out, float* o) {
    return attn_call(false, kv_type, n_head, n_kv, n_past, t, qproj, k, v, q_norm, k_norm, eps, rope_base, n_rot,
                     k_in, v_in, k_out, v_out, o);
}

extern "C" OPENJET_API int openjet_test_attn_prefill(int kv_type, int n_head, int n_kv, int n_past, int t,
                                                     const float* qproj, const float* k, const float* v,
                                                     const float* q_norm, const float* k_norm, float eps,
                                                     float rope_base, int n_rot, const void* k_in, const void* v_in,
                                                     void* k_out, void* v_out, float* o, int rows) {
    return attn_call(true, kv_type, n_head, n_kv, n_past, t, qproj, k, v, q_norm, k_norm, eps, rope_base, n_rot,
                     k_in, v_in, k_out, v_out, o, rows);
}

extern "C" OPENJET_API int openjet_test_attn_store_kv(int kv_type, int n_head, int n_kv, int n_past, int t,
                                                      const float* k, const float* v, const float* k_norm, float eps,
                                                      float rope_base, int n_rot, const void* k_in, const void* v_in,
                                                      void* k_out, void* v_out) {
    if (int s = check_shape(kv_type, n_head, n_kv, n_past, 1)) return s;  // t: its own limit below
    if (t < 1 || t > 4096) return fail(OPENJET_ERR_INVALID_ARGUMENT, "t = %d: must be 1..4096", t);
    if (!k || !v || !k_norm || !k_out || !v_out || (n_past > 0 && (!k_in || !v_in)))
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "attn_store_kv: null pointer");
    const size_t rb = row_bytes(kv_type), cap = static_cast<size_t>(n_past) + t;
    const size_t n_k = static_cast<size_t>(t) * n_kv * kAttnHeadDim;
    DevBuf dk, dv, dkn, dkc, dvc;
    CHECK(dk.upload(k, sizeof(float) * n_k));
    CHECK(dv.upload(v, sizeof(float) * n_k));
    CHECK(dkn.upload(k_norm, sizeof(float) * kAttnHeadDim));
    if (int s = upload_caches(kv_type, n_kv, n_past, t, k_in, v_in, dkc, dvc)) return s;
    AttnDecodeArgs a{};
    a.kv_type = kv_type, a.n_head = n_head, a.n_kv = n_kv, a.t = t, a.n_past = n_past, a.capacity = static_cast<int>(cap);
    a.n_rot = n_rot, a.eps = eps, a.rope_base = rope_base;
    a.k = dk.as<float>(), a.v = dv.as<float>(), a.k_norm = dkn.as<float>();
    a.k_cache = dkc.as<char>(), a.v_cache = dvc.as<char>();
    CHECK(launch_attn_store_kv(a, 0));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(k_out, dkc.p, rb * cap * n_kv, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(v_out, dvc.p, rb * cap * n_kv, cudaMemcpyDeviceToHost));
    return OPENJET_OK;
}

namespace {

// Times one decode step (prefill = false: prep, chunks, combine, the split sized for split_factor x the SMs) or
// one prefill call (launch_attn_prefill, prefill_rows rows per block) on random caches of n_past + t rows.
int bench_attn(bool prefill, int kv_type, int n_head, int n_kv, int n_past, int t, int split_factor, int prefill_rows,
               int copies, int reps, int runs, float* us_out) {
    if (int s = check_shape(kv_type, n_head, n_kv, n_past, prefill ? 1 : t)) return s;
    if (prefill && (t < 1 || t > 4096)) return fail(OPENJET_ERR_INVALID_ARGUMENT, "t = %d: must be 1..4096", t);
    if (!us_out || split_factor < 1 || copies < 1 || reps < 1 || runs < 1)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "bench_attn: null pointer or split_factor/copies/reps/runs < 1");
    const size_t rb = row_bytes(kv_type), cap = static_cast<size_t>(n_past) + t;
    const size_t rows = cap * n_kv;
    int chunk_keys = 0, n_chunks = 0, sms = 0;
    if (!prefill) {
        CHECK(attn_decode_split(n_past, n_kv, t, &chunk_keys, &n_chunks, &sms));
        sms *= split_factor;  // size the split as for a GPU with split_factor times the SMs
        n_chunks = attn_n_chunks(n_past, t, attn_chunk_keys(n_past, n_kv, sms));
    }
    std::vector<DevBuf> kc(copies), vc(copies);
    for (int i = 0; i < copies; ++i) {
        CHECK(kc[i].alloc(rb * rows));
        CHECK(vc[i].alloc(rb * rows));
        if (kv_type == kKvF16) {
            fill_cache_kernel<KvF16><<<static_cast<unsigned>(rows), 256>>>(kc[i].as<char>(), 2 * i + 1);
            fill_cache_kernel<KvF16><<<static_cast<unsigned>(rows), 256>>>(vc[i].as<char>(), 2 * i + 2);
        } else {
            fill_cache_kernel<KvQ8_0><<<static_cast<unsigned>(rows), 256>>>(kc[i].as<char>(), 2 * i + 1);
            fill_cache_kernel<KvQ8_0><<<static_cast<unsigned>(rows), 256>>>(vc[i].as<char>(), 2 * i + 2);
        }
        CHECK(cudaGetLastError());
    }
    // Inputs: fixed pseudo-random projections, norms near 1.
    const size_t n_q = static_cast<size_t>(t) * n_head * 2 * kAttnHeadDim, n_k = static_cast<size_t>(t) * n_kv * kAttnHeadDim;
    std::vector<float> host(n_q + 2 * n_k + 2 * kAttnHeadDim);
    fill_pseudo_random(host);
    for (size_t i = n_q + 2 * n_k; i < host.size(); ++i) host[i] = 1.0f + 0.1f * host[i];
    DevBuf din, dout, dwork;
    CHECK(din.upload(host.data(), sizeof(float) * host.size()));
    CHECK(dout.alloc(sizeof(float) * t * n_head * kAttnHeadDim));
    CHECK(dwork.alloc(sizeof(float) * (prefill ? attn_prefill_work_floats(n_head, t)
                                               : attn_decode_work_floats(n_head, t, n_chunks))));
    AttnDecodeArgs a{};
    a.kv_type = kv_type, a.n_head = n_head, a.n_kv = n_kv, a.t = t, a.n_past = n_past, a.capacity = static_cast<int>(cap);
    a.n_rot = 64, a.eps = 1e-6f, a.rope_base = 1e7f;
    const float* in = din.as<float>();
    a.qproj = in, a.k = in + n_q, a.v = in + n_q + n_k, a.q_norm = in + n_q + 2 * n_k, a.k_norm = a.q_norm + kAttnHeadDim;
    a.o = dout.as<float>(), a.work = dwork.as<float>(), a.sm_count = sms, a.prefill_rows = prefill_rows;
    attn_pipe_switch(&a.pipe, &a.stages);
    if (int st = prefill_keys_from_env(&a.prefill_keys)) return st;
    DevBuf f16;
    if (prefill) CHECK(give_f16_rows(a, f16));
    std::string failed;
    const auto launch = [&](int i, cudaStream_t stream) {
        a.k_cache = kc[i % copies].as<char>(), a.v_cache = vc[i % copies].as<char>();
        return prefill ? launch_attn_prefill(a, stream) : launch_attn_decode(a, stream);
    };
    if (cudaError_t e = time_graph_replays(prefill ? "launch_attn_prefill" : "launch_attn_decode", copies, reps, runs,
                                           us_out, launch, &failed))
        return cuda_fail(e, failed.c_str());
    return OPENJET_OK;
}

}  // namespace

extern "C" OPENJET_API int openjet_test_bench_attn_decode(int kv_type, int n_head, int n_kv, int n_past, int t,
                                                          int split_factor, int copies, int reps, int runs,
                                                          float* us_out) {
    return bench_attn(false, kv_type, n_head, n_kv, n_past, t, split_factor, 0, copies, reps, runs, us_out);
}

extern "C" OPENJET_API int openjet_test_bench_attn_prefill(int kv_type, int n_head, int n_kv, int n_past, int t,
                                                           int rows, int reps, int runs, float* us_out) {
    return bench_attn(true, kv_type, n_head, n_kv, n_past, t, 1, rows, 1, reps, runs, us_out);
}
