// launch_attn_decode: the three standalone kernels of attn_decode.cuh (prep, chunks, combine).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "attn_decode.cuh"
#include "device_attr.cuh"
#include "grid_sync.cuh"  // publish_phase_max, take_phase_max
#include "launch_count.h"
#include "pdl.cuh"

namespace openjet {
namespace {

// Block (x, y): row y, head first + x of attn_prep_row's numbering (q heads, then kv heads).
template <class Fmt>
__global__ void __launch_bounds__(kAttnThreads) attn_prep_kernel(const AttnDecodeArgs a, int first) {
    pdl_start();  // pdl.cuh
    attn_prep_row<Fmt>(a, blockIdx.y, first + blockIdx.x);
}

// Block t: every head of row t (a prefill call's rows; attn_prep_rows).
template <class Fmt>
__global__ void __launch_bounds__(kAttnThreads) attn_prep_rows_kernel(const AttnDecodeArgs a) {
    pdl_start();  // pdl.cuh
    attn_prep_heads_of_row<Fmt>(a, blockIdx.x);
}

// Blocks of up to 48 rows (decode and verify steps) are cut to 128 registers so that two fit an SM: a step
// launches ~2 chunk blocks per SM (the spread), in one wave. (Uncut, 48 rows took 145 registers: one block per
// SM, two waves at T = 6..8; sm_90 ptxas: now 126-128, no spills; 64 rows keep 148-165 for prefill.)
template <class Fmt, int MAXR, bool kHiOnly, bool kPlanned = false>
__global__ void __launch_bounds__(kAttnThreads, MAXR <= 48 ? 2 : 1)
attn_chunk_kernel(const AttnDecodeArgs a, int chunk_keys) {
    extern __shared__ __align__(16) char smem[];
    pdl_start();  // pdl.cuh
    attn_chunk<Fmt, MAXR, kHiOnly, kPlanned>(a, chunk_keys, blockIdx.x, blockIdx.y, blockIdx.z * MAXR, smem,
                                             a.stages);
}

__global__ void __launch_bounds__(kAttnThreads) attn_combine_kernel(const AttnDecodeArgs a, int chunk_keys) {
    pdl_start();  // pdl.cuh
    attn_combine_row(a, chunk_keys, blockIdx.y, blockIdx.x);
}

// The combine with its own pack (AttnDecodeArgs::pack_sync): block (h, t) combines head h of row t, then the row's
// heads meet through AttnPackSync (each publishes its max |o| with its phase in one word; thread i takes head i's
// word once it is this launch's) and warp w packs 32-block 8 h + w of the row (lane = element) under the row's max,
// head 0 writing the row's 1 / s: the max is exact in any order and the rest is pack_block, so the pack has
// launch_pack_act's bits (gdn_decode.cu gdn_pack_own_rows, the GDN step's own pack, meets the same way).
__global__ void __launch_bounds__(kAttnThreads) attn_combine_pack_kernel(const AttnDecodeArgs a, int chunk_keys) {
    __shared__ unsigned phase_s, row_max_s;
    __shared__ float warp_max[kAttnThreads / 32];
    static_assert(kAttnHeadDim == kAttnThreads && kAttnThreads / 32 == kAttnHeadDim / kActBlock,
                  "a thread an element, a warp a 32-block");
    pdl_start();  // pdl.cuh
    const int h = blockIdx.x, t = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    auto* sync = reinterpret_cast<AttnPackSync*>(a.pack_sync);
    if (threadIdx.x == 0) phase_s = __ldcg(&sync->phase_of[t][h]) + 1u, row_max_s = 0u;  // (read past the barriers)
    const float o = attn_combine_row(a, chunk_keys, t, h);
    float m = fabsf(o);
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if (lane == 0) warp_max[warp] = m;
    __syncthreads();
    const unsigned phase = phase_s;
    if (threadIdx.x == 0) {
        float block_max = 0.0f;
#pragma unroll
        for (int w = 0; w < kAttnThreads / 32; ++w) block_max = fmaxf(block_max, warp_max[w]);
        publish_phase_max(&sync->row_word[t][h], phase, block_max);
        sync->phase_of[t][h] = phase;  // (read by this block's next launch only)
    }
    if (static_cast<int>(threadIdx.x) < a.n_head) take_phase_max(&sync->row_word[t][threadIdx.x], phase, &row_max_s);
    __syncthreads();
    const ActRow r = act_row(a.pack_out, t, a.n_head * kAttnHeadDim, __uint_as_float(row_max_s));
    pack_block(o, r.s, h * (kAttnHeadDim / kActBlock) + warp, r.h, r.sum);
    if (h == 0 && threadIdx.x == 0) a.pack_out.inv[t] = r.inv;
}

// The most rows a chunk block takes on this device: the largest instantiation whose shared memory fits the
// device's per-block limit (OPENJET_ATTN_SMEM_LIMIT=bytes lowers it: tests run the split on an H200).
int attn_rows_per_block_max(int smem_stride) {
    int optin = 0;
    if (device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, &optin) != cudaSuccess)
        return kAttnMaxRows;  // the launch reports the error
    if (const char* lim = std::getenv("OPENJET_ATTN_SMEM_LIMIT")) optin = std::min(optin, std::atoi(lim));
    for (const int r : {64, 48, 32, 16})
        if (attn_chunk_smem_bytes(r, smem_stride) <= static_cast<size_t>(optin)) return r;
    return 8;
}

int device_sm_count() {
    int sms = 0;
    return device_attribute(cudaDevAttrMultiProcessorCount, &sms) == cudaSuccess ? sms : 0;
}

// The planned form's stages for blocks of MAXR rows (AttnDecodeArgs::stages: 2..kAttnMaxStages where a block may have
// their shared memory, else 0; 0 asked: the most whose shared memory keeps as many chunk blocks on an SM as two stages
// do, by the occupancy API: on the H200 with a Q8_0 cache 4 stages for up to 16 rows, 3 for 32, 2 for 48; F16 2, 2,
// 4, 4 (one block an SM at 32 and 48 rows either way); on the 100 KB SMs of sm_86/89/120 one block an SM at any
// depth). The kernel is opted in once for its deepest ring that fits (a launch may use less); 0: the two-stage form
// runs instead.
template <class Fmt, int MAXR>
int planned_stages(int asked) {
    static constexpr auto kernel = attn_chunk_kernel<Fmt, MAXR, false, true>;
    const auto smem = [](int s) { return attn_chunk_smem_bytes(MAXR, Fmt::kSmemStride, s); };
    static const int deepest = [&] {
        int optin = 0;
        if (device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, &optin) != cudaSuccess) return 0;
        for (int s = kAttnMaxStages; s >= 2; --s) {
            if (smem(s) > static_cast<size_t>(optin)) continue;
            if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem(s))) == cudaSuccess)
                return s;
            cudaGetLastError();  // not sticky
            return 0;
        }
        return 0;
    }();
    static const int keeping = [&] {  // the auto choice
        const auto blocks = [&](int s) {
            int n = 0;
            if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kAttnThreads, smem(s)) != cudaSuccess) {
                cudaGetLastError();
                n = 0;
            }
            return n;
        };
        const int base = deepest ? blocks(2) : 0;
        for (int s = deepest; s >= 2 && base > 0; --s)
            if (blocks(s) >= base) return s;
        return 0;
    }();
    return asked == 0 ? keeping : asked <= deepest ? asked : 0;
}

