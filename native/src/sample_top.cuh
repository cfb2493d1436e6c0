// A token drawn on the device from one row's top k: the MTP head's sampled drafts, chained without the host
// (openjet_engine_mtp_draft_sampled).
//
// The transform is sampling.py's, in its order: logits / temperature, softmax over the k, top-p (the smallest prefix
// whose mass reaches top_p), min-p (drop p < min_p * p_max), renormalised; then the inverse CDF over the survivors in
// increasing id order with a uniform u in [0, 1) that the host drew from the request's generator. A sampled cycle's
// verdict (launch_accept_sampled) takes the same transform of the verify rows' top k. In double
// precision, but not numpy's operations bit for bit, and it need not be: exact speculative sampling only needs the
// acceptance test to use the very distribution q the draft was drawn from, so q comes back (its ids, increasing, and
// probabilities) and the host tests against it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace openjet {

struct SampleTransform {
    double temperature;  // > 0 (the host's float64 parameters, as sampling.py has them)
    double top_p;        // (0, 1]
    double min_p;        // [0, 1]
};

// values / ids [k]: launch_topk's output for the row (value down, ties to the lower id; ids -1 past the valid ones).
// u: one double on the device. Writes the drawn id to *pick (and *pick_copy where set: the next draft step's input),
// q's q_len survivors to q_ids / q_probs (ids increasing). No valid entry at all: id 0 with probability 1.
cudaError_t launch_sample_top(const float* values, const int32_t* ids, int k, SampleTransform tr, const double* u,
                              int32_t* pick, int32_t* pick_copy, int32_t* q_ids, double* q_probs, int* q_len,
                              cudaStream_t stream);

// A sampled speculative cycle's verdict on the device (exact speculative sampling, speculative.py's accept_sampled):
// values / ids [n_draft + 1, k] the verify rows' top k, drafts [n_draft] drawn from the distributions q (q_ids /
// q_probs [n_draft, kTopKMax], q_len [n_draft]: launch_sample_top's), u the acceptance stream's n_draft + 1 uniforms.
// out [kept + 1] the kept drafts and the next token, *n_out = kept + 1 (the rows to accept), *n_used the uniforms
// taken (kept + 2 after a rejection, n_draft + 1 when every draft is kept).
cudaError_t launch_accept_sampled(const float* values, const int32_t* ids, int k, SampleTransform tr,
                                  const int32_t* drafts, const int32_t* q_ids, const double* q_probs, const int* q_len,
                                  int n_draft, const double* u, int32_t* out, int* n_out, int* n_used,
                                  cudaStream_t stream);

// A greedy speculative cycle's verdict on the device: targets [n_draft + 1] the verify rows' argmaxes, drafts
// [n_draft]; k = the longest prefix with drafts[i] == targets[i]; out [k + 1] = drafts[0..k) and targets[k], *n_out =
// k + 1 (the rows to accept: the cycle's token and the k kept drafts).
cudaError_t launch_accept_greedy(const int32_t* drafts, const int32_t* targets, int n_draft, int32_t* out, int* n_out,
                                 cudaStream_t stream);

}  // namespace openjet
