// Fused Mamba2 + C51 + return-head forward for inference: one thread block evaluates one
// K-bar window from zero state, from the normalised window to both heads' logits, in shared
// memory. Reference: agent/model/network.py forward() (through agent/kernels/mamba_forward.py).
// Used by mamba_forward.cu (the forward alone) and decide.cu (a whole decision per block).
//
// Shapes and the packed parameter layout come from the Python wrapper as macros:
//   MF_K window, MF_F features, MF_D d_model, MF_L layers, MF_DI inner width, MF_H heads,
//   MF_P headdim, MF_G groups, MF_N d_state, MF_W conv width, MF_NQ = A * atoms, MF_NR bins;
//   OFF_* offsets into the packed float32 buffer (weights stored transposed, in x out order;
//   BLK_A holds A_log, the parameter itself, so that the trainer updates the same buffer);
//   MF_THREADS, MF_TG and MF_STAGE pick a variant:
//   * latency (MF_STAGE 1): the matrices of the next stage are copied into shared memory
//     with cp.async while the current stage computes (one block a multiprocessor, every
//     weight read once from L2 a window), and every matmul picks the row tile that keeps all
//     MF_THREADS threads busy;
//   * throughput (MF_STAGE 0): weights read through the L1 cache with row tiles of MF_TG
//     (more reuse per load), several blocks per multiprocessor; with MF_TC the projections over
//     the whole window (embedding, in_proj, out_proj) run on the tensor cores instead
//     (mf_matmul_tc_tile: 3xTF32, float32 accuracy).
//   * cluster (MF_CL > 1): a window on a thread-block cluster of MF_CL ranks, every rank the
//     latency form of its share of the network: MF_DI, MF_H, MF_G (1) and MF_IP are one
//     rank's (its MF_H heads, its group's B and C; packed as a model of that width, one share
//     every MF_PSTRIDE floats), the embedding and the pre-norms computed by every rank alike.
//     Two sums cross the cluster through distributed shared memory, each pushed by remote
//     stores (which do not wait; remote loads would) and read locally after a cluster barrier:
//     each gated norm's sum of squares over the MF_GRANKS ranks of a group (of MF_GW
//     channels); and each out_proj, reduce-scattered (row t of every rank's partial product to
//     rank t % MF_CL, which adds them to the residual in rank order) and all-gathered (the sum
//     stored into every rank's residual stream), so the streams stay bitwise equal. Rank 0
//     alone runs the heads.
// In the last block only the last time step feeds the heads, so its gate, norm, out_proj and
// residual run for t = K-1 only (the scan still runs over the whole window).
// Cached form (mf_forward<true>, decide.cu): the first layer's per-row work (the embedding, its
// pre-norm and its in_proj map each step's row on its own) comes from the slot's ring of cached
// rows (MfRows) for the steps it holds, and is computed (and stored) for the others only: the
// new row, or the whole window where the ring is stale (mf_rows_*).
#pragma once

#define MF_CD (MF_DI + 2 * MF_G * MF_N)
#ifndef MF_IP  // a cluster rank's in_proj is padded to a multiple of 4 columns
#define MF_IP (2 * MF_DI + 2 * MF_G * MF_N + MF_H)
#endif
#ifndef MF_CL
#define MF_CL 1  // blocks (cluster ranks) a window
#endif
#ifndef MF_DIF  // the whole model's inner width, heads and groups (a cluster rank's MF_DI, MF_H, MF_G are its share's)
#define MF_DIF MF_DI
#define MF_HF MF_H
#define MF_GF MF_G
#endif
#define MF_IPF (2 * MF_DIF + 2 * MF_GF * MF_N + MF_HF)  // the whole model's in_proj width
#define MF_CW (MF_D + MF_R4(MF_IPF))  // a cached row: the embedding's output (D), then in_proj's (IPF)
#define MF_EPS 1e-5f
#ifndef MF_THREADS
#define MF_THREADS 256  // threads per block (one window per block)
#endif
#ifndef MF_TG
#define MF_TG 8  // time steps per matmul work item (throughput variant)
#endif
#ifndef MF_STAGE
#define MF_STAGE 0
#endif
#ifndef MF_ADAPT
#define MF_ADAPT 0
#endif
#ifndef MF_TC
#define MF_TC 0  // projections over the window on the tensor cores (throughput form only)
#endif
// Row stride of the pre-norm buffer: in the tensor-core form D + 8 where D is a multiple of 16,
// so that the four rows of a half-warp's fragment loads fall in distinct banks.
#define MF_LDU (MF_TC && MF_D % 16 == 0 ? MF_D + 8 : MF_D)
#ifndef MF_FILL
#define MF_FILL 1  // see mf_tile
#endif
#ifndef MF_MINB
#define MF_MINB 0  // blocks a multiprocessor the kernels' registers must allow (0: any)
#endif
#if MF_MINB > 0
#define MF_BOUNDS __launch_bounds__(MF_THREADS, MF_MINB)
#else
#define MF_BOUNDS __launch_bounds__(MF_THREADS)
#endif
// Chunks of steps the conv splits a channel into: as many as keep every (channel, chunk) item on
// its own thread (then the conv reads all inputs, waits, and writes), else 1.
#define MF_CHUNKS (MF_THREADS / MF_CD > 1 ? (MF_THREADS / MF_CD > MF_K ? MF_K : MF_THREADS / MF_CD) : 1)
#define MF_WARPS (MF_THREADS / 32)
// Threads a (head, channel) in the scan: 4 or 2 where the block has threads for them (and whole
// warps of them), else 1; each holds MF_NS of the channel's MF_N states.
#define MF_SPLIT_OK(s) (MF_N % (s) == 0 && MF_THREADS >= (s) * MF_DI && ((s) * MF_DI) % 32 == 0)
#define MF_SPLIT (MF_SPLIT_OK(4) ? 4 : (MF_SPLIT_OK(2) ? 2 : 1))
#define MF_NS (MF_N / MF_SPLIT)

