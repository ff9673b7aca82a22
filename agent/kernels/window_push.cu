// Window push: per row, shift one instrument's K-bar window left by one bar and insert the
// new bar's raw feature row at K-1 (normalisation happens when the model reads the window, so
// that a hot-swapped model with other statistics reads the same raw history).
// Reference: agent/kernels/window_push.py (window_push_ref).
//
// window (slots, K, F) float32, in place; rows (B, F) float32; slot (B) int32 (< 0: padded
// row, skipped; slots must be distinct within one call); healthy (B) uint8.
// Out: valid (B) uint8 = healthy and every feature finite. Only valid rows are pushed.
// One block per row; dynamic shared memory: (K - 1) * F floats.

extern "C" __global__ void window_push_kernel(float* __restrict__ window,
                                              const float* __restrict__ rows,
                                              const int* __restrict__ slot,
                                              const unsigned char* __restrict__ healthy, int K,
                                              int F, unsigned char* __restrict__ valid) {
    extern __shared__ float keep[];
    const int b = blockIdx.x;
    const int s = slot[b];
    if (s < 0) return;
    const float* row = rows + (size_t)b * F;
    int bad = 0;
    for (int f = threadIdx.x; f < F; f += blockDim.x) bad |= !isfinite(row[f]);
    const int ok = !__syncthreads_or(bad) && healthy[b] != 0;
    if (threadIdx.x == 0) valid[b] = (unsigned char)ok;
    if (!ok) return;
    float* w = window + (size_t)s * K * F;
    const int n_keep = (K - 1) * F;
    for (int i = threadIdx.x; i < n_keep; i += blockDim.x) keep[i] = w[i + F];
    __syncthreads();
    for (int i = threadIdx.x; i < n_keep; i += blockDim.x) w[i] = keep[i];
    for (int f = threadIdx.x; f < F; f += blockDim.x) w[n_keep + f] = row[f];
}
