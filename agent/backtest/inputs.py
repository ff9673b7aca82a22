"""What a backtest reads: the recorded days in a date range and the checkpoint to trade.

* :func:`select_days` picks the daily DBN files of an archive directory (or one file) whose data
  overlaps a time window ``[start, end)`` (:func:`parse_bound`: whole UTC days for dates, exact
  instants for ISO date-times) and returns it.
* :func:`resolve_checkpoint` finds a checkpoint by ``promoted`` (the registry's promoted model for
  the configured instrument set), by sha256 (or a unique prefix of at least 8 hex digits,
  :func:`match_sha256`, which ``tradeagent ctl promote`` uses too) in the content-addressed
  store, or by a file path; it is verified (hash, fingerprint) on load and checked against the
  features the data produces (:func:`check_compatible`).

Every failure is a :class:`~agent.backtest.errors.BacktestError` (or the feeds/storage error of
the layer that found it) with a message naming the input; nothing is written before these checks.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path

from agent.backtest.errors import BacktestError
from agent.model.checkpoint import Checkpoint, checkpoint_from_bytes
from agent.model.errors import ModelError
from agent.policy.floors import VOL_REF_FLOOR
from agent.policy.observation import AGENT_FEATURES
from feeds.config import FeedsConfig
from feeds.dbn import DBNInfo, dbn_files, read_metadata
from feeds.errors import FeedError
from feeds.features import FEATURE_NAMES
from storage.checkpoints import CheckpointStore
from storage.config import StorageConfig
from storage.errors import StorageError
from storage.floors import LearnedFloors
from storage.registry import ModelRegistry
from storage.schema import open_database
from storage.url import is_embedded, resolve_url
from storage.values import instrument_set_key

__all__ = [
    "DaySelection",
    "ResolvedCheckpoint",
    "check_compatible",
    "iso_ns",
    "match_sha256",
    "ns_iso",
    "parse_bound",
    "resolve_checkpoint",
    "select_days",
]

_NS_PER_DAY = 86_400_000_000_000
_HEX = re.compile(r"^[0-9a-fA-F]{8,64}$")


@dataclass(frozen=True)
class DaySelection:
    """The archive files a backtest replays and its time window ``[start_ns, end_ns)`` (UTC)."""

    files: tuple[Path, ...]
    start_ns: int
    end_ns: int
    first_day: dt.date
    last_day: dt.date


def parse_bound(text: str, option: str, *, end: bool) -> int:
    """``--from``/``--to`` -> a time bound in ns since the epoch (UTC).

    A date (``YYYY-MM-DD``) is a whole UTC day: ``--from`` its start, ``--to`` its end (the day
    is included). A date-time (ISO 8601, ``2024-01-09T14:30:00``, ``...+00:00`` or ``...Z``; UTC
    when no offset is given; microseconds at most) is an instant: ``--from`` includes it, ``--to``
    excludes it, so the window ``[from, to)`` of a training fold's test block replays exactly
    that block. Raises :class:`BacktestError` naming ``option``.
    """
    try:
        if len(text) == 10:
            day = dt.date.fromisoformat(text)
            return _day_ns(day + dt.timedelta(days=1) if end else day)
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise BacktestError(
            f"{option} {text!r}: expected a date (YYYY-MM-DD) or an ISO date-time "
            "(YYYY-MM-DDTHH:MM:SS[.ffffff][+00:00])"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return iso_ns(when)


def iso_ns(when: dt.datetime) -> int:
    """Nanoseconds since the epoch of an aware date-time, exactly (no float rounding)."""
    delta = when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


def ns_iso(ns: int) -> str:
    """The ISO 8601 date-time (UTC, microseconds) of ``ns`` rounded down to the microsecond:
    :func:`parse_bound` gives back ``ns`` exactly when it is a whole microsecond."""
    base = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (base + dt.timedelta(microseconds=ns // 1_000)).isoformat()


def _day(ns: int) -> dt.date:
    return dt.datetime.fromtimestamp(ns // 1_000_000_000, dt.UTC).date()


def _day_ns(day: dt.date) -> int:
    return (day - dt.date(1970, 1, 1)).days * _NS_PER_DAY


def _data_span(info: DBNInfo) -> tuple[int, int]:
    """``[first, last]`` ns of the data a file holds, from its metadata."""
    last_ns = info.end_ns - 1 if info.end_ns is not None and info.end_ns > info.start_ns else info.start_ns
    return info.start_ns, last_ns


def select_days(path: str | Path, start_ns: int | None, end_ns: int | None) -> DaySelection:
    """The DBN files under ``path`` with data in ``[start_ns, end_ns)`` (None = open end; see
    :func:`parse_bound`).

    Raises :class:`BacktestError` for a missing path, a directory without DBN files, an inverted
    range, or a range that holds no data (the message gives the range the data covers).
    """
    p = Path(path)
    if not p.exists():
        raise BacktestError(f"--data {p}: no such file or directory")
    if start_ns is not None and end_ns is not None and start_ns >= end_ns:
        raise BacktestError(f"--from {ns_iso(start_ns)} is not before --to {ns_iso(end_ns)}")
    try:
        infos = [read_metadata(file) for file in dbn_files(p)]
    except FeedError as exc:
        raise BacktestError(f"--data {p}: {exc}") from None
    spans = [(info, *_data_span(info)) for info in infos]
    lo = min(first for _, first, _ in spans)
    hi = max(last for _, _, last in spans)
    want_lo = _day_ns(_day(lo)) if start_ns is None else start_ns
    want_hi = _day_ns(_day(hi) + dt.timedelta(days=1)) if end_ns is None else end_ns
    chosen = [info for info, first, last in spans if last >= want_lo and first < want_hi]
    if not chosen:
        raise BacktestError(
            f"no data between {ns_iso(want_lo)} and {ns_iso(want_hi)}: {p} covers "
            f"{_day(lo)} .. {_day(hi)} (UTC dates)"
        )
    return DaySelection(
        files=tuple(sorted((i.path for i in chosen), key=lambda q: (q.name, str(q)))),
        start_ns=want_lo,
        end_ns=want_hi,
        first_day=_day(max(want_lo, min(_data_span(i)[0] for i in chosen))),
        last_day=_day(min(want_hi - 1, max(_data_span(i)[1] for i in chosen))),
    )


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """A verified checkpoint and the learned regime floors (instrument id -> floor) that the
    daemon would trade it with (from the same database; empty for a checkpoint file)."""

    checkpoint: Checkpoint
    floors: dict[int, float]


def resolve_checkpoint(
    spec: str, feeds: FeedsConfig, storage: StorageConfig, data_dir: str
) -> ResolvedCheckpoint:
    """Load the checkpoint named by ``spec``: ``promoted``, a sha256 (or unique prefix) in the
    store of ``data_dir``, or a path to a checkpoint file. Verified on load."""
    path = Path(spec)
    if spec != "promoted" and path.is_file():
        try:
            return ResolvedCheckpoint(checkpoint_from_bytes(path.read_bytes()), {})
        except ModelError as exc:
            raise BacktestError(f"--checkpoint {spec}: not a valid checkpoint: {exc}") from None
        except OSError as exc:
            raise BacktestError(f"--checkpoint {spec}: cannot read it: {exc}") from None
    if spec != "promoted" and not _HEX.match(spec):
        raise BacktestError(
            f"--checkpoint {spec}: no such file, and not 'promoted' or a sha256 (8 to 64 hex digits)"
        )
    promoted_sets: list[str] = []
    store = CheckpointStore.for_data_dir(data_dir)
    url = resolve_url(storage, data_dir)
    floors: dict[int, float] = {}
    record = None
    # A backtest never creates a database: without the embedded one there is nothing promoted
    # and no learned floor.
    if not (is_embedded(storage) and url.database and not Path(url.database).is_file()):
        database = open_database(storage, data_dir)
        try:
            floors = {iid: v.value for (iid, _), v in LearnedFloors(database).all(VOL_REF_FLOOR).items()}
            if spec == "promoted":
                key = instrument_set_key([s.symbol for s in feeds.instruments])
                registry = ModelRegistry(database)
                record = registry.current_promoted(key)
                promoted_sets = [c.instrument_set for c in registry.checkpoints(status="promoted")]
        finally:
            database.close()
    if spec == "promoted":
        key = instrument_set_key([s.symbol for s in feeds.instruments])
        if record is None:
            remedy = (
                f"promoted there: {', '.join(promoted_sets)}; trade one of these sets with "
                f"--instruments (e.g. --instruments {promoted_sets[0]}), or pass a sha256 or a file"
                if promoted_sets
                else "train one with `tradeagent train --promote`, or pass a sha256 or a file"
            )
            raise BacktestError(
                f"--checkpoint promoted: no promoted checkpoint for {key} in {data_dir}; {remedy}"
            )
        sha = record.sha256
    else:
        sha = match_sha256(spec, store, "--checkpoint")
    try:
        return ResolvedCheckpoint(checkpoint_from_bytes(store.get(sha), expected_sha256=sha), floors)
    except (ModelError, StorageError) as exc:
        raise BacktestError(f"--checkpoint {spec}: {exc}") from None


def match_sha256(text: str, store: CheckpointStore, option: str) -> str:
    """The one sha256 in ``store`` that starts with ``text`` (8 to 64 hex digits, any case).

    Raises :class:`BacktestError` naming ``option`` when ``text`` is not such a prefix, or when
    no stored checkpoint or more than one starts with it (the message says how long a prefix
    must be).
    """
    if not _HEX.match(text):
        raise BacktestError(f"{option} {text}: not a sha256 or a prefix of one (8 to 64 hex digits)")
    matches = [h for h in store.hashes() if h.startswith(text.lower())]
    if not matches:
        raise BacktestError(f"{option} {text}: no checkpoint in {store.root} starts with it")
    if len(matches) > 1:
        shortest = [h[: max(8, 1 + max(_shared(h, o) for o in matches if o != h))] for h in matches[:4]]
        raise BacktestError(
            f"{option} {text}: ambiguous, {len(matches)} checkpoints in {store.root} start with it; "
            f"give enough digits to pick one: {', '.join(shortest)}{', ...' if len(matches) > 4 else ''}"
        )
    return matches[0]


def _shared(a: str, b: str) -> int:
    """How many leading characters ``a`` and ``b`` share."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def check_compatible(checkpoint: Checkpoint) -> None:
    """Raise :class:`BacktestError` unless the checkpoint reads the features this code builds
    (market features plus the agent's two), in the same order."""
    expected = (*FEATURE_NAMES, *AGENT_FEATURES)
    names = tuple(checkpoint.feature_names)
    if names != expected:
        missing = [n for n in expected if n not in names]
        extra = [n for n in names if n not in expected]
        detail = (
            f"missing {missing[:4]}, unknown {extra[:4]}" if missing or extra else "same names, other order"
        )
        raise BacktestError(
            f"checkpoint {checkpoint.sha256[:12]} was trained on {len(names)} features that do not match "
            f"the {len(expected)} this data gives ({detail})"
        )
    if checkpoint.config.n_features != len(expected):
        raise BacktestError(
            f"checkpoint {checkpoint.sha256[:12]} expects {checkpoint.config.n_features} inputs per bar, "
            f"the data gives {len(expected)}"
        )
