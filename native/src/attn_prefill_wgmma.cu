// The flash prefill attention of attn_prefill.cu at its H200 default shape (F16 tiles, 128 query rows x 64 keys) on
// Hopper's warpgroup MMA (wgmma.cuh; sm_90a only) with OPENJET_ATTN_PREFILL_WGMMA=1 (the default, 2, is this kernel
// warp-specialised: attn_prefill_wgmma_ws.cu; 0: the mma.sync kernel). The same bits as the mma.sync kernel:
//   Block = 2 warpgroups x 64 rows of one q head; warp w holds rows 16 w .. 16 w + 15 as there, in the same
//   m16n8k16 fragments, and runs the same per-warp softmax and output (attn_prefill_rows.cuh).
//   S = Q K^T     a warpgroup's 64 rows x 64 keys: 16 wgmma m64n64k16, Q and K from shared memory, the k16 steps in
//                 increasing dim order: the mma.sync kernel's chain of 16 k-steps per output.
//   O += P V      64 rows x 256 dims: 4 wgmma m64n256k16, P from the softmax's registers (its fp16 pairs are the
//                 register A fragment), V from shared memory (MN-major), the keys' k16 steps in increasing order.
// Tiles are in wgmma's 128-byte swizzle (Sw128: one layout serves K-major Q and K and MN-major V), two K/V stages by
// cp.async. wgmma is warpgroup-collective, so a tile is skipped only when none of the warpgroup's 64 rows sees a key
// of it, where the mma.sync kernel skips per warp of 16; the extra tiles a warp then takes have every key masked:
// its maxima stay, alpha is exactly 1, the sums gain + 0 and P is 0, so O gains exact zeros (O never holds -0: it
// starts at +0 and a round-to-nearest sum of zeros is +0) and every bit stays.
#include <cuda_fp16.h>

#include <cstdint>

#include "attn_prefill_rows.cuh"
#include "attn_prefill_wgmma.cuh"
#include "device_attr.cuh"
#include "pdl.cuh"
#include "wgmma.cuh"

