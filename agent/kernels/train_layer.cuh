// One Mamba2 block's forward and backward for the trainer's backward kernel (train.cu), with the
// block's activations in shared memory. Reference: agent/model/mamba2.py block_forward and
// block_backward (the scan's backward in its quadratic form, ALGORITHMS 1.5 b).
#pragma once
#include "train_ops.cuh"

// The backward kernel's shared memory: offsets TB_* (floats) come from train_layout() in
// agent/kernels/train.py, the one definition of the layout:
//   TB_X window (K, F); TB_HS each layer's input (L, K, D); TB_HF the last step after the last
//   layer (D); TB_U pre-norm output u (K, D); TB_R its inverse RMS (K); TB_ZX in_proj output
//   (K, IP), later its gradient; TB_XBC silu(conv) = x, B, C (K, CD); TB_DT dt (K, H); TB_Y
//   y = ssm + D x (K, DI); TB_RG the gated norm's inverse RMS (K, G); TB_GH the residual
//   stream's gradient (K, D); TB_GO o (forward), go -> gy, later gu (K, DI); TB_GX o
//   (backward), gx | gB | gC -> gpre (K, max(CD, DI)); TB_GDT gdt (K, H); TB_M, TB_GM one
//   head's M = CB * Lam and gM (K, K + 1); TB_GU its gU, TB_XH its x, TB_GYH its gy
//   (K, P + 1); TB_CB, TB_GCB C B^T and its gradient per group (G, K, K); TB_CUM every head's
//   cumulative dt A (K, H); TB_GCUM one head's gradient of it (K); TB_GA gA per head (H);
//   TB_HEAD q and return logits; TB_GHEAD their gradients; TB_FEAT feat, fhat, gfeat, fr
//   (4 x D); TB_TGT the target distribution m (ATOMS); TB_SCRATCH ((A + 2) x ATOMS); TB_WS
//   the staging region of the projections' weights (tb_stage_rows).

// A layer's forward state: the regions TB_U .. TB_GH (u, r, zx, xbc, dt, y, rg), contiguous.
#define TB_STATE (TB_GH - TB_U)

// Rows [r0, r0 + n) of a row-major weight W (global, ncols columns) copied into the staging
// region TB_WS, landed and visible to the whole block on return. Callers synchronise the block
// between the last read of the region and the next copy into it. Chunks of TB_CH_WIN rows of
// W_in^T (D, IP) and TB_CH_WOUT rows of W_out^T (Di, D) fit the region (train_layout()): the
// forward's projections read their weights from shared memory, one L2 round trip a chunk. (The
// backward's products with the weights, tr_mm_rows, load each weight row once into registers
// and were measured slower staged.)
__device__ __forceinline__ void tb_stage_rows(float* sm, const float* __restrict__ W, int ncols, int r0, int n) {
    mf_stage(sm + TB_WS, W + (size_t)r0 * ncols, n * ncols);
    mf_stage_wait();
}

// dst[i] = src[i] for i < n (n and both addresses multiples of 4 floats), as float4.
__device__ __forceinline__ void tb_copy4(float* dst, const float* src, int n) {
    for (int i = threadIdx.x; i < n / 4; i += MF_THREADS) {
        reinterpret_cast<float4*>(dst)[i] = reinterpret_cast<const float4*>(src)[i];
    }
}

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
    for (int k0 = 0; k0 < MF_D; k0 += TB_CH_WIN) {  // in_proj, a chunk of its input rows at a time
        const int n = min(TB_CH_WIN, MF_D - k0);
        tb_stage_rows(sm, blk + BLK_WIN_T, MF_IP, k0, n);
        mf_matmul<mf_tile(MF_IP, MF_K)>(u + k0, MF_D, n, sm + TB_WS, MF_IP, nullptr, zx, MF_IP, 0, MF_IP, 0, MF_K,
                                        k0 > 0);
        __syncthreads();
    }
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
        for (int k0 = 0; k0 < MF_DI; k0 += TB_CH_WOUT) {  // out_proj, a chunk of its input rows at a time
            const int n = min(TB_CH_WOUT, MF_DI - k0);
            tb_stage_rows(sm, blk + BLK_WOUT_T, MF_D, k0, n);  // (its barrier also orders the copy above)
            mf_matmul<mf_tile(MF_D, MF_K)>(sm + TB_GO + t0 * MF_DI + k0, MF_DI, n, sm + TB_WS, MF_D, nullptr,
                                           out + t0 * MF_D, MF_D, 0, MF_D, 0, MF_K - t0, true);
            __syncthreads();
        }
    }
}

