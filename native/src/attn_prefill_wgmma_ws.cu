// attn_prefill_wgmma.cu's kernel warp-specialised in the FlashAttention-3 manner (OPENJET_ATTN_PREFILL_WGMMA unset or
// 2, the default where it runs; sm_90a only; 4,096 rows of one 27B layer 1,091 -> 992 us, after 28,672 cached 10,299
// -> 9,049 us on the H200 at d988e58). The same rows, tiles, products and per-warp softmax, so the same bits; what
// changes is who loads and how the loads are waited for:
//   warpgroup 0    the producer: its 128 threads cp.async K and V tiles into separate rings (K 3 stages, V 2: K runs
//                  a tile further ahead, as S of the next tile is multiplied before this tile's P V), each copy's
//                  landing signalled on the stage's "full" mbarrier (cp.async.mbarrier.arrive.noinc), a stage
//                  refilled once its "empty" mbarrier says every consumer warp is done with it. 24 registers.
//   warpgroups 1-2 the consumers, 64 rows each: attn_prefill_wgmma.cu's loop, with a wait on the full barrier of the
//                  tile in place of the block's __syncthreads, an arrival on the empty barrier after the wgmma that
//                  read it. 240 registers (setmaxnreg; 128 x 24 + 256 x 240 = 64,512 of the SM's 65,536).
// A warpgroup no longer waits for the other at every tile, nor stops to issue loads. Protocol, tile j:
//   K: stage j % 3, full and empty phase j / 3; V: stage j % 2, phase j / 2. full counts the producer's 128 threads
//   (one noinc arrival each per tile), empty the 8 consumer warps (lane 0 of each, after its wgmma_wait<0>). The
//   producer waits for empty's phase j / S - 1 (parity (j / S & 1) ^ 1: the first S tiles pass at once), the
//   consumers for full's phase j / S. Every consumer warp releases every tile of the block, the ones its warpgroup
//   skips too (a suffix: their rows see none of their keys), and only once it has seen the tile's full phase: an
//   arrival before that would count towards the stage's previous phase and free it under the other warpgroup.
// Visibility: cp.async writes shared memory in the generic proxy, wgmma reads it through the async proxy. A consumer
// thread acquires the copies with its wait on the full barrier (the noinc arrival fires once they landed), then
// fence.proxy.async.shared::cta orders them before its wgmma's reads; the producer cannot fence after copies it does
// not wait for. The q tile the consumers store themselves: their fence, then a named barrier over the 256 of them.
// Not done (FA3's ping-pong): the two consumer warpgroups taking turns on the tensor cores, one's softmax under the
// other's products, would add two named barriers of 256 threads (ids 2, 3): consumer warpgroup w bar.syncs on 2 + w
// before issuing a tile's wgmmas and bar.arrives on 3 - w after them, warpgroup 1 arriving on 2 once at the start to
// let warpgroup 0 go first; a warpgroup that skips tiles (or has no row) must go on taking its turns without products,
// else the other waits for it forever.
#include <cuda_fp16.h>

#include <cstdint>

#include "attn_prefill_rows.cuh"
#include "attn_prefill_wgmma.cuh"
#include "mbarrier.cuh"
#include "pdl.cuh"
#include "wgmma.cuh"

