// launch_gdn_step: the standalone launch of gdn_step_head (gdn_decode.cuh), one block per value head, or per
// kGdnSplitCols columns of one (the column split) followed by the gated RMSNorm's launch, or (opt-in) the chunked
// form of gdn_chunk.cuh followed by the same launch.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "act_pack.cuh"
#include "device_attr.cuh"
#include "gdn_chunk.cuh"
#include "gdn_decode.cuh"
#include "grid_sync.cuh"  // publish_phase_max, take_phase_max
#include "launch_count.h"
#include "pdl.cuh"

namespace openjet {
namespace {

// What the own pack keeps in shared memory: the rows' maxima as they meet, and the launch's phase, which
// gdn_pack_own_begin loads at the kernel's start so that its L2 round trip is not in the chain at the end.
struct GdnPackShared {
    unsigned row_max[kGdnMaxT];
    unsigned phase;
};

// Before the step (after the PDL wait): thread 0 reads this block's phase (its launches so far; only this block
// writes it, and every launch runs every block once, so all blocks count alike), the row maxima start at 0. Both are
// first read after the step's barriers.
__device__ __forceinline__ void gdn_pack_own_begin(const GdnStepArgs& a, int h, GdnPackShared& ps) {
    if (threadIdx.x == 0) ps.phase = __ldcg(&reinterpret_cast<const GdnPackSync*>(a.pack_sync)->phase_of[h]) + 1u;
    if (threadIdx.x < kGdnMaxT) ps.row_max[threadIdx.x] = 0u;
}

// The step's own pack of its y rows (GdnStepArgs::pack_out), after gdn_step_head wrote them: warp r takes its head's
// 128 values of row r (lane = element of each of the head's four 32-blocks, as pack_block wants); the heads' maxima
// meet through GdnPackSync (each block writes its max of each row with its phase in one word; a thread a word waits
// for it and brings its max into the block's shared max), and each warp packs its four 32-blocks under
// the row's max; head 0 writes the row's 1 / s. The max is exact in any order and the rest is pack_cluster_kernel's
// pack_block, so the pack has launch_pack_act's bits. Every block of the launch must be resident at once
// (launch_gdn_step checks). (Earlier forms: an atomic max and a shared arrival counter, 96 atomics on two words, at
// parity with the pack launch on the H100, trace_step at 2307356; the maxima stored, then a fenced release of the
// phase word and a load of the maxima after the spin, ~0.8 us a layer slower, NOTES_gemv.md forty-fifth session.)
// kStaged (GdnStepArgs::staged): y from sm.o where the call replays no rows (gdn_step_head<128, true> left its rows
// there, one sub-step: the own pack takes at most kGdnMaxT), else from global memory.
template <bool kStaged, bool kProbe = false>
__device__ __forceinline__ void gdn_pack_own_rows(const GdnStepArgs& a, int h, const GdnSmem& sm, GdnPackShared& ps) {
    auto* sync = reinterpret_cast<GdnPackSync*>(a.pack_sync);
    unsigned* const row_max = ps.row_max;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, k = a.n_v * kGdnHeadDim;
    __syncthreads();  // the block's y rows are written (step 4 of its last sub-step)
    const unsigned phase = ps.phase;
    float v[4] = {};
    if (warp < a.t) {
        const float* yr = kStaged && !a.replay ? sm.o[warp] : a.y + (size_t)warp * k + (size_t)h * kGdnHeadDim;
        float m = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            v[i] = yr[lane + 32 * i];
            m = fmaxf(m, fabsf(v[i]));
        }
#pragma unroll
        for (int o = 16; o >= 1; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (lane == 0) publish_phase_max(&sync->row_word[h][warp], phase, m);
    }
    gdn_mark<kProbe>(a.probe, kProbePublished);
    if (threadIdx.x == 0) sync->phase_of[h] = phase;  // (read by this block's next launch only)
    // Thread i: block i % blocks's word of row i / blocks, once it is this launch's (a block that never came: fail,
    // not hang); one thread a word, so the rows' round trips run side by side (blocks * t <= 64 * 8 threads).
    static_assert(kGdnPackMaxBlocks * kGdnMaxT <= kGdnThreads, "a thread for every word");
    const int blocks = static_cast<int>(gridDim.x);
    if (static_cast<int>(threadIdx.x) < blocks * a.t) {
        const int b = static_cast<int>(threadIdx.x) % blocks, r = static_cast<int>(threadIdx.x) / blocks;
        take_phase_max(&sync->row_word[b][r], phase, &row_max[r]);
    }
    __syncthreads();
    gdn_mark<kProbe>(a.probe, kProbeMet);
    if (warp < a.t) {
        const ActRow r = act_row(a.pack_out, warp, k, __uint_as_float(row_max[warp]));
#pragma unroll
        for (int i = 0; i < 4; ++i) pack_block(v[i], r.s, h * 4 + i, r.h, r.sum);
        if (h == 0 && lane == 0) a.pack_out.inv[warp] = r.inv;
    }
}

// The column split's blocks at 2 per SM at least (128 registers: sm_120 took 164, one block per SM, so 192 blocks
// would run in two waves on 170 SMs). kOwnPack (whole heads only): the step packs its own output (gdn_pack_own_rows),
// a kernel of its own so that the default one's code stays as it was. kStaged (whole heads only): GdnStepArgs::staged.
// kProbe (the own pack's staged form only): GdnStepArgs::probe. kLateLaunch (the own pack's staged form only;
// GdnStepArgs::late_launch): gdn_step_head's.
template <int kCols, bool kOwnPack = false, bool kStaged = false, bool kProbe = false, bool kLateLaunch = false>
__global__ void __launch_bounds__(kGdnRowGroups * kCols, kCols == kGdnHeadDim ? 1 : 2)
gdn_step_kernel(const GdnStepArgs a) {
    static_assert(!kOwnPack || kCols == kGdnHeadDim, "the own pack takes whole heads");
    static_assert(!kProbe || (kOwnPack && kStaged), "the probe takes the default form");
    __shared__ GdnSmem sm;
    constexpr int kSplits = kGdnHeadDim / kCols;
    const int h = blockIdx.x / kSplits, c0 = blockIdx.x % kSplits * kCols;
    if constexpr (kProbe) {
        if (threadIdx.x == 0) {
            a.probe->ns[blockIdx.x][0] = global_ns();
            unsigned smid;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
            a.probe->sm[blockIdx.x] = smid;
        }
    }
    gdn_mark<kProbe>(a.probe, kProbeEntry);
    gdn_prefetch_inputs<kCols>(a, h, c0);  // (hints only, so before the wait: the loads stay after it)
    if constexpr (kStaged) gdn_stage_params(a, h, sm);  // (weights' copies and hints: before the wait too)
    pdl_start_late<kLateLaunch>();  // pdl.cuh (late: the kernels after let in by gdn_step_head)
    gdn_mark<kProbe>(a.probe, kProbeWaited);
    __shared__ GdnPackShared ps;  // (the own pack's; other forms leave it unused)
    if constexpr (kOwnPack) gdn_pack_own_begin(a, h, ps);
    gdn_step_head<kCols, kStaged, kProbe, kLateLaunch>(a, h, sm, c0);
    if constexpr (kOwnPack) gdn_pack_own_rows<kStaged, kProbe>(a, h, sm, ps);
    if constexpr (kProbe) {
        gdn_mark<kProbe>(a.probe, kProbeEnd);
        if (threadIdx.x == 0) a.probe->ns[blockIdx.x][1] = global_ns();
    }
}

// OPENJET_BENCH_GDN_PROBE's record (GdnProbe), one for the process: the last probed launch's.
__device__ GdnProbe g_gdn_probe;

// The own pack's whole-head kernel, staged or not (GdnStepArgs::staged), probed where asked (staged only), the late
// launch's form where asked (GdnStepArgs::late_launch; staged only).
using GdnKernel = void (*)(GdnStepArgs);
GdnKernel own_pack_kernel(bool staged, bool probe, bool late) {
    if (!staged) return gdn_step_kernel<kGdnHeadDim, true>;
    if (late)
        return probe ? gdn_step_kernel<kGdnHeadDim, true, true, true, true>
                     : gdn_step_kernel<kGdnHeadDim, true, true, false, true>;
    return probe ? gdn_step_kernel<kGdnHeadDim, true, true, true> : gdn_step_kernel<kGdnHeadDim, true, true>;
}

constexpr int kNormThreads = 256;

// The column split's second launch: y = gated RMSNorm of the o rows the step wrote to y, in place; one warp per
// (token, head), the operations of gdn_step_head's step 4.
__global__ void __launch_bounds__(kNormThreads) gdn_gated_norm_kernel(const GdnStepArgs a) {
    pdl_start();
    const int w = static_cast<int>((blockIdx.x * kNormThreads + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (w >= a.t * a.n_v) return;  // whole warps
    const int tok = w / a.n_v, h = w % a.n_v;
    const size_t row = (size_t)tok * a.n_v * kGdnHeadDim + (size_t)h * kGdnHeadDim;
    const float* z = a.z + row;
    gdn_gated_norm_row(a.y + row, [&](int c) { return a.norm_w[c]; }, [&](int c) { return z[c]; }, a.eps, lane,
                       a.y + row);
}

// A prefill's gated RMSNorm and the out projection's pack in one pass (launch_gdn_step's pack): a block per token row.
// Its threads copy the row's o into shared memory in one coalesced sweep, its warps take the heads' 1 / rms from
// there (gdn_inv_rms, as gdn_gated_norm_row), then pack_act_row packs the gated values (gdn_gated) as launch_pack_act
// packs y: the same values, the same pack, so the same bits, without writing y and reading it back. (Its first form
// read each head's o from global memory warp by warp, six heads a warp one after the other: ~185 us a 4,096-row call
// of the 27B on the H200 by the profile, slower than the two kernels' ~167.)
constexpr int kMaxNormPackHeads = 64;  // the row in shared memory: n_v * 128 floats, at most 32 KB
template <int kThreads, int kCached>
__global__ void __launch_bounds__(kThreads) gdn_gated_norm_pack_kernel(const GdnStepArgs a, ActPack p) {
    __shared__ float inv_rms[kMaxNormPackHeads];
    extern __shared__ __align__(16) float o_row[];  // [n_v * 128]
    pdl_start();
    const int tok = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, k = a.n_v * kGdnHeadDim;
    const size_t row = static_cast<size_t>(tok) * k;
    const float *o = a.y + row, *z = a.z + row;
#pragma unroll 4
    for (int i = threadIdx.x * 4; i < k; i += kThreads * 4)  // k % 128 == 0: whole float4s
        *reinterpret_cast<float4*>(o_row + i) = *reinterpret_cast<const float4*>(o + i);
    __syncthreads();
    for (int h = warp; h < a.n_v; h += kThreads / 32) {
        const float r = gdn_inv_rms(o_row + h * kGdnHeadDim, a.eps, lane);
        if (lane == 0) inv_rms[h] = r;
    }
    __syncthreads();
    pack_act_row<kThreads, kCached>(
        [&](int i) { return gdn_gated(o_row[i], inv_rms[i / kGdnHeadDim], a.norm_w[i % kGdnHeadDim], z[i]); }, k, p,
        tok);
}

// A prefill's gated RMSNorm packed under given row scales (launch_gdn_step's pack_scales), a warp a (token, head):
// the head's 128 values (gdn_gated_norm_row's, the same operations) as four 32-blocks of the pack (pack_blocks4:
// fp16(v s) in the pack's element order, the blocks' sums), with neither y written nor a pass for the row's maximum;
// the warp of head 0 writes the row's 1 / s.
__global__ void __launch_bounds__(kNormThreads)
    gdn_gated_pack_bounded_kernel(const GdnStepArgs a, ActPack p, const float* __restrict__ scales) {
    pdl_start();
    const int w = static_cast<int>((blockIdx.x * kNormThreads + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (w >= a.t * a.n_v) return;  // whole warps
    const int tok = w / a.n_v, h = w % a.n_v, k = a.n_v * kGdnHeadDim;
    const size_t row = static_cast<size_t>(tok) * k + static_cast<size_t>(h) * kGdnHeadDim;
    const float *o = a.y + row, *z = a.z + row;
    const float r = gdn_inv_rms(o, a.eps, lane);
    static_assert(kGdnHeadDim == 4 * kActBlock, "a head is four 32-blocks of the pack");
    float v[4];
    int b4[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const int c = kActBlock * q + lane;
        v[q] = gdn_gated(o[c], r, a.norm_w[c], z[c]);
        b4[q] = 4 * h + q;
    }
    const ActRow dst = act_row_scaled(p, tok, k, scales[tok]);
    pack_blocks4(v, dst.s, b4, k / kActBlock, dst.h, dst.sum);
    if (h == 0 && lane == 0) p.inv[tok] = dst.inv;
}

// OPENJET_GDN_NORM_PACK=1: launch_gdn_step's pack where it is asked for; unset or 0 (the default until its bit test
// has run on a GPU): never.
bool gdn_norm_pack() {
    const char* v = std::getenv("OPENJET_GDN_NORM_PACK");
    return v && std::strcmp(v, "1") == 0;
}

// The gated RMSNorm of y in place; or (pack) it and the pack of its rows in one pass at 256 threads a row
// (launch_pack_act's default for prefill rows; its pack's bits do not depend on the count: pack_act_row); or (pack
// and scales) the pack under those row scales, a warp a head, as the in-place norm takes its warps.
cudaError_t launch_gated_norm(const GdnStepArgs& a, const ActPack* pack, const float* scales,
                              cudaStream_t stream) {
    const long long threads = 32LL * a.t * a.n_v;
    const auto warps_grid = static_cast<unsigned>((threads + kNormThreads - 1) / kNormThreads);
    if (pack && scales) {
        count_launch(Counted::kGdnPackBounded);
        return launch_kernel(gdn_gated_pack_bounded_kernel, warps_grid, kNormThreads, 0, stream, a, *pack, scales);
    }
    if (pack) {
        count_launch(Counted::kGdnNormPack);
        return launch_kernel(gdn_gated_norm_pack_kernel<256, 24>, a.t, 256,
                             sizeof(float) * a.n_v * kGdnHeadDim, stream, a, *pack);
    }
    return launch_kernel(gdn_gated_norm_kernel, warps_grid, kNormThreads, 0, stream, a);
}

// The column split for a prefill call's rows: more than one sub-step, no fused projections (whose per-head
// logits every block of the head would compute again); OPENJET_GDN_SPLIT=0 turns it off (to compare).
// (Read at each such launch, a prefill chunk's 48, never on a decode step: tests switch it.)
bool gdn_split(const GdnStepArgs& a) {
    if (a.w_beta || a.t <= kGdnMaxT || a.replay) return false;
    const char* v = std::getenv("OPENJET_GDN_SPLIT");
    return !(v && std::strcmp(v, "0") == 0);
}

bool overlap(const float* a, const float* b, size_t n) { return a < b + n && b < a + n; }

// Whether the GPU holds n whole-head blocks at once (the step's own pack waits for all of them), asked once: on a GPU
// of fewer SMs than the 27B's 48 heads (46 is the smallest our users run) the separate pack launch stays.
bool gdn_blocks_resident(int n) {
    static const int slots = [] {
        int sms = 0, per_sm = 0;
        if (device_attribute(cudaDevAttrMultiProcessorCount, &sms) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gdn_step_kernel<kGdnHeadDim, true>, kGdnThreads,
                                                          0) != cudaSuccess)
            return 0;
        return sms * per_sm;
    }();
    return n <= slots;
}

}  // namespace

GdnProbe* gdn_probe_buffer() {
    void* p = nullptr;
    return cudaGetSymbolAddress(&p, g_gdn_probe) == cudaSuccess ? static_cast<GdnProbe*>(p) : nullptr;
}

cudaError_t gdn_probe_read(GdnProbe* out) { return cudaMemcpyFromSymbol(out, g_gdn_probe, sizeof(GdnProbe)); }

cudaError_t launch_gdn_step(const GdnStepArgs& a, cudaStream_t stream, const ActPack* pack, bool* packed,
                            const float* pack_scales) {
    if (packed) *packed = false;
    if (pack && !act_pack_plain(*pack)) return cudaErrorNotSupported;  // (its packs have no integer twin)
    if (a.n_k < 1 || a.n_v < a.n_k || a.n_v % a.n_k || a.t < 1 || a.t > kGdnMaxRows || !(a.eps >= 0.0f))
        return cudaErrorInvalidValue;
    if (!a.qkv || !a.z || !a.conv_w || !a.conv_state_in || !a.conv_state_out || !a.ssm_a || !a.dt_bias || !a.norm_w ||
        !a.state || !a.y)
        return cudaErrorInvalidValue;
    if (a.w_beta) {  // fused projections: F32 rows and x rows 16-byte aligned (float4 loads)
        const uintptr_t bits = reinterpret_cast<uintptr_t>(a.w_beta) | reinterpret_cast<uintptr_t>(a.w_alpha) |
                               reinterpret_cast<uintptr_t>(a.x_in);
        if (!a.w_alpha || !a.x_in || a.proj_k < 4 || a.proj_k % 4 || bits & 15 || a.t > kGdnMaxT)
            return cudaErrorInvalidValue;
    } else if (!a.b || !a.alpha) {
        return cudaErrorInvalidValue;
    }
    const size_t conv_dim = (size_t)(2 * a.n_k + a.n_v) * kGdnHeadDim;
    if (overlap(a.conv_state_in, a.conv_state_out, 3 * conv_dim)) return cudaErrorInvalidValue;
    if (a.state_out && overlap(a.state, a.state_out, (size_t)a.n_v * kGdnHeadDim * kGdnHeadDim))
        return cudaErrorInvalidValue;
    // A fused replay or an early commit: whole-head blocks of a decode or verify step only (the column split and the
    // chunked forms take neither).
    if (a.replay < 0 || a.replay > kGdnMaxT || a.commit < -1 || a.commit > a.replay + a.t ||
        (a.replay && (!a.replay_qkv || !a.replay_b || !a.replay_alpha)) ||
        ((a.replay || a.commit >= 0) && (a.t > kGdnMaxT || a.chunk_scratch)))
        return cudaErrorInvalidValue;
    if ((a.snap_state || a.snap_conv) &&  // a snapshot: form 2 only, at a chunk boundary inside the call
        (!a.snap_state || !a.snap_conv || a.snap_row <= 0 || a.snap_row >= a.t || a.snap_row % kGdnChunk ||
         !a.chunk_scratch || !gdn_two_phase_runs() || !gdn_chunked(a)))
        return cudaErrorInvalidValue;
    bool chunked = false;  // OPENJET_GDN_CHUNKED=1: gdn_chunk.cuh, where the device holds its blocks
    if (gdn_chunked(a)) {
        if (cudaError_t e = launch_gdn_chunk(a, stream, &chunked)) return e;
    }
    const int k = a.n_v * kGdnHeadDim;
    if (!chunked) {
        if (!gdn_split(a)) {
            // The step's own pack (GdnStepArgs::pack_out) where the caller gave the barrier's words and the pack
            // (not a bounded one), the rows fit one sub-step's warps and the GPU holds every block at once.
            // The staged form (GdnStepArgs::staged) where its 16-byte copies of conv_w and norm_w are aligned.
            const bool staged =
                a.staged && !((reinterpret_cast<uintptr_t>(a.conv_w) | reinterpret_cast<uintptr_t>(a.norm_w)) & 15);
            if (staged) count_launch(Counted::kGdnStaged);
            if (pack && a.pack_sync && !pack_scales && a.t <= kGdnMaxT && a.n_v <= kGdnPackMaxBlocks &&
                act_pack_fits(*pack, a.t, k) && gdn_blocks_resident(a.n_v)) {
                GdnStepArgs own = a;
                own.pack_out = *pack;
                count_launch(Counted::kGdnStepPack);
                if (staged && a.late_launch) count_launch(Counted::kGdnLateLaunch);
                const GdnKernel kernel = own_pack_kernel(staged, a.probe != nullptr, a.late_launch);
                if (const cudaError_t e = launch_kernel(kernel, a.n_v, kGdnThreads, 0, stream, own))
                    return e;
                if (packed) *packed = true;
                return cudaSuccess;
            }
            return launch_kernel(staged ? gdn_step_kernel<kGdnHeadDim, false, true> : gdn_step_kernel<kGdnHeadDim>,
                                 a.n_v, kGdnThreads, 0, stream, a);
        }
        constexpr int kSplits = kGdnHeadDim / kGdnSplitCols;
        if (cudaError_t e = launch_kernel(gdn_step_kernel<kGdnSplitCols>, a.n_v * kSplits,
                                          kGdnRowGroups * kGdnSplitCols, 0, stream, a))
            return e;
    }
    if (pack && !(act_pack_fits(*pack, a.t, k) && (pack_scales || (gdn_norm_pack() && a.n_v <= kMaxNormPackHeads))))
        pack = nullptr;  // the caller packs y
    if (const cudaError_t e = launch_gated_norm(a, pack, pack ? pack_scales : nullptr, stream)) return e;
    if (packed) *packed = pack != nullptr;
    return cudaSuccess;
}

}  // namespace openjet
