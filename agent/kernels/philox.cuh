// Philox4x32-10 (Salmon et al. 2011), device side; the NumPy twin is agent/policy/philox.py.
// Stream layout (ALGORITHMS.md section 3): key = (seed_lo, seed_hi);
// counter = (step_lo, step_hi, env, purpose << 16 | block); u = (x >> 8) * 2^-24 in [0, 1).
#pragma once

struct Philox4 {
    unsigned int v[4];
};

__device__ __forceinline__ Philox4 philox4x32_10(Philox4 c, unsigned int k0, unsigned int k1) {
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        const unsigned int lo0 = 0xD2511F53u * c.v[0];
        const unsigned int hi0 = __umulhi(0xD2511F53u, c.v[0]);
        const unsigned int lo1 = 0xCD9E8D57u * c.v[2];
        const unsigned int hi1 = __umulhi(0xCD9E8D57u, c.v[2]);
        Philox4 n;
        n.v[0] = hi1 ^ c.v[1] ^ k0;
        n.v[1] = lo1;
        n.v[2] = hi0 ^ c.v[3] ^ k1;
        n.v[3] = lo0;
        c = n;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return c;
}

__device__ __forceinline__ float philox_uniform(unsigned int x) {
    return (float)(x >> 8) * 5.9604644775390625e-08f;  // 2^-24, exact
}

// Four uniforms of stream (seed, env, step, purpose, block).
__device__ __forceinline__ Philox4 philox_draw(unsigned long long seed, unsigned int env,
                                               unsigned long long step, unsigned int purpose,
                                               unsigned int block) {
    Philox4 c;
    c.v[0] = (unsigned int)(step & 0xFFFFFFFFull);
    c.v[1] = (unsigned int)(step >> 32);
    c.v[2] = env;
    c.v[3] = (purpose << 16) | block;
    return philox4x32_10(c, (unsigned int)(seed & 0xFFFFFFFFull), (unsigned int)(seed >> 32));
}
