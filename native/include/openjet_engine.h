/* OpenJet engine: the decode engine's C API (v1), included by openjet.h. Conventions as openjet.h: every
 * function returns an int status (OPENJET_OK or a negative OPENJET_ERR_* / OPENJET_ENGINE_ERR_*), nothing
 * aborts, and after a failure openjet_engine_last_error() (per thread) says what failed in words.
 *
 * One engine = the weights of one qwen35 GGUF file on one GPU + ONE sequence (KV caches, Gated DeltaNet
 * recurrent and conv states) + a few device checkpoint slots of the recurrent state for rollback.
 * Shapes are row-major; token rows t are 1..8 (a decode step, or a verify step of 1 + drafts), up to the
 * config's prefill_rows (512 by default, at most 8192) in a prefill chunk. */
#ifndef OPENJET_ENGINE_H
#define OPENJET_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "openjet.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OPENJET_ENGINE_ERR_CUDA (-4)        /* a CUDA call or kernel failed (message has the CUDA error) */
#define OPENJET_ENGINE_ERR_DEVICE_MEMORY (-5) /* cudaMalloc failed: the message says how many bytes */
#define OPENJET_ENGINE_ERR_MODEL (-6)       /* a tensor is missing, or has a shape or type we cannot run */
#define OPENJET_ENGINE_MAX_T 8            /* token rows of a decode step (1 + drafts) */
#define OPENJET_ENGINE_PREFILL_ROWS 512   /* default token rows of a prefill chunk (its weights are read once) */
#define OPENJET_ENGINE_PREFILL_ROWS_MAX 8192 /* the most a config's prefill_rows may ask */

/* Model dimensions (the ModelShape fields of the GGUF file) and the sequence's sizes. */
typedef struct openjet_engine_config {
    int n_embd, n_ff, n_layer;              /* n_layer: trunk layers (the MTP block is not run by v1) */
    int n_head, n_head_kv, head_dim, n_rot; /* head_dim must be 256 */
    int ssm_n_k_heads, ssm_n_v_heads, ssm_head_dim; /* ssm_head_dim must be 128 */
    int ssm_conv_kernel;                    /* must be 4 */
    int full_attn_interval;                 /* attention layers: (il + 1) % interval == 0 */
    int n_vocab;
    float rms_eps, rope_base;
    int n_ctx;                              /* KV cache capacity in tokens (positions 0 .. n_ctx - 1) */
    int kv_type;                            /* GGML type id of the KV cache: 1 F16, 8 Q8_0 */
    int n_checkpoints;                      /* device slots for openjet_engine_checkpoint (0 .. 64) */
    int device;                             /* CUDA device ordinal */
    int prefill_rows;                       /* token rows of a prefill chunk the scratch holds (~260 KB each at
                                               27B): 0 = OPENJET_ENGINE_PREFILL_ROWS, at most ..._MAX */
} openjet_engine_config;

/* One tensor of the file: its GGUF name, GGML type id, ne (ne[0] = the input dimension; unused dims 1),
 * and its bytes in host memory (e.g. into the memory-mapped file), read during create only. */
typedef struct openjet_tensor_desc {
    const char* name;
    int ggml_type;
    int n_dims;
    int64_t ne[4];
    const void* data;
    size_t n_bytes;
} openjet_tensor_desc;

/* Bytes the engine holds on the device. */
typedef struct openjet_engine_memory_report {
    size_t weights_bytes;      /* uploaded tensors (the ones the trunk reads) */
    size_t kv_bytes;           /* K and V caches of the attention layers at n_ctx */
    size_t state_bytes;        /* Gated DeltaNet recurrent states + both conv-state buffers */
    size_t checkpoint_bytes;   /* the checkpoint slots */
    size_t scratch_bytes;      /* activations of a prefill chunk (prefill_rows rows), logits and attention
                                  workspace of a T = 8 step */
    size_t prefill_f16_bytes;  /* the prefill's fp16 weights where kept (OPENJET_PREFILL_F16_WEIGHTS: only where
                                  the device has the room, ~49 GB at 27B; never on a 24 GB card), else 0 */
    size_t total_bytes;
} openjet_engine_memory_report;

typedef struct openjet_engine openjet_engine;

/* Message of this thread's last failed openjet_engine_* call ("" when none failed yet). */
OPENJET_API const char* openjet_engine_last_error(void);