template <class Fmt, int MAXR, bool kHiOnly>
cudaError_t launch_chunks_numerics(const AttnDecodeArgs& a, int chunk_keys, int n_chunks, cudaStream_t stream) {
    constexpr size_t smem = attn_chunk_smem_bytes(MAXR, Fmt::kSmemStride);
    static bool opted_in = false;  // per instantiation; raising the limit twice is harmless
    if (!opted_in) {
        const cudaError_t e = cudaFuncSetAttribute(attn_chunk_kernel<Fmt, MAXR, kHiOnly>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
        if (e != cudaSuccess) return e;
        opted_in = true;
    }
    const int rows = a.n_head / a.n_kv * a.t;  // blockIdx.z: rows in blocks of MAXR (when rows > MAXR)
    return launch_kernel(attn_chunk_kernel<Fmt, MAXR, kHiOnly>, dim3(n_chunks, a.n_kv, (rows + MAXR - 1) / MAXR),
                         kAttnThreads, smem, stream, a, chunk_keys);
}

// The planned form (a.pipe 1: attn_chunk's kPlanned; Q8_0 rows as KvQ8_0Wide) for blocks of MAXR <= 48 rows: false
// where it cannot run (no depth fits, or a cache not 16-byte aligned), and the two-stage form runs (the same bits).
template <class Fmt, int MAXR>
bool launch_chunks_planned(const AttnDecodeArgs& a_in, int chunk_keys, int n_chunks, cudaStream_t stream,
                           cudaError_t* err) {
    using Wide = std::conditional_t<Fmt::kType == kKvQ8_0, KvQ8_0Wide, Fmt>;
    if constexpr (MAXR > 48) {
        return false;
    } else {
        if (a_in.pipe != 1 || a_in.hi_only || a_in.stages < 0 || a_in.stages == 1 || a_in.stages > kAttnMaxStages ||
            (reinterpret_cast<uintptr_t>(a_in.k_cache) | reinterpret_cast<uintptr_t>(a_in.v_cache)) % 16)
            return false;
        const int stages = planned_stages<Wide, MAXR>(a_in.stages);
        if (!stages) return false;
        AttnDecodeArgs a = a_in;
        a.stages = stages;
        count_launch(Counted::kAttnPlanned);
        const int rows = a.n_head / a.n_kv * a.t;
        *err = launch_kernel(attn_chunk_kernel<Wide, MAXR, false, true>,
                             dim3(n_chunks, a.n_kv, (rows + MAXR - 1) / MAXR), kAttnThreads,
                             attn_chunk_smem_bytes(MAXR, Wide::kSmemStride, stages), stream, a, chunk_keys);
        return true;
    }
}

// The chunk blocks of MAXR rows, with decode's numerics or (a.hi_only, prefill calls only: their rows are > 8
// or flagged, never a decode step's) single fp16 operands; a.pipe 1: the planned form where it runs.
template <class Fmt, int MAXR>
cudaError_t launch_chunks(const AttnDecodeArgs& a, int chunk_keys, int n_chunks, cudaStream_t stream) {
    cudaError_t err = cudaSuccess;
    if (launch_chunks_planned<Fmt, MAXR>(a, chunk_keys, n_chunks, stream, &err)) return err;
    if (a.hi_only) return launch_chunks_numerics<Fmt, MAXR, true>(a, chunk_keys, n_chunks, stream);
    return launch_chunks_numerics<Fmt, MAXR, false>(a, chunk_keys, n_chunks, stream);
}

// Whether the combine can pack o itself (AttnDecodeArgs::pack_sync): a decode or verify step's rows, a pack that
// holds them, and every combine block resident at once (its blocks wait for each other).
bool combine_packs(const AttnDecodeArgs& a) {
    if (!a.pack_sync || a.t > kAttnMaxT || a.n_head > kAttnPackMaxHeads || !a.pack_out.h || !a.pack_out.sum ||
        !a.pack_out.inv || a.pack_out.rows < a.t || !act_pack_plain(a.pack_out) ||
        (a.n_head * kAttnHeadDim) % kActUnit)
        return false;
    return resident_per_sm<attn_combine_pack_kernel, kAttnThreads, 0>() * device_sm_count() >= a.n_head * a.t;
}

template <class Fmt>
cudaError_t launch_fmt(const AttnDecodeArgs& a, int chunk_keys, int n_chunks, cudaStream_t stream,
                       bool* packed) {
    cudaError_t e = launch_attn_prep(a, stream);
    if (e != cudaSuccess) return e;
    // Rows per block (instantiations for the 27B's T = 1, 2, 4, 8): all of the kv head's group x T where the
    // block's shared memory fits the device, else blocks of fewer rows (the 100 KB SMs of sm_86/89/120 hold 16
    // rows with an F16 cache: 94 KB; 32 with Q8_0: 88 KB), as even as the instantiations allow (a prefill call's
    // 96 rows: two blocks of 48, which fit two per SM, rather than 64 + 32; rows keep their bits in any split).
    const int total = a.n_head / a.n_kv * a.t, cap = attn_rows_per_block_max(Fmt::kSmemStride);
    const int n_blocks = (total + cap - 1) / cap, rows = (total + n_blocks - 1) / n_blocks;
    if (rows <= 8) e = launch_chunks<Fmt, 8>(a, chunk_keys, n_chunks, stream);
    else if (rows <= 16) e = launch_chunks<Fmt, 16>(a, chunk_keys, n_chunks, stream);
    else if (rows <= 32) e = launch_chunks<Fmt, 32>(a, chunk_keys, n_chunks, stream);
    else if (rows <= 48) e = launch_chunks<Fmt, 48>(a, chunk_keys, n_chunks, stream);
    else e = launch_chunks<Fmt, 64>(a, chunk_keys, n_chunks, stream);
    if (e != cudaSuccess) return e;
    if (packed && combine_packs(a)) {
        count_launch(Counted::kAttnOwnPack);
        *packed = true;
        return launch_kernel(attn_combine_pack_kernel, dim3(a.n_head, a.t), kAttnThreads, 0, stream, a, chunk_keys);
    }
    return launch_kernel(attn_combine_kernel, dim3(a.n_head, a.t), kAttnThreads, 0, stream, a, chunk_keys);
}

}  // namespace

