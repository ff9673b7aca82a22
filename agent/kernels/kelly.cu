// Exact discrete Kelly sizing with the regime scale (kelly.cuh), one warp per row.
// Reference: agent/policy/kelly.py (kelly_size_ref). Compiled with --fmad=false.
//
// ret_probs (rows, bins) float32; bin_ticks (bins) float64; dir_src (rows) int32 with
// direction = dir_src - dir_offset; slot (rows) int32 (< 0: padded row, skipped); tick_value
// (slots) float64; regime (rows) float32; valid (rows) uint8; position (rows) int32; spread
// (rows, spread_stride) float32, the book's spread in ticks at column 0 of each row (the engine
// passes its raw feature rows, offset to the spread column).
// Out: target (rows) int32, size, f_star, mean_return (rows) float64.
#include "kelly.cuh"

extern "C" __global__ void kelly_kernel(const float* __restrict__ ret_probs,
                                        const double* __restrict__ bin_ticks, int bins,
                                        const int* __restrict__ dir_src, int dir_offset,
                                        const int* __restrict__ slot,
                                        const double* __restrict__ tick_value,
                                        const float* __restrict__ regime,
                                        const unsigned char* __restrict__ valid,
                                        const int* __restrict__ position,
                                        const float* __restrict__ spread, int spread_stride,
                                        int rows, double capital, double fee, double min_edge,
                                        double kelly_fraction,
                                        double scale_floor, int max_contracts,
                                        int* __restrict__ target, double* __restrict__ size_out,
                                        double* __restrict__ f_star_out,
                                        double* __restrict__ mean_out) {
    const int b = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (b >= rows) return;  // warp-uniform
    const int s = slot[b];
    if (s < 0) return;  // warp-uniform
    const KellyPolicy pol{capital, fee, min_edge, kelly_fraction, scale_floor, max_contracts};
    const KellyResult k = kelly_warp(ret_probs + (size_t)b * bins, bin_ticks, bins, dir_src[b] - dir_offset,
                                     tick_value[s], regime[b], spread[(size_t)b * spread_stride],
                                     valid[b] != 0, position[b], pol);
    if ((threadIdx.x & 31) == 0) {
        target[b] = k.target;
        size_out[b] = k.size;
        f_star_out[b] = k.f_star;
        mean_out[b] = k.mean;
    }
}
