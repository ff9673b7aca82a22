// The trainer's building blocks (train.cu): the activation functions and their derivatives, and
// the window load (called by all MF_THREADS threads of a block). Needs mamba_forward.cuh's macros.
#pragma once
#include "mamba_forward.cuh"

#ifndef TR_AGENT
#define TR_AGENT 2
#endif
#define TR_FM (MF_F - TR_AGENT)
#define TR_WARPS MF_WARPS

static_assert(MF_A <= 4 && MF_ATOMS <= 128 && MF_NR <= 128, "heads sized for one warp a row");

// The logistic function in mf_silu's form (the hardware exp2 and approximate division):
// relative error ~1e-6, inside the update's parity tolerance, at a few instructions.
__device__ __forceinline__ float tr_sigmoid(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }
__device__ __forceinline__ float tr_silu_grad(float x) {
    const float s = tr_sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}

// The normalised model input of decision bar t (K, F) into dst.
__device__ __forceinline__ void tr_load_window(const float* __restrict__ feat, long long t,
                                               const float* __restrict__ agent, float* dst) {
    for (int i = threadIdx.x; i < MF_K * MF_F; i += MF_THREADS) {
        const int k = i / MF_F, f = i % MF_F;
        dst[i] = f < TR_FM ? feat[(size_t)(t - MF_K + 1 + k) * TR_FM + f] : agent[k * TR_AGENT + (f - TR_FM)];
    }
}