namespace openjet {
namespace {

using namespace prefill_rows;

constexpr int kRows = 128, kKeys = 64, kThreads = 256;
constexpr int kQBytes = kRows * D * 2, kTileBytes = tile_bytes<kKeys>();  // 64 KB, 32 KB
constexpr int kSmem = kQBytes + 2 * 2 * kTileBytes + 1024;                 // q, two [K | V] stages, the alignment

__global__ void __launch_bounds__(kThreads, 1) attn_prefill_wgmma_kernel(const AttnDecodeArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(16) char smem_raw[];
    const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
    char* q_s = smem_raw + ((1024u - (raw_addr & 1023u)) & 1023u);  // SW128 atoms start on 1,024-byte boundaries
    char* kv_s = q_s + kQBytes;                                      // stage s at kv_s + 2 s kTileBytes: [K | V]
    const uint32_t q_addr = static_cast<uint32_t>(__cvta_generic_to_shared(q_s));
    const auto [h, kv, q0, n_keys, n_tiles] = block_rows<kRows, kKeys>(a);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
    pdl_start();  // pdl.cuh: q comes from the prep kernel, the caches were written by it

    const int wg_row0 = q0 + 64 * (warp >> 2);          // the warpgroup's first row
    const int wrow0 = q0 + 16 * warp;                   // the warp's first row
    const int pos_lo = a.n_past + wrow0 + g, pos_hi = pos_lo + 8;  // positions of this lane's rows g, g + 8
    const uint32_t q_wg = q_addr + 64 * (warp >> 2) * 128;  // the warpgroup's rows in each 64-dim block of q
    // Tile j's K and V: stage j % 2, [K | V]. Whether tile j has a key for any row of the warpgroup (a prefix of the
    // tiles: the later ones see no key of it).
    const auto k_tile = [&](int j) { return kv_s + (j & 1) * 2 * kTileBytes; };
    const auto k_addr = [&](int j) { return q_addr + kQBytes + (j & 1) * 2 * kTileBytes; };
    const auto live = [&](int j) { return wg_row0 < a.t && j * kKeys <= a.n_past + wg_row0 + 63; };
    // S = Q K_j^T into s (zeroed), issued (attn_prefill_wgmma.cuh).
    const auto issue_s = [&](float (&s)[kKeys / 8][4], int j) { wgmma_issue_s<kRows, kKeys>(s, q_wg, k_addr(j)); };

    // The loads run a tile ahead of the products, K a tile ahead of V: while tile it's softmax runs, the tensor cores
    // already multiply S of tile it + 1 (its K landed with V of tile it).
    issue_f16_rows<kThreads, kKeys, Sw128<kKeys>>(a, a.k_cache, kv, 0, n_keys, k_tile(0));
    load_q<kRows, kThreads, Sw128<kRows>>(a, q0, h, q_s, tid);
    cp_async_commit();
    if (n_tiles > 1) issue_f16_rows<kThreads, kKeys, Sw128<kKeys>>(a, a.k_cache, kv, kKeys, n_keys, k_tile(1));
    issue_f16_rows<kThreads, kKeys, Sw128<kKeys>>(a, a.v_cache, kv, 0, n_keys, k_tile(0) + kTileBytes);
    cp_async_commit();
    cp_async_wait<1>();   // K of tile 0
    fence_proxy_async();  // this thread's q stores and copies, visible to wgmma's reads after the barrier
    __syncthreads();
    float o[D / 8][4] = {};
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    float s[kKeys / 8][4] = {};
    if (live(0)) {
        issue_s(s, 0);
        wgmma_wait<0>();
        fence_operands(s);
    }

    for (int it = 0; it < n_tiles; ++it) {
        cp_async_wait<0>();   // K of tile it + 1, V of tile it
        fence_proxy_async();
        __syncthreads();      // landed for every thread; every warpgroup is done with the buffers refilled below
        if (it + 2 < n_tiles)
            issue_f16_rows<kThreads, kKeys, Sw128<kKeys>>(a, a.k_cache, kv, (it + 2) * kKeys, n_keys, k_tile(it + 2));
        if (it + 1 < n_tiles)
            issue_f16_rows<kThreads, kKeys, Sw128<kKeys>>(a, a.v_cache, kv, (it + 1) * kKeys, n_keys,
                                                          k_tile(it + 1) + kTileBytes);
        cp_async_commit();
        if (!live(it)) continue;  // no key of this tile (nor of the later ones) for any row of the group

        float s_next[kKeys / 8][4] = {};
        const bool next = it + 1 < n_tiles && live(it + 1);
        if (next) issue_s(s_next, it + 1);

        uint32_t pa[kKeys / 16][4];  // then O += P V (attn_prefill_wgmma.cuh)
        softmax_to_p<kKeys>(s, o, m_run, l_run, it * kKeys, a.n_past + wrow0, tq, pos_lo, pos_hi, pa);
        wgmma_issue_pv<kKeys>(o, pa, k_addr(it) + kTileBytes);
        wgmma_wait<0>();  // S of tile it + 1 and O
        fence_operands(o);
        fence_operands(s_next);
        take_next<kKeys>(s, s_next);
    }
    store_rows(a, o, l_run, wrow0, h, g, tq);
#endif
}

}  // namespace

bool attn_prefill_wgmma_fits(int smem_bytes) {
#ifdef OPENJET_HAVE_SM90A
    int major = 0, minor = 0, optin = 0;
    return device_attribute(cudaDevAttrComputeCapabilityMajor, &major) == cudaSuccess &&
           device_attribute(cudaDevAttrComputeCapabilityMinor, &minor) == cudaSuccess && major == 9 && minor == 0 &&
           device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, &optin) == cudaSuccess && smem_bytes <= optin;
#else
    return false;
#endif
}

bool attn_prefill_wgmma_available() { return attn_prefill_wgmma_fits(kSmem); }

cudaError_t launch_attn_prefill_wgmma(const AttnDecodeArgs& a, cudaStream_t stream) {
    return launch_wgmma_rows<attn_prefill_wgmma_kernel, kRows, kThreads, kSmem>(a, stream);
}

}  // namespace openjet
