/* OpenJet engine: test-only C API. Each call runs one kernel family on host arrays: it allocates device
 * memory, copies in, launches, synchronises, copies out and frees. For tests and benchmarks
 * (openjet_launcher/engine/kernels_test.py), not for serving.
 *
 * Conventions (as openjet.h): an int status, OPENJET_OK or negative, never an abort; after a failure
 * openjet_test_last_error() says what failed (per thread). Shapes are row-major: x [t, k], y [t, n],
 * weights [n, k] as GGUF stores them (n rows of k/elements_per_block blocks). qtype is the GGML type id:
 * 0 F32, 8 Q8_0, 12 Q4_K, 13 Q5_K, 14 Q6_K. t (token rows) is 1..128 (decode: 1..8; more: the prefill GEMM, in groups of 8). */
#ifndef OPENJET_TEST_H
#define OPENJET_TEST_H

#include <stddef.h>
#include <stdint.h>

#include "openjet.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OPENJET_TEST_ERR_CUDA (-4) /* a CUDA call or kernel failed: see openjet_test_last_error() */

/* Message of this thread's last failed call of the test API: openjet_test_* here and in openjet_test_gdn.h and
 * openjet_test_attn.h ("" when none failed yet). */
OPENJET_API const char* openjet_test_last_error(void);

/* Activation packing, the GEMV's input format (optionally fused RMSNorm: norm_w != NULL, then
 * v = x*rsqrt(mean x^2+eps)*w): per row, s = 2^e with max|v|*s in [2^14, 2^15); xh [t, k] fp16 bits of v*s,
 * each aligned quad stored in the order 0, 2, 1, 3; xsum [t, k/32 * 2] fp16 bits of each 32-block's sum S
 * / 32 as hi + lo, in native/src/act_pack.cuh's order; xinv [t] = 1/s. t is 1..8192, k % 256 == 0. */
OPENJET_API int openjet_test_pack_act(const float* x, int t, int k, const float* norm_w, float eps, uint16_t* xh,
                                      uint16_t* xsum, float* xinv);

/* The persistent FFN's pack rows (ffn_persistent.cuh), host-side arithmetic only: rows[0] = where the tail's pack
 * rows start, in rows of k_out (k_out 0: no tail, -1); rows[1] = where the next norm's pack rows start when the launch
 * also runs the next layer's input projections (next_proj != 0), in rows of n_embd (else 0). */
OPENJET_API int openjet_test_ffn_pack_rows(int n_embd, int n_ff, int k_out, int next_proj, int* rows);

/* The W rows a block of the prefill's tf32x3 F32 GEMM takes (prefill_f32.cu; host arithmetic, no GPU needed) for a
 * call of t rows x n, `matrices` (1 or 2) in one launch, on a GPU of `sms` multiprocessors whose blocks may opt in to
 * `optin` bytes of shared memory: 48 (wide) or 16 (narrow) into *rows. */
OPENJET_API int openjet_test_prefill_f32_block_rows(int t, int n, int matrices, int sms, int optin, int* rows);

/* What the engine allocates for the persistent FFN at FFN width n_ff: *ints counters and flags
 * (ffn_persistent_scratch_ints) and *profile_slots 8-byte profile accumulators (kFfnProfileSlots). */
OPENJET_API int openjet_test_ffn_scratch(int n_ff, int* ints, int* profile_slots);

/* y [t, k] = x * rsqrt(mean x^2 + eps) * w. */
OPENJET_API int openjet_test_rmsnorm(const float* x, int t, int k, const float* w, float eps, float* y);

/* launch_add_norm_pack on t <= OPENJET_ENGINE_MAX_T decode rows: h + delta (null: none) -> h_out, rmsnorm(h) * w ->
 * a_out, and its pack (xh, xsum, xinv as openjet_test_pack_act's). */
