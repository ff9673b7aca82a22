"""The trainer's gates (DESIGN section 9): halts, kill criteria, promotion.

Each gate returns a :class:`GateEvent` holding the numbers it decided on; the run stores every
event through the model registry (``storage.ModelRegistry.record_gate_event``), so a rejected
candidate can always be explained. Units: Q values are normalised reward units (ticks x
``reward_scale``, the units of the C51 support ``[v_min, v_max]``), entropies nats, P&L and
drawdown account currency. Sharpe ratios here are per bucket, not annualised: the statistics
of Bailey & Lopez de Prado are stated for the returns actually observed.

Halts (checked after every epoch, :mod:`agent.train.trainer`):

* :func:`q_drift`: the probe Q-mean is not finite, or it more than ``drift_ratio``-folds from the
  previous epoch of the same fold and exceeds :func:`drift_floor`, a fraction of the support's
  half-width. A fold's first epoch is not compared with anything (before training, and after
  the previous fold on other data, Q lies elsewhere): only its finiteness is checked.
* :func:`nonfinite_gradients`: the share of an epoch's updates skipped for a non-finite
  gradient exceeds ``max_nonfinite_rate``.

Kill criteria (:func:`kill_criteria`, per fold): did it learn anything?

Promotion (:func:`promotion`): the as-traded out-of-sample P&L, bucketed, must be significant
against flat by the probabilistic Sharpe ratio (deflated for the number of trials), beat the
always-long and random baselines, beat the incumbent on the same buckets by a paired test plus a
margin, and stay within the drawdown limit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import msgspec
import numpy as np

from agent.backtest.metrics import choose_bucket_s
from agent.model import ModelConfig
from agent.train.config import TrainConfig
from agent.train.env import Rollout

__all__ = [
    "GateEvent",
    "PnlSeries",
    "SharpeStats",
    "action_entropy",
    "drift_floor",
    "edge_t",
    "expected_max_sharpe",
    "kill_criteria",
    "nonfinite_gradients",
    "probabilistic_sharpe",
    "promotion",
    "q_drift",
    "sharpe_stats",
]

_NORMAL = NormalDist()
_EULER_GAMMA = 0.5772156649015329


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


# --- halts ---------------------------------------------------------------------------------------


def drift_floor(model: ModelConfig, config: TrainConfig) -> float:
    """The Q-drift halt's absolute floor (normalised units): ``drift_abs_frac`` of the support's
    half-width ``max(|v_min|, |v_max|)``."""
    return config.drift_abs_frac * max(abs(model.v_min), abs(model.v_max))


def q_drift(
    q: float, q_prev: float | None, floor: float, config: TrainConfig, *, fold_index: int, epoch: int
) -> GateEvent:
    """Q-drift halt: fails when ``q`` is not finite, or ``|q| > drift_ratio * |q_prev|`` and
    ``|q| > floor`` (``q``: mean expected Q on the fold's fixed probe windows after this epoch;
    ``q_prev``: after the fold's previous epoch, ``None`` for its first epoch, which is checked
    for finiteness only; ``floor``: :func:`drift_floor`)."""
    values = {"q": q, "q_prev": q_prev, "drift_ratio": config.drift_ratio, "drift_abs": floor}
    if not _finite(q) or (q_prev is not None and not _finite(q_prev)):
        grew, message = True, "probe Q is NaN or infinite"
    elif q_prev is None:
        grew, message = False, "probe Q finite (first epoch of the fold: no comparison)"
    else:
        grew = abs(q) > config.drift_ratio * abs(q_prev) and abs(q) > floor
        message = (
            f"|q| = {abs(q):.4g} > {config.drift_ratio:g} x |q_prev| = "
            f"{config.drift_ratio * abs(q_prev):.4g} and > {floor:.4g}: Q is diverging"
            if grew
            else "probe Q stable"
        )
    return GateEvent(
        kind="q_drift",
        passed=not grew,
        values=_json_safe(values),
        message=message,
        fold_index=fold_index,
        epoch=epoch,
    )


def nonfinite_gradients(
    skipped: int, attempted: int, config: TrainConfig, *, fold_index: int, epoch: int
) -> GateEvent:
    """Halt when more than ``max_nonfinite_rate`` of an epoch's ``attempted`` updates were
    skipped because their gradient was not finite (``skipped`` of them)."""
    rate = skipped / attempted if attempted else 0.0
    bad = rate > config.max_nonfinite_rate
    return GateEvent(
        kind="nonfinite_gradients",
        passed=not bad,
        values={
            "skipped": skipped,
            "attempted": attempted,
            "rate": rate,
            "max_rate": config.max_nonfinite_rate,
        },
        message=(
            f"{skipped} of {attempted} updates ({rate:.1%}) had a non-finite gradient "
            f"{'>' if bad else '<='} {config.max_nonfinite_rate:.1%}"
        ),
        fold_index=fold_index,
        epoch=epoch,
    )


# --- kill criteria -------------------------------------------------------------------------------


def action_entropy(mix: list[float]) -> float:
    """Entropy (nats) of an action mix given as fractions."""
    return -sum(p * math.log(p) for p in mix if p > 0)


def edge_t(candidate: Rollout, random: Rollout) -> float:
    """Welch t statistic of the gross edge per position-bar: the candidate's P&L before costs
    per contract held over each bar it held a position, against the random policy's on the same
    test block (NaN when either held a position on fewer than 2 bars).

    Costs are left out on purpose: a policy that seldom trades beats random on net P&L by its
    saved costs alone, whatever it learned. Over a martingale mid every bar's gross P&L has mean
    zero whatever the position, so the statistic is about N(0, 1) for a policy with no edge."""

    def per_bar(ro: Rollout) -> np.ndarray[Any, np.dtype[np.float64]]:
        held = np.asarray(ro.held, dtype=np.float64)
        on = held > 0
        gross = np.asarray(ro.pnl, dtype=np.float64) + np.asarray(ro.cost, dtype=np.float64)
        return np.asarray(gross[on] / held[on], dtype=np.float64)

    x, y = per_bar(candidate), per_bar(random)
    if x.size < 2 or y.size < 2:
        return math.nan
    se = math.sqrt(float(x.var(ddof=1)) / x.size + float(y.var(ddof=1)) / y.size)
    diff = float(x.mean() - y.mean())
    return diff / se if se > 0 else math.nan


def kill_criteria(
    *,
    fold_index: int,
    q_spread: float,
    entropy: float,
    early_q_move: float,
    candidate: Rollout,
    random: Rollout,
    model: ModelConfig,
    config: TrainConfig,
) -> list[GateEvent]:
    """Did it learn anything on fold ``fold_index``? Four checks; failing any rejects the candidate.

    * ``kill_q_spread``: mean over the probe windows of ``max_a Q - min_a Q`` after the fold's
      training must reach ``min_q_spread_frac`` of the support width ``v_max - v_min``;
    * ``kill_action_entropy``: entropy (nats) of the greedy action mix on the probe windows must
      reach ``min_action_entropy`` (not collapsed onto one action);
    * ``kill_return_vs_random``: :func:`edge_t` of the greedy policy against the random baseline
      on the fold's test block must reach ``min_edge_t``;
    * ``kill_early_q_move``: the largest move of the probe Q-mean from its value before the
      fold's training within its first ``early_epochs`` epochs must reach
      ``min_early_q_move_frac`` of the support width.

    Measured with ``config/tiny.toml`` (support width 10) on 4-day synthetic ES archives of
    generator seeds 11-13, 2 folds per run (the thresholds in brackets). Trained on ``signal =
    1``: Q spread 0.22-0.92 [0.1], entropy 0.11-1.04 [0.05], early Q move 0.23-1.50 [0.01], edge
    t 15-22 [3] (-3.1 and 0.7 for the seed-13 run, which learned to stay flat). Untrained
    (learning rate 1e-9): early Q move <= 1e-6, Q spread 0.75-0.85, entropy 1.02-1.07, edge t
    -0.2 to 7.6 (a random projection of strongly predictive features has some edge). Only the
    early Q move tells an untrained network from a trained one, by five orders of magnitude on
    either side of its threshold; the others overlap (an untrained network's random C51 heads
    already differ per action by ~8% of the support and pick near-uniformly; a trained one's
    spread and entropy can be as high), so a tighter threshold on them would reject trained
    models before it rejected untrained ones, and none is tightened. Trained on ``signal = 0``
    with every cost at zero (seeds 31-41): edge t -1.9 to 1.2 and Q spread 0.015-0.098, below
    their thresholds in every fold.
    """
    width = model.v_max - model.v_min
    edge = edge_t(candidate, random)
    checks = [
        ("kill_q_spread", q_spread, config.min_q_spread_frac * width, "Q spread across actions"),
        ("kill_action_entropy", entropy, config.min_action_entropy, "greedy action entropy"),
        ("kill_return_vs_random", edge, config.min_edge_t, "gross edge per position-bar over random (t)"),
        ("kill_early_q_move", early_q_move, config.min_early_q_move_frac * width, "early Q movement"),
    ]
    events = []
    for kind, value, threshold, what in checks:
        ok = _finite(value) and value >= threshold
        values: dict[str, Any] = {"value": value, "threshold": threshold}
        if kind in ("kill_q_spread", "kill_early_q_move"):
            values["support_width"] = width
        events.append(
            GateEvent(
                kind=kind,
                passed=ok,
                values=_json_safe(values),
                message=f"fold {fold_index}: {what} {value:.4g} {'>=' if ok else '<'} {threshold:.4g}",
                fold_index=fold_index,
            )
        )
    return events


# --- promotion -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PnlSeries:
    """Per-bar net P&L after costs (currency) of one policy and the bars' close times (ns UTC)."""

    pnl: np.ndarray[Any, Any]
    ts_ns: np.ndarray[Any, Any]

    def __post_init__(self) -> None:
        if np.ndim(self.pnl) != 1 or np.shape(self.pnl) != np.shape(self.ts_ns):
            raise ValueError(
                "pnl and ts_ns must be 1-D of one length, "
                f"got {np.shape(self.pnl)} and {np.shape(self.ts_ns)}"
            )


