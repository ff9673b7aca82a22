"""The training report: one self-contained HTML file with inline SVG plots (no script, no network,
no plotting library).

Sections: the decision (promoted, halted, why), per-fold out-of-sample metrics against the
baselines and the incumbent, the concatenated out-of-sample equity curves, learning curves, the
probe Q-mean per epoch with the Q-drift threshold drawn, the action mix (exploration and the
greedy test decisions) and every gate event with its numbers.
"""

from __future__ import annotations

import datetime as dt
import html
import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agent.model import ACTIONS
from agent.train.run import RunResult, TrainSummary

__all__ = ["render_report", "write_report"]

_COLOURS = {
    "candidate": "#1f6feb",
    "incumbent": "#8250df",
    "flat": "#6e7781",
    "random": "#cf222e",
    "long": "#1a7f37",
    "threshold": "#bc4c00",
}
_ACTION_COLOURS = ("#cf222e", "#6e7781", "#1a7f37")
_W, _H, _PAD = 760, 260, 48
_MAX_POINTS = 1500

Series = tuple[str, Any, Any, str, bool]
"""(label, xs, ys, colour, dashed)."""


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return "nan" if not math.isfinite(v) else f"{v:,.{digits}f}"
    return html.escape(str(v))


def _thin(
    xs: np.ndarray[Any, Any], ys: np.ndarray[Any, Any]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    if xs.shape[0] <= _MAX_POINTS:
        return xs, ys
    idx = np.unique(np.linspace(0, xs.shape[0] - 1, _MAX_POINTS).astype(np.int64))
    return xs[idx], ys[idx]


def _svg_open(height: int, title: str) -> str:
    return (
        f'<svg viewBox="0 0 {_W} {height}" width="{_W}" height="{height}" role="img" '
        f'aria-label="{html.escape(title)}">'
    )


def _line_chart(
    title: str, series: Sequence[Series], *, x_label: str, y_label: str, x_dates: bool = False
) -> str:
    """An SVG line chart of ``series`` with axes, 5 ticks per axis and a legend."""
    finite = [
        (label, *_thin(np.asarray(xs, float)[m], np.asarray(ys, float)[m]), colour, dashed)
        for label, xs, ys, colour, dashed in series
        for m in [np.isfinite(np.asarray(ys, float)) & np.isfinite(np.asarray(xs, float))]
    ]
    pts = [s for s in finite if s[1].size]
    parts = [_svg_open(_H, title)]
    parts.append(f'<text x="{_W / 2}" y="16" text-anchor="middle" class="t">{html.escape(title)}</text>')
    if not pts:
        parts.append(f'<text x="{_W / 2}" y="{_H / 2}" text-anchor="middle">no data</text></svg>')
        return "".join(parts)
    x_all = np.concatenate([s[1] for s in pts])
    y_all = np.concatenate([s[2] for s in pts])
    x0, x1 = float(x_all.min()), float(x_all.max())
    y0, y1 = float(y_all.min()), float(y_all.max())
    if x1 == x0:
        x1 = x0 + 1.0
    if y1 == y0:
        y0, y1 = y0 - 1.0, y1 + 1.0
    left, right, top, bottom = _PAD + 12, _W - 12, 28, _H - _PAD + 8

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (right - left)

    def sy(y: float) -> float:
        return bottom - (y - y0) / (y1 - y0) * (bottom - top)

    parts.append(f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" class="frame"/>')
    for i in range(5):
        yv = y0 + (y1 - y0) * i / 4
        xv = x0 + (x1 - x0) * i / 4
        parts.append(f'<line x1="{left}" x2="{right}" y1="{sy(yv):.1f}" y2="{sy(yv):.1f}" class="grid"/>')
        parts.append(f'<text x="{left - 4}" y="{sy(yv) + 4:.1f}" text-anchor="end">{yv:,.3g}</text>')
        label = (
            dt.datetime.fromtimestamp(xv / 1e9, dt.UTC).strftime("%m-%d %H:%M") if x_dates else f"{xv:,.3g}"
        )
        parts.append(f'<text x="{sx(xv):.1f}" y="{bottom + 16}" text-anchor="middle">{label}</text>')
    parts.append(
        f'<text x="{(left + right) / 2}" y="{_H - 6}" text-anchor="middle">{html.escape(x_label)}</text>'
    )
    parts.append(
        f'<text x="12" y="{(top + bottom) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 12 {(top + bottom) / 2})">{html.escape(y_label)}</text>'
    )
    for k, (label, xs, ys, colour, dashed) in enumerate(pts):
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, ys, strict=True))
        dash = ' stroke-dasharray="5 4"' if dashed else ""
        parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.6"{dash}/>')
        if xs.size == 1 or len(pts) == 1:
            parts.extend(
                f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{colour}"/>'
                for x, y in zip(xs, ys, strict=True)
            )
        parts.append(
            f'<rect x="{left + 8 + 130 * k}" y="{top + 6}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{left + 22 + 130 * k}" y="{top + 15}">{html.escape(label)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _stacked_bars(title: str, labels: Sequence[str], mixes: Sequence[Sequence[float]]) -> str:
    """Horizontal stacked bars of action fractions (short, flat, long), one per label."""
    row = 22
    height = 40 + row * max(len(labels), 1) + 24
    parts = [_svg_open(height, title)]
    parts.append(f'<text x="{_W / 2}" y="16" text-anchor="middle" class="t">{html.escape(title)}</text>')
    left, right = 140, _W - 20
    for i, (label, mix) in enumerate(zip(labels, mixes, strict=True)):
        y = 30 + i * row
        parts.append(f'<text x="{left - 6}" y="{y + 14}" text-anchor="end">{html.escape(label)}</text>')
        x = float(left)
        for frac, colour in zip(mix, _ACTION_COLOURS, strict=False):
            w = max(0.0, float(frac)) * (right - left)
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row - 4}" fill="{colour}"/>')
            x += w
    legend_y = height - 10
    for k, (name, colour) in enumerate(zip(ACTIONS, _ACTION_COLOURS, strict=True)):
        parts.append(
            f'<rect x="{left + 90 * k}" y="{legend_y - 10}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{left + 14 + 90 * k}" y="{legend_y}">{name}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _ns(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, dt.UTC).strftime("%Y-%m-%d %H:%M")


def _decision(s: TrainSummary) -> str:
    state = (
        "PROMOTED"
        if s.promoted
        else ("HALTED" if s.halted else (s.candidate_status or "no candidate").upper())
    )
    promo = next((g for g in reversed(s.gates) if g.kind == "promotion"), None)
    why = html.escape(s.halt_reason or (promo.message if promo else ""))
    return (
        f'<p class="state">{state}</p><p>{why}</p>'
        f"<p>run {_fmt(s.run_id)} &middot; instruments {html.escape(s.instrument_set)} &middot; "
        f"{html.escape(s.device)} &middot; seed {s.seed} &middot; {s.wall_s:,.1f} s</p>"
        f"<p>candidate {_fmt(s.candidate_sha256)} &middot; incumbent {_fmt(s.incumbent_sha256)}"
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
            f.sharpe,
            f.baselines.get("flat"),
            f.baselines.get("random"),
            f.baselines.get("long"),
            f.incumbent_sharpe,
            f.metrics.pnl,
            f.metrics.max_drawdown,
            f.metrics.turnover,
            f.metrics.hit_rate,
        ]
        for f in s.folds
    ]
    if s.oos is not None:
        fold_rows.append(
            [
                "all",
                "concatenated",
                s.oos.sharpe,
                *(s.oos_baselines[b].sharpe for b in ("flat", "random", "long")),
                s.incumbent_sharpe,
                s.oos.pnl,
                s.oos.max_drawdown,
                s.oos.turnover,
                s.oos.hit_rate,
            ]
        )
    sections.append("<h2>Out-of-sample metrics per fold (Sharpe after costs, annualised)</h2>")
    sections.append(
        _table(
            [
                "fold",
                "test block (UTC)",
                "candidate",
                "flat",
                "random",
                "long",
                "incumbent",
                "P&L",
                "max DD",
                "contracts/day",
                "hit rate",
            ],
            fold_rows,
        )
    )
    curves: list[Series] = []
    for name in ("candidate", "incumbent", "flat", "random", "long"):
        ts, eq = result.curves.equity(name)
        if ts.size:
            curves.append((name, ts.astype(float), eq, _COLOURS[name], name in ("flat", "incumbent")))
    sections.append(
        _line_chart(
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
        _line_chart(
            "C51 and return-head loss per epoch",
            [
                ("C51 loss", x, [e.c51_loss for e in s.epochs], _COLOURS["candidate"], False),
                ("return loss", x, [e.return_loss for e in s.epochs], _COLOURS["long"], True),
            ],
            x_label="epoch (all folds)",
            y_label="cross-entropy",
        )
    )
    sections.append(
        _line_chart(
            "Mean exploration reward per step",
            [
                ("reward", x, [e.reward_mean for e in s.epochs], _COLOURS["candidate"], False),
            ],
            x_label="epoch (all folds)",
            y_label="normalised units",
        )
    )
    q = [e.q_mean for e in s.epochs]
    envelope = [s.drift_ratio * abs(v) for v in [float("nan"), *q[:-1]]]
    sections.append(
        _line_chart(
            "Probe Q-mean per epoch and the Q-drift threshold",
            [
                ("Q-mean", x, q, _COLOURS["candidate"], False),
                ("+drift_abs", x, [s.drift_abs] * len(x), _COLOURS["threshold"], True),
                ("-drift_abs", x, [-s.drift_abs] * len(x), _COLOURS["threshold"], True),
                ("ratio x |q_prev|", x, envelope, _COLOURS["random"], True),
            ],
            x_label="epoch (all folds)",
            y_label="normalised units",
        )
    )
    sections.append("<h2>Action mix</h2>")
    sections.append(
        _stacked_bars(
            "Exploration (Thompson) per epoch",
            [f"fold {e.fold} epoch {e.epoch}" for e in s.epochs],
            [e.explore_mix for e in s.epochs],
        )
    )
    sections.append(
        _stacked_bars(
            "Greedy decisions on each test block",
            [f"fold {f.index}" for f in s.folds],
            [f.greedy_mix for f in s.folds],
        )
    )
    sections.append("<h2>Gate events</h2>")
    sections.append(
        _table(
            ["gate", "fold", "epoch", "passed", "message", "numbers"],
            [
                [
                    g.kind,
                    g.fold_index,
                    g.epoch,
                    "yes" if g.passed else "NO",
                    g.message,
                    ", ".join(
                        f"{k}={_fmt(v, 4) if isinstance(v, float) else v}" for k, v in g.values.items()
                    ),
                ]
                for g in s.gates
            ],
        )
    )
    if s.floors:
        sections.append("<h2>Learned floors (vol_ref, squared log-return per bar)</h2>")
        sections.append(
            _table(
                ["instrument", "previous", "target", "new"],
                [[k, v["previous"], v["target"], v["value"]] for k, v in s.floors.items()],
            )
        )
    style = (
        "body{font:14px system-ui,sans-serif;margin:24px;color:#1f2328;max-width:820px}"
        "table{border-collapse:collapse;margin:8px 0 20px}td,th{border:1px solid #d0d7de;padding:3px 6px;"
        "text-align:right;font-size:12px}th{background:#f6f8fa}svg{display:block;margin:12px 0}"
        "svg text{font-size:11px;fill:#1f2328}svg .t{font-size:13px;font-weight:600}"
        ".frame{fill:none;stroke:#d0d7de}.grid{stroke:#eaeef2}.state{font-size:20px;font-weight:700}"
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>tradeagent training report</title>'
        f"<style>{style}</style></head><body>{''.join(sections)}</body></html>\n"
    )


def write_report(result: RunResult, path: str | Path) -> Path:
    """Write the report atomically (temporary file, then rename); returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(render_report(result))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
