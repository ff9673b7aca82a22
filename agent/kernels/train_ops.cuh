// The trainer's block-level building blocks (train.cu): window loads, matrix products shaped for
// the backward pass, row RMSNorm and its backward. One thread block works on one window, every
// function is called by all of its MF_THREADS threads. Needs mamba_forward.cuh's macros.
#pragma once
#include "mamba_forward.cuh"

#ifndef TR_AGENT
#define TR_AGENT 2
#endif
#define TR_FM (MF_F - TR_AGENT)
#define TR_WARPS MF_WARPS

static_assert(MF_A <= 4 && MF_ATOMS <= 128 && MF_NR <= 128, "heads sized for one warp a row");

__device__ __forceinline__ float tr_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float tr_silu(float x) { return x * tr_sigmoid(x); }
__device__ __forceinline__ float tr_silu_grad(float x) {
    const float s = tr_sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}

// The normalised model input of decision bar t (K, F) into dst.
__device__ __forceinline__ void tr_load_window(const float* __restrict__ feat, long long t,
                                               const float* __restrict__ agent, float* dst) {
    for (int i = threadIdx.x; i < MF_K * MF_F; i += MF_THREADS) {
        const int k = i / MF_F, f = i % MF_F;
        dst[i] = f < TR_FM ? feat[(size_t)(t - MF_K + 1 + k) * TR_FM + f] : agent[k * TR_AGENT + (f - TR_FM)];
    }
}

