// The trainer's kernels (agent/kernels/train.py): one C51 + return-head update of the network
// with no host synchronisation, and the acting forward of the rollouts.
//
// References: agent/model/network.py forward/backward, agent/model/losses.py (c51_project_ref,
// c51_loss_and_grad, return_loss_and_grad), agent/model/optim.py (clip_grad_norm, Adam) and
// agent/train/learner.py (double-DQN targets, Polyak or hard target sync), chained as
// Learner.update does; the act kernel's reference is Learner.explore / Learner.q_values.
//
// Parameters live in the packed layout of mamba_forward.cuh (the inference kernels' layout,
// A_log at BLK_A, the normalisation statistics 0 and 1: the trainer's windows are normalised
// already). Gradients, Adam's moments and the per-sample partial gradients use the same layout,
// so the optimiser is one elementwise pass over the buffer (padding holds zeros and stays so).
//
// One update, in stream order (a CUDA graph):
//   next_logits_kernel   (B, 2) blocks: online and target network on s' -> C51 logits
//   backward_kernel      B blocks: forward on s (keeping each layer's input), the loss of the
//                        sample and its gradient at both heads, then the backward pass with
//                        each layer's activations recomputed; the sample's gradient -> its
//                        row of `partial` (B, total), every entry written
//   reduce_kernel        grad[j] = sum_b partial[b, j] in a fixed order (deterministic), and
//                        per block the sum of squares of its entries (float64)
//   adam_kernel          global norm from those sums (fixed order), then, when finite, clip,
//                        Adam and the target sync; a non-finite norm leaves everything as it is
//   finish_kernel        counters (Adam steps, updates, skipped) and one stats record a update
//                        into a device ring the host reads once an epoch
//
// Windows are built on the device: market rows t-K+1..t of `feat` (rows, F - TR_AGENT),
// normalised, then the TR_AGENT agent columns of the sample.

#include "mamba_forward.cuh"
#include "softmax_ev.cuh"
#include "thompson.cuh"

#ifndef TR_AGENT
#define TR_AGENT 2
#endif
#define TR_FM (MF_F - TR_AGENT)
#define TR_WARPS MF_WARPS

static_assert(MF_A <= 4 && MF_ATOMS <= 128 && MF_NR <= 128, "heads sized for one warp a row");

// Statistics of one update in the device ring (TrainStats in agent/kernels/train.py).
struct TrainStats {
    float c51_loss;   // batch mean
    float ret_loss;   // mean over the samples with a label (0 when none)
    float grad_norm;  // global L2 norm before clipping (NaN/Inf: the update was skipped)
    int skipped;      // 1 when the gradient was not finite
};

// Counters (int64): Adam steps taken, updates applied, updates skipped, ring records written.
#define TR_ADAM_STEP 0
#define TR_UPDATES 1
#define TR_SKIPPED 2
#define TR_RING 3

// ---------------------------------------------------------------------------------------------
// Shared helpers

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

// C[m, n] (+)= sum_k A[m, k] * B[n, k] for m < M, n < N (A (M, K) lda, B (N, K) ldb): a product
// with a row-major weight (out, in) read along its rows.
__device__ __forceinline__ void tr_mm_nt(const float* A, int lda, const float* B, int ldb, int kdim, float* C,
                                         int ldc, int M, int N, bool accumulate) {
    for (int i = threadIdx.x; i < M * N; i += MF_THREADS) {
        const int m = i / N, n = i % N;
        const float* a = A + (size_t)m * lda;
        const float* b = B + (size_t)n * ldb;
        float acc = 0.0f;
        for (int k = 0; k < kdim; ++k) acc += a[k] * b[k];
        C[(size_t)m * ldc + n] = (accumulate ? C[(size_t)m * ldc + n] : 0.0f) + acc;
    }
}

