"""The training report: one self-contained HTML file with inline SVG plots (no script, no network,
no plotting library) of a :class:`~agent.train.summary.RunResult`, built from the shared blocks
of :mod:`agent.reports`.

Sections: the decision (promoted, halted, why), per-fold out-of-sample figures of the policy as
the daemon trades it (what the gate scored) against the baselines and the incumbent, with the
greedy one-contract diagnostic beside them, the concatenated out-of-sample equity curves, learning
curves, the
probe Q-mean per epoch with the Q-drift threshold drawn, the action mix (exploration and the
greedy test decisions) and every gate event with its numbers.
"""

from __future__ import annotations

import datetime as dt
import html
from pathlib import Path

from agent.reports.page import fmt, page, table, write_atomic
from agent.reports.svg import COLOURS, Series, line_chart, stacked_bars
from agent.train.summary import RunResult, TrainSummary

__all__ = ["render_report", "write_report"]


def _ns(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, dt.UTC).strftime("%Y-%m-%d %H:%M")


def _decision(s: TrainSummary) -> str:
    state = (
        "PROMOTED"
        if s.promoted
        else ("HALTED" if s.halted else (s.candidate_status or "no candidate").upper())
    )
    reasons = s.gate.reasons if s.gate is not None else []
    why = html.escape(s.halt_reason or ("; ".join(reasons) if reasons else "promotion criteria met"))
    return (
        f'<p class="state">{state}</p><p>{why}</p>'
        f"<p>run {fmt(s.run_id)} &middot; instruments {html.escape(s.instrument_set)} &middot; "
        f"{html.escape(s.device)} &middot; seed {s.seed} &middot; {s.wall_s:,.1f} s</p>"
        f"<p>candidate {fmt(s.candidate_sha256)} &middot; incumbent {fmt(s.incumbent_sha256)}"
        f"{' (' + html.escape(s.incumbent_note) + ')' if s.incumbent_note else ''}</p>"
    )


def render_report(result: RunResult) -> str:
    """The report of a run as an HTML document (a string)."""
    s = result.summary
    sections = ["<h1>tradeagent training report</h1>", _decision(s)]
    fold_rows = [
        [
            f.index,
            f"{_ns(f.test_ns[0])} .. {_ns(f.test_ns[1])}",
            f.as_traded.pnl,
            f.as_traded.sharpe,
            f.as_traded.psr,
            *(f.baselines[b].pnl for b in ("flat", "random", "long")),
            f.incumbent.pnl if f.incumbent is not None else None,
            f.as_traded.costs,
            f.as_traded.max_drawdown,
            f.as_traded.turnover,
            f.greedy_unit.pnl,
        ]
        for f in s.folds
    ]
    if s.oos is not None:
        fold_rows.append(
            [
                "all",
                "concatenated",
                s.oos.pnl,
                s.oos.sharpe,
                None,
                *(s.oos_baselines[b].pnl for b in ("flat", "random", "long")),
                None,
                s.oos.costs,
                s.oos.max_drawdown,
                s.oos.turnover,
                s.oos_greedy_unit.pnl if s.oos_greedy_unit is not None else None,
            ]
        )
    sections.append(
        "<h2>Out-of-sample, as traded (what the gate scored: the daemon's selection, sizing, risk "
        "limits, fills at arrival + latency and fees; currency after costs)</h2>"
    )
    sections.append(
        table(
            [
                "fold",
                "test block (UTC)",
                "P&L",
                "Sharpe",
                "PSR",
                "flat P&L",
                "random P&L",
                "long P&L",
                "incumbent P&L",
                "costs",
                "max DD",
                "contracts/day",
                "greedy 1-lot P&L (diagnostic)",
            ],
            fold_rows,
        )
    )
    curves: list[Series] = []
    for name in ("candidate", "incumbent", "flat", "random", "long", "greedy_unit"):
        ts, eq = result.curves.equity(name)
        if ts.size:
            curves.append((name, ts.astype(float), eq, COLOURS[name], name in ("flat", "incumbent")))
    sections.append(
        line_chart(
            "Out-of-sample equity (currency, concatenated test blocks)",
            curves,
            x_label="time (UTC)",
            y_label="cumulative P&L",
            x_dates=True,
        )
    )
    x = list(range(len(s.epochs)))
    sections.append("<h2>Learning curves</h2>")
    sections.append(
        line_chart(
            "C51 and return-head loss per epoch",
            [
                ("C51 loss", x, [e.c51_loss for e in s.epochs], COLOURS["candidate"], False),
                ("return loss", x, [e.return_loss for e in s.epochs], COLOURS["long"], True),
            ],
            x_label="epoch (all folds)",
            y_label="cross-entropy",
        )
    )
    sections.append(
        line_chart(
            "Mean exploration reward per step",
            [
                ("reward", x, [e.reward_mean for e in s.epochs], COLOURS["candidate"], False),
            ],
            x_label="epoch (all folds)",
            y_label="normalised units",
        )
    )
    q = [e.q_mean for e in s.epochs]
    envelope = [s.drift_ratio * abs(v) for v in [float("nan"), *q[:-1]]]
    sections.append(
        line_chart(
            "Probe Q-mean per epoch and the Q-drift threshold",
            [
                ("Q-mean", x, q, COLOURS["candidate"], False),
                ("+drift_abs", x, [s.drift_abs] * len(x), COLOURS["threshold"], True),
                ("-drift_abs", x, [-s.drift_abs] * len(x), COLOURS["threshold"], True),
                ("ratio x |q_prev|", x, envelope, COLOURS["random"], True),
            ],
            x_label="epoch (all folds)",
            y_label="normalised units",
        )
    )
    sections.append("<h2>Action mix</h2>")
    sections.append(
        stacked_bars(
            "Exploration (Thompson) per epoch",
            [f"fold {e.fold} epoch {e.epoch}" for e in s.epochs],
            [e.explore_mix for e in s.epochs],
        )
    )
    sections.append(
        stacked_bars(
            "Greedy decisions on each test block",
            [f"fold {f.index}" for f in s.folds],
            [f.greedy_mix for f in s.folds],
        )
    )
    sections.append("<h2>Gate events</h2>")
    sections.append(
        table(
            ["gate", "fold", "epoch", "passed", "message", "numbers"],
            [
                [
                    g.kind,
                    g.fold_index,
                    g.epoch,
                    "yes" if g.passed else "NO",
                    g.message,
                    ", ".join(f"{k}={fmt(v, 4) if isinstance(v, float) else v}" for k, v in g.values.items()),
                ]
                for g in s.gates
            ],
        )
    )
    if s.floors:
        sections.append("<h2>Learned floors (vol_ref, squared log-return per bar)</h2>")
        sections.append(
            table(
                ["instrument", "previous", "target", "new"],
                [[k, v["previous"], v["target"], v["value"]] for k, v in s.floors.items()],
            )
        )
    return page("tradeagent training report", sections)


def write_report(result: RunResult, path: str | Path) -> Path:
    """Write the report atomically (temporary file, then rename); returns the path."""
    return write_atomic(path, render_report(result))
