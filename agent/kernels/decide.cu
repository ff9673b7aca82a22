// One whole decision per thread block (the engine's only kernel): window push -> Mamba2
// encoder -> C51 and return-head moments -> action (Thompson, or the best expected Q when
// greedy) -> Kelly x regime size.
// References: window_push_ref, mamba_forward_ref, softmax_ev_ref, thompson_ref or greedy_ref and
// kelly_size_ref, chained as agent/gpu/cpu_runner.py does; the stages are the device functions
// of mamba_forward.cuh, softmax_ev.cuh, thompson.cuh and kelly.cuh.
//
// Macros: those of mamba_forward.cuh, plus MF_A actions and MF_ATOMS atoms (MF_NQ = A * atoms).
// Inputs (B rows; pinned mapped host memory, or device memory where the engine copies them
// first: agent/gpu/cuda_runner.py): rows (B, F) raw features of the new bar; slot
// (B) int32 (< 0: padded row, skipped); healthy (B) uint8; position (B) int32; regime (B)
// float32; spread_col the column of rows holding the book's spread in ticks (Kelly's cost
// gate). Device, per slot: window (slots, K, F) raw features, bars (rows pushed) and steps
// (decisions made), updated in place (slots distinct within a launch); tick_value float64.
// The model's, per slot: cache (slots, K, MF_CW) the ring of the first layer's per-row work
// (MfRows in mamba_forward.cuh) and cached the rows pushed when the ring last held the window
// (any other value: stale, the whole window is computed and stored, as after a model is loaded).
// A row is pushed when healthy and every feature is finite; it is valid (sized, else its
// position is kept) when pushed and the slot has K bars; its Thompson key is the slot's step.
// Out: one DecideOut record per row (pinned mapped host memory), with the global nanosecond
// timer read when the row's (lead) block starts and when it has written the record: the host
// reads the launch's device time as the span of its rows.
// MF_CL blocks a row (a cluster, mamba_forward.cuh): every rank pushes and normalises the window
// for itself; rank 0 alone keeps the slot's counters, writes the pushed window back (once the
// cluster is past its first barrier, when every rank has read the old one) and runs the tail.
// Every rank reads the slot's counters itself, and rank 0 writes them once the forward is done
// (past the cluster's barriers: every rank has read them by then).

#include "kelly.cuh"
#include "mamba_forward.cuh"
#include "softmax_ev.cuh"
#include "thompson.cuh"

// agent/kernels/decide.py (OUT_DTYPE) mirrors this layout.
struct DecideOut {
    double f_star;
    double size;
    double regime_scale;
    unsigned long long step;
    unsigned long long start_ns;
    unsigned long long end_ns;
    float q[MF_A];
    float ret_mean;
    float ret_var;
    int action;
    int target;
    signed char direction;
    unsigned char valid;
};

// The global nanosecond timer (the emulation: the host's steady clock).
__device__ __forceinline__ unsigned long long decide_now_ns() {
#ifdef __CUDA_ARCH__
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
#else
    return emu::now_ns();
#endif
}

static_assert(MF_F <= MF_THREADS && MF_F <= MF_K * MF_D, "one thread and one staging float a feature");

