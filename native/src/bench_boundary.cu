// openjet_test_bench_boundary: what a phase boundary costs on this GPU with no work on either side, the two ways
// the engine has of passing one (issue 7's question: the persistent FFN's phases stream at the launches' rate, yet
// each layer loses ~25 us at its edges, NOTES_gemv.md 2026-12-05).
//   hand-over: one launch to the next under PDL (every decode kernel starts with pdl_wait, lets the next one in),
//              timed as a CUDA graph of `rounds` launches (time_graph_replays) so that the host's enqueue rate is not
//              what is measured;
//   barrier:   one grid-wide round inside a resident grid, as ffn_persistent.cu's phases pass one: each arriving warp
//              fences and adds 1 to a counter, then every warp's lane 0 spins on an acquire load until the round's
//              arrivals are all in (grid_sync.cuh's warp_arrive and warp_wait, the kernel's own). With block_wait,
//              only warp 0 of each block spins and releases its block with __syncthreads (one poller a block on the
//              counter's line instead of every warp: what a barrier with fewer pollers would gain).
// With read_bytes > 0, every warp of every block then reads the same read_bytes from L2 (ld.global.cg), as each block of
// a projection reads the activation row the phase before made (10 KB at T = 1, fp16 x 5,120; the removed norm fold read
// ~60 KB of h, the delta and the norm weights): the same lines asked for by the whole grid at once, after either kind
// of boundary.
#include <cuda_runtime.h>

#include <climits>
#include <string>

#include "api_common.cuh"
#include "grid_sync.cuh"
#include "openjet_test.h"
#include "pdl.cuh"

namespace {

using namespace openjet;

constexpr auto& fail = fail_in<Api::kTest>;

int cuda_fail(cudaError_t e, const char* what) { return cuda_fail_in<Api::kTest>(e, what, "the grid's shape"); }

constexpr int kReadBatch = 8;  // 16-byte loads a lane has in flight before it uses the first

// The warp reads `bytes` (a multiple of 512) of `src` through L2, kReadBatch pieces of 512 bytes (a 16-byte load a lane)
// in flight before it uses the first; from piece 0 in every warp (the whole grid asking for the same lines at once),
// or with `rotated` from a piece of its own (each warp of the grid starting elsewhere, round the row). A word that keeps
// the loads: sum_out is written only where the sum is one no buffer of zeros gives.
__device__ __forceinline__ void warp_read(const uint4* src, int bytes, bool rotated, unsigned* sum_out) {
    const int lane = threadIdx.x & 31, pieces = bytes / 512;
    const int first = rotated ? (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) % pieces : 0;
    unsigned sum = 0;
    for (int j0 = 0; j0 < pieces; j0 += kReadBatch) {
        uint4 v[kReadBatch];
#pragma unroll
        for (int q = 0; q < kReadBatch; ++q) {
            int piece = first + j0 + q;
            if (piece >= pieces) piece -= pieces;
            v[q] = j0 + q < pieces ? __ldcg(src + piece * 32 + lane) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int q = 0; q < kReadBatch; ++q) sum += v[q].x ^ v[q].y ^ v[q].z ^ v[q].w;
    }
    if (sum == 0xdeadbeefu) *sum_out = sum;
}

__global__ void handover_kernel(int* launches, const uint4* src, int read_bytes, int rotated, unsigned* sink) {
    pdl_start();
    if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(launches, 1);  // (a count the caller checks)
    if (read_bytes) warp_read(src, read_bytes, rotated, sink);
}

__global__ void barrier_kernel(int* counter, int rounds, int arrivals_per_block, int block_wait, const uint4* src,
                               int read_bytes, int rotated, unsigned* sink) {
    pdl_start();
    const int warp = threadIdx.x >> 5;
    const int per_round = gridDim.x * arrivals_per_block;
    for (int r = 1; r <= rounds; ++r) {  // (the persistent FFN's phase boundary: grid_sync.cuh)
        if (warp < arrivals_per_block) warp_arrive(counter, 1);
        if (!block_wait) {
            warp_wait(counter, r * per_round);
        } else {
            if (warp == 0) warp_wait(counter, r * per_round);  // (its acquire, then the block's barrier: the
            __syncthreads();                                    // other warps ordered after the arrivals too)
        }
        if (read_bytes) warp_read(src, read_bytes, rotated, sink);
    }
}

// One thread spinning `ns` on the device: queued before a timed launch, it keeps the stream busy while the host
// submits that launch, so the first event fires when the launch can start, not before the host has sent it.
__global__ void delay_kernel(unsigned long long ns) {
    const unsigned long long start = global_ns();
    while (global_ns() - start < ns) __nanosleep(256);
}

constexpr unsigned long long kDelayNs = 50'000;
constexpr int kMaxReadBytes = 1 << 20;

// The milliseconds `work` takes on `stream` (events around it; the delay kernel before the first). (The hand-over's
// graph is timed by api_common.cuh's time_graph_replays: its replays keep the stream busy on their own.)
template <class Work> cudaError_t time_ms(cudaStream_t stream, const Work& work, float* ms) {
    Event e0, e1;
    if (cudaError_t e = cudaEventCreate(&e0.e)) return e;
    if (cudaError_t e = cudaEventCreate(&e1.e)) return e;
    delay_kernel<<<1, 1, 0, stream>>>(kDelayNs);
    if (cudaError_t e = cudaGetLastError()) return e;
    if (cudaError_t e = cudaEventRecord(e0.e, stream)) return e;
    if (cudaError_t e = work()) return e;
    if (cudaError_t e = cudaEventRecord(e1.e, stream)) return e;
    if (cudaError_t e = cudaEventSynchronize(e1.e)) return e;
    return cudaEventElapsedTime(ms, e0.e, e1.e);
}

}  // namespace

