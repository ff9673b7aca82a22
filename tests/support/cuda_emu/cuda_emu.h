// A CUDA C++ execution model on the CPU, for testing the project's kernels where no GPU is.
//
// Each thread block runs on one host thread as cooperative fibers (ucontext), one fiber per CUDA
// thread, in lane order; __syncthreads() and the warp collectives (__syncwarp, __shfl*_sync,
// __syncthreads_or) switch fibers at their barriers, so a kernel that is correct under CUDA's
// barrier rules runs here with the same results up to floating-point contraction. Blocks run one
// after another (as a GPU may), so `__shared__` variables become function statics; the blocks of
// a thread-block cluster run together (their fibers interleaved), with the cluster barrier and
// the mapping of one block's dynamic shared memory onto another's (emu::cluster_*).
//
// Used by tests/support/cuda_emu.py, which compiles a kernel file with g++ against this header
// and calls it through ctypes with the driver API's argument convention (an array of pointers to
// the arguments). Not for speed: a block of 512 threads costs ~1 ms per barrier.
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }

namespace emu {

enum class Wait { kNone, kBlock, kWarp, kCluster, kDone };

constexpr size_t kStack = 256 * 1024;

struct Fiber {
    ucontext_t ctx;
    std::unique_ptr<char[]> stack{new char[kStack]};  // uninitialised: pages committed as used
    dim3 idx;
    int linear = 0;
    Wait wait = Wait::kNone;
};

struct Block {
    std::vector<Fiber> fibers;
    ucontext_t scheduler;
    int current = -1;
    std::function<void()> body;
    std::vector<unsigned char> shared;
    // Collective exchange: one 8-byte slot a thread, reused by every collective.
    std::vector<uint64_t> slot;
    // mma_m16n8k8_tf32's exchange: a thread's six fragment registers.
    std::vector<float> mma;
    dim3 block_dim, grid_dim, block_idx;
    int rank = 0;  // in the cluster
    std::vector<Block>* cluster = nullptr;
};

inline Block*& block() {
    static Block* b = nullptr;
    return b;
}

inline Fiber& self() { return block()->fibers[block()->current]; }

inline void yield(Wait w) {
    Block* b = block();
    Fiber& f = self();
    f.wait = w;
    swapcontext(&f.ctx, &b->scheduler);
}

inline void fiber_entry() {
    block()->body();
    yield(Wait::kDone);
}

inline int warp_of(int linear) { return linear / 32; }

// Run every fiber that is not waiting until it waits; then release a barrier that every live
// participant has reached (a block's, a warp's, or the cluster's). Returns when all are done.
inline void schedule(std::vector<Block>& blocks) {
    for (;;) {
        bool ran = false;
        for (Block& b : blocks) {
            block() = &b;
            for (int i = 0; i < (int)b.fibers.size(); ++i) {
                if (b.fibers[i].wait == Wait::kNone) {
                    b.current = i;
                    swapcontext(&b.scheduler, &b.fibers[i].ctx);
                    ran = true;
                }
            }
        }
        if (ran) continue;
        int live = 0, at_cluster = 0;
        for (Block& b : blocks) {
            for (auto& f : b.fibers) {
                if (f.wait != Wait::kDone) ++live;
                if (f.wait == Wait::kCluster) ++at_cluster;
            }
        }
        if (live == 0) return;
        bool released = false;
        if (at_cluster == live) {
            for (Block& b : blocks) {
                for (auto& f : b.fibers) f.wait = Wait::kNone;
            }
            continue;
        }
        for (Block& b : blocks) {
            const int n = (int)b.fibers.size();
            int block_live = 0, at_block = 0;
            for (auto& f : b.fibers) {
                if (f.wait != Wait::kDone) ++block_live;
                if (f.wait == Wait::kBlock) ++at_block;
            }
            if (block_live > 0 && at_block == block_live) {
                for (auto& f : b.fibers) f.wait = Wait::kNone;
                released = true;
                continue;
            }
            const int warps = (n + 31) / 32;
            for (int w = 0; w < warps; ++w) {
                int wl = 0, ww = 0;
                for (int i = w * 32; i < std::min(n, w * 32 + 32); ++i) {
                    if (b.fibers[i].wait != Wait::kDone) ++wl;
                    if (b.fibers[i].wait == Wait::kWarp) ++ww;
                }
                if (wl > 0 && ww == wl) {
                    for (int i = w * 32; i < std::min(n, w * 32 + 32); ++i) {
                        if (b.fibers[i].wait == Wait::kWarp) b.fibers[i].wait = Wait::kNone;
                    }
                    released = true;
                }
            }
        }
        if (!released) {
            std::fprintf(stderr, "cuda_emu: deadlock (threads wait at barriers that cannot complete)\n");
            std::abort();
        }
    }
}

// Run the grid cluster by cluster (`cluster` consecutive blocks along x, together).
inline void run_grid(dim3 grid, dim3 blk, size_t shared_bytes, unsigned int cluster,
                     const std::function<void()>& kernel) {
    if (cluster == 0 || grid.x % cluster != 0) {
        std::fprintf(stderr, "cuda_emu: grid.x %u is not a multiple of the cluster size %u\n", grid.x, cluster);
        std::abort();
    }
    const int n = (int)(blk.x * blk.y * blk.z);
    std::vector<Block> blocks(cluster);
    for (unsigned int r = 0; r < cluster; ++r) {
        Block& b = blocks[r];
        b.body = kernel;
        b.block_dim = blk;
        b.grid_dim = grid;
        b.rank = (int)r;
        b.cluster = &blocks;
        b.fibers.resize(n);
        b.slot.assign(n, 0);
        b.mma.assign(6 * (size_t)n, 0.0f);
    }
    for (unsigned int bz = 0; bz < grid.z; ++bz) {
        for (unsigned int by = 0; by < grid.y; ++by) {
            for (unsigned int bx = 0; bx < grid.x; bx += cluster) {
                for (unsigned int r = 0; r < cluster; ++r) {
                    Block& b = blocks[r];
                    b.block_idx = dim3{bx + r, by, bz};
                    // Fresh shared memory a block, filled with a NaN pattern: reads of unwritten
                    // shared memory show up in results.
                    b.shared.assign(shared_bytes + 16, 0xFF);
                    for (int i = 0; i < n; ++i) {
                        Fiber& f = b.fibers[i];
                        f.linear = i;
                        f.idx = dim3{(unsigned)(i % blk.x), (unsigned)((i / blk.x) % blk.y),
                                     (unsigned)(i / (blk.x * blk.y))};
                        f.wait = Wait::kNone;
                        getcontext(&f.ctx);
                        f.ctx.uc_stack.ss_sp = f.stack.get();
                        f.ctx.uc_stack.ss_size = kStack;
                        f.ctx.uc_link = nullptr;
                        makecontext(&f.ctx, fiber_entry, 0);
                    }
                }
                schedule(blocks);
            }
        }
    }
    block() = nullptr;
}

inline void* shared_of(Block& b) {
    auto addr = reinterpret_cast<uintptr_t>(b.shared.data());
    return reinterpret_cast<void*>((addr + 15) & ~uintptr_t(15));
}

inline void* dynamic_shared() { return shared_of(*block()); }

inline int cluster_rank() { return block()->rank; }

// p (in this block's dynamic shared memory) at the same offset in cluster rank `rank`'s.
template <typename T>
inline T* cluster_peer(T* p, int rank) {
    Block* b = block();
    const auto offset = reinterpret_cast<char*>(p) - static_cast<char*>(shared_of(*b));
    if (offset < 0 || (size_t)offset >= b->shared.size() || rank < 0 || rank >= (int)b->cluster->size()) {
        std::fprintf(stderr, "cuda_emu: a cluster mapping outside dynamic shared memory or the cluster\n");
        std::abort();
    }
    return reinterpret_cast<T*>(static_cast<char*>(shared_of((*b->cluster)[rank])) + offset);
}

inline void cluster_sync() { yield(Wait::kCluster); }

inline unsigned long long now_ns() {
    return (unsigned long long)std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

template <typename T>
inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "collectives take values of at most 8 bytes");
    uint64_t u = 0;
    std::memcpy(&u, &v, sizeof(T));
    return u;
}