// Layer l's backward, its forward state in shared memory (tb_layer_forward) and TB_GH the
// gradient at its output, zero in the rows before t0 (the last layer's output is read at its last
// step only): the layer's parameter gradients added to G (the block's partial row), TB_GH
// becomes the gradient at its input.
__device__ void tb_layer_backward(const float* __restrict__ P, int l, const float* hs, float* __restrict__ G,
                                  int t0, float* sm) {
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

    // o again (TB_GO held it; the backward needs that region for go): o into TB_GX, rows >= t0.
    for (int i = t0 * MF_DI + threadIdx.x; i < MF_K * MF_DI; i += MF_THREADS) {
        const int t = i / MF_DI, c = i % MF_DI;
        gx[i] = y[i] * tr_silu(zx[t * MF_IP + c]) * rg[t * MF_G + c / GW] * __ldg(blk + BLK_GNORM + c);
    }
    __syncthreads();
    // gW_out^T (Di, D) = o^T gh; go = gh W_out (K, Di), zero before t0.
    tr_mm_tn(gx + t0 * MF_DI, MF_DI, gh + t0 * MF_D, MF_D, MF_K - t0, gblk + BLK_WOUT_T, MF_D, MF_DI, MF_D);
    tr_mm_rows<MF_D>(gh, MF_D, blk + BLK_WOUT_T, MF_DI, go, MF_DI, t0);
    __syncthreads();
    // ggnorm_w = sum_t go vhat (vhat = o / gnorm_w, recomputed).
    for (int c = threadIdx.x; c < MF_DI; c += MF_THREADS) {
        float acc = 0.0f;
        for (int t = t0; t < MF_K; ++t) {
            acc += go[t * MF_DI + c] * y[t * MF_DI + c] * tr_silu(zx[t * MF_IP + c]) * rg[t * MF_G + c / GW];
        }
        gblk[BLK_GNORM + c] += acc;
    }
    __syncthreads();
    // Gated norm backward per (step, group): gv; gy = gv silu(z) -> TB_GO; gz = gv y silu'(z)
    // -> the z columns of TB_ZX (rows before t0: gy is 0 already, gz set to 0).
    for (int i = threadIdx.x; i < t0 * MF_DI; i += MF_THREADS) zx[(i / MF_DI) * MF_IP + i % MF_DI] = 0.0f;
    for (int rgi = t0 * MF_G + (threadIdx.x >> 5); rgi < MF_K * MF_G; rgi += TR_WARPS) {
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
    // One warp a head, the lanes over its (step, channel) pairs.
    for (int h = threadIdx.x >> 5; h < MF_H; h += TR_WARPS) {
        float acc = 0.0f;
        for (int i = lane; i < MF_K * MF_P; i += 32) {
            const int t = i / MF_P, p = i % MF_P;
            acc += go[t * MF_DI + h * MF_P + p] * xbc[t * MF_CD + h * MF_P + p];
        }
        acc = mf_warp_sum(acc);
        if (lane == 0) {
            gblk[BLK_D + h] += acc;
            sm[TB_GA + h] = 0.0f;
        }
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
    // across rows hit different banks.
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
        for (int i = threadIdx.x; i < MF_K * MF_K; i += MF_THREADS) {
            const int t = i / MF_K, s = i % MF_K;
            float m = 0.0f, gm = 0.0f;
            if (s <= t) {
                m = sm[TB_CB + g * MF_K * MF_K + i] * expf(cum_all[t * MF_H + h] - cum_all[s * MF_H + h]);
                for (int p = 0; p < MF_P; ++p) gm += gyh[t * PP + p] * xh[s * PP + p];
                gm *= dt[s * MF_H + h];
            }
            M[t * KP + s] = m;
            gM[t * KP + s] = gm;
        }
        __syncthreads();
        // gU[s, p] = sum_{t >= s} M[t, s] gy[t, p]; gx = dt gU + D gy.
        for (int i = threadIdx.x; i < MF_K * MF_P; i += MF_THREADS) {
            const int s = i / MF_P, p = i % MF_P;
            float acc = 0.0f;
            for (int t = s; t < MF_K; ++t) acc += M[t * KP + s] * gyh[t * PP + p];
            gU[s * PP + p] = acc;
            gx[s * MF_CD + h * MF_P + p] = dt[s * MF_H + h] * acc + Dh * gyh[s * PP + p];
        }
        // gCB += gM * Lam (Lam = M / CB where CB != 0: recomputed from cum instead).
        for (int i = threadIdx.x; i < MF_K * MF_K; i += MF_THREADS) {
            const int t = i / MF_K, s = i % MF_K;
            if (s <= t) {
                sm[TB_GCB + g * MF_K * MF_K + i] +=
                    gM[t * KP + s] * expf(cum_all[t * MF_H + h] - cum_all[s * MF_H + h]);
            }
        }
        // gcum_t = sum_s S[t, s] - sum_t' S[t', t], S = gM * M: one warp a step t, the lanes over s.
        for (int t = threadIdx.x >> 5; t < MF_K; t += TR_WARPS) {
            float acc = 0.0f;
            for (int s = lane; s < MF_K; s += 32) acc += gM[t * KP + s] * M[t * KP + s] - gM[s * KP + t] * M[s * KP + t];
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
        gblk[BLK_A + h] += sm[TB_GA + h] * -expf(__ldg(blk + BLK_A + h));
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
        gblk[BLK_CONV_B + c] += gb;
#pragma unroll
        for (int k = 0; k < MF_W; ++k) gblk[BLK_CONV_W + c * MF_W + k] += gw[k];
    }
    for (int h = threadIdx.x; h < MF_H; h += MF_THREADS) {
        float acc = 0.0f;
        for (int t = 0; t < MF_K; ++t) acc += zx[t * MF_IP + MF_DI + MF_CD + h];
        gblk[BLK_DT_BIAS + h] += acc;
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
    tr_mm_rows<MF_IP>(zx, MF_IP, blk + BLK_WIN_T, MF_D, go, MF_D, 0);
    __syncthreads();
    // gnorm_w = sum_t gu nhat; the residual's gradient gains the pre-norm's backward.
    for (int k = threadIdx.x; k < MF_D; k += MF_THREADS) {
        float acc = 0.0f;
        for (int t = 0; t < MF_K; ++t) acc += go[t * MF_D + k] * hs[t * MF_D + k] * r[t];
        gblk[BLK_NORM + k] += acc;
    }
    tr_rmsnorm_backward_rows(hs, r, go, blk + BLK_NORM, gh, MF_K, true);
    __syncthreads();
}