extern "C" OPENJET_API int openjet_test_bench_boundary(int blocks_per_sm, int threads, int arrivals_per_block,
                                                       int block_wait, int read_bytes, int read_rotated, int rounds,
                                                       int runs, float* handover_us, float* barrier_us,
                                                       int* counts_out) {
    if (blocks_per_sm < 1 || threads < 32 || threads > 1024 || threads % 32 || arrivals_per_block < 1 ||
        arrivals_per_block > threads / 32 || read_bytes < 0 || read_bytes > kMaxReadBytes || read_bytes % 512 ||
        rounds < 1 || runs < 1 || !handover_us || !barrier_us || !counts_out)
        return fail(OPENJET_ERR_INVALID_ARGUMENT,
                    "bench_boundary: blocks_per_sm >= 1, threads a multiple of 32 up to 1024, arrivals_per_block "
                    "1..threads/32, read_bytes a multiple of 512 up to %d, rounds and runs >= 1, outputs not null",
                    kMaxReadBytes);
    int dev = 0, sms = 0, per_sm = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, barrier_kernel, threads, 0));
    if (blocks_per_sm > per_sm)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "bench_boundary: %d blocks a SM of %d threads, at most %d resident",
                    blocks_per_sm, threads, per_sm);
    const int grid = sms * blocks_per_sm;
    if (static_cast<long long>(rounds) * grid * arrivals_per_block > INT_MAX ||
        1 + (static_cast<long long>(runs) + 1) * rounds > INT_MAX)
        return fail(OPENJET_ERR_INVALID_ARGUMENT, "bench_boundary: rounds x grid x arrivals_per_block or the "
                                                  "launches counted past an int");
    DevBuf counters, row;
    CHECK(counters.alloc(4 * sizeof(int)));
    int* launches = static_cast<int*>(counters.p);
    int* counter = launches + 1;
    unsigned* sink = reinterpret_cast<unsigned*>(launches + 2);
    CHECK(cudaMemset(launches, 0, sizeof(int)));
    CHECK(row.alloc(read_bytes ? read_bytes : 16));
    CHECK(cudaMemset(row.p, 0, read_bytes ? read_bytes : 16));
    const uint4* src = static_cast<const uint4*>(row.p);

    // The hand-over: `rounds` launches of the grid as one CUDA graph (PDL's edges kept in it), replayed.
    std::string failed;
    const auto handover = [&](int, cudaStream_t stream) {
        return launch_kernel(handover_kernel, dim3(grid), dim3(threads), 0, stream, launches, src, read_bytes,
                             read_rotated, sink);
    };
    if (cudaError_t e = time_graph_replays("handover_kernel", 1, rounds, runs, handover_us, handover, &failed))
        return cuda_fail(e, failed.c_str());
    CHECK(cudaMemcpy(&counts_out[0], launches, sizeof(int), cudaMemcpyDeviceToHost));

    // The barrier: one launch with `rounds` rounds against one with none, after an untimed first launch.
    Stream stream;
    CHECK(stream.create());
    CHECK(cudaMemsetAsync(counter, 0, sizeof(int), stream.s));
    CHECK(launch_kernel(barrier_kernel, dim3(grid), dim3(threads), 0, stream.s, counter, 1, arrivals_per_block,
                        block_wait, src, read_bytes, read_rotated, sink));
    CHECK(cudaStreamSynchronize(stream.s));
    for (int r = 0; r < runs; ++r) {
        float barrier_ms = 0.0f, empty_ms = 0.0f;
        CHECK(cudaMemsetAsync(counter, 0, sizeof(int), stream.s));
        CHECK(time_ms(stream.s, [&] {
            return launch_kernel(barrier_kernel, dim3(grid), dim3(threads), 0, stream.s, counter, 0,
                                 arrivals_per_block, block_wait, src, read_bytes, read_rotated, sink);
        }, &empty_ms));
        CHECK(time_ms(stream.s, [&] {
            return launch_kernel(barrier_kernel, dim3(grid), dim3(threads), 0, stream.s, counter, rounds,
                                 arrivals_per_block, block_wait, src, read_bytes, read_rotated, sink);
        }, &barrier_ms));
        CHECK(cudaMemcpy(&counts_out[1 + r], counter, sizeof(int), cudaMemcpyDeviceToHost));
        barrier_us[r] = (barrier_ms - empty_ms) * 1e3f / rounds;
    }
    return OPENJET_OK;
}
