// The trainer's per-sample loss at the heads (train.cu). Reference: agent/model/losses.py
// (c51_project_ref, c51_loss_and_grad, return_loss_and_grad) and the double-DQN target of
// agent/train/learner.py.
#pragma once
#include "softmax_ev.cuh"
#include "train_ops.cuh"

// The sample's loss and its gradients at the heads' logits (TB_HEAD -> TB_GHEAD): the C51
// cross-entropy of the taken action against the projected double-DQN target, and the return
// head's cross-entropy against the bin of the label when it has one. Every thread calls it: warps
// work on separate rows at once (online Q of each action, the target network's distribution of
// each action, the taken action's log-softmax, the return head), then the projection spreads over
// the block. TB_SCRATCH: A target distributions, then log p of the taken action, then the shifted
// atoms T (ATOMS each).
// After the projection into TB_TGT: the cross-entropy of the taken action's logits (log p in
// TB_SCRATCH after the A distributions) against m and its gradient (p sum(m) - m) / B.
__device__ void tb_cross_entropy(int action, int batch, float* sm, float* stats, float& msum_s) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float* m = sm + TB_TGT;
    const float* logp = sm + TB_SCRATCH + MF_A * MF_ATOMS;
    __syncthreads();
    if (warp == 0) {
        float loss = 0.0f, msum = 0.0f;
        for (int i = lane; i < MF_ATOMS; i += 32) {
            loss -= m[i] * logp[i];
            msum += m[i];
        }
        loss = mf_warp_sum(loss);
        msum = mf_warp_sum(msum);
        if (lane == 0) {
            msum_s = msum;
            stats[0] = loss;
        }
    }
    __syncthreads();
    float* gq = sm + TB_GHEAD;
    for (int i = threadIdx.x; i < MF_NQ; i += MF_THREADS) {
        const int a = i / MF_ATOMS, k = i % MF_ATOMS;
        gq[i] = a == action ? (expf(logp[k]) * msum_s - m[k]) / (float)batch : 0.0f;
    }
}


// Munchausen (Munch.munchausen): the target is instead the pi(.|s')-mixture of the target
// network's next-state distributions, each shifted by the reward, the bonus alpha * clip(tau log
// pi(a|s), clip_low, 0) and the discounted z - tau log pi(a'|s'), pi = softmax(Q_target / tau);
// ``qt_now`` holds the target network's logits at s. Reference: munchausen_project.
struct Munch {
    int munchausen;
    float alpha, tau, clip_low;
    const float* qt_now;
};

// tau log pi(a) (A) of softmax(q / tau), in the tau-scaled log-sum-exp form.
__device__ __forceinline__ void tb_tau_log_pi(const float* q, float tau, float* out) {
    float mx = q[0];
    for (int a = 1; a < MF_A; ++a) mx = fmaxf(mx, q[a]);
    float se = 0.0f;
    for (int a = 0; a < MF_A; ++a) se += expf((q[a] - mx) / tau);
    const float lse = tau * logf(se);
    for (int a = 0; a < MF_A; ++a) out[a] = q[a] - mx - lse;
}

