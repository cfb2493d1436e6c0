// How fast can the decode GEMV's weight reads go on this GPU with no arithmetic at all? (issues 6 and 7)
//
// The decode GEMV stops near 65% of the copy rate per call even with 2-4x fewer instructions (NOTES_gemv.md), so
// this separates the access pattern from the kernel: each kernel below reads a k-quant matrix's bytes the way one
// GEMV design would and only xors a word per lane into a sink. Patterns:
//   stream: the whole matrix as one contiguous array (grid-stride 16-byte loads): the ceiling;
//   tile:   engine v1's decode GEMV: a block of 4 warps per 16-row tile, warp w the k quarter w, each 256-weight
//           unit (16 rows x 144 bytes, Q4_K) cp.async'd into a STAGES-deep shared ring; --layout tiled puts a tile's
//           16 rows of one unit next to each other (a load-time repack); --persist runs SMs x blocks blocks that
//           walk tiles grid-stride and keep their ring full across tile boundaries;
//   row:    a warp per row, the whole row's bytes as 16-byte register loads, BATCH in flight per lane.
// Each launch reads another copy of the matrix (copies fill >= 1 GiB, so L2 holds none of it). One JSON line per
// case on stdout. Build and run (scripts/gpu_read_patterns.sh):
//   nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/read_patterns native/bench/read_patterns.cu && /tmp/read_patterns
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../src/cp_async.cuh"  // the engine's cp.async helpers

using openjet::cp_async16;
using openjet::cp_async_commit;
using openjet::cp_async_wait;

#define CHECK(x)                                                                           \
    do {                                                                                   \
        cudaError_t e_ = (x);                                                              \
        if (e_ != cudaSuccess) {                                                           \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            std::exit(1);                                                                  \
        }                                                                                  \
    } while (0)

constexpr int kUnitBytes = 144;  // one Q4_K super-block: 256 weights
constexpr int kTileRows = 16;
constexpr int kUnitChunks = kTileRows * kUnitBytes / 16;  // 16-byte copies per warp unit: 144

__device__ __forceinline__ uint4 load_stream(const void* p) {  // read once: no L1 allocation
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__global__ void stream_kernel(const uint4* p, size_t n16, unsigned* sink) {
    unsigned acc = 0;
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        const uint4 a = load_stream(p + i), b = load_stream(p + i + stride);
        const uint4 c = load_stream(p + i + 2 * stride), d = load_stream(p + i + 3 * stride);
        acc ^= a.x ^ b.y ^ c.z ^ d.w;
    }
    for (; i < n16; i += stride) acc ^= load_stream(p + i).x;
    if (acc == 0x12345678u) sink[0] = acc;  // never true in practice; keeps the loads
}

// The address of unit u (0 .. units per row) of row r of tile `tile`, 16-byte chunk c of its 16 x 144 bytes.
template <bool kTiledLayout>
__device__ __forceinline__ const char* unit_chunk(const char* m, int tile, int u, int c, int units_per_row) {
    const int r = c / (kUnitBytes / 16), off = (c % (kUnitBytes / 16)) * 16;
    if (kTiledLayout)  // [tile][unit][16 rows][144 bytes]
        return m + ((size_t(tile) * units_per_row + u) * kTileRows + r) * kUnitBytes + off;
    return m + (size_t(tile) * kTileRows + r) * units_per_row * kUnitBytes + size_t(u) * kUnitBytes + off;
}

template <int kStages, bool kTiledLayout>
__global__ void __launch_bounds__(128) tile_kernel(const char* m, int tiles, int units_per_row, int work_cycles,
                                                   unsigned* sink) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    unsigned char* ring = smem + warp * kStages * kTileRows * kUnitBytes;
    const int uq = units_per_row / 4;  // this warp's k quarter: units warp*uq .. +uq
    const int my_tiles = (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x;
    const int seq = my_tiles * uq;  // the warp's units over all its tiles, one continuous pipeline
    auto issue = [&](int s) {
        if (s < seq) {
            const int tile = blockIdx.x + (s / uq) * gridDim.x, u = warp * uq + s % uq;
            unsigned char* dst = ring + (s % kStages) * kTileRows * kUnitBytes;
            for (int c = lane; c < kUnitChunks; c += 32)
                cp_async16(dst + c * 16, unit_chunk<kTiledLayout>(m, tile, u, c, units_per_row));
        }
        cp_async_commit();  // an empty group past the end keeps the wait count uniform
    };
    for (int s = 0; s < kStages - 1; ++s) issue(s);
    unsigned acc = 0;
    for (int s = 0; s < seq; ++s) {
        issue(s + kStages - 1);
        cp_async_wait<kStages - 1>();
        __syncwarp();
        acc ^= reinterpret_cast<const unsigned*>(ring + (s % kStages) * kTileRows * kUnitBytes)[lane];
        if (work_cycles) {  // the unit's arithmetic, as a busy wait that takes issue slots as the real one does
            const long long t0 = clock64();
            while (clock64() - t0 < work_cycles) acc += 1;
        }
        __syncwarp();
    }
    if (acc == 0x12345678u) sink[0] = acc;
}

