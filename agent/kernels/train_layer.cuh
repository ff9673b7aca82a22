// The per-window middle of one Mamba2 block for the trainer (train.cu): everything between
// in_proj and out_proj (causal conv, dt, the scan, the gated RMSNorm) and its backward, with the
// window's activations in shared memory. The projections, the norms and the heads run for the
// whole batch outside (matrix products and row kernels). Reference: agent/model/mamba2.py
// block_forward and block_backward (the scan's backward in its quadratic form, ALGORITHMS 1.5 b).
#pragma once
#include "train_ops.cuh"

// Shared memory of the per-window kernels: offsets TB_* (floats) come from train_layout() in
// agent/kernels/train.py, the one definition of the layout:
//   TB_ZX the in_proj output (K, IP) (the forward); the backward splits that region into TB_Z,
//   its z columns (K, DI), and TB_XD the others (K, TB_LDXD), later their gradient;
//   TB_XBC silu(conv) = x, B, C (K, CD);
//   TB_DT dt (K, H); TB_Y y = ssm + D x (K, DI); TB_RG the gated norm's inverse RMS (K, G);
//   TB_GO go -> gy (K, DI); TB_GX gx | gB | gC -> gpre (K, max(CD, DI)), in TB_Y's region (y
//   is dead by the time the scan's backward writes gx); TB_GDT gdt (K, H);
//   TB_M, TB_GM one head's M = CB * Lam and gM (K, K + 1); TB_GU its gU, TB_XH its x, TB_GYH
//   its gy (K, P + 1), in TB_Z's region where they fit; TB_CB, TB_GCB C B^T and its gradient per group (G, K, K); TB_CUM every
//   head's cumulative dt A (K, H); TB_GCUM one head's gradient of it (K); TB_GA gA per head (H).
//   The loss kernel's regions (train_loss.cuh: TB_HEAD, TB_GHEAD, TB_TGT, TB_SCRATCH, TB_QN)
//   are a layout of their own: no kernel uses both.

// The small parameters of a block, [BLK_CONV_W, BLK_WOUT_T) of its packed layout (conv, dt
// bias, A, D, gnorm weights): one row of per-window gradients each, summed over the batch.
#define TB_SMALL (BLK_WOUT_T - BLK_CONV_W)
// Row stride of TB_XD: the in_proj output's columns after z (conv inputs, raw dt).
#define TB_LDXD (MF_CD + MF_H)
#define TB_GS(off) ((off) - BLK_CONV_W)

// The lower triangle s <= t of a (K, K) matrix, row by row: TB_TRI entries, tb_tri(t) of them
// before row t, and the (t, s) of entry i.
#define TB_TRI (MF_K * (MF_K + 1) / 2)
__device__ __forceinline__ int tb_tri(int t) { return t * (t + 1) / 2; }
__device__ __forceinline__ void tb_tri_at(int i, int& t, int& s) {
    t = (int)((sqrtf(8.0f * (float)i + 1.0f) - 1.0f) * 0.5f);
    if (tb_tri(t + 1) <= i) ++t;  // the float root may land one row off either way
    if (tb_tri(t) > i) --t;
    s = i - tb_tri(t);
}

// From the in_proj output's conv and dt columns (xd: row t at xd[t * LD], the Cd conv inputs
// then the H raw dt): x, B, C = silu(causal conv) into TB_XBC and dt = softplus(dt_raw +
// dt_bias) into TB_DT.
template <int LD>
__device__ void tb_conv_dt(const float* __restrict__ blk, const float* xd, float* sm) {
    float* xbc = sm + TB_XBC;
    float* dt = sm + TB_DT;
    mf_conv<LD, false, false>(xd, blk + BLK_CONV_W, blk + BLK_CONV_B,
                              [&](int t, int c, float pre) { xbc[t * MF_CD + c] = mf_silu(pre); });
    for (int i = threadIdx.x; i < MF_K * MF_H; i += MF_THREADS) {
        const int t = i / MF_H, h = i % MF_H;
        dt[i] = mf_softplus(xd[t * LD + MF_CD + h] + __ldg(blk + BLK_DT_BIAS + h));
    }
}