// Shared memory layout (floats; every region a multiple of 4 for float4 access).
#define MF_R4(n) ((((n) + 3) / 4) * 4)
#define MF_MAX(a, b) ((a) > (b) ? (a) : (b))
#define MF_ZXW MF_MAX(MF_IP, MF_F)
#define SM_HS 0                                         // residual stream (K, D)
#define SM_US (SM_HS + MF_R4(MF_K * MF_D))              // block input after the pre-norm (K, D), rows MF_LDU apart
#define SM_ZX (SM_US + MF_R4(MF_K * MF_LDU))            // in_proj output (K, IP); first the window
#define SM_LOGITS (SM_ZX + MF_R4(MF_K * MF_ZXW))        // q logits (NQ) then return logits (NR)
#define SM_PROBS (SM_LOGITS + MF_R4(MF_NQ) + MF_R4(MF_NR))  // their probabilities, same layout
#define SM_WIN (SM_PROBS + MF_R4(MF_NQ) + MF_R4(MF_NR))    // staged in_proj weights (D, IP)
#define SM_WOUT (SM_WIN + MF_R4(MF_D * MF_IP))           // staged out_proj (Di, D) or embedding (F, D)
#define SM_WHEAD (SM_WOUT + MF_R4(MF_MAX(MF_DI * MF_D, MF_F * MF_D)))  // staged heads (D, NQ) (D, NR)
#define SM_SMALL (SM_WHEAD + MF_R4(MF_D * MF_NQ) + MF_R4(MF_D * MF_NR))  // staged small parameters:
#define SM_SMALL_L (MF_R4(MF_D) + BLK_WOUT_T - BLK_CONV_W)  // a block's norm, then conv_w .. gnorm_w
#define SM_STAGED_END (SM_SMALL + MF_L * SM_SMALL_L + MF_R4(MF_D))  // ... and the final norm
// Cluster exchange buffers: a gated norm's sums of squares (a slot of K per rank of the group),
// the out_proj partial rows this rank owns (a slot of MF_OWN rows per rank).
#define MF_OWN ((MF_K + MF_CL - 1) / MF_CL)
#define SM_SS SM_STAGED_END
#define SM_EX (SM_SS + MF_R4(MF_GRANKS * MF_K))
static_assert(BLK_CONV_W < BLK_CONV_B && BLK_CONV_B < BLK_DT_BIAS && BLK_DT_BIAS < BLK_A && BLK_A < BLK_D &&
                  BLK_D < BLK_GNORM && BLK_GNORM < BLK_WOUT_T,
              "the small parameters staged as one run [BLK_CONV_W, BLK_WOUT_T) of a block's layout");
#define MF_SHARED_FLOATS (MF_CL > 1 ? SM_EX + MF_CL * MF_OWN * MF_D : MF_STAGE ? SM_STAGED_END : SM_WIN)
#if MF_CL > 1
static_assert(MF_STAGE && MF_G == 1 && MF_D % 4 == 0,
              "a cluster rank stages its weights, holds one group and sums residual rows as float4");
#define MF_CLUSTER_DIMS __cluster_dims__(MF_CL, 1, 1)
#else
#define MF_CLUSTER_DIMS
#endif
static_assert(!MF_TC || (!MF_STAGE && MF_CL == 1), "the tensor-core form is the throughput form's");

// SiLU with the hardware exp2 and the approximate division (MUFU.EX2 and MUFU.RCP, five
// instructions; the correctly rounded reciprocal __frcp_rn compiled to ~15 with a slow-path
// branch, 10% of the decision kernel's instructions): relative error ~1e-6, far inside the
// forward's parity tolerance. For x < -87, 1 + exp(-x) > 2^126 and the quotient is 0.
__device__ __forceinline__ float mf_silu(float x) { return __fdividef(x, 1.0f + __expf(-x)); }

__device__ __forceinline__ float mf_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float mf_warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// This block's rank in its cluster (0 outside clusters).
__device__ __forceinline__ int mf_rank() {
#if MF_CL > 1
#ifdef __CUDA_ARCH__
    unsigned int r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return (int)r;
#else
    return emu::cluster_rank();
#endif
#else
    return 0;
#endif
}

// The same shared-memory location (a pointer into this block's dynamic shared memory) in the
// block of cluster rank `rank`: a generic pointer for plain loads and stores.
__device__ __forceinline__ float* mf_peer(float* p, int rank) {
#ifdef __CUDA_ARCH__
    float* out;
    asm("mapa.u64 %0, %1, %2;" : "=l"(out) : "l"(p), "r"(rank));  // an address only: free to hoist
    return out;
#else
    return emu::cluster_peer(p, rank);
#endif
}

// Barrier of every thread of the cluster; the writes before it (shared memory of any rank
// included) are visible after it.
__device__ __forceinline__ void mf_cluster_sync() {
#ifdef __CUDA_ARCH__
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
    emu::cluster_sync();
#endif
}

// Copy N floats (1 or 4: 4 or 16 bytes, aligned alike) from global src to shared dst without
// waiting (cp.async; the emulation copies at once).
template <int N>
__device__ __forceinline__ void mf_copy_async(float* dst, const float* src) {
#ifdef __CUDA_ARCH__
    const unsigned int at = (unsigned int)__cvta_generic_to_shared(dst);
    if constexpr (N == 4) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(at), "l"(src));
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(at), "l"(src));
    }
#else
    for (int k = 0; k < N; ++k) dst[k] = src[k];
#endif
}

// Close this thread's copies issued since its last commit into one group (mf_copy_wait).
__device__ __forceinline__ void mf_copy_commit() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Wait for this thread's copy groups but the newest `pending`.
template <int pending>
__device__ __forceinline__ void mf_copy_wait() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
#endif
}

// Start copying n floats (rounded up to whole 16-byte chunks: the packed layout pads every
// tensor to 16 bytes) from global src to shared dst without waiting, as one copy group.
__device__ __forceinline__ void mf_stage(float* dst, const float* __restrict__ src, int n) {
    for (int i = threadIdx.x; i < (n + 3) / 4; i += MF_THREADS) mf_copy_async<4>(dst + 4 * i, src + 4 * i);
    mf_copy_commit();
}

// Wait for every staged copy of this thread, then for those of the whole block.
__device__ __forceinline__ void mf_stage_wait() {
    mf_copy_wait<0>();
    __syncthreads();
}

// Row tile of a matmul over nt rows and ncols outputs: the throughput variant's MF_TG; the
// latency variant's largest tile in {8, 4, 2, 1} that still gives a work item to MF_THREADS /
// MF_FILL threads (longer tiles read each weight for more rows: less shared-memory traffic), the
// trainer's (MF_ADAPT) the same below MF_TG.
__host__ __device__ constexpr int mf_tile(int ncols, int nt) {
    if (!MF_STAGE && !MF_ADAPT) return MF_TG;
    const int groups = (ncols % 4 == 0) ? ncols / 4 : ncols;
    for (int tg = MF_STAGE ? 8 : MF_TG; tg > 1; tg /= 2) {
        if (groups * ((nt + tg - 1) / tg) * MF_FILL >= MF_THREADS) return tg;
    }
    return 1;
}

