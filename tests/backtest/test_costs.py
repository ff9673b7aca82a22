"""The control experiment of mid fills (``broker.fill_price = "mid"`` with ``policy.leg_price =
"mid"``): every fill, in both drivers, is at the mid of the book the order meets, so trading
pays no spread; the sizing's cost gate charges the fee alone; the two keys must agree."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgspec
import numpy as np
import pytest

from agent.backtest.api import BacktestRequest, run_backtest
from agent.backtest.fast import load_bars, regime_path, run_fast
from agent.config import Config, ConfigError, load_config
from agent.execution.fills import order_schedule
from agent.model.checkpoint import checkpoint_from_bytes
from agent.policy.kelly import kelly_size_ref, leg_cost
from agent.policy.regime import RegimeTracker
from agent.trading.decider import ModelDecider
from feeds.dbn import read_mbp10
from tests.backtest.conftest import backtest_config
from tests.backtest.test_parity import _Quiet
from tests.daemon.support import INSTRUMENTS


def _mid_fills(config: Config) -> Config:
    return msgspec.structs.replace(
        config,
        broker=msgspec.structs.replace(config.broker, fill_price="mid", fee_per_contract=0.0),
        policy=msgspec.structs.replace(config.policy, leg_price="mid"),
    )


def test_mid_fills_are_at_the_mid_of_the_book_met_in_both_drivers(
    signal_data: Path, checkpoint_file: Path, tmp_path: Path
) -> None:
    config = _mid_fills(backtest_config(tmp_path / "state"))
    bars = load_bars(
        signal_data,
        INSTRUMENTS,
        config.feeds,
        0,
        2**62,
        latency_ms=config.broker.latency_ms,
        close_grace_ns=config.daemon.close_grace_ns,
    )
    frames = [bars.frames[s.symbol] for s in INSTRUMENTS]
    decider = ModelDecider(
        checkpoint_from_bytes(checkpoint_file.read_bytes()),
        config.policy,
        [s.tick_value for s in INSTRUMENTS],
        "cpu",
        fee_per_contract=0.0,
        max_batch=len(INSTRUMENTS),
    )
    try:
        regimes = regime_path(frames, RegimeTracker(config.regime, config.policy.scale_floor, [0.0, 0.0]))
        fills = run_fast(bars, INSTRUMENTS, config, decider, regimes, chunks=1).fills
    finally:
        decider.close()
    f = fills.arrays()
    assert f["bar"].size > 20 and not f["fee"].any()
    records = read_mbp10(signal_data)  # in feed order, as the backtest read them
    for i, (spec, frame) in enumerate(zip(INSTRUMENTS, frames, strict=True)):
        mine = f["instrument"] == i
        rows = order_schedule(
            records,
            spec.instrument_id,
            frame.close_index,
            frame.ts_close,
            config.broker.latency_ms,
            bars=config.feeds.bars,
            grace_ns=config.daemon.close_grace_ns,
        ).rows
        met = records[rows[f["bar"][mine]]]
        mid = (met["bid_px_00"].astype(np.float64) + met["ask_px_00"].astype(np.float64)) / 2
        np.testing.assert_array_equal(f["price"][mine], np.rint(mid))
    # the event-driven driver (the paper broker) fills the same, to the books
    request = BacktestRequest(data=signal_data, checkpoint=str(checkpoint_file), fast=False)
    event = run_backtest(config, request, _Quiet())
    fast = run_backtest(config, dataclasses.replace(request, fast=True, chunks=1), _Quiet())
    assert event.summary.fills == f["bar"].size == fast.summary.fills
    np.testing.assert_allclose(event.books.pnl, fast.books.pnl, rtol=0, atol=1e-6)
    # what the control run's costs hold is the mid's move between decision and execution, which
    # nets to next to nothing; at the touch the same model pays the spread
    book = run_backtest(backtest_config(tmp_path / "book"), request, _Quiet()).summary.performance
    assert book.costs > 0 and abs(event.summary.performance.costs) < 0.1 * book.costs


def test_the_cost_gate_charges_the_fee_alone_under_mid_fills() -> None:
    np.testing.assert_allclose(leg_cost([2.0, 4.0], [12.5, 12.5], 1.0, leg_price="mid"), [1.0, 1.0])
    assert leg_cost([np.nan], [12.5], 1.0, leg_price="mid")[0] == np.inf
    base = load_config(None, env={"TRADEAGENT__DEVICE": "cpu"})
    # a view of +0.5 tick: below one leg at the touch (half of a 2-tick spread + fee), above the
    # fee and the edge margin alone
    probs = np.zeros((1, 3))
    probs[0, 2] = 0.5
    probs[0, 1] = 0.5
    sizes = {}
    for leg_price in ("book", "mid"):
        policy = msgspec.structs.replace(base.policy, leg_price=leg_price)
        sizing = kelly_size_ref(
            probs,
            np.array([-1.0, 0.0, 1.0]),
            np.array([1]),
            np.array([12.5]),
            np.array([1.0]),
            spread_ticks=np.array([2.0]),
            position=np.array([0]),
            policy=policy,
            fee_per_contract=1.0,
        )
        sizes[leg_price] = int(sizing.target[0])
    assert sizes == {"book": 0, "mid": 1}


def test_the_broker_and_the_cost_gate_must_agree_on_the_fill_price() -> None:
    mid = {"TRADEAGENT__BROKER__FILL_PRICE": "mid", "TRADEAGENT__DEVICE": "cpu"}
    with pytest.raises(ConfigError, match=r"key 'policy\.leg_price'.*must charge what the broker fills"):
        load_config(None, env=mid)
    config = load_config(None, env={**mid, "TRADEAGENT__POLICY__LEG_PRICE": "mid"})
    assert config.broker.fill_price == config.policy.leg_price == "mid"
    with pytest.raises(ConfigError, match=r"key 'broker\.fill_price'.*device = \"cpu\""):
        load_config(None, env={**mid, "TRADEAGENT__POLICY__LEG_PRICE": "mid", "TRADEAGENT__DEVICE": "auto"})
    with pytest.raises(ConfigError, match=r"key 'broker\.fill_price'.*market orders only"):
        load_config(
            None,
            env={**mid, "TRADEAGENT__POLICY__LEG_PRICE": "mid", "TRADEAGENT__BROKER__ORDER_TYPE": "limit"},
        )