// The block's middle from the in_proj output in TB_ZX: xbc, dt, y (rows [0, K)) and rg, and
// o = y silu(z) rg gnorm_w for rows [t0, K) into o (row t at o[(t - t0) * DI], any memory).
__device__ void tb_mid_forward(const float* __restrict__ blk, float* sm, float* o, int t0) {
    const float* zx = sm + TB_ZX;
    const float* xbc = sm + TB_XBC;
    const float* dt = sm + TB_DT;
    float* y = sm + TB_Y;
    float* rg = sm + TB_RG;
    tb_conv_dt<MF_IP>(blk, zx + MF_DI, sm);
    __syncthreads();
    // The scan from zero state (mf_scan_share: MF_SPLIT threads a (head, channel)); y with the D
    // skip, for the steps >= t0 (the last block's: its last step only).
    for (int item = threadIdx.x; item < MF_DI * MF_SPLIT; item += MF_THREADS) {
        const int idx = item / MF_SPLIT, part = item % MF_SPLIT;
        const int h = idx / MF_P;
        const int g = h / (MF_H / MF_G);
        const float Dh = __ldg(blk + BLK_D + h);
        const float A = -expf(__ldg(blk + BLK_A + h));
        const auto y_out = [&](int t, float v) { y[t * MF_DI + idx] = v + Dh * xbc[t * MF_CD + idx]; };
        const float* bc = xbc + MF_DI + g * MF_N + part * MF_NS;
        if (t0 == MF_K - 1) {
            mf_scan_share<MF_CD, MF_H, true>(xbc + idx, dt + h, bc, A, part, y_out);
        } else {
            mf_scan_share<MF_CD, MF_H, false>(xbc + idx, dt + h, bc, A, part, y_out);
        }
    }
    __syncthreads();
    // Gated RMSNorm statistics per (step, group) for the rows >= t0, and o.
    const int lane = threadIdx.x & 31;
    constexpr int GW = MF_DI / MF_G;
    for (int rgi = t0 * MF_G + (threadIdx.x >> 5); rgi < MF_K * MF_G; rgi += TR_WARPS) {
        const int t = rgi / MF_G, g = rgi % MF_G;
        float ss = 0.0f;
        for (int i = g * GW + lane; i < (g + 1) * GW; i += 32) {
            const float v = y[t * MF_DI + i] * mf_silu(zx[t * MF_IP + i]);
            ss += v * v;
        }
        const float r = 1.0f / sqrtf(mf_warp_sum(ss) / (float)GW + MF_EPS);
        if (lane == 0) rg[rgi] = r;
        for (int i = g * GW + lane; i < (g + 1) * GW; i += 32) {
            o[(t - t0) * MF_DI + i] = y[t * MF_DI + i] * mf_silu(zx[t * MF_IP + i]) * r * __ldg(blk + BLK_GNORM + i);
        }
    }
}