class SharpeStats(msgspec.Struct, frozen=True, kw_only=True):
    """Moments of a return series behind the probabilistic Sharpe ratio (per period)."""

    n: int
    mean: float
    std: float
    """Sample standard deviation (ddof = 1)."""
    sharpe: float
    """``mean / std``, not annualised (NaN when undefined)."""
    skew: float
    kurtosis: float
    """Non-excess (3 for a normal distribution)."""


def sharpe_stats(returns: Any) -> SharpeStats:
    """Sharpe ratio, skewness and kurtosis of ``returns`` (skewness and kurtosis from the
    population central moments, as in Bailey & Lopez de Prado). Undefined values are NaN:
    fewer than 2 returns, or no variance."""
    r = np.asarray(returns, dtype=np.float64)
    n = int(r.size)
    if n < 2:
        return SharpeStats(n=n, mean=float(r.mean()) if n else math.nan, std=math.nan, sharpe=math.nan,
                           skew=math.nan, kurtosis=math.nan)  # fmt: skip
    mean = float(r.mean())
    std = float(r.std(ddof=1))
    m2 = float(np.mean((r - mean) ** 2))
    if not (std > 1e-12 * max(1.0, abs(mean))):
        return SharpeStats(n=n, mean=mean, std=std, sharpe=math.nan, skew=math.nan, kurtosis=math.nan)
    skew = float(np.mean((r - mean) ** 3)) / m2**1.5
    kurt = float(np.mean((r - mean) ** 4)) / m2**2
    return SharpeStats(n=n, mean=mean, std=std, sharpe=mean / std, skew=skew, kurtosis=kurt)


