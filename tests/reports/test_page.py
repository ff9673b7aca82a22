"""The report building blocks: charts say when they have no data, thin long series, draw signed
bars on both sides of zero; the writer never leaves a partial file."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from agent.reports.page import page, table, write_atomic
from agent.reports.svg import MAX_POINTS, bar_chart, line_chart


def test_line_chart_drops_non_finite_points_and_thins_long_series() -> None:
    xs = np.arange(10_000, dtype=float)
    ys = np.sin(xs / 100.0)
    ys[5] = np.nan
    svg = line_chart("t", [("a", xs, ys, "#000", False)], x_label="x", y_label="y")
    points = re.search(r'points="([^"]+)"', svg)
    assert points is not None
    assert 2 <= len(points.group(1).split()) <= MAX_POINTS
    assert "nan" not in points.group(1)
    empty = line_chart("t", [("a", [1.0], [np.nan], "#000", False)], x_label="x", y_label="y")
    assert "no data" in empty and "polyline" not in empty


def test_bar_chart_draws_signed_bars_around_zero() -> None:
    svg = bar_chart("pnl", ["a", "b"], [10.0, -5.0], y_label="ccy")
    bars = re.findall(
        r'<rect x="[\d.]+" y="([\d.]+)" width="[\d.]+" height="([\d.]+)" fill="(#[0-9a-f]+)"', svg
    )
    assert len(bars) == 2
    (y_pos, h_pos, c_pos), (y_neg, h_neg, c_neg) = bars
    assert c_pos != c_neg
    assert float(y_pos) + float(h_pos) == pytest.approx(float(y_neg), abs=0.2)  # both meet at zero
    assert float(h_pos) == pytest.approx(2 * float(h_neg), rel=0.01)


def test_page_escapes_and_write_is_atomic(tmp_path: Path) -> None:
    html = page("<x>", [table(["k"], [["<script>"]])])
    assert "<script>" not in html and "&lt;script&gt;" in html
    target = write_atomic(tmp_path / "r.html", html)
    assert target.read_text() == html

    with pytest.raises(TypeError):
        write_atomic(tmp_path / "r.html", 42)  # type: ignore[arg-type]
    assert target.read_text() == html, "a failed write leaves the previous file whole"
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"], "no temporary file is left behind"
