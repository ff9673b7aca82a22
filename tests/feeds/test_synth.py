"""The synthetic generator: determinism, metadata, valid and self-consistent books, regimes, and
the planted signal (present at the default strength, absent at zero)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import databento
import numpy as np
import numpy.typing as npt
import pytest

from agent.cli import main
from feeds.config import InstrumentSpec, SynthConfig
from feeds.dbn import read_mbp10, read_metadata
from feeds.records import LEVELS, PRICE_SCALE
from feeds.synth import session_bounds, simulate_session, synth_file_name, trading_days, write_synthetic

ES = InstrumentSpec(symbol="ES", instrument_id=1001, tick_size=0.25)
NQ = InstrumentSpec(symbol="NQ", instrument_id=1002, tick_size=0.25, tick_value=5.0)
DAY = dt.date(2024, 1, 2)
TICK = int(0.25 * PRICE_SCALE)
SIDES = ("bid", "ask")


@pytest.fixture(scope="module")
def with_signal() -> npt.NDArray[np.void]:
    """A full default session (6.5 h) of ES at the default signal strength."""
    return simulate_session(ES, DAY, SynthConfig(), seed=0, open_tick=20_000).records


@pytest.fixture(scope="module")
def no_signal() -> npt.NDArray[np.void]:
    return simulate_session(ES, DAY, SynthConfig(signal=0.0), seed=0, open_tick=20_000).records


def _levels(records: npt.NDArray[np.void], what: str) -> npt.NDArray[np.int64]:
    """``[n, 20]``: bid levels 0..9 then ask levels 0..9."""
    return np.stack(
        [records[f"{side}_{what}_{k:02d}"].astype(np.int64) for side in SIDES for k in range(LEVELS)], axis=1
    )


def _one_second_bars(
    records: npt.NDArray[np.void],
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per 1-second bar: order-flow imbalance over the top 3 levels (Cont et al., from the book
    snapshots) and the mid change in ticks over the bar. Bars with no record carry the mid."""
    px, sz = _levels(records, "px"), _levels(records, "sz").astype(np.float64)
    ofi = np.zeros(len(records))
    for k in range(3):
        b, a = k, LEVELS + k
        pb0, pb1, qb0, qb1 = px[:-1, b], px[1:, b], sz[:-1, b], sz[1:, b]
        pa0, pa1, qa0, qa1 = px[:-1, a], px[1:, a], sz[:-1, a], sz[1:, a]
        ofi[1:] += (pb1 >= pb0) * qb1 - (pb1 <= pb0) * qb0 - (pa1 <= pa0) * qa1 + (pa1 >= pa0) * qa0
    ts = records["ts_recv"].astype(np.int64)
    second = (ts - ts[0]) // 1_000_000_000
    bars = int(second[-1]) + 1
    bar_ofi: npt.NDArray[np.float64] = np.bincount(second, weights=ofi, minlength=bars).astype(np.float64)
    mid = (px[:, 0] + px[:, LEVELS]) / (2 * TICK)
    last = np.zeros(bars, dtype=np.int64)
    last[second] = np.arange(len(records))  # the last record of each bar wins
    last = np.maximum.accumulate(np.where(np.isin(np.arange(bars), second), last, 0))
    close = mid[last]
    bar_return: npt.NDArray[np.float64] = np.diff(close, prepend=mid[0]).astype(np.float64)
    return bar_ofi, bar_return


def _lead_statistics(records: npt.NDArray[np.void]) -> tuple[float, float, int]:
    """Correlation of bar OFI with the next bar's return, its heteroskedasticity-robust t-stat,
    and the number of bar pairs."""
    ofi, ret = _one_second_bars(records)
    x, y = ofi[:-1], ret[1:]
    x = x - x.mean()
    product = x * (y - y.mean())
    t = float(product.mean() / (product.std() / np.sqrt(len(product))))
    return float(np.corrcoef(x, y)[0, 1]), t, len(product)