template <typename T>
inline T from_bits(uint64_t u) {
    T v;
    std::memcpy(&v, &u, sizeof(T));
    return v;
}

// Publish v, wait for the warp, read lane src's value, wait again (the slot is then reusable).
template <typename T>
inline T warp_exchange(T v, int src_lane) {
    Block* b = block();
    const int me = self().linear;
    b->slot[me] = to_bits(v);
    yield(Wait::kWarp);
    const int src = warp_of(me) * 32 + (src_lane & 31);
    const T out = src < (int)b->slot.size() ? from_bits<T>(b->slot[src]) : v;
    yield(Wait::kWarp);
    return out;
}

// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 for the calling warp: d += A B with the
// PTX fragment layout (lane l, g = l / 4, q = l % 4: a = A[g][q], A[g + 8][q], A[g][q + 4],
// A[g + 8][q + 4]; b = B[q][g], B[q + 4][g]; d = D[g][2q], D[g][2q + 1], D[g + 8][2q],
// D[g + 8][2q + 1]). Operands are used as given (the kernels pass TF32 values: float32 with the
// low 13 mantissa bits clear, whose products float32 holds exactly).
inline void mma_m16n8k8_tf32(float (&d)[4], const float (&a)[4], float b0, float b1) {
    Block* b = block();
    const int me = self().linear, lane = me & 31, base = me - lane;
    float* mine = &b->mma[6 * (size_t)me];
    for (int i = 0; i < 4; ++i) mine[i] = a[i];
    mine[4] = b0;
    mine[5] = b1;
    yield(Wait::kWarp);
    const int g = lane >> 2, q = lane & 3;
    const float* regs = &b->mma[6 * (size_t)base];
    for (int r = 0; r < 4; ++r) {
        const int row = g + 8 * (r >> 1), col = 2 * q + (r & 1);
        float sum = 0.0f;
        for (int k = 0; k < 8; ++k) {
            const float av = regs[6 * ((row % 8) * 4 + k % 4) + (row >= 8 ? 1 : 0) + (k >= 4 ? 2 : 0)];
            const float bv = regs[6 * (col * 4 + k % 4) + 4 + (k >= 4 ? 1 : 0)];
            sum += av * bv;
        }
        d[r] += sum;
    }
    yield(Wait::kWarp);
}

}  // namespace emu

