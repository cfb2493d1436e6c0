// Partial NeoX RoPE (qwen38.md §3.2 step 3, text positions): pairs (i, i + n_rot/2) for i < n_rot/2,
// theta_i = pos * base^(-2i/n_rot); dims n_rot.. pass through.
#pragma once

#include <cuda_runtime.h>

namespace openjet {

// cos and sin of theta_i, the angle in double (pos * inv_freq reaches ~3e5 rad at 262K positions: float
// would lose ~0.03 rad), rounded to float once, as the reference's rope_tables does.
__device__ __forceinline__ void rope_cos_sin(int pos, int i, int n_rot, float base, float& c, float& s) {
    const double angle = static_cast<double>(pos) * pow(static_cast<double>(base), -2.0 * i / n_rot);
    double sd, cd;
    sincos(angle, &sd, &cd);
    c = static_cast<float>(cd);
    s = static_cast<float>(sd);
}

// Dim d < n_rot of one head y after the rotation, given c and s = rope_cos_sin of its pair d mod n_rot / 2.
__device__ __forceinline__ float rope_neox_rotated(const float* y, int d, int n_rot, float c, float s) {
    const int half = n_rot / 2;
    const int i = d < half ? d : d - half;
    const float x1 = y[i], x2 = y[i + half];
    // x1' = x1 c - x2 s, x2' = x1 s + x2 c, each product rounded as numpy does
    return d < half ? __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)) : __fadd_rn(__fmul_rn(x1, s), __fmul_rn(x2, c));
}

// Rotates y[0..n_rot) of one head held in shared memory, one thread per dim (blockDim.x >= n_rot). Reads
// both halves before any write; the caller syncs before and after.
__device__ __forceinline__ float rope_neox_dim(const float* y, int d, int pos, int n_rot, float base) {
    const int half = n_rot / 2;
    if (d >= n_rot) return y[d];
    float c, s;
    rope_cos_sin(pos, d < half ? d : d - half, n_rot, base, c, s);
    return rope_neox_rotated(y, d, n_rot, c, s);
}

}  // namespace openjet
