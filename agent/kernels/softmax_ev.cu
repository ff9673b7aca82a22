// Row softmax with the expectation and variance of a support: the C51 head (Q = sum z p) and
// the return head (mean and variance in ticks). Reference: agent/kernels/softmax_ev.py.
// One warp per row; rows of at most 128 entries (4 per lane).

#define SEV_MAX_PER_LANE 4

// logits (rows, n) float32; support (n). Out: probs (rows, n), mean (rows), var (rows).
extern "C" __global__ void softmax_ev_kernel(const float* __restrict__ logits,
                                             const float* __restrict__ support, int rows, int n,
                                             float* __restrict__ probs, float* __restrict__ mean,
                                             float* __restrict__ var) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const float* x = logits + (size_t)row * n;
    float v[SEV_MAX_PER_LANE];
    float m = -__int_as_float(0x7f800000);
#pragma unroll
    for (int i = 0; i < SEV_MAX_PER_LANE; ++i) {
        const int j = lane + 32 * i;
        v[i] = j < n ? x[j] : -__int_as_float(0x7f800000);
        m = fmaxf(m, v[i]);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < SEV_MAX_PER_LANE; ++i) {
        const int j = lane + 32 * i;
        v[i] = j < n ? expf(v[i] - m) : 0.0f;
        s += v[i];
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    const float inv = 1.0f / s;
    float m1 = 0.0f, m2 = 0.0f;
#pragma unroll
    for (int i = 0; i < SEV_MAX_PER_LANE; ++i) {
        const int j = lane + 32 * i;
        if (j < n) {
            const float p = v[i] * inv;
            probs[(size_t)row * n + j] = p;
            const float z = support[j];
            m1 += p * z;
            m2 += p * z * z;
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        m1 += __shfl_xor_sync(0xffffffffu, m1, off);
        m2 += __shfl_xor_sync(0xffffffffu, m2, off);
    }
    if (lane == 0) {
        mean[row] = m1;
        var[row] = fmaxf(m2 - m1 * m1, 0.0f);
    }
}
