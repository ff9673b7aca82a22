"""Synthetic MBP-10 data: a queue-reactive book with volatility regimes and a planted signal.

The generator writes real DBN files (one ``.dbn.zst`` per trading day holding every instrument,
merged in ``ts_recv`` order) through :func:`feeds.dbn.write_mbp10`. Everything is vectorised
NumPy: a 6.5-hour day of one instrument (~125k records) takes well under a second.

The model, per instrument and session
-------------------------------------
*Regimes.* The session alternates calm and active stretches (exponential lengths; a calm stretch
is a *long* one, mean ``long_calm_minutes``, with probability ``long_calm_probability``). The
regime scales the event rate (``calm_activity`` / ``active_activity``) and the chance that an
event moves the price, so realised variance differs by an order of magnitude between regimes.

*Events.* Book events arrive as a Poisson process of rate ``events_per_second`` x activity.
An event is either a price move (probability ``*_move_probability``) or an order-book event on
one side at depth ``k`` (mostly the top levels): an add, a cancel or modify (size down or up),
or, at depth 0, a trade against the level. Each has a size ``q`` (geometric, mean
``mean_order_size``). Order flow is persistent, as in real markets: a latent pressure ``p(t)``
(stationary N(0, 1), a moving average of noise over ``pressure_s`` seconds) makes an event
buy-side (bid add, ask cancel, buy-aggressor trade) with probability
``(1 + tanh(pressure_tilt * p)) / 2``. Prices never read ``p``.

*Queues.* Every price level is a queue whose size is the running sum of the sizes added and
removed at that price, reflected at one contract (a cancel or trade never empties a level that
is not consumed by a price move; sizes are the Skorokhod reflection of the summed flow, computed
in closed form per level). Removals are slightly larger than additions on average, so every
queue is a stable, mean-reverting reflected walk: the book reacts to its own queue sizes. Levels
never touched yet hold a size drawn once from a per-day hash of their price. Order counts are
``ceil(size / m)`` with ``m`` in 1..4 per level, so ``1 <= count <= size``.

*Price moves.* The spread is one tick. An up-move is a buy-aggressor trade that consumes the
whole best ask queue followed, at the same ``ts_recv``, by an add that rests the aggressor's
remainder at that price as the new best bid (a down-move mirrors it). Between the two records
the spread is two ticks; the mid moves half a tick with each, one tick per move.

*The planted signal* (exact relationship). Let the signed order flow of a book event at depth
``k < 3`` be ``+q`` for a bid add, an ask cancel or a buy-aggressor trade, and ``-q`` for an ask
add, a bid cancel or a sell-aggressor trade (the order-flow imbalance of Cont, Kukanov and
Stoikov, at the top three levels). For a price move at time ``t``::

    OFI(t) = sum of signed flow of the book events in [t - W, t)          W = signal_window_s
    z(t)   = OFI(t) / sqrt(sum of q^2 over those events + mean_order_size^2)
    P(up)  = (1 + tanh(signal * z(t))) / 2

so the net order flow of the last seconds leads the next mid moves, and since flow is
persistent the lead lasts tens of seconds. Measured on a default day (``signal`` 0.5, 1-second
bars, the test's top-3-level OFI computed from the book snapshots): the correlation of a bar's
OFI with the next bar's mid change is ~0.27, and when the last 5 seconds' OFI is beyond two
standard deviations the mid moves ~3 ticks its way over the next 5 seconds and ~7 over 30,
against a round-trip cost of one tick of spread plus fees: learnable and tradable after costs.
With ``signal = 0`` every move is a fair coin drawn independently of everything before it (move
times do not depend on direction), so the mid is a martingale and no strategy has an edge.

Determinism: each (seed, instrument, day) has its own random stream, and the random numbers
drawn do not depend on ``signal`` (only the move directions' use of them does), so the same seed
gives byte-identical files and ``signal`` changes nothing but the directions.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from feeds.config import InstrumentSpec, SynthConfig
from feeds.dbn import write_mbp10
from feeds.dbn.framing import MBP10_LENGTH, concat_mbp10, take_mbp10
from feeds.errors import FeedError
from feeds.records import LEVELS, MBP10_DTYPE, MBP10_RTYPE, PRICE_SCALE

__all__ = ["SynthDay", "simulate_session", "synth_file_name", "trading_days", "write_synthetic"]

NS = 1_000_000_000
F_LAST = 128
"""DBN flag: last record of an event (the first record of a price move's pair lacks it)."""
PUBLISHER_ID = 1
SIGNAL_DEPTH = 3
DEPTH_DECAY = 0.45
"""P(depth = k) is proportional to (1 - DEPTH_DECAY) ** k: most events hit the top levels."""
TRADE_SHARE = 0.25
"""Share of depth-0 book events that are trades."""
MODIFY_SHARE = 0.1
REMOVAL_SIZE_RATIO = 1.15
"""Cancels and trades are this much larger than adds on average: queues mean-revert."""
INITIAL_SIZE_FACTOR = 6.0
"""Untouched levels start at ~this many mean order sizes."""
LATENCY_NS = (2_000, 40_000)
"""Range of ts_recv - ts_event."""

# Record kinds inside the generator.
_ADD, _CANCEL, _MODIFY, _TRADE, _CLEAR, _REFILL = range(6)
_ACTION = np.array([b"A", b"C", b"M", b"T", b"T", b"A"], dtype="S1")


@dataclass(frozen=True, slots=True)
class SynthDay:
    """One instrument's session: records in ``ts_recv`` order and the closing best bid (ticks)."""

    records: npt.NDArray[np.void]
    close_tick: int


def _hhmm(text: str, key: str) -> dt.time:
    try:
        return dt.datetime.strptime(text, "%H:%M").time()
    except ValueError:
        raise FeedError(f"{key}: {text!r} is not HH:MM") from None


def session_bounds(spec: InstrumentSpec, day: dt.date) -> tuple[int, int]:
    """``[open, close)`` of ``spec``'s session on ``day`` in ns (UTC). A session whose end is not
    after its start opens the previous calendar day (e.g. 23:00 -> 22:00)."""
    start = _hhmm(spec.session_start, f"feeds.instruments[{spec.symbol}].session_start")
    end = _hhmm(spec.session_end, f"feeds.instruments[{spec.symbol}].session_end")
    close = dt.datetime.combine(day, end, tzinfo=dt.UTC)
    opening = dt.datetime.combine(day if end > start else day - dt.timedelta(days=1), start, tzinfo=dt.UTC)
    return int(opening.timestamp()) * NS, int(close.timestamp()) * NS


def trading_days(start: dt.date, days: int) -> list[dt.date]:
    """The first ``days`` weekdays from ``start`` (inclusive)."""
    out: list[dt.date] = []
    day = start
    while len(out) < days:
        if day.weekday() < 5:
            out.append(day)
        day += dt.timedelta(days=1)
    return out


def synth_file_name(dataset: str, day: dt.date) -> str:
    """Daily file name, e.g. ``synth-mbp-10-20240102.dbn.zst``."""
    return f"{dataset.lower()}-mbp-10-{day:%Y%m%d}.dbn.zst"


def _rng(seed: int, instrument_id: int, day: dt.date) -> np.random.Generator:
    return np.random.Generator(
        np.random.PCG64(np.random.SeedSequence([seed, instrument_id, day.toordinal()]))
    )


def _regimes(rng: np.random.Generator, seconds: int, synth: SynthConfig) -> npt.NDArray[np.bool_]:
    """Per second of the session: True in active stretches. Stretch lengths are exponential;
    the loop runs once per stretch (a handful per day)."""
    active = np.zeros(seconds, dtype=bool)
    now = 0
    calm = bool(rng.random() < 0.6)
    while now < seconds:
        if calm:
            mean = (
                synth.long_calm_minutes if rng.random() < synth.long_calm_probability else synth.calm_minutes
            )
        else:
            mean = synth.active_minutes
        length = max(60, int(rng.exponential(mean * 60.0)))
        active[now : now + length] = not calm
        now += length
        calm = not calm
    return active


def _pressure(rng: np.random.Generator, seconds: int, scale_s: float) -> npt.NDArray[np.float64]:
    """Per second: the latent order-flow pressure, a stationary N(0, 1) process (a moving
    average of white noise over ``scale_s`` seconds, so it persists about that long)."""
    width = max(1, round(scale_s))
    noise = np.concatenate(([0.0], np.cumsum(rng.standard_normal(seconds + width))))
    out: npt.NDArray[np.float64] = (noise[width:] - noise[:-width])[:seconds] / np.sqrt(width)
    return out


def _geometric(rng: np.random.Generator, mean: float, n: int) -> npt.NDArray[np.int64]:
    """Sizes >= 1 with the given mean."""
    sizes: npt.NDArray[np.int64] = rng.geometric(min(1.0, 1.0 / mean), size=n).astype(np.int64)
    return sizes


def _hash_uniform(keys: npt.NDArray[np.int64], salt: int) -> npt.NDArray[np.float64]:
    """A deterministic uniform in (0, 1) per key (splitmix64 finaliser)."""
    with np.errstate(over="ignore"):
        z = keys.astype(np.uint64) + np.uint64(salt)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    out: npt.NDArray[np.float64] = ((z >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
    return out


def _initial_size(keys: npt.NDArray[np.int64], salt: int, mean_order: float) -> npt.NDArray[np.int64]:
    """Size of a level before its first event of the day (>= 1)."""
    u = _hash_uniform(keys, salt)
    out: npt.NDArray[np.int64] = 1 + (-np.log(u) * INITIAL_SIZE_FACTOR * mean_order).astype(np.int64)
    return out


def _order_divisor(keys: npt.NDArray[np.int64], salt: int) -> npt.NDArray[np.int64]:
    out: npt.NDArray[np.int64] = 1 + (_hash_uniform(keys, salt ^ 0x5A5A) * 4).astype(np.int64)
    return out


def _move_directions(
    *,
    times: npt.NDArray[np.float64],
    flow: npt.NDArray[np.float64],
    flow_sq: npt.NDArray[np.float64],
    moves: npt.NDArray[np.intp],
    coin: npt.NDArray[np.float64],
    synth: SynthConfig,
) -> npt.NDArray[np.int64]:
    """+1/-1 per move: ``P(up) = (1 + tanh(signal * z)) / 2`` with ``z`` the normalised signed
    flow of the events in ``[t - W, t)`` (module docstring)."""
    cum = np.concatenate(([0.0], np.cumsum(flow)))
    cum_sq = np.concatenate(([0.0], np.cumsum(flow_sq)))
    lo = np.searchsorted(times, times[moves] - synth.signal_window_s, side="left")
    ofi = cum[moves] - cum[lo]
    z = ofi / np.sqrt(cum_sq[moves] - cum_sq[lo] + synth.mean_order_size**2)
    p_up = 0.5 * (1.0 + np.tanh(synth.signal * z))
    out: npt.NDArray[np.int64] = np.where(coin < p_up, 1, -1).astype(np.int64)
    return out


def _segmented_reflection(
    inc: npt.NDArray[np.int64],
    seg_start: npt.NDArray[np.bool_],
    base: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """Queue sizes after each event, events sorted by (key, time).

    Within a segment (a run of one key starting at ``seg_start``) the size is
    ``S_j = base + sum(inc[:j+1])`` reflected at 1: ``X_j = S_j + max(0, max_{i<=j} (1 - S_i))``.
    """
    seg = np.cumsum(seg_start) - 1
    csum = np.cumsum(inc)
    starts = np.flatnonzero(seg_start)
    offset = csum[starts] - inc[starts]
    s = base[seg] + csum - offset[seg]
    deficit = 1 - s
    span = int(np.abs(deficit).max()) + 1 if len(deficit) else 1
    lifted = deficit + seg * (2 * span)
    running = np.maximum.accumulate(lifted) - seg * (2 * span)
    out: npt.NDArray[np.int64] = s + np.maximum(0, running)
    return out


@dataclass(frozen=True, slots=True)
class _Events:
    """The session's events in time order with every random number they use, drawn in one place
    and one order that does not depend on ``signal`` (module docstring: determinism)."""

    times: npt.NDArray[np.float64]
    """Seconds from the open."""
    is_move: npt.NDArray[np.bool_]
    coin: npt.NDArray[np.float64]
    """A move's direction draw (:func:`_move_directions`)."""
    buyish: npt.NDArray[np.bool_]
    depth: npt.NDArray[np.int64]
    trade_u: npt.NDArray[np.float64]
    add_u: npt.NDArray[np.float64]
    modify_u: npt.NDArray[np.float64]
    add_size: npt.NDArray[np.int64]
    remove_size: npt.NDArray[np.int64]
    refill_size: npt.NDArray[np.int64]
    latency: npt.NDArray[np.int64]


def _events(rng: np.random.Generator, seconds: int, synth: SynthConfig) -> _Events | None:
    """The regimes, the event times and every random number of the session (None: no event)."""
    active = _regimes(rng, seconds, synth)
    rate = synth.events_per_second * np.where(active, synth.active_activity, synth.calm_activity)
    counts = rng.poisson(rate)
    n = int(counts.sum())
    times = np.sort(np.repeat(np.arange(seconds, dtype=np.float64), counts) + rng.random(n))
    regime = active[times.astype(np.int64)]
    if n == 0:
        return None
    pressure = _pressure(rng, seconds, synth.pressure_s)[times.astype(np.int64)]
    p_move = np.where(regime, synth.active_move_probability, synth.calm_move_probability)
    # Keyword arguments are evaluated in order: this is the order of the draws.
    return _Events(
        times=times,
        is_move=rng.random(n) < p_move,
        coin=rng.random(n),
        buyish=rng.random(n) < 0.5 * (1.0 + np.tanh(synth.pressure_tilt * pressure)),
        depth=np.minimum(rng.geometric(DEPTH_DECAY, size=n) - 1, LEVELS - 1).astype(np.int64),
        trade_u=rng.random(n),
        add_u=rng.random(n),
        modify_u=rng.random(n),
        add_size=_geometric(rng, synth.mean_order_size, n),
        remove_size=_geometric(rng, synth.mean_order_size * REMOVAL_SIZE_RATIO, n),
        refill_size=_geometric(rng, synth.mean_order_size, n),
        latency=rng.integers(*LATENCY_NS, size=n),
    )


@dataclass(frozen=True, slots=True)
class _BookEvents:
    """Per event: its kind, the signed size change of the level it touches and that level's side
    (True = bid); the signed flow the planted signal reads and its square (0 for a move and
    below :data:`SIGNAL_DEPTH`)."""

    kind: npt.NDArray[np.int64]
    delta: npt.NDArray[np.int64]
    is_bid: npt.NDArray[np.bool_]
    flow: npt.NDArray[np.float64]
    flow_sq: npt.NDArray[np.float64]


def _book_events(e: _Events) -> _BookEvents:
    is_trade = ~e.is_move & (e.depth == 0) & (e.trade_u < TRADE_SHARE)
    is_add = ~e.is_move & ~is_trade & (e.add_u < 0.5)
    # Buy-side flow is a bid add, an ask cancel or a trade against the ask (a buy aggressor).
    is_bid = is_add == e.buyish
    kind = np.where(is_trade, _TRADE, np.where(is_add, _ADD, _CANCEL))
    kind = np.where((kind != _TRADE) & (e.modify_u < MODIFY_SHARE), _MODIFY, kind)
    delta = np.where(is_add, e.add_size, -e.remove_size)
    # A trade consumes the level on the side opposite the aggressor: the touched side is is_bid.
    side_sign = np.where(is_bid, 1.0, -1.0)
    counted = ~e.is_move & (e.depth < SIGNAL_DEPTH)
    return _BookEvents(
        kind=kind,
        delta=delta,
        is_bid=is_bid,
        flow=np.where(counted, side_sign * delta, 0.0),
        flow_sq=np.where(counted, delta.astype(np.float64) ** 2, 0.0),
    )


@dataclass(frozen=True, slots=True)
class _Records:
    """The records of the events, a move being two (consuming trade, then the resting
    remainder): per record its event, whether it is a move's, the best bid and ask after it
    (ticks), its kind, the side (True = bid) and price (ticks) it touches, its size change and
    the size a move's refill rests."""

    event: npt.NDArray[np.int64]
    move: npt.NDArray[np.bool_]
    bid: npt.NDArray[np.int64]
    ask: npt.NDArray[np.int64]
    kind: npt.NDArray[np.int64]
    bid_side: npt.NDArray[np.bool_]
    price: npt.NDArray[np.int64]
    delta: npt.NDArray[np.int64]
    reset: npt.NDArray[np.int64]


def _records(
    e: _Events, book: _BookEvents, direction: npt.NDArray[np.int64], bid_before: npt.NDArray[np.int64]
) -> _Records:
    ev = np.repeat(np.arange(len(e.times)), 1 + e.is_move.astype(np.int64))
    second = np.zeros(len(ev), dtype=bool)
    second[1:] = ev[1:] == ev[:-1]
    up = direction[ev] > 0
    mv = e.is_move[ev]
    b0 = bid_before[ev]
    # Best bid/ask after each record: an up-move shows (b, b+2) then (b+1, b+2); a down-move
    # (b-1, b+1) then (b-1, b).
    bid = np.where(mv & ~up & ~second, b0 - 1, np.where(mv & second, b0 + direction[ev], b0))
    ask = np.where(mv & up, b0 + 2, np.where(mv & ~up & second, b0, b0 + 1))
    return _Records(
        event=ev,
        move=mv,
        bid=bid,
        ask=ask,
        kind=np.where(mv, np.where(second, _REFILL, _CLEAR), book.kind[ev]),
        bid_side=np.where(mv, np.where(second, up, ~up), book.is_bid[ev]),
        price=np.where(
            mv,
            np.where(up, b0 + 1, b0),
            np.where(book.is_bid[ev], bid - e.depth[ev], ask + e.depth[ev]),
        ),
        delta=np.where(mv, 0, book.delta[ev]),
        reset=np.where(mv & second, e.refill_size[ev], 0),
    )


@dataclass(frozen=True, slots=True)
class _Queues:
    """The levels' queues: level keys (side, price) from ``p_lo`` in ``width`` prices a side;
    the records' order sorted by (key, record), the key and the queue size after each record in
    that order, and per record the size its ``size`` field shows."""

    p_lo: int
    width: int
    order: npt.NDArray[np.int64]
    keys: npt.NDArray[np.int64]
    after: npt.NDArray[np.int64]
    size: npt.NDArray[np.int64]


def _queues(r: _Records, salt: int, mean_order: float) -> _Queues:
    """Group the records by level and reflect the summed flow per segment (module docstring)."""
    p_lo = int(min(r.bid.min(), r.price.min())) - LEVELS
    p_hi = int(max(r.ask.max(), r.price.max())) + LEVELS
    width = p_hi - p_lo + 1
    m = len(r.event)
    key = np.where(r.bid_side, 0, width) + (r.price - p_lo)
    order = np.lexsort((np.arange(m), key))
    k_sorted = key[order]
    kind_sorted = r.kind[order]
    is_reset = (kind_sorted == _CLEAR) | (kind_sorted == _REFILL)
    group_start = np.ones(m, dtype=bool)
    group_start[1:] = k_sorted[1:] != k_sorted[:-1]
    seg_start = group_start | is_reset
    initial = _initial_size(k_sorted, salt, mean_order)
    base = np.where(is_reset, r.reset[order], initial)[seg_start]
    inc = np.where(is_reset, 0, r.delta[order])
    after_sorted = _segmented_reflection(inc, seg_start, base)
    before_sorted = np.where(group_start, initial, np.roll(after_sorted, 1))
    after = np.empty(m, dtype=np.int64)
    before = np.empty(m, dtype=np.int64)
    after[order] = after_sorted
    before[order] = before_sorted
    size = np.where(r.kind == _CLEAR, before, np.where(r.kind == _REFILL, after, np.abs(after - before)))
    return _Queues(p_lo=p_lo, width=width, order=order, keys=k_sorted, after=after_sorted, size=size)


def _snapshot(
    out: npt.NDArray[np.void], r: _Records, q: _Queues, *, salt: int, mean_order: float, tick_fixed: int
) -> None:
    """Write every level's price, size and order count as of each record into ``out``: the size
    after the last event at that price, else the level's initial size."""
    m = len(r.event)
    codes = q.keys * m + q.order
    rec_index = np.arange(m, dtype=np.int64)
    for level in range(LEVELS):
        for is_bid_side, best, sign, name in ((True, r.bid, -1, "bid"), (False, r.ask, 1, "ask")):
            price = best + sign * level
            lkey = (0 if is_bid_side else q.width) + (price - q.p_lo)
            pos = np.searchsorted(codes, lkey * m + rec_index, side="right") - 1
            hit = (pos >= 0) & (q.keys[np.maximum(pos, 0)] == lkey)
            lsize = np.where(hit, q.after[np.maximum(pos, 0)], _initial_size(lkey, salt, mean_order))
            out[f"{name}_px_{level:02d}"] = price * tick_fixed
            out[f"{name}_sz_{level:02d}"] = lsize
            out[f"{name}_ct_{level:02d}"] = np.minimum(lsize, -(-lsize // _order_divisor(lkey, salt)))


def simulate_session(
    spec: InstrumentSpec,
    day: dt.date,
    synth: SynthConfig,
    *,
    seed: int,
    open_tick: int,
) -> SynthDay:
    """Simulate one instrument's session on ``day`` (module docstring); ``open_tick`` is the
    opening best bid in ticks. Returns records of :data:`MBP10_DTYPE` in ``ts_recv`` order."""
    if spec.tick_size <= 0:
        raise FeedError(f"feeds.instruments[{spec.symbol}].tick_size must be positive")
    rng = _rng(seed, spec.instrument_id, day)
    open_ns, close_ns = session_bounds(spec, day)
    seconds = (close_ns - open_ns) // NS
    if seconds <= 0:
        raise FeedError(f"{spec.symbol}: empty session {spec.session_start}-{spec.session_end}")
    tick_fixed = round(spec.tick_size * PRICE_SCALE)
    if abs(tick_fixed - spec.tick_size * PRICE_SCALE) > 1e-3:
        raise FeedError(
            f"feeds.instruments[{spec.symbol}].tick_size {spec.tick_size} is not a multiple of 1e-9"
        )
    salt = int(rng.integers(0, 2**62))
    e = _events(rng, seconds, synth)
    if e is None:
        return SynthDay(records=np.empty(0, dtype=MBP10_DTYPE), close_tick=open_tick)
    book = _book_events(e)

    # Price moves, with the planted signal.
    moves = np.flatnonzero(e.is_move)
    direction = np.zeros(len(e.times), dtype=np.int64)
    direction[moves] = _move_directions(
        times=e.times, flow=book.flow, flow_sq=book.flow_sq, moves=moves, coin=e.coin[moves], synth=synth
    )
    r = _records(e, book, direction, open_tick + np.cumsum(direction) - direction)
    q = _queues(r, salt, synth.mean_order_size)
    out = np.zeros(len(r.event), dtype=MBP10_DTYPE)
    _snapshot(out, r, q, salt=salt, mean_order=synth.mean_order_size, tick_fixed=tick_fixed)

    ev = r.event
    ts_recv = open_ns + (e.times[ev] * NS).astype(np.int64)
    out["length"] = MBP10_LENGTH
    out["rtype"] = MBP10_RTYPE
    out["publisher_id"] = PUBLISHER_ID
    out["instrument_id"] = spec.instrument_id
    out["ts_recv"] = ts_recv
    out["ts_event"] = ts_recv - e.latency[ev]
    out["ts_in_delta"] = e.latency[ev]
    out["price"] = r.price * tick_fixed
    out["size"] = q.size
    out["action"] = _ACTION[r.kind]
    trade_side = np.where(r.bid_side, b"A", b"B")  # aggressor: a trade on the bid is a sell
    out["side"] = np.where(
        (r.kind == _TRADE) | (r.kind == _CLEAR), trade_side, np.where(r.bid_side, b"B", b"A")
    )
    out["flags"] = np.where(r.kind == _CLEAR, 0, F_LAST)
    out["depth"] = np.where(r.move, 0, e.depth[ev])

    # Drop events that changed nothing (a removal reflected at one contract).
    keep = q.size > 0
    records = take_mbp10(out, keep) if not keep.all() else out
    records["sequence"] = np.arange(1, len(records) + 1)
    return SynthDay(records=records, close_tick=int(r.bid[-1]))


def _open_tick(spec: InstrumentSpec, synth: SynthConfig) -> int:
    price = synth.start_prices.get(spec.symbol, synth.default_start_price)
    return max(LEVELS + 1, round(price / spec.tick_size))


def write_synthetic(
    out_dir: str | Path,
    *,
    instruments: Sequence[InstrumentSpec],
    synth: SynthConfig,
    seed: int,
    on_day: Callable[[dt.date, int], None] | None = None,
) -> list[Path]:
    """Write ``synth.days`` daily files into ``out_dir``; return their paths.

    Each file holds every instrument's session merged in ``ts_recv`` order, with metadata over
    the union of the sessions and symbology from ``instruments``. ``on_day(day, records)`` is
    called after each file (progress reporting).
    """
    if not instruments:
        raise FeedError("no instruments to generate")
    ids = [spec.instrument_id for spec in instruments]
    if len(set(ids)) != len(ids) or len({spec.symbol for spec in instruments}) != len(ids):
        raise FeedError("instrument ids and symbols must be unique")
    try:
        first = dt.date.fromisoformat(synth.start_date)
    except ValueError:
        raise FeedError(f"synth.start_date: {synth.start_date!r} is not a date (YYYY-MM-DD)") from None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ticks = {spec.instrument_id: _open_tick(spec, synth) for spec in instruments}
    symbols = {spec.instrument_id: spec.symbol for spec in instruments}
    paths: list[Path] = []
    for day in trading_days(first, synth.days):
        sessions = []
        for spec in instruments:
            result = simulate_session(spec, day, synth, seed=seed, open_tick=ticks[spec.instrument_id])
            ticks[spec.instrument_id] = result.close_tick
            sessions.append(result.records)
        records = concat_mbp10(sessions)
        if len(sessions) > 1:
            records = take_mbp10(records, np.argsort(records["ts_recv"], kind="stable"))
        bounds = [session_bounds(spec, day) for spec in instruments]
        path = write_mbp10(
            out / synth_file_name(synth.dataset, day),
            records,
            dataset=synth.dataset,
            symbols=symbols,
            start_ns=min(b[0] for b in bounds),
            end_ns=max(b[1] for b in bounds),
        )
        paths.append(path)
        if on_day is not None:
            on_day(day, len(records))
    return paths