// The block's middle backward. In shared memory: the in_proj output split into its z columns
// (TB_Z, (K, DI)) and the rest (TB_XD, (K, TB_LDXD): the conv inputs then the raw dt), y and rg
// of the rows >= t0 (TB_Y, TB_RG) and go, the gradient at o (TB_GO; zero in the rows before t0,
// as the last layer's output is read at its last step only). Writes d loss / d z to gz (global,
// row t at gz[t * IP]), leaves d loss / d (conv inputs, raw dt) in TB_XD and adds the small
// parameters' gradients to gs (TB_SMALL floats, indexed TB_GS(BLK_*)). Once the gated norm's
// backward is done TB_Z is free: the scan's per-head scratch may live there (train_layout()).
__device__ void tb_mid_backward(const float* __restrict__ blk, float* __restrict__ gs, float* __restrict__ gz,
                                int t0, float* sm) {
    const float* z = sm + TB_Z;
    float* xd = sm + TB_XD;
    float* xbc = sm + TB_XBC;
    float* dt = sm + TB_DT;
    float* y = sm + TB_Y;
    float* rg = sm + TB_RG;
    float* go = sm + TB_GO;
    float* gx = sm + TB_GX;
    float* gdt = sm + TB_GDT;
    const int lane = threadIdx.x & 31;
    constexpr int GW = MF_DI / MF_G;
    constexpr int HG = MF_H / MF_G;
    tb_conv_dt<TB_LDXD>(blk, xd, sm);
    __syncthreads();
    // ggnorm_w = sum_t go vhat (vhat = o / gnorm_w, recomputed).
    for (int c = threadIdx.x; c < MF_DI; c += MF_THREADS) {
        float acc = 0.0f;
        for (int t = t0; t < MF_K; ++t) {
            acc += go[t * MF_DI + c] * y[t * MF_DI + c] * mf_silu(z[t * MF_DI + c]) * rg[t * MF_G + c / GW];
        }
        gs[TB_GS(BLK_GNORM) + c] += acc;
    }
    __syncthreads();
    // Gated norm backward per (step, group): gv; gy = gv silu(z) -> TB_GO; gz = gv y silu'(z)
    // -> gz (rows before t0: gy is 0 already; gz is not written there, the caller's products
    // read the rows >= t0 only).
    for (int rgi = t0 * MF_G + (threadIdx.x >> 5); rgi < MF_K * MF_G; rgi += TR_WARPS) {
        const int t = rgi / MF_G, g = rgi % MF_G;
        const float rr = rg[rgi];
        float dot = 0.0f;
        for (int i = g * GW + lane; i < (g + 1) * GW; i += 32) {
            const float vhat = y[t * MF_DI + i] * mf_silu(z[t * MF_DI + i]) * rr;
            dot += go[t * MF_DI + i] * __ldg(blk + BLK_GNORM + i) * vhat;
        }
        dot = mf_warp_sum(dot) / (float)GW;
        for (int i = g * GW + lane; i < (g + 1) * GW; i += 32) {
            const float zv = z[t * MF_DI + i];
            const float gate = mf_silu(zv);
            const float vhat = y[t * MF_DI + i] * gate * rr;
            const float gv = rr * (go[t * MF_DI + i] * __ldg(blk + BLK_GNORM + i) - vhat * dot);
            go[t * MF_DI + i] = gv * gate;
            gz[t * MF_IP + i] = gv * y[t * MF_DI + i] * tr_silu_grad(zv);
        }
    }
    __syncthreads();
    // gD per head; C B^T per group (the rows >= t0: gy is 0 before); the gradient accumulators
    // zeroed. One warp a head, the lanes over its (step, channel) pairs.
    for (int h = threadIdx.x >> 5; h < MF_H; h += TR_WARPS) {
        float acc = 0.0f;
        for (int i = t0 * MF_P + lane; i < MF_K * MF_P; i += 32) {
            const int t = i / MF_P, p = i % MF_P;
            acc += go[t * MF_DI + h * MF_P + p] * xbc[t * MF_CD + h * MF_P + p];
        }
        acc = mf_warp_sum(acc);
        if (lane == 0) {
            gs[TB_GS(BLK_D) + h] += acc;
            sm[TB_GA + h] = 0.0f;
        }
    }
    for (int i = threadIdx.x; i < MF_G * MF_K * MF_K; i += MF_THREADS) sm[TB_GCB + i] = 0.0f;
    for (int i = threadIdx.x; i < MF_G * (TB_TRI - tb_tri(t0)); i += MF_THREADS) {
        const int g = i / (TB_TRI - tb_tri(t0));
        int t, s;
        tb_tri_at(tb_tri(t0) + i % (TB_TRI - tb_tri(t0)), t, s);
        const float* C = xbc + t * MF_CD + MF_DI + MF_G * MF_N + g * MF_N;
        const float* B = xbc + s * MF_CD + MF_DI + g * MF_N;
        float acc = 0.0f;
        for (int n = 0; n < MF_N; ++n) acc += C[n] * B[n];
        sm[TB_CB + g * MF_K * MF_K + t * MF_K + s] = acc;
    }
    __syncthreads();
    // The scan's backward in its quadratic form (one chunk, zero initial state), head by head;
    // first every head's cumulative dt A (one thread a head).
    float* M = sm + TB_M;
    float* gM = sm + TB_GM;
    float* gU = sm + TB_GU;
    float* cum_all = sm + TB_CUM;
    float* gcum = sm + TB_GCUM;
    for (int h = threadIdx.x; h < MF_H; h += MF_THREADS) {
        const float A = -expf(__ldg(blk + BLK_A + h));
        float c = 0.0f;
        for (int t = 0; t < MF_K; ++t) {
            c += dt[t * MF_H + h] * A;
            cum_all[t * MF_H + h] = c;
        }
    }
    __syncthreads();
    // Rows of the [K, K] and [K, P] scratch are padded (KP, PP): threads reading one column
    // across rows hit different banks. M, gM (and C B^T above) are formed on the lower triangle
    // s <= t and for the rows t >= t0 only (the rows of gy before t0 are 0, and so are those of
    // gM and of S below); nothing reads the rest.
    constexpr int KP = MF_K + 1, PP = MF_P + 1;
    float* xh = sm + TB_XH;
    float* gyh = sm + TB_GYH;
    for (int h = 0; h < MF_H; ++h) {
        const int g = h / HG;
        const float A = -expf(__ldg(blk + BLK_A + h));
        const float Dh = __ldg(blk + BLK_D + h);
        for (int i = threadIdx.x; i < MF_K * MF_P; i += MF_THREADS) {  // this head's x and gy
            const int s = i / MF_P, p = i % MF_P;
            xh[s * PP + p] = xbc[s * MF_CD + h * MF_P + p];
            gyh[s * PP + p] = go[s * MF_DI + h * MF_P + p];
        }
        __syncthreads();
        // M = C B^T Lam, Lam[t, s] = exp(cum_t - cum_s); gM = gy x^T dt; gCB += gM Lam.
        for (int i = tb_tri(t0) + threadIdx.x; i < TB_TRI; i += MF_THREADS) {
            int t, s;
            tb_tri_at(i, t, s);
            const float lam = __expf(cum_all[t * MF_H + h] - cum_all[s * MF_H + h]);
            float gm = 0.0f;
            for (int p = 0; p < MF_P; ++p) gm += gyh[t * PP + p] * xh[s * PP + p];
            gm *= dt[s * MF_H + h];
            M[t * KP + s] = sm[TB_CB + g * MF_K * MF_K + t * MF_K + s] * lam;
            gM[t * KP + s] = gm;
            sm[TB_GCB + g * MF_K * MF_K + t * MF_K + s] += gm * lam;
        }
        __syncthreads();
        // gU[s, p] = sum_{t >= s} M[t, s] gy[t, p]; gx = dt gU + D gy.
        for (int i = threadIdx.x; i < MF_K * MF_P; i += MF_THREADS) {
            const int s = i / MF_P, p = i % MF_P;
            float acc = 0.0f;
            for (int t = max(s, t0); t < MF_K; ++t) acc += M[t * KP + s] * gyh[t * PP + p];
            gU[s * PP + p] = acc;
            gx[s * MF_CD + h * MF_P + p] = dt[s * MF_H + h] * acc + Dh * gyh[s * PP + p];
        }
        // gcum_t = sum_{s <= t} S[t, s] - sum_{t' >= t} S[t', t], S = gM * M (lower triangle,
        // rows >= t0): one warp a step t, the lanes over s.
        for (int t = threadIdx.x >> 5; t < MF_K; t += TR_WARPS) {
            float acc = 0.0f;
            if (t >= t0) {
                for (int s = lane; s <= t; s += 32) acc += gM[t * KP + s] * M[t * KP + s];
            }
            for (int s = max(t, t0) + lane; s < MF_K; s += 32) acc -= gM[s * KP + t] * M[s * KP + t];
            acc = mf_warp_sum(acc);
            if (lane == 0) gcum[t] = acc;
        }
        __syncthreads();
        // Warp 0: ga_r = sum_{t >= r} gcum_t (a suffix scan, 32 steps a pass), then
        // gdt[s] = sum_p gU[s, p] x[s, p] + A ga_s and gA += sum_s dt_s ga_s.
        if ((threadIdx.x >> 5) == 0) {
            const int lane = threadIdx.x & 31;
            float carry = 0.0f, ga_sum = 0.0f;
            for (int base = ((MF_K - 1) / 32) * 32; base >= 0; base -= 32) {
                const int s = base + lane;
                float v = s < MF_K ? gcum[s] : 0.0f;
#pragma unroll
                for (int off = 1; off < 32; off <<= 1) {
                    const float up = __shfl_down_sync(0xffffffffu, v, off);
                    if (lane + off < 32) v += up;
                }
                v += carry;
                carry = __shfl_sync(0xffffffffu, v, 0);
                if (s < MF_K) {
                    float acc = 0.0f;
                    for (int p = 0; p < MF_P; ++p) acc += gU[s * PP + p] * xh[s * PP + p];
                    gdt[s * MF_H + h] = acc + A * v;
                    ga_sum += dt[s * MF_H + h] * v;
                }
            }
            ga_sum = mf_warp_sum(ga_sum);
            if (lane == 0) sm[TB_GA + h] += ga_sum;
        }
        __syncthreads();
    }
    // gC[t] = sum_s gCB[t, s] B_s; gB[s] = sum_t gCB[t, s] C_t (per group; the rows of gCB
    // before t0 are 0); gA_log = gA A.
    for (int i = threadIdx.x; i < MF_K * MF_G * MF_N; i += MF_THREADS) {
        const int t = i / (MF_G * MF_N), g = (i / MF_N) % MF_G, n = i % MF_N;
        const float* gcb = sm + TB_GCB + g * MF_K * MF_K;
        float gc = 0.0f, gb = 0.0f;
        if (t >= t0) {
            for (int s = 0; s < MF_K; ++s) gc += gcb[t * MF_K + s] * xbc[s * MF_CD + MF_DI + g * MF_N + n];
        }
        for (int s = t0; s < MF_K; ++s) gb += gcb[s * MF_K + t] * xbc[s * MF_CD + MF_DI + MF_G * MF_N + g * MF_N + n];
        gx[t * MF_CD + MF_DI + MF_G * MF_N + g * MF_N + n] = gc;
        gx[t * MF_CD + MF_DI + g * MF_N + n] = gb;
    }
    for (int h = threadIdx.x; h < MF_H; h += MF_THREADS) {
        gs[TB_GS(BLK_A) + h] += sm[TB_GA + h] * -expf(__ldg(blk + BLK_A + h));
    }
    __syncthreads();
    // gs = gdt sigmoid(s) -> the dt columns of TB_XD; gpre = gxbc silu'(pre) in place (pre
    // recomputed from the conv input, which TB_XD still holds).
    for (int i = threadIdx.x; i < MF_K * MF_H; i += MF_THREADS) {
        const int t = i / MF_H, h = i % MF_H;
        float* v = xd + t * TB_LDXD + MF_CD + h;
        *v = gdt[i] * tr_sigmoid(*v + __ldg(blk + BLK_DT_BIAS + h));
    }
    mf_conv<TB_LDXD, false, false>(xd, blk + BLK_CONV_W, blk + BLK_CONV_B,
                                   [&](int t, int c, float pre) { gx[t * MF_CD + c] *= tr_silu_grad(pre); });
    __syncthreads();
    // gconv_b, gconv_w (every step unrolled: each input read once), gdt_bias.
    for (int c = threadIdx.x; c < MF_CD; c += MF_THREADS) {
        float gb = 0.0f;
        float gw[MF_W];
#pragma unroll
        for (int k = 0; k < MF_W; ++k) gw[k] = 0.0f;
#pragma unroll
        for (int t = 0; t < MF_K; ++t) {
            const float gp = gx[t * MF_CD + c];
            gb += gp;
#pragma unroll
            for (int k = 0; k < MF_W; ++k) {
                const int src = t - MF_W + 1 + k;
                if (src >= 0) gw[k] += gp * xd[src * TB_LDXD + c];
            }
        }
        gs[TB_GS(BLK_CONV_B) + c] += gb;
#pragma unroll
        for (int k = 0; k < MF_W; ++k) gs[TB_GS(BLK_CONV_W) + c * MF_W + k] += gw[k];
    }
    for (int h = threadIdx.x; h < MF_H; h += MF_THREADS) {
        float acc = 0.0f;
        for (int t = 0; t < MF_K; ++t) acc += xd[t * TB_LDXD + MF_CD + h];
        gs[TB_GS(BLK_DT_BIAS) + h] += acc;
    }
    __syncthreads();
    // gxbc_raw[t'] = sum_k gpre[t' + W - 1 - k] conv_w[k] (the conv's transpose) -> the conv
    // columns of TB_XD.
    mf_conv<MF_CD, true, false>(gx, blk + BLK_CONV_W, nullptr,
                                [&](int t, int c, float v) { xd[t * TB_LDXD + c] = v; });
    __syncthreads();
}