namespace openjet {
namespace {

using namespace prefill_rows;

constexpr int kRows = 128, kKeys = 64, kConsumers = 256, kThreads = 128 + kConsumers;
constexpr int kKStages = 3, kVStages = 2, kProducerRegs = 24, kConsumerRegs = 240;
static_assert(128 * kProducerRegs + kConsumers * kConsumerRegs <= 65536, "the SM's register file");
constexpr int kQBytes = kRows * D * 2, kTileBytes = tile_bytes<kKeys>();  // 64 KB, 32 KB
constexpr int kKRing = kQBytes, kVRing = kKRing + kKStages * kTileBytes, kBars = kVRing + kVStages * kTileBytes;
constexpr int kSmem = kBars + 2 * (kKStages + kVStages) * 8 + 1024;  // q, the rings, the mbarriers, the alignment

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Rows key0 .. key0 + 63 of kv head kv of one F16 cache (rows >= n_keys: zeros) into the Sw128 tile at shared address
// dst by the producer's 128 threads, then this thread's arrival on full once its copies have landed.
__device__ __forceinline__ void produce_tile(const AttnDecodeArgs& a, const char* cache, int kv, int key0, int n_keys,
                                             uint32_t dst, uint32_t full) {
    constexpr int kPieces = KvF16::kRowBytes / 16;
    const char* base = cache + (static_cast<size_t>(kv) * a.capacity + key0) * KvF16::kRowBytes;
#pragma unroll 4
    for (int i = threadIdx.x; i < kKeys * kPieces; i += 128) {
        const int j = i / kPieces, c = i % kPieces;
        const bool in = key0 + j < n_keys;  // key0 < n_keys: row 0 is a valid source for the zeros
        cp_async16_zfill(dst + Sw128<kKeys>::at(j, c), base + (in ? j : 0) * KvF16::kRowBytes + 16 * c, in ? 16 : 0);
    }
    cp_async_mbar_arrive_noinc(full);
}
#endif

__global__ void __launch_bounds__(kThreads, 1) attn_prefill_wgmma_ws_kernel(const AttnDecodeArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(16) char smem_raw[];
    const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
    char* q_s = smem_raw + ((1024u - (raw_addr & 1023u)) & 1023u);  // SW128 atoms start on 1,024-byte boundaries
    const uint32_t q_addr = static_cast<uint32_t>(__cvta_generic_to_shared(q_s));
    const auto [h, kv, q0, n_keys, n_tiles] = block_rows<kRows, kKeys>(a);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
    // Tile j's stage in either ring and its barriers: full_k, empty_k, full_v, empty_v, one 8-byte mbarrier a stage.
    const auto k_addr = [&](int j) { return q_addr + kKRing + j % kKStages * kTileBytes; };
    const auto v_addr = [&](int j) { return q_addr + kVRing + j % kVStages * kTileBytes; };
    const uint32_t bars = q_addr + kBars;
    const auto full_k = [&](int j) { return bars + 8 * (j % kKStages); };
    const auto empty_k = [&](int j) { return bars + 8 * (kKStages + j % kKStages); };
    const auto full_v = [&](int j) { return bars + 8 * (2 * kKStages + j % kVStages); };
    const auto empty_v = [&](int j) { return bars + 8 * (2 * kKStages + kVStages + j % kVStages); };
    if (tid < kKStages) {
        mbar_init(full_k(tid), 128), mbar_init(empty_k(tid), kConsumers / 32);
        if (tid < kVStages) mbar_init(full_v(tid), 128), mbar_init(empty_v(tid), kConsumers / 32);
    }
    pdl_start();     // pdl.cuh: q comes from the prep kernel, the caches were written by it
    __syncthreads();  // the barriers initialised; the last block-wide barrier

    if (warp < 4) {  // the producer: K a tile ahead of V, in the order the consumers take them (K 0, K 1, V 0, K 2, ..)
        setmaxnreg_dec<kProducerRegs>();
        for (int j = -1; j < n_tiles; ++j) {
            if (j + 1 < n_tiles) {
                mbar_wait(empty_k(j + 1), ((j + 1) / kKStages & 1) ^ 1);
                produce_tile(a, a.k_cache, kv, (j + 1) * kKeys, n_keys, k_addr(j + 1), full_k(j + 1));
            }
            if (j >= 0) {
                mbar_wait(empty_v(j), (j / kVStages & 1) ^ 1);
                produce_tile(a, a.v_cache, kv, j * kKeys, n_keys, v_addr(j), full_v(j));
            }
        }
        asm volatile("cp.async.wait_all;\n" ::: "memory");  // no copy outlives its thread
        return;
    }

    setmaxnreg_inc<kConsumerRegs>();
    const int cw = warp - 4;                             // the consumer warp: rows 16 cw .. of the block
    const int wg_row0 = q0 + 64 * (cw >> 2);             // the warpgroup's first row
    const int wrow0 = q0 + 16 * cw;                      // the warp's first row
    const int pos_lo = a.n_past + wrow0 + g, pos_hi = pos_lo + 8;  // positions of this lane's rows g, g + 8
    const uint32_t q_wg = q_addr + 64 * (cw >> 2) * 128;  // the warpgroup's rows in each 64-dim block of q
    // Whether tile j has a key for any row of the warpgroup (a prefix of the tiles: the later ones see no key of it).
    const auto live = [&](int j) { return wg_row0 < a.t && j * kKeys <= a.n_past + wg_row0 + 63; };
    // Tile j's K (V) landed, and the copies ordered before this thread's wgmma reads of them (the file's opening).
    const auto k_ready = [&](int j) {
        mbar_wait(full_k(j), j / kKStages & 1);
        fence_proxy_async();
    };
    const auto v_ready = [&](int j) {
        mbar_wait(full_v(j), j / kVStages & 1);
        fence_proxy_async();
    };
    // S = Q K_j^T into s (zeroed), issued (attn_prefill_wgmma.cuh).
    const auto issue_s = [&](float (&s)[kKeys / 8][4], int j) { wgmma_issue_s<kRows, kKeys>(s, q_wg, k_addr(j)); };

    load_q<kRows, kConsumers, Sw128<kRows>>(a, q0, h, q_s, tid - 128);
    fence_proxy_async();             // this thread's q stores, visible to wgmma's reads after the barrier
    named_bar_sync(1, kConsumers);  // the consumers' q stored
    float o[D / 8][4] = {};
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    float s[kKeys / 8][4] = {};
    if (live(0)) {
        k_ready(0);
        issue_s(s, 0);
        wgmma_wait<0>();
        fence_operands(s);
        if (lane == 0) mbar_arrive(empty_k(0));
    }

    int it = 0;
    for (; it < n_tiles && live(it); ++it) {
        float s_next[kKeys / 8][4] = {};
        const bool next = it + 1 < n_tiles && live(it + 1);
        if (next) {
            k_ready(it + 1);
            issue_s(s_next, it + 1);
        }

        uint32_t pa[kKeys / 16][4];  // then O += P V (attn_prefill_wgmma.cuh)
        softmax_to_p<kKeys>(s, o, m_run, l_run, it * kKeys, a.n_past + wrow0, tq, pos_lo, pos_hi, pa);
        v_ready(it);
        wgmma_issue_pv<kKeys>(o, pa, v_addr(it));
        wgmma_wait<0>();  // S of tile it + 1 and O: this warp is done with K of it + 1 and V of it
        fence_operands(o);
        fence_operands(s_next);
        if (lane == 0) {
            mbar_arrive(empty_v(it));
            if (next) mbar_arrive(empty_k(it + 1));
        }
        take_next<kKeys>(s, s_next);
    }
    store_rows(a, o, l_run, wrow0, h, g, tq);
    // The tiles no row of the warpgroup sees (it .. n_tiles - 1: the last one for the first warpgroup, or all of them
    // for one with no row before t), neither K nor V read: released once landed.
    if (lane == 0) {
        for (int j = it; j < n_tiles; ++j) {
            mbar_wait(full_k(j), j / kKStages & 1);
            mbar_arrive(empty_k(j));
            mbar_wait(full_v(j), j / kVStages & 1);
            mbar_arrive(empty_v(j));
        }
    }
#endif
}

}  // namespace

bool attn_prefill_wgmma_ws_available() { return attn_prefill_wgmma_fits(kSmem); }

cudaError_t launch_attn_prefill_wgmma_ws(const AttnDecodeArgs& a, cudaStream_t stream) {
    return launch_wgmma_rows<attn_prefill_wgmma_ws_kernel, kRows, kThreads, kSmem>(a, stream);
}

}  // namespace openjet
