"""The trainer's gates (DESIGN section 9): Q-drift halt, kill criteria, promotion.

Each gate returns a :class:`GateEvent` holding the numbers it decided on; the run stores every
event through the model registry (``storage.ModelRegistry.record_gate_event``), so a rejected
candidate can always be explained. Units: Q values are normalised reward units (ticks x
``reward_scale``), entropies nats, P&L and drawdown account currency, Sharpe annualised.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from agent.train.config import TrainConfig

__all__ = ["GateEvent", "action_entropy", "kill_criteria", "promotion", "q_drift"]


class GateEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One gate evaluation."""

    kind: str
    passed: bool
    values: dict[str, Any]
    message: str
    fold_index: int | None = None
    epoch: int | None = None


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


def q_drift(q: float, q_prev: float, config: TrainConfig, *, fold_index: int, epoch: int) -> GateEvent:
    """Q-drift halt: fails when ``q`` is not finite, or ``|q| > drift_ratio * |q_prev|`` and
    ``|q| > drift_abs`` (``q``: mean expected Q on the fixed probe windows after this epoch,
    ``q_prev``: after the previous epoch, or before training for the first)."""
    values = {"q": q, "q_prev": q_prev, "drift_ratio": config.drift_ratio, "drift_abs": config.drift_abs}
    if not _finite(q, q_prev):
        return GateEvent(
            kind="q_drift",
            passed=False,
            values=_json_safe(values),
            message="probe Q is NaN or infinite",
            fold_index=fold_index,
            epoch=epoch,
        )
    grew = abs(q) > config.drift_ratio * abs(q_prev) and abs(q) > config.drift_abs
    message = (
        f"|q| = {abs(q):.4g} > {config.drift_ratio:g} x |q_prev| = {config.drift_ratio * abs(q_prev):.4g} "
        f"and > {config.drift_abs:g}: Q is diverging"
        if grew
        else "probe Q stable"
    )
    return GateEvent(
        kind="q_drift", passed=not grew, values=values, message=message, fold_index=fold_index, epoch=epoch
    )


def action_entropy(mix: list[float]) -> float:
    """Entropy (nats) of an action mix given as fractions."""
    return -sum(p * math.log(p) for p in mix if p > 0)


def kill_criteria(
    *,
    q_spread: float,
    entropy: float,
    pnl: float,
    random_pnl: float,
    early_q_move: float,
    config: TrainConfig,
) -> list[GateEvent]:
    """Did it learn anything? Four checks, each against its threshold in ``config``:

    * ``kill_q_spread``: mean over probe windows of ``max_a Q - min_a Q`` (the model tells actions apart);
    * ``kill_action_entropy``: entropy of the greedy action mix on the probe windows (not collapsed);
    * ``kill_return_vs_random``: out-of-sample P&L minus the random baseline's on the same bars;
    * ``kill_early_q_move``: largest move of the probe Q-mean in the first ``early_epochs`` epochs.
    """
    checks = [
        ("kill_q_spread", q_spread, config.min_q_spread, "Q spread across actions"),
        ("kill_action_entropy", entropy, config.min_action_entropy, "greedy action entropy"),
        ("kill_return_vs_random", pnl - random_pnl, config.min_return_vs_random, "OOS P&L over random"),
        ("kill_early_q_move", early_q_move, config.min_early_q_move, "early Q movement"),
    ]
    events = []
    for kind, value, threshold, what in checks:
        ok = _finite(value) and value > threshold
        values = {"value": value, "threshold": threshold}
        if kind == "kill_return_vs_random":
            values |= {"pnl": pnl, "random_pnl": random_pnl}
        events.append(
            GateEvent(
                kind=kind,
                passed=ok,
                values=_json_safe(values),
                message=f"{what} {value:.4g} {'>' if ok else '<='} {threshold:.4g}",
            )
        )
    return events


def promotion(
    *,
    halted: bool,
    kills_passed: bool,
    sharpe: float,
    incumbent_sharpe: float | None,
    max_drawdown: float,
    config: TrainConfig,
) -> GateEvent:
    """Promote only with no halt, every kill criterion passed, out-of-sample Sharpe after costs
    above 0 and above the incumbent's on the same folds plus ``promotion_margin`` (no incumbent:
    above ``promotion_margin``), and max drawdown within ``max_drawdown``."""
    bar = config.promotion_margin + (incumbent_sharpe if incumbent_sharpe is not None else 0.0)
    reasons = []
    if halted:
        reasons.append("training halted")
    if not kills_passed:
        reasons.append("a kill criterion failed")
    if not (_finite(sharpe) and sharpe > 0 and sharpe > bar):
        reasons.append(f"OOS Sharpe {sharpe:.3f} not above {max(bar, 0.0):.3f}")
    if not (_finite(max_drawdown) and max_drawdown <= config.max_drawdown):
        reasons.append(f"max drawdown {max_drawdown:.2f} above {config.max_drawdown:.2f}")
    values = {
        "sharpe": sharpe,
        "incumbent_sharpe": incumbent_sharpe,
        "margin": config.promotion_margin,
        "max_drawdown": max_drawdown,
        "max_drawdown_limit": config.max_drawdown,
        "halted": halted,
        "kills_passed": kills_passed,
    }
    return GateEvent(
        kind="promotion",
        passed=not reasons,
        values=_json_safe(values),
        message="; ".join(reasons) if reasons else "promotion criteria met",
    )


def _json_safe(values: dict[str, Any]) -> dict[str, Any]:
    """Non-finite floats become strings ("nan", "inf"): stored JSON must stay valid."""
    return {k: (repr(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in values.items()}
