"""The ordered ledger write queue on real files (``agent.daemon.backlog``):

* past its memory bound every pending entry goes to the spill file and later ones are appended
  to it; the head comes back in order, through the file, and the file goes once all is taken;
* ``keep`` (the stop path) leaves exactly the pending entries in the file, and a new queue that
  ``adopt``s it (the next start) gives them back in order with their kinds counted;
* a spill file of another database or account, or with a line that is not a ledger write, is
  refused with a message naming the file; a spill directory that cannot be written keeps the
  entries in memory past the bound, and ``keep`` writes them once it can;
* ``spill`` (a full database disk) puts every pending entry in the file (0600) at once, and a
  process killed then leaves a file the next start adopts whole; ``keep`` that cannot rewrite
  the file fsyncs it as it stands; a spill directory on the SQLite ledger's filesystem is
  warned about at start.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from agent.daemon.backlog import Backlog, Entry, OrderRows, SpillError, read_spill
from agent.execution.protocol import Ack, Cancelled, Fill
from storage.values import LedgerOrder

DATABASE = "sqlite:////var/lib/tradeagent/tradeagent.db"


def _entries(n: int) -> list[Entry]:
    """Orders, each followed by its ack, a fill and a cancel of the rest."""
    out: list[Entry] = []
    for k in range(n // 4):
        oid = f"s1-{k}"
        row = LedgerOrder(
            client_order_id=oid, instrument_id=1001, side="buy", qty=2, ts_ns=k, account="paper"
        )
        out += [
            OrderRows(rows=(row,)),
            Ack(seq=3 * k + 1, client_order_id=oid, ts_ns=k),
            Fill(
                seq=3 * k + 2,
                fill_id=f"f{k}",
                client_order_id=oid,
                instrument_id=1001,
                side="buy",
                qty=1,
                price=5_000_250_000_000,
                fee=0.1 + k / 3,
                leaves_qty=1,
                ts_ns=k,
            ),
            Cancelled(seq=3 * k + 3, client_order_id=oid, cancelled_qty=1, reason="ioc", ts_ns=k),
        ]
    return out


def _backlog(tmp_path: Path, bound: int = 3) -> Backlog:
    backlog = Backlog(tmp_path / "spill" / "ledger-spill.jsonl", bound, account="paper")
    assert backlog.adopt(DATABASE) == 0
    return backlog


def _drain(backlog: Backlog) -> list[Entry]:
    out = []
    while backlog:
        assert backlog.head() == next(iter(backlog))
        out.append(backlog.popleft())
    return out


def test_past_the_bound_entries_go_through_the_spill_file_in_order(tmp_path: Path) -> None:
    backlog = _backlog(tmp_path)
    entries = _entries(40)
    for entry in entries[:3]:
        backlog.append(entry)
    assert not backlog.spilling and not backlog.path.exists()
    for entry in entries[3:]:
        backlog.append(entry)
    assert backlog.spilling and len(backlog) == 40
    assert backlog.describe() == {
        "pending": 40,
        "in_memory": 3,
        "spill_file": str(backlog.path),
        "kinds": {"orders": 10, "acks": 10, "fills": 10, "cancels": 10},
    }
    assert backlog.reported["s1-0"] == 3  # its ack, fill and cancel wait: its venue answered
    _, stored = read_spill(backlog.path)
    assert list(stored) == entries  # every pending entry is in the file
    taken = [backlog.popleft() for _ in range(5)]  # persisted while more arrive
    more = _entries(48)[40:]
    for entry in more:
        backlog.append(entry)
    assert taken + _drain(backlog) == entries + more
    assert not backlog.spilling and not backlog.path.exists()  # removed once all is persisted
    assert backlog.describe()["kinds"] == {} and not backlog.reported
    backlog.append(entries[0])  # memory again until the bound
    assert not backlog.spilling and len(backlog) == 1


def test_keep_leaves_exactly_the_pending_entries_and_the_next_start_adopts_them(tmp_path: Path) -> None:
    backlog = _backlog(tmp_path)
    entries = _entries(24)
    for entry in entries:
        backlog.append(entry)
    for _ in range(7):
        backlog.popleft()
    assert backlog.keep() == 17
    header, stored = read_spill(backlog.path)
    assert (header.database, header.account) == (DATABASE, "paper")
    assert list(stored) == entries[7:]
    backlog.close()

    again = Backlog(backlog.path, 3, account="paper")
    assert again.adopt(DATABASE) == 17
    assert again.spilling and again.describe()["kinds"] == {"orders": 4, "acks": 4, "fills": 4, "cancels": 5}
    assert (again.reported["s1-1"], again.reported["s1-2"]) == (1, 3)  # s1-1's cancel; s1-2's three
    assert _drain(again) == entries[7:]
    assert not again.path.exists()


def test_keep_without_a_spill_file_writes_one_and_with_nothing_pending_removes_it(tmp_path: Path) -> None:
    backlog = _backlog(tmp_path, bound=100)
    entries = _entries(8)
    for entry in entries:
        backlog.append(entry)
    assert backlog.keep() == 8 and backlog.spilling
    assert list(read_spill(backlog.path)[1]) == entries
    assert _drain(backlog) == entries
    assert backlog.keep() == 0 and not backlog.path.exists()


def test_a_spill_file_of_another_ledger_or_with_a_bad_line_is_refused(tmp_path: Path) -> None:
    backlog = _backlog(tmp_path, bound=1)
    for entry in _entries(8):
        backlog.append(entry)
    backlog.keep()
    backlog.close()
    other = Backlog(backlog.path, 1, account="live")
    with pytest.raises(SpillError, match=r"ledger-spill\.jsonl holds the ledger writes of account 'paper'"):
        other.adopt(DATABASE)
    with pytest.raises(SpillError, match=re.escape(f"for {DATABASE}, not this daemon's")):
        Backlog(backlog.path, 1, account="paper").adopt("postgresql+psycopg://trader:***@db/ledger")
    lines = backlog.path.read_bytes().splitlines(keepends=True)
    backlog.path.write_bytes(b"".join(lines[:4]) + lines[4][:20])  # the last line cut short
    with pytest.raises(SpillError, match=r"ledger-spill\.jsonl: line 5 is not a ledger write"):
        Backlog(backlog.path, 1, account="paper").adopt(DATABASE)
    assert backlog.path.read_bytes().startswith(b"".join(lines[:4]))  # left as it was


def test_an_unwritable_spill_directory_keeps_the_entries_in_memory_until_keep_can_write(
    tmp_path: Path,
) -> None:
    backlog = _backlog(tmp_path, bound=2)
    directory = backlog.path.parent
    directory.rmdir()
    directory.write_text("not a directory")  # every file under it fails to open
    entries = _entries(12)
    for entry in entries:
        backlog.append(entry)
    assert not backlog.spilling and backlog.describe()["in_memory"] == 12  # past the bound, none lost
    with pytest.raises(SpillError, match=r"ledger-spill\.jsonl: cannot write the spill file"):
        backlog.keep()
    directory.unlink()
    directory.mkdir()
    assert backlog.keep() == 12
    assert list(read_spill(backlog.path)[1]) == entries
    assert _drain(backlog) == entries


def test_spill_puts_every_pending_entry_on_disk_at_once_owner_only(tmp_path: Path) -> None:
    """What the daemon does when the database's disk is full: the entries in memory go to the
    spill file whatever the bound, later ones are appended, and a process killed then (nothing
    closed, nothing kept) leaves a file the next start adopts whole."""
    previous = os.umask(0o022)
    try:
        backlog = _backlog(tmp_path, bound=10_000)
        entries = _entries(16)
        for entry in entries[:5]:
            backlog.append(entry)
        assert not backlog.spilling
        backlog.spill()
        assert backlog.spilling and stat.S_IMODE(backlog.path.stat().st_mode) == 0o600
        assert list(read_spill(backlog.path)[1]) == entries[:5]
        for entry in entries[5:]:
            backlog.append(entry)
        backlog.spill()  # already on disk: nothing changes
        assert backlog.describe()["pending"] == 16
    finally:
        os.umask(previous)
    after_kill = Backlog(backlog.path, 3, account="paper")
    assert after_kill.adopt(DATABASE) == 16  # the file as the appends left it: nothing kept or closed
    backlog.close()  # the killed process's descriptors, closed by the OS (the file stays)
    assert _drain(after_kill) == entries


def test_keep_fsyncs_the_file_as_it_stands_when_it_cannot_be_rewritten(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backlog = _backlog(tmp_path, bound=3)
    entries = _entries(12)
    for entry in entries:
        backlog.append(entry)
    for _ in range(5):
        backlog.popleft()
    before = backlog.path.read_bytes()
    blocked = backlog.path.with_name(backlog.path.name + ".tmp")
    blocked.mkdir()
    (blocked / "in-the-way").write_text("x")  # the rewrite's temporary file cannot be made
    assert backlog.keep() == 7
    assert backlog.path.read_bytes() == before
    assert "kept as it is, fsynced; it holds the pending ledger writes behind some already persisted" in (
        caplog.text
    )
    backlog.close()
    (blocked / "in-the-way").unlink()
    blocked.rmdir()
    again = Backlog(backlog.path, 3, account="paper")
    assert again.adopt(DATABASE) == 12  # the 5 persisted ones again (harmless), then the 7
    assert _drain(again) == entries


def test_a_spill_directory_on_the_ledgers_filesystem_is_warned_about_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    database_file = tmp_path / "tradeagent.db"
    backlog = Backlog(tmp_path / "spill" / "ledger-spill.jsonl", 3, account="paper")
    assert backlog.adopt(DATABASE, database_file=database_file) == 0
    assert (
        f"daemon.spill_dir {tmp_path / 'spill'} is on the filesystem of the SQLite ledger {database_file}"
    ) in caplog.text
    assert "set daemon.spill_dir to a directory on another disk" in caplog.text
    caplog.clear()
    server = Backlog(tmp_path / "spill2" / "ledger-spill.jsonl", 3, account="paper")
    assert server.adopt("postgresql+psycopg://trader:***@db/ledger", database_file=None) == 0
    assert "daemon.spill_dir" not in caplog.text  # a server database: nothing on this disk