// out[t, j] (+)= bias[j] + sum_k in[t, k] * Wt[k, j] for t in [t0, t0 + nt), j in [j0, j1).
// Register tiling: each work item owns JT consecutive output columns and TG consecutive rows
// (TG * JT accumulators); consecutive threads take consecutive column groups (coalesced
// weight loads). The vector form (JT = 4) reads `in` four k at a time as float4 and the
// weights as float4: per four k, TG + 4 wide loads feed 16 TG multiply-adds. It needs kdim,
// ldi, nout and j0 divisible by 4 and 16-byte aligned bases (the packed layout and the shared
// layout align every tensor); other shapes take the scalar form (JT = 1). Wt is global
// (throughput) or shared (latency) memory.
template <int TG, int JT>
__device__ __forceinline__ void mf_matmul_tile(const float* in, int ldi, int kdim, const float* Wt, int nout,
                                               const float* __restrict__ bias, float* out, int ldo,
                                               int j0, int j1, int t0, int nt, bool accumulate) {
    const int ngroups = (j1 - j0) / JT;
    const int ntg = (nt + TG - 1) / TG;
    for (int item = threadIdx.x; item < ngroups * ntg; item += MF_THREADS) {
        const int j = j0 + (item % ngroups) * JT;
        const int tb = t0 + (item / ngroups) * TG;
        int rows[TG];
        float acc[TG][JT];
#pragma unroll
        for (int i = 0; i < TG; ++i) {
            rows[i] = min(tb + i, t0 + nt - 1) * ldi;
#pragma unroll
            for (int c = 0; c < JT; ++c) acc[i][c] = 0.0f;
        }
        if constexpr (JT == 4) {
            for (int k = 0; k < kdim; k += 4) {
                float w[4][4];
#pragma unroll
                for (int kk = 0; kk < 4; ++kk) {
                    const float4 v = *reinterpret_cast<const float4*>(Wt + (size_t)(k + kk) * nout + j);
                    w[kk][0] = v.x;
                    w[kk][1] = v.y;
                    w[kk][2] = v.z;
                    w[kk][3] = v.w;
                }
#pragma unroll
                for (int i = 0; i < TG; ++i) {
                    const float4 a = *reinterpret_cast<const float4*>(in + rows[i] + k);
#pragma unroll
                    for (int c = 0; c < 4; ++c) {
                        acc[i][c] += a.x * w[0][c];
                        acc[i][c] += a.y * w[1][c];
                        acc[i][c] += a.z * w[2][c];
                        acc[i][c] += a.w * w[3][c];
                    }
                }
            }
        } else {
            for (int k = 0; k < kdim; ++k) {
                const float w = Wt[(size_t)k * nout + j];
#pragma unroll
                for (int i = 0; i < TG; ++i) acc[i][0] += in[rows[i] + k] * w;
            }
        }
#pragma unroll
        for (int i = 0; i < TG; ++i) {
            if (tb + i < t0 + nt) {
#pragma unroll
                for (int c = 0; c < JT; ++c) {
                    float* o = out + (tb + i) * ldo + j + c;
                    const float b0 = bias != nullptr ? __ldg(bias + j + c) : 0.0f;
                    *o = (accumulate ? *o : 0.0f) + b0 + acc[i][c];
                }
            }
        }
    }
}

template <int TG>
__device__ __forceinline__ void mf_matmul(const float* in, int ldi, int kdim, const float* Wt, int nout,
                                          const float* __restrict__ bias, float* out, int ldo, int j0, int j1,
                                          int t0, int nt, bool accumulate) {
    if (((kdim | ldi | nout | j0 | j1) & 3) == 0) {
        mf_matmul_tile<TG, 4>(in, ldi, kdim, Wt, nout, bias, out, ldo, j0, j1, t0, nt, accumulate);
    } else {
        mf_matmul_tile<TG, 1>(in, ldi, kdim, Wt, nout, bias, out, ldo, j0, j1, t0, nt, accumulate);
    }
}

// out[j] (+)= sum_k in[k] * Wt[k * ldw + j] for j in [0, n): one row through a matrix on every
// thread of the block. mf_matmul's one-row form gives a thread four columns and the whole k, so
// only n / 4 threads work, each through kdim dependent steps: the last layer's z row and out_proj
// row took nearly as long as the 32-row projections beside them. Here k is cut into `slices`
// (as many as leave a thread a column group of one slice, at most kdim / 4 and MF_K - 1): each
// slice's float4 partial sums go to row s of `scratch` (rows MF_IP apart, n floats each; the
// caller's rows that no thread reads any more), and thread j adds column j's partials in slice
// order, after a barrier. Shapes not in multiples of 4 take mf_matmul's one-row form (as there,
// the bases of in, Wt and scratch are on 16 bytes: the layouts align every tensor and row).
// Every thread of the block calls it.
__device__ __forceinline__ void mf_project_row(const float* in, int kdim, const float* Wt, int ldw, float* out, int n,
                                               float* scratch, bool accumulate) {
    if (MF_IP % 4 != 0 || ((kdim | ldw | n) & 3) != 0) {
        mf_matmul<1>(in, 0, kdim, Wt, ldw, nullptr, out, 0, 0, n, 0, 1, accumulate);
        return;
    }
    const int groups = n / 4, k4 = kdim / 4;
    const int slices = max(1, min(min(MF_THREADS / groups, k4), MF_K - 1));
    for (int item = threadIdx.x; item < groups * slices; item += MF_THREADS) {  // one pass up to 4 x threads columns
        const int g = item % groups, s = item / groups;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int q = s * k4 / slices; q < (s + 1) * k4 / slices; ++q) {
            const float4 a = *reinterpret_cast<const float4*>(in + 4 * q);
            const float av[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                const float4 w = *reinterpret_cast<const float4*>(Wt + (size_t)(4 * q + kk) * ldw + 4 * g);
                acc.x += av[kk] * w.x;
                acc.y += av[kk] * w.y;
                acc.z += av[kk] * w.z;
                acc.w += av[kk] * w.w;
            }
        }
        *reinterpret_cast<float4*>(scratch + s * MF_IP + 4 * g) = acc;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < n; j += MF_THREADS) {
        float sum = 0.0f;
        for (int s = 0; s < slices; ++s) sum += scratch[s * MF_IP + j];
        out[j] = (accumulate ? out[j] : 0.0f) + sum;
    }
}

// x with its low 13 mantissa bits cleared: a TF32 value (exact as float32).
__device__ __forceinline__ float mf_tf32(float x) { return __uint_as_float(__float_as_uint(x) & 0xffffe000u); }

// d += A B on the tensor cores for one warp: A 16 x 8 and B 8 x 8 TF32, d 16 x 8 float32, in
// the fragments of mma.m16n8k8 (lane l, g = l / 4, q = l % 4: a = A[g][q], A[g + 8][q],
// A[g][q + 4], A[g + 8][q + 4]; b = B[q][g], B[q + 4][g]; d = D[g][2q], D[g][2q + 1],
// D[g + 8][2q], D[g + 8][2q + 1]).
__device__ __forceinline__ void mf_mma(float (&d)[4], const float (&a)[4], float b0, float b1) {
#ifdef __CUDA_ARCH__
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(__float_as_uint(a[0])), "r"(__float_as_uint(a[1])), "r"(__float_as_uint(a[2])),
          "r"(__float_as_uint(a[3])), "r"(__float_as_uint(b0)), "r"(__float_as_uint(b1)));
#else
    emu::mma_m16n8k8_tf32(d, a, b0, b1);
#endif
}