// Lane i ends with the sum over the warp's lanes of v[i] (32 values a lane, 31 shuffles): each
// round O (16, 8, .., 1) a lane keeps the half of its values its partner does not and adds the
// partner's copy of them. A template a round, so that every index is static (registers).
template <int O>
__device__ __forceinline__ void tr_transpose_round(float (&v)[32], int lane) {
    const bool upper = (lane & O) != 0;
#pragma unroll
    for (int i = 0; i < O; ++i) {
        const float send = upper ? v[i] : v[i + O];
        const float keep = upper ? v[i + O] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
    if constexpr (O > 1) tr_transpose_round<O / 2>(v, lane);
}

__device__ __forceinline__ float tr_transpose_sum(float (&v)[32]) {
    tr_transpose_round<16>(v, threadIdx.x & 31);
    return v[0];
}

// C[t, r] = sum_j A[t, j] * W[r, j] for t0 <= t < MF_K, r < R, and 0 for t < t0: A (K, KD) in
// shared memory (ld lda), W a row-major (R, KD) weight in global memory. One warp a weight row: the lanes read it in
// coalesced passes of 32 and keep every step's partial sum, then reduce them across lanes in
// one transposing pass (tr_transpose_sum), lane t writing step t.
template <int KD>
__device__ __forceinline__ void tr_mm_rows(const float* A, int lda, const float* __restrict__ W, int R, float* C,
                                           int ldc, int t0) {
    constexpr int PASSES = (KD + 31) / 32;
    const int lane = threadIdx.x & 31;
    for (int r = threadIdx.x >> 5; r < R; r += TR_WARPS) {
        float w[PASSES];
#pragma unroll
        for (int q = 0; q < PASSES; ++q) {
            const int j = q * 32 + lane;
            w[q] = j < KD ? __ldg(W + (size_t)r * KD + j) : 0.0f;
        }
        for (int t0 = 0; t0 < MF_K; t0 += 32) {
            float acc[32];
#pragma unroll
            for (int i = 0; i < 32; ++i) {
                const int t = t0 + i;
                float a = 0.0f;
                if (t < MF_K && t >= t0) {
#pragma unroll
                    for (int q = 0; q < PASSES; ++q) {
                        const int j = q * 32 + lane;
                        if (j < KD) a += A[t * lda + j] * w[q];
                    }
                }
                acc[i] = a;
            }
            const float total = tr_transpose_sum(acc);
            const int t = t0 + lane;
            if (t < MF_K) C[t * ldc + r] = total;
        }
    }
}

// C[m, n] += sum_t A[t, m] * B[t, n] over t < T (A (T, M) lda, B (T, N) ldb, both in shared
// memory): a weight gradient summed over the window's steps, added to global memory (the block's
// row of partial gradients). Work items own 4 x 4 outputs (float4 loads of both operands and
// float4 read-modify-writes of C: M, N, lda, ldb and ldc divisible by 4), or 1 x 4 where 4 x 4
// leaves threads idle; other shapes one output an item.
template <int RM>
__device__ __forceinline__ void tr_mm_tn_tiles(const float* A, int lda, const float* B, int ldb, int T, float* C,
                                               int ldc, int M, int N) {
    const int nb = N / 4;
    for (int item = threadIdx.x; item < (M / RM) * nb; item += MF_THREADS) {
        const int m = (item / nb) * RM, n = (item % nb) * 4;
        float acc[RM][4] = {};
        for (int t = 0; t < T; ++t) {
            const float4 b = *reinterpret_cast<const float4*>(B + (size_t)t * ldb + n);
            float av[RM];
            if constexpr (RM == 4) {
                const float4 a = *reinterpret_cast<const float4*>(A + (size_t)t * lda + m);
                av[0] = a.x;
                av[1] = a.y;
                av[2] = a.z;
                av[3] = a.w;
            } else {
                av[0] = A[(size_t)t * lda + m];
            }
#pragma unroll
            for (int i = 0; i < RM; ++i) {
                acc[i][0] += av[i] * b.x;
                acc[i][1] += av[i] * b.y;
                acc[i][2] += av[i] * b.z;
                acc[i][3] += av[i] * b.w;
            }
        }
#pragma unroll
        for (int i = 0; i < RM; ++i) {
            float4* c = reinterpret_cast<float4*>(C + (size_t)(m + i) * ldc + n);
            float4 v = *c;
            v.x += acc[i][0];
            v.y += acc[i][1];
            v.z += acc[i][2];
            v.w += acc[i][3];
            *c = v;
        }
    }
}

__device__ __forceinline__ void tr_mm_tn(const float* A, int lda, const float* B, int ldb, int T, float* C,
                                         int ldc, int M, int N) {
    if (((M | N | lda | ldb | ldc) & 3) == 0) {
        if ((M / 4) * (N / 4) >= MF_THREADS) {
            tr_mm_tn_tiles<4>(A, lda, B, ldb, T, C, ldc, M, N);
        } else {
            tr_mm_tn_tiles<1>(A, lda, B, ldb, T, C, ldc, M, N);
        }
        return;
    }
    for (int i = threadIdx.x; i < M * N; i += MF_THREADS) {
        const int m = i / N, n = i % N;
        float acc = 0.0f;
        for (int t = 0; t < T; ++t) acc += A[(size_t)t * lda + m] * B[(size_t)t * ldb + n];
        C[(size_t)m * ldc + n] += acc;
    }
}

// Rows t of `in` (ld MF_D): inverse RMS into r[t]; out[t] = in[t] * r[t] * w (when out is not null).
__device__ __forceinline__ void tr_rmsnorm_rows(const float* in, float* out, float* r, const float* __restrict__ w,
                                                int rows) {
    const int lane = threadIdx.x & 31;
    for (int t = threadIdx.x >> 5; t < rows; t += TR_WARPS) {
        const float* x = in + t * MF_D;
        float ss = 0.0f;
        for (int k = lane; k < MF_D; k += 32) ss += x[k] * x[k];
        const float inv = 1.0f / sqrtf(mf_warp_sum(ss) / (float)MF_D + MF_EPS);
        if (lane == 0) r[t] = inv;
        if (out != nullptr) {
            for (int k = lane; k < MF_D; k += 32) out[t * MF_D + k] = x[k] * inv * __ldg(w + k);
        }
    }
}

// RMSNorm backward of rows: for each row t, with nhat = x * r[t], g = gin * w:
// gout[t] (+)= r[t] * (g - nhat * mean(g * nhat)).
__device__ __forceinline__ void tr_rmsnorm_backward_rows(const float* x, const float* r, const float* gin,
                                                         const float* __restrict__ w, float* gout, int rows,
                                                         bool accumulate) {
    const int lane = threadIdx.x & 31;
    for (int t = threadIdx.x >> 5; t < rows; t += TR_WARPS) {
        float dot = 0.0f;
        for (int k = lane; k < MF_D; k += 32) dot += gin[t * MF_D + k] * __ldg(w + k) * x[t * MF_D + k] * r[t];
        dot = mf_warp_sum(dot) / (float)MF_D;
        for (int k = lane; k < MF_D; k += 32) {
            const float nh = x[t * MF_D + k] * r[t];
            const float v = r[t] * (gin[t * MF_D + k] * __ldg(w + k) - nh * dot);
            gout[t * MF_D + k] = (accumulate ? gout[t * MF_D + k] : 0.0f) + v;
        }
    }
}

