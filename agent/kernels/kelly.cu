// Exact discrete Kelly sizing with the regime scale (ALGORITHMS.md section 4, DESIGN section 7).
// Reference: agent/policy/kelly.py (kelly_size_ref); same algorithm in float64: safeguarded
// Newton on G'(f) = sum p R / (1 + f R) over f >= 0, at most 20 iterations.
//
// One thread per row. ret_probs (rows, bins) float32; bin_ticks (bins) float64;
// dir_src (rows) int32 with direction = dir_src - dir_offset (the engine passes the action
// index and 1: short/flat/long -> -1/0/+1); slot (rows) int32 (< 0: padded row, skipped);
// tick_value (slots) float64; regime (rows) float32; valid (rows) uint8; position (rows) int32.
// A row that is not valid keeps its position (no new order). Out: target (rows) int32,
// size, f_star, mean_return (rows) float64.

#define KELLY_MAX_BINS 64
#define KELLY_ITERATIONS 20
#define KELLY_TOL 1e-12

extern "C" __global__ void kelly_kernel(const float* __restrict__ ret_probs,
                                        const double* __restrict__ bin_ticks, int bins,
                                        const int* __restrict__ dir_src, int dir_offset,
                                        const int* __restrict__ slot,
                                        const double* __restrict__ tick_value,
                                        const float* __restrict__ regime,
                                        const unsigned char* __restrict__ valid,
                                        const int* __restrict__ position, int rows,
                                        double capital, double cost, double kelly_fraction,
                                        double scale_floor, int max_contracts,
                                        int* __restrict__ target, double* __restrict__ size_out,
                                        double* __restrict__ f_star_out,
                                        double* __restrict__ mean_out) {
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= rows) return;
    const int s = slot[b];
    if (s < 0) return;
    const int d = dir_src[b] - dir_offset;
    const double per_tick = (double)d * tick_value[s] / capital;
    double p[KELLY_MAX_BINS];
    double r[KELLY_MAX_BINS];
    double total = 0.0;
    for (int i = 0; i < bins; ++i) {
        p[i] = (double)ret_probs[(size_t)b * bins + i];
        r[i] = bin_ticks[i] * per_tick;
        total += p[i];
    }
    double mu = 0.0, second = 0.0, worst = __longlong_as_double(0x7ff0000000000000LL);
    if (total > 0.0) {
        for (int i = 0; i < bins; ++i) {
            p[i] /= total;
            mu += p[i] * r[i];
            second += p[i] * r[i] * r[i];
            if (p[i] > 0.0 && r[i] < worst) worst = r[i];
        }
    }
    double f = 0.0;
    if (d != 0 && mu > cost) {
        if (!(worst < 0.0)) {
            f = __longlong_as_double(0x7ff0000000000000LL);  // no losing bin: G grows without bound
        } else {
            double lo = 0.0, hi = -1.0 / worst;
            f = mu / second;
            if (!(f < hi)) f = 0.5 * hi;
            for (int it = 0; it < KELLY_ITERATIONS; ++it) {
                double g1 = 0.0, g2 = 0.0;
                for (int i = 0; i < bins; ++i) {
                    const double q = r[i] / (1.0 + f * r[i]);  // one division per bin
                    g1 += p[i] * q;
                    g2 -= p[i] * q * q;
                }
                if (g1 > 0.0) lo = f; else hi = f;
                double next = f - g1 / g2;
                if (next >= hi) next = 0.5 * (f + hi);
                else if (next <= lo) next = 0.5 * (f + lo);
                const bool done = fabs(next - f) <= KELLY_TOL * f;
                f = next;
                if (done) break;
            }
        }
    }
    const double size = fmin(fmax(kelly_fraction * f, 0.0), 1.0);
    double scale = (double)regime[b];
    if (!isfinite(scale)) scale = scale_floor;
    scale = fmin(fmax(scale, scale_floor), 1.0);
    const int ok = valid[b] != 0;
    target[b] = ok ? d * (int)floor(size * scale * (double)max_contracts) : position[b];
    size_out[b] = ok ? size : 0.0;
    f_star_out[b] = f;
    mean_out[b] = mu;
}