// mf_matmul on the tensor cores, a warp a tile of 32 rows x 16 columns (two by two
// fragments), in 3xTF32: each operand x = hi + lo (hi = tf32(x), lo = tf32(x - hi)) and
// a b ~ a_lo b_hi + a_hi b_lo + a_hi b_hi, the float32 result to ~1e-6 of the operands' scale.
// k runs in pairs: over eight k a lane holds k = k0 + 2q and k0 + 2q + 1 as fragment columns q
// and q + 4 of A and rows q and q + 4 of B (any order of k gives the same product), so that it
// reads a row of `in` as one float2 (V2: ldi even). The weights are split as they are read
// (from Wt through L1; split copies packed beside the buffer ran 619 against 573 us at 4,096
// rows: twice the bytes, a third of them found in L1). Rows past nt repeat the last row and are
// not stored.
template <bool V2>
__device__ __forceinline__ void mf_matmul_tc_tile(const float* in, int ldi, int kdim, const float* __restrict__ Wt,
                                                  int nout, const float* __restrict__ bias, float* out, int ldo,
                                                  int j0, int j1, int t0, int nt, bool accumulate) {
    constexpr int MT = 2, NT = 2;  // 16-row and 8-column fragments a warp tile
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int ncol = (j1 - j0 + 8 * NT - 1) / (8 * NT);
    const int tiles = (nt + 16 * MT - 1) / (16 * MT) * ncol;
    for (int tile = threadIdx.x >> 5; tile < tiles; tile += MF_WARPS) {
        const int tb = t0 + tile / ncol * 16 * MT, jb = j0 + tile % ncol * 8 * NT;
        int rows[MT][2];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
#pragma unroll
            for (int h = 0; h < 2; ++h) rows[m][h] = min(tb + 16 * m + 8 * h + g, t0 + nt - 1) * ldi;
        }
        float acc[MT][NT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
#pragma unroll
            for (int n = 0; n < NT; ++n) {
#pragma unroll
                for (int r = 0; r < 4; ++r) acc[m][n][r] = 0.0f;
            }
        }
        // Two steps' loads in flight: 4,096 rows 638 -> 621 us, 132 rows 58 -> 52 us (H200, with
        // the weights pre-split).
#pragma unroll 2
        for (int k0 = 0; k0 < kdim; k0 += 8) {
            const int k = k0 + 2 * q;
            float ah[MT][4], al[MT][4];
#pragma unroll
            for (int m = 0; m < MT; ++m) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float x0, x1;
                    if (V2 && k + 1 < kdim) {
                        const float2 v = *reinterpret_cast<const float2*>(in + rows[m][h] + k);
                        x0 = v.x;
                        x1 = v.y;
                    } else {
                        x0 = k < kdim ? in[rows[m][h] + k] : 0.0f;
                        x1 = k + 1 < kdim ? in[rows[m][h] + k + 1] : 0.0f;
                    }
                    ah[m][h] = mf_tf32(x0);
                    al[m][h] = mf_tf32(x0 - ah[m][h]);
                    ah[m][h + 2] = mf_tf32(x1);
                    al[m][h + 2] = mf_tf32(x1 - ah[m][h + 2]);
                }
            }
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const int j = jb + 8 * n + g;
                const float w0 = j < j1 && k < kdim ? __ldg(Wt + (size_t)k * nout + j) : 0.0f;
                const float w1 = j < j1 && k + 1 < kdim ? __ldg(Wt + (size_t)(k + 1) * nout + j) : 0.0f;
                const float h0 = mf_tf32(w0), h1 = mf_tf32(w1);
                const float l0 = mf_tf32(w0 - h0), l1 = mf_tf32(w1 - h1);
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    mf_mma(acc[m][n], al[m], h0, h1);
                    mf_mma(acc[m][n], ah[m], l0, l1);
                    mf_mma(acc[m][n], ah[m], h0, h1);
                }
            }
        }
#pragma unroll
        for (int m = 0; m < MT; ++m) {
#pragma unroll
            for (int n = 0; n < NT; ++n) {
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const int t = tb + 16 * m + 8 * (r >> 1) + g, j = jb + 8 * n + 2 * q + (r & 1);
                    if (t < t0 + nt && j < j1) {
                        float* o = out + t * ldo + j;
                        const float b0 = bias != nullptr ? __ldg(bias + j) : 0.0f;
                        *o = (accumulate ? *o : 0.0f) + b0 + acc[m][n][r];
                    }
                }
            }
        }
    }
}

// A projection over rows [t0, t0 + nt) of the window: on the tensor cores in the tensor-core
// form, else mf_matmul<TG>.
template <int TG>
__device__ __forceinline__ void mf_project(const float* in, int ldi, int kdim, const float* Wt, int nout,
                                           const float* __restrict__ bias, float* out, int ldo, int j0, int j1,
                                           int t0, int nt, bool accumulate) {
    if constexpr (MF_TC) {
        if ((ldi & 1) == 0 && (reinterpret_cast<size_t>(in) & 7) == 0) {
            mf_matmul_tc_tile<true>(in, ldi, kdim, Wt, nout, bias, out, ldo, j0, j1, t0, nt, accumulate);
        } else {
            mf_matmul_tc_tile<false>(in, ldi, kdim, Wt, nout, bias, out, ldo, j0, j1, t0, nt, accumulate);
        }
    } else {
        mf_matmul<TG>(in, ldi, kdim, Wt, nout, bias, out, ldo, j0, j1, t0, nt, accumulate);
    }
}

// Layer `layer`'s small parameter BLK_* `off` (norm, conv, dt bias, A, D, gnorm weights; blk is
// the layer's packed block): the staged copy in shared memory (latency variant), else global.
__device__ __forceinline__ const float* mf_small(const float* sm, const float* blk, int layer, int off) {
    if (!MF_STAGE) return blk + off;
    return sm + SM_SMALL + layer * SM_SMALL_L + (off == BLK_NORM ? 0 : MF_R4(MF_D) + off - BLK_CONV_W);
}

// A read of a parameter pointer from mf_small (shared memory, or global through the read-only path).
__device__ __forceinline__ float mf_ld(const float* p) { return MF_STAGE ? *p : __ldg(p); }

// The shares' sums of the scan's outputs, scattered: each halving step swaps with the partner
// share (lane ^ OFF) the half of the remaining steps that the partner keeps and adds the half it
// receives, so that after log2(MF_SPLIT) steps share `part` holds in ys[0, MF_K / MF_SPLIT) the
// whole sums of steps part * MF_K / MF_SPLIT + j (MF_K / 2 + MF_K / 4 + ... shuffles in place of
// MF_K log2(MF_SPLIT)).
template <int OFF, int N>
__device__ __forceinline__ void mf_share_halve(float (&ys)[MF_K], int part) {
    if constexpr (OFF >= 1) {
        constexpr int HALF = N / 2;
        const bool upper = (part & OFF) != 0;
#pragma unroll
        for (int j = 0; j < HALF; ++j) {
            const float send = upper ? ys[j] : ys[j + HALF];
            const float keep = upper ? ys[j + HALF] : ys[j];
            ys[j] = keep + __shfl_xor_sync(0xffffffffu, send, OFF);
        }
        mf_share_halve<OFF / 2, HALF>(ys, part);
    }
}

