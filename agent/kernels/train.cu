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
//   backward_kernel      one block a multiprocessor (at most B), each taking samples b =
//                        block, block + grid, ...: the forward on s (each layer's input and
//                        state kept), the loss of the sample and its gradient at both heads,
//                        then the backward pass; the block's samples' gradients summed into its
//                        row of `partial` (grid, total), which stays in L2
//   reduce_kernel        grad[j] = sum over the rows of partial[., j] in a fixed order, and
//                        per block the sum of squares of its entries (float64)
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

// ---------------------------------------------------------------------------------------------
// The target's logits: blockIdx.y 0 = online network on s', 1 = target network on s', 2 (with
// Munchausen) = target network on s.

extern "C" __global__ void __launch_bounds__(MF_THREADS)
next_logits_kernel(const float* __restrict__ P_online, const float* __restrict__ P_target,
                   const float* __restrict__ feat, const long long* __restrict__ t_next,
                   const float* __restrict__ agent_next, const long long* __restrict__ t_obs,
                   const float* __restrict__ agent_obs, float* __restrict__ q_online, float* __restrict__ q_target,
                   float* __restrict__ q_target_now) {
    extern __shared__ __align__(16) float sm[];
    const int b = blockIdx.x, y = blockIdx.y;
    const float* P = y == 0 ? P_online : P_target;
    mf_forward_begin(P, sm);
    const long long t = y == 2 ? t_obs[b] : t_next[b];
    const float* agent = (y == 2 ? agent_obs : agent_next) + (size_t)b * MF_K * TR_AGENT;
    tr_load_window(feat, t, agent, sm + SM_ZX);
    mf_forward(P, sm);
    float* out = (y == 0 ? q_online : y == 1 ? q_target : q_target_now) + (size_t)b * MF_NQ;
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
        const int best = select_action_warp(greedy != 0, row_q, probs, support, seed, purpose, (unsigned int)e,
                                            step[e], MF_A, MF_ATOMS);
        if (lane == 0) action[e] = best;
    }
}

