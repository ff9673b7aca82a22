"""The backtest report: one HTML file with the run's figures next to the baselines.

Sections: headline metrics (candidate and the flat / random / always-long baselines, after costs),
equity and drawdown, position and signed Kelly size over time, regime scale, action mix, P&L per
instrument and per day, and the distribution of decision latency.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from agent.backtest.api import BacktestResult
from agent.backtest.metrics import Performance
from agent.reports.page import fmt, page, table, write_atomic
from agent.reports.svg import COLOURS, bar_chart, line_chart, stacked_bars

__all__ = ["render_backtest", "write_backtest"]

_INSTRUMENT_COLOURS = ("#1f6feb", "#bc4c00", "#8250df", "#1a7f37", "#cf222e", "#6e7781")
_LATENCY_EDGES_US = (0, 25, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 50_000)


def _metrics_rows(named: dict[str, Performance]) -> list[list[Any]]:
    return [
        [
            name,
            p.pnl,
            p.sharpe,
            p.sortino,
            p.max_drawdown,
            p.costs,
            p.turnover,
            p.hit_rate,
            p.n_days,
        ]
        for name, p in named.items()
    ]


_METRIC_HEAD = ["policy", "P&L", "Sharpe", "Sortino", "max DD", "costs", "contracts/day", "hit rate", "days"]


def _latency_histogram(latency_ns: np.ndarray[Any, Any]) -> tuple[list[str], list[float]]:
    us = latency_ns / 1e3
    edges = np.asarray([*_LATENCY_EDGES_US, np.inf])
    counts, _ = np.histogram(us, bins=edges)
    labels = [f"<{int(e):,}" for e in edges[1:-1]] + [f">={_LATENCY_EDGES_US[-1]:,}"]
    return labels, counts.astype(float).tolist()


def render_backtest(result: BacktestResult) -> str:
    """The report of a backtest as an HTML document (a string)."""
    s = result.summary
    d = result.decisions
    sections = [
        "<h1>tradeagent backtest report</h1>",
        f'<p class="state">{"event-driven (daemon pipeline)" if s.mode == "event" else "vectorised"} '
        f"backtest, {html.escape(s.first_day)} .. {html.escape(s.last_day)}</p>",
        f"<p>checkpoint {fmt(s.checkpoint_sha256)} &middot; data {fmt(s.data)} &middot; instruments "
        f"{html.escape(', '.join(s.instruments))} &middot; {s.records:,} records, {s.bars:,} bars, "
        f"{s.decisions:,} decisions, {s.orders:,} orders, {s.fills:,} fills &middot; {s.wall_s:,.1f} s "
        f"({s.records_per_s:,.0f} records/s)</p>",
    ]
    if s.halt_reason:
        sections.append(f"<p><b>Risk halt:</b> {html.escape(s.halt_reason)}</p>")
    sections.append("<h2>Metrics after costs (Sharpe annualised for the bar cadence)</h2>")
    sections.append(table(_METRIC_HEAD, _metrics_rows({"candidate": s.performance, **s.baselines})))
    sections.append(table(_METRIC_HEAD, _metrics_rows(s.per_instrument)))
    curves = []
    for name, books in (("candidate", result.books), *result.baselines.items()):
        ts, eq = books.equity()
        curves.append((name, ts.astype(float), eq, COLOURS[name], name != "candidate"))
    sections.append("<h2>Equity and drawdown</h2>")
    # The random baseline pays the spread at most bars: on the same axes it would flatten every
    # other curve, so it gets the second chart with all four.
    sections.append(
        line_chart(
            "Cumulative P&L after costs: candidate, flat and always long",
            [c for c in curves if c[0] != "random"],
            x_label="time (UTC)",
            y_label="currency",
            x_dates=True,
        )
    )
    sections.append(
        line_chart(
            "Cumulative P&L after costs: with the random baseline",
            curves,
            x_label="time (UTC)",
            y_label="currency",
            x_dates=True,
        )
    )
    ts, eq = result.books.equity()
    drawdown = eq - np.maximum.accumulate(np.maximum(eq, 0.0)) if eq.size else eq
    sections.append(
        line_chart(
            "Drawdown of the candidate",
            [("drawdown", ts.astype(float), drawdown, COLOURS["random"], False)],
            x_label="time (UTC)",
            y_label="currency",
            x_dates=True,
        )
    )
    sections.append("<h2>Position, Kelly size and regime</h2>")
    pos_series, size_series, regime_series = [], [], []
    for i, sym in enumerate(result.symbols):
        colour = _INSTRUMENT_COLOURS[i % len(_INSTRUMENT_COLOURS)]
        mine = result.books.instrument == i
        pos_series.append(
            (sym, result.books.ts_ns[mine].astype(float), result.books.position[mine], colour, False)
        )
        rows = (d["instrument"] == i) & d["valid"].astype(bool) if d["ts_ns"].size else np.zeros(0, bool)
        signed = d["size"][rows] * (d["action"][rows].astype(np.float64) - 1.0)
        size_series.append((sym, d["ts_ns"][rows].astype(float), signed, colour, False))
        regime_series.append((sym, d["ts_ns"][rows].astype(float), d["regime"][rows], colour, False))
    sections.append(
        line_chart(
            "Position (contracts)", pos_series, x_label="time (UTC)", y_label="contracts", x_dates=True
        )
    )
    sections.append(
        line_chart(
            "Kelly size of each decision, signed by direction",
            size_series,
            x_label="time (UTC)",
            y_label="clip(c * f*, 0, 1)",
            x_dates=True,
        )
    )
    sections.append(
        line_chart("Regime scale", regime_series, x_label="time (UTC)", y_label="scale", x_dates=True)
    )
    sections.append("<h2>Action mix</h2>")
    labels, mixes = ["all instruments"], [[s.action_mix["short"], s.action_mix["flat"], s.action_mix["long"]]]
    for i, sym in enumerate(result.symbols):
        rows = (d["instrument"] == i) & d["valid"].astype(bool) if d["ts_ns"].size else np.zeros(0, bool)
        counts = np.bincount(d["action"][rows].astype(np.int64), minlength=3)[:3]
        labels.append(sym)
        mixes.append((counts / max(int(counts.sum()), 1)).tolist())
    sections.append(stacked_bars("Share of valid decisions per action", labels, mixes))
    sections.append("<h2>P&L per instrument and per day</h2>")
    sections.append(
        bar_chart(
            "Net P&L per instrument",
            list(result.symbols),
            [s.per_instrument[sym].pnl for sym in result.symbols],
            y_label="currency",
        )
    )
    sections.append(
        bar_chart("Net P&L per day (UTC)", list(s.per_day), list(s.per_day.values()), y_label="currency")
    )
    sections.append("<h2>Decision latency</h2>")
    what = (
        "closing record handed to the pipeline to decision taken (order sent), per decision"
        if s.mode == "event"
        else "one batched decision divided by its rows (amortised)"
    )
    sections.append(
        f"<p>{html.escape(what)}: " + ", ".join(f"{k} {v:,.1f} us" for k, v in s.latency_us.items()) + "</p>"
    )
    hist_labels, hist_counts = _latency_histogram(result.latency_ns)
    sections.append(
        bar_chart(
            "Decisions per latency bucket (microseconds)", hist_labels, hist_counts, y_label="decisions"
        )
    )
    sections.append("<h2>Health</h2>")
    sections.append(table(["counter", "value"], [[k, v] for k, v in s.health.items()]))
    return page("tradeagent backtest report", sections)


def write_backtest(result: BacktestResult, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``report.html`` and ``summary.json`` under ``out_dir`` (each atomically); returns
    their paths."""
    out = Path(out_dir)
    summary = msgspec.json.format(msgspec.json.encode(result.summary), indent=1).decode() + "\n"
    report = write_atomic(out / "report.html", render_backtest(result))
    return report, write_atomic(out / "summary.json", summary)