OPENJET_API int openjet_test_add_norm_pack(const float* h, const float* delta, const float* w, int t, int k, float eps,
                                           float* h_out, float* a_out, uint16_t* xh, uint16_t* xsum, float* xinv);

/* y [t, n] = W x: k-quant W packs x first (no norm), F32 W takes x as is. k: a multiple of 256 for the
 * k-quants, of 4 for F32. */
OPENJET_API int openjet_test_gemv(int qtype, const void* w, int n, int k, const float* x, int t, float* y);

/* The tile layout (native/src/weight_layout.cuh, the engine's layout of its GEMV weights): out = W's bytes with each
 * group of 16 rows stored unit by unit (byte b of 256-weight unit u of row 16 g + r at ((g * k / 256 + u) * 16 + r) *
 * pitch + b, pitch = the unit's bytes rounded up to 4, zeros after them: n * k / 256 * pitch bytes), moved on the
 * device. A k-quant qtype, n % 16 == 0, k % 256 == 0. */
OPENJET_API int openjet_test_tile_layout(int qtype, const void* w, int n, int k, void* out);

/* openjet_test_gemv with W (given in the row layout) moved into the tile layout on the device first, then read there
 * (decode and prefill calls alike, as the engine reads its weights): the tile layout's shapes. */
OPENJET_API int openjet_test_gemv_tiled(int qtype, const void* w, int n, int k, const float* x, int t, float* y);
/* The producer-warp decode GEMV (a 90a build on 9.0; W in the tile layout); form -1 the default's, 1 or 2. */
OPENJET_API int openjet_test_gemv_tma(int qtype, const void* w, int n, int k, const float* x, int t, int form,
                                      float* y);

/* (y0, y1) [t, n] = (W0 x, W1 x) for two F32 matrices of one shape in one launch_gemv_pair, as the engine's prefill
 * projects a GDN layer's beta and alpha: under the prefill's own numerics (OPENJET_PREFILL_GEMM unset, fast or dense)
 * both in one launch of prefill_f32.cu's GEMM, whatever t, unless OPENJET_PREFILL_F32=rows; else decode's kernels
 * and bits. */
OPENJET_API int openjet_test_gemv_f32_pair(const float* w0, const float* w1, int n, int k, const float* x, int t,
                                           float* y0, float* y1);

/* Microseconds per openjet_test_gemv_f32_pair-shaped call over t rows (pseudo-random W0, W1 [n, k] and x), one
 * figure per run of reps graph-replayed calls: the F32 projections' kernels as OPENJET_PREFILL_F32 picks them. */
OPENJET_API int openjet_test_bench_gemv_f32_pair(int n, int k, int t, int reps, int runs, float* us_out);

/* y [t, n] = W x for k-quant W and activations already packed (openjet_test_pack_act's xh, xsum, xinv). */
OPENJET_API int openjet_test_gemv_packed(int qtype, const void* w, int n, int k, const uint16_t* xh,
                                         const uint16_t* xsum, const float* xinv, int t, float* y);

/* The ffn_down input of a prefill call: the pack (openjet_test_pack_act's format, [t, n]) of silu(G x) * (U x) for
 * k-quant G and U (Q4_K, Q5_K or Q6_K, both [n, k]) and x [t, k] packed on the device first, as the engine's prefill
 * computes it: gate and up in one GEMM (native/src/prefill_gemm.cuh, launch_ffn_gate_up_pack), or under
 * OPENJET_PREFILL_FFN_FUSED=0 two GEMMs and the swiglu pack (the same bits). n % 256 == 0. */
OPENJET_API int openjet_test_prefill_gate_up(int qtype, const void* w_gate, const void* w_up, int n, int k,
                                             const float* x, int t, uint16_t* xh, uint16_t* xsum, float* xinv);

