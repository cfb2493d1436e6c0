// launch_sample_top (sample_top.cuh): one thread works the row's at most kTopKMax candidates (the rest of its warp
// idles): a few microseconds of latency in a chain of draft steps whose host round trip it saves.
#include "sample_top.cuh"

#include "pdl.cuh"
#include "topk.cuh"

namespace openjet {
namespace {

// The request's distribution over one row's top k (values / ids: launch_topk's output), sampling.py's transform in its
// order: softmax of logits / temperature over the candidates (the largest first; where the top logit / t leaves
// double, its limit: (v - v0) / t, 0 for the maxima and -inf below them), top-p (the smallest prefix whose mass
// reaches top_p, all of them if rounding falls short), min-p (drop p < min_p * p_max), renormalised. Into id / p
// (ids increasing: the order the host's CDF runs in); returns their count m. No valid entry: id 0 with probability 1.
__device__ int top_distribution(const float* values, const int32_t* ids, int k, SampleTransform tr,
                                int32_t (&id)[kTopKMax], double (&p)[kTopKMax]) {
    int m = 0;
    while (m < k && ids[m] >= 0) id[m] = ids[m], ++m;
    if (m == 0) {  // nothing valid to rank (a draft vocabulary without an id below n_valid): a certain id 0
        id[0] = 0, p[0] = 1.0;
        return 1;
    }
    const double t = tr.temperature, v0 = values[0];
    const bool limit = !isfinite(v0 / t);
    const double z0 = limit ? 0.0 : v0 / t;
    double sum = 0.0;
    for (int i = 0; i < m; ++i) {
        const double v = values[i];
        sum += p[i] = exp((limit ? (v - v0) / t : v / t) - z0);
    }
    for (int i = 0; i < m; ++i) p[i] /= sum;
    if (tr.top_p < 1.0) {
        double mass = 0.0;
        for (int i = 0; i < m; ++i) {
            mass += p[i];
            if (mass >= tr.top_p) {
                m = i + 1;
                break;
            }
        }
    }
    if (tr.min_p > 0.0) {  // p[0] is the largest and always stays
        const double floor = tr.min_p * p[0];
        int kept = 0;
        for (int i = 0; i < m; ++i)
            if (p[i] >= floor) p[kept] = p[i], id[kept] = id[i], ++kept;
        m = kept;
    }
    sum = 0.0;
    for (int i = 0; i < m; ++i) sum += p[i];
    for (int i = 0; i < m; ++i) p[i] /= sum;
    for (int i = 1; i < m; ++i) {  // increasing ids (insertion sort, m <= 32)
        const int32_t ki = id[i];
        const double pi = p[i];
        int j = i - 1;
        for (; j >= 0 && id[j] > ki; --j) id[j + 1] = id[j], p[j + 1] = p[j];
        id[j + 1] = ki, p[j + 1] = pi;
    }
    return m;
}

// The index the host's draw picks from weights w [m] (unnormalised, m >= 1) with the uniform u:
// numpy's searchsorted(cumsum(w), u * cumsum(w)[-1], "right"), the cumulative sums in the same order.
__device__ int draw_index(const double* w, int m, double u) {
    double total = 0.0;
    for (int i = 0; i < m; ++i) total += w[i];
    const double x = u * total;
    double cdf = 0.0;
    for (int i = 0; i < m; ++i) {
        cdf += w[i];
        if (cdf > x) return i;
    }
    return m - 1;
}

// A distribution's probability of `token` (ids increasing; 0 where it has none): speculative.py's prob_at.
__device__ double prob_of(const int32_t* id, const double* p, int m, int32_t token) {
    for (int i = 0; i < m && id[i] <= token; ++i)
        if (id[i] == token) return p[i];
    return 0.0;
}

__global__ void __launch_bounds__(32) sample_top_kernel(const float* __restrict__ values,
                                                        const int32_t* __restrict__ ids, int k, SampleTransform tr,
                                                        const double* __restrict__ u, int32_t* pick,
                                                        int32_t* pick_copy, int32_t* q_ids, double* q_probs,
                                                        int* q_len) {
    pdl_start();  // pdl.cuh
    if (threadIdx.x) return;
    double p[kTopKMax];
    int32_t id[kTopKMax];
    const int m = top_distribution(values, ids, k, tr, id, p);
    const int chosen = draw_index(p, m, *u);
    *pick = id[chosen];
    if (pick_copy) *pick_copy = id[chosen];
    for (int i = 0; i < m; ++i) q_ids[i] = id[i], q_probs[i] = p[i];
    *q_len = m;
}

// speculative.py's accept_sampled on the device, for openjet_engine_cycle_sampled: the verify rows' top k
// (values / ids [n_draft + 1, k]) give the target's distributions p_i by top_distribution; draft i (drafts[i], drawn
// from q_i: q_ids / q_probs [n_draft, kTopKMax], q_len [n_draft]) is kept while u * q_i(d_i) < p_i(d_i), u the
// acceptance stream's next uniform; at the first rejection the next token is drawn (the stream's next uniform) from
// max(p_i - q_i, 0) over p_i's ids, and when every draft is kept, from p_{n_draft}. out [kept + 1]: the kept drafts
// and that token; *n_out = kept + 1 (the rows to accept); *n_used: the uniforms taken, so that the host's generator
// moves as far as its own acceptance would have moved it.
__global__ void __launch_bounds__(32) accept_sampled_kernel(const float* __restrict__ values,
                                                            const int32_t* __restrict__ ids, int k, SampleTransform tr,
                                                            const int32_t* __restrict__ drafts,
                                                            const int32_t* __restrict__ q_ids,
                                                            const double* __restrict__ q_probs,
                                                            const int* __restrict__ q_len, int n_draft,
                                                            const double* __restrict__ u, int32_t* out, int* n_out,
                                                            int* n_used) {
    pdl_start();
    if (threadIdx.x) return;
    double p[kTopKMax];
    int32_t id[kTopKMax];
    int used = 0;
    for (int i = 0; i < n_draft; ++i) {
        const int m = top_distribution(values + static_cast<long long>(i) * k, ids + static_cast<long long>(i) * k, k,
                                       tr, id, p);
        const int32_t* qi = q_ids + i * kTopKMax;
        const double* qp = q_probs + i * kTopKMax;
        const int d = drafts[i], qm = q_len[i];
        if (u[used++] * prob_of(qi, qp, qm, d) < prob_of(id, p, m, d)) {
            out[i] = d;
            continue;
        }
        for (int j = 0; j < m; ++j) p[j] = fmax(p[j] - prob_of(qi, qp, qm, id[j]), 0.0);  // (p - q exact, then max)
        out[i] = id[draw_index(p, m, u[used++])];
        *n_out = i + 1;
        *n_used = used;
        return;
    }
    const int m = top_distribution(values + static_cast<long long>(n_draft) * k,
                                   ids + static_cast<long long>(n_draft) * k, k, tr, id, p);
    out[n_draft] = id[draw_index(p, m, u[used++])];
    *n_out = n_draft + 1;
    *n_used = used;
}

__global__ void __launch_bounds__(32) accept_greedy_kernel(const int32_t* __restrict__ drafts,
                                                           const int32_t* __restrict__ targets, int n_draft,
                                                           int32_t* out, int* n_out) {
    pdl_start();
    if (threadIdx.x) return;
    int k = 0;
    while (k < n_draft && drafts[k] == targets[k]) out[k] = drafts[k], ++k;
    out[k] = targets[k];
    *n_out = k + 1;
}

}  // namespace

cudaError_t launch_accept_greedy(const int32_t* drafts, const int32_t* targets, int n_draft, int32_t* out, int* n_out,
                                 cudaStream_t stream) {
    if (!targets || !out || !n_out || n_draft < 0 || (n_draft && !drafts)) return cudaErrorInvalidValue;
    return launch_kernel(accept_greedy_kernel, 1, 32, 0, stream, drafts, targets, n_draft, out, n_out);
}

cudaError_t launch_accept_sampled(const float* values, const int32_t* ids, int k, SampleTransform tr,
                                  const int32_t* drafts, const int32_t* q_ids, const double* q_probs, const int* q_len,
                                  int n_draft, const double* u, int32_t* out, int* n_out, int* n_used,
                                  cudaStream_t stream) {
    if (!values || !ids || !u || !out || !n_out || !n_used || k < 1 || k > kTopKMax || n_draft < 0 ||
        (n_draft && (!drafts || !q_ids || !q_probs || !q_len)) || !(tr.temperature > 0.0) ||
        !(tr.top_p > 0.0 && tr.top_p <= 1.0) || !(tr.min_p >= 0.0 && tr.min_p <= 1.0))
        return cudaErrorInvalidValue;
    return launch_kernel(accept_sampled_kernel, 1, 32, 0, stream, values, ids, k, tr, drafts, q_ids, q_probs, q_len,
                         n_draft, u, out, n_out, n_used);
}

cudaError_t launch_sample_top(const float* values, const int32_t* ids, int k, SampleTransform tr, const double* u,
                              int32_t* pick, int32_t* pick_copy, int32_t* q_ids, double* q_probs, int* q_len,
                              cudaStream_t stream) {
    if (!values || !ids || !u || !pick || !q_ids || !q_probs || !q_len || k < 1 || k > kTopKMax ||
        !(tr.temperature > 0.0) || !(tr.top_p > 0.0 && tr.top_p <= 1.0) || !(tr.min_p >= 0.0 && tr.min_p <= 1.0))
        return cudaErrorInvalidValue;
    return launch_kernel(sample_top_kernel, 1, 32, 0, stream, values, ids, k, tr, u, pick, pick_copy, q_ids, q_probs,
                         q_len);
}

}  // namespace openjet
