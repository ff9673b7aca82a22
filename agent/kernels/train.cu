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
// already). Gradients and Adam's moments use the same layout, so the optimiser is one
// elementwise pass over the buffer (padding holds zeros and stays so).
//
// An update (FusedUpdate.enqueue in train.py) runs the network over the whole batch at once:
// every projection (embedding, in_proj, out_proj, the heads) and every weight gradient is one
// matrix product over the batch's B * K rows (cuBLAS), every norm a row kernel here, and only
// what runs along a window's steps (conv, scan, gated norm, their backward) a kernel with a
// block a window. Then, in stream order:
//   loss_kernel          a block a sample: the loss and its gradient at both heads' logits
//   sumsq_kernel         per block of 256 entries the sum of squares of the gradient (float64)
//   adam_kernel          global norm from those sums (fixed order), then, when finite, clip,
//                        Adam and the target sync; a non-finite norm leaves everything as it is
//   finish_kernel        counters (Adam steps, updates, skipped) and one stats record a update
//                        into a device ring the host reads once an epoch
//
// Windows are built on the device: market rows t-K+1..t of `feat` (rows, F - TR_AGENT),
// normalised, then the TR_AGENT agent columns of the sample.

#include "softmax_ev.cuh"
#include "thompson.cuh"
#include "train_layer.cuh"
#include "train_loss.cuh"

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

// Threads a block of the row kernels (a warp a row).
#define TR_ROW_THREADS 256
#define TR_DV ((MF_D + 31) / 32)

// ---------------------------------------------------------------------------------------------
// A pass's first rows, a warp TR_EMBED_ROWS rows (row i: step k = i % K of window b = i / K):
// the model input x (market row t[b] - K + 1 + k of feat, then the sample's TR_AGENT agent
// columns), kept in x_out when has_x (the backward's embedding gradient reads it); the residual
// stream's first value h = x W_emb + b_emb; the first block's pre-norm r = 1 / rms(h),
// u = h r w. The lanes hold x a feature each (32 at a time, every row's gathered at once) and
// hand it round by shuffles; lane l sums the outputs l, l + 32, ..., each weight it reads serving
// the warp's rows.
#define TR_EMBED_ROWS 4

