// Thompson action choice over C51 distributions (ALGORITHMS.md section 3).
// Reference: agent/policy/thompson.py (thompson_ref). Compiled with --fmad=false: the CDF and
// the threshold are plain float32 additions and one multiply, bit-identical to NumPy.
#include "philox.cuh"

// probs (rows, A, N) float32; support (N); env (rows) int32 (< 0: padded row, skipped);
// step (rows) uint64. Out: action (rows) int32, value (rows, A) float32.
extern "C" __global__ void thompson_kernel(const float* __restrict__ probs,
                                           const float* __restrict__ support,
                                           const int* __restrict__ env,
                                           const unsigned long long* __restrict__ step,
                                           unsigned long long seed, unsigned int purpose,
                                           int rows, int n_actions, int n_atoms,
                                           int* __restrict__ action, float* __restrict__ value) {
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= rows) return;
    const int e = env[b];
    if (e < 0) return;
    const Philox4 bits = philox_draw(seed, (unsigned int)e, step[b], purpose, 0u);
    int best = 0;
    float best_value = 0.0f;
    for (int a = 0; a < n_actions; ++a) {
        const float* p = probs + ((size_t)b * n_actions + a) * n_atoms;
        float total = 0.0f;
        for (int j = 0; j < n_atoms; ++j) total += p[j];
        const float threshold = philox_uniform(bits.v[a]) * total;
        float cdf = 0.0f;
        int pick = n_atoms - 1;
        for (int j = 0; j < n_atoms; ++j) {
            cdf += p[j];
            if (cdf > threshold) {
                pick = j;
                break;
            }
        }
        const float v = support[pick];
        value[(size_t)b * n_actions + a] = v;
        if (a == 0 || v > best_value) {
            best = a;
            best_value = v;
        }
    }
    action[b] = best;
}