def probabilistic_sharpe(returns: Any, benchmark: float = 0.0) -> float:
    """Probability that the true Sharpe ratio of ``returns`` exceeds ``benchmark`` (both per
    period): ``PSR = Phi((SR - SR*) sqrt(n - 1) / sqrt(1 - skew SR + (kurt - 1) / 4 SR^2))``
    (Bailey & Lopez de Prado 2012). NaN when the Sharpe ratio is undefined (see
    :func:`sharpe_stats`)."""
    return _psr(sharpe_stats(returns), benchmark)


def _psr(s: SharpeStats, benchmark: float) -> float:
    if not _finite(s.sharpe):
        return math.nan
    # kurt >= 1 + skew^2 makes the variance term a square, >= 0; guard its exact zero.
    var = max(1.0 - s.skew * s.sharpe + (s.kurtosis - 1.0) / 4.0 * s.sharpe**2, 1e-12)
    return _NORMAL.cdf((s.sharpe - benchmark) * math.sqrt(s.n - 1) / math.sqrt(var))


def expected_max_sharpe(n_trials: int, variance: float) -> float:
    """Expected maximum of ``n_trials`` independent Sharpe estimates of zero-edge strategies
    whose estimates have variance ``variance``: the benchmark ``SR*`` of the deflated Sharpe
    ratio (Bailey & Lopez de Prado 2014),
    ``sqrt(V) ((1 - g) Phi^-1(1 - 1/N) + g Phi^-1(1 - 1/(N e)))``, ``g`` the Euler-Mascheroni
    constant; 0 for a single trial."""
    if n_trials < 1:
        raise ValueError(f"n_trials must be >= 1, got {n_trials}")
    if n_trials == 1:
        return 0.0
    g = _EULER_GAMMA
    z = (1.0 - g) * _NORMAL.inv_cdf(1.0 - 1.0 / n_trials) + g * _NORMAL.inv_cdf(
        1.0 - 1.0 / (n_trials * math.e)
    )
    return math.sqrt(variance) * z