extern "C" __global__ void __launch_bounds__(TR_ROW_THREADS)
embed_kernel(const float* __restrict__ P, const float* __restrict__ feat, const long long* __restrict__ t,
             const float* __restrict__ agent, float* __restrict__ x_out, int has_x, float* __restrict__ h,
             float* __restrict__ u, float* __restrict__ r, int rows) {
    const int lane = threadIdx.x & 31;
    const int i0 = (blockIdx.x * (TR_ROW_THREADS / 32) + (threadIdx.x >> 5)) * TR_EMBED_ROWS;
    if (i0 >= rows) return;
    const float* w_emb = P + OFF_EMB_WT;
    float acc[TR_EMBED_ROWS][TR_DV];
#pragma unroll
    for (int q = 0; q < TR_DV; ++q) {
        const int j = q * 32 + lane;
        const float bias = j < MF_D ? __ldg(P + OFF_EMB_B + j) : 0.0f;
#pragma unroll
        for (int e = 0; e < TR_EMBED_ROWS; ++e) acc[e][q] = bias;
    }
    for (int f0 = 0; f0 < MF_F; f0 += 32) {
        const int f = f0 + lane;
        float xv[TR_EMBED_ROWS];
#pragma unroll
        for (int e = 0; e < TR_EMBED_ROWS; ++e) {
            const int i = i0 + e;
            float v = 0.0f;
            if (i < rows && f < MF_F) {
                const long long bar = t[i / MF_K] - MF_K + 1 + i % MF_K;
                v = f < TR_FM ? feat[(size_t)bar * TR_FM + f] : agent[(size_t)i * TR_AGENT + (f - TR_FM)];
                if (has_x) x_out[(size_t)i * MF_F + f] = v;
            }
            xv[e] = v;
        }
        const int n = min(32, MF_F - f0);
        for (int c = 0; c < n; ++c) {
            float w[TR_DV];
#pragma unroll
            for (int q = 0; q < TR_DV; ++q) {
                const int j = q * 32 + lane;
                w[q] = j < MF_D ? __ldg(w_emb + (size_t)(f0 + c) * MF_D + j) : 0.0f;
            }
#pragma unroll
            for (int e = 0; e < TR_EMBED_ROWS; ++e) {
                const float xc = __shfl_sync(0xffffffffu, xv[e], c);
#pragma unroll
                for (int q = 0; q < TR_DV; ++q) acc[e][q] += xc * w[q];
            }
        }
    }
    const float* w = P + OFF_BLOCKS + BLK_NORM;
#pragma unroll
    for (int e = 0; e < TR_EMBED_ROWS; ++e) {
        const int i = i0 + e;
        if (i >= rows) break;
        float ss = 0.0f;
#pragma unroll
        for (int q = 0; q < TR_DV; ++q) ss += acc[e][q] * acc[e][q];
        const float inv = 1.0f / sqrtf(mf_warp_sum(ss) / (float)MF_D + MF_EPS);
        if (lane == 0) r[i] = inv;
#pragma unroll
        for (int q = 0; q < TR_DV; ++q) {
            const int j = q * 32 + lane;
            if (j < MF_D) {
                h[(size_t)i * MF_D + j] = acc[e][q];
                u[(size_t)i * MF_D + j] = acc[e][q] * inv * __ldg(w + j);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// RMSNorm of rows, a warp a row: x = a[i * a_every + a_first] (+ b[i]), written to h when
// has_h; r[i] = 1 / rms(x); u[i] = x * r[i] * w. The residual stream's sums (x + o W_out) land
// here, before the next block's norm.

extern "C" __global__ void __launch_bounds__(TR_ROW_THREADS)
norm_kernel(const float* __restrict__ a, int a_every, int a_first, const float* __restrict__ b, int has_b,
            float* __restrict__ h, int has_h, const float* __restrict__ w, float* __restrict__ u,
            float* __restrict__ r, int rows) {
    const int i = blockIdx.x * (TR_ROW_THREADS / 32) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (i >= rows) return;
    const float* ar = a + ((size_t)i * a_every + a_first) * MF_D;
    float x[TR_DV];
    float ss = 0.0f;
#pragma unroll
    for (int q = 0; q < TR_DV; ++q) {
        const int k = q * 32 + lane;
        float v = 0.0f;
        if (k < MF_D) {
            v = ar[k];
            if (has_b) v += b[(size_t)i * MF_D + k];
            if (has_h) h[(size_t)i * MF_D + k] = v;
        }
        x[q] = v;
        ss += v * v;
    }
    const float inv = 1.0f / sqrtf(mf_warp_sum(ss) / (float)MF_D + MF_EPS);
    if (lane == 0) r[i] = inv;
#pragma unroll
    for (int q = 0; q < TR_DV; ++q) {
        const int k = q * 32 + lane;
        if (k < MF_D) u[(size_t)i * MF_D + k] = x[q] * inv * __ldg(w + k);
    }
}

// RMSNorm backward of rows, a warp a row: g = g1[i] (+ g2[i]), nhat = x[i] r[i];
// gw_rows[i] = g nhat (the weight's gradient, summed over the rows outside);
// gh[i] = res(i) + r[i] (g w - nhat mean(g w nhat)), res(i) = res[i] (res_mode 1), res[i / K]
// in a window's last row and 0 elsewhere (res_mode 2: the last block's output is read at its last
// step only), 0 (res_mode 0). gh may be res itself (res_mode 1: the residual stream in place).

extern "C" __global__ void __launch_bounds__(TR_ROW_THREADS)
norm_backward_kernel(const float* __restrict__ x, const float* __restrict__ r, const float* __restrict__ g1,
                     const float* __restrict__ g2, int has_g2, const float* __restrict__ w, const float* res,
                     int res_mode, float* gh, float* __restrict__ gw_rows, int rows) {
    const int i = blockIdx.x * (TR_ROW_THREADS / 32) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (i >= rows) return;
    const float ri = r[i];
    float g[TR_DV], nh[TR_DV];
    float dot = 0.0f;
#pragma unroll
    for (int q = 0; q < TR_DV; ++q) {
        const int k = q * 32 + lane;
        g[q] = 0.0f;
        nh[q] = 0.0f;
        if (k < MF_D) {
            const size_t at = (size_t)i * MF_D + k;
            g[q] = g1[at] + (has_g2 ? g2[at] : 0.0f);
            nh[q] = x[at] * ri;
            gw_rows[at] = g[q] * nh[q];
            dot += g[q] * __ldg(w + k) * nh[q];
        }
    }
    dot = mf_warp_sum(dot) / (float)MF_D;
    const bool last = i % MF_K == MF_K - 1;
#pragma unroll
    for (int q = 0; q < TR_DV; ++q) {
        const int k = q * 32 + lane;
        if (k < MF_D) {
            const size_t at = (size_t)i * MF_D + k;
            float base = 0.0f;
            if (res_mode == 1) base = res[at];
            if (res_mode == 2 && last) base = res[(size_t)(i / MF_K) * MF_D + k];
            gh[at] = base + ri * (g[q] * __ldg(w + k) - nh[q] * dot);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A block's middle (tb_mid_forward), a block a window b: the in_proj output zx (B, K, IP) ->
// o (B, K - t0, DI), the rows >= t0; with save, y and rg of those rows too (the backward's).

// dst[i] = src[i] for i < n, global to shared memory: as float4 when VEC (n and both addresses
// multiples of 4 floats), the loads unrolled so that several are in flight at once.
template <bool VEC>
__device__ __forceinline__ void tb_load(float* dst, const float* __restrict__ src, int n) {
    if constexpr (VEC) {
        const float4* s4 = reinterpret_cast<const float4*>(src);
        float4* d4 = reinterpret_cast<float4*>(dst);
#pragma unroll 4
        for (int i = threadIdx.x; i < n / 4; i += MF_THREADS) d4[i] = __ldg(s4 + i);
    } else {
#pragma unroll 4
        for (int i = threadIdx.x; i < n; i += MF_THREADS) dst[i] = __ldg(src + i);
    }
}

// Row widths that keep a window's rows, and every window, 16-byte aligned.
#define TB_VEC_IP (MF_IP % 4 == 0)
#define TB_VEC_DI (MF_DI % 4 == 0)

extern "C" __global__ void __launch_bounds__(MF_THREADS)
mid_forward_kernel(const float* __restrict__ P, int layer, const float* __restrict__ zx, float* __restrict__ o,
                   int t0, int save, float* __restrict__ y_out, float* __restrict__ rg_out) {
    extern __shared__ __align__(16) float sm[];
    const int b = blockIdx.x, rows = MF_K - t0;
    const float* blk = P + OFF_BLOCKS + (size_t)layer * BLK_STRIDE;
    tb_load<TB_VEC_IP>(sm + TB_ZX, zx + (size_t)b * MF_K * MF_IP, MF_K * MF_IP);
    __syncthreads();
    tb_mid_forward(blk, sm, o + (size_t)b * rows * MF_DI, t0);
    if (!save) return;
    __syncthreads();
    for (int i = threadIdx.x; i < rows * MF_DI; i += MF_THREADS) {
        y_out[(size_t)b * rows * MF_DI + i] = sm[TB_Y + t0 * MF_DI + i];
    }
    for (int i = threadIdx.x; i < rows * MF_G; i += MF_THREADS) {
        rg_out[(size_t)b * rows * MF_G + i] = sm[TB_RG + t0 * MF_G + i];
    }
}

// Its backward (tb_mid_backward), a block a window: from zx, the saved y and rg and go (B,
// K - t0, DI), the gradient at the in_proj output gzx (B, K, IP) and the window's gradients of
// the block's small parameters, a row of gsmall (B, TB_SMALL) each.

extern "C" __global__ void __launch_bounds__(MF_THREADS)
mid_backward_kernel(const float* __restrict__ P, int layer, const float* __restrict__ zx,
                    const float* __restrict__ y_in, const float* __restrict__ rg_in, const float* __restrict__ go,
                    int t0, float* __restrict__ gzx, float* __restrict__ gsmall) {
    extern __shared__ __align__(16) float sm[];
    const int b = blockIdx.x, rows = MF_K - t0;
    const float* blk = P + OFF_BLOCKS + (size_t)layer * BLK_STRIDE;
    float* gs = gsmall + (size_t)b * TB_SMALL;
    for (int i = threadIdx.x; i < TB_SMALL; i += MF_THREADS) gs[i] = 0.0f;
    const float* in = zx + (size_t)b * MF_K * MF_IP;
    if constexpr (TB_VEC_IP && TB_VEC_DI) {  // z | conv inputs, raw dt: four columns at a time
#pragma unroll 4
        for (int i = threadIdx.x; i < MF_K * MF_IP / 4; i += MF_THREADS) {
            const int t = 4 * i / MF_IP, c = 4 * i % MF_IP;
            *reinterpret_cast<float4*>(sm + (c < MF_DI ? TB_Z + t * MF_DI + c : TB_XD + t * TB_LDXD + c - MF_DI)) =
                __ldg(reinterpret_cast<const float4*>(in) + i);
        }
    } else {
        for (int i = threadIdx.x; i < MF_K * MF_IP; i += MF_THREADS) {
            const int t = i / MF_IP, c = i % MF_IP;
            sm[c < MF_DI ? TB_Z + t * MF_DI + c : TB_XD + t * TB_LDXD + c - MF_DI] = __ldg(in + i);
        }
    }
    tb_load<TB_VEC_DI>(sm + TB_Y + t0 * MF_DI, y_in + (size_t)b * rows * MF_DI, rows * MF_DI);
    tb_load<false>(sm + TB_RG + t0 * MF_G, rg_in + (size_t)b * rows * MF_G, rows * MF_G);
    for (int i = threadIdx.x; i < t0 * MF_DI; i += MF_THREADS) sm[TB_GO + i] = 0.0f;
    tb_load<TB_VEC_DI>(sm + TB_GO + t0 * MF_DI, go + (size_t)b * rows * MF_DI, rows * MF_DI);
    __syncthreads();
    float* out = gzx + (size_t)b * MF_K * MF_IP;
    tb_mid_backward(blk, gs, out, t0, sm);
    for (int i = threadIdx.x; i < MF_K * TB_LDXD; i += MF_THREADS) {
        const int t = i / TB_LDXD, c = i % TB_LDXD;
        out[t * MF_IP + MF_DI + c] = sm[TB_XD + i];
    }
}

// ---------------------------------------------------------------------------------------------
// The loss, a block a sample b: the heads' logits (matrix products without their biases: q_s
// and r_s of the online network at s, qn_online / qn_target at s', qt_now the target network at
// s with Munchausen) -> the sample's losses (sample_stats) and the gradients at the logits gq, gr.

extern "C" __global__ void __launch_bounds__(MF_THREADS)
loss_kernel(const float* __restrict__ P, const float* __restrict__ P_target, const float* __restrict__ support,
            const float* __restrict__ q_s, const float* __restrict__ r_s, const float* __restrict__ qn_online,
            const float* __restrict__ qn_target, const float* __restrict__ qt_now, const int* __restrict__ action,
            const float* __restrict__ reward, const float* __restrict__ discount, const double* __restrict__ label,
            int munchausen, float m_alpha, float m_tau, float m_clip, float ret_weight, int batch,
            float* __restrict__ gq, float* __restrict__ gr, float* __restrict__ sample_stats) {
    extern __shared__ __align__(16) float sm[];
    const int b = blockIdx.x;
    float* qn = sm + TB_QN;  // online at s', target at s', target at s: MF_R4(MF_NQ) each
    constexpr int QS = MF_R4(MF_NQ);
    for (int j = threadIdx.x; j < MF_NQ; j += MF_THREADS) {
        const size_t at = (size_t)b * MF_NQ + j;
        sm[TB_HEAD + j] = q_s[at] + __ldg(P + OFF_Q_B + j);
        qn[j] = qn_online[at] + __ldg(P + OFF_Q_B + j);
        qn[QS + j] = qn_target[at] + __ldg(P_target + OFF_Q_B + j);
        if (munchausen) qn[2 * QS + j] = qt_now[at] + __ldg(P_target + OFF_Q_B + j);
    }
    for (int j = threadIdx.x; j < MF_NR; j += MF_THREADS) {
        sm[TB_HEAD + QS + j] = r_s[(size_t)b * MF_NR + j] + __ldg(P + OFF_R_B + j);
    }
    __syncthreads();
    const Munch mu{munchausen, m_alpha, m_tau, m_clip, qn + 2 * QS};
    tb_loss(support, qn, qn + QS, action[b], reward[b], discount[b], label[b], batch, ret_weight, mu, sm,
            sample_stats + (size_t)b * 3);
    __syncthreads();
    for (int j = threadIdx.x; j < MF_NQ; j += MF_THREADS) gq[(size_t)b * MF_NQ + j] = sm[TB_GHEAD + j];
    for (int j = threadIdx.x; j < MF_NR; j += MF_THREADS) gr[(size_t)b * MF_NR + j] = sm[TB_GHEAD + QS + j];
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
        const int best = select_action_warp(greedy != 0, row_q, probs, support, seed, purpose, (unsigned int)e,
                                            step[e], MF_A, MF_ATOMS);
        if (lane == 0) action[e] = best;
    }
}

// ---------------------------------------------------------------------------------------------
// sumsq[blockIdx.x] = sum over the block's 256 entries j of grad[j]^2 (float64, fixed tree).

extern "C" __global__ void __launch_bounds__(256)
sumsq_kernel(const float* __restrict__ grad, int total, double* __restrict__ sumsq) {
    __shared__ double part[256];
    const int j = blockIdx.x * 256 + threadIdx.x;
    const double g = j < total ? (double)grad[j] : 0.0;
    part[threadIdx.x] = g * g;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) sumsq[blockIdx.x] = part[0];
}

// The global norm from the sumsq blocks' sums (same order in every block), then clip, Adam
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