/* The FFN's fp16 form (launch_ffn_gate_up_pack on the engine's kept rows) beside the fp32 swiglu epilogue on the same
 * fp16 rows: v [t, n] float (the fp32 epilogue, natural order), h [t, n] fp16 bits (the fp16 form, the pack's element
 * order), inv [t] (its row factors), norms [2] (the largest row norms of G and U). The dense GEMM only (a 90a build
 * with CUTLASS on sm_90); t >= 256, n % 256 == 0. */
OPENJET_API int openjet_test_prefill_gate_up_half(int qtype, const void* w_gate, const void* w_up, int n, int k,
                                                  const float* x, int t, float* v, uint16_t* h, float* inv,
                                                  float* norms);

/* out [n_ids, dim] = rows ids of a Q4_K table [vocab, dim] (qtype 12), dequantised. */
OPENJET_API int openjet_test_embed(int qtype, const void* table, int vocab, int dim, const int32_t* ids,
                                   int n_ids, float* out);

/* The MTP head's input pack in one launch (launch_mtp_input_pack): row r of [rmsnorm(embedding of ids[r]) * enorm |
   rmsnorm(hs[r]) * hnorm] packed as openjet_test_pack_act packs a row of 2 dim (xh [t, 2 dim], xsum [t, 2 dim / 32 *
   2], xinv [t]); t 1..8, hs [t, dim], a Q4_K table [vocab, dim]; an id outside [0, vocab) gives a row of zeros. An
   error where the launch does not take the call (no clusters on this GPU or build, OPENJET_PACK_CLUSTER below 2). */
OPENJET_API int openjet_test_mtp_input_pack(const void* table, int vocab, int dim, const int32_t* ids, int t,
                                            const float* hs, const float* enorm, const float* hnorm, float eps,
                                            uint16_t* xh, uint16_t* xsum, float* xinv);

/* values / ids [rows, k] = the top k (1..32) of each row of x [rows, n] among ids < n_valid, by decreasing
 * value then increasing id, after z[pen_ids[i]] -= pen_deltas[i] (ids unique and < n_valid; n_pen may be 0). */
OPENJET_API int openjet_test_topk(const float* x, int rows, int n, int n_valid, int k, const int32_t* pen_ids,
                                  const float* pen_deltas, int n_pen, float* values, int32_t* ids);

/* A sampled draft step's pick from a row x [n] (sample_top.cuh): its top k (1..32) among ids < n_valid, entry i being
 * token row_ids[i] (NULL: i), then the transform (temperature > 0, top_p, min_p) and the draw with u in [0, 1): the
 * pick, and q (q_len ids, increasing, in q_ids / q_probs [k]). */
OPENJET_API int openjet_test_sample_top(const float* x, int n, const int32_t* row_ids, int n_valid, int k,
                                        double temperature, double top_p, double min_p, double u, int32_t* pick,
                                        int32_t* q_ids, double* q_probs, int* q_len);

/* The launch shape the GEMV picks on the current device. */
OPENJET_API int openjet_test_gemv_shape(int qtype, int n, int k, int* rows_per_block, int* warps_per_block,
                                        int* blocks);

/* The decode GEMV's tile shape for the calls that follow: -1 what OPENJET_GEMV_HALF says (gemv_half_tiles), 0 the
 * automatic choice, 1 16-row tiles, 2 half tiles. Process-wide: tests compare the shapes' bits, the benchmark their
 * times. */
OPENJET_API int openjet_test_set_gemv_half(int mode);

/* The add-norm cluster pack's scale from its bound where it pins the max (OPENJET_ADD_NORM_MAX_EST) for the calls that
 * follow: -1 what the environment says (read at the next call), 0 off, 1 on. Process-wide. */
OPENJET_API int openjet_test_set_add_norm_max_est(int mode);

/* 1 where this build and device run the dense prefill GEMM (dense_gemm_available: OPENJET_PREFILL_GEMM=dense), else
 * 0. */
OPENJET_API int openjet_test_dense_gemm_available(void);

