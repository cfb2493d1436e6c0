/* OpenJet engine: test-only C API of the Gated DeltaNet decode step (native/src/gdn_decode.cuh), kept apart
 * from openjet_test.h. Same conventions: an int status, OPENJET_OK or negative; after a failure
 * openjet_test_last_error() says what failed (per thread). Host arrays, row-major, float32:
 *   qkv [t, conv_dim] with conv_dim = (2 n_k + n_v) * 128, z [t, n_v*128], b and alpha [t, n_v],
 *   conv_w [conv_dim, 4] (tap 3 multiplies the current token), conv state [3, conv_dim] (oldest first),
 *   ssm_a and dt_bias [n_v], norm_w [128], state [n_v, 128 (k), 128 (v)], y [t, n_v*128].
 * t (token rows) is 1..8192 (in sub-steps of 8, bit for bit as one-row calls); n_v is a multiple of n_k (value
 * head v reads key head v mod n_k). */
#ifndef OPENJET_TEST_GDN_H
#define OPENJET_TEST_GDN_H

#include "openjet_test.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One decode step over t tokens: conv_state_out gets the new conv state (it may be the same host array
 * as conv_state_in), state is updated in place, y is written. */
OPENJET_API int openjet_test_gdn_step(int n_k, int n_v, int t, float eps, const float* qkv, const float* z,
                                      const float* b, const float* alpha, const float* conv_w,
                                      const float* conv_state_in, float* conv_state_out, const float* ssm_a,
                                      const float* dt_bias, const float* norm_w, float* state, float* y);

/* The step with a fused replay (the engine's OPENJET_GDN_REPLAY=fused, GdnStepArgs::replay / commit): qkv, b and
 * alpha hold replay + t rows, the first `replay` (0..8) of them given to the kernel as the replay ring's rows, the
 * other t (1..8) as the call's own; z and y hold the t own rows. The state (in place) and conv_state_out are written
 * after `commit` rows, replay rows counted (-1: all; 0: neither, conv_state_out then left as it came). Each row's
 * arithmetic is what a one-row call of it does, so every output equals a chain of one-row openjet_test_gdn_step
 * calls bit for bit. */
OPENJET_API int openjet_test_gdn_step_replay(int n_k, int n_v, int replay, int t, int commit, float eps,
                                             const float* qkv, const float* z, const float* b, const float* alpha,
                                             const float* conv_w, const float* conv_state_in, float* conv_state_out,
                                             const float* ssm_a, const float* dt_bias, const float* norm_w,
                                             float* state, float* y);

/* The same step over t token rows (OPENJET_GDN_CHUNKED's two-phase form: a prefill call's) with its output packed
 * under the given row scales (launch_gdn_step's bounded pack, OPENJET_GDN_PACK_BOUND): h [t, n_v*128] (fp16 bits,
 * the pack's element order), sum [t, n_v*128/32*2] (each 32-block's sum as two fp16), inv [t] = 1 / scales; the
 * inputs left unchanged. n_v * 128 a multiple of 256. */
OPENJET_API int openjet_test_gdn_step_bounded_pack(int n_k, int n_v, int t, float eps, const float* qkv,
                                                   const float* z, const float* b, const float* alpha,
                                                   const float* conv_w, const float* conv_state_in,
                                                   const float* ssm_a, const float* dt_bias, const float* norm_w,
                                                   const float* state, const float* scales, uint16_t* h,
                                                   uint16_t* sum, float* inv);

/* Times launch_gdn_step on pseudo-random inputs: `copies` independent sets of states (S and both conv
 * buffers) that successive calls rotate through (so L2 cannot hold them), `reps` calls captured in a CUDA
 * graph, each of `runs` replays timed with events: us_out[i] = microseconds per call. */
OPENJET_API int openjet_test_bench_gdn(int n_k, int n_v, int t, int copies, int reps, int runs, float* us_out);

/* What the last GDN step launched under OPENJET_BENCH_GDN_PROBE=1 recorded (gdn_decode.cuh GdnProbe; the engine's
 * default form, whole heads with their own pack): for each of its first `blocks` blocks (at most 64) clock[b * points
 * + p], the SM's clock64() at the end of phase p (points must be 12: GdnProbePoint's order, entry first), ns[2 b] and
 * ns[2 b + 1] the global timer (ns) at its entry and end, sm[b] its SM. Zeros where no probed launch ran. */
OPENJET_API int openjet_test_gdn_probe(int blocks, int points, long long* clock, unsigned long long* ns,
                                       unsigned* sm);

#ifdef __cplusplus
}
#endif

#endif /* OPENJET_TEST_GDN_H */
