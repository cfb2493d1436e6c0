// How fast can a few SMs pull weights into L2 while the rest of the GPU is idle? The decode step's latency-bound
// kernels (the packs on an 8-block cluster a row, the GDN step's 48 blocks) leave DRAM idle for ~5-10 us each; if
// their blocks can prefetch the next GEMV's first bytes into L2 in that time, the GEMV starts from L2.
//
// Each trial: flush L2 (read 256 MB elsewhere), a "gap" kernel of B blocks that issues prefetches of the first S bytes
// of a range and then spins for D us (the gap kernel's own work), then a full-GPU read of the range, timed. Modes:
//   none   no prefetch (the gap alone: the cold read)
//   bulk   thread 0 of each block: cp.async.bulk.prefetch.L2 over its slice in pieces of C bytes (the TMA unit)
//   bulkel the same with an evict_last cache policy
//   lines  every thread: prefetch.global.L2 of its share of 128-byte lines (the form measured slow at 83ed0d8)
// Prints one JSON object a trial. Build: nvcc -O3 -std=c++17 -arch=sm_90a -o l2_prefetch l2_prefetch.cu
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                                                            \
    do {                                                                                 \
        cudaError_t e_ = (x);                                                            \
        if (e_ != cudaSuccess) {                                                         \
            std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            std::exit(1);                                                                \
        }                                                                                \
    } while (0)

enum Mode { kNone, kBulk, kBulkEvictLast, kLines };

__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

__global__ void gap_kernel(const char* p, size_t bytes, int mode, unsigned chunk, unsigned spin_ns,
                           unsigned long long* issue_ns) {
    const unsigned long long t0 = now_ns();
    const size_t slice = (bytes / gridDim.x + 127) / 128 * 128;
    const size_t lo = slice * blockIdx.x, hi = lo + slice < bytes ? lo + slice : bytes;
    if ((mode == kBulk || mode == kBulkEvictLast) && threadIdx.x == 0) {
        uint64_t policy = 0;
        if (mode == kBulkEvictLast) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
        for (size_t o = lo; o < hi; o += chunk) {
            const unsigned n = static_cast<unsigned>(hi - o < chunk ? hi - o : chunk);
            if (mode == kBulk)
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + o), "r"(n) : "memory");
            else
                asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(p + o), "r"(n),
                             "l"(policy)
                             : "memory");
        }
    } else if (mode == kLines) {
        for (size_t o = lo + 128 * threadIdx.x; o < hi; o += 128 * blockDim.x)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
    }
    __syncthreads();
    if (threadIdx.x == 0 && blockIdx.x == 0) *issue_ns = now_ns() - t0;
    while (now_ns() - t0 < spin_ns) {
    }
}

__global__ void read_kernel(const uint4* __restrict__ p, size_t n, unsigned* sink) {
    unsigned acc = 0;
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
#pragma unroll 4
    for (; i < n; i += stride) {
        const uint4 v = __ldcs(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc;
}

int main(int argc, char** argv) {
    int dev = 0, sms = 0;
    CK(cudaSetDevice(dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    int l2 = 0;
    CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    const size_t total = size_t(1) << 31;
    char* buf = nullptr;
    unsigned* sink = nullptr;
    unsigned long long* issue = nullptr;
    CK(cudaMalloc(&buf, total));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMalloc(&issue, 8));
    CK(cudaMemset(buf, 1, total));
    const size_t flush_off = size_t(1) << 30, flush_bytes = size_t(256) << 20;
    cudaEvent_t a, b, c;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventCreate(&c));
    const int read_blocks = sms * 8;
    auto read = [&](size_t off, size_t bytes) {
        read_kernel<<<read_blocks, 256>>>(reinterpret_cast<const uint4*>(buf + off), bytes / 16, sink);
    };
    std::printf("{\"sms\": %d, \"l2_bytes\": %d}\n", sms, l2);
    const char* modes[] = {"none", "bulk", "bulkel", "lines"};
    const int blocks_list[] = {1, 8, 16, 48, 132};
    const size_t sizes_mb[] = {8, 16, 24};
    const unsigned spins_us[] = {3, 6, 12};
    const unsigned chunks[] = {4096, 65536};
    const int reps = 5;
    for (size_t smb : sizes_mb)
        for (unsigned spin : spins_us)
            for (int mode = 0; mode < 4; ++mode)
                for (int blocks : blocks_list)
                    for (unsigned chunk : chunks) {
                        if (mode == kNone && (blocks != 1 || chunk != chunks[0])) continue;
                        if (mode == kLines && chunk != chunks[0]) continue;
                        const size_t bytes = smb << 20, off = size_t(64) << 20;
                        std::vector<float> gap_ms, read_ms;
                        unsigned long long issue_ns = 0;
                        for (int r = 0; r < reps + 1; ++r) {
                            read(flush_off, flush_bytes);
                            CK(cudaDeviceSynchronize());
                            CK(cudaEventRecord(a));
                            gap_kernel<<<blocks, 256>>>(buf + off, bytes, mode, chunk, spin * 1000, issue);
                            CK(cudaEventRecord(b));
                            read(off, bytes);
                            CK(cudaEventRecord(c));
                            CK(cudaEventSynchronize(c));
                            CK(cudaGetLastError());
                            float g = 0, rd = 0;
                            CK(cudaEventElapsedTime(&g, a, b));
                            CK(cudaEventElapsedTime(&rd, b, c));
                            CK(cudaMemcpy(&issue_ns, issue, 8, cudaMemcpyDeviceToHost));
                            if (r) gap_ms.push_back(g), read_ms.push_back(rd);
                        }
                        std::sort(gap_ms.begin(), gap_ms.end());
                        std::sort(read_ms.begin(), read_ms.end());
                        std::printf(
                            "{\"mb\": %zu, \"spin_us\": %u, \"mode\": \"%s\", \"blocks\": %d, \"chunk\": %u, "
                            "\"gap_us\": %.2f, \"read_us\": %.2f, \"read_gbs\": %.0f, \"issue_us\": %.2f}\n",
                            smb, spin, modes[mode], blocks, chunk, 1e3 * gap_ms[reps / 2], 1e3 * read_ms[reps / 2],
                            bytes / (1e6 * read_ms[reps / 2]), issue_ns / 1e3);
                    }
    // the warm read (the range read twice): what a read from L2 costs
    for (size_t smb : sizes_mb) {
        const size_t bytes = smb << 20, off = size_t(64) << 20;
        read(off, bytes);
        CK(cudaEventRecord(b));
        read(off, bytes);
        CK(cudaEventRecord(c));
        CK(cudaEventSynchronize(c));
        float rd = 0;
        CK(cudaEventElapsedTime(&rd, b, c));
        std::printf("{\"mb\": %zu, \"mode\": \"warm\", \"read_us\": %.2f}\n", smb, 1e3 * rd);
    }
    return 0;
}
