"""Typed settings of the trainer (``[train]`` in the TOML files, composed into ``agent.config``).

Units: bars are bars of the decision clock (``feeds.bars``); rewards are ticks times
``reward_scale`` ("normalised units", the units of the C51 support ``model.v_min/v_max`` and
of the Q-drift threshold); drawdown and the return margin are in account currency.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

__all__ = ["TrainConfig"]


class TrainConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Walk-forward, environment, learner and gate settings (DESIGN section 9)."""

    # --- walk-forward -------------------------------------------------------------------------
    folds: int = 4
    train_test_ratio: float = 3.0
    """Train window length over test block length (rolling folds)."""
    anchored: bool = False
    """True: expanding train windows from the start of the archive."""
    gap_bars: int = 0
    """Purge/embargo gap between train and test; raised to at least K + max(n_step,
    return_horizon) (0 = exactly that minimum)."""
    session_gap_s: float = 600.0
    """A pause between bars longer than this starts a new session: no episode, window or label
    crosses it, and positions are closed at the last decision bar before it."""
    # --- environment --------------------------------------------------------------------------
    n_envs: int = 64
    """Training windows stepped in lockstep."""
    reward_scale: float = 0.5
    """Normalised reward units per tick of P&L (also scales the unrealised-P&L feature)."""
    eval_envs: int = 256
    """Contiguous chunks evaluated in lockstep on a test block (each starts flat)."""
    eval_workers: int = 0
    """Worker processes for the gate's as-traded evaluations (each fold's, and the incumbent's),
    which then run beside the training: 0 = one per evaluation up to the host's cores less two
    (none below four cores), 1 = in the trainer's process, one after another."""
    # --- learner ------------------------------------------------------------------------------
    epochs: int = 8
    """Epochs per fold; the Q-drift gate runs after each."""
    steps_per_epoch: int = 500
    """Lockstep environment steps per epoch (each adds ``n_envs`` transitions)."""
    updates_per_step: float = 1.0
    """Learner updates per lockstep environment step (fractions allowed, e.g. 0.25)."""
    batch_size: int = 128
    replay_capacity: int = 200_000
    learning_starts: int = 2_000
    """Transitions in replay before the first update."""
    gamma: float = 0.9
    n_step: int = 3
    lr: float = 2.5e-4
    adam_eps: float = 3.125e-4
    grad_clip: float = 10.0
    target_update: Literal["polyak", "hard", "none"] = "polyak"
    """``none`` bootstraps from the online network (only for experiments and the halt test)."""
    polyak_rho: float = 0.005
    hard_sync_every: int = 1000
    """Updates between hard target copies (``target_update = "hard"``)."""
    return_loss_weight: float = 1.0
    munchausen: bool = False
    """Munchausen C51 targets (ALGORITHMS 2) instead of double DQN."""
    munchausen_alpha: float = 0.9
    munchausen_tau: float = 0.03
    """Entropy temperature, in normalised reward units."""
    munchausen_clip: float = -1.0
    """Lower clip of ``tau log pi(a|s)`` in the bonus."""
    probe_size: int = 256
    """Fixed probe windows (from the training data, flat agent state) for Q-mean and kill stats."""
    cpu_threads: int = 1
    """BLAS threads while training on the CPU (0 = the library's default). The trainer's matrices
    are small: one thread is several times faster than contended multi-threaded BLAS."""
    sharpe_bucket_s: float = 0.0
    """P&L bucket for the annualised Sharpe (seconds): 0 = chosen from the sample's span, daily
    over 20 days or more, else intraday buckets giving 20+ returns (:mod:`agent.backtest.metrics`)."""
    # --- gates --------------------------------------------------------------------------------
    drift_ratio: float = 2.0
    """Q-drift halt, from a fold's second epoch: |q| > drift_ratio x |q_prev| ..."""
    drift_abs_frac: float = 0.5
    """... and |q| > drift_abs_frac x max(|v_min|, |v_max|) of the model's C51 support, or anything
    non-finite. Trained tiny models (support +/-5) settle at |q| up to 1.9 (0.37 of the half-width)
    from costs alone; a diverging one runs to the support's edge."""
    max_nonfinite_rate: float = 0.01
    """Halt: share of an epoch's updates skipped for a non-finite gradient above this."""
    min_q_spread_frac: float = 0.01
    """Kill: mean over probe windows of max_a Q - min_a Q must reach this fraction of the support
    width v_max - v_min."""
    min_action_entropy: float = 0.05
    """Kill: entropy (nats) of the greedy action mix on the probe windows must reach this."""
    min_edge_t: float = 3.0
    """Kill: Welch t of the greedy policy's gross P&L per position-bar over the random policy's on
    each fold's test block must reach this (no edge: about N(0, 1))."""
    early_epochs: int = 2
    min_early_q_move_frac: float = 0.001
    """Kill: within a fold's first ``early_epochs`` epochs the probe Q-mean must move this fraction
    of the support width from its value before the fold's training."""
    min_psr: float = 0.95
    """Promotion: probabilistic Sharpe ratio of the as-traded OOS bucket returns against flat
    (deflated for the number of trials) must reach this."""
    incumbent_margin: float = 0.05
    """Promotion: the per-bucket Sharpe ratio (not annualised) of candidate minus incumbent bucket
    P&L on the same folds must exceed this ..."""
    min_incumbent_psr: float = 0.9
    """... with this probability (probabilistic Sharpe of the difference series)."""
    max_drawdown: float = 10_000.0
    """Promotion: OOS max drawdown (currency, the positions as trained) must stay within this."""

    def __post_init__(self) -> None:
        ints = {
            "folds": self.folds,
            "n_envs": self.n_envs,
            "eval_envs": self.eval_envs,
            "epochs": self.epochs,
            "steps_per_epoch": self.steps_per_epoch,
            "batch_size": self.batch_size,
            "replay_capacity": self.replay_capacity,
            "n_step": self.n_step,
            "hard_sync_every": self.hard_sync_every,
            "probe_size": self.probe_size,
            "early_epochs": self.early_epochs,
        }
        for name, value in ints.items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        positive = {
            "train_test_ratio": self.train_test_ratio,
            "session_gap_s": self.session_gap_s,
            "reward_scale": self.reward_scale,
            "updates_per_step": self.updates_per_step,
            "lr": self.lr,
            "adam_eps": self.adam_eps,
            "grad_clip": self.grad_clip,
            "drift_ratio": self.drift_ratio,
            "drift_abs_frac": self.drift_abs_frac,
            "max_drawdown": self.max_drawdown,
        }
        for name, fvalue in positive.items():
            if not (math.isfinite(fvalue) and fvalue > 0):
                raise ValueError(f"{name} must be a positive number, got {fvalue}")
        if self.gap_bars < 0 or self.learning_starts < 0 or self.cpu_threads < 0 or self.eval_workers < 0:
            raise ValueError("gap_bars, learning_starts, cpu_threads and eval_workers must be >= 0")
        if not 0.0 < self.gamma < 1.0:
            raise ValueError(f"gamma must be in (0, 1), got {self.gamma}")
        if not 0.0 < self.polyak_rho <= 1.0:
            raise ValueError(f"polyak_rho must be in (0, 1], got {self.polyak_rho}")
        if self.batch_size > self.replay_capacity:
            raise ValueError("batch_size must not exceed replay_capacity")
        if not (self.munchausen_tau > 0 and self.munchausen_alpha >= 0 and self.munchausen_clip < 0):
            raise ValueError("munchausen_tau must be > 0, munchausen_alpha >= 0 and munchausen_clip < 0")
        if self.sharpe_bucket_s < 0 or self.return_loss_weight < 0:
            raise ValueError("sharpe_bucket_s and return_loss_weight must be >= 0")
        for name, prob in (
            ("max_nonfinite_rate", self.max_nonfinite_rate),
            ("min_psr", self.min_psr),
            ("min_incumbent_psr", self.min_incumbent_psr),
        ):
            if not 0.0 <= prob <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {prob}")
