// Thompson action choice over C51 distributions (thompson.cuh). Reference:
// agent/policy/thompson.py (thompson_ref). Compiled with --fmad=false.
//
// One warp per row: the lanes stage the row's A x N probabilities in shared memory with
// parallel loads, then draw (thompson_warp). Dynamic shared memory: warps per block x A x N
// floats.
#include "thompson.cuh"

// probs (rows, A, N) float32; support (N); env (rows) int32 (< 0: padded row, skipped);
// step (rows) uint64. Out: action (rows) int32, value (rows, A) float32. A <= 4.
extern "C" __global__ void thompson_kernel(const float* __restrict__ probs,
                                           const float* __restrict__ support,
                                           const int* __restrict__ env,
                                           const unsigned long long* __restrict__ step,
                                           unsigned long long seed, unsigned int purpose,
                                           int rows, int n_actions, int n_atoms,
                                           int* __restrict__ action, float* __restrict__ value) {
    extern __shared__ float staged[];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int b = blockIdx.x * (blockDim.x >> 5) + warp;
    if (b >= rows) return;  // warp-uniform
    const int e = env[b];
    if (e < 0) return;  // warp-uniform
    const int width = n_actions * n_atoms;
    float* p = staged + warp * width;
    const float* src = probs + (size_t)b * width;
    for (int i = lane; i < width; i += 32) p[i] = src[i];
    __syncwarp();
    const int best = thompson_warp(p, support, seed, purpose, (unsigned int)e, step[b], n_actions,
                                   n_atoms, value + (size_t)b * n_actions);
    if (lane == 0) action[b] = best;
}
