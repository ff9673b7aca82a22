// Row softmax with the expectation and variance of a support (softmax_ev.cuh), one warp per
// row. Reference: agent/kernels/softmax_ev.py.
#include "softmax_ev.cuh"

// logits (rows, n) float32; support (n). Out: probs (rows, n), mean (rows), var (rows).
extern "C" __global__ void softmax_ev_kernel(const float* __restrict__ logits,
                                             const float* __restrict__ support, int rows, int n,
                                             float* __restrict__ probs, float* __restrict__ mean,
                                             float* __restrict__ var) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    float m1, v;
    sev_row(logits + (size_t)row * n, support, n, probs + (size_t)row * n, m1, v);
    if ((threadIdx.x & 31) == 0) {
        mean[row] = m1;
        var[row] = v;
    }
}