template <int kBatch>
__global__ void row_kernel(const char* m, int rows, int row_bytes, unsigned* sink) {
    const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
    const int chunks = row_bytes / 16;
    unsigned acc = 0;
    for (int r = blockIdx.x * warps + threadIdx.x / 32; r < rows; r += gridDim.x * warps) {
        const uint4* row = reinterpret_cast<const uint4*>(m + size_t(r) * row_bytes);
        for (int c0 = 0; c0 < chunks; c0 += 32 * kBatch) {
            uint4 v[kBatch];
#pragma unroll
            for (int j = 0; j < kBatch; ++j) {
                const int c = c0 + j * 32 + lane;
                v[j] = c < chunks ? load_stream(row + c) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int j = 0; j < kBatch; ++j) acc ^= v[j].x;
        }
    }
    if (acc == 0x12345678u) sink[0] = acc;
}

struct Shape {
    const char* name;
    int n, k;  // output rows, weights per row (Q4_K bytes: k / 256 * 144 per row)
};

struct Ctx {
    char* buf;
    size_t buf_bytes;
    unsigned* sink;
    int sms;
    double copy_gbps;
    cudaEvent_t e0, e1;
};

// Launch f(copy) once per copy of the matrix, `sweeps` times; the mean time per launch in microseconds.
template <class F>
double time_launches(Ctx& c, size_t mat_bytes, F f) {
    const int copies = int(c.buf_bytes / mat_bytes);
    for (int i = 0; i < copies; ++i) f(c.buf + size_t(i) * mat_bytes);  // warm-up sweep
    CHECK(cudaGetLastError());
    const int sweeps = std::max(1, 4096 / copies);
    CHECK(cudaEventRecord(c.e0));
    for (int s = 0; s < sweeps; ++s)
        for (int i = 0; i < copies; ++i) f(c.buf + size_t(i) * mat_bytes);
    CHECK(cudaEventRecord(c.e1));
    CHECK(cudaEventSynchronize(c.e1));
    CHECK(cudaGetLastError());
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, c.e0, c.e1));
    return 1000.0 * ms / (double(sweeps) * copies);
}

void report(const Ctx& c, const Shape& s, const std::string& pattern, double us, size_t bytes, int grid, int block) {
    const double gbps = bytes / us / 1e3;
    std::printf("{\"shape\": \"%s\", \"n\": %d, \"k\": %d, \"pattern\": \"%s\", \"grid\": %d, \"block\": %d, "
                "\"us\": %.2f, \"gbps\": %.1f, \"pct_copy\": %.1f}\n",
                s.name, s.n, s.k, pattern.c_str(), grid, block, us, gbps, 100.0 * gbps / c.copy_gbps);
    std::fflush(stdout);
}

template <int kStages, bool kTiled>
void run_tile(Ctx& c, const Shape& s, size_t bytes, int blocks_per_sm, bool persist, int work_cycles = 0) {
    const int tiles = s.n / kTileRows, upr = s.k / 256;
    if (upr % 4) return;
    auto kern = tile_kernel<kStages, kTiled>;
    // Cap the blocks per SM by asking for a share of the SM's shared memory (as registers cap the real kernel).
    int smem_sm = 0;
    CHECK(cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0));
    const int need = 4 * kStages * kTileRows * kUnitBytes;
    const int smem = std::max(need, smem_sm / blocks_per_sm - 2048);
    CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int fit = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kern, 128, smem));
    const int grid = persist ? std::min(tiles, fit * c.sms) : tiles;
    const double us = time_launches(c, bytes, [&](const char* m) {
        kern<<<grid, 128, smem>>>(m, tiles, upr, work_cycles, c.sink);
    });
    char name[96];
    std::snprintf(name, sizeof name, "tile/%s/stages%d/%dbps/%s/work%d", kTiled ? "tiled" : "rows", kStages, fit,
                  persist ? "persist" : "block-per-tile", work_cycles);
    report(c, s, name, us, bytes, grid, 128);
}