/* 1 where this build and device run the producer-warp decode GEMV (gemv_tma_available: OPENJET_GEMV_TMA), else 0. */
OPENJET_API int openjet_test_gemv_tma_available(void);

/* Launches so far of a counted path: `what` is an index of native/src/launch_count.h's Counted (0 the dense prefill
 * GEMM, ..., 21 a decode GEMV on the producer-warp kernel; the Python side's COUNTED names them). */
OPENJET_API int openjet_test_launch_count(int what, long long* out);

/* Times the GEMV alone (activations packed once beforehand): W is copied to `copies` device buffers
 * that successive calls rotate through (so L2 cannot hold the weights), `reps` calls are captured in a
 * CUDA graph, and each of `runs` graph replays is timed with events: us_out[i] = microseconds per call. */
OPENJET_API int openjet_test_bench_gemv(int qtype, const void* w, int n, int k, int t, int copies, int reps,
                                        int runs, float* us_out);

/* openjet_test_bench_gemv with the weights in the tile layout when tiled != 0. */
OPENJET_API int openjet_test_bench_gemv_layout(int qtype, const void* w, int n, int k, int t, int tiled, int copies,
                                               int reps, int runs, float* us_out);

/* The integer-tensor-core GEMV (native/src/gemv_imma.cuh, an experiment): y [t, n] = W x for Q4_K / Q5_K / Q6_K W,
 * t = 1..8, x packed on the device first; stages: cp.async depth per warp (0 default, 2, 3, 4, 6); persistent:
 * 1, a grid of the blocks the GPU holds at once, each streaming several tiles (the same bits); 2, the producer-warp
 * form (launch_gemv_tma_imma: sm_90a, tiled only, stages unused; the same bits); tiled: W moved into the tile layout
 * on the device first (n % 16 == 0; the same bits). */
OPENJET_API int openjet_test_gemv_imma(int qtype, const void* w, int n, int k, const float* x, int t, int stages,
                                       int persistent, int tiled, float* y);
/* The same as the engine runs it under OPENJET_GEMV_INT: x packed as the fp16 GEMV's pack (openjet_test_pack_act),
 * then the engine's GEMV dispatch with the integer pack's scratch (launch_gemv, GemvArgs::xi: the integer pack made
 * from the fp16 one, the engine's grid); an error if the dispatch took another GEMV. */
OPENJET_API int openjet_test_gemv_imma_from_pack(int qtype, const void* w, int n, int k, const float* x, int t,
                                                 int tiled, float* y);
/* Its timing, as openjet_test_bench_gemv's. */
OPENJET_API int openjet_test_bench_gemv_imma(int qtype, const void* w, int n, int k, int t, int stages, int persistent,
                                             int tiled, int copies, int reps, int runs, float* us_out);

/* Device-to-device cudaMemcpy of `bytes`, `reps` times per run: gbps_out[i] = (read + written bytes) / s. */
OPENJET_API int openjet_test_bench_copy(size_t bytes, int reps, int runs, float* gbps_out);

/* What sits between two decode GEMVs costs, in a CUDA graph of `reps` chains GEMV A -> middle -> GEMV B (both k x k
   of qtype, host weights w in the row layout, moved into the tile layout, `copies` >= 2 copies rotated through):
   middle by mode 0 none, 1 the add-norm pack of A's output into B's input, 2 an empty one-block kernel, 3 an empty
   cluster of 8 blocks, 4 eight empty blocks with no cluster, 5 the fold (gemv_fold.cuh: no middle; A's tiles end with
   the residual add and the norm's partials, B reads them; Q4_K on a 90a build on 9.0), 6 and 7 its halves alone
   (timings only: A's epilogue with B on its pack, A plain with B reading the fold's buffers). us_out[r]: microseconds per
   chain in run r. */