// C[m, n] = sum_t A[t, m] * B[t, n] over t < T (A (T, M) lda, B (T, N) ldb): a weight gradient
// summed over the window's steps. C is global memory (the sample's partial gradient).
__device__ __forceinline__ void tr_mm_tn(const float* A, int lda, const float* B, int ldb, int T, float* C,
                                         int ldc, int M, int N) {
    for (int i = threadIdx.x; i < M * N; i += MF_THREADS) {
        const int m = i / N, n = i % N;
        float acc = 0.0f;
        for (int t = 0; t < T; ++t) acc += A[(size_t)t * lda + m] * B[(size_t)t * ldb + n];
        C[(size_t)m * ldc + n] = acc;
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

// ---------------------------------------------------------------------------------------------
// Next-state logits: blockIdx.y 0 = online, 1 = target network, on s'.

extern "C" __global__ void __launch_bounds__(MF_THREADS)
next_logits_kernel(const float* __restrict__ P_online, const float* __restrict__ P_target,
                   const float* __restrict__ feat, const long long* __restrict__ t_next,
                   const float* __restrict__ agent_next, float* __restrict__ q_online, float* __restrict__ q_target) {
    extern __shared__ __align__(16) float sm[];
    const int b = blockIdx.x;
    const float* P = blockIdx.y == 0 ? P_online : P_target;
    mf_forward_begin(P, sm);
    tr_load_window(feat, t_next[b], agent_next + (size_t)b * MF_K * TR_AGENT, sm + SM_ZX);
    mf_forward(P, sm);
    float* out = (blockIdx.y == 0 ? q_online : q_target) + (size_t)b * MF_NQ;
    for (int j = threadIdx.x; j < MF_NQ; j += MF_THREADS) out[j] = sm[SM_LOGITS + j];
}

// ---------------------------------------------------------------------------------------------
// Acting: the online network on E windows -> expected Q per action and the action (Thompson
// draw keyed by (seed, env, step), or the best expected Q when greedy).

extern "C" __global__ void __launch_bounds__(MF_THREADS)
act_kernel(const float* __restrict__ P, const float* __restrict__ support, const float* __restrict__ feat,
           const long long* __restrict__ t, const float* __restrict__ agent, const unsigned long long* __restrict__ step,
           unsigned long long seed, unsigned int purpose, int greedy, int* __restrict__ action, float* __restrict__ q) {
    extern __shared__ __align__(16) float sm[];
    __shared__ float row_q[MF_A];
    const int e = blockIdx.x;
    mf_forward_begin(P, sm);
    tr_load_window(feat, t[e], agent + (size_t)e * MF_K * TR_AGENT, sm + SM_ZX);
    mf_forward(P, sm);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float* probs = sm + SM_PROBS;
    if (warp < MF_A) {
        float mean, var;
        sev_row(sm + SM_LOGITS + warp * MF_ATOMS, support, MF_ATOMS, probs + warp * MF_ATOMS, mean, var);
        if (lane == 0) {
            row_q[warp] = mean;
            q[(size_t)e * MF_A + warp] = mean;
        }
    }
    __syncthreads();
    if (warp == 0) {
        int best = 0;
        if (greedy) {
            for (int a = 1; a < MF_A; ++a) {
                if (row_q[a] > row_q[best]) best = a;
            }
        } else {
            best = thompson_warp(probs, support, seed, purpose, (unsigned int)e, step[e], MF_A, MF_ATOMS, nullptr);
        }
        if (lane == 0) action[e] = best;
    }
}

// ---------------------------------------------------------------------------------------------
// The backward kernel's shared memory: offsets TB_* (floats) come from train_layout() in
// agent/kernels/train.py, the one definition of the layout:
//   TB_X window (K, F); TB_HS each layer's input (L, K, D); TB_HF the last step after the last
//   layer (D); TB_U pre-norm output u (K, D); TB_R its inverse RMS (K); TB_ZX in_proj output
//   (K, IP), later its gradient; TB_XBC silu(conv) = x, B, C (K, CD); TB_DT dt (K, H); TB_Y
//   y = ssm + D x (K, DI); TB_RG the gated norm's inverse RMS (K, G); TB_GH the residual
//   stream's gradient (K, D); TB_GO o (forward), go -> gy, later gu (K, DI); TB_GX o
//   (backward), gx | gB | gC -> gpre (K, max(CD, DI)); TB_GDT gdt (K, H); TB_M, TB_GM one
//   head's M = CB * Lam and gM (K, K); TB_GU its gU (K, P); TB_CB, TB_GCB C B^T and its gradient
//   per group (G, K, K); TB_CUM, TB_GCUM one head's cumulative dt A and its gradient (K); TB_GA
//   gA per head (H); TB_HEAD q and return logits; TB_GHEAD their gradients; TB_FEAT feat, fhat,
//   gfeat, fr (4 x D); TB_TGT the target distribution m (ATOMS); TB_SCRATCH (ATOMS).

// Layer l's forward from its input hs (K, D): u, r, zx, xbc, dt, y and rg into their regions.
// When out is not null, the layer's output rows [t0, K) are written there (ld D) as
// hs + o W_out^T (the residual added); o goes through TB_GO.
__device__ void tb_layer_forward(const float* __restrict__ P, int l, const float* hs, float* out, int t0,
                                 float* sm) {
    const float* blk = P + OFF_BLOCKS + (size_t)l * BLK_STRIDE;
    float* u = sm + TB_U;
    float* zx = sm + TB_ZX;
    float* xbc = sm + TB_XBC;
    float* dt = sm + TB_DT;
    float* y = sm + TB_Y;
    float* rg = sm + TB_RG;
    tr_rmsnorm_rows(hs, u, sm + TB_R, blk + BLK_NORM, MF_K);
    __syncthreads();
    mf_matmul<MF_TG>(u, MF_D, MF_D, blk + BLK_WIN_T, MF_IP, nullptr, zx, MF_IP, 0, MF_IP, 0, MF_K, false);
    __syncthreads();
    for (int i = threadIdx.x; i < MF_K * MF_CD; i += MF_THREADS) {
        const int t = i / MF_CD, c = i % MF_CD;
        float pre = __ldg(blk + BLK_CONV_B + c);
        for (int k = 0; k < MF_W; ++k) {
            const int src = t - MF_W + 1 + k;
            if (src >= 0) pre += __ldg(blk + BLK_CONV_W + c * MF_W + k) * zx[src * MF_IP + MF_DI + c];
        }
        xbc[i] = tr_silu(pre);
    }
    for (int i = threadIdx.x; i < MF_K * MF_H; i += MF_THREADS) {
        const int t = i / MF_H, h = i % MF_H;
        dt[i] = mf_softplus(zx[t * MF_IP + MF_DI + MF_CD + h] + __ldg(blk + BLK_DT_BIAS + h));
    }
    __syncthreads();
    // The scan from zero state, one (head, channel) per thread; y with the D skip.
    for (int idx = threadIdx.x; idx < MF_DI; idx += MF_THREADS) {
        const int h = idx / MF_P;
        const int g = h / (MF_H / MF_G);
        const float A = -expf(__ldg(blk + BLK_A + h));
        const float Dh = __ldg(blk + BLK_D + h);
        float state[MF_N];
#pragma unroll
        for (int n = 0; n < MF_N; ++n) state[n] = 0.0f;
        for (int t = 0; t < MF_K; ++t) {
            const float* row = xbc + t * MF_CD;
            const float xv = row[idx];
            const float dtv = dt[t * MF_H + h];
            const float decay = expf(dtv * A);
            const float dx = dtv * xv;
            const float* Bt = row + MF_DI + g * MF_N;
            const float* Ct = row + MF_DI + MF_G * MF_N + g * MF_N;
            float acc = 0.0f;
#pragma unroll
            for (int n = 0; n < MF_N; ++n) {
                state[n] = decay * state[n] + dx * Bt[n];
                acc += state[n] * Ct[n];
            }
            y[t * MF_DI + idx] = acc + Dh * xv;
        }
    }
    __syncthreads();
    // Gated RMSNorm statistics per (step, group); o = y silu(z) rg gnorm_w into TB_GO.
    {
        const int lane = threadIdx.x & 31;
        constexpr int GW = MF_DI / MF_G;
        float* o = sm + TB_GO;
        for (int rgi = threadIdx.x >> 5; rgi < MF_K * MF_G; rgi += TR_WARPS) {
            const int t = rgi / MF_G, g = rgi % MF_G;
            float ss = 0.0f;
            for (int i = g * GW + lane; i < (g + 1) * GW; i += 32) {
                const float v = y[t * MF_DI + i] * tr_silu(zx[t * MF_IP + i]);
                ss += v * v;
            }
            const float r = 1.0f / sqrtf(mf_warp_sum(ss) / (float)GW + MF_EPS);
            if (lane == 0) rg[rgi] = r;
            for (int i = g * GW + lane; i < (g + 1) * GW; i += 32) {
                o[t * MF_DI + i] = y[t * MF_DI + i] * tr_silu(zx[t * MF_IP + i]) * r * __ldg(blk + BLK_GNORM + i);
            }
        }
    }
    __syncthreads();
    if (out != nullptr) {
        for (int i = threadIdx.x; i < (MF_K - t0) * MF_D; i += MF_THREADS) out[t0 * MF_D + i] = hs[t0 * MF_D + i];
        __syncthreads();
        mf_matmul<MF_TG>(sm + TB_GO + t0 * MF_DI, MF_DI, MF_DI, blk + BLK_WOUT_T, MF_D, nullptr, out + t0 * MF_D,
                         MF_D, 0, MF_D, 0, MF_K - t0, true);
        __syncthreads();
    }
}

// Layer l's backward, its forward state in shared memory (tb_layer_forward) and TB_GH the
// gradient at its output: the layer's parameter gradients into G (the sample's partial row),
// TB_GH becomes the gradient at its input.
__device__ void tb_layer_backward(const float* __restrict__ P, int l, const float* hs, float* __restrict__ G,
                                  float* sm) {
    const float* blk = P + OFF_BLOCKS + (size_t)l * BLK_STRIDE;
    float* gblk = G + OFF_BLOCKS + (size_t)l * BLK_STRIDE;
    float* u = sm + TB_U;
    float* r = sm + TB_R;
    float* zx = sm + TB_ZX;
    float* xbc = sm + TB_XBC;
    float* dt = sm + TB_DT;
    float* y = sm + TB_Y;
    float* rg = sm + TB_RG;
    float* gh = sm + TB_GH;
    float* go = sm + TB_GO;
    float* gx = sm + TB_GX;
    float* gdt = sm + TB_GDT;
    const int lane = threadIdx.x & 31;
    constexpr int GW = MF_DI / MF_G;
    constexpr int HG = MF_H / MF_G;

    // o again (TB_GO held it; the backward needs that region for go): o into TB_GX.
    for (int i = threadIdx.x; i < MF_K * MF_DI; i += MF_THREADS) {
        const int t = i / MF_DI, c = i % MF_DI;
        gx[i] = y[i] * tr_silu(zx[t * MF_IP + c]) * rg[t * MF_G + c / GW] * __ldg(blk + BLK_GNORM + c);
    }
    __syncthreads();
    // gW_out^T (Di, D) = o^T gh; go = gh W_out (K, Di).
    tr_mm_tn(gx, MF_DI, gh, MF_D, MF_K, gblk + BLK_WOUT_T, MF_D, MF_DI, MF_D);
    for (int i = threadIdx.x; i < MF_K * MF_DI; i += MF_THREADS) {
        const int t = i / MF_DI, c = i % MF_DI;
        const float* w = blk + BLK_WOUT_T + (size_t)c * MF_D;
        float acc = 0.0f;
        for (int j = 0; j < MF_D; ++j) acc += gh[t * MF_D + j] * __ldg(w + j);
        go[i] = acc;
    }
    __syncthreads();
    // ggnorm_w = sum_t go vhat (vhat = o / gnorm_w, recomputed).
    for (int c = threadIdx.x; c < MF_DI; c += MF_THREADS) {
        float acc = 0.0f;
        for (int t = 0; t < MF_K; ++t) {
            acc += go[t * MF_DI + c] * y[t * MF_DI + c] * tr_silu(zx[t * MF_IP + c]) * rg[t * MF_G + c / GW];
        }
        gblk[BLK_GNORM + c] = acc;
    }
    __syncthreads();
    // Gated norm backward per (step, group): gv; gy = gv silu(z) -> TB_GO; gz = gv y silu'(z)
    // -> the z columns of TB_ZX.
    for (int rgi = threadIdx.x >> 5; rgi < MF_K * MF_G; rgi += TR_WARPS) {
        const int t = rgi / MF_G, g = rgi % MF_G;
        const float rr = rg[rgi];
        float dot = 0.0f;
        for (int i = g * GW + lane; i < (g + 1) * GW; i += 32) {
            const float vhat = y[t * MF_DI + i] * tr_silu(zx[t * MF_IP + i]) * rr;
            dot += go[t * MF_DI + i] * __ldg(blk + BLK_GNORM + i) * vhat;
        }
        dot = mf_warp_sum(dot) / (float)GW;
        for (int i = g * GW + lane; i < (g + 1) * GW; i += 32) {
            const float z = zx[t * MF_IP + i];
            const float gate = tr_silu(z);
            const float vhat = y[t * MF_DI + i] * gate * rr;
            const float gv = rr * (go[t * MF_DI + i] * __ldg(blk + BLK_GNORM + i) - vhat * dot);
            go[t * MF_DI + i] = gv * gate;
            zx[t * MF_IP + i] = gv * y[t * MF_DI + i] * tr_silu_grad(z);
        }
    }
    __syncthreads();
    // gD per head; C B^T per group; the gradient accumulators zeroed.
    for (int h = threadIdx.x; h < MF_H; h += MF_THREADS) {
        float acc = 0.0f;
        for (int t = 0; t < MF_K; ++t) {
            for (int p = 0; p < MF_P; ++p) acc += go[t * MF_DI + h * MF_P + p] * xbc[t * MF_CD + h * MF_P + p];
        }
        gblk[BLK_D + h] = acc;
        sm[TB_GA + h] = 0.0f;
    }
    for (int i = threadIdx.x; i < MF_G * MF_K * MF_K; i += MF_THREADS) {
        const int g = i / (MF_K * MF_K), t = (i / MF_K) % MF_K, s = i % MF_K;
        const float* C = xbc + t * MF_CD + MF_DI + MF_G * MF_N + g * MF_N;
        const float* B = xbc + s * MF_CD + MF_DI + g * MF_N;
        float acc = 0.0f;
        for (int n = 0; n < MF_N; ++n) acc += C[n] * B[n];
        sm[TB_CB + i] = acc;
        sm[TB_GCB + i] = 0.0f;
    }
    __syncthreads();
    // The scan's backward in its quadratic form (one chunk, zero initial state), head by head.
    float* M = sm + TB_M;
    float* gM = sm + TB_GM;
    float* gU = sm + TB_GU;
    float* cum = sm + TB_CUM;
    float* gcum = sm + TB_GCUM;
    for (int h = 0; h < MF_H; ++h) {
        const int g = h / HG;
        const float A = -expf(__ldg(blk + BLK_A + h));
        const float Dh = __ldg(blk + BLK_D + h);
        if (threadIdx.x == 0) {
            float c = 0.0f;
            for (int t = 0; t < MF_K; ++t) {
                c += dt[t * MF_H + h] * A;
                cum[t] = c;
            }
        }
        __syncthreads();
        for (int i = threadIdx.x; i < MF_K * MF_K; i += MF_THREADS) {
            const int t = i / MF_K, s = i % MF_K;
            float m = 0.0f, gm = 0.0f;
            if (s <= t) {
                m = sm[TB_CB + g * MF_K * MF_K + i] * expf(cum[t] - cum[s]);
                const float dts = dt[s * MF_H + h];
                for (int p = 0; p < MF_P; ++p) {
                    gm += go[t * MF_DI + h * MF_P + p] * dts * xbc[s * MF_CD + h * MF_P + p];
                }
            }
            M[i] = m;
            gM[i] = gm;
        }
        __syncthreads();
        // gU[s, p] = sum_{t >= s} M[t, s] gy[t, p]; gx = dt gU + D gy.
        for (int i = threadIdx.x; i < MF_K * MF_P; i += MF_THREADS) {
            const int s = i / MF_P, p = i % MF_P;
            float acc = 0.0f;
            for (int t = s; t < MF_K; ++t) acc += M[t * MF_K + s] * go[t * MF_DI + h * MF_P + p];
            gU[i] = acc;
            gx[s * MF_CD + h * MF_P + p] = dt[s * MF_H + h] * acc + Dh * go[s * MF_DI + h * MF_P + p];
        }
        // gCB += gM * Lam (Lam = M / CB where CB != 0: recomputed from cum instead).
        for (int i = threadIdx.x; i < MF_K * MF_K; i += MF_THREADS) {
            const int t = i / MF_K, s = i % MF_K;
            if (s <= t) sm[TB_GCB + g * MF_K * MF_K + i] += gM[i] * expf(cum[t] - cum[s]);
        }
        // gcum_t = sum_s S[t, s] - sum_t' S[t', t], S = gM * M.
        for (int t = threadIdx.x; t < MF_K; t += MF_THREADS) {
            float acc = 0.0f;
            for (int s = 0; s < MF_K; ++s) acc += gM[t * MF_K + s] * M[t * MF_K + s] - gM[s * MF_K + t] * M[s * MF_K + t];
            gcum[t] = acc;
        }
        __syncthreads();
        if (threadIdx.x == 0) {  // ga_r = sum_{t >= r} gcum_t, in place; gA += sum_r dt_r ga_r
            float acc = 0.0f, ga_sum = 0.0f;
            for (int t = MF_K - 1; t >= 0; --t) {
                acc += gcum[t];
                gcum[t] = acc;
                ga_sum += dt[t * MF_H + h] * acc;
            }
            sm[TB_GA + h] += ga_sum;
        }
        __syncthreads();
        // gdt[s] = sum_p gU[s, p] x[s, p] + A ga_s.
        for (int s = threadIdx.x; s < MF_K; s += MF_THREADS) {
            float acc = 0.0f;
            for (int p = 0; p < MF_P; ++p) acc += gU[s * MF_P + p] * xbc[s * MF_CD + h * MF_P + p];
            gdt[s * MF_H + h] = acc + A * gcum[s];
        }
        __syncthreads();
    }
    // gC[t] = sum_s gCB[t, s] B_s; gB[s] = sum_t gCB[t, s] C_t (per group); gA_log = gA A.
    for (int i = threadIdx.x; i < MF_K * MF_G * MF_N; i += MF_THREADS) {
        const int t = i / (MF_G * MF_N), g = (i / MF_N) % MF_G, n = i % MF_N;
        const float* gcb = sm + TB_GCB + g * MF_K * MF_K;
        float gc = 0.0f, gb = 0.0f;
        for (int s = 0; s < MF_K; ++s) {
            gc += gcb[t * MF_K + s] * xbc[s * MF_CD + MF_DI + g * MF_N + n];
            gb += gcb[s * MF_K + t] * xbc[s * MF_CD + MF_DI + MF_G * MF_N + g * MF_N + n];
        }
        gx[t * MF_CD + MF_DI + MF_G * MF_N + g * MF_N + n] = gc;
        gx[t * MF_CD + MF_DI + g * MF_N + n] = gb;
    }
    for (int h = threadIdx.x; h < MF_H; h += MF_THREADS) {
        gblk[BLK_A + h] = sm[TB_GA + h] * -expf(__ldg(blk + BLK_A + h));
    }
    __syncthreads();
    // gs = gdt sigmoid(s) -> the dt columns of TB_ZX; gpre = gxbc silu'(pre) in place (pre
    // recomputed from the conv input, which TB_ZX still holds).
    for (int i = threadIdx.x; i < MF_K * MF_H; i += MF_THREADS) {
        const int t = i / MF_H, h = i % MF_H;
        float* v = zx + t * MF_IP + MF_DI + MF_CD + h;
        *v = gdt[i] * tr_sigmoid(*v + __ldg(blk + BLK_DT_BIAS + h));
    }
    for (int i = threadIdx.x; i < MF_K * MF_CD; i += MF_THREADS) {
        const int t = i / MF_CD, c = i % MF_CD;
        float pre = __ldg(blk + BLK_CONV_B + c);
        for (int k = 0; k < MF_W; ++k) {
            const int src = t - MF_W + 1 + k;
            if (src >= 0) pre += __ldg(blk + BLK_CONV_W + c * MF_W + k) * zx[src * MF_IP + MF_DI + c];
        }
        gx[i] *= tr_silu_grad(pre);
    }
    __syncthreads();
    // gconv_b, gconv_w, gdt_bias.
    for (int c = threadIdx.x; c < MF_CD; c += MF_THREADS) {
        float gb = 0.0f;
        float gw[MF_W];
#pragma unroll
        for (int k = 0; k < MF_W; ++k) gw[k] = 0.0f;
        for (int t = 0; t < MF_K; ++t) {
            const float gp = gx[t * MF_CD + c];
            gb += gp;
#pragma unroll
            for (int k = 0; k < MF_W; ++k) {
                const int src = t - MF_W + 1 + k;
                if (src >= 0) gw[k] += gp * zx[src * MF_IP + MF_DI + c];
            }
        }
        gblk[BLK_CONV_B + c] = gb;
#pragma unroll
        for (int k = 0; k < MF_W; ++k) gblk[BLK_CONV_W + c * MF_W + k] = gw[k];
    }
    for (int h = threadIdx.x; h < MF_H; h += MF_THREADS) {
        float acc = 0.0f;
        for (int t = 0; t < MF_K; ++t) acc += zx[t * MF_IP + MF_DI + MF_CD + h];
        gblk[BLK_DT_BIAS + h] = acc;
    }
    __syncthreads();
    // gxbc_raw[t'] = sum_k gpre[t' + W - 1 - k] conv_w[k] -> the conv columns of TB_ZX.
    for (int i = threadIdx.x; i < MF_K * MF_CD; i += MF_THREADS) {
        const int t = i / MF_CD, c = i % MF_CD;
        float acc = 0.0f;
        for (int k = 0; k < MF_W; ++k) {
            const int dst = t + MF_W - 1 - k;
            if (dst < MF_K) acc += gx[dst * MF_CD + c] * __ldg(blk + BLK_CONV_W + c * MF_W + k);
        }
        zx[t * MF_IP + MF_DI + c] = acc;
    }
    __syncthreads();
    // TB_ZX is now d loss / d zxbcdt: gW_in^T (D, IP) = u^T gzx; gu = gzx W_in -> TB_GO.
    tr_mm_tn(u, MF_D, zx, MF_IP, MF_K, gblk + BLK_WIN_T, MF_IP, MF_D, MF_IP);
    tr_mm_nt(zx, MF_IP, blk + BLK_WIN_T, MF_IP, MF_IP, go, MF_D, MF_K, MF_D, false);
    __syncthreads();
    // gnorm_w = sum_t gu nhat; the residual's gradient gains the pre-norm's backward.
    for (int k = threadIdx.x; k < MF_D; k += MF_THREADS) {
        float acc = 0.0f;
        for (int t = 0; t < MF_K; ++t) acc += go[t * MF_D + k] * hs[t * MF_D + k] * r[t];
        gblk[BLK_NORM + k] = acc;
    }
    tr_rmsnorm_backward_rows(hs, r, go, blk + BLK_NORM, gh, MF_K, true);
    __syncthreads();
}

// The sample's loss and its gradients at the heads' logits (TB_HEAD -> TB_GHEAD): the C51
// cross-entropy of the taken action against the projected double-DQN target, and the return
// head's cross-entropy against the bin of the label when it has one. Warp 0; the others wait.
__device__ void tb_loss(const float* __restrict__ support, const float* qn_online, const float* qn_target,
                        int action, float reward, float discount, double label, int batch, float ret_weight,
                        float* sm, float* stats) {
    if ((threadIdx.x >> 5) != 0) return;
    const int lane = threadIdx.x & 31;
    constexpr int PER_Q = (MF_ATOMS + 31) / 32;
    constexpr int PER_R = (MF_NR + 31) / 32;
    float* m = sm + TB_TGT;
    float* scratch = sm + TB_SCRATCH;
    // a* = argmax_a Q_online(s', a), ties to the lowest action.
    int best = 0;
    float best_q = 0.0f;
    for (int a = 0; a < MF_A; ++a) {
        float mean, var;
        sev_row(qn_online + a * MF_ATOMS, support, MF_ATOMS, scratch, mean, var);
        if (a == 0 || mean > best_q) {
            best = a;
            best_q = mean;
        }
    }
    float mean, var;
    sev_row(qn_target + best * MF_ATOMS, support, MF_ATOMS, scratch, mean, var);
    __syncwarp();
    // Projection, kernel form: m_i = sum_j q_j clip(1 - |T_j - z_i| / dz, 0, 1).
    const float vmin = support[0], vmax = support[MF_ATOMS - 1];
    const float dz = (vmax - vmin) / (float)(MF_ATOMS - 1);
    for (int i = lane; i < MF_ATOMS; i += 32) {
        float acc = 0.0f;
        for (int j = 0; j < MF_ATOMS; ++j) {
            const float T = fminf(fmaxf(reward + discount * support[j], vmin), vmax);
            acc += scratch[j] * fminf(fmaxf(1.0f - fabsf(T - support[i]) / dz, 0.0f), 1.0f);
        }
        m[i] = acc;
    }
    __syncwarp();
    // Cross-entropy of the taken action's logits against m; gradient (p sum(m) - m) / B.
    const float* x = sm + TB_HEAD + action * MF_ATOMS;
    float v[PER_Q];
    float mx = -__int_as_float(0x7f800000);
#pragma unroll
    for (int k = 0; k < PER_Q; ++k) {
        const int i = lane + 32 * k;
        v[k] = i < MF_ATOMS ? x[i] : -__int_as_float(0x7f800000);
        mx = fmaxf(mx, v[k]);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float se = 0.0f, msum = 0.0f;
#pragma unroll
    for (int k = 0; k < PER_Q; ++k) {
        const int i = lane + 32 * k;
        if (i < MF_ATOMS) {
            se += expf(v[k] - mx);
            msum += m[i];
        }
    }
    se = mf_warp_sum(se);
    msum = mf_warp_sum(msum);
    const float lse = logf(se);
    float loss = 0.0f;
    float* gq = sm + TB_GHEAD;
    for (int i = lane; i < MF_NQ; i += 32) gq[i] = 0.0f;
    __syncwarp();
#pragma unroll
    for (int k = 0; k < PER_Q; ++k) {
        const int i = lane + 32 * k;
        if (i < MF_ATOMS) {
            const float logp = v[k] - mx - lse;
            loss -= m[i] * logp;
            gq[action * MF_ATOMS + i] = (expf(logp) * msum - m[i]) / (float)batch;
        }
    }
    loss = mf_warp_sum(loss);
    // Return head.
    const bool labelled = isfinite(label) && ret_weight > 0.0f;
    int bin = 0;
    if (labelled) {
        const double width = 2.0 * (double)MF_RET_MAX / (double)(MF_NR - 1);
        const double index = rint((label + (double)MF_RET_MAX) / width);
        bin = (int)fmin(fmax(index, 0.0), (double)(MF_NR - 1));
    }
    const float* xr = sm + TB_HEAD + MF_R4(MF_NQ);
    float w[PER_R];
    float mr = -__int_as_float(0x7f800000);
#pragma unroll
    for (int k = 0; k < PER_R; ++k) {
        const int i = lane + 32 * k;
        w[k] = i < MF_NR ? xr[i] : -__int_as_float(0x7f800000);
        mr = fmaxf(mr, w[k]);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mr = fmaxf(mr, __shfl_xor_sync(0xffffffffu, mr, off));
    float sr = 0.0f;
#pragma unroll
    for (int k = 0; k < PER_R; ++k) {
        const int i = lane + 32 * k;
        if (i < MF_NR) sr += expf(w[k] - mr);
    }
    const float lser = logf(mf_warp_sum(sr));
    float ret_loss = 0.0f;
    float* gr = sm + TB_GHEAD + MF_R4(MF_NQ);
#pragma unroll
    for (int k = 0; k < PER_R; ++k) {
        const int i = lane + 32 * k;
        if (i < MF_NR) {
            const float logp = w[k] - mr - lser;
            const float onehot = i == bin ? 1.0f : 0.0f;
            if (i == bin) ret_loss = -logp;
            gr[i] = labelled ? (expf(logp) - onehot) * ret_weight / (float)batch : 0.0f;
        }
    }
    ret_loss = mf_warp_sum(ret_loss);
    if (lane == 0) {
        stats[0] = loss;
        stats[1] = labelled ? ret_loss : 0.0f;
        stats[2] = labelled ? 1.0f : 0.0f;
    }
}

extern "C" __global__ void __launch_bounds__(MF_THREADS)
backward_kernel(const float* __restrict__ P, const float* __restrict__ support, const float* __restrict__ feat,
                const long long* __restrict__ t_obs, const float* __restrict__ agent_obs,
                const int* __restrict__ action, const float* __restrict__ reward, const float* __restrict__ discount,
                const double* __restrict__ label, const float* __restrict__ q_online, const float* __restrict__ q_target,
                float ret_weight, int total, float* __restrict__ partial, float* __restrict__ sample_stats) {
    extern __shared__ __align__(16) float sm[];
    const int b = blockIdx.x;
    const int batch = gridDim.x;
    float* G = partial + (size_t)b * total;
    for (int i = threadIdx.x; i < total; i += MF_THREADS) G[i] = 0.0f;
    float* hs = sm + TB_HS;
    tr_load_window(feat, t_obs[b], agent_obs + (size_t)b * MF_K * TR_AGENT, sm + TB_X);
    __syncthreads();
    mf_matmul<MF_TG>(sm + TB_X, MF_F, MF_F, P + OFF_EMB_WT, MF_D, P + OFF_EMB_B, hs, MF_D, 0, MF_D, 0, MF_K, false);
    __syncthreads();
    for (int l = 0; l < MF_L; ++l) {
        const bool last = l == MF_L - 1;
        float* out = last ? sm + TB_HF - (MF_K - 1) * MF_D : hs + (l + 1) * MF_K * MF_D;
        tb_layer_forward(P, l, hs + l * MF_K * MF_D, out, last ? MF_K - 1 : 0, sm);
    }
    // Final norm of the last step and the heads.
    float* feat_v = sm + TB_FEAT;
    float* fhat = feat_v + MF_R4(MF_D);
    float* gfeat = fhat + MF_R4(MF_D);
    float* fr = gfeat + MF_R4(MF_D);
    tr_rmsnorm_rows(sm + TB_HF, feat_v, fr, P + OFF_FINAL_NORM, 1);
    __syncthreads();
    for (int k = threadIdx.x; k < MF_D; k += MF_THREADS) fhat[k] = sm[TB_HF + k] * fr[0];
    for (int j = threadIdx.x; j < MF_NQ + MF_NR; j += MF_THREADS) {
        const bool q = j < MF_NQ;
        const int jj = q ? j : j - MF_NQ;
        const int n = q ? MF_NQ : MF_NR;
        const float* Wt = P + (q ? OFF_Q_WT : OFF_R_WT);
        float acc = __ldg(P + (q ? OFF_Q_B : OFF_R_B) + jj);
        for (int k = 0; k < MF_D; ++k) acc += feat_v[k] * __ldg(Wt + k * n + jj);
        sm[TB_HEAD + (q ? 0 : MF_R4(MF_NQ)) + jj] = acc;
    }
    __syncthreads();
    tb_loss(support, q_online + (size_t)b * MF_NQ, q_target + (size_t)b * MF_NQ, action[b], reward[b], discount[b],
            label[b], batch, ret_weight, sm, sample_stats + (size_t)b * 3);
    __syncthreads();
    // Heads' backward: weights, biases, gfeat; final norm.
    const float* gq = sm + TB_GHEAD;
    const float* gr = sm + TB_GHEAD + MF_R4(MF_NQ);
    for (int i = threadIdx.x; i < MF_D * MF_NQ; i += MF_THREADS) G[OFF_Q_WT + i] = feat_v[i / MF_NQ] * gq[i % MF_NQ];
    for (int i = threadIdx.x; i < MF_D * MF_NR; i += MF_THREADS) G[OFF_R_WT + i] = feat_v[i / MF_NR] * gr[i % MF_NR];
    for (int j = threadIdx.x; j < MF_NQ; j += MF_THREADS) G[OFF_Q_B + j] = gq[j];
    for (int j = threadIdx.x; j < MF_NR; j += MF_THREADS) G[OFF_R_B + j] = gr[j];
    for (int k = threadIdx.x; k < MF_D; k += MF_THREADS) {
        float acc = 0.0f;
        for (int j = 0; j < MF_NQ; ++j) acc += gq[j] * __ldg(P + OFF_Q_WT + k * MF_NQ + j);
        for (int j = 0; j < MF_NR; ++j) acc += gr[j] * __ldg(P + OFF_R_WT + k * MF_NR + j);
        gfeat[k] = acc;
        G[OFF_FINAL_NORM + k] = acc * fhat[k];
    }
    float* gh = sm + TB_GH;
    for (int i = threadIdx.x; i < MF_K * MF_D; i += MF_THREADS) gh[i] = 0.0f;
    __syncthreads();
    tr_rmsnorm_backward_rows(sm + TB_HF, fr, gfeat, P + OFF_FINAL_NORM, gh + (MF_K - 1) * MF_D, 1, false);
    __syncthreads();
    for (int l = MF_L - 1; l >= 0; --l) {
        if (l != MF_L - 1) tb_layer_forward(P, l, hs + l * MF_K * MF_D, nullptr, 0, sm);
        tb_layer_backward(P, l, hs + l * MF_K * MF_D, G, sm);
    }
    // Embedding.
    tr_mm_tn(sm + TB_X, MF_F, gh, MF_D, MF_K, G + OFF_EMB_WT, MF_D, MF_F, MF_D);
    for (int k = threadIdx.x; k < MF_D; k += MF_THREADS) {
        float acc = 0.0f;
        for (int t = 0; t < MF_K; ++t) acc += gh[t * MF_D + k];
        G[OFF_EMB_B + k] = acc;
    }
}

// ---------------------------------------------------------------------------------------------
// grad[j] = sum_b partial[b, j] (b in order); sumsq[blockIdx.x] = sum over the block's j of
// grad[j]^2 (float64, fixed tree). 256 threads a block.

extern "C" __global__ void __launch_bounds__(256)
reduce_kernel(const float* __restrict__ partial, int batch, int total, float* __restrict__ grad,
              double* __restrict__ sumsq) {
    __shared__ double part[256];
    const int j = blockIdx.x * 256 + threadIdx.x;
    double sq = 0.0;
    if (j < total) {
        float acc = 0.0f;
        for (int b = 0; b < batch; ++b) acc += partial[(size_t)b * total + j];
        grad[j] = acc;
        sq = (double)acc * (double)acc;
    }
    part[threadIdx.x] = sq;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) sumsq[blockIdx.x] = part[0];
}

// The global norm from the reduce blocks' sums (same order in every block), then clip, Adam
// and the target sync. target_mode: 0 none (the target is the online network), 1 Polyak, 2 hard
// copy every hard_every updates. 256 threads a block.
extern "C" __global__ void __launch_bounds__(256)
adam_kernel(float* __restrict__ params, float* __restrict__ target, float* __restrict__ m, float* __restrict__ v,
            const float* __restrict__ grad, const double* __restrict__ sumsq, int nsums, int total,
            const long long* __restrict__ counters, float lr, float beta1, float beta2, float eps, float max_norm,
            int target_mode, float rho, int hard_every, float* __restrict__ norm_out) {
    __shared__ double norm_s;
    if (threadIdx.x < 32) {
        double acc = 0.0;
        for (int i = threadIdx.x; i < nsums; i += 32) acc += sumsq[i];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (threadIdx.x == 0) norm_s = sqrt(acc);
    }
    __syncthreads();
    const double norm = norm_s;
    if (blockIdx.x == 0 && threadIdx.x == 0) *norm_out = (float)norm;
    if (!isfinite(norm)) return;
    const float scale = norm > (double)max_norm ? (float)((double)max_norm / (norm + 1e-6)) : 1.0f;
    const double step = (double)(counters[TR_ADAM_STEP] + 1);
    const float bc1 = (float)(1.0 - pow((double)beta1, step));
    const float bc2 = (float)(1.0 - pow((double)beta2, step));
    const bool hard = target_mode == 2 && (counters[TR_UPDATES] + 1) % hard_every == 0;
    const int j = blockIdx.x * 256 + threadIdx.x;
    if (j >= total) return;
    const float g = grad[j] * scale;
    float mj = m[j] * beta1;
    mj += (1.0f - beta1) * g;
    float vj = v[j] * beta2;
    vj += (1.0f - beta2) * (g * g);
    m[j] = mj;
    v[j] = vj;
    const float p = params[j] - (lr / bc1) * mj / (sqrtf(vj / bc2) + eps);
    params[j] = p;
    if (target_mode == 1) {
        float tj = target[j] * (1.0f - rho);
        tj += rho * p;
        target[j] = tj;
    } else if (hard) {
        target[j] = p;
    }
}

// Counters and the update's record in the ring (one warp).
extern "C" __global__ void finish_kernel(const float* __restrict__ sample_stats, int batch,
                                         const float* __restrict__ norm_in, long long* __restrict__ counters,
                                         TrainStats* __restrict__ ring, int ring_size) {
    float c51 = 0.0f, ret = 0.0f, labelled = 0.0f;
    for (int b = threadIdx.x; b < batch; b += 32) {
        c51 += sample_stats[b * 3];
        ret += sample_stats[b * 3 + 1];
        labelled += sample_stats[b * 3 + 2];
    }
    c51 = mf_warp_sum(c51);
    ret = mf_warp_sum(ret);
    labelled = mf_warp_sum(labelled);
    if (threadIdx.x != 0) return;
    const float norm = *norm_in;
    const bool ok = isfinite(norm);
    TrainStats s;
    s.c51_loss = c51 / (float)batch;
    s.ret_loss = labelled > 0.0f ? ret / labelled : 0.0f;
    s.grad_norm = norm;
    s.skipped = ok ? 0 : 1;
    ring[counters[TR_RING] % ring_size] = s;
    counters[TR_RING] += 1;
    if (ok) {
        counters[TR_ADAM_STEP] += 1;
        counters[TR_UPDATES] += 1;
    } else {
        counters[TR_SKIPPED] += 1;
    }
}
