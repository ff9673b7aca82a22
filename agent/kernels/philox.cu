// Raw Philox4x32-10 block function over many counters: the known-answer and parity test hook.
#include "philox.cuh"

extern "C" __global__ void philox4x32_kernel(const unsigned int* __restrict__ counters,
                                             const unsigned int* __restrict__ keys,
                                             unsigned int* __restrict__ out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    Philox4 c;
#pragma unroll
    for (int w = 0; w < 4; ++w) c.v[w] = counters[4 * i + w];
    const Philox4 r = philox4x32_10(c, keys[2 * i], keys[2 * i + 1]);
#pragma unroll
    for (int w = 0; w < 4; ++w) out[4 * i + w] = r.v[w];
}
