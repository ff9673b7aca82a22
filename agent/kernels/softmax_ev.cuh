// Row softmax with the expectation and variance of a support, one warp per row: the C51 head
// (Q = sum z p) and the return head (mean and variance in ticks). Reference:
// agent/kernels/softmax_ev.py (softmax_ev_ref). Used by softmax_ev.cu and decide.cu.
#pragma once

#define SEV_MAX_PER_LANE 4  // rows of at most 128 entries

// x (n) logits; support (n); out: probs (n) (when not null). Every lane returns the row's mean
// and variance (the variance clamped at 0 against cancellation).
__device__ __forceinline__ void sev_row(const float* x, const float* __restrict__ support, int n,
                                        float* probs, float& mean, float& var) {
    const int lane = threadIdx.x & 31;
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
            probs[j] = p;
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
    mean = m1;
    var = fmaxf(m2 - m1 * m1, 0.0f);
}
