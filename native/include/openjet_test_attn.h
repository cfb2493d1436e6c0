/* OpenJet engine: test-only C API of the gated attention decode (native/src/attn_decode.cuh), for
 * tests/test_gpu_attn.py and the benchmark in openjet_launcher/engine/kernels_test_attn.py. Same conventions
 * as openjet_test.h: host arrays in and out, an int status (OPENJET_OK or negative), and after a failure
 * openjet_test_last_error() (openjet_test.h) says what failed (per thread).
 *
 * Shapes (row-major, head_dim 256): qproj [t, n_head * 512] (per head [query 256 | gate 256]); k, v
 * [t, n_kv * 256]; q_norm, k_norm [256]; o [t, n_head * 256]. kv_type is the GGML type id of the cache:
 * 1 F16 (512 bytes per cached row), 8 Q8_0 (8 ggml blocks of 34 bytes: 272 bytes per row). Caches are
 * [n_kv, rows, row bytes]: k after RMSNorm and RoPE, raw v. t is 1..8 and (n_head / n_kv) * t <= 64. */
#ifndef OPENJET_TEST_ATTN_H
#define OPENJET_TEST_ATTN_H

#include "openjet_test.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One decode step of t rows at positions n_past .. n_past + t - 1: the caches k_in / v_in hold n_past rows
 * per kv head (NULL allowed when n_past == 0); k_out / v_out (NULL: not returned) receive n_past + t rows,
 * the new ones appended. o = attention * sigmoid(gate). OPENJET_TEST_ATTN_CAPTURED_AT=L: the launch is made for
 * length L (0..n_past, n_past's chunk size) and reads n_past on the device, as a CUDA graph's replayed later. */
OPENJET_API int openjet_test_attn_decode(int kv_type, int n_head, int n_kv, int n_past, int t, const float* qproj,
                                         const float* k, const float* v, const float* q_norm, const float* k_norm,
                                         float eps, float rope_base, int n_rot, const void* k_in, const void* v_in,
                                         void* k_out, void* v_out, float* o);

/* The cache stores of a step alone (launch_attn_store_kv: what the MTP head's fill runs): t = 1..4096 rows of
 * k (RMSNorm, RoPE) and v appended after the n_past cached rows, as openjet_test_attn_decode appends them. */
OPENJET_API int openjet_test_attn_store_kv(int kv_type, int n_head, int n_kv, int n_past, int t, const float* k,
                                           const float* v, const float* k_norm, float eps, float rope_base, int n_rot,
                                           const void* k_in, const void* v_in, void* k_out, void* v_out);

/* A prefill call's attention (launch_attn_prefill, attn_prefill.cuh: flash attention, numerics of its own): t =
 * 1..4096 rows, otherwise as openjet_test_attn_decode; rows: query rows per block (64, 128, or 0: the library's
 * choice). */
OPENJET_API int openjet_test_attn_prefill(int kv_type, int n_head, int n_kv, int n_past, int t, const float* qproj,
                                          const float* k, const float* v, const float* q_norm, const float* k_norm,
                                          float eps, float rope_base, int n_rot, const void* k_in, const void* v_in,
                                          void* k_out, void* v_out, float* o, int rows);

/* The split the launch picks on this device: keys per chunk, chunks, and the SM count it read. */
OPENJET_API int openjet_test_attn_split(int n_past, int n_kv, int t, int* chunk_keys, int* n_chunks, int* sm_count);

/* 1 where this build and device run the prefill attention on warpgroup MMA (a 90a build on compute capability 9.0:
 * taken there unless OPENJET_ATTN_PREFILL_WGMMA=0), else 0. */
OPENJET_API int openjet_test_attn_prefill_wgmma_available(void);

/* Times one decode step (prep, chunks, combine) on random device caches of n_past + t rows, the context split
 * sized as for split_factor times the device's SMs (1: what the library does): `copies` cache
 * pairs that successive calls rotate through (so L2 cannot hold them), `reps` calls captured in a CUDA graph,
 * us_out[i] = microseconds per call of run i. */
OPENJET_API int openjet_test_bench_attn_decode(int kv_type, int n_head, int n_kv, int n_past, int t, int split_factor,
                                               int copies, int reps, int runs, float* us_out);

/* Times one prefill call's attention (prep and the flash kernel, `rows` query rows per block as in
 * openjet_test_attn_prefill) over t rows after n_past random cached rows: `reps` calls in a CUDA graph, us_out[i] =
 * microseconds per call of run i. */
OPENJET_API int openjet_test_bench_attn_prefill(int kv_type, int n_head, int n_kv, int n_past, int t, int rows,
                                                int reps, int runs, float* us_out);

#ifdef __cplusplus
}
#endif

#endif /* OPENJET_TEST_ATTN_H */
