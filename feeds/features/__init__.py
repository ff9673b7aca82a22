"""Causal bar features per instrument: one set of definitions, a vectorised and an incremental path.

Both paths reduce a bar's records to the same *sufficient statistics*, all integers
(:class:`~feeds.features.statistics.BarStatistics`: per-level order-flow imbalance, signed and
total traded volume, trade count, records, the sum of squared mid steps in half-ticks, the book
at the close...), and turn them into features with one function per feature over arrays of
closed bars (:data:`~feeds.features.definitions.FEATURES`). The record rules are shared the same
way: :func:`feeds.health.fault_mask` and :func:`~feeds.features.statistics.ofi_price_term` are
written once over operands that are Python ints (one record) or int64 arrays (many).

Modules, by concern:

* :mod:`~feeds.features.definitions`: the feature list; per feature, the statistics it needs and
  the array function that makes its column(s); the column layout (:data:`FEATURE_NAMES`) derives
  from the list;
* :mod:`~feeds.features.statistics`: the statistics, the book-at-close reduction and the OFI rule;
* :mod:`~feeds.features.frame`: :class:`BarFrame`, built from statistics by
  :func:`~feeds.features.frame.bar_frames`;
* :mod:`~feeds.features.group_statistics` and :mod:`~feeds.features.vectorised`: the vectorised path
  (replay, training), :func:`compute_bars` / :func:`compute_all` over arrays and
  :class:`FeatureStream` / :func:`compute_file` over chunks;
* :mod:`~feeds.features.incremental`: the live path, :class:`IncrementalBars` (one instrument,
  records pushed one at a time or in batches) and :class:`IncrementalFeatures` (routing).

**Adding a feature** is one :class:`~feeds.features.definitions.Feature` in
:data:`~feeds.features.definitions.FEATURES` (its names, the statistics it needs, its array
function); both paths use it as it is. A feature that needs a statistic the bars do not keep
yet also needs that statistic: a field of ``BarStatistics``, computed over arrays in
:func:`feeds.features.group_statistics.bar_statistics` and record by record in ``IncrementalBars`` (its
per-record update and its place in the closed-bar row, ``_ROW_PARTS``).

Integers are exact and the features come from the same array code on both paths, so they are
identical bit for bit (tests/feeds/test_features_parity.py checks every column, on random,
faulty, synthetic and official data).

Causality: the features of the bar closing at ``close(t)`` use only the records in
``(close(t-1), close(t)]`` (see :mod:`feeds.bars`) and the book at ``close(t)`` (the levels of
the instrument's last healthy record at or before the close). A bar with no record carries the
book forward: book features repeat, flow features are 0.

Health: records that fail a record check (:mod:`feeds.health`) never feed the maths as valid:
the mid used for returns and realised variance is that of the last healthy record, an order-flow
term needs the record and the one before it healthy, and the book at close is the last healthy
book. A bar is ``tradable`` only when none of its records failed a check, the last record is
healthy, the feed was not stale at the close and no transport gap was reported in the bar.

Units: prices become ticks with the instrument's ``tick_size``; sizes are contracts; times ns.
NaN never appears: every ratio has a defined value for an empty denominator (0).

The model's input is these ``F = len(FEATURE_NAMES)`` market features plus 2 agent features
(the agent's position and unrealised P&L) that the agent appends at decision time; they are
not computed here.
"""

from feeds.features.definitions import FEATURE_NAMES
from feeds.features.frame import BarFrame
from feeds.features.incremental import IncrementalBars, IncrementalFeatures
from feeds.features.statistics import BOOK_INTS, ofi_price_term
from feeds.features.vectorised import (
    FILE_CHUNK_RECORDS,
    FeatureSet,
    FeatureStream,
    compute_all,
    compute_bars,
    compute_file,
)

__all__ = [
    "BOOK_INTS",
    "FEATURE_NAMES",
    "FILE_CHUNK_RECORDS",
    "BarFrame",
    "FeatureSet",
    "FeatureStream",
    "IncrementalBars",
    "IncrementalFeatures",
    "compute_all",
    "compute_bars",
    "compute_file",
    "ofi_price_term",
]
