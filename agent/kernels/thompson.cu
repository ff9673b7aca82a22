// Thompson action choice over C51 distributions (ALGORITHMS.md section 3).
// Reference: agent/policy/thompson.py (thompson_ref). Compiled with --fmad=false: the CDF and
// the threshold are plain float32 additions and one multiply in index order, bit-identical to
// NumPy's sequential accumulate.
//
// One warp per row: the lanes stage the row's A x N probabilities in shared memory with
// parallel loads, then lane a (< A) walks action a's CDF sequentially; the warp's argmax goes
// to the lowest action on ties. Dynamic shared memory: warps per block x A x N floats.
#include "philox.cuh"

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
    float v = -__int_as_float(0x7f800000);
    if (lane < n_actions) {
        const Philox4 bits = philox_draw(seed, (unsigned int)e, step[b], purpose, 0u);
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
        value[(size_t)b * n_actions + lane] = v;
    }
    float drawn[4];
#pragma unroll
    for (int a = 0; a < 4; ++a) drawn[a] = __shfl_sync(0xffffffffu, v, a);
    if (lane == 0) {
        int best = 0;
        for (int a = 1; a < n_actions; ++a) {
            if (drawn[a] > drawn[best]) best = a;
        }
        action[b] = best;
    }
}