// The scan of one (head, channel) from zero state on MF_SPLIT neighbouring threads, each with
// MF_NS of its states (this thread's share: `part`): the recurrence h_t = exp(dt_t A) h_{t-1} +
// dt_t x_t B_t runs on every share at once and y_t = C_t . h_t is summed over the shares by
// shuffles off the recurrence's path, then handed to store(t, y_t) by one share each. Step t
// reads x at x[t * LD], dt at dt[t * LDDT], the share of B_t at bc[t * LD] and of C_t MF_G * MF_N
// floats after it; every step unrolled with its output kept in registers (no store inside the
// loop, so the next step's loads issue while this step computes). B and C are read as float4
// where the strides keep them 16-byte aligned. LAST: only y at the last step is wanted (the last
// block's output is read there only): C is read and the sum formed at that step alone.
template <int LD, int LDDT, bool LAST, typename Store>
__device__ __forceinline__ void mf_scan_share(const float* x, const float* dt, const float* bc, float A, int part,
                                              Store store) {
    constexpr int NS = MF_NS;
    constexpr bool VEC = NS % 4 == 0 && LD % 4 == 0 && MF_DI % 4 == 0;
    float state[NS];
#pragma unroll
    for (int n = 0; n < NS; ++n) state[n] = 0.0f;
    float ys[MF_K];
#pragma unroll
    for (int t = 0; t < MF_K; ++t) {
        const bool out = !LAST || t == MF_K - 1;
        const float xv = x[t * LD];
        const float dtv = dt[t * LDDT];
        const float decay = __expf(dtv * A);  // dt * A <= 0: decay in (0, 1]
        const float dx = dtv * xv;
        const float* Bt = bc + t * LD;
        const float* Ct = Bt + MF_G * MF_N;
        float y = 0.0f;
        if constexpr (VEC) {
#pragma unroll
            for (int n = 0; n < NS; n += 4) {
                const float4 b4 = *reinterpret_cast<const float4*>(Bt + n);
                state[n] = decay * state[n] + dx * b4.x;
                state[n + 1] = decay * state[n + 1] + dx * b4.y;
                state[n + 2] = decay * state[n + 2] + dx * b4.z;
                state[n + 3] = decay * state[n + 3] + dx * b4.w;
                if (out) {
                    const float4 c4 = *reinterpret_cast<const float4*>(Ct + n);
                    y += state[n] * c4.x + state[n + 1] * c4.y + state[n + 2] * c4.z + state[n + 3] * c4.w;
                }
            }
        } else {
#pragma unroll
            for (int n = 0; n < NS; ++n) {
                state[n] = decay * state[n] + dx * Bt[n];
                if (out) y += state[n] * Ct[n];
            }
        }
        ys[t] = y;
    }
    if constexpr (LAST) {
        float y = ys[MF_K - 1];
#pragma unroll
        for (int off = 1; off < MF_SPLIT; off <<= 1) y += __shfl_xor_sync(0xffffffffu, y, off);
        if (part == 0) store(MF_K - 1, y);
    } else if constexpr (MF_K % MF_SPLIT == 0) {
        constexpr int OWN = MF_K / MF_SPLIT;
        mf_share_halve<MF_SPLIT / 2, MF_K>(ys, part);
#pragma unroll
        for (int j = 0; j < OWN; ++j) store(part * OWN + j, ys[j]);
    } else {
#pragma unroll
        for (int t = 0; t < MF_K; ++t) {
#pragma unroll
            for (int off = 1; off < MF_SPLIT; off <<= 1) ys[t] += __shfl_xor_sync(0xffffffffu, ys[t], off);
        }
        if (part == 0) {
#pragma unroll
            for (int t = 0; t < MF_K; ++t) store(t, ys[t]);
        }
    }
}

// The causal depthwise conv of the MF_CD x, B, C channels (in row t at in[t * LD]; w (MF_CD,
// MF_W), b (MF_CD) or nullptr, read with mf_ld; steps outside [0, K) read as 0):
//   pre[t, c] = b[c] + sum_k w[c, k] in[t - (W - 1) + k, c],
// or with REV its transpose (the backward's), pre[t, c] = sum_k w[c, k] in[t + (W - 1) - k, c],
// handed to epi(t, c, pre). A thread takes a (channel, chunk of steps) item with the channel's
// weights and the chunk's inputs (and the W - 1 steps beside it) in registers: each input is read
// once a chunk, not once a tap. INPLACE: epi writes where `in` lies, so every input is read
// before any output is written. With more channels than threads a thread takes whole channels.
template <int LD, bool REV, bool INPLACE, typename Epi>
__device__ __forceinline__ void mf_conv(const float* in, const float* w, const float* b, Epi epi) {
    constexpr int CHUNKS = MF_CHUNKS;
    constexpr int CS = (MF_K + CHUNKS - 1) / CHUNKS;
    constexpr int R = CS + MF_W - 1;
    for (int base = 0; base < MF_CD * CHUNKS; base += MF_THREADS) {
        const int item = base + threadIdx.x;
        const bool mine = item < MF_CD * CHUNKS;
        const int c = item % MF_CD, t0 = (item / MF_CD) * CS;
        float raw[R];
        float cw[MF_W];
        float cb = 0.0f;
        if (mine) {
#pragma unroll
            for (int k = 0; k < MF_W; ++k) cw[k] = mf_ld(w + c * MF_W + k);
            if (b != nullptr) cb = mf_ld(b + c);
#pragma unroll
            for (int i = 0; i < R; ++i) {
                const int t = REV ? t0 + i : t0 - (MF_W - 1) + i;
                raw[i] = (t >= 0 && t < MF_K) ? in[t * LD + c] : 0.0f;
            }
        }
        if constexpr (INPLACE && CHUNKS > 1) __syncthreads();  // (one pass: every item read first)
        if (mine) {
#pragma unroll
            for (int i = 0; i < CS; ++i) {
                if (t0 + i < MF_K) {
                    float pre = cb;
#pragma unroll
                    for (int k = 0; k < MF_W; ++k) pre += raw[REV ? i + MF_W - 1 - k : i + k] * cw[k];
                    epi(t0 + i, c, pre);
                }
            }
        }
    }
}