__device__ void tb_loss(const float* __restrict__ support, const float* qn_online, const float* qn_target,
                        int action, float reward, float discount, double label, int batch, float ret_weight,
                        const Munch& mu, float* sm, float* stats) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    constexpr int PER_R = (MF_NR + 31) / 32;
    float* m = sm + TB_TGT;
    float* probs = sm + TB_SCRATCH;                  // (A, ATOMS) target distributions
    float* logp = probs + MF_A * MF_ATOMS;           // (ATOMS) log p of the taken action
    float* shifted = logp + MF_ATOMS;                // (A, ATOMS) T_{a', j} (double DQN: row 0)
    __shared__ float q_next[MF_A];   // double DQN: online Q at s'; Munchausen: target Q at s'
    __shared__ float q_now[MF_A];    // Munchausen: target Q at s
    __shared__ float tlp_next[MF_A];
    __shared__ float pi_next[MF_A];
    __shared__ float msum_s;
    static_assert(MF_A + 2 <= TR_WARPS, "a warp a row");
    if (warp < MF_A) {  // online network at s' (double DQN) or target network at s (Munchausen)
        float mean, var;
        const float* row = (mu.munchausen ? mu.qt_now : qn_online) + warp * MF_ATOMS;
        sev_row(row, support, MF_ATOMS, probs + warp * MF_ATOMS, mean, var);
        if (lane == 0) (mu.munchausen ? q_now : q_next)[warp] = mean;
    }
    __syncthreads();
    if (warp < MF_A) {  // target network at s': every action's distribution
        float mean, var;
        sev_row(qn_target + warp * MF_ATOMS, support, MF_ATOMS, probs + warp * MF_ATOMS, mean, var);
        if (mu.munchausen && lane == 0) q_next[warp] = mean;
    } else if (warp == MF_A) {  // log-softmax of the taken action's logits
        const float* x = sm + TB_HEAD + action * MF_ATOMS;
        float mx = -__int_as_float(0x7f800000);
        for (int i = lane; i < MF_ATOMS; i += 32) mx = fmaxf(mx, x[i]);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        float se = 0.0f;
        for (int i = lane; i < MF_ATOMS; i += 32) se += expf(x[i] - mx);
        const float lse = logf(mf_warp_sum(se));
        for (int i = lane; i < MF_ATOMS; i += 32) logp[i] = x[i] - mx - lse;
    } else if (warp == MF_A + 1) {  // the return head
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
                const float lp = w[k] - mr - lser;
                if (i == bin) ret_loss = -lp;
                gr[i] = labelled ? (expf(lp) - (i == bin ? 1.0f : 0.0f)) * ret_weight / (float)batch : 0.0f;
            }
        }
        ret_loss = mf_warp_sum(ret_loss);
        if (lane == 0) {
            stats[1] = labelled ? ret_loss : 0.0f;
            stats[2] = labelled ? 1.0f : 0.0f;
        }
    }
    const float vmin = support[0], vmax = support[MF_ATOMS - 1];
    const float dz = (vmax - vmin) / (float)(MF_ATOMS - 1);
    if (!mu.munchausen) {
        for (int j = threadIdx.x; j < MF_ATOMS; j += MF_THREADS) {
            shifted[j] = fminf(fmaxf(reward + discount * support[j], vmin), vmax);
        }
        __syncthreads();
        // a* = argmax_a Q_online(s', a), ties to the lowest action; projection, kernel form:
        // m_i = sum_j q_j clip(1 - |T_j - z_i| / dz, 0, 1), q = the target network's row of a*.
        int best = 0;
        for (int a = 1; a < MF_A; ++a) {
            if (q_next[a] > q_next[best]) best = a;
        }
        const float* q = probs + best * MF_ATOMS;
        for (int i = threadIdx.x; i < MF_ATOMS; i += MF_THREADS) {
            const float zi = support[i];
            float acc = 0.0f;
            for (int j = 0; j < MF_ATOMS; ++j) {
                acc += q[j] * fminf(fmaxf(1.0f - fabsf(shifted[j] - zi) / dz, 0.0f), 1.0f);
            }
            m[i] = acc;
        }
        return tb_cross_entropy(action, batch, sm, stats, msum_s);
    }
    __shared__ float bonus_s;
    __syncthreads();  // every action's target Q at s' and s
    if (threadIdx.x == 0) {
        float tlp_now[MF_A];
        tb_tau_log_pi(q_now, mu.tau, tlp_now);
        bonus_s = mu.alpha * fminf(fmaxf(tlp_now[action], mu.clip_low), 0.0f);
        tb_tau_log_pi(q_next, mu.tau, tlp_next);
        for (int a = 0; a < MF_A; ++a) pi_next[a] = expf(tlp_next[a] / mu.tau);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < MF_A * MF_ATOMS; i += MF_THREADS) {
        const int a = i / MF_ATOMS, j = i % MF_ATOMS;
        shifted[i] = fminf(fmaxf(reward + bonus_s + discount * (support[j] - tlp_next[a]), vmin), vmax);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < MF_ATOMS; i += MF_THREADS) {
        const float zi = support[i];
        float acc = 0.0f;
        for (int a = 0; a < MF_A; ++a) {
            float row = 0.0f;
            for (int j = 0; j < MF_ATOMS; ++j) {
                row += probs[a * MF_ATOMS + j] *
                       fminf(fmaxf(1.0f - fabsf(shifted[a * MF_ATOMS + j] - zi) / dz, 0.0f), 1.0f);
            }
            acc += pi_next[a] * row;
        }
        m[i] = acc;
    }
    tb_cross_entropy(action, batch, sm, stats, msum_s);
}