def _aligned_buckets(
    series: Mapping[str, PnlSeries], bucket_s: float
) -> dict[str, np.ndarray[Any, np.dtype[np.float64]]]:
    """Every series summed into the same clock buckets (the union of their non-empty buckets;
    a series without a bar in a bucket made nothing there)."""
    bucket_ns = max(1, round(bucket_s * 1e9))
    keys = {name: np.asarray(s.ts_ns, dtype=np.int64) // bucket_ns for name, s in series.items()}
    union = np.unique(np.concatenate(list(keys.values()))) if keys else np.zeros(0, np.int64)
    return {
        name: np.bincount(
            np.searchsorted(union, k),
            weights=np.asarray(series[name].pnl, dtype=np.float64),
            minlength=union.size,
        ).astype(np.float64)
        for name, k in keys.items()
    }


def promotion(
    *,
    halted: bool,
    kills_passed: bool,
    candidate: PnlSeries,
    candidate_gross: PnlSeries | None = None,
    baselines: Mapping[str, PnlSeries],
    incumbent: PnlSeries | None,
    max_drawdown: float,
    n_trials: int,
    config: TrainConfig,
) -> GateEvent:
    """Promote only when every test below passes; the message names each one that failed.

    All series (the candidate's as-traded out-of-sample P&L, each baseline's and the
    incumbent's on the same test blocks) are summed into one set of clock buckets of
    ``sharpe_bucket_s`` seconds (0: chosen from the candidate's bar times,
    :func:`agent.backtest.metrics.choose_bucket_s`). Statistics are per bucket.

    * no halt (a halted run fails on that alone: there is no trained model to score) and every
      kill criterion passed;
    * significance against flat: :func:`probabilistic_sharpe` of the candidate's buckets against
      ``SR* = expected_max_sharpe(n_trials, 1 / (n - 1))`` (``n_trials``: the configurations
      and retrains whose best would have been promoted; the variance of a zero-edge Sharpe
      estimate on ``n`` returns is about ``1 / (n - 1)``) must reach ``min_psr``;
    * each baseline (``long`` and ``random``; ``flat`` is the significance test): the
      candidate's mean bucket P&L must exceed the baseline's. The difference of means is the
      mean of the paired differences; no significance is asked for here, because significance
      against flat is already required and a baseline is itself noisy: a paired test would
      reject a real edge whenever the market drifted strongly in the test period;
    * the incumbent (when there is one): paired test on the bucket differences
      ``d = candidate - incumbent``: ``PSR(d, benchmark = incumbent_margin)`` must reach
      ``min_incumbent_psr`` (the candidate's edge over the incumbent has a per-bucket Sharpe
      above the margin with that confidence; an identical incumbent gives no variance and fails);
    * max drawdown of the candidate's cumulative P&L within ``max_drawdown``.

    ``candidate_gross`` (the candidate's P&L before costs: fills at the decision bar's mid, no
    fees) is a diagnostic, never gated: ``gross_psr`` is the same deflated PSR on it, so a
    rejection can be told apart as "no edge" (both low) or "an edge the costs eat" (gross high).
    """
    bucket_s = config.sharpe_bucket_s if config.sharpe_bucket_s > 0 else choose_bucket_s(candidate.ts_ns)
    named: dict[str, PnlSeries] = {
        "candidate": candidate,
        **{f"baseline_{k}": v for k, v in baselines.items()},
    }
    if incumbent is not None:
        named["incumbent"] = incumbent
    buckets = _aligned_buckets(named, bucket_s)
    cand = buckets["candidate"]
    stats = sharpe_stats(cand)
    benchmark = expected_max_sharpe(n_trials, 1.0 / (stats.n - 1)) if stats.n >= 2 else math.nan
    psr = _psr(stats, benchmark) if stats.n >= 2 else math.nan
    values: dict[str, Any] = {
        "halted": halted,
        "kills_passed": kills_passed,
        "bucket_s": bucket_s,
        "n_buckets": stats.n,
        "mean": stats.mean,
        "std": stats.std,
        "sharpe": stats.sharpe,
        "skew": stats.skew,
        "kurtosis": stats.kurtosis,
        "n_trials": n_trials,
        "sharpe_benchmark": benchmark,
        "psr": psr,
        "min_psr": config.min_psr,
        "max_drawdown": max_drawdown,
        "max_drawdown_limit": config.max_drawdown,
    }
    if candidate_gross is not None:
        gross = sharpe_stats(_aligned_buckets({"gross": candidate_gross}, bucket_s)["gross"])
        values["gross_sharpe"] = gross.sharpe
        values["gross_psr"] = _psr(gross, benchmark) if gross.n >= 2 else math.nan
    if halted:  # no trained model to score: the halt is the whole reason
        return _promotion_event(values, ["training halted"])
    reasons = [] if kills_passed else ["a kill criterion failed"]
    if not (_finite(psr) and psr >= config.min_psr):
        against = (
            "flat" if n_trials == 1 else f"the best of {n_trials} zero-edge trials (SR* {benchmark:.3f})"
        )
        reasons.append(
            f"probabilistic Sharpe {psr:.3f} < {config.min_psr:g}: not significant against {against}"
        )
    for name in sorted(baselines):
        diff = buckets[f"baseline_{name}"]
        gap = float(np.mean(cand - diff)) if cand.size else math.nan
        values[f"mean_over_{name}"] = gap
        if not (_finite(gap) and gap > 0):
            reasons.append(f"mean bucket P&L {gap:.4g} over the {name} baseline: not above it")
    values["incumbent"] = incumbent is not None
    if incumbent is not None:
        d = sharpe_stats(cand - buckets["incumbent"])
        inc_psr = _psr(d, config.incumbent_margin)
        values |= {
            "incumbent_mean_diff": d.mean,
            "incumbent_sharpe_diff": d.sharpe,
            "incumbent_margin": config.incumbent_margin,
            "incumbent_psr": inc_psr,
            "min_incumbent_psr": config.min_incumbent_psr,
        }
        if not (_finite(inc_psr) and inc_psr >= config.min_incumbent_psr):
            reasons.append(
                f"paired probabilistic Sharpe over the incumbent {inc_psr:.3f} < "
                f"{config.min_incumbent_psr:g} (margin {config.incumbent_margin:g}): "
                "not better than the incumbent"
            )
    if not (_finite(max_drawdown) and max_drawdown <= config.max_drawdown):
        reasons.append(f"max drawdown {max_drawdown:.2f} above {config.max_drawdown:.2f}")
    return _promotion_event(values, reasons)


def _promotion_event(values: dict[str, Any], reasons: list[str]) -> GateEvent:
    """The promotion event: ``values["reasons"]`` lists each failed test (empty: promoted)."""
    return GateEvent(
        kind="promotion",
        passed=not reasons,
        values=_json_safe({**values, "reasons": reasons}),
        message="; ".join(reasons) if reasons else "promotion criteria met",
    )


def _json_safe(values: dict[str, Any]) -> dict[str, Any]:
    """Non-finite floats become strings ("nan", "inf"): stored JSON must stay valid."""
    return {k: (repr(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in values.items()}
