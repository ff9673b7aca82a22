"""Inline SVG charts: lines over time or index, horizontal stacked bars, and signed bars.

Every chart is a complete ``<svg>`` element with a title, axes with five ticks, a legend and at
most :data:`MAX_POINTS` points per series (longer series are thinned evenly). Non-finite points
are dropped; a chart with no data says so instead of drawing empty axes.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["ACTION_COLOURS", "COLOURS", "MAX_POINTS", "Series", "bar_chart", "line_chart", "stacked_bars"]

COLOURS = {
    "candidate": "#1f6feb",
    "incumbent": "#8250df",
    "flat": "#6e7781",
    "random": "#cf222e",
    "long": "#1a7f37",
    "greedy_unit": "#9a6700",
    "threshold": "#bc4c00",
}
"""Colours of the policies and markers that both reports draw."""
ACTION_COLOURS = ("#cf222e", "#6e7781", "#1a7f37")
"""short, flat, long."""
WIDTH, HEIGHT, PAD = 760, 260, 48
MAX_POINTS = 1500

Series = tuple[str, Any, Any, str, bool]
"""(label, xs, ys, colour, dashed)."""


def _thin(
    xs: np.ndarray[Any, Any], ys: np.ndarray[Any, Any]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    if xs.shape[0] <= MAX_POINTS:
        return xs, ys
    idx = np.unique(np.linspace(0, xs.shape[0] - 1, MAX_POINTS).astype(np.int64))
    return xs[idx], ys[idx]


def _open(height: int, title: str) -> list[str]:
    return [
        f'<svg viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" '
        f'aria-label="{html.escape(title)}">',
        f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" class="t">{html.escape(title)}</text>',
    ]


def _tick_label(value: float, dates: bool) -> str:
    if dates:
        return dt.datetime.fromtimestamp(value / 1e9, dt.UTC).strftime("%m-%d %H:%M")
    return f"{value:,.3g}"


def line_chart(
    title: str, series: Sequence[Series], *, x_label: str, y_label: str, x_dates: bool = False
) -> str:
    """An SVG line chart of ``series``; ``x_dates``: the xs are UNIX ns, labelled in UTC."""
    finite = [
        (label, *_thin(np.asarray(xs, float)[m], np.asarray(ys, float)[m]), colour, dashed)
        for label, xs, ys, colour, dashed in series
        for m in [np.isfinite(np.asarray(ys, float)) & np.isfinite(np.asarray(xs, float))]
    ]
    pts = [s for s in finite if s[1].size]
    parts = _open(HEIGHT, title)
    if not pts:
        parts.append(f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">no data</text></svg>')
        return "".join(parts)
    x_all = np.concatenate([s[1] for s in pts])
    y_all = np.concatenate([s[2] for s in pts])
    x0, x1 = float(x_all.min()), float(x_all.max())
    y0, y1 = float(y_all.min()), float(y_all.max())
    if x1 == x0:
        x1 = x0 + 1.0
    if y1 == y0:
        y0, y1 = y0 - 1.0, y1 + 1.0
    left, right, top, bottom = PAD + 12, WIDTH - 12, 28, HEIGHT - PAD + 8

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
        anchor = ("start", "middle", "middle", "middle", "end")[i]  # the outer labels stay inside
        label = _tick_label(xv, x_dates)
        parts.append(f'<text x="{sx(xv):.1f}" y="{bottom + 16}" text-anchor="{anchor}">{label}</text>')
    parts.append(
        f'<text x="{(left + right) / 2}" y="{HEIGHT - 6}" text-anchor="middle">{html.escape(x_label)}</text>'
    )
    parts.append(
        f'<text x="12" y="{(top + bottom) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 12 {(top + bottom) / 2})">{html.escape(y_label)}</text>'
    )
    for k, (label, xs, ys, colour, dashed) in enumerate(pts):
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, ys, strict=True))
        dash = ' stroke-dasharray="5 4"' if dashed else ""
        parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.6"{dash}/>')
        if xs.size == 1 or (len(pts) == 1 and xs.size <= 60):  # mark the points of short series
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


def stacked_bars(
    title: str,
    labels: Sequence[str],
    mixes: Sequence[Sequence[float]],
    *,
    parts_names: Sequence[str] = ("short", "flat", "long"),
    colours: Sequence[str] = ACTION_COLOURS,
) -> str:
    """Horizontal stacked bars of fractions (default: the action mix), one bar per label."""
    row = 22
    height = 40 + row * max(len(labels), 1) + 24
    parts = _open(height, title)
    left, right = 140, WIDTH - 20
    for i, (label, mix) in enumerate(zip(labels, mixes, strict=True)):
        y = 30 + i * row
        parts.append(f'<text x="{left - 6}" y="{y + 14}" text-anchor="end">{html.escape(label)}</text>')
        x = float(left)
        for frac, colour in zip(mix, colours, strict=False):
            w = max(0.0, float(frac)) * (right - left)
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row - 4}" fill="{colour}"/>')
            x += w
    legend_y = height - 10
    for k, (name, colour) in enumerate(zip(parts_names, colours, strict=True)):
        parts.append(
            f'<rect x="{left + 90 * k}" y="{legend_y - 10}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{left + 14 + 90 * k}" y="{legend_y}">{html.escape(name)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(title: str, labels: Sequence[str], values: Sequence[float], *, y_label: str) -> str:
    """Vertical bars of signed values (positive green, negative red) around a zero line."""
    vals = np.asarray(values, dtype=np.float64)
    parts = _open(HEIGHT, title)
    if vals.size == 0 or not np.isfinite(vals).any():
        parts.append(f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">no data</text></svg>')
        return "".join(parts)
    vals = np.where(np.isfinite(vals), vals, 0.0)
    lo, hi = min(0.0, float(vals.min())), max(0.0, float(vals.max()))
    if hi == lo:
        hi = lo + 1.0
    left, right, top, bottom = PAD + 12, WIDTH - 12, 28, HEIGHT - PAD + 8

    def sy(y: float) -> float:
        return bottom - (y - lo) / (hi - lo) * (bottom - top)

    parts.append(f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" class="frame"/>')
    for i in range(5):
        yv = lo + (hi - lo) * i / 4
        parts.append(f'<line x1="{left}" x2="{right}" y1="{sy(yv):.1f}" y2="{sy(yv):.1f}" class="grid"/>')
        parts.append(f'<text x="{left - 4}" y="{sy(yv) + 4:.1f}" text-anchor="end">{yv:,.3g}</text>')
    step = (right - left) / vals.size
    width = max(1.0, step * 0.8)
    every = max(1, vals.size // 12)
    for i, (label, v) in enumerate(zip(labels, vals, strict=True)):
        x = left + i * step + (step - width) / 2
        y_top, y_bottom = sorted((sy(float(v)), sy(0.0)))
        colour = COLOURS["long"] if v >= 0 else COLOURS["random"]
        h = max(y_bottom - y_top, 0.5)
        parts.append(
            f'<rect x="{x:.1f}" y="{y_top:.1f}" width="{width:.1f}" height="{h:.1f}" '
            f'fill="{colour}"><title>{html.escape(label)}: {v:,.2f}</title></rect>'
        )
        if i % every == 0:
            cx = x + width / 2
            parts.append(
                f'<text x="{cx:.1f}" y="{bottom + 16}" text-anchor="middle">{html.escape(label)}</text>'
            )
    parts.append(f'<line x1="{left}" x2="{right}" y1="{sy(0.0):.1f}" y2="{sy(0.0):.1f}" stroke="#1f2328"/>')
    parts.append(
        f'<text x="12" y="{(top + bottom) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 12 {(top + bottom) / 2})">{html.escape(y_label)}</text></svg>'
    )
    return "".join(parts)