template <int kBatch>
void run_row(Ctx& c, const Shape& s, size_t bytes, int warps, int blocks_per_sm) {
    const int row_bytes = s.k / 256 * kUnitBytes;
    const int grid = std::min((s.n + warps - 1) / warps, blocks_per_sm * c.sms);
    const double us = time_launches(c, bytes, [&](const char* m) {
        row_kernel<kBatch><<<grid, warps * 32>>>(m, s.n, row_bytes, c.sink);
    });
    char name[96];
    std::snprintf(name, sizeof name, "row/batch%d/%dwarps/%dbps", kBatch, warps, blocks_per_sm);
    report(c, s, name, us, bytes, grid, warps * 32);
}

int main() {
    Ctx c{};
    CHECK(cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop{};
    CHECK(cudaGetDeviceProperties(&prop, 0));
    c.buf_bytes = size_t(2) << 30;
    CHECK(cudaMalloc(&c.buf, c.buf_bytes));
    CHECK(cudaMemset(c.buf, 1, c.buf_bytes));
    CHECK(cudaMalloc(&c.sink, 64));
    CHECK(cudaEventCreate(&c.e0));
    CHECK(cudaEventCreate(&c.e1));
    {  // the copy rate every figure is a share of: read + write of a 1 GiB device-to-device copy
        const size_t half = c.buf_bytes / 2;
        CHECK(cudaMemcpy(c.buf + half, c.buf, half, cudaMemcpyDeviceToDevice));
        CHECK(cudaEventRecord(c.e0));
        for (int i = 0; i < 5; ++i) CHECK(cudaMemcpyAsync(c.buf + half, c.buf, half, cudaMemcpyDeviceToDevice));
        CHECK(cudaEventRecord(c.e1));
        CHECK(cudaEventSynchronize(c.e1));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, c.e0, c.e1));
        c.copy_gbps = 2.0 * half * 5 / (ms * 1e6);
    }
    std::printf("{\"gpu\": \"%s\", \"sms\": %d, \"copy_gbps\": %.1f}\n", prop.name, c.sms, c.copy_gbps);
    const Shape shapes[] = {
        {"ffn_up 5120->17408", 17408, 5120},
        {"ffn_down 17408->5120", 5120, 17408},
        {"attn/ssm 6144->5120", 5120, 6144},
        {"in_proj 5120->10240", 10240, 5120},
        {"lm_head-size 5120->248320", 248320, 5120},
    };
    for (const Shape& s : shapes) {
        const size_t bytes = size_t(s.n) * (s.k / 256) * kUnitBytes;
        const int grid = 8 * c.sms;
        const double us = time_launches(c, bytes, [&](const char* m) {
            stream_kernel<<<grid, 256>>>(reinterpret_cast<const uint4*>(m), bytes / 16, c.sink);
        });
        report(c, s, "stream", us, bytes, grid, 256);
        run_tile<3, false>(c, s, bytes, 4, false);  // engine v1's decode GEMV's reads
        run_tile<3, false>(c, s, bytes, 4, false, 1000);  // ... with ~its unit's arithmetic time per warp
        run_tile<3, false>(c, s, bytes, 4, true, 1000);
        run_tile<6, false>(c, s, bytes, 4, true, 1000);
        run_tile<3, true>(c, s, bytes, 4, true, 1000);
        run_tile<3, false>(c, s, bytes, 4, false, 2000);
        run_tile<3, false>(c, s, bytes, 4, true, 2000);
        run_tile<6, false>(c, s, bytes, 4, true, 2000);
        run_tile<3, false>(c, s, bytes, 4, true);
        run_tile<6, false>(c, s, bytes, 4, true);
        run_tile<3, false>(c, s, bytes, 8, false);
        run_tile<3, false>(c, s, bytes, 8, true);
        run_tile<3, true>(c, s, bytes, 4, false);
        run_tile<3, true>(c, s, bytes, 4, true);
        run_tile<6, true>(c, s, bytes, 4, true);
        run_row<4>(c, s, bytes, 4, 8);
        run_row<8>(c, s, bytes, 4, 8);
        run_row<8>(c, s, bytes, 8, 4);
        run_row<4>(c, s, bytes, 8, 8);
    }
    return 0;
}