extern "C" __global__ void MF_CLUSTER_DIMS MF_BOUNDS
decide_kernel(const float* __restrict__ P, const float* __restrict__ support,
              const float* __restrict__ centres32, const double* __restrict__ centres64,
              float* __restrict__ window, unsigned long long* __restrict__ bars,
              unsigned long long* __restrict__ steps, float* __restrict__ cache,
              unsigned long long* __restrict__ cached, const double* __restrict__ tick_value,
              const float* __restrict__ rows, const int* __restrict__ slot,
              const unsigned char* __restrict__ healthy, const int* __restrict__ position,
              const float* __restrict__ regime, int greedy, unsigned long long seed, unsigned int purpose,
              double capital, double fee, double min_edge, double kelly_fraction, double scale_floor,
              int max_contracts, int spread_col, DecideOut* __restrict__ out) {
    extern __shared__ __align__(16) float sm[];
    __shared__ unsigned long long row_step, row_now;
    __shared__ int row_position, row_valid;
    __shared__ float row_regime, row_spread;
    __shared__ float row_q[MF_A];
    const unsigned long long start_ns = decide_now_ns();
    const int b = blockIdx.x / MF_CL;
    const bool lead = mf_rank() == 0;  // the row's bookkeeping and tail (the block, outside clusters)
#if MF_CL > 1
    P += (size_t)mf_rank() * MF_PSTRIDE;
#endif
    // Every read of the inputs is issued here, at once: where they lie in host memory, one PCIe
    // round trip, not one a stage.
    const int s = slot[b];
    const bool ok = healthy[b] != 0;
    const float fresh = threadIdx.x < MF_F ? rows[(size_t)b * MF_F + threadIdx.x] : 0.0f;
    int pos = 0;
    float reg = 0.0f;
    if (threadIdx.x == 0 && lead) {
        pos = position[b];
        reg = regime[b];
    }
    // The normalisation's mean and std of this thread's feature (the same for every element it
    // pushes where F divides the block), read while the inputs' reads are under way.
    constexpr bool ONE_F = MF_THREADS % MF_F == 0;
    const float mean = ONE_F ? __ldg(P + OFF_MEAN + threadIdx.x % MF_F) : 0.0f;
    const float sd = ONE_F ? __ldg(P + OFF_STD + threadIdx.x % MF_F) : 1.0f;
    mf_forward_begin(P, sm);  // the weights' copies start while the reads above cross the bus
    if (s < 0) {
        if (MF_STAGE) mf_stage_wait();  // no copy outlives its block (the row is the same for all)
        return;
    }
    const unsigned long long seen = bars[s], ring_at = cached[s];  // every thread (one address a warp)
    unsigned long long step = 0;
    if (threadIdx.x == 0 && lead) step = steps[s];

    // Window push: the new window is the old one's bars 1..K-1 and the new row. Stage the old
    // window (normalised later) and the new row (in the free pre-norm buffer), then decide.
    constexpr int KEEP = (MF_K - 1) * MF_F;
    constexpr int PER = (MF_K * MF_F + MF_THREADS - 1) / MF_THREADS;
    float* win = window + (size_t)s * MF_K * MF_F;
    float* old = sm + SM_ZX;
    float* row = sm + SM_US;
#pragma unroll
    for (int r = 0; r < PER; ++r) {
        const int i = threadIdx.x + r * MF_THREADS;
        if (i < MF_K * MF_F) old[i] = win[i];
    }
    if (threadIdx.x < MF_F) row[threadIdx.x] = fresh;
    if (threadIdx.x == spread_col && lead) row_spread = fresh;  // visible after the barrier below
    const bool pushed = !__syncthreads_or(threadIdx.x < MF_F && !isfinite(fresh)) && ok;
    float raw[PER];
#pragma unroll
    for (int r = 0; r < PER; ++r) {
        const int i = threadIdx.x + r * MF_THREADS;
        if (i < MF_K * MF_F) raw[r] = !pushed ? old[i] : (i < KEEP ? old[i + MF_F] : row[i - KEEP]);
    }
    __syncthreads();  // every staged value read before the buffer is overwritten
#pragma unroll
    for (int r = 0; r < PER; ++r) {
        const int i = threadIdx.x + r * MF_THREADS;
        if (i < MF_K * MF_F) {
            const int f = i % MF_F;
            old[i] = ONE_F ? (raw[r] - mean) / sd
                           : (raw[r] - __ldg(P + OFF_MEAN + f)) / __ldg(P + OFF_STD + f);
            if (MF_CL == 1 && pushed) win[i] = raw[r];
        }
    }
    const unsigned long long now = seen + (pushed ? 1ull : 0ull);  // rows pushed after this one
    if (threadIdx.x == 0 && lead) {
        row_step = step;
        row_now = now;
        row_valid = pushed && seen + 1ull >= (unsigned long long)MF_K;
        row_position = pos;
        row_regime = reg;
    }

    const MfRows ring{cache + (size_t)s * MF_K * MF_CW, (int)(now % MF_K),
                      ring_at != seen ? 0 : pushed ? MF_K - 1 : MF_K};
    if (!mf_forward<true>(P, sm, ring)) return;
    if (threadIdx.x == 0) {  // rank 0 (the others have returned)
        bars[s] = row_now;
        steps[s] = row_step + 1ull;
        cached[s] = row_now;
    }
    if (MF_CL > 1 && pushed) {
#pragma unroll
        for (int r = 0; r < PER; ++r) {
            const int i = threadIdx.x + r * MF_THREADS;
            if (i < MF_K * MF_F) win[i] = raw[r];
        }
    }

    // Softmax and moments: warp a < A the C51 row of action a, warp A the return head.
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float* qprobs = sm + SM_PROBS;
    float* rprobs = sm + SM_PROBS + MF_R4(MF_NQ);
    DecideOut* o = out + b;
    if (warp < MF_A) {
        float mean, var;
        sev_row(sm + SM_LOGITS + warp * MF_ATOMS, support, MF_ATOMS, qprobs + warp * MF_ATOMS, mean, var);
        if (lane == 0) {
            o->q[warp] = mean;
            row_q[warp] = mean;
        }
    } else if (warp == MF_A) {
        float mean, var;
        sev_row(sm + SM_LOGITS + MF_R4(MF_NQ), centres32, MF_NR, rprobs, mean, var);
        if (lane == 0) {
            o->ret_mean = mean;
            o->ret_var = var;
        }
    }
    __syncthreads();
    if (warp == 0) {
        const int best = select_action_warp(greedy != 0, row_q, qprobs, support, seed, purpose, (unsigned int)s,
                                            row_step, MF_A, MF_ATOMS);
        const KellyPolicy pol{capital, fee, min_edge, kelly_fraction, scale_floor, max_contracts};
        const KellyResult k = kelly_warp(rprobs, centres64, MF_NR, best - 1, tick_value[s], row_regime,
                                         row_spread, row_valid != 0, row_position, pol);
        if (lane == 0) {
            o->f_star = k.f_star;
            o->size = k.size;
            o->regime_scale = k.scale;
            o->step = row_step;
            o->action = best;
            o->target = k.target;
            o->direction = (signed char)(best - 1);
            o->valid = (unsigned char)row_valid;
            o->start_ns = start_ns;
            o->end_ns = decide_now_ns();
        }
    }
}