cudaError_t attn_decode_split(int n_past, int n_kv, int t, int* chunk_keys, int* n_chunks, int* sm_count) {
    if (n_past < 0 || n_kv < 1 || t < 1 || t > kAttnMaxCallT) return cudaErrorInvalidValue;
    const int sms = device_sm_count();
    if (sms < 1) return cudaErrorNoDevice;
    const int ck = attn_chunk_keys(n_past, n_kv, sms);
    if (chunk_keys) *chunk_keys = ck;
    if (n_chunks) *n_chunks = attn_n_chunks(n_past, t, ck);
    if (sm_count) *sm_count = sms;
    return cudaSuccess;
}

void attn_pipe_switch(int* pipe, int* stages) {
    const char* p = std::getenv("OPENJET_ATTN_PIPE");
    const char* s = std::getenv("OPENJET_ATTN_STAGES");
    *pipe = p && std::strcmp(p, "0") == 0 ? 0 : 1;  // the default since 2026-12-05 (H100: 32K T=1 10.65 -> 10.40 ms)
    *stages = s && s[0] >= '2' && s[0] <= '0' + kAttnMaxStages && !s[1] ? s[0] - '0' : 0;
}

// OPENJET_ATTN_PREP_ROWS (read at each call): unset or 1, a call of more than a decode step's rows preps a row a
// block (attn_prep_heads_of_row: the same bits); 0, a block per (row, head) as a decode step.
bool attn_prep_rows(int t) {
    if (t <= kAttnMaxT) return false;
    const char* v = std::getenv("OPENJET_ATTN_PREP_ROWS");
    return !(v && std::strcmp(v, "0") == 0);
}

