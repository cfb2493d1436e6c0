// Do the tensor cores take fp16 subnormals as they are? A probe for a cheaper k-quant decode.
//
// Today a code q becomes an exact fp16 in two instructions: (0x6400 | q) is 1024 + q (one LOP3), then an HSUB2 or
// HFMA2 takes the 1024 off (gemv_mma.cuh). The bits q alone, with a zero exponent, are the fp16 subnormal q 2^-24:
// exact, in the one LOP3, with no offset to take off. If mma.sync multiplies such an A by normal activations with no
// flush and no lost bits, then C 2^24 equals the mma of the exact codes, bit for bit (a power of two commutes with
// every rounding above the fp32 subnormal range, which these products stay far from), and a decode could drop one
// instruction per fp16 pair of weights (the scale then applied to C in fp32, per sub-block).
//
// Each trial: a 16 x 16 matrix of codes (4-bit, 6-bit, or a high nibble in place: 16 q) and a 16 x 8 matrix of fp16
// activations spanning 2^-14 .. 2^15 in magnitude, both signs; one warp computes the m16n8k16 product twice, A as the
// subnormal codes and A as the same codes made normal (the magic-number form), and the host compares: bits equal
// after the 2^24 scale, and each against the exact product in double. One JSON object on stdout.
// Build: nvcc -O3 -std=c++17 -arch=sm_90a -o mma_subnormal mma_subnormal.cu   (any sm_80+ arch works)
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#define CK(x)                                                                                \
    do {                                                                                     \
        cudaError_t e_ = (x);                                                                \
        if (e_ != cudaSuccess) {                                                             \
            std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

namespace {

constexpr int kTrials = 8192;

__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The fp16 bits of code pair (lo, hi) as subnormals: the code is the mantissa.
__device__ __forceinline__ uint32_t sub_pair(uint32_t lo, uint32_t hi) { return lo | (hi << 16); }
// The same codes as exact normal fp16 (1024 + q) - 1024.
__device__ __forceinline__ uint32_t norm_pair(uint32_t lo, uint32_t hi) {
    const uint32_t m = (lo | (hi << 16)) | 0x64006400u;
    uint32_t r;
    asm("sub.f16x2 %0, %1, %2;" : "=r"(r) : "r"(m), "r"(0x64006400u));
    return r;
}

// codes: kTrials x 16 x 16 (uint16 code bits: q, or 16 q for the high nibble in place); x: kTrials x 16 (k) x 8 (n)
// fp16 bits. out_sub / out_norm: kTrials x 16 x 8 floats.
__global__ void probe(const uint16_t* codes, const uint16_t* x, float* out_sub, float* out_norm) {
    const int lane = threadIdx.x & 31, trial = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (trial >= kTrials) return;
    const int g = lane >> 2, tq = lane & 3;
    const uint16_t* A = codes + trial * 256;
    const uint16_t* B = x + trial * 128;
    const auto a_at = [&](int r, int k) { return static_cast<uint32_t>(A[r * 16 + k]); };
    const auto b_at = [&](int k, int n) { return static_cast<uint32_t>(B[k * 8 + n]); };
    uint32_t as[4], an[4], b[2];
    const int rows[4] = {g, g + 8, g, g + 8}, ks[4] = {2 * tq, 2 * tq, 2 * tq + 8, 2 * tq + 8};
    for (int i = 0; i < 4; ++i) {
        as[i] = sub_pair(a_at(rows[i], ks[i]), a_at(rows[i], ks[i] + 1));
        an[i] = norm_pair(a_at(rows[i], ks[i]), a_at(rows[i], ks[i] + 1));
    }
    b[0] = b_at(2 * tq, g) | (b_at(2 * tq + 1, g) << 16);
    b[1] = b_at(2 * tq + 8, g) | (b_at(2 * tq + 9, g) << 16);
    float cs[4] = {}, cn[4] = {};
    mma16816(cs, as, b);
    mma16816(cn, an, b);
    const int orow[4] = {g, g, g + 8, g + 8}, ocol[4] = {2 * tq, 2 * tq + 1, 2 * tq, 2 * tq + 1};
    for (int i = 0; i < 4; ++i) {
        out_sub[trial * 128 + orow[i] * 8 + ocol[i]] = cs[i];
        out_norm[trial * 128 + orow[i] * 8 + ocol[i]] = cn[i];
    }
}

struct Result {
    long long outputs = 0, equal_bits = 0, flushed = 0;
    double max_rel_sub = 0.0, max_rel_norm = 0.0;
};

Result run_kind(const char* kind, int code_max, int code_shift, bool first, std::mt19937& rng) {
    std::vector<uint16_t> codes(kTrials * 256), x(kTrials * 128);
    std::uniform_int_distribution<int> code(0, code_max);
    std::uniform_int_distribution<int> expo(-14, 15), mant(0, 1023), sign(0, 1);
    for (auto& c : codes) c = static_cast<uint16_t>(code(rng) << code_shift);
    for (auto& v : x) {
        const float f = (sign(rng) ? -1.0f : 1.0f) * std::ldexp(1.0f + mant(rng) / 1024.0f, expo(rng));
        const __half h = __float2half_rn(f);
        std::memcpy(&v, &h, 2);
    }
    uint16_t *dc, *dx;
    float *ds, *dn;
    CK(cudaMalloc(&dc, codes.size() * 2));
    CK(cudaMalloc(&dx, x.size() * 2));
    CK(cudaMalloc(&ds, kTrials * 128 * 4));
    CK(cudaMalloc(&dn, kTrials * 128 * 4));
    CK(cudaMemcpy(dc, codes.data(), codes.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    probe<<<kTrials / 4, 128>>>(dc, dx, ds, dn);
    CK(cudaGetLastError());
    std::vector<float> s(kTrials * 128), n(kTrials * 128);
    CK(cudaMemcpy(s.data(), ds, s.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(n.data(), dn, n.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaFree(dc));
    CK(cudaFree(dx));
    CK(cudaFree(ds));
    CK(cudaFree(dn));
    Result r;
    for (int t = 0; t < kTrials; ++t) {
        for (int row = 0; row < 16; ++row) {
            for (int col = 0; col < 8; ++col) {
                double exact = 0.0, mag = 0.0;
                for (int k = 0; k < 16; ++k) {
                    const double q = codes[t * 256 + row * 16 + k];
                    const double xv = __half2float(*reinterpret_cast<const __half*>(&x[t * 128 + k * 8 + col]));
                    exact += q * xv;
                    mag += std::fabs(q * xv);
                }
                const float sub = std::ldexp(s[t * 128 + row * 8 + col], 24), nrm = n[t * 128 + row * 8 + col];
                ++r.outputs;
                uint32_t bs, bn;
                std::memcpy(&bs, &sub, 4);
                std::memcpy(&bn, &nrm, 4);
                r.equal_bits += bs == bn;
                r.flushed += sub == 0.0f && exact != 0.0;
                if (mag > 0) {
                    r.max_rel_sub = std::fmax(r.max_rel_sub, std::fabs(sub - exact) / mag);
                    r.max_rel_norm = std::fmax(r.max_rel_norm, std::fabs(nrm - exact) / mag);
                }
            }
        }
    }
    std::printf("%s\"%s\": {\"outputs\": %lld, \"equal_bits\": %lld, \"flushed\": %lld, "
                "\"max_err_over_abs_sum_subnormal\": %.3e, \"max_err_over_abs_sum_normal\": %.3e}",
                first ? "" : ", ", kind, r.outputs, r.equal_bits, r.flushed,
                r.max_rel_sub, r.max_rel_norm);
    return r;
}

}  // namespace

int main() {
    cudaDeviceProp p{};
    CK(cudaGetDeviceProperties(&p, 0));
    std::mt19937 rng(1234);
    std::printf("{\"bench\": \"mma_subnormal\", \"gpu\": \"%s\", \"cc\": \"%d.%d\", \"trials\": %d, ", p.name, p.major,
                p.minor, kTrials);
    run_kind("q4", 15, 0, true, rng);
    run_kind("q4_high_nibble_in_place", 15, 4, false, rng);
    run_kind("q6", 63, 0, false, rng);
    std::printf("}\n");
    return 0;
}
