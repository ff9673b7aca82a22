// Exact discrete Kelly sizing with the regime scale (ALGORITHMS.md section 4, DESIGN section 7).
// Reference: agent/policy/kelly.py (kelly_size_ref); same algorithm in float64: safeguarded
// Newton on G'(f) = sum p R / (1 + f R) over f >= 0, at most 20 iterations. One warp per row,
// two bins a lane (sums by butterfly shuffles, so f* agrees with the reference to rounding).
// Cost gate: legs = |d - sign(position)| (opening 1, reversing 2, keeping 0); mu must exceed
// (legs * (spread / 2 * tick_value + fee) + min_edge * tick_value) / capital when legs > 0, else
// 0 (a spread that is negative or not finite never opens). Contracts: round to nearest, at least
// 1 once the gate passed, at most max_contracts. Used by kelly.cu and decide.cu.
#pragma once

#define KELLY_ITERATIONS 20
#define KELLY_TOL 1e-12

struct KellyPolicy {
    double capital, fee, min_edge, kelly_fraction, scale_floor;
    int max_contracts;
};

struct KellyResult {
    int target;
    double size, f_star, mean, scale;
};

__device__ __forceinline__ double kelly_warp_sum(double v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// One warp per row: lane l holds bins l and l + 32 (at most 64 bins). probs (bins) float32
// return-head probabilities; bin_ticks (bins) float64; d the direction (-1, 0, +1); regime the
// raw regime scale (clamped here; non-finite -> the floor); spread_ticks the decision book's
// spread; a row that is not valid keeps its position (no new order) and gets size 0. Every
// lane returns the same result.
__device__ __forceinline__ KellyResult kelly_warp(const float* probs, const double* __restrict__ bin_ticks,
                                                  int bins, int d, double tick_value, float regime,
                                                  float spread_ticks, bool valid, int position,
                                                  const KellyPolicy& pol) {
    const int lane = threadIdx.x & 31;
    const double per_tick = (double)d * tick_value / pol.capital;
    double p[2], r[2];
    double total = 0.0;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int i = lane + 32 * k;
        p[k] = i < bins ? (double)probs[i] : 0.0;
        r[k] = i < bins ? bin_ticks[i] * per_tick : 0.0;
        total += p[k];
    }
    total = kelly_warp_sum(total);
    double mu = 0.0, second = 0.0, worst = __longlong_as_double(0x7ff0000000000000LL);
    if (total > 0.0) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            p[k] /= total;
            mu += p[k] * r[k];
            second += p[k] * r[k] * r[k];
            if (p[k] > 0.0 && r[k] < worst) worst = r[k];
        }
        mu = kelly_warp_sum(mu);
        second = kelly_warp_sum(second);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) worst = fmin(worst, __shfl_xor_sync(0xffffffffu, worst, off));
    }
    const double spread = (double)spread_ticks;
    const int held = (position > 0) - (position < 0);
    const int legs = abs(d - held);
    const double leg = (spread >= 0.0 && isfinite(spread)) ? 0.5 * spread * tick_value + pol.fee
                                                           : __longlong_as_double(0x7ff0000000000000LL);
    const double required = legs > 0 ? ((double)legs * leg + pol.min_edge * tick_value) / pol.capital : 0.0;
    double f = 0.0;
    if (d != 0 && mu > required) {
        if (!(worst < 0.0)) {
            f = __longlong_as_double(0x7ff0000000000000LL);  // no losing bin: G grows without bound
        } else {
            double lo = 0.0, hi = -1.0 / worst;
            f = mu / second;
            if (!(f < hi)) f = 0.5 * hi;
            for (int it = 0; it < KELLY_ITERATIONS; ++it) {
                double g1 = 0.0, g2 = 0.0;
#pragma unroll
                for (int k = 0; k < 2; ++k) {
                    const double q = r[k] / (1.0 + f * r[k]);
                    g1 += p[k] * q;
                    g2 -= p[k] * q * q;
                }
                g1 = kelly_warp_sum(g1);
                g2 = kelly_warp_sum(g2);
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
    const double size = fmin(fmax(pol.kelly_fraction * f, 0.0), 1.0);
    double scale = (double)regime;
    if (!isfinite(scale)) scale = pol.scale_floor;
    scale = fmin(fmax(scale, pol.scale_floor), 1.0);
    int contracts = 0;
    if (size > 0.0 && pol.max_contracts > 0) {
        contracts = (int)floor(size * scale * (double)pol.max_contracts + 0.5);
        contracts = min(max(contracts, 1), pol.max_contracts);
    }
    KellyResult out;
    out.target = valid ? d * contracts : position;
    out.size = valid ? size : 0.0;
    out.f_star = f;
    out.mean = mu;
    out.scale = scale;
    return out;
}
