"""The Mamba2 block: forward and backward of the window form (ALGORITHMS 1.2, 1.4, 1.5).

Shapes: Bt batch, L window (K), d model width, Di inner width, H heads of P = headdim, G
groups, N = d_state, Cd = Di + 2GN conv channels, W conv width, Q chunk length.

The state-space scan runs in the chunked SSD ("quadratic") form: inside a chunk of Q steps
the output is a masked [Q, Q] matrix product, chunks are chained by their [P, N] states.
Everything is batched matmul over (Bt, G, H/G) with Python loops only over chunks (one chunk
by default, Q = K), which is what a GPU wants. Decay factors are exponentials of masked
segment sums (always <= 0), never ``exp(cum_t) * exp(-cum_s)``. :func:`ssd_ref` is the
sequential recurrence the chunked form is tested against.

Internally head quantities live as (Bt, G, H/G, L, ...) and group quantities as (Bt, G, 1,
L, ...), so that one broadcast matmul serves every head of a group and the gradients of B
and C are sums over the heads axis.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from agent.model.arrays import Array, Params, array_module
from agent.model.errors import ModelError
from agent.model.ops import (
    exp_floor,
    linear,
    rmsnorm,
    rmsnorm_backward,
    sigmoid,
    silu,
    silu_grad,
    softplus,
    sum_leading,
)

__all__ = [
    "BlockCache",
    "block_backward",
    "block_forward",
    "ssd_chunked",
    "ssd_chunked_backward",
    "ssd_ref",
]


def _t(a: Array) -> Array:
    """Swap the last two axes."""
    return a.swapaxes(-1, -2)


def _heads(x: Array, dt: Array, A: Array, B: Array, C: Array) -> tuple[Array, Array, Array, Array, Array]:
    """(Bt,L,H,P), (Bt,L,H), (H), (Bt,L,G,N) x2 -> grouped head-major layouts."""
    bt, length, h, p = x.shape
    g = B.shape[2]
    xh = x.reshape(bt, length, g, h // g, p).transpose(0, 2, 3, 1, 4)  # (Bt,G,Hg,L,P)
    dth = dt.reshape(bt, length, g, h // g).transpose(0, 2, 3, 1)  # (Bt,G,Hg,L)
    Bg = B.transpose(0, 2, 1, 3)[:, :, None]  # (Bt,G,1,L,N)
    Cg = C.transpose(0, 2, 1, 3)[:, :, None]
    return xh, dth, A.reshape(g, h // g), Bg, Cg


def _chunks(length: int, chunk: int) -> list[tuple[int, int]]:
    return [(t0, min(t0 + chunk, length)) for t0 in range(0, length, chunk)]


class _Decays:
    """Decays of one chunk from dt (.., Q) and A (G, Hg), each built when first used (the full
    output of a one-chunk window needs neither ``e`` nor ``w``).

    With ``cum_t = sum_{r <= t} dt_r A`` inside the chunk: ``e_t = exp(cum_t)`` (.., Q);
    ``w_s = exp(cum_{Q-1} - cum_s)`` (.., Q); :meth:`lam` gives ``Lam[t, s] = exp(cum_t -
    cum_s)`` for s <= t. Every exponent is clipped into [exp_floor, 0] (A < 0, dt > 0 make them
    <= 0 where used; the floor avoids subnormal results).
    """

    def __init__(self, dtc: Array, Ag: Array) -> None:
        self.xp = array_module(dtc)
        self.lo = exp_floor(dtc.dtype)
        self.cum = self.xp.cumsum(dtc * Ag[..., None], axis=-1)

    @functools.cached_property
    def e(self) -> Array:
        return self.xp.exp(self.xp.maximum(self.cum, self.lo))

    @functools.cached_property
    def w(self) -> Array:
        return self.xp.exp(self.xp.maximum(self.cum[..., -1:] - self.cum, self.lo))

    def lam(self, *, last_row: bool) -> Array:
        """Lam rows (.., R, Q). With ``last_row`` only the last row, R = 1: a view of ``w``, no
        [Q, Q] array built. Otherwise R = Q, a new array, *not* masked: its entries above the
        diagonal are 1 (exp of a clipped 0), and the callers apply the causal mask
        (:func:`_causal`) to the [Q, Q] products that heads share, H/G times fewer entries."""
        if last_row:
            return self.w[..., None, :]
        xp, cum = self.xp, self.cum
        seg = xp.empty((*cum.shape, cum.shape[-1]), dtype=cum.dtype)
        seg[...] = cum[..., :, None]  # a broadcast copy, then a subtraction in place: ~1.6x faster
        seg -= cum[..., None, :]  # than one broadcast subtraction into a new array (NumPy, B = 32)
        return xp.exp(xp.clip(seg, self.lo, 0.0, out=seg), out=seg)


def _causal(m: Array) -> Array:
    """Zero the entries above the diagonal of the [Q, Q] matrices in ``m`` (in place)."""
    xp = array_module(m)
    m *= xp.tri(m.shape[-1], dtype=m.dtype)
    return m


def ssd_chunked(
    x: Array, dt: Array, A: Array, B: Array, C: Array, *, chunk: int, last_only: bool = False
) -> tuple[Array, list[Array | None]]:
    """SSM scan of a window from zero state, chunked SSD form (ALGORITHMS 1.4), no D skip.

    x (Bt,L,H,P), dt (Bt,L,H) > 0, A (H) < 0, B and C (Bt,L,G,N) -> y (Bt,L,H,P) with
    ``h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T``, ``y_t = h_t C_t``, ``h_{-1} = 0``; with
    ``last_only`` only y at the last step, (Bt,1,H,P), which needs no [Q, Q] product at all
    (the network reads its last block there only). Also returns the state entering each
    chunk ((Bt,G,H/G,P,N); None for the first, which is zero), kept for the backward pass.
    """
    xp = array_module(x, dt, A, B, C)
    bt, length, h, p = x.shape
    xh, dth, Ag, Bg, Cg = _heads(x, dt, A, B, C)
    spans = _chunks(length, chunk)
    ys: list[Array] = []
    states: list[Array | None] = [None]
    for c, (t0, t1) in enumerate(spans):
        xc, dtc, Bc, Cc = xh[..., t0:t1, :], dth[..., t0:t1], Bg[..., t0:t1, :], Cg[..., t0:t1, :]
        last = c + 1 == len(spans)
        decays = _Decays(dtc, Ag)
        U = dtc[..., None] * xc
        hin = states[c]
        if last or not last_only:
            rows = slice(-1, None) if last_only else slice(None)
            Cr = Cc[..., rows, :]
            CB = xp.matmul(Cr, _t(Bc))  # (Bt,G,1,R,Q): one per group, shared by its heads
            lam = decays.lam(last_row=last_only)
            # Lam (a fresh [Q, Q] array unless last_only: then a view of w) is not needed afterwards
            M = CB * lam if last_only else xp.multiply(lam, _causal(CB), out=lam)
            y = xp.matmul(M, U)
            if hin is not None:
                y = y + decays.e[..., rows, None] * xp.matmul(Cr, _t(hin))
            ys.append(y)
        if not last:
            hout = xp.matmul(_t(U * decays.w[..., None]), Bc)
            states.append(hout if hin is None else hout + decays.e[..., -1:, None] * hin)
    y = xp.concatenate(ys, axis=3) if len(ys) > 1 else ys[0]
    return y.transpose(0, 3, 1, 2, 4).reshape(bt, y.shape[3], h, p), states


def _output_grads(
    decays: _Decays, U: Array, Bc: Array, Cc: Array, *, hin: Array | None, gY: Array, last_only: bool
) -> tuple[Array, Array, Array, Array, Array | None]:
    """One chunk's gradients through its output rows R (all Q rows, or only the last with
    ``last_only``; ``gY`` holds theirs) -> gU, gcum, gB, gC and the share of the entering state's
    gradient (None when the chunk enters from zero state)."""
    xp = array_module(U, Bc, Cc, gY)
    q = Cc.shape[-2]
    rows = slice(q - 1, q) if last_only else slice(0, q)
    Cr = Cc[..., rows, :]
    CB = xp.matmul(Cr, _t(Bc))
    lam = decays.lam(last_row=last_only)
    M = (CB if last_only else _causal(CB)) * lam  # (.., R, Q), causal
    gM = xp.matmul(gY, _t(U))  # its entries above the diagonal are masked where used
    gU = xp.matmul(_t(M), gY)
    # products summed by einsum: no (.., R, Q) temporaries, ~3x faster than multiply-then-sum
    gcum = -xp.einsum("...ts,...ts->...s", gM, M)
    gcum[..., rows] += xp.einsum("...ts,...ts->...t", gM, M)
    gCB = xp.einsum("bghts,bghts->bgts", gM, lam)[:, :, None]
    if not last_only:
        _causal(gCB)
    gCr = xp.matmul(gCB, Bc)
    gB = xp.matmul(_t(gCB), Cr)
    ghin = None
    if hin is not None:
        eg = decays.e[..., rows, None] * gY
        gcum[..., rows] += (eg * xp.matmul(Cr, _t(hin))).sum(axis=-1)
        gCr = gCr + xp.matmul(eg, hin).sum(axis=2, keepdims=True)
        ghin = xp.matmul(_t(eg), Cr)
    gC = gCr if not last_only else xp.concatenate([xp.zeros_like(Cc[..., 1:, :]), gCr], axis=-2)
    return gU, gcum, gB, gC, ghin


def ssd_chunked_backward(
    x: Array,
    dt: Array,
    A: Array,
    B: Array,
    C: Array,
    *,
    chunk: int,
    states: list[Array | None],
    gy: Array,
    last_only: bool = False,
) -> tuple[Array, Array, Array, Array, Array]:
    """Gradients of :func:`ssd_chunked` (ALGORITHMS 1.5 b) -> gx, gdt, gA, gB, gC.

    ``gy`` is (Bt,L,H,P), or (Bt,1,H,P) with ``last_only`` (as the forward was run). Chunks are visited in
    reverse; the gradient of each chunk's entering state flows into the previous chunk.
    Decays are recomputed from dt and A rather than stored. The output-dependent terms are
    written once for a set of output rows R of the chunk (all Q rows, or only the last).
    """
    xp = array_module(x, dt, A, B, C, gy)
    bt, length, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    if gy.shape[1] != (1 if last_only else length):
        raise ModelError(f"gy has {gy.shape[1]} steps for a window of {length} (last_only={last_only})")
    xh, dth, Ag, Bg, Cg = _heads(x, dt, A, B, C)
    gyh = gy.reshape(bt, gy.shape[1], g, h // g, p).transpose(0, 2, 3, 1, 4)
    spans = _chunks(length, chunk)
    gxs: list[Array] = []
    gdts: list[Array] = []
    gBs: list[Array] = []
    gCs: list[Array] = []
    gA = xp.zeros_like(Ag)
    ghout: Array | None = None
    for c in range(len(spans) - 1, -1, -1):
        t0, t1 = spans[c]
        xc, dtc, Bc, Cc = xh[..., t0:t1, :], dth[..., t0:t1], Bg[..., t0:t1, :], Cg[..., t0:t1, :]
        decays = _Decays(dtc, Ag)
        U = dtc[..., None] * xc
        hin = states[c]
        if c + 1 < len(spans) and last_only:  # no output rows here: only the state path
            gU, gcum, gB, gC = xp.zeros_like(U), xp.zeros_like(dtc), xp.zeros_like(Bc), xp.zeros_like(Cc)
            ghin: Array | None = None
        else:
            gY = gyh if last_only else gyh[..., t0:t1, :]
            gU, gcum, gB, gC, ghin = _output_grads(decays, U, Bc, Cc, hin=hin, gY=gY, last_only=last_only)
        if ghout is not None:
            hout = states[c + 1]
            GB = xp.matmul(Bc, _t(ghout))  # (..,Q,P): gHout B_s per step
            w = decays.w
            gU = gU + w[..., None] * GB
            gB = gB + xp.matmul(w[..., None] * U, ghout).sum(axis=2, keepdims=True)
            gcum = gcum - w * (U * GB).sum(axis=-1)
            gcum[..., -1] += (ghout * hout).sum(axis=(-1, -2))
            if hin is not None:
                eh = decays.e[..., -1:, None] * ghout
                ghin = eh if ghin is None else ghin + eh
        ghout = ghin
        ga = xp.flip(xp.cumsum(xp.flip(gcum, axis=-1), axis=-1), axis=-1)  # sum_{t >= r} gcum_t
        gxs.append(dtc[..., None] * gU)
        gdts.append(xp.einsum("...p,...p->...", gU, xc) + Ag[..., None] * ga)
        gA = gA + sum_leading((dtc * ga).sum(axis=-1).reshape(bt, -1)).reshape(Ag.shape)
        gBs.append(gB)
        gCs.append(gC)

    def join(parts: list[Array], axis: int) -> Array:
        return xp.concatenate(parts[::-1], axis=axis) if len(parts) > 1 else parts[0]

    gx = join(gxs, 3).transpose(0, 3, 1, 2, 4).reshape(bt, length, h, p)
    gdt = join(gdts, 3).transpose(0, 3, 1, 2).reshape(bt, length, h)
    gB_out = join(gBs, 3)[:, :, 0].transpose(0, 2, 1, 3).reshape(bt, length, g, n)
    gC_out = join(gCs, 3)[:, :, 0].transpose(0, 2, 1, 3).reshape(bt, length, g, n)
    return gx, gdt, gA.reshape(h), gB_out, gC_out


def ssd_ref(
    x: Array, dt: Array, A: Array, B: Array, C: Array, *, h0: Array | None = None
) -> tuple[Array, Array]:
    """Sequential reference of the scan (ALGORITHMS 1.2 step 4), one time step at a time.

    Same inputs as :func:`ssd_chunked` plus an optional initial state h0 (Bt,H,P,N); returns
    y (Bt,L,H,P) and the final state (Bt,H,P,N). Slow; for tests and as the recurrent-step
    definition.
    """
    xp = array_module(x, dt, A, B, C)
    bt, length, h, p = x.shape
    g = B.shape[2]
    heads_per_group = h // g
    state = xp.zeros((bt, h, p, B.shape[3]), dtype=x.dtype) if h0 is None else h0
    ys = []
    for t in range(length):
        Bt_ = xp.repeat(B[:, t], heads_per_group, axis=1)  # (Bt,H,N)
        Ct_ = xp.repeat(C[:, t], heads_per_group, axis=1)
        decay = xp.exp(dt[:, t] * A)[..., None, None]
        state = decay * state + (dt[:, t, :, None] * x[:, t])[..., None] * Bt_[:, :, None, :]
        ys.append(xp.matmul(state, Ct_[..., None])[..., 0])
    return xp.stack(ys, axis=1), state


@dataclass(frozen=True, slots=True)
class BlockCache:
    """What :func:`block_backward` needs from :func:`block_forward`.

    Lo = L, or 1 when only the last step's output was computed (``last_only``).
    """

    u: Array  # block input (Bt,L,d)
    z: Array  # gate pre-activation (Bt,Lo,Di)
    xbc_raw: Array  # conv input (Bt,L,Cd)
    pre: Array  # conv output before SiLU (Bt,L,Cd)
    xbc: Array  # after SiLU (Bt,L,Cd)
    s: Array  # dt_raw + dt_bias (Bt,L,H)
    dt: Array  # softplus(s) (Bt,L,H)
    A: Array  # -exp(A_log) (H)
    states: list[Array | None]  # SSD chunk-entry states
    y: Array  # SSM output incl. D skip (Bt,Lo,Di)
    gate: Array  # silu(z) (Bt,Lo,Di)
    vhat: Array  # normalised y * gate (Bt,Lo,Di)
    r: Array  # inverse RMS (Bt,Lo,G,1)
    o: Array  # vhat * gnorm_w (Bt,Lo,Di)
    chunk: int
    last_only: bool


def _split_xbc(xbc: Array, di: int, g: int, n: int, heads: int) -> tuple[Array, Array, Array]:
    bt, length, _ = xbc.shape
    x = xbc[..., :di].reshape(bt, length, heads, di // heads)
    B = xbc[..., di : di + g * n].reshape(bt, length, g, n)
    C = xbc[..., di + g * n :].reshape(bt, length, g, n)
    return x, B, C


def _causal_conv(xbc_raw: Array, conv_w: Array, conv_b: Array) -> Array:
    """Causal depthwise convolution over time from zero padding, (Bt,L,Cd) -> (Bt,L,Cd):
    ``pre[t] = conv_b + sum_k conv_w[:, k] xbc_raw[t - (W - 1) + k]``, terms before the window
    being 0. One copy into a zero-padded (Bt, W-1+L, Cd) array, then one einsum over its
    (Bt, L, W, Cd) sliding-window view: a fused multiply-add per tap, k = 0 .. W-1, with no
    temporaries (2-3x faster than a multiply and an add per tap on shifted slices, NumPy)."""
    xp = array_module(xbc_raw)
    bt, length, cd = xbc_raw.shape
    width = conv_w.shape[1]
    padded = xp.empty((bt, width - 1 + length, cd), dtype=xbc_raw.dtype)
    padded[:, : width - 1] = 0.0
    padded[:, width - 1 :] = xbc_raw
    s_b, s_t, s_c = padded.strides
    taps = xp.lib.stride_tricks.as_strided(padded, (bt, length, width, cd), (s_b, s_t, s_t, s_c))
    # taps (W, Cd) row-major, as the CPU runner stores conv_w (column-major): the einsum's inner
    # loop then runs over contiguous channels in both operands (a row-major conv_w, as in
    # training, is copied: 2.5x faster than its strided columns)
    pre = xp.einsum("btkc,kc->btc", taps, xp.ascontiguousarray(conv_w.T))
    pre += conv_b
    return pre


def block_forward(
    params: Params, prefix: str, u: Array, groups: int, chunk: int, *, last_only: bool = False
) -> tuple[Array, BlockCache]:
    """Mamba2 mixer on u (Bt,L,d) -> out (Bt,L,d) (ALGORITHMS 1.2); ``prefix`` = "blocks.i.".

    With ``last_only`` the output is the last step's only, (Bt,1,d): what the network's last
    block needs; the scan then builds no [Q, Q] matrices and gate, norm and out_proj run on
    one row. The residual connection and the pre-norm are the network's business.
    """
    xp = array_module(u)
    W_in, conv_w, conv_b = params[prefix + "W_in"], params[prefix + "conv_w"], params[prefix + "conv_b"]
    di = params[prefix + "gnorm_w"].shape[0]
    heads = params[prefix + "A_log"].shape[0]
    cd = conv_w.shape[0]
    n = (cd - di) // (2 * groups)
    bt, length, _ = u.shape
    rows = slice(length - 1, length) if last_only else slice(0, length)
    if last_only:  # the gate is read at the last step only: its rows of in_proj alone
        z = linear(u[:, rows], W_in[:di])
        xbcdt = linear(u, W_in[di:])
    else:
        zxbcdt = linear(u, W_in)
        z, xbcdt = zxbcdt[..., :di], zxbcdt[..., di:]
    xbc_raw, dt_raw = xbcdt[..., :cd], xbcdt[..., cd:]
    pre = _causal_conv(xbc_raw, conv_w, conv_b)
    xbc = silu(pre)
    x, B, C = _split_xbc(xbc, di, groups, n, heads)
    s = dt_raw + params[prefix + "dt_bias"]
    dt = softplus(s)
    A = -xp.exp(params[prefix + "A_log"])
    ssm, states = ssd_chunked(x, dt, A, B, C, chunk=chunk, last_only=last_only)
    # the D skip over the flat (Bt, Lo, Di) layout, D repeated per head channel: long inner loops
    y = ssm.reshape(bt, -1, di) + xbc[:, rows, :di] * xp.repeat(params[prefix + "D"], di // heads)
    gate = silu(z)
    vhat, r = rmsnorm(y * gate, groups)
    o = vhat * params[prefix + "gnorm_w"]
    out = linear(o, params[prefix + "W_out"])
    cache = BlockCache(u, z, xbc_raw, pre, xbc, s, dt, A, states, y, gate, vhat, r, o, chunk, last_only)
    return out, cache


def block_backward(params: Params, prefix: str, cache: BlockCache, gout: Array) -> tuple[Params, Array]:
    """Gradients of :func:`block_forward` (ALGORITHMS 1.5 b, c).

    gout (Bt,L,d), or (Bt,1,d) after a ``last_only`` forward -> (grads keyed by full tensor
    name, gu (Bt,L,d)).
    """
    xp = array_module(gout)
    W_in, W_out, conv_w = params[prefix + "W_in"], params[prefix + "W_out"], params[prefix + "conv_w"]
    bt, length, d = cache.u.shape
    di = cache.y.shape[-1]
    cd, width = conv_w.shape
    groups = cache.r.shape[-2]
    n = (cd - di) // (2 * groups)
    heads = cache.A.shape[0]
    x, B, C = _split_xbc(cache.xbc, di, groups, n, heads)
    grads: Params = {}

    go = linear(gout, W_out.T)
    grads[prefix + "W_out"] = xp.matmul(gout.reshape(-1, d).T, cache.o.reshape(-1, di))
    grads[prefix + "gnorm_w"] = sum_leading(go * cache.vhat)
    gv = rmsnorm_backward(go * params[prefix + "gnorm_w"], cache.vhat, cache.r)
    gy = gv * cache.gate
    gz = gv * cache.y * silu_grad(cache.z)

    rows = slice(length - 1, length) if cache.last_only else slice(0, length)
    gy4 = gy.reshape(bt, -1, heads, di // heads)
    grads[prefix + "D"] = sum_leading(xp.einsum("...p,...p->...", gy4, x[:, rows]))
    gx, gdt, gA, gB, gC = ssd_chunked_backward(
        x, cache.dt, cache.A, B, C, chunk=cache.chunk, states=cache.states, gy=gy4, last_only=cache.last_only
    )
    gx[:, rows] += params[prefix + "D"][:, None] * gy4
    if cache.last_only:
        gz = xp.concatenate([xp.zeros((bt, length - 1, di), dtype=gz.dtype), gz], axis=1)
    grads[prefix + "A_log"] = gA * cache.A
    gs = gdt * sigmoid(cache.s)
    grads[prefix + "dt_bias"] = sum_leading(gs)

    gxbc = xp.concatenate(
        [gx.reshape(bt, length, di), gB.reshape(bt, length, -1), gC.reshape(bt, length, -1)], axis=-1
    )
    gpre = gxbc * silu_grad(cache.pre)
    grads[prefix + "conv_b"] = sum_leading(gpre)
    # The conv's taps on shifted slices, as in _causal_conv: tap k pairs output step t with
    # input step t - (W - 1 - k); steps before the window (zero padding) contribute nothing.
    gw = xp.zeros((cd, width), dtype=gout.dtype)
    gxbc_raw = xp.zeros((bt, length, cd), dtype=gout.dtype)
    for k in range(width):
        n = length - (width - 1 - k)
        if n > 0:
            gw[:, k] = sum_leading(gpre[:, length - n :] * cache.xbc_raw[:, :n])
            gxbc_raw[:, :n] += gpre[:, length - n :] * conv_w[:, k]
    grads[prefix + "conv_w"] = gw
    gzxbcdt = xp.concatenate([gz, gxbc_raw, gs], axis=-1)
    grads[prefix + "W_in"] = xp.matmul(gzxbcdt.reshape(-1, W_in.shape[0]).T, cache.u.reshape(-1, d))
    gu = linear(gzxbcdt, W_in.T)
    return grads, gu
