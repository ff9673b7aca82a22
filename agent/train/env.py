"""The vectorised trading environment: recorded bars replayed for many windows in lockstep.

Data (:class:`EnvData`) lives on the device (NumPy or CuPy arrays): the instruments' bars of one
range (a fold's train or test span) concatenated, with their normalised market features.
:class:`VecEnv` steps ``E`` environments at once; each holds a unit position in {-1, 0, +1}.

Step at decision bar ``t`` with action ``a`` (index into short, flat, long; target ``a - 1``):

* the position moves to the target at the book the order meets, as the paper broker fills it:
  the instrument's book at arrival + ``broker.latency_ms`` after the record that closed bar
  ``t`` (a buy pays that book's ask, a sell its bid, relative to bar ``t``'s mid, or that
  book's mid under ``broker.fill_price = "mid"``, plus ``fee_ticks`` a contract:
  :func:`agent.execution.fills.fill_costs_ticks`, :func:`agent.execution.fills.step_pnl_ticks`);
* it is held to the next bar: ``gross = pos * (mark_{t+1} - mark_t)`` ticks;
* ``reward = (gross - cost) * reward_scale`` in normalised units.

``mark`` is the mid in ticks carried forward over non-tradable bars (health mask of
:mod:`feeds.features`). On a non-tradable bar the position cannot change (no trade, no cost),
and because the mark is frozen the bar's reward is zero: a move that happened while the book
was unhealthy is credited at the next tradable bar, from the last trusted mid, so P&L is
conserved and never read from a bad book. At the last decision bar of a session (see
``TrainConfig.session_gap_s``) the position is closed: episodes end flat, ``done`` is a true
terminal.

Observation: ``[E, K, F + 2]`` float32, the K-bar window of normalised market features ending at
``t`` plus, per bar, the 2 agent features the agent had at that bar: its position and its
unrealised P&L from its entry fill to the bar's mark, in normalised units, clipped to +/-5
(:func:`agent.policy.observation.agent_features`, the one definition of these columns: the
daemon and both backtests build theirs with it from the ledger's average fill price).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from agent.execution.config import FillPrice
from agent.execution.fills import fill_costs_ticks, step_pnl_ticks
from agent.model.arrays import Array, to_numpy
from agent.policy.observation import AGENT_FEATURES, agent_features
from agent.train.errors import TrainError
from feeds.book import tick_fixed
from feeds.config import InstrumentSpec
from feeds.features import FEATURE_NAMES, BarFrame
from feeds.records import UNDEF_PRICE

__all__ = [
    "EnvData",
    "FeatureNorm",
    "InstrumentBars",
    "Rollout",
    "StepResult",
    "VecEnv",
    "build_env_data",
    "fit_norm",
    "rollout",
]


@dataclass(frozen=True)
class InstrumentBars:
    """One instrument's bars on the host, as the environment reads them."""

    symbol: str
    ts_ns: np.ndarray[Any, Any]
    """(T,) int64 bar close times, ns UTC, increasing."""
    features: np.ndarray[Any, Any]
    """(T, F) float32 market features (:data:`feeds.features.FEATURE_NAMES`)."""
    mid_ticks: np.ndarray[Any, Any]
    """(T,) float64 mid at the close, in ticks."""
    spread_ticks: np.ndarray[Any, Any]
    """(T,) float64 spread at the close, in ticks."""
    buy_cost_ticks: np.ndarray[Any, Any]
    """(T,) float64: the ask an order sent at the bar's close meets (the book at arrival +
    latency) minus the close mid, in ticks (NaN where that book has no ask)."""
    sell_cost_ticks: np.ndarray[Any, Any]
    """(T,) float64: the close mid minus the bid that order meets, in ticks."""
    tradable: np.ndarray[Any, Any]
    """(T,) bool health mask."""
    tick_value: float
    """Currency per tick per contract."""
    fee_ticks: float
    """Fee per contract in ticks (``fee_per_contract / tick_value``)."""

    @classmethod
    def from_frame(
        cls,
        frame: BarFrame,
        spec: InstrumentSpec,
        fee_per_contract: float,
        *,
        exec_bid: np.ndarray[Any, Any],
        exec_ask: np.ndarray[Any, Any],
    ) -> InstrumentBars:
        """Adapt a :class:`feeds.features.BarFrame`; ``exec_bid``/``exec_ask`` are the best bid
        and ask (1e-9 fixed point) of the book each bar's order meets
        (:func:`agent.execution.fills.order_schedule`). Bars with non-finite values, or whose
        order would meet no two-sided book, are marked not tradable (their features zeroed)
        rather than passed on as valid."""
        feats = np.asarray(frame.features, dtype=np.float32)
        tick = float(tick_fixed(spec.tick_size))
        mid = frame.mid_ticks
        two_sided = (exec_bid != UNDEF_PRICE) & (exec_ask != UNDEF_PRICE) & (exec_bid > 0) & (exec_ask > 0)
        buy = np.where(two_sided, np.asarray(exec_ask, dtype=np.float64) / tick - mid, np.nan)
        sell = np.where(two_sided, mid - np.asarray(exec_bid, dtype=np.float64) / tick, np.nan)
        finite = np.isfinite(feats).all(axis=1) & np.isfinite(mid)
        finite &= np.isfinite(frame.spread_ticks) & np.isfinite(buy) & np.isfinite(sell)
        ok = finite & (frame.spread_ticks > 0)
        return cls(
            symbol=frame.symbol,
            ts_ns=np.asarray(frame.ts_close, dtype=np.int64),
            features=np.where(finite[:, None], feats, 0.0).astype(np.float32),
            mid_ticks=np.where(finite, frame.mid_ticks, np.nan),
            spread_ticks=np.where(ok, frame.spread_ticks, np.nan),
            buy_cost_ticks=np.where(ok, buy, np.nan),
            sell_cost_ticks=np.where(ok, sell, np.nan),
            tradable=np.asarray(frame.tradable, dtype=bool) & ok,
            tick_value=spec.tick_value,
            fee_ticks=fee_per_contract / spec.tick_value,
        )

    def __len__(self) -> int:
        return int(self.ts_ns.shape[0])


