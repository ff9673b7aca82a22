// Single-precision matrix products on the tensor cores, three TF32 passes a product (3xTF32):
// each operand x is split into big (x rounded to TF32) and small = x - big, and
// a b ~= a_small b_big + a_big b_small + a_big b_big, accumulated in float32. What is dropped
// (a_small b_small, small's bits below TF32) is under 2^-20 of each product: the sums are as
// close to float64 as cuBLAS's sgemm (tests/gpu/test_blas.py), at tensor-core speed.
//
// C (m, n) = A (m, k) B (k, n), every matrix row-major with its own leading dimension (a block of
// columns or every n-th row of a larger matrix is a pointer and a stride); B may be given as its
// transpose instead (gemm_tf32x3_nt: B[k][n] at b[n * ldb + k]); accumulate adds to C. A
// block's product is a fixed sequence of operations: results are deterministic. Tiles of GM_BM x GM_BN of
// C a block (grid: column tiles x row tiles), 4 warps of 64 x 32 each, the inner dimension in
// slices of GM_BK copied to shared memory asynchronously, GM_STAGES - 1 slices in flight while
// the tensor cores work on one; rows and columns past the edges read as zero.
// Reference: numpy.matmul (tests/gpu/test_blas.py); the caller is agent/kernels/blas.py.

#define GM_BM 128
#define GM_BN 64
#define GM_THREADS 128
#define GM_BLOCKS 3
// The depth of an inner slice and the slices in flight come from the caller (agent/kernels/
// blas.py), which sizes the dynamic shared memory: GM_STAGES slices of GM_A_FLOATS +
// GM_B_FLOATS floats.
#if !defined(GM_BK) || !defined(GM_STAGES)
#error "gemm.cu needs -DGM_BK and -DGM_STAGES"
#endif

// x = big + small, both for TF32 operands: big is x rounded to TF32's 10 mantissa bits (half an
// ulp added, the 13 low bits cleared), small = x - big exactly; small is passed with its low
// bits set, which the tensor cores ignore (truncation: an error below 2^-21 |x|). Three integer
// and float operations, where cvt.rna.tf32 would take the slower conversion unit twice.
__device__ __forceinline__ void gm_split(float x, unsigned& big, unsigned& small) {
    big = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
    small = __float_as_uint(x - __uint_as_float(big));
}

// d += a b for one 16 x 8 tile of C and an 8-deep slice (PTX mma.m16n8k8, TF32 in, float32 out).
__device__ __forceinline__ void gm_mma(float* d, const unsigned* a, const unsigned* b) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// An asynchronous copy of 4 floats (16 bytes, aligned) of which the first `valid` come from src
// and the rest are zero (src is not read when valid is 0).
__device__ __forceinline__ void gm_copy(float* dst, const float* src, int valid) {
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid * 4));
}

// Rows of the staged slices are padded so that the fragment reads (lanes g = lane / 4 over
// rows, t = lane % 4 over the inner dimension) hit 32 different banks; every row starts on a
// 16-byte boundary.
#define GM_LDA (GM_BK + 4)
#define GM_LDB (GM_BN + 8)
#define GM_LDBT (GM_BK + 4)
#define GM_A_FLOATS (GM_BM * GM_LDA)
#define GM_B_FLOATS (GM_BK * GM_LDB > GM_BN * GM_LDBT ? GM_BK * GM_LDB : GM_BN * GM_LDBT)

// Rows [r0, r0 + R) and columns [c0, c0 + C) of a row-major matrix (row stride ld; rows from
// rlim and columns from clim on read as zero) into shared memory with row pitch LD, 16 bytes a
// copy (every row of the matrix starts on a 16-byte boundary).
template <int R, int C, int LD>
__device__ __forceinline__ void gm_tile(float* dst, const float* __restrict__ src, int ld, int r0, int rlim, int c0,
                                        int clim) {
    constexpr int CW = C / 4;
#pragma unroll
    for (int i = threadIdx.x; i < R * CW; i += GM_THREADS) {
        const int r = i / CW, c = (i % CW) * 4;
        const int valid = r0 + r < rlim ? max(0, min(4, clim - c0 - c)) : 0;
        gm_copy(dst + r * LD + c, valid ? src + (size_t)(r0 + r) * ld + c0 + c : src, valid);
    }
}

// Slice [k0, k0 + GM_BK) of the block's rows of A and columns of B into shared memory.
template <bool BT>
__device__ __forceinline__ void gm_stage(float* as, float* bs, const float* __restrict__ a, int lda,
                                         const float* __restrict__ b, int ldb, int row0, int col0, int k0, int m,
                                         int n, int k) {
    gm_tile<GM_BM, GM_BK, GM_LDA>(as, a, lda, row0, m, k0, k);
    if constexpr (BT) {  // B's columns are the rows of its transpose
        gm_tile<GM_BN, GM_BK, GM_LDBT>(bs, b, ldb, col0, n, k0, k);
    } else {
        gm_tile<GM_BK, GM_BN, GM_LDB>(bs, b, ldb, k0, k, col0, n);
    }
}

