"""The gate's as-traded evaluations in worker processes give the backtests' results exactly:
two windows of a synthetic archive evaluated by spawned workers and in this process, compared
array for array (the evaluations are deterministic and independent of each other), and the
baselines' own job gives the books a backtest trades beside the model."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest

from agent.backtest.api import BacktestRequest, Books, run_backtest
from agent.backtest.inputs import ResolvedCheckpoint
from agent.config import load_config
from agent.model.checkpoint import checkpoint_from_bytes, checkpoint_to_bytes
from agent.model.params import init_params
from agent.policy.observation import AGENT_FEATURES
from agent.progress import SILENT
from agent.train.data import select_instruments
from agent.train.evaluate import AsTradedRunner, eval_workers
from feeds.config import SynthConfig
from feeds.features import FEATURE_NAMES
from feeds.synth import write_synthetic

DAY_NS = 86_400 * 10**9


def test_worker_processes_evaluate_exactly_as_this_process(tmp_path: Path) -> None:
    config = load_config("config/tiny.toml", env={"TRADEAGENT__FEEDS__BARS__INTERVAL_S": "10"})
    es = select_instruments(config.feeds, ["ES"])
    archive = tmp_path / "archive"
    write_synthetic(archive, instruments=es, synth=SynthConfig(days=2, events_per_second=2.0), seed=5)
    config = msgspec.structs.replace(
        config,
        data_dir=str(tmp_path / "dd"),
        feeds=msgspec.structs.replace(config.feeds, instruments=tuple(es)),
    )
    model = config.model.with_features(len(FEATURE_NAMES) + len(AGENT_FEATURES))
    f = model.n_features
    params = init_params(model, np.random.default_rng(2))
    for name in ("q.W", "q.b", "ret.W", "ret.b"):  # sharper heads: the model trades
        params[name] = params[name] * np.float32(4.0)
    checkpoint = checkpoint_from_bytes(
        checkpoint_to_bytes(
            params,
            model,
            feature_names=(*FEATURE_NAMES, *AGENT_FEATURES),
            norm_mean=np.zeros(f, np.float32),
            norm_std=np.ones(f, np.float32),
            metadata={},
        )
    )
    days = sorted(p.name for p in archive.iterdir())  # synth-mbp-10-YYYYMMDD.dbn.zst
    assert len(days) == 2
    stamp = days[0].split("-")[-1][:8]
    first = int(np.datetime64(f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:]}", "ns").astype(np.int64))
    windows = [(first, first + DAY_NS), (first + DAY_NS, first + 2 * DAY_NS)]
    with AsTradedRunner(config, archive, workers=2) as pool:
        remote = [pool.submit(checkpoint, {}, w) for w in windows]
        remote_base = [pool.submit_baselines(w) for w in windows]
        remote_results = [r.result() for r in remote]
        remote_baselines = [r.result() for r in remote_base]
    with AsTradedRunner(config, archive, workers=1) as here:
        local_results = [here.submit(checkpoint, {}, w).result() for w in windows]
        local_baselines = [here.submit_baselines(w).result() for w in windows]
    for got, want in zip(remote_results, local_results, strict=True):
        assert got.summary.pnl == want.summary.pnl
        assert got.summary.orders == want.summary.orders > 0
        assert got.summary.baselines == {}  # a job of their own
        _same_books(got.books, want.books)
    # the baselines' own job gives the books a backtest trades beside the model
    whole = run_backtest(
        config,
        BacktestRequest(
            data=archive,
            checkpoint=ResolvedCheckpoint(checkpoint, {}),
            start_ns=windows[0][0],
            end_ns=windows[0][1],
        ),
        SILENT,
    )
    for got, want in zip(remote_baselines, [whole.baselines, local_baselines[1]], strict=True):
        assert set(got) == {"flat", "random", "long"}
        for name in got:
            _same_books(got[name], want[name])
    assert remote_baselines[0]["random"].traded.sum() > 0


def _same_books(got: Books, want: Books) -> None:
    for field in ("pnl", "cost", "traded", "held", "ts_ns", "position"):
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=field)


@pytest.mark.parametrize(
    ("configured", "jobs", "cores", "want"), [(3, 8, 16, 3), (0, 8, 16, 8), (0, 8, 6, 4), (0, 8, 2, 1)]
)
def test_worker_count(
    configured: int, jobs: int, cores: int, want: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agent.train.evaluate.os.cpu_count", lambda: cores)
    assert eval_workers(configured, jobs) == want
