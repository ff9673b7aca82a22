// The fused network forward alone (mamba_forward.cuh): one thread block per window, logits
// out. Reference: agent/model/network.py forward() (through agent/kernels/mamba_forward.py).
// The engine runs the same forward inside decide.cu; this kernel is its parity surface.
#include "mamba_forward.cuh"

// P: packed parameters; window (slots, K, F) raw features; slot (B) int32 (< 0: padded row).
// Out: q_logits (B, NQ), ret_logits (B, NR). Dynamic shared memory: MF_SHARED_FLOATS floats.
// MF_CL blocks a row (a cluster, rank r reading the share at P + r * MF_PSTRIDE).
extern "C" __global__ void MF_CLUSTER_DIMS MF_BOUNDS
mamba_forward_kernel(const float* __restrict__ P, const float* __restrict__ window,
                     const int* __restrict__ slot, float* __restrict__ q_logits,
                     float* __restrict__ ret_logits) {
    extern __shared__ __align__(16) float sm[];
    const int b = blockIdx.x / MF_CL;
    const int s = slot[b];
    if (s < 0) return;
#if MF_CL > 1
    P += (size_t)mf_rank() * MF_PSTRIDE;
#endif
    mf_forward_begin(P, sm);
    mf_load_window(P, window + (size_t)s * MF_K * MF_F, sm);
    if (!mf_forward(P, sm)) return;
    for (int j = threadIdx.x; j < MF_NQ + MF_NR; j += MF_THREADS) {
        if (j < MF_NQ) {
            q_logits[(size_t)b * MF_NQ + j] = sm[SM_LOGITS + j];
        } else {
            ret_logits[(size_t)b * MF_NR + j - MF_NQ] = sm[SM_LOGITS + MF_R4(MF_NQ) + j - MF_NQ];
        }
    }
}