/* Validates the config and the tensors (names, types, shapes), uploads the trunk's weights and allocates
 * the sequence at position 0. On failure *out is NULL and every byte taken is freed. Tensors the trunk does
 * not read (the MTP block) are ignored. */
OPENJET_API int openjet_engine_create(const openjet_engine_config* config, const openjet_tensor_desc* tensors,
                                      int n_tensors, openjet_engine** out);

/* Frees everything; NULL is a no-op. */
OPENJET_API void openjet_engine_destroy(openjet_engine* engine);

/* Back to position 0: zero recurrent and conv states; the KV cache length becomes 0. */
OPENJET_API int openjet_engine_reset(openjet_engine* engine);

/* Tokens processed so far (the position of the next token). */
OPENJET_API int openjet_engine_n_past(const openjet_engine* engine, int* n_past);

/* One decode step over t tokens at positions n_past .. n_past + t - 1 (1 <= t <= 8, ids in [0, n_vocab),
 * n_past + t <= n_ctx). logits [t, n_vocab] and hidden [t, n_embd] (post-output_norm) are host buffers;
 * either may be NULL (logits NULL: the lm_head is skipped, as a replay needs). On failure the sequence is
 * unchanged when the failure is a bad argument, and undefined after a CUDA failure: every operation but
 * openjet_engine_reset and openjet_engine_restore is then refused until one of them has run (this holds for every
 * operation that changes the sequence). */
OPENJET_API int openjet_engine_decode(openjet_engine* engine, const int32_t* ids, int t, float* logits,
                                      float* hidden);

/* Prefill: n tokens at positions n_past .. n_past + n - 1 in chunks of `chunk` rows (1..prefill_rows), each
 * chunk reading every weight once. Under OPENJET_PREFILL_GEMM=exact every row gets the bits a decode step of 1..8
 * rows gives it; by default the numerics are the prefill's own (docs/ENGINE.md), and the state left is the same,
 * bit for bit, whatever the chunk size and however the tokens are split between calls (with the chunked GDN, the
 * default: where chunks and calls start on its 32-token boundaries, as CudaEngine.prefill keeps them). logits [n_vocab] and
 * hidden [n_embd] of the last token (either may be NULL). Errors as decode. */
OPENJET_API int openjet_engine_prefill(openjet_engine* engine, const int32_t* ids, int n, int chunk, float* logits,
                                       float* hidden);

/* openjet_engine_prefill (2 <= n) that also leaves in checkpoint slot `slot` what openjet_engine_checkpoint would
 * after the first `at` tokens (1 <= at < n): as if the tokens were prefilled in two calls with a checkpoint between,
 * the same bits, in one call where the chunked GDN's form 2 runs and `at` and `chunk` are multiples of its 32-token
 * chunks (the state at that chunk boundary written by the GDN step itself), else as those two calls. Errors as
 * prefill, and a bad slot or `at`. */
OPENJET_API int openjet_engine_prefill_checkpoint(openjet_engine* engine, const int32_t* ids, int n, int chunk, int slot,
                                                  int at, float* logits, float* hidden);

/* A decode step that returns, instead of the logits, each row's top k (1..32) among ids < n_valid, by
 * decreasing logit then increasing id, after logit[pen_ids[i]] -= pen_deltas[i] (presence / frequency
 * penalties computed as sampling.py does; ids unique, < n_valid; n_pen may be 0): top_values / top_ids
 * [t, k] on the host, hidden [t, n_embd] or NULL. The host sampler draws from these k, so a step copies
 * 32 values per row instead of n_vocab. Otherwise as decode. */
OPENJET_API int openjet_engine_decode_top(openjet_engine* engine, const int32_t* ids, int t, int k, int n_valid,
                                          const int32_t* pen_ids, const float* pen_deltas, int n_pen,
                                          float* top_values, int32_t* top_ids, float* hidden);

/* Speculative verification without a rollback (engines created with the MTP head): verify runs a decode step
 * over t rows (the last token and its drafts; logits [t, n_vocab], hidden [t, n_embd] as decode) but leaves the
 * sequence where it was; accept(n) then commits its first n rows (1 <= n <= t): each GDN layer's recurrent
 * step is replayed over them from the inputs the verify step kept (the same kernel on the same inputs: the
 * bits a decode of those rows leaves), their KV and MTP cache rows stay, n_past advances by n. Between the
 * two, every call but accept and reset is refused. */