// out[t, :] = in[t, :] / sqrt(mean(in[t, :]^2) + eps) * w for t in [t0, K), out's rows ldo
// apart; one warp a row, a warp's rows side by side (their loads and shuffle reductions
// independent, not one row's after another's); w from mf_small (or the final norm's, staged
// alike). The inverse root is rsqrtf (MUFU.RSQ, ~2 ulp), as in the gated norm: correctly
// rounded sqrtf and division cost 1.0 us of the 23.8 at one row and 22 of the 572 us at 4,096
// rows (H200, side by side).
__device__ __forceinline__ void mf_rmsnorm_rows(const float* in, float* out, int ldo, const float* __restrict__ w,
                                                int t0) {
    constexpr int ROWS = (MF_K + MF_WARPS - 1) / MF_WARPS;  // a warp's rows at most
    constexpr int PER = (MF_D + 31) / 32;
    const int lane = threadIdx.x & 31, first = t0 + (threadIdx.x >> 5);
    float x[ROWS][PER], ss[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const int t = first + r * MF_WARPS;
        ss[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            const int k = lane + 32 * i;
            x[r][i] = t < MF_K && k < MF_D ? in[t * MF_D + k] : 0.0f;
            ss[r] += x[r][i] * x[r][i];
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) ss[r] = mf_warp_sum(ss[r]);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const int t = first + r * MF_WARPS;
        if (t >= MF_K) break;
        const float inv = rsqrtf(ss[r] / (float)MF_D + MF_EPS);
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            const int k = lane + 32 * i;
            if (k < MF_D) out[t * ldo + k] = x[r][i] * inv * mf_ld(w + k);
        }
    }
}

// A slot's ring of cached rows (the cached form): for each of the window's K steps, the first
// layer's per-row work, MF_CW floats (the embedding's output, then in_proj's over the whole
// model's columns: z, x, B, C, dt). Step t of the window is at ring row (first + t) % K; steps
// [0, from) are read from it, steps [from, K) computed and stored (from = K - 1: the new row;
// 0: the whole window, where the ring does not hold the window's rows; K: nothing new).
struct MfRows {
    float* ring;
    int first;
    int from;
};

// In the whole model's in_proj layout, this rank's column c (its share's layout: z and x of its
// channels, its group's B and C, dt of its heads, padding; :func:`_share` in mamba_forward.py);
// -1 for padding. Outside clusters the identity.
__device__ __forceinline__ int mf_global_col(int c) {
#if MF_CL > 1
    const int r = mf_rank(), g = r * MF_H / (MF_HF / MF_GF);
    if (c < 2 * MF_DI) return (c < MF_DI ? 0 : MF_DIF - MF_DI) + r * MF_DI + c;
    c -= 2 * MF_DI;
    if (c < 2 * MF_N) return 2 * MF_DIF + (c < MF_N ? 0 : MF_GF * MF_N - MF_N) + g * MF_N + c;
    c -= 2 * MF_N;
    return c < MF_H ? 2 * MF_DIF + 2 * MF_GF * MF_N + r * MF_H + c : -1;
#else
    return c;
#endif
}

// Whether this rank stores its column c into the ring: its own columns, and its group's B and C
// in the group's first rank alone (every rank of the group computes them).
__device__ __forceinline__ bool mf_stores_col(int c) {
#if MF_CL > 1
    return c < 2 * MF_DI || c >= 2 * MF_DI + 2 * MF_N || mf_rank() % MF_GRANKS == 0;
#else
    return true;
#endif
}

// sum_k x[k] w[k * ldw] over KD terms (w staged or global, mf_ld) in one fixed order whatever
// the variant or the thread (four interleaved partial sums, added pairwise): a cached row is the
// same bits whichever form computed it.
template <int KD>
__device__ __forceinline__ float mf_dot(const float* x, const float* w, int ldw) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 8
    for (int k = 0; k < KD; ++k) acc[k & 3] = fmaf(x[k], mf_ld(w + (size_t)k * ldw), acc[k & 3]);
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// The embedding (weights w_emb, staged or global) of the normalised steps [from, K) (sm + SM_ZX,
// (K, F)) into hs, stored into the ring by rank 0 (every rank computes it alike).
__device__ __forceinline__ void mf_rows_embed(const float* __restrict__ P, const float* w_emb, const float* x,
                                              float* hs, MfRows rows) {
    for (int i = rows.from * MF_D + threadIdx.x; i < MF_K * MF_D; i += MF_THREADS) {
        const int t = i / MF_D, j = i % MF_D;
        const float v = __ldg(P + OFF_EMB_B + j) + mf_dot<MF_F>(x + t * MF_F, w_emb + j, MF_D);
        hs[i] = v;
        if (mf_rank() == 0) rows.ring[(size_t)((rows.first + t) % MF_K) * MF_CW + j] = v;
    }
}

// The first layer's in_proj (weights w_in, staged or global) of the pre-normed steps [from, K)
// (us) into zx (this rank's columns), stored into the ring.
__device__ __forceinline__ void mf_rows_in_proj(const float* w_in, const float* us, float* zx, MfRows rows) {
    for (int i = rows.from * MF_IP + threadIdx.x; i < MF_K * MF_IP; i += MF_THREADS) {
        const int t = i / MF_IP, c = i % MF_IP, col = mf_global_col(c);
        const float v = mf_dot<MF_D>(us + t * MF_LDU, w_in + c, MF_IP);
        zx[i] = v;
        if (col >= 0 && mf_stores_col(c)) rows.ring[(size_t)((rows.first + t) % MF_K) * MF_CW + MF_D + col] = v;
    }
}

// Start copying steps [0, from) of the first layer from the ring, as one copy group: the
// embedding's outputs into hs (HS), else this rank's in_proj columns into zx (padding 0, stored
// at once). Rows are copied 16 bytes at a time where a step's floats lie in one run of whole
// chunks (the embedding's; in_proj's outside clusters), else float by float.
template <bool HS>
__device__ __forceinline__ void mf_rows_fetch(const MfRows rows, float* dst) {
    constexpr int W = HS ? MF_D : MF_IP;  // floats a step
    constexpr bool V4 = W % 4 == 0 && (HS || (MF_CL == 1 && MF_D % 4 == 0));
    constexpr int PER = V4 ? W / 4 : W;  // copies a step
    for (int i = threadIdx.x; i < rows.from * PER; i += MF_THREADS) {
        const int t = i / PER, q = i % PER;
        const float* src = rows.ring + (size_t)((rows.first + t) % MF_K) * MF_CW + (HS ? 0 : MF_D);
        if constexpr (V4) {
            mf_copy_async<4>(dst + t * W + 4 * q, src + 4 * q);
        } else {
            const int col = HS ? q : mf_global_col(q);
            if (col < 0) {
                dst[t * W + q] = 0.0f;
            } else {
                mf_copy_async<1>(dst + t * W + q, src + col);
            }
        }
    }
    mf_copy_commit();
}

// Latency variant: start staging the embedding and the first block's in_proj, before the
// caller loads the window (the copies overlap its reads).
__device__ __forceinline__ void mf_forward_begin(const float* __restrict__ P, float* sm) {
    if (MF_STAGE) {
        mf_stage(sm + SM_WOUT, P + OFF_EMB_WT, MF_F * MF_D);
        mf_stage(sm + SM_WIN, P + OFF_BLOCKS + BLK_WIN_T, MF_D * MF_IP);
        for (int layer = 0; layer < MF_L; ++layer) {
            const float* blk = P + OFF_BLOCKS + (size_t)layer * BLK_STRIDE;
            float* dst = sm + SM_SMALL + layer * SM_SMALL_L;
            mf_stage(dst, blk + BLK_NORM, MF_D);
            mf_stage(dst + MF_R4(MF_D), blk + BLK_CONV_W, BLK_WOUT_T - BLK_CONV_W);
        }
        mf_stage(sm + SM_SMALL + MF_L * SM_SMALL_L, P + OFF_FINAL_NORM, MF_D);
    }
}