#define threadIdx (emu::self().idx)
#define blockIdx (emu::block()->block_idx)
#define blockDim (emu::block()->block_dim)
#define gridDim (emu::block()->grid_dim)
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __align__(n) alignas(n)
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define __shared__ static

inline void __syncthreads() { emu::yield(emu::Wait::kBlock); }
inline void __syncwarp(unsigned int = 0xffffffffu) { emu::yield(emu::Wait::kWarp); }
inline int __syncthreads_or(int pred) {
    emu::Block* b = emu::block();
    b->slot[emu::self().linear] = pred != 0;
    emu::yield(emu::Wait::kBlock);
    int any = 0;
    for (uint64_t v : b->slot) any |= (int)(v != 0);
    emu::yield(emu::Wait::kBlock);
    return any;
}
template <typename T>
inline T __shfl_sync(unsigned int, T v, int src) {
    return emu::warp_exchange(v, src);
}
template <typename T>
inline T __shfl_xor_sync(unsigned int, T v, int mask) {
    return emu::warp_exchange(v, (int)(emu::self().linear & 31) ^ mask);
}
template <typename T>
inline T __shfl_down_sync(unsigned int, T v, int delta) {
    const int lane = emu::self().linear & 31;
    return emu::warp_exchange(v, lane + delta < 32 ? lane + delta : lane);
}
template <typename T>
inline T __ldg(const T* p) {
    return *p;
}
inline unsigned int __umulhi(unsigned int a, unsigned int b) {
    return (unsigned int)(((unsigned long long)a * b) >> 32);
}
inline float __int_as_float(int i) { return emu::from_bits<float>((uint64_t)(uint32_t)i); }
inline float __uint_as_float(unsigned int i) { return emu::from_bits<float>((uint64_t)i); }
inline unsigned int __float_as_uint(float x) { return (unsigned int)emu::to_bits(x); }
inline double __longlong_as_double(long long i) { return emu::from_bits<double>((uint64_t)i); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float atomicAdd(float* p, float v) {
    const float old = *p;
    *p = old + v;
    return old;
}
inline unsigned int atomicAdd(unsigned int* p, unsigned int v) {
    const unsigned int old = *p;
    *p = old + v;
    return old;
}
using std::isfinite;
using std::max;
using std::min;
inline float fminf(float a, float b) { return std::fmin(a, b); }
inline float fmaxf(float a, float b) { return std::fmax(a, b); }
using std::isnan;

// Launch a kernel with the driver API's argument convention: args[i] points at argument i.
template <typename... A, size_t... I>
inline void emu_call(void (*k)(A...), void** args, std::index_sequence<I...>) {
    k(*reinterpret_cast<std::remove_reference_t<A>*>(args[I])...);
}

template <typename... A>
inline void emu_launch(void (*k)(A...), const unsigned int* dims, size_t shared_bytes, unsigned int cluster,
                       void** args) {
    emu::run_grid(dim3{dims[0], dims[1], dims[2]}, dim3{dims[3], dims[4], dims[5]}, shared_bytes, cluster,
                  [&] { emu_call(k, args, std::index_sequence_for<A...>{}); });
}

// EMU_EXPORT(name, cluster) after the kernel's definition: extern "C" emu_launch_<name>(dims,
// shared, args), `cluster` blocks a cluster (the kernel's __cluster_dims__ x, else 1).
#define EMU_EXPORT(name, cluster)                                                             \
    extern "C" void emu_launch_##name(const unsigned int* dims, size_t shared_bytes, void** args) { \
        emu_launch(&name, dims, shared_bytes, (cluster), args);                               \
    }