// G[k, j] += a[k] b[j] for k < MF_D, j < N (G global, row-major): each thread reads four of its
// entries before it writes any, so that four loads are in flight instead of one.
template <int N>
__device__ __forceinline__ void tb_add_outer(float* __restrict__ G, const float* a, const float* b) {
    constexpr int U = 4, n = MF_D * N;
    for (int base = threadIdx.x; base < n; base += U * MF_THREADS) {
        float g[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int i = base + u * MF_THREADS;
            g[u] = i < n ? G[i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int i = base + u * MF_THREADS;
            if (i < n) G[i] = g[u] + a[i / N] * b[i % N];
        }
    }
}

// One sample's forward, loss and backward; its gradient is added to G (the block's row).
__device__ void tb_sample(const float* __restrict__ P, const float* __restrict__ support,
                          const float* __restrict__ feat, const long long* __restrict__ t_obs,
                          const float* __restrict__ agent_obs, const int* __restrict__ action,
                          const float* __restrict__ reward, const float* __restrict__ discount,
                          const double* __restrict__ label, const float* __restrict__ q_online,
                          const float* __restrict__ q_target, float ret_weight, const Munch& mu, int b,
                          int batch, float* G, float* __restrict__ sample_stats, float* __restrict__ saved,
                          float* sm) {
    float* hs = sm + TB_HS;
    tr_load_window(feat, t_obs[b], agent_obs + (size_t)b * MF_K * TR_AGENT, sm + TB_X);
    __syncthreads();
    mf_matmul<mf_tile(MF_D, MF_K)>(sm + TB_X, MF_F, MF_F, P + OFF_EMB_WT, MF_D, P + OFF_EMB_B, hs, MF_D, 0, MF_D, 0,
                                   MF_K, false);
    __syncthreads();
    // The forward; every layer but the last leaves its state (TB_U .. TB_GH) in the sample's
    // slice of `saved` for the backward, which reads it back instead of recomputing it.
    float* keep = saved + (size_t)b * (MF_L - 1) * TB_STATE;
    for (int l = 0; l < MF_L; ++l) {
        const bool last = l == MF_L - 1;
        float* out = last ? sm + TB_HF - (MF_K - 1) * MF_D : hs + (l + 1) * MF_K * MF_D;
        tb_layer_forward(P, l, hs + l * MF_K * MF_D, out, last ? MF_K - 1 : 0, sm);
        if (!last) {
            tb_copy4(keep + (size_t)l * TB_STATE, sm + TB_U, TB_STATE);
            __syncthreads();  // copied before the next layer overwrites the state
        }
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
    Munch mub = mu;
    mub.qt_now = mu.qt_now + (size_t)b * MF_NQ;
    tb_loss(support, q_online + (size_t)b * MF_NQ, q_target + (size_t)b * MF_NQ, action[b], reward[b], discount[b],
            label[b], batch, ret_weight, mub, sm, sample_stats + (size_t)b * 3);
    __syncthreads();
    // Heads' backward: weights, biases, gfeat; final norm.
    const float* gq = sm + TB_GHEAD;
    const float* gr = sm + TB_GHEAD + MF_R4(MF_NQ);
    tb_add_outer<MF_NQ>(G + OFF_Q_WT, feat_v, gq);
    tb_add_outer<MF_NR>(G + OFF_R_WT, feat_v, gr);
    for (int j = threadIdx.x; j < MF_NQ; j += MF_THREADS) G[OFF_Q_B + j] += gq[j];
    for (int j = threadIdx.x; j < MF_NR; j += MF_THREADS) G[OFF_R_B + j] += gr[j];
    // gfeat: one warp a feature k, the lanes over the heads' outputs (coalesced weight rows).
    for (int k = threadIdx.x >> 5; k < MF_D; k += MF_WARPS) {
        const int lane = threadIdx.x & 31;
        float acc = 0.0f;
        for (int j = lane; j < MF_NQ; j += 32) acc += gq[j] * __ldg(P + OFF_Q_WT + k * MF_NQ + j);
        for (int j = lane; j < MF_NR; j += 32) acc += gr[j] * __ldg(P + OFF_R_WT + k * MF_NR + j);
        acc = mf_warp_sum(acc);
        if (lane == 0) {
            gfeat[k] = acc;
            G[OFF_FINAL_NORM + k] += acc * fhat[k];
        }
    }
    float* gh = sm + TB_GH;
    for (int i = threadIdx.x; i < MF_K * MF_D; i += MF_THREADS) gh[i] = 0.0f;
    __syncthreads();
    tr_rmsnorm_backward_rows(sm + TB_HF, fr, gfeat, P + OFF_FINAL_NORM, gh + (MF_K - 1) * MF_D, 1, false);
    __syncthreads();
    for (int l = MF_L - 1; l >= 0; --l) {
        if (l != MF_L - 1) {
            tb_copy4(sm + TB_U, keep + (size_t)l * TB_STATE, TB_STATE);
            __syncthreads();
        }
        tb_layer_backward(P, l, hs + l * MF_K * MF_D, G, l == MF_L - 1 ? MF_K - 1 : 0, sm);
    }
    // Embedding.
    tr_mm_tn(sm + TB_X, MF_F, gh, MF_D, MF_K, G + OFF_EMB_WT, MF_D, MF_F, MF_D);
    for (int k = threadIdx.x; k < MF_D; k += MF_THREADS) {
        float acc = 0.0f;
        for (int t = 0; t < MF_K; ++t) acc += gh[t * MF_D + k];
        G[OFF_EMB_B + k] += acc;
    }
}

extern "C" __global__ void __launch_bounds__(MF_THREADS)
backward_kernel(const float* __restrict__ P, const float* __restrict__ support, const float* __restrict__ feat,
                const long long* __restrict__ t_obs, const float* __restrict__ agent_obs,
                const int* __restrict__ action, const float* __restrict__ reward, const float* __restrict__ discount,
                const double* __restrict__ label, const float* __restrict__ q_online, const float* __restrict__ q_target,
                const float* __restrict__ q_target_now, int munchausen, float m_alpha, float m_tau,
                float m_clip, float ret_weight, int batch, int total, float* __restrict__ partial,
                float* __restrict__ sample_stats, float* __restrict__ saved) {
    extern __shared__ __align__(16) float sm[];
    const Munch mu{munchausen, m_alpha, m_tau, m_clip, q_target_now};
    float* G = partial + (size_t)blockIdx.x * total;
    for (int i = threadIdx.x; i < total; i += MF_THREADS) G[i] = 0.0f;
    for (int b = blockIdx.x; b < batch; b += gridDim.x) {
        __syncthreads();  // the previous sample's last reads of shared memory are done
        tb_sample(P, support, feat, t_obs, agent_obs, action, reward, discount, label, q_online, q_target,
                  ret_weight, mu, b, batch, G, sample_stats, saved, sm);
    }
}

// ---------------------------------------------------------------------------------------------
// grad[j] = sum_r partial[r, j] (rows in order); sumsq[blockIdx.x] = sum over the block's j of
// grad[j]^2 (float64, fixed tree). 256 threads a block.

extern "C" __global__ void __launch_bounds__(256)
reduce_kernel(const float* __restrict__ partial, int rows, int total, float* __restrict__ grad,
              double* __restrict__ sumsq) {
    __shared__ double part[256];
    const int j = blockIdx.x * 256 + threadIdx.x;
    double sq = 0.0;
    if (j < total) {
        float acc = 0.0f;
        for (int r = 0; r < rows; ++r) acc += partial[(size_t)r * total + j];
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
