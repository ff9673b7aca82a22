"""The features: one list, :data:`FEATURES`, each with the statistics it reads and its function.

A :class:`Feature` is one column (or a few computed together) of the feature matrix: the
:class:`~feeds.features.statistics.BarStatistics` fields it needs and the one array function that
turns those statistics of ``n`` closed bars into its rows. Both paths hand their closed bars'
statistics to :func:`feature_rows`, so every feature has exactly one definition; the column
names (:data:`FEATURE_NAMES`, in list order) and positions (:data:`COLUMNS`) derive from the
list.

Units: prices in ticks of the instrument, sizes in contracts, times in ns. NaN never appears:
every ratio has a defined value for an empty denominator (0), the case before the first healthy
book.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from feeds.features.statistics import BOOK, BOOK_INTS, DEPTH_LEVELS, BarStatistics
from feeds.records import LEVELS

__all__ = ["COLUMNS", "FEATURES", "FEATURE_NAMES", "Feature", "feature_rows"]

_DAY_NS = 86_400 * 1_000_000_000
_TWO_PI = 2.0 * math.pi
_STATISTICS = frozenset(f.name for f in dataclasses.fields(BarStatistics))
_BID, _ASK, _BID_SIZE, _ASK_SIZE = (BOOK[name] for name in ("bid", "ask", "bid_size", "ask_size"))
_DEPTHS = slice(BOOK["bid_depth_l1"], BOOK[f"ask_depth_l{DEPTH_LEVELS[-1]}"] + 1)
assert BOOK_INTS[_DEPTHS] == tuple(f"{side}_depth_l{k}" for side in ("bid", "ask") for k in DEPTH_LEVELS)
_BID_L10, _ASK_L10 = BOOK[f"bid_depth_l{LEVELS}"], BOOK[f"ask_depth_l{LEVELS}"]


@dataclasses.dataclass(frozen=True, slots=True)
class Feature:
    """One feature: its column names, the statistics it reads and its array function.

    ``compute(out, *stats)`` gets ``out``, float64 ``(len(names), n)`` (one row per column, to
    write every element of), and the :class:`BarStatistics` fields named in ``needs``, in that
    order. A feature with several columns computes them together (a block such as the ten OFI
    levels, or columns that share their work).
    """

    names: tuple[str, ...]
    needs: tuple[str, ...]
    compute: Callable[..., None]
    _get: Callable[[BarStatistics], Any] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.needs) - _STATISTICS)
        if unknown:
            raise TypeError(f"feature {self.names}: needs {unknown}, which are not BarStatistics fields")
        if not self.needs or not self.names:
            raise TypeError(f"feature {self.names}: a feature needs a name and at least one statistic")
        get = operator.attrgetter(*self.needs)
        object.__setattr__(self, "_get", (lambda s: (get(s),)) if len(self.needs) == 1 else get)

    def evaluate(self, stats: BarStatistics, out: np.ndarray) -> None:
        """Write this feature of the bars of ``stats`` into ``out`` (see the class)."""
        self.compute(out, *self._get(stats))


def _mid_moves(out: np.ndarray, mid2: np.ndarray, mid2_before: np.ndarray, tick: Any) -> None:
    """``log(mid(close t) / mid(close t-1))`` and ``(mid(close t) - mid(close t-1)) / tick``,
    both 0 without a mid at both closes (the first bar)."""
    ok = (mid2 > 0) & (mid2_before > 0)
    np.divide(np.where(ok, mid2, 1), np.where(ok, mid2_before, 1), out=out[0])
    np.log(out[0], out=out[0])
    np.divide(np.where(ok, mid2 - mid2_before, 0), 2 * tick, out=out[1])


def _spread_microprice(out: np.ndarray, book: np.ndarray, tick: Any) -> None:
    """``spread_ticks = (ask - bid) / tick`` of the book at the close, and (microprice - mid) /
    tick = ``spread_ticks * (qb - qa) / (2 (qb + qa))`` (microprice ``(b qa + a qb) / (qa +
    qb)``, with ``qb, qa`` the best sizes; 0 without sizes)."""
    qb, qa = book[:, _BID_SIZE], book[:, _ASK_SIZE]
    np.divide(book[:, _ASK] - book[:, _BID], tick, out=out[0])
    np.multiply(out[0], qb - qa, out=out[1])
    top = qb + qa
    np.divide(out[1], 2 * np.where(top > 0, top, 1), out=out[1])


def _depth_imbalance(out: np.ndarray, book: np.ndarray) -> None:
    """``(B_k - A_k) / (B_k + A_k)`` per level ``k`` of :data:`DEPTH_LEVELS`, with ``B_k, A_k``
    the contracts on levels 1..k of each side; 0 on an empty book."""
    depth = book[:, _DEPTHS].T
    k = len(DEPTH_LEVELS)
    total = depth[:k] + depth[k:]
    np.divide(depth[:k] - depth[k:], np.where(total > 0, total, 1), out=out)


def _ofi_levels(out: np.ndarray, ofi: np.ndarray) -> None:
    """Order-flow imbalance per level, contracts summed over the bar."""
    out[:] = ofi.T


def _ofi_total(out: np.ndarray, ofi: np.ndarray) -> None:
    """The sum of the levels' order-flow imbalance."""
    out[0] = ofi.sum(axis=1)


