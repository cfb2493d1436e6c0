// What the C API files (test_api*.cu, engine.cu) share: the per-thread last-error message, CUDA calls checked
// into a status (never an abort), device buffers freed at scope exit, and the timing of a kernel replayed from
// a CUDA graph. Host code only; each API file brings fail / cuda_fail for its own surface into scope.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "openjet.h"

namespace openjet {

// The C API surfaces with a *_last_error() of their own: a failed test call never overwrites the engine's.
enum class Api { kTest, kEngine };

// This thread's message of one surface ("" until one of its calls fails).
template <Api A> std::string& last_error() {
    static thread_local std::string message;
    return message;
}

// Sets this thread's message of A (printf-style) and returns status, so a failure reads `return fail(...)`.
template <Api A> __attribute__((format(printf, 2, 3))) int fail_in(int status, const char* fmt, ...) {
    char b[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    last_error<A>() = b;
    return status;
}

// A failed CUDA call `what` as a status: cudaErrorInvalidValue with an invalid_hint (what the launcher
// rejects) is the caller's mistake, OPENJET_ERR_INVALID_ARGUMENT; anything else is -4 (OPENJET_TEST_ERR_CUDA,
// OPENJET_ENGINE_ERR_CUDA) with CUDA's name and text of the error.
template <Api A> int cuda_fail_in(cudaError_t e, const char* what, const char* invalid_hint) {
    constexpr int kErrCuda = -4;
    if (invalid_hint && e == cudaErrorInvalidValue)
        return fail_in<A>(OPENJET_ERR_INVALID_ARGUMENT, "%s: invalid argument (%s)", what, invalid_hint);
    return fail_in<A>(kErrCuda, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

// Returns cuda_fail(error, "call") (the including file's, for its surface) when a CUDA call fails.
#define CHECK(call)                                         \
    do {                                                    \
        const cudaError_t e_ = (call);                      \
        if (e_ != cudaSuccess) return cuda_fail(e_, #call); \
    } while (0)

// Device memory freed at scope exit.
struct DevBuf {
    void* p = nullptr;
    DevBuf() = default;
    DevBuf(const DevBuf&) = delete;
    DevBuf(DevBuf&& o) noexcept : p(o.p) { o.p = nullptr; }
    ~DevBuf() {
        if (p) cudaFree(p);
    }
    cudaError_t alloc(size_t bytes) { return cudaMalloc(&p, bytes ? bytes : 1); }
    // alloc, then copy `bytes` in from the host.
    cudaError_t upload(const void* host, size_t bytes) {
        const cudaError_t e = alloc(bytes);
        return e != cudaSuccess ? e : cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice);
    }
    template <class T> T* as() const { return static_cast<T*>(p); }
};

// An event destroyed at scope exit.
struct Event {
    cudaEvent_t e = nullptr;
    ~Event() {
        if (e) cudaEventDestroy(e);
    }
};

// A non-blocking stream destroyed at scope exit (create() makes it).
struct Stream {
    cudaStream_t s = nullptr;
    ~Stream() {
        if (s) cudaStreamDestroy(s);
    }
    cudaError_t create() { return cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); }
};

// The sampler's penalty list (topk.cuh): ids in [0, n_valid) and unique, since a device thread updates
// each one. nullptr when fine, else what is wrong.
inline const char* penalty_list_problem(const int32_t* ids, int n, int n_valid) {
    std::vector<int32_t> sorted(ids, ids + n);
    std::sort(sorted.begin(), sorted.end());
    for (int i = 0; i < n; ++i) {
        if (sorted[i] < 0 || sorted[i] >= n_valid) return "a penalised token id is outside the vocabulary";
        if (i && sorted[i] == sorted[i - 1]) return "a token id is penalised twice";
    }
    return nullptr;
}

// Fixed pseudo-random values in [-1, 1), never all zero: the benchmarks' activations (an LCG from seed 12345).
inline void fill_pseudo_random(std::vector<float>& v) {
    uint32_t s = 12345u;
    for (auto& x : v) {
        s = s * 1664525u + 1013904223u;
        x = static_cast<float>(static_cast<int>(s >> 8) - (1 << 23)) / static_cast<float>(1 << 23);
    }
}

// Times launch(i, stream) (a cudaError_t), i = 0 .. reps - 1, the calls rotating through `copies` buffer sets:
// one warm-up call per copy on the default stream (module load, smem opt-in), then the reps calls captured in
// one CUDA graph, one warm replay, and `runs` timed replays: us_out[r] = microseconds per call of replay r.
// On failure returns the error and names the failed call in *failed (`name`: the launcher's).
template <class Launch>
cudaError_t time_graph_replays(const char* name, int copies, int reps, int runs, float* us_out, Launch&& launch,
                               std::string* failed) {
#define TRY_CUDA(call, what)                   \
    do {                                       \
        const cudaError_t e_ = (call);         \
        if (e_ != cudaSuccess) {               \
            *failed = what;                    \
            return e_;                         \
        }                                      \
    } while (0)
    for (int i = 0; i < copies; ++i) TRY_CUDA(launch(i, cudaStream_t{}), std::string(name) + " (warm-up)");
    TRY_CUDA(cudaDeviceSynchronize(), "cudaDeviceSynchronize()");

    Stream owned;
    TRY_CUDA(owned.create(), "cudaStreamCreateWithFlags");
    const cudaStream_t stream = owned.s;
    cudaGraph_t graph = nullptr;
    TRY_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    for (int i = 0; i < reps; ++i) {
        const cudaError_t e = launch(i, stream);
        if (e != cudaSuccess) {
            cudaStreamEndCapture(stream, &graph);
            if (graph) cudaGraphDestroy(graph);
            *failed = std::string(name) + " (capture)";
            return e;
        }
    }
    TRY_CUDA(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t ie = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    TRY_CUDA(ie, "cudaGraphInstantiate");
    struct ExecGuard {
        cudaGraphExec_t g;
        ~ExecGuard() { cudaGraphExecDestroy(g); }
    } eg{exec};
    Event e0, e1;
    TRY_CUDA(cudaEventCreate(&e0.e), "cudaEventCreate");
    TRY_CUDA(cudaEventCreate(&e1.e), "cudaEventCreate");
    TRY_CUDA(cudaGraphLaunch(exec, stream), "cudaGraphLaunch (warm replay)");
    for (int r = 0; r < runs; ++r) {
        TRY_CUDA(cudaEventRecord(e0.e, stream), "cudaEventRecord");
        TRY_CUDA(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
        TRY_CUDA(cudaEventRecord(e1.e, stream), "cudaEventRecord");
        TRY_CUDA(cudaEventSynchronize(e1.e), "cudaEventSynchronize");
        float ms = 0.0f;
        TRY_CUDA(cudaEventElapsedTime(&ms, e0.e, e1.e), "cudaEventElapsedTime");
        us_out[r] = ms * 1000.0f / reps;
    }
    return cudaSuccess;
#undef TRY_CUDA
}

}  // namespace openjet