class FeatureNorm(NamedTuple):
    """Normalisation of the model input: ``(x - mean) / std`` over all ``F + 2`` columns (the
    agent columns have mean 0 and std 1). Fitted on a fold's training bars only."""

    mean: np.ndarray[Any, Any]
    std: np.ndarray[Any, Any]


def fit_norm(parts: Sequence[tuple[InstrumentBars, int, int]]) -> FeatureNorm:
    """Mean and standard deviation of the market features over the tradable bars of ``parts``
    (``(bars, start, end)`` ranges); a constant feature gets std 1."""
    rows = [b.features[s:e][b.tradable[s:e]] for b, s, e in parts]
    data = np.concatenate(rows).astype(np.float64) if rows else np.zeros((0, len(FEATURE_NAMES)))
    if data.shape[0] < 2:
        raise TrainError("the training window has fewer than 2 tradable bars: cannot fit normalisation")
    mean = data.mean(axis=0)
    std = data.std(axis=0)
    std = np.where(std > 1e-8 * np.maximum(1.0, np.abs(mean)), std, 1.0)
    n_agent = len(AGENT_FEATURES)
    return FeatureNorm(
        np.concatenate([mean, np.zeros(n_agent)]).astype(np.float32),
        np.concatenate([std, np.ones(n_agent)]).astype(np.float32),
    )