def _copy(out: np.ndarray, statistic: np.ndarray) -> None:
    """The statistic itself."""
    out[0] = statistic


def _realized_var_ticks2(out: np.ndarray, rv_half_ticks2: np.ndarray) -> None:
    """Sum of squared record-to-record mid changes in the bar, ticks^2."""
    np.divide(rv_half_ticks2, 4, out=out[0])


def _log_depth_l10(out: np.ndarray, book: np.ndarray) -> None:
    """``log1p(contracts on the 10 levels)``, bid then ask, book at close."""
    out[0] = book[:, _BID_L10]
    out[1] = book[:, _ASK_L10]
    np.log1p(out, out=out)


def _bar_seconds(out: np.ndarray, close_ts: np.ndarray, close_ts_before: np.ndarray) -> None:
    """Time since the previous close, s (0 for the first bar)."""
    np.divide(close_ts - close_ts_before, 1e9, out=out[0])


def _time_of_day(out: np.ndarray, close_ts: np.ndarray) -> None:
    """Time of day of the close (UTC): ``sin``, ``cos`` of ``2 pi s / 86400``."""
    angle = (close_ts % _DAY_NS) * (_TWO_PI / _DAY_NS)
    np.sin(angle, out=out[0])
    np.cos(angle, out=out[1])


FEATURES: tuple[Feature, ...] = (
    Feature(("mid_logret", "mid_change_ticks"), ("mid2", "mid2_before", "tick"), _mid_moves),
    Feature(("spread_ticks", "microprice_offset_ticks"), ("book", "tick"), _spread_microprice),
    Feature(tuple(f"depth_imbalance_l{k}" for k in DEPTH_LEVELS), ("book",), _depth_imbalance),
    Feature(tuple(f"ofi_l{m}" for m in range(1, LEVELS + 1)), ("ofi",), _ofi_levels),
    Feature(("ofi_total",), ("ofi",), _ofi_total),
    Feature(("trade_volume_signed",), ("signed_volume",), _copy),  # + buyer-initiated
    Feature(("trade_volume",), ("volume",), _copy),
    Feature(("trade_count",), ("trades",), _copy),
    Feature(("realized_var_ticks2",), ("rv_half_ticks2",), _realized_var_ticks2),
    Feature(("update_count",), ("n_records",), _copy),  # records in the bar
    Feature(("log_depth_bid_l10", "log_depth_ask_l10"), ("book",), _log_depth_l10),
    Feature(("bar_seconds",), ("close_ts", "close_ts_before"), _bar_seconds),
    Feature(("tod_sin", "tod_cos"), ("close_ts",), _time_of_day),
)
"""Every feature, in column order (see :class:`Feature`)."""

FEATURE_NAMES: tuple[str, ...] = tuple(name for feature in FEATURES for name in feature.names)
"""The columns of :attr:`feeds.features.BarFrame.features`, ``F = len(FEATURE_NAMES)``."""
COLUMNS: dict[str, int] = {name: i for i, name in enumerate(FEATURE_NAMES)}
"""The column of each feature name."""
assert len(COLUMNS) == len(FEATURE_NAMES), "feature names must be unique"
_ROWS = [(feature, slice(COLUMNS[feature.names[0]], COLUMNS[feature.names[-1]] + 1)) for feature in FEATURES]


def feature_rows(stats: BarStatistics) -> np.ndarray:
    """Every feature of the bars of ``stats``, float64 ``(F, n)`` (row ``COLUMNS[name]``).

    Rows, not columns: each feature writes contiguous rows, and the caller casts the transpose
    into the float32 matrix in one copy (with a batch of a few bars, the incremental path's,
    NumPy's per-call cost is what counts)."""
    rows = np.empty((len(FEATURE_NAMES), stats.close_ts.shape[0]))
    for feature, at in _ROWS:
        feature.evaluate(stats, rows[at])
    return rows