OPENJET_API int openjet_engine_verify(openjet_engine* engine, const int32_t* ids, int t, float* logits, float* hidden);
/* verify, handing back each row's top k as decode_top does (no penalties: speculation runs without them). */
OPENJET_API int openjet_engine_verify_top(openjet_engine* engine, const int32_t* ids, int t, int k, int n_valid,
                                          float* top_values, int32_t* top_ids, float* hidden);
OPENJET_API int openjet_engine_accept(openjet_engine* engine, int n);

/* Copies the recurrent + conv states and n_past into checkpoint slot `slot` (device to device). */
OPENJET_API int openjet_engine_checkpoint(openjet_engine* engine, int slot);

/* Makes the sequence what it was when `slot` was saved: states copied back, n_past restored (KV rows past it
 * are dead and get overwritten). Rows below n_past are the ones the saved sequence wrote, as long as no
 * step since then ran at a position below the slot's n_past. */
OPENJET_API int openjet_engine_restore(openjet_engine* engine, int slot);

OPENJET_API int openjet_engine_memory(const openjet_engine* engine, openjet_engine_memory_report* report);

/* *has_mtp = 1 when the model has an MTP head (blk.{n_layer}.nextn.*), else 0. With one, every decode step also
 * extends the head's own KV cache by the step's (token, previous hidden) pairs (qwen38.md §3.3). */
OPENJET_API int openjet_engine_has_mtp(const openjet_engine* engine, int* has_mtp);

/* Draft step k (0, 1, ...) of a chain after the last processed token: the MTP head on (token, h), h = the
 * trunk's last hidden row for k = 0, else the head's own output of step k - 1; it writes its cache row
 * n_past - 1 + k (past the committed rows: the next decode step overwrites it). logits [n_vocab] (with a
 * draft vocabulary, set_draft_rows: [its count]) and hidden [n_embd] (h', the head's post-norm output) are
 * host buffers, either may be NULL. The sequence is unchanged. Needs n_past >= 1. */
OPENJET_API int openjet_engine_mtp_step(openjet_engine* engine, int32_t token, int k, float* logits, float* hidden);

/* Greedy drafting chained on the device (issue 7: the host reads back only the drafts): draft steps 0..n-1 after
 * `token` as mtp_step runs them, each step's token the one before's argmax (the first of verify_top's order: value
 * down, ties to the lower id, ids < n_valid; over the draft vocabulary's rows when set), with one wait at the end.
 * drafts [n] the ids; values [n] their logits and hidden [n, n_embd] each step's h' (either may be NULL). The same
 * drafts as mtp_step steps ranked on the host (CudaEngine.mtp_draft_top, k = 1). 1 <= n <= OPENJET_ENGINE_MAX_T,
 * 1 <= n_valid <= n_vocab; the sequence is unchanged. */
OPENJET_API int openjet_engine_mtp_draft_greedy(openjet_engine* engine, int32_t token, int n, int n_valid,
                                                int32_t* drafts, float* values, float* hidden);

/* A whole greedy speculative cycle after `token` (chosen, not processed), with one wait: n_draft (0..7) greedy
 * drafts as mtp_draft_greedy makes them, a verify step of [token, drafts] whose rows are ranked on the device (the
 * argmax among ids < n_valid), the longest prefix of drafts equal to the target's argmax kept and accepted with the
 * token (openjet_engine_accept's work), and the target's next token. out [n_draft + 1]: the kept drafts then the next
 * token, *n_out of them (1..n_draft + 1); the sequence has advanced by the token and the kept drafts. What verify +
 * accept give with the drafts the host's own ranking makes, the same ids. */
OPENJET_API int openjet_engine_cycle_greedy(openjet_engine* engine, int32_t token, int n_draft, int n_valid,
                                            int32_t* out, int* n_out);

/* Sampled drafting chained on the device: draft steps 0..n-1 after `token` as mtp_draft_greedy runs them, each step's
 * token drawn from q_j, the request's transform of the step's top k logits (ids < n_valid; over the draft vocabulary's
 * rows when set): logits / temperature, softmax over the k, top-p, min-p, renormalised (sampling.py's order), then
 * the inverse CDF over q_j's ids in increasing order with u[j] in [0, 1), drawn by the caller from the request's
 * generator. q_j comes back for the acceptance test, which must use the very q the draft was drawn from (the output
 * is then exact whatever q is): q_ids / q_probs [n, k], row j's first q_len[j] entries (ids increasing). 1 <= n <=
 * OPENJET_ENGINE_MAX_T, 1 <= k <= 32, temperature > 0, 0 < top_p <= 1, 0 <= min_p <= 1. The sequence is unchanged. */