def test_planted_signal_order_flow_leads_returns(with_signal: npt.NDArray[np.void]) -> None:
    corr, t, n = _lead_statistics(with_signal)
    assert n > 20_000
    assert corr > 0.15
    assert t > 10


def test_without_signal_the_lead_is_indistinguishable_from_zero(no_signal: npt.NDArray[np.void]) -> None:
    corr, t, n = _lead_statistics(no_signal)
    assert abs(t) < 3
    assert abs(corr) < 4 / np.sqrt(n)
    # And past returns do not predict the next one either (martingale mid).
    _, ret = _one_second_bars(no_signal)
    product = (ret[:-1] - ret.mean()) * (ret[1:] - ret.mean())
    assert abs(product.mean() / (product.std() / np.sqrt(len(product)))) < 3


@pytest.mark.parametrize("name", ["with_signal", "no_signal"])
def test_books_are_valid(name: str, request: pytest.FixtureRequest) -> None:
    records: npt.NDArray[np.void] = request.getfixturevalue(name)
    px, sz, ct = _levels(records, "px"), _levels(records, "sz"), _levels(records, "ct")
    assert 100_000 < len(records) < 200_000
    assert np.all(px[:, 0] < px[:, LEVELS])
    assert np.all(np.diff(px[:, :LEVELS], axis=1) == -TICK)
    assert np.all(np.diff(px[:, LEVELS:], axis=1) == TICK)
    assert np.all(px[:, LEVELS] - px[:, 0] <= 2 * TICK)
    assert np.all(px % TICK == 0) and np.all(records["price"] % TICK == 0)
    assert np.all(sz >= 1) and np.all((ct >= 1) & (ct <= sz))
    assert np.all(records["size"] >= 1)
    ts = records["ts_recv"].astype(np.int64)
    assert np.all(np.diff(ts) >= 0) and np.all(records["ts_event"] < records["ts_recv"])
    assert np.array_equal(records["sequence"], np.arange(1, len(records) + 1))
    assert set(np.unique(records["action"])) == {b"A", b"C", b"M", b"T"}
    assert set(np.unique(records["side"])) == {b"A", b"B"}
    assert np.all(records["instrument_id"] == ES.instrument_id)


def test_each_book_event_explains_the_book_change(with_signal: npt.NDArray[np.void]) -> None:
    """Where the best prices did not move, exactly one level changed, by the event's size, in
    the direction of its action; and each price move is a trade that empties the best level
    followed at the same timestamp by the remainder resting on the other side."""
    r = with_signal
    px, sz = _levels(r, "px"), _levels(r, "sz")
    same = np.all(px[1:] == px[:-1], axis=1)
    change = (sz[1:] - sz[:-1])[same]
    action, size = r["action"][1:][same], r["size"][1:][same].astype(np.int64)
    assert np.all(np.count_nonzero(change, axis=1) == 1)
    total = change.sum(axis=1)
    assert np.array_equal(np.abs(total), size)
    assert np.all(total[action == b"A"] > 0)
    assert np.all(total[(action == b"C") | (action == b"T")] < 0)
    moved = np.flatnonzero(~same) + 1
    first = moved[r["flags"][moved] == 0]
    assert len(first) > 100
    assert np.all(r["action"][first] == b"T") and np.all(r["action"][first + 1] == b"A")
    assert np.array_equal(r["ts_recv"][first], r["ts_recv"][first + 1])
    assert np.all(px[first, LEVELS] - px[first, 0] == 2 * TICK)  # spread two ticks in between


def test_calm_and_active_regimes_with_a_long_calm_stretch(with_signal: npt.NDArray[np.void]) -> None:
    _, ret = _one_second_bars(with_signal)
    rv = np.add.reduceat(ret**2, np.arange(0, len(ret), 300))  # realised variance per 5 minutes
    low, high = np.quantile(rv, 0.1), np.quantile(rv, 0.9)
    assert high > 8 * low
    calm = rv < np.sqrt(low * high)
    runs = np.diff(np.flatnonzero(np.diff(np.concatenate(([0], calm.astype(np.int8), [0])))))[::2]
    assert runs.max() * 5 >= 120, "expected a calm stretch of at least two hours"
    assert (~calm).sum() * 5 >= 30, "expected active stretches"


