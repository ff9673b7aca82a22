"""``tradeagent bench train``: speed of the trainer (not a test; figures go in the README).

Keys:

* ``env_steps_per_s``: environment transitions per second of the vectorised environment alone
  (``train.n_envs`` windows in lockstep, random actions, observation gathered each step);
* ``act_steps_per_s``: lockstep steps per second with the model acting (forward on ``n_envs``
  windows, Thompson draw, environment step);
* ``updates_per_s``: learner updates per second (``train.batch_size``, double-DQN targets, return
  head, backward, clipping, Adam, Polyak) with the configured model;
* ``standard_retrain_s``: wall time of the standard retrain: reading 20 trading days of 1-second
  bars of one instrument (synthetic ES, DBN decode and features: ``load_s``) plus
  ``tradeagent train``'s walk-forward over them with 4 folds, the configured model and trainer,
  in a throw-away data directory (``standard_retrain_train_s``: the part spent in the training
  loops). On the CPU the full run takes hours, so by default it runs 2% of the training steps
  (``--fraction`` sets the share on any device) and estimates the full training loops as
  ``folds x epochs x steps_per_epoch x (1 / act_steps_per_s + updates_per_step / updates_per_s)``
  (data, evaluation and registry as measured); the JSON then says so:
  ``standard_retrain_extrapolated`` is true and ``standard_retrain_measured_s`` /
  ``standard_retrain_fraction`` give the measured reduced run. ``bars``: bars trained and tested on.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from threadpoolctl import threadpool_limits

from agent.config import Config
from agent.errors import CommandError
from agent.gpu.backend import select_backend
from agent.model import init_params
from agent.policy.observation import AGENT_FEATURES
from agent.train.cuda_learner import fused_fits, select_learner
from agent.train.data import load_archive, select_instruments
from agent.train.env import InstrumentBars, VecEnv, build_env_data, fit_norm
from agent.train.replay import NStepBuffer, Replay
from agent.train.walkforward import TrainRequest, run_training
from feeds.config import SynthConfig
from feeds.features import FEATURE_NAMES
from feeds.synth import write_synthetic

__all__ = ["add_arguments", "measure", "run"]

log = logging.getLogger(__name__)

STANDARD_DAYS = 20
STANDARD_FOLDS = 4
CPU_FRACTION = 0.02


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), help="override the configured device")
    parser.add_argument("--data", metavar="DIR", help="archive to use (default: 20 synthetic days of ES)")
    parser.add_argument(
        "--fraction",
        type=float,
        help="share of the retrain's training steps to run, the rest extrapolated "
        "(default: 1 on CUDA, 0.02 on the CPU)",
    )
    parser.add_argument("--steps", type=int, default=200, help="environment steps and updates to time")


def _sync(xp: Any) -> None:
    if xp is not np:
        xp.cuda.Stream.null.synchronize()


def run(args: argparse.Namespace, config: Config) -> dict[str, Any]:
    if args.device:
        config = msgspec.structs.replace(config, device=args.device)
    es = select_instruments(config.feeds, ["ES"])
    with tempfile.TemporaryDirectory(prefix="tradeagent-bench-train-") as tmp:
        data = Path(args.data) if args.data else Path(tmp) / "archive"
        if not args.data:
            log.info("writing %d synthetic trading days of ES", STANDARD_DAYS)
            write_synthetic(data, instruments=es, synth=SynthConfig(days=STANDARD_DAYS), seed=config.seed)
        start = time.perf_counter()
        bars = load_archive(
            data,
            config.feeds,
            es,
            fee_per_contract=config.broker.fee_per_contract,
            latency_ms=config.broker.latency_ms,
            close_grace_ns=config.daemon.close_grace_ns,
        )
        load_s = time.perf_counter() - start
        return measure(
            config,
            bars,
            data=data,
            load_s=load_s,
            state=Path(tmp) / "state",
            fraction=args.fraction,
            steps=args.steps,
        )


def measure(
    config: Config,
    bars: dict[str, InstrumentBars],
    *,
    data: Path,
    load_s: float,
    state: Path,
    fraction: float | None,
    steps: int,
) -> dict[str, Any]:
    """The benchmark's figures for bars already in memory, read from the archive ``data`` (which
    the gate's as-traded evaluation replays; ``load_s``: what reading the bars took, added to
    the retrain's wall time). ``fraction``: share of the retrain's training steps to run (None:
    all of them on CUDA, 0.02 on the CPU)."""
    backend = select_backend(config.device)
    result: dict[str, Any] = {"device": backend.description, "bars": len(bars["ES"]), "load_s": load_s}
    with contextlib.ExitStack() as stack:
        if not backend.is_cuda and config.train.cpu_threads:
            stack.enter_context(threadpool_limits(config.train.cpu_threads, user_api="blas"))
        result |= _micro(config, bars["ES"], backend.xp, steps)
    log.info("micro-benchmarks: %s", result)
    share = fraction if fraction is not None else (1.0 if backend.is_cuda else CPU_FRACTION)
    per_step = 1.0 / result["act_steps_per_s"] + config.train.updates_per_step / result["updates_per_s"]
    result |= _retrain(config, bars, data, load_s, state, fraction=share, per_step_s=per_step)
    return result


def _micro(config: Config, bars: InstrumentBars, xp: Any, steps: int) -> dict[str, Any]:
    cfg = config.train
    parts = [(bars, 0, len(bars))]
    model = config.model.with_features(len(FEATURE_NAMES) + len(AGENT_FEATURES))
    cuda = xp is not np
    fused = cuda and fused_fits(model)
    params = init_params(model, np.random.default_rng(0), xp=np if fused else xp)
    learner = select_learner(model, cfg, params, seed=0, cuda=cuda)
    env_xp = learner.xp
    env_data = build_env_data(
        parts,
        fit_norm(parts),
        window=model.window,
        horizon=model.return_horizon,
        session_gap_s=cfg.session_gap_s,
        xp=env_xp,
    )
    env = VecEnv(env_data, cfg.n_envs, reward_scale=cfg.reward_scale, seed=0)
    env.reset_random()
    rng = np.random.default_rng(0)
    actions = [env_xp.asarray(rng.integers(0, 3, cfg.n_envs)) for _ in range(steps)]
    _sync(env_xp)
    start = time.perf_counter()
    for a in actions:
        env.observe()
        res = env.step(a)
        env.reset_random(res.done)
    _sync(env_xp)
    env_rate = steps * cfg.n_envs / (time.perf_counter() - start)
    replay = Replay(max(cfg.batch_size * 4, cfg.n_envs * 8), model.window, len(AGENT_FEATURES), env_xp)
    nstep = NStepBuffer(
        cfg.n_step, cfg.gamma, n_envs=cfg.n_envs, window=model.window, n_agent=len(AGENT_FEATURES), xp=env_xp
    )
    while replay.size < replay.capacity:
        before = (env.t.copy(), env.agent.copy())
        res = env.step(env_xp.asarray(rng.integers(0, 3, cfg.n_envs)))
        batch = nstep.push(before, res.action, res.reward, res.done, (env.t.copy(), env.agent.copy()))
        if batch is not None:
            replay.add(batch)
        env.reset_random(res.done)
    n_updates = max(10, steps // 4) * (10 if fused else 1)
    learner.update(env_data, replay.sample(rng, cfg.batch_size))  # warm-up (kernel compilation)
    learner.take_stats()  # waits for the device
    start = time.perf_counter()
    for _ in range(n_updates):
        learner.update(env_data, replay.sample(rng, cfg.batch_size))
    learner.take_stats()
    update_rate = n_updates / (time.perf_counter() - start)
    env_ids = env_xp.arange(cfg.n_envs, dtype=np.int64)
    n_act = max(10, steps // 4) * (10 if fused else 1)
    learner.explore(env_data, env.t, env.agent, env_ids, env_xp.zeros(cfg.n_envs, dtype=np.int64))  # warm-up
    _sync(env_xp)
    start = time.perf_counter()
    for k in range(n_act):
        counter = env_xp.full(cfg.n_envs, k, dtype=np.int64)
        res = env.step(learner.explore(env_data, env.t, env.agent, env_ids, counter))
        env.reset_random(res.done)
    _sync(env_xp)
    act_rate = n_act / (time.perf_counter() - start)
    return {
        "env_steps_per_s": env_rate,
        "updates_per_s": update_rate,
        "act_steps_per_s": act_rate,
        "learner": "fused CUDA kernels" if fused else f"array code ({'CuPy' if cuda else 'NumPy'})",
    }


def _retrain(
    config: Config,
    bars: dict[str, InstrumentBars],
    data: Path,
    load_s: float,
    state: Path,
    *,
    fraction: float,
    per_step_s: float,
) -> dict[str, Any]:
    cfg = config.train
    if not 0.0 < fraction <= 1.0:
        raise CommandError(f"--fraction must be in (0, 1], got {fraction}")
    steps = max(1, min(cfg.steps_per_epoch, round(cfg.steps_per_epoch * fraction)))
    full = steps == cfg.steps_per_epoch
    train = msgspec.structs.replace(cfg, folds=STANDARD_FOLDS, steps_per_epoch=steps)
    run_config = msgspec.structs.replace(config, data_dir=str(state), train=train)
    start = time.perf_counter()
    summary = run_training(run_config, TrainRequest(data=data, instruments=["ES"], bars=bars)).summary
    measured = load_s + time.perf_counter() - start
    out: dict[str, Any] = {
        "standard_retrain_s": measured,
        "standard_retrain_extrapolated": False,
        "standard_retrain_train_s": summary.train_s,
    }
    if not full:
        # The reduced run's loops mostly fill replay (few updates), so its training time does not
        # scale: the full loops are estimated from the measured per-step costs instead.
        total_steps = STANDARD_FOLDS * cfg.epochs * cfg.steps_per_epoch
        out |= {
            "standard_retrain_s": measured - summary.train_s + total_steps * per_step_s,
            "standard_retrain_extrapolated": True,
            "standard_retrain_measured_s": measured,
            "standard_retrain_fraction": steps / cfg.steps_per_epoch,
        }
    return out