@dataclass(frozen=True)
class EnvData:
    """A range of bars of one or more instruments, concatenated, on the device (``[N]`` arrays
    unless stated). Decision bars are those with a full K-bar window and a next bar inside their
    session (:attr:`starts`)."""

    xp: ModuleType
    feat: Array
    """(N, F) float32 normalised market features."""
    feat_windows: Array
    """(N, K, F) read-only view of ``feat``: ``feat_windows[t]`` is the K-bar window ending at bar
    ``t``, one block to gather (before bar ``K - 1`` the window wraps to the last bars, as
    indexing ``feat`` with negative indices does)."""
    step_table: Array
    """(N, 8) float64: per bar, what a step reads, in one gather (:func:`_step_table`);
    ``mark``, ``buy_cost``, ``sell_cost``, ``fee_ticks`` and ``tick_value`` are its columns."""
    mark: Array
    """float64 mid in ticks, carried forward over non-tradable bars."""
    buy_cost: Array
    """float64 ticks a buy pays over ``mark`` (the ask of the book its order meets, or that
    book's mid under mid fills; carried forward like ``mark``)."""
    sell_cost: Array
    """float64 ticks a sell gives up under ``mark`` (carried forward like ``mark``)."""
    tradable: Array
    last_decision: Array
    """bool: the last decision bar of its session (the position is closed there)."""
    session_end: Array
    """int64: exclusive end index of the bar's session."""
    fee_ticks: Array
    tick_value: Array
    label_ticks: Array
    """float64 realised ``horizon``-bar mark change in ticks; NaN when the horizon leaves the session."""
    starts: Array
    """int64 sorted indices of the decision bars."""
    ts_ns: np.ndarray[Any, Any]
    """(N,) int64 close times (host)."""
    instrument: np.ndarray[Any, Any]
    """(N,) int32 index into ``symbols`` (host)."""
    symbols: tuple[str, ...]
    window: int

    @property
    def n_market(self) -> int:
        return int(self.feat.shape[1])

    def windows(self, t: Array, agent: Array) -> Array:
        """Model input ``[B, K, F + 2]`` float32 for decision bars ``t`` ``[B]`` with agent feature
        history ``agent`` ``[B, K, 2]``."""
        return self.xp.concatenate([self.feat_windows[t], agent], axis=2)


_COL_MARK, _COL_MARK_NEXT, _COL_BUY, _COL_SELL, _COL_FEE, _COL_BUY_FILL, _COL_SELL_FILL, _COL_TICK_VALUE = (
    range(8)
)
"""Columns of :attr:`EnvData.step_table` (:func:`_step_table`)."""


def _step_table(
    mark: np.ndarray[Any, Any],
    buy: np.ndarray[Any, Any],
    sell: np.ndarray[Any, Any],
    fee: np.ndarray[Any, Any],
    tick_value: np.ndarray[Any, Any],
) -> np.ndarray[Any, Any]:
    """Per bar ``[N, 8]``: ``mark``; the next bar's mark (the last bar's own); ``buy``, ``sell``
    and ``fee`` costs in ticks; the price a buy fills at, ``mark + buy``, and a sell,
    ``mark - sell``; ``tick_value``."""
    n = mark.shape[0]
    table = np.empty((n, 8))
    table[:, _COL_MARK] = mark
    table[:, _COL_MARK_NEXT] = mark[np.minimum(np.arange(1, n + 1), n - 1)]
    table[:, _COL_BUY] = buy
    table[:, _COL_SELL] = sell
    table[:, _COL_FEE] = fee
    table[:, _COL_BUY_FILL] = mark + buy
    table[:, _COL_SELL_FILL] = mark - sell
    table[:, _COL_TICK_VALUE] = tick_value
    return table