OPENJET_API int openjet_engine_mtp_draft_sampled(openjet_engine* engine, int32_t token, int n, int n_valid, int k,
                                                 double temperature, double top_p, double min_p, const double* u,
                                                 int32_t* drafts, int32_t* q_ids, double* q_probs, int* q_len);

/* A whole sampled speculative cycle after `token` (chosen, not processed), with one wait (issue 7: the verdict on the
 * device, the host reads back only the tokens): n_draft (0..7) drafts as mtp_draft_sampled draws them with
 * u[0..n_draft), a verify step of [token, drafts] whose rows' top k (ids < n_valid) give the target's distributions
 * p_i under the same transform, and exact speculative sampling (speculative.py's accept_sampled): draft i is kept
 * while u_a * q_i(d_i) < p_i(d_i), u_a the next uniform of the acceptance stream u[n_draft..2 n_draft]; at the first
 * rejection the next token is drawn (the stream's next uniform, inverse CDF over p_i's ids in increasing order) from
 * max(p_i - q_i, 0), and when every draft is kept, from p_{n_draft}. out [n_draft + 1]: the kept drafts then the
 * next token, *n_out of them; *n_used: the acceptance uniforms taken (kept + 2 after a rejection, n_draft + 1
 * otherwise), so that the caller's generator can move exactly as far as a host acceptance would have moved it. The
 * sequence has advanced by the token and the kept drafts. Parameters as mtp_draft_sampled's; 2 n_draft + 1 uniforms. */
OPENJET_API int openjet_engine_cycle_sampled(openjet_engine* engine, int32_t token, int n_draft, int n_valid, int k,
                                             double temperature, double top_p, double min_p, const double* u,
                                             int32_t* out, int* n_out, int* n_used);

/* The per-phase profile, when on (set_profile, or OPENJET_PROFILE=1 in the environment at create): JSON
 * {"on": bool, "calls": n, "phases": {"gdn.step": {"ms": total, "marks": n}, ...}} of the device time between
 * phase marks (embed, norm, gdn.in_proj, gdn.step, gdn.out_proj, attn.in_proj, attn.core, attn.out_proj, ffn,
 * lm_head, topk, mtp.fill, logits.copy, accept, and a draft step's mtp.draft.in / .attn / .ffn / .head / .pick),
 * summed over calls since the last reset. Events between every
 * phase slow the engine a little; off, nothing is recorded. reset != 0 clears the totals. */
OPENJET_API int openjet_engine_profile(openjet_engine* engine, char* json, size_t capacity, int reset);
OPENJET_API int openjet_engine_set_profile(openjet_engine* engine, int on);

/* Attention chunk blocks per SM that the split-K attention aims at (2 at create, measured fastest at 32K on the
 * H200; at most the cap that OPENJET_ATTN_SPREAD (1..8, default 2) gave at create, which sizes the workspace):
 * more chunks of fewer keys. Rows stay T-invariant (the split depends on the context, the SM count and this,
 * never on T); the rounding of attention at long contexts changes with it. attn_spread reads the current one. */
OPENJET_API int openjet_engine_set_attn_spread(openjet_engine* engine, int spread);
OPENJET_API int openjet_engine_attn_spread(const openjet_engine* engine, int* spread);

/* The MTP head's draft vocabulary (issue 7): from now on mtp_step computes only the lm_head rows ids[0..n)
 * and its logits hold n values, logits[i] that of token ids[i], bit for bit the value the full lm_head gives
 * (the same rows, the same GEMV). Rows 0..keep are kept as they are (keep <= the current count; ids[0..keep)
 * is not read), the rest gathered from output.weight: extending the list as a sequence brings new tokens
 * costs only those rows. n = 0: every row again. Verification never uses it, so drafts may change, the output never does. */
OPENJET_API int openjet_engine_set_draft_rows(openjet_engine* engine, const int32_t* ids, int n, int keep);

#ifdef __cplusplus
}
#endif

#endif /* OPENJET_ENGINE_H */