cudaError_t launch_attn_prep(const AttnDecodeArgs& a, cudaStream_t stream) {
    if (attn_prep_rows(a.t)) {
        count_launch(Counted::kAttnPrepRows);
        if (a.kv_type == kKvF16) return launch_kernel(attn_prep_rows_kernel<KvF16>, a.t, kAttnThreads, 0, stream, a);
        if (a.kv_type == kKvQ8_0)
            return launch_kernel(attn_prep_rows_kernel<KvQ8_0>, a.t, kAttnThreads, 0, stream, a);
        return cudaErrorInvalidValue;
    }
    const dim3 grid(a.n_head + a.n_kv, a.t);
    if (a.kv_type == kKvF16) return launch_kernel(attn_prep_kernel<KvF16>, grid, kAttnThreads, 0, stream, a, 0);
    if (a.kv_type == kKvQ8_0) return launch_kernel(attn_prep_kernel<KvQ8_0>, grid, kAttnThreads, 0, stream, a, 0);
    return cudaErrorInvalidValue;
}

cudaError_t launch_attn_store_kv(const AttnDecodeArgs& a, cudaStream_t stream) {
    if (a.n_head < 1 || a.n_kv < 1 || a.t < 1 || a.t > 65535 || a.n_past < 0 || a.capacity < a.n_past + a.t ||
        a.n_rot < 2 || a.n_rot % 2 || a.n_rot > kAttnHeadDim || !a.k || !a.v || !a.k_norm || !a.k_cache || !a.v_cache)
        return cudaErrorInvalidValue;
    const dim3 grid(a.n_kv, a.t);  // the prep kernel's kv blocks alone
    if (a.kv_type == kKvF16)
        return launch_kernel(attn_prep_kernel<KvF16>, grid, kAttnThreads, 0, stream, a, a.n_head);
    if (a.kv_type == kKvQ8_0)
        return launch_kernel(attn_prep_kernel<KvQ8_0>, grid, kAttnThreads, 0, stream, a, a.n_head);
    return cudaErrorInvalidValue;
}

