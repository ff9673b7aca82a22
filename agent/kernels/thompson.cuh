// Thompson action choice over C51 distributions (ALGORITHMS.md section 3), one warp per row.
// Reference: agent/policy/thompson.py (thompson_ref). The CDF and the threshold are plain
// float32 additions and one multiply in index order (nothing an FMA could contract), so the
// result is bit-identical to NumPy's sequential accumulate. Used by thompson.cu and decide.cu.
#pragma once
#include "philox.cuh"

// p: the row's A x N probabilities, readable by every lane (shared memory); support (N).
// Lane a (< A) draws action a's atom by inverse CDF with Philox stream (seed, env, step,
// purpose) and, when value is not null, writes it to value[a]. Every lane returns the argmax of
// the draws (the lowest action on ties). A <= 4.
__device__ __forceinline__ int thompson_warp(const float* p, const float* __restrict__ support,
                                             unsigned long long seed, unsigned int purpose,
                                             unsigned int env, unsigned long long step,
                                             int n_actions, int n_atoms, float* value) {
    const int lane = threadIdx.x & 31;
    float v = -__int_as_float(0x7f800000);
    if (lane < n_actions) {
        const Philox4 bits = philox_draw(seed, env, step, purpose, 0u);
        const float* pa = p + lane * n_atoms;
        float total = 0.0f;
        for (int j = 0; j < n_atoms; ++j) total += pa[j];
        const float threshold = philox_uniform(bits.v[lane]) * total;
        float cdf = 0.0f;
        int pick = n_atoms - 1;
        for (int j = 0; j < n_atoms; ++j) {
            cdf += pa[j];
            if (cdf > threshold) {
                pick = j;
                break;
            }
        }
        v = support[pick];
        if (value != nullptr) value[lane] = v;
    }
    float drawn[4];
#pragma unroll
    for (int a = 0; a < 4; ++a) drawn[a] = __shfl_sync(0xffffffffu, v, a);
    int best = 0;
    for (int a = 1; a < n_actions; ++a) {
        if (drawn[a] > drawn[best]) best = a;
    }
    return best;
}

// policy.selection for one row on a warp: the best expected Q (ties to the lowest action) when
// greedy, else the Thompson draw (thompson_warp). q (A) and p (A x N) readable by every lane;
// every lane returns the action.
__device__ __forceinline__ int select_action_warp(bool greedy, const float* q, const float* p,
                                                  const float* __restrict__ support, unsigned long long seed,
                                                  unsigned int purpose, unsigned int env, unsigned long long step,
                                                  int n_actions, int n_atoms) {
    if (greedy) {
        int best = 0;
        for (int a = 1; a < n_actions; ++a) {
            if (q[a] > q[best]) best = a;
        }
        return best;
    }
    return thompson_warp(p, support, seed, purpose, env, step, n_actions, n_atoms, nullptr);
}