def test_files_are_deterministic_with_metadata_and_symbology(tmp_path: Path) -> None:
    instruments = [
        InstrumentSpec(symbol="ES", instrument_id=1001, session_start="14:00", session_end="14:20"),
        InstrumentSpec(symbol="NQ", instrument_id=1002, session_start="14:10", session_end="14:30"),
    ]
    synth = SynthConfig(days=2, start_date="2024-03-08")  # a Friday: the next day is Monday
    a = write_synthetic(tmp_path / "a", instruments=instruments, synth=synth, seed=5)
    b = write_synthetic(tmp_path / "b", instruments=instruments, synth=synth, seed=5)
    c = write_synthetic(tmp_path / "c", instruments=instruments, synth=synth, seed=6)
    assert [p.name for p in a] == [synth_file_name("SYNTH", dt.date(2024, 3, d)) for d in (8, 11)]
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert a[0].read_bytes() != c[0].read_bytes()
    for path, day in zip(a, (dt.date(2024, 3, 8), dt.date(2024, 3, 11)), strict=True):
        store = databento.DBNStore.from_bytes(path.read_bytes())
        assert str(store.schema) == "mbp-10" and store.dataset == "SYNTH"
        assert {s: m[0]["symbol"] for s, m in store.symbology["mappings"].items()} == {
            "ES": "1001",
            "NQ": "1002",
        }
        records = np.asarray(store.to_ndarray())
        assert set(np.unique(records["instrument_id"])) == {1001, 1002}
        assert np.all(np.diff(records["ts_recv"].astype(np.int64)) >= 0)
        info = read_metadata(path)
        assert info.start_ns == session_bounds(instruments[0], day)[0]
        assert info.end_ns == session_bounds(instruments[1], day)[1]
        for spec in instruments:
            own = records[records["instrument_id"] == spec.instrument_id]
            lo, hi = session_bounds(spec, day)
            assert np.all((own["ts_recv"] >= lo) & (own["ts_recv"] < hi))
    # Monday opens where Friday closed.
    days = [read_mbp10(path) for path in a]
    friday, monday = (d[d["instrument_id"] == 1001] for d in days)
    assert abs(int(monday["bid_px_00"][0]) - int(friday["bid_px_00"][-1])) <= 2 * TICK


def test_trading_days_skip_weekends_and_sessions_may_cross_midnight() -> None:
    assert trading_days(dt.date(2024, 3, 8), 3) == [dt.date(2024, 3, d) for d in (8, 11, 12)]
    overnight = InstrumentSpec(symbol="CL", instrument_id=7, session_start="23:00", session_end="22:00")
    start, end = session_bounds(overnight, dt.date(2024, 3, 11))
    assert (end - start) // 1_000_000_000 == 23 * 3600
    assert dt.datetime.fromtimestamp(start // 1_000_000_000, tz=dt.UTC).day == 10


def test_synth_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["synth", "--out", str(tmp_path), "--days", "1", "--instruments", "NQ", "--seed", "3"]
    args += ["--signal", "0", "--start", "2024-03-08", "--events-per-second", "0.5", "--json"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["instruments"] == ["NQ"] and summary["signal"] == 0.0 and summary["seed"] == 3
    (path,) = (Path(p) for p in summary["files"])
    assert path.name == "synth-mbp-10-20240308.dbn.zst"
    assert len(read_mbp10(path)) == summary["records"] > 1000
    assert read_metadata(path).symbols == {1002: "NQ"}


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--instruments", "ES,ZZ"], "unknown ZZ"),
        (["--days", "0"], "bad option"),
        (["--start", "2024-13-01"], "not a date"),
        (["--events-per-second", "-1"], "bad option"),
    ],
)
def test_synth_command_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: list[str], message: str
) -> None:
    assert main(["synth", "--out", str(tmp_path), *option]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
