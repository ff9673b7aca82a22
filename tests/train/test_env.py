"""The vectorised environment on small hand-built bar arrays."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgspec
import numpy as np
import pytest

from agent.config import load_config
from agent.execution.broker import PaperBroker
from agent.execution.config import FillPrice
from agent.execution.fills import order_schedule
from agent.execution.orders import OrderManager
from agent.execution.portfolio import Portfolio
from agent.execution.protocol import Fill, Side
from agent.policy.observation import AGENT_FEATURES, agent_feature_values
from agent.train.data import load_archive
from agent.train.env import EnvData, InstrumentBars, VecEnv, build_env_data, fit_norm, rollout
from agent.train.errors import TrainError
from feeds.book import tick_fixed
from feeds.dbn import read_mbp10
from feeds.features import FEATURE_NAMES, compute_all
from tests.daemon.support import INSTRUMENTS, synth_feed

F = len(FEATURE_NAMES)
SEC = 1_000_000_000


def make_bars(
    mid: list[float], *, spread: float = 1.0, tradable: list[bool] | None = None, ts: list[int] | None = None
) -> InstrumentBars:
    n = len(mid)
    rng = np.random.default_rng(0)
    return InstrumentBars(
        symbol="ES",
        ts_ns=np.array(ts if ts is not None else [i * SEC for i in range(n)], dtype=np.int64),
        features=rng.normal(size=(n, F)).astype(np.float32),
        mid_ticks=np.array(mid, dtype=np.float64),
        spread_ticks=np.full(n, spread),
        buy_cost_ticks=np.full(n, spread / 2),
        sell_cost_ticks=np.full(n, spread / 2),
        tradable=np.array(tradable if tradable is not None else [True] * n),
        tick_value=12.5,
        fee_ticks=0.1,
    )


def data_of(bars: InstrumentBars, window: int = 2, gap_s: float = 600.0) -> EnvData:
    norm = fit_norm([(bars, 0, len(bars))])
    return build_env_data([(bars, 0, len(bars))], norm, window=window, horizon=1, session_gap_s=gap_s, xp=np)


def test_rewards_costs_and_agent_features_by_hand() -> None:
    data = data_of(make_bars([100, 102, 101, 104, 104, 103]))
    env = VecEnv(data, 1, reward_scale=0.5, seed=0)
    env.reset_at(np.array([True]), np.array([1]), np.array([5]))
    obs = env.observe()
    assert obs.shape == (1, 2, F + len(AGENT_FEATURES)) and not obs[0, :, F:].any()
    r = env.step(np.array([2]))  # long at bar 1: cost 0.5 + 0.1, gross 101 - 102 = -1
    assert r.gross_ticks[0] == -1 and r.cost_ticks[0] == pytest.approx(0.6)
    assert r.reward[0] == pytest.approx(-1.6 * 0.5) and r.position[0] == 1 and not r.done[0]
    # unrealised from the entry fill (102 + half-spread 0.5) to the mark 101: -1.5 ticks x 0.5
    np.testing.assert_allclose(env.observe()[0, -1, F:], [1.0, -0.75])
    r = env.step(np.array([0]))  # flip to short at bar 2: cost 2 x 0.6, gross -(104 - 101)
    assert r.gross_ticks[0] == -3 and r.cost_ticks[0] == pytest.approx(1.2) and r.traded[0] == 2
    r = env.step(np.array([0]))  # hold short at bar 3: gross 0
    assert r.gross_ticks[0] == 0 and r.cost_ticks[0] == 0
    r = env.step(np.array([0]))  # bar 4 is the session's last decision bar: closed, done
    assert r.position[0] == 0 and r.cost_ticks[0] == pytest.approx(0.6) and r.done[0]
    assert r.action[0] == 1 and not env.active[0]


def test_steps_and_resets_replace_the_state_and_windows_are_the_feature_rows() -> None:
    """The trainer keeps the state arrays it read before a step and a reset instead of copies:
    neither writes them. The observation is the K feature rows up to each bar and its agent
    history."""
    mid = list(100 + np.cumsum(np.random.default_rng(1).integers(-1, 2, 60)))
    data = data_of(make_bars(mid, spread=2.0), window=4)
    env = VecEnv(data, 5, reward_scale=0.5, seed=3)
    env.reset_random()
    rng = np.random.default_rng(0)
    for _ in range(80):
        held = {k: getattr(env, k) for k in ("t", "end", "position", "entry", "agent", "active")}
        copies = {k: v.copy() for k, v in held.items()}
        obs = env.observe()
        for i, t in enumerate(env.t):
            np.testing.assert_array_equal(obs[i, :, :F], data.feat[t - 3 : t + 1])
        np.testing.assert_array_equal(obs[:, :, F:], env.agent)
        res = env.step(rng.integers(0, 3, 5))
        env.reset_random(res.done)
        for k, v in held.items():
            np.testing.assert_array_equal(v, copies[k], err_msg=k)


def test_reset_random_draws_the_same_whatever_it_restarts() -> None:
    """Each call draws for every environment, so the starts drawn later do not depend on whom
    earlier calls restarted (nobody, in the first environment here)."""
    data = data_of(make_bars(list(range(100, 160))), window=4)
    a, b = (VecEnv(data, 4, reward_scale=1.0, seed=5) for _ in range(2))
    a.reset_random()
    b.reset_random()
    t0 = a.t.copy()
    a.reset_random(np.zeros(4, dtype=bool))
    b.reset_random(np.array([False, True, False, True]))
    np.testing.assert_array_equal(a.t, t0)
    mask = np.array([True, False, True, False])
    a.reset_random(mask)
    b.reset_random(mask)
    np.testing.assert_array_equal(a.t[mask], b.t[mask])


def test_mid_fills_cost_the_move_of_the_mid_and_the_fee_only() -> None:
    bars = make_bars([100, 102, 101, 104, 104, 103], spread=2.0)
    # the book an order meets: its ask 1.5 ticks above the decision mid, its bid 0.5 below, so
    # its mid is 0.5 above the decision mid
    bars = dataclasses.replace(bars, buy_cost_ticks=np.full(6, 1.5), sell_cost_ticks=np.full(6, 0.5))
    norm = fit_norm([(bars, 0, len(bars))])
    data = build_env_data(
        [(bars, 0, 6)], norm, window=2, horizon=1, session_gap_s=600, xp=np, fill_price="mid"
    )
    np.testing.assert_allclose(data.buy_cost, 0.5)
    np.testing.assert_allclose(data.sell_cost, -0.5)
    env = VecEnv(data, 1, reward_scale=1.0, seed=0)
    env.reset_at(np.array([True]), np.array([1]), np.array([5]))
    r = env.step(np.array([2]))  # buy at the book's mid 102.5: 0.5 + fee 0.1
    assert r.cost_ticks[0] == pytest.approx(0.6)
    np.testing.assert_allclose(env.observe()[0, -1, F:], [1.0, 101 - 102.5])
    r = env.step(np.array([1]))  # sell at 101.5: it gives up -0.5 (gains the move) + fee 0.1
    assert r.cost_ticks[0] == pytest.approx(-0.4)


@pytest.mark.parametrize("fill_price", ["book", "mid"])
def test_the_agent_columns_are_the_ledgers_for_the_same_fills(tmp_path: Path, fill_price: FillPrice) -> None:
    """The environment's two agent columns after each step equal the trading step's observation
    row (:func:`agent.policy.observation.agent_feature_values`) of the position and average fill
    price that the paper broker's fills give a portfolio for the same orders, marked at the same
    mids: training and trading show the model one state."""
    synth_feed(tmp_path, days=1)
    config = load_config(None, env={})
    broker_config = msgspec.structs.replace(config.broker, latency_ms=25.0, fill_price=fill_price)
    feeds = msgspec.structs.replace(config.feeds, instruments=INSTRUMENTS)
    es = load_archive(
        tmp_path, feeds, INSTRUMENTS, fee_per_contract=0.0, latency_ms=25.0, close_grace_ns=50_000_000
    )["ES"]
    spec = INSTRUMENTS[0]
    records = read_mbp10(tmp_path)
    frame = compute_all(records, INSTRUMENTS, feeds.bars, feeds.health).frames["ES"]
    mine = np.flatnonzero(records["instrument_id"] == spec.instrument_id)
    closing = mine[np.minimum(np.searchsorted(mine, frame.close_index, side="right"), mine.size - 1)]
    closing_ns = records["ts_recv"][closing].astype(np.int64)
    # Orders go out only where the fill is in before the next bar's decision (the environment's
    # assumption; the trading step would still see the order working otherwise).
    in_time = np.r_[closing_ns[1:] > closing_ns[:-1] + 25_000_000, False]
    part = [(es, 0, len(es))]
    data = build_env_data(
        part, fit_norm(part), window=2, horizon=1, session_gap_s=600, xp=np, fill_price=fill_price
    )
    np.testing.assert_array_equal(data.ts_ns, es.ts_ns)  # one session: env bar k is bar k
    broker = PaperBroker(broker_config, [s.instrument_id for s in INSTRUMENTS])
    portfolio = Portfolio(INSTRUMENTS)
    orders = OrderManager("t")
    env = VecEnv(data, 1, reward_scale=0.5, seed=0)
    start, steps = 10, 120
    env.reset_at(np.array([True]), np.array([start]), np.array([start + steps]))
    rng = np.random.default_rng(5)
    fed = 0
    compared = traded = 0
    for t in range(start, start + steps):
        for report in broker.on_records(records[fed : closing[t] + 1]):
            if isinstance(report, Fill):
                portfolio.apply(report)
        fed = int(closing[t]) + 1
        if t > start:  # the state at bar t's decision, as the environment shows it
            row = agent_feature_values(
                portfolio.position(spec.instrument_id),
                portfolio.avg_price(spec.instrument_id) / float(tick_fixed(spec.tick_size)),
                float(data.mark[t]),
                0.5,
            )
            np.testing.assert_allclose(env.agent[0, -1], np.float32(row), rtol=1e-6, atol=1e-6)
            compared += 1
        before = int(env.position[0])
        # a walk over short / flat / long one contract at a time (unit orders: one level's fill)
        want = int(np.clip(before + rng.integers(-1, 2), -1, 1)) if in_time[t] else before
        after = int(env.step(np.array([want + 1])).position[0])
        if after != before:
            side: Side = "buy" if after > before else "sell"
            order = orders.new(spec.instrument_id, side, 1, ts_ns=int(closing_ns[t]))
            assert broker.submit(order) == []
            traded += 1
    assert compared == steps - 1 and traded >= 20


def test_non_tradable_bars_freeze_position_and_credit_the_move_later() -> None:
    bars = make_bars(
        [100, 100, 101, 150, 103, 104, 104], tradable=[True, True, True, False, True, True, True]
    )
    data = data_of(bars)
    np.testing.assert_array_equal(data.mark, [100, 100, 101, 101, 103, 104, 104])
    env = VecEnv(data, 1, reward_scale=1.0, seed=0)
    env.reset_at(np.array([True]), np.array([1]), np.array([6]))
    env.step(np.array([2]))  # long at bar 1 (gross +1)
    r = env.step(np.array([2]))  # bar 2 -> 3: the mark is frozen over the unhealthy bar 3
    assert r.gross_ticks[0] == 0
    r = env.step(np.array([0]))  # bar 3 is not tradable: the short order is ignored
    assert r.position[0] == 1 and r.cost_ticks[0] == 0 and r.gross_ticks[0] == 2  # 101 -> 103
    assert r.action[0] == 2


def test_sessions_split_on_time_gaps_and_label_stays_inside() -> None:
    ts = [0, 1, 2, 3, 4, 10_000, 10_001, 10_002, 10_003]
    bars = make_bars([1, 2, 3, 4, 5, 6, 7, 8, 9], ts=[t * SEC for t in ts])
    data = data_of(bars, window=2)
    np.testing.assert_array_equal(data.starts, [1, 2, 3, 6, 7])
    np.testing.assert_array_equal(data.session_end, [5] * 5 + [9] * 4)
    assert np.isnan(data.label_ticks[4]) and data.label_ticks[3] == 1
    with pytest.raises(TrainError, match="no session"):
        data_of(make_bars([1, 2]), window=4)


def test_rollout_visits_each_decision_bar_once_and_baselines_add_up() -> None:
    rng = np.random.default_rng(3)
    mid = list(1000 + np.cumsum(rng.integers(-1, 2, 300)))
    data = data_of(make_bars(mid, spread=2.0), window=4)
    flat = rollout(data, lambda obs, t: np.ones(obs.shape[0], dtype=np.int64), n_envs=7, reward_scale=1.0)
    np.testing.assert_array_equal(flat.bar, data.starts)
    assert not flat.pnl.any() and not flat.traded.any()
    long = rollout(data, lambda obs, t: np.full(obs.shape[0], 2), n_envs=7, reward_scale=1.0)
    # Each of the 7 chunks opens long (half-spread 1 + fee 0.1 ticks); the session's last decision
    # bar closes the position, so the move over the final bar is not held.
    opens = int((long.traded > 0).sum()) - 1
    move = mid[int(data.starts[-1])] - mid[int(data.starts[0])]
    assert opens == 7 and long.held[-1] == 0 and long.held[:-1].all()
    assert long.pnl.sum() == pytest.approx((move - 1.1 * (opens + 1)) * 12.5)


def test_the_env_fills_where_the_paper_broker_fills(tmp_path: Path) -> None:
    """A unit order sent when a bar is decided costs in the environment exactly what the paper
    broker charges for it: the ask (bid) of the book as it stands ``latency_ms`` after the
    moment of decision (the closing record, or the clock a grace after a quiet bar's close),
    against the bar's mid."""
    synth_feed(tmp_path, days=1)
    config = load_config(None, env={})
    broker_config = msgspec.structs.replace(config.broker, latency_ms=25.0)
    feeds = msgspec.structs.replace(config.feeds, instruments=INSTRUMENTS)
    bars = load_archive(
        tmp_path,
        feeds,
        INSTRUMENTS,
        fee_per_contract=0.0,
        latency_ms=broker_config.latency_ms,
        close_grace_ns=config.daemon.close_grace_ns,
    )
    records = read_mbp10(tmp_path)
    frame = compute_all(records, INSTRUMENTS, feeds.bars, feeds.health).frames["ES"]
    es = bars["ES"]
    tick = tick_fixed(INSTRUMENTS[0].tick_size)
    decided = order_schedule(
        records,
        INSTRUMENTS[0].instrument_id,
        frame.close_index,
        frame.ts_close,
        broker_config.latency_ms,
        bars=feeds.bars,
        grace_ns=config.daemon.close_grace_ns,
    ).decided_ns
    checked = on_clock = 0
    for k in range(10, len(frame) - 10, max(1, len(frame) // 25)):
        if not es.tradable[k]:
            continue
        closing = int(np.searchsorted(records["ts_recv"], decided[k], side="right")) - 1  # the last before
        on_clock += int(decided[k] == frame.ts_close[k] + config.daemon.close_grace_ns + 1)
        sides: tuple[tuple[Side, float], ...] = (
            ("buy", es.buy_cost_ticks[k]),
            ("sell", -es.sell_cost_ticks[k]),
        )
        for side, cost in sides:
            broker = PaperBroker(broker_config, [s.instrument_id for s in INSTRUMENTS])
            broker.on_records(records[: closing + 1])
            order = OrderManager("t").new(INSTRUMENTS[0].instrument_id, side, 1, ts_ns=int(decided[k]))
            reports = broker.submit(order) + broker.on_records(records[closing + 1 :])
            fills = [r for r in reports if isinstance(r, Fill)]
            assert len(fills) == 1
            assert fills[0].price == round((es.mid_ticks[k] + cost) * tick)
        checked += 1
    assert checked >= 10
    assert 0 < on_clock < checked  # both kinds of decision were checked
