// launch_sample_top (sample_top.cuh): one thread works the row's at most kTopKMax candidates (the rest of its warp
// idles): a few microseconds of latency in a chain of draft steps whose host round trip it saves.
#include "sample_top.cuh"

#include "pdl.cuh"
#include "topk.cuh"

namespace openjet {
namespace {

__global__ void __launch_bounds__(32) sample_top_kernel(const float* __restrict__ values,
                                                        const int32_t* __restrict__ ids, int k, SampleTransform tr,
                                                        const double* __restrict__ u, int32_t* pick,
                                                        int32_t* pick_copy, int32_t* q_ids, double* q_probs,
                                                        int* q_len) {
    pdl_start();  // pdl.cuh
    if (threadIdx.x) return;
    double p[kTopKMax];
    int32_t id[kTopKMax];
    int m = 0;
    while (m < k && ids[m] >= 0) id[m] = ids[m], ++m;
    if (m == 0) {  // nothing valid to rank (a draft vocabulary without an id below n_valid): a certain id 0
        id[0] = 0, p[0] = 1.0, m = 1;
    } else {
        // softmax of logits / temperature over the candidates, the largest first (sampling.py's _survivors; where the
        // top logit / t leaves double, its limit: (v - v0) / t, 0 for the maxima and -inf below them)
        const double t = tr.temperature, v0 = values[0];
        const bool limit = !isfinite(v0 / t);
        const double z0 = limit ? 0.0 : v0 / t;
        double sum = 0.0;
        for (int i = 0; i < m; ++i) {
            const double v = values[i];
            sum += p[i] = exp((limit ? (v - v0) / t : v / t) - z0);
        }
        for (int i = 0; i < m; ++i) p[i] /= sum;
        if (tr.top_p < 1.0) {  // the smallest prefix whose mass reaches top_p (all of them if rounding falls short)
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
    }
    for (int i = 1; i < m; ++i) {  // increasing ids: the order the host's CDF runs in (insertion sort, m <= 32)
        const int32_t ki = id[i];
        const double pi = p[i];
        int j = i - 1;
        for (; j >= 0 && id[j] > ki; --j) id[j + 1] = id[j], p[j + 1] = p[j];
        id[j + 1] = ki, p[j + 1] = pi;
    }
    // The first survivor whose cumulative mass exceeds u * total (numpy's searchsorted(cdf, u * cdf[-1], "right")).
    double total = 0.0;
    for (int i = 0; i < m; ++i) total += p[i];
    const double x = *u * total;
    double cdf = 0.0;
    int chosen = m - 1;
    for (int i = 0; i < m; ++i) {
        cdf += p[i];
        if (cdf > x) {
            chosen = i;
            break;
        }
    }
    *pick = id[chosen];
    if (pick_copy) *pick_copy = id[chosen];
    for (int i = 0; i < m; ++i) q_ids[i] = id[i], q_probs[i] = p[i];
    *q_len = m;
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