template <bool BT>
__device__ __forceinline__ void gm_product(const float* __restrict__ a, int lda, const float* __restrict__ b, int ldb,
                                           float* __restrict__ c, int ldc, int m, int n, int k, int accumulate) {
    extern __shared__ __align__(16) float gm_shared[];
    float* as = gm_shared;
    float* bs = gm_shared + GM_STAGES * GM_A_FLOATS;
    const int row0 = blockIdx.y * GM_BM, col0 = blockIdx.x * GM_BN;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wm = (warp >> 1) * 64, wn = (warp & 1) * 32;
    const int g = lane >> 2, t = lane & 3;
    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    // GM_STAGES - 1 slices in flight before the first is used; then each step waits for its
    // slice, and once every thread is past the previous step refills that step's stage.
    const int slices = (k + GM_BK - 1) / GM_BK;
#pragma unroll
    for (int s = 0; s < GM_STAGES - 1; ++s) {
        if (s < slices) {
            gm_stage<BT>(as + s * GM_A_FLOATS, bs + s * GM_B_FLOATS, a, lda, b, ldb, row0, col0, s * GM_BK, m, n, k);
        }
        asm volatile("cp.async.commit_group;");
    }
    for (int s = 0; s < slices; ++s) {
        asm volatile("cp.async.wait_group %0;" ::"n"(GM_STAGES - 2));
        __syncthreads();
        const int next = s + GM_STAGES - 1;
        if (next < slices) {
            const int at = next % GM_STAGES;
            gm_stage<BT>(as + at * GM_A_FLOATS, bs + at * GM_B_FLOATS, a, lda, b, ldb, row0, col0, next * GM_BK, m,
                            n, k);
        }
        asm volatile("cp.async.commit_group;");
        const float* A = as + (s % GM_STAGES) * GM_A_FLOATS;
        const float* B = bs + (s % GM_STAGES) * GM_B_FLOATS;
#pragma unroll
        for (int kk = 0; kk < GM_BK; kk += 8) {
            unsigned a_big[4][4], a_small[4][4], b_big[4][2], b_small[4][2];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float* ar = A + (wm + i * 16 + g) * GM_LDA + kk + t;
                gm_split(ar[0], a_big[i][0], a_small[i][0]);
                gm_split(ar[8 * GM_LDA], a_big[i][1], a_small[i][1]);
                gm_split(ar[4], a_big[i][2], a_small[i][2]);
                gm_split(ar[8 * GM_LDA + 4], a_big[i][3], a_small[i][3]);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int col = wn + j * 8 + g;
                const float b0 = BT ? B[col * GM_LDBT + kk + t] : B[(kk + t) * GM_LDB + col];
                const float b1 = BT ? B[col * GM_LDBT + kk + t + 4] : B[(kk + t + 4) * GM_LDB + col];
                gm_split(b0, b_big[j][0], b_small[j][0]);
                gm_split(b1, b_big[j][1], b_small[j][1]);
            }
            // The small terms first, each pass over all 16 tiles (independent accumulators
            // between two products into one tile).
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) gm_mma(acc[i][j], a_small[i], b_big[j]);
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) gm_mma(acc[i][j], a_big[i], b_small[j]);
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) gm_mma(acc[i][j], a_big[i], b_big[j]);
        }
    }
    // Lane (g, t) holds rows g and g + 8, columns 2t and 2t + 1 of each 16 x 8 tile: a float2
    // a row where C's rows start on 8-byte boundaries (each store then fills whole sectors).
    const bool pairs = (ldc % 2 == 0) && (reinterpret_cast<size_t>(c) % 8 == 0);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = row0 + wm + i * 16 + g + h * 8, col = col0 + wn + j * 8 + 2 * t;
                if (r >= m || col >= n) continue;
                float* p = c + (size_t)r * ldc + col;
                float2 v = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
                if (pairs && col + 1 < n) {
                    if (accumulate) {
                        const float2 old = *reinterpret_cast<const float2*>(p);
                        v.x += old.x;
                        v.y += old.y;
                    }
                    *reinterpret_cast<float2*>(p) = v;
                } else {
                    p[0] = accumulate ? p[0] + v.x : v.x;
                    if (col + 1 < n) p[1] = accumulate ? p[1] + v.y : v.y;
                }
            }
}

// The entry points: B as it lies (nn) or as its transpose (nt). Every row of A and B starts on a
// 16-byte boundary (lda, ldb multiples of 4, aligned bases); C's rows on an 8-byte one where
// whole pairs are stored.
#define GM_ENTRY(name, BT)                                                                                 \
    extern "C" __global__ void __launch_bounds__(GM_THREADS, GM_BLOCKS)                                    \
        name(const float* __restrict__ a, int lda, const float* __restrict__ b, int ldb, float* __restrict__ c, \
             int ldc, int m, int n, int k, int accumulate) {                                               \
        gm_product<BT>(a, lda, b, ldb, c, ldc, m, n, k, accumulate);                                       \
    }
GM_ENTRY(gemm_tf32x3_nn, false)
GM_ENTRY(gemm_tf32x3_nt, true)