// The network on the window normalised into sm + SM_ZX ((K, F), written by the caller, no
// barrier needed after it); leaves the q logits at sm + SM_LOGITS and the return logits at
// sm + SM_LOGITS + MF_R4(MF_NQ), followed by a barrier, and returns true; in a cluster only
// rank 0 does (P its share), the other ranks return false once the cluster needs them no more.
// CACHED: the first layer's per-row work from the slot's ring `rows` where it holds the steps.
template <bool CACHED = false>
__device__ __forceinline__ bool mf_forward(const float* __restrict__ P, float* sm, MfRows rows = {}) {
    float* hs = sm + SM_HS;
    float* us = sm + SM_US;
    float* zx = sm + SM_ZX;
    if (MF_STAGE) {
        mf_stage_wait();
    } else {
        __syncthreads();
    }
    const float* w_emb = MF_STAGE ? sm + SM_WOUT : P + OFF_EMB_WT;
    if constexpr (CACHED) {
        mf_rows_fetch<true>(rows, hs);  // the ring's steps: the embedding writes the others' rows
        mf_rows_embed(P, w_emb, zx, hs, rows);
    } else {
        mf_project<mf_tile(MF_D, MF_K)>(zx, MF_F, MF_F, w_emb, MF_D, P + OFF_EMB_B, hs, MF_D, 0, MF_D, 0, MF_K,
                                        false);
    }
    __syncthreads();  // (cached: the new steps' features read, the ring's steps overwrite them in zx)
    if (CACHED) mf_rows_fetch<false>(rows, zx);  // (a group before out_proj's, which may stay pending)
    if (MF_STAGE) mf_stage(sm + SM_WOUT, P + OFF_BLOCKS + BLK_WOUT_T, MF_DI * MF_D);
    if constexpr (CACHED) {
        mf_rmsnorm_rows(hs, us, MF_LDU, mf_small(sm, P + OFF_BLOCKS, 0, BLK_NORM), rows.from);
        __syncthreads();
        mf_rows_in_proj(MF_STAGE ? sm + SM_WIN : P + OFF_BLOCKS + BLK_WIN_T, us, zx, rows);
        mf_copy_wait<MF_STAGE ? 1 : 0>();  // the ring's steps landed (out_proj's copy may go on)
        __syncthreads();
    }

    for (int layer = 0; layer < MF_L; ++layer) {
        const float* blk = P + OFF_BLOCKS + (size_t)layer * BLK_STRIDE;
        const bool last = layer == MF_L - 1;
        const int t_out = last ? MF_K - 1 : 0;  // first time step whose output is needed
        const float* w_in = MF_STAGE ? sm + SM_WIN : blk + BLK_WIN_T;
        const float* w_out = MF_STAGE ? sm + SM_WOUT : blk + BLK_WOUT_T;

        if (!CACHED || layer > 0) {
            mf_rmsnorm_rows(hs, us, MF_LDU, mf_small(sm, blk, layer, BLK_NORM), 0);
            __syncthreads();
            // in_proj: x, B, C, dt for every step; z only where the output is needed.
            constexpr int xbcdt = MF_IP - MF_DI;
            if (last) {
                mf_project<mf_tile(xbcdt, MF_K)>(us, MF_LDU, MF_D, w_in, MF_IP, nullptr, zx, MF_IP, MF_DI, MF_IP,
                                                 0, MF_K, false);
                // z of the last step alone, its partial sums in z's free rows (before the last)
                mf_project_row(us + t_out * MF_LDU, MF_D, w_in, MF_IP, zx + t_out * MF_IP, MF_DI, zx, false);
            } else {
                mf_project<mf_tile(MF_IP, MF_K)>(us, MF_LDU, MF_D, w_in, MF_IP, nullptr, zx, MF_IP, 0, MF_IP, 0,
                                                 MF_K, false);
            }
            __syncthreads();
        }
        if (MF_STAGE) {  // the next block's in_proj, or the heads after the last block
            if (last && mf_rank() == 0) {
                mf_stage(sm + SM_WHEAD, P + OFF_Q_WT, MF_D * MF_NQ);
                mf_stage(sm + SM_WHEAD + MF_R4(MF_D * MF_NQ), P + OFF_R_WT, MF_D * MF_NR);
            } else if (!last) {
                mf_stage(sm + SM_WIN, blk + BLK_STRIDE + BLK_WIN_T, MF_D * MF_IP);
            }
        }

        // Causal depthwise conv + SiLU over the x, B, C channels, in place.
        mf_conv<MF_IP, false, true>(zx + MF_DI, mf_small(sm, blk, layer, BLK_CONV_W),
                                    mf_small(sm, blk, layer, BLK_CONV_B),
                                    [&](int t, int c, float pre) { zx[t * MF_IP + MF_DI + c] = mf_silu(pre); });
        // dt = softplus(dt_raw + dt_bias)
        for (int i = threadIdx.x; i < MF_K * MF_H; i += MF_THREADS) {
            const int t = i / MF_H, h = i % MF_H;
            float* v = zx + t * MF_IP + MF_DI + MF_CD + h;
            *v = mf_softplus(*v + mf_ld(mf_small(sm, blk, layer, BLK_DT_BIAS) + h));
        }
        __syncthreads();

        // SSM scan from zero state (mf_scan_share: MF_SPLIT threads a (head, channel)); y (with
        // the D skip) then overwrites x where needed.
        for (int item = threadIdx.x; item < MF_DI * MF_SPLIT; item += MF_THREADS) {
            const int idx = item / MF_SPLIT, part = item % MF_SPLIT;
            const int h = idx / MF_P;
            const int g = h / (MF_H / MF_G);
            const float A = -__expf(mf_ld(mf_small(sm, blk, layer, BLK_A) + h));  // the layout stores A_log
            const float Dh = mf_ld(mf_small(sm, blk, layer, BLK_D) + h);
            const auto y_out = [&](int t, float y) {
                float* v = zx + t * MF_IP + MF_DI + idx;
                *v = y + Dh * *v;
            };
            const float* xs = zx + MF_DI + idx;
            const float* dts = zx + MF_DI + MF_CD + h;
            const float* bc = zx + 2 * MF_DI + g * MF_N + part * MF_NS;
            if (last) {
                mf_scan_share<MF_IP, MF_IP, true>(xs, dts, bc, A, part, y_out);
            } else {
                mf_scan_share<MF_IP, MF_IP, false>(xs, dts, bc, A, part, y_out);
            }
        }
        __syncthreads();

        // Gate before the norm: v = y * silu(z); grouped RMSNorm; o = vhat * gnorm_w (in place).
        // In a cluster the group's sum of squares is the sum of its ranks' (rank order).
        {
            const int lane = threadIdx.x & 31;
            constexpr int GW = MF_DI / MF_G;
            for (int rg = threadIdx.x >> 5; rg < (MF_K - t_out) * MF_G; rg += MF_WARPS) {
                const int t = t_out + rg / MF_G, g = rg % MF_G;
                float* row = zx + t * MF_IP;
                float ss = 0.0f;
                for (int i = g * GW + lane; i < (g + 1) * GW; i += 32) {
                    const float v = row[MF_DI + i] * mf_silu(row[i]);
                    row[MF_DI + i] = v;
                    ss += v * v;
                }
                ss = mf_warp_sum(ss);
#if MF_CL > 1
                // Lane j < MF_GRANKS stores into group rank j's slot of this rank.
                const int first = mf_rank() / MF_GRANKS * MF_GRANKS;
                if (lane < MF_GRANKS) *mf_peer(sm + SM_SS + (mf_rank() - first) * MF_K + t, first + lane) = ss;
#else
                const float r = rsqrtf(ss / (float)GW + MF_EPS);
                __syncwarp();
                for (int i = g * GW + lane; i < (g + 1) * GW; i += 32) {
                    row[MF_DI + i] = row[MF_DI + i] * r * mf_ld(mf_small(sm, blk, layer, BLK_GNORM) + i);
                }
#endif
            }
#if MF_CL > 1
            mf_cluster_sync();
            for (int t = t_out + (threadIdx.x >> 5); t < MF_K; t += MF_WARPS) {
                const float ss = mf_warp_sum(lane < MF_GRANKS ? sm[SM_SS + lane * MF_K + t] : 0.0f);
                const float r = rsqrtf(ss / (float)MF_GW + MF_EPS);
                float* row = zx + t * MF_IP;
                for (int i = lane; i < MF_DI; i += 32) {
                    row[MF_DI + i] = row[MF_DI + i] * r * mf_ld(mf_small(sm, blk, layer, BLK_GNORM) + i);
                }
            }
#endif
        }
        if (MF_STAGE) {
            mf_stage_wait();  // this block's out_proj (and the next stage's copy) has landed
        } else {
            __syncthreads();
        }

        // out_proj and the residual: hs[t] += o[t] W_out^T. In a cluster each rank's partial
        // product (its channels) goes to its free pre-norm buffer, then across the cluster.
        float* prod = MF_CL > 1 ? us : hs;
        if (last) {
            // the last step's row alone, its partial sums in zx's rows before the last (free once
            // the gate has read them)
            mf_project_row(zx + t_out * MF_IP + MF_DI, MF_DI, w_out, MF_D, prod + t_out * MF_D, MF_D, zx,
                           MF_CL == 1);
        } else {
            mf_project<mf_tile(MF_D, MF_K)>(zx + MF_DI, MF_IP, MF_DI, w_out, MF_D, nullptr, prod, MF_D, 0, MF_D, 0,
                                            MF_K, MF_CL == 1);
        }
#if MF_CL > 1
        {
            constexpr int D4 = MF_D / 4;
            const int me = mf_rank();
            const float4* part = reinterpret_cast<const float4*>(us);
            const float4* ex = reinterpret_cast<const float4*>(sm + SM_EX);
            float4* h4 = reinterpret_cast<float4*>(hs);
            __syncthreads();  // the partial product written
            // Reduce-scatter: row t of this rank's partial into slot `me` of rank t % MF_CL (rank 0
            // alone in the last block, which needs row K-1 only).
            for (int i = t_out * D4 + threadIdx.x; i < MF_K * D4; i += MF_THREADS) {
                const int t = i / D4;
                const int owner = last ? 0 : t % MF_CL, row = last ? 0 : t / MF_CL;
                float* dst = sm + SM_EX + ((me * MF_OWN + row) * D4 + i % D4) * 4;
                *reinterpret_cast<float4*>(mf_peer(dst, owner)) = part[i];
            }
            mf_cluster_sync();
            if (last && me != 0) return false;  // nothing reads this rank's memory any more
            // The owned rows' sums (residual + ranks' partials in rank order), stored into every
            // rank's residual stream (all-gather; in the last block rank 0's own).
            for (int i = threadIdx.x; i < (last ? 1 : MF_OWN) * D4; i += MF_THREADS) {
                const int row = i / D4, c = i % D4;
                const int t = last ? MF_K - 1 : me + row * MF_CL;
                if (t >= MF_K) continue;
                float4 v = h4[t * D4 + c];
#pragma unroll
                for (int q = 0; q < MF_CL; ++q) {
                    const float4 p = ex[(q * MF_OWN + row) * D4 + c];
                    v.x += p.x;
                    v.y += p.y;
                    v.z += p.z;
                    v.w += p.w;
                }
                if (last) {
                    h4[t * D4 + c] = v;
                } else {
#pragma unroll
                    for (int q = 0; q < MF_CL; ++q) {
                        reinterpret_cast<float4*>(mf_peer(hs, q))[t * D4 + c] = v;
                    }
                }
            }
            if (last) {
                __syncthreads();
            } else {
                mf_cluster_sync();
            }
        }
#else
        __syncthreads();
#endif
        if (MF_STAGE && !last) mf_stage(sm + SM_WOUT, blk + BLK_STRIDE + BLK_WOUT_T, MF_DI * MF_D);
    }

    // Final RMSNorm of the last step, then both heads.
    mf_rmsnorm_rows(hs, us, MF_LDU, MF_STAGE ? sm + SM_SMALL + MF_L * SM_SMALL_L : P + OFF_FINAL_NORM, MF_K - 1);
    __syncthreads();
    const float* feat = us + (MF_K - 1) * MF_LDU;
    const float* wq = MF_STAGE ? sm + SM_WHEAD : P + OFF_Q_WT;
    const float* wr = MF_STAGE ? sm + SM_WHEAD + MF_R4(MF_D * MF_NQ) : P + OFF_R_WT;
    for (int j = threadIdx.x; j < MF_NQ + MF_NR; j += MF_THREADS) {
        const bool q = j < MF_NQ;
        const int jj = q ? j : j - MF_NQ;
        const int n = q ? MF_NQ : MF_NR;
        const float* Wt = q ? wq : wr;
        float acc = __ldg(P + (q ? OFF_Q_B : OFF_R_B) + jj);
        for (int k = 0; k < MF_D; ++k) acc += feat[k] * Wt[k * n + jj];
        sm[SM_LOGITS + (q ? 0 : MF_R4(MF_NQ)) + jj] = acc;
    }
    __syncthreads();
    return true;
}

// Normalise the window win (K, F) raw features into sm + SM_ZX.
__device__ __forceinline__ void mf_load_window(const float* __restrict__ P, const float* win, float* sm) {
    for (int i = threadIdx.x; i < MF_K * MF_F; i += MF_THREADS) {
        const int f = i % MF_F;
        sm[SM_ZX + i] = (win[i] - __ldg(P + OFF_MEAN + f)) / __ldg(P + OFF_STD + f);
    }
}