cudaError_t launch_attn_decode(const AttnDecodeArgs& a, cudaStream_t stream) {
    return launch_attn_decode_packed(a, stream, nullptr);
}

cudaError_t launch_attn_decode_packed(const AttnDecodeArgs& a_in, cudaStream_t stream, bool* packed) {
    if (packed) *packed = false;
    AttnDecodeArgs a = a_in;
    if (a.n_head < 1 || a.n_kv < 1 || a.n_head % a.n_kv || a.t < 1 || a.t > kAttnMaxCallT ||
        a.n_head / a.n_kv > kAttnMaxRows || a.n_past < 0 || a.capacity < a.n_past + a.t || a.n_rot < 2 ||
        a.n_rot % 2 || a.n_rot > kAttnHeadDim || !a.qproj || !a.k || !a.v || !a.q_norm || !a.k_norm ||
        !a.k_cache || !a.v_cache || !a.o || !a.work)
        return cudaErrorInvalidValue;
    if (a.sm_count <= 0) a.sm_count = device_sm_count();
    if (a.sm_count <= 0) return cudaErrorNoDevice;
    const int chunk_keys = attn_chunk_keys(a.n_past, a.n_kv, a.sm_count);
    // With a.pos (a graph's launch), chunks for the longest length of this chunk size: the rest return at once.
    const int longest = a.pos ? std::min(attn_chunk_keys_last(chunk_keys, a.n_kv, a.sm_count), a.capacity - a.t)
                              : a.n_past;
    const int n_chunks = attn_n_chunks(longest, a.t, chunk_keys);
    if (a.kv_type == kKvF16) return launch_fmt<KvF16>(a, chunk_keys, n_chunks, stream, packed);
    if (a.kv_type == kKvQ8_0) return launch_fmt<KvQ8_0>(a, chunk_keys, n_chunks, stream, packed);
    return cudaErrorInvalidValue;
}

}  // namespace openjet