/* The fold (gemv_fold.cuh, an experiment) between two decode GEMVs in the tile layout: A [n, ka] over x [t, ka] with
   the fold's epilogue over the residual h [t, n] and the norm's weights norm_w [n], then B [nb, n] reading it: h_out
   and u [t, n], part [t, n / 16, 4] (q, m, s, 0), B's y [t, nb] and its rows' (c, inv) in scales [t, 2]; what B
   leaves for the kernels after it: the normed rows a_out [t, n] and B's pack (xh, xsum, xinv as openjet_test_pack_act).
   rows (t > 1): B's first t blocks make its rows' pack (OPENJET_FOLD_ROWS) instead of the fold's pack launch;
   grid_sms: both GEMVs' grids sized for that many SMs (0: all). */
OPENJET_API int openjet_test_gemv_fold(int qtype, const void* wa, int n, int ka, const void* wb, int nb, const float* x,
                                       int t, const float* h, const float* norm_w, float eps, float* h_out, float* u,
                                       float* part, float* y, float* scales, float* a_out, uint16_t* xh,
                                       uint16_t* xsum, float* xinv, int rows, int grid_sms);
/* The down projection's side of OPENJET_SWIGLU_ROWS: A [n, ka] in the tile layout with the fold's epilogue over h
   [t, n] and norm_w [n], its input the swiglu pack of g and up [t, ka], made by the swiglu pack launch before it (rows
   0) or by A's own first blocks (rows 1, t > 1); grid_sms as openjet_test_gemv_fold's. Out: h_out and u_out [t, n],
   part [t, n / 16, 4] and the pack A read (xh, xsum, xinv as openjet_test_pack_act). */
OPENJET_API int openjet_test_gemv_swiglu_rows(int qtype, const void* wa, int n, int ka, const float* g, const float* up,
                                              int t, const float* h, const float* norm_w, int rows, int grid_sms,
                                              float* h_out, float* u_out, float* part, uint16_t* xh, uint16_t* xsum,
                                              float* xinv);
/* A prefill's add-norm on the fold's numerics (launch_fold_add_norm_pack, a 90a build on 9.0) over t rows of k: h plus
   delta (null: h is already the sum) into h_out, then u, part, the normed rows a_out and the pack (xh, xsum, xinv) as
   openjet_test_gemv_fold gives them. */
OPENJET_API int openjet_test_fold_add_norm_pack(const float* h, const float* delta, const float* norm_w, int t, int k,
                                                float eps, float* h_out, float* u, float* part, float* a_out,
                                                uint16_t* xh, uint16_t* xsum, float* xinv);

OPENJET_API int openjet_test_bench_pack_chain(int qtype, const void* w, int k, int t, int mode, int copies, int reps,
                                              int runs, float* us_out);

/* A phase boundary's cost with no work on either side (bench_boundary.cu), on a grid of blocks_per_sm blocks a SM
   of `threads` threads, a figure per run: handover_us[i] = one launch's hand-over to the next under PDL (a CUDA
   graph of `rounds` launches, replayed), barrier_us[i] = one grid-wide barrier round in a resident grid
   (arrivals_per_block warps of each block arrive, every warp waits; with block_wait, warp 0 waits and releases its
   block with __syncthreads). read_bytes (a multiple of 512, at most 1 MiB;
   0: none): after each boundary every warp reads the same read_bytes through L2, as a projection's blocks read the
   row the phase before made, each from the row's start or with read_rotated from a 512-byte piece of its own. counts_out [1 + runs]: [0] the hand-over launches counted (1 + (runs + 1) x rounds: a
   warm-up launch, a warm replay, the timed ones), [1 + i] the arrivals counted in run i (rounds x grid x
   arrivals_per_block). */
OPENJET_API int openjet_test_bench_boundary(int blocks_per_sm, int threads, int arrivals_per_block, int block_wait,
                                            int read_bytes, int read_rotated, int rounds, int runs, float* handover_us, float* barrier_us,
                                            int* counts_out);

#ifdef __cplusplus
}
#endif

#endif /* OPENJET_TEST_H */