def _forward_fill(values: np.ndarray[Any, Any], ok: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Carry the last ``ok`` value forward; values before the first ``ok`` take the first one."""
    idx = np.where(ok, np.arange(values.shape[0]), -1)
    np.maximum.accumulate(idx, out=idx)
    first = int(np.argmax(ok))
    idx = np.where(idx < 0, first, idx)
    return values[idx]


def build_env_data(
    parts: Sequence[tuple[InstrumentBars, int, int]],
    norm: FeatureNorm,
    *,
    window: int,
    horizon: int,
    session_gap_s: float,
    xp: ModuleType,
    fill_price: FillPrice = "book",
) -> EnvData:
    """Concatenate the bar ranges ``(bars, start, end)`` into device arrays.

    Sessions split at range boundaries and wherever consecutive closes are more than
    ``session_gap_s`` apart; a session with no tradable bar is dropped. ``horizon`` is the
    return head's label horizon in bars. ``fill_price`` is the broker's fill rule
    (``broker.fill_price``; ``book`` is the broker's default) the execution costs follow.
    """
    n_market = norm.mean.shape[0] - len(AGENT_FEATURES)
    cols: dict[str, list[np.ndarray[Any, Any]]] = {
        k: []
        for k in ("feat", "mark", "buy", "sell", "trad", "last", "send", "fee", "tv", "label", "ts", "inst")
    }
    starts: list[np.ndarray[Any, Any]] = []
    symbols = tuple(dict.fromkeys(b.symbol for b, _, _ in parts))
    offset = 0
    gap_ns = int(session_gap_s * 1e9)
    for bars, start, end in parts:
        if bars.features.shape[1] != n_market:
            raise TrainError(
                f"{bars.symbol}: {bars.features.shape[1]} features, the normalisation has {n_market}"
            )
        ts = bars.ts_ns[start:end]
        cuts = np.flatnonzero(np.diff(ts) > gap_ns) + 1
        for s_lo, s_hi in zip(np.r_[0, cuts], np.r_[cuts, ts.shape[0]], strict=True):
            lo, hi = start + int(s_lo), start + int(s_hi)
            trad = bars.tradable[lo:hi]
            n = hi - lo
            if n < window + 1 or not trad.any():
                continue
            mark = _forward_fill(bars.mid_ticks[lo:hi], trad)
            buy, sell = fill_costs_ticks(bars.buy_cost_ticks[lo:hi], bars.sell_cost_ticks[lo:hi], fill_price)
            buy = _forward_fill(buy, trad)
            sell = _forward_fill(sell, trad)
            label = np.full(n, np.nan)
            label[: n - horizon] = mark[horizon:] - mark[: n - horizon]
            last = np.zeros(n, dtype=bool)
            last[n - 2] = True
            feats = (bars.features[lo:hi] - norm.mean[:n_market]) / norm.std[:n_market]
            cols["feat"].append(feats.astype(np.float32))
            cols["mark"].append(mark)
            cols["buy"].append(buy)
            cols["sell"].append(sell)
            cols["trad"].append(trad)
            cols["last"].append(last)
            cols["send"].append(np.full(n, offset + n, dtype=np.int64))
            cols["fee"].append(np.full(n, bars.fee_ticks))
            cols["tv"].append(np.full(n, bars.tick_value))
            cols["label"].append(label)
            cols["ts"].append(bars.ts_ns[lo:hi])
            cols["inst"].append(np.full(n, symbols.index(bars.symbol), dtype=np.int32))
            starts.append(np.arange(offset + window - 1, offset + n - 1, dtype=np.int64))
            offset += n
    if not starts:
        raise TrainError(f"no session in this range holds {window + 1} bars with a tradable one")
    host = {k: np.concatenate(v) for k, v in cols.items()}
    n_bars = host["mark"].shape[0]
    # The K - 1 last bars ahead of the first one: every bar's window is one block of the table.
    padded = xp.asarray(np.concatenate([host["feat"][n_bars - (window - 1) :], host["feat"]]))
    step_table = xp.asarray(_step_table(host["mark"], host["buy"], host["sell"], host["fee"], host["tv"]))
    return EnvData(
        xp=xp,
        feat=padded[window - 1 :],
        feat_windows=xp.lib.stride_tricks.sliding_window_view(padded, window, axis=0).swapaxes(1, 2),
        step_table=step_table,
        mark=step_table[:, _COL_MARK],
        buy_cost=step_table[:, _COL_BUY],
        sell_cost=step_table[:, _COL_SELL],
        tradable=xp.asarray(host["trad"]),
        last_decision=xp.asarray(host["last"]),
        session_end=xp.asarray(host["send"]),
        fee_ticks=step_table[:, _COL_FEE],
        tick_value=step_table[:, _COL_TICK_VALUE],
        label_ticks=xp.asarray(host["label"]),
        starts=xp.asarray(np.concatenate(starts)),
        ts_ns=host["ts"],
        instrument=host["inst"],
        symbols=symbols,
        window=window,
    )


class StepResult(NamedTuple):
    """What one lockstep step did, per environment (``[E]`` device arrays)."""

    t: Array
    """Decision bar of the step."""
    action: Array
    """Effective action index (``position + 1`` after the step: the agent's choice unless the bar
    was not tradable or closed the session)."""
    reward: Array
    """float32 normalised reward."""
    gross_ticks: Array
    cost_ticks: Array
    traded: Array
    """Contracts traded (|delta|)."""
    position: Array
    """Position held from ``t`` to ``t + 1``."""
    done: Array
    """bool: the environment reached the end of its span (a session end or an evaluation chunk end)."""


class VecEnv:
    """``E`` environments over one :class:`EnvData`, stepped in lockstep.

    Training (:meth:`reset_random`): each environment starts flat at a random decision bar and
    runs to the end of that session. Evaluation (:meth:`reset_at`): explicit spans.

    The state arrays (``t``, ``agent``, ``position``, ...) are replaced by a step or a reset,
    never written in place: a reference taken before keeps the state of that moment.
    """

    def __init__(self, data: EnvData, n_envs: int, *, reward_scale: float, seed: int) -> None:
        xp = data.xp
        self.data = data
        self.n_envs = n_envs
        self.reward_scale = reward_scale
        self.rng = np.random.default_rng(seed)
        self.t = xp.zeros(n_envs, dtype=np.int64)
        self.end = xp.zeros(n_envs, dtype=np.int64)
        self.position = xp.zeros(n_envs, dtype=np.float64)
        self.entry = xp.zeros(n_envs, dtype=np.float64)
        self.agent = xp.zeros((n_envs, data.window, len(AGENT_FEATURES)), dtype=np.float32)
        self.active = xp.zeros(n_envs, dtype=bool)
        self._obs = xp.empty((n_envs, data.window, data.n_market + len(AGENT_FEATURES)), dtype=np.float32)

    def reset_at(self, mask: Array, starts: Array, ends: Array) -> None:
        """Start the environments in ``mask`` flat at decision bars ``starts`` running while
        ``t < ends`` (both ``[E]``, read where ``mask``)."""
        xp = self.data.xp
        self.t = xp.where(mask, starts, self.t)
        self.end = xp.where(mask, ends, self.end)
        self.position = xp.where(mask, 0.0, self.position)
        self.entry = xp.where(mask, 0.0, self.entry)
        self.agent = xp.where(mask[:, None, None], np.float32(0.0), self.agent)
        self.active = self.active | mask

    def reset_random(self, mask: Array | None = None) -> None:
        """Restart the environments in ``mask`` (all when None) at random decision bars (the
        generator draws ``E`` of them on every call, whatever the mask)."""
        xp = self.data.xp
        pick = self.rng.integers(0, int(self.data.starts.shape[0]), self.n_envs)
        if mask is None:
            mask = xp.ones(self.n_envs, dtype=bool)
        elif not int(xp.count_nonzero(mask)):
            return
        starts = self.data.starts[xp.asarray(pick)]
        self.reset_at(mask, starts, self.data.session_end[starts] - 1)

    def observe(self) -> Array:
        """The model input ``[E, K, F + 2]`` at the current decision bars: the environment's own
        buffer, overwritten by the next call."""
        obs, n_market = self._obs, self.data.n_market
        obs[:, :, :n_market] = self.data.feat_windows[self.t]
        obs[:, :, n_market:] = self.agent
        return obs

    def step(self, actions: Array) -> StepResult:
        """Apply action indices ``[E]``; inactive environments do not move."""
        d, xp, t, position, active = self.data, self.data.xp, self.t, self.position, self.active
        everyone = int(xp.count_nonzero(active)) == self.n_envs  # always so in training: fewer masks
        bar = d.step_table.take(t, axis=0)
        mark, mark_next = bar[:, _COL_MARK], bar[:, _COL_MARK_NEXT]
        target = xp.subtract(xp.asarray(actions), 1.0, dtype=np.float64)
        target = xp.where(d.tradable[t], target, position)
        target = xp.where(d.last_decision[t], 0.0, target)
        if not everyone:
            target = xp.where(active, target, position)
        gross, cost = step_pnl_ticks(
            position,
            target,
            mark,
            mark_next,
            buy_cost_ticks=bar[:, _COL_BUY],
            sell_cost_ticks=bar[:, _COL_SELL],
            fee_ticks=bar[:, _COL_FEE],
        )
        # A unit position is opened or reversed at one fill: that fill's price is its entry (the
        # ledger's average price), a buy at mark + buy_cost, a sell at mark - sell_cost.
        delta = target - position
        traded = xp.abs(delta)
        fill = xp.where(delta > 0, bar[:, _COL_BUY_FILL], bar[:, _COL_SELL_FILL])
        self.entry = xp.where(target * delta != 0, fill, self.entry)  # a new position, not flat
        self.position = target
        reward = ((gross - cost) * self.reward_scale).astype(np.float32)
        t1 = xp.minimum(t + 1, d.mark.shape[0] - 1)  # inactive environments may sit on the last bar
        history = self.agent[:, 1:]
        if everyone:
            nxt = t1
            new_row = agent_features(xp, target, self.entry, mark_next, self.reward_scale)
            self.agent = xp.concatenate([history, new_row[:, None, :]], axis=1)
            done = nxt >= self.end
            self.active = ~done
        else:
            nxt = xp.where(active, t1, t)
            new_row = agent_features(
                xp, target, self.entry, xp.where(active, mark_next, mark), self.reward_scale
            )
            moved = xp.concatenate([history, new_row[:, None, :]], axis=1)
            self.agent = xp.where(active[:, None, None], moved, self.agent)
            done = active & (nxt >= self.end)
            self.active = active & ~done
        self.t = nxt
        return StepResult(t, target.astype(np.int64) + 1, reward, gross, cost, traded, target, done)


class Rollout(NamedTuple):
    """Per-decision-bar record of an evaluation (host arrays over the visited bars, time order
    within each instrument)."""

    bar: np.ndarray[Any, Any]
    pnl: np.ndarray[Any, Any]
    """Net P&L in currency."""
    cost: np.ndarray[Any, Any]
    """Costs in currency."""
    traded: np.ndarray[Any, Any]
    held: np.ndarray[Any, Any]
    action: np.ndarray[Any, Any]
    ts_ns: np.ndarray[Any, Any]
    instrument: np.ndarray[Any, Any]


Policy = Callable[[Array, Array], Array]
"""``policy(obs [E, K, F+2], t [E]) -> action indices [E]``."""


def rollout(data: EnvData, policy: Policy, *, n_envs: int, reward_scale: float) -> Rollout:
    """Run ``policy`` over every decision bar of ``data`` once.

    The decision bars are cut into at most ``n_envs`` contiguous chunks (never across a session)
    run in lockstep; each chunk starts flat, so a position open at a chunk's end is not carried
    into the next one (at most one extra entry per chunk compared with one long run).
    """
    xp = data.xp
    starts = to_numpy(data.starts)
    session_end = to_numpy(data.session_end)[starts]
    chunk = max(1, -(-starts.shape[0] // n_envs))
    breaks = np.flatnonzero(np.diff(session_end) != 0) + 1
    bounds = np.unique(np.concatenate([np.arange(0, starts.shape[0], chunk), breaks, [starts.shape[0]]]))
    spans = [(int(starts[a]), int(starts[b - 1]) + 1) for a, b in itertools.pairwise(bounds.tolist())]
    n = data.mark.shape[0]
    out = {k: xp.zeros(n, dtype=np.float64) for k in ("pnl", "cost", "traded", "held")}
    act = xp.full(n, -1, dtype=np.int64)
    for wave in range(0, len(spans), n_envs):
        batch = spans[wave : wave + n_envs]
        env = VecEnv(data, n_envs, reward_scale=reward_scale, seed=0)
        mask = np.zeros(n_envs, dtype=bool)
        mask[: len(batch)] = True
        lo = np.zeros(n_envs, dtype=np.int64)
        hi = np.zeros(n_envs, dtype=np.int64)
        lo[: len(batch)] = [s for s, _ in batch]
        hi[: len(batch)] = [e for _, e in batch]
        env.reset_at(xp.asarray(mask), xp.asarray(lo), xp.asarray(hi))
        for _ in range(max(e - s for s, e in batch)):
            active = env.active
            res = env.step(policy(env.observe(), env.t))
            tv = data.tick_value[res.t]
            where = res.t[active]
            out["pnl"][where] = ((res.gross_ticks - res.cost_ticks) * tv)[active]
            out["cost"][where] = (res.cost_ticks * tv)[active]
            out["traded"][where] = res.traded[active]
            out["held"][where] = xp.abs(res.position)[active]
            act[where] = res.action[active]
    host = {k: to_numpy(v) for k, v in out.items()}
    acts = to_numpy(act)
    visited = np.flatnonzero(acts >= 0)
    return Rollout(
        bar=visited,
        pnl=host["pnl"][visited],
        cost=host["cost"][visited],
        traded=host["traded"][visited],
        held=host["held"][visited],
        action=acts[visited],
        ts_ns=data.ts_ns[visited],
        instrument=data.instrument[visited],
    )
