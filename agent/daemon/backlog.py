"""The daemon's ordered ledger write queue: bounded in memory, spilled to an append-only file.

Every ledger write of the daemon that must not be lost (a venue report, the rows of orders sent
to the paper broker) enters this one queue and is persisted from its head, in order, by the
daemon's writes task (:mod:`agent.daemon.writes`). While the database refuses writes (unavailable,
disk full) the entries wait here:

* Up to ``daemon.write_queue`` of them in memory. When one more arrives, every pending entry is
  written to the **spill file** ``<daemon.spill_dir>/ledger-spill.jsonl`` (a header line naming
  the database and the account, then one JSON line per entry in the wire messages' own
  encoding) and from then on new entries are appended to it. The file holds every pending
  entry (behind those already persisted); memory holds a window at its head, refilled from the
  file as the head is persisted; the file is removed once everything in it is persisted.
* :meth:`Backlog.spill` puts every pending entry in the file at once, whatever the bound: the
  daemon calls it when the database's disk is full (space comes back when someone frees it, not
  in milliseconds), so that a process killed meanwhile loses nothing it was told.
* :meth:`Backlog.keep` (the stop path) rewrites the file with exactly the pending entries and
  fsyncs it (when the rewrite cannot be written, an existing file that holds every pending entry
  is fsynced as it is); :meth:`Backlog.adopt` (the next start) takes a previous process's file
  as the queue, which the daemon persists before it reads the ledger back and trades. Persisting
  an entry twice is harmless: orders are keyed by client order id, fills by fill id, and an
  order update repeated changes nothing (a terminal state is kept).
* When the file cannot be written (its disk full too, permissions), entries stay in memory past
  the bound, behind the file's, until the queue has emptied: never dropped (logged). A full
  disk under a SQLite ledger fills the spill file's disk too when both are one filesystem, so
  :meth:`Backlog.adopt` warns at start when they are (see :func:`shared_disk`).

A new spill file is written, owner-only (0600: it holds the account's orders and fills), to a
temporary file and renamed into place; appends are plain ``write`` calls: a process kill loses
nothing that was written. :meth:`Backlog.spill` and :meth:`Backlog.keep` also fsync the file and
its directory, so that what they wrote survives a power loss.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from agent.daemon.config import DaemonConfig
from agent.errors import AgentError
from agent.execution.protocol import Ack, Cancelled, Fill, Reject
from storage.values import LedgerOrder

__all__ = [
    "Backlog",
    "Entry",
    "OrderRows",
    "SpillError",
    "SpillHeader",
    "read_spill",
    "shared_disk",
    "spill_path",
]

log = logging.getLogger(__name__)

SPILL_NAME = "ledger-spill.jsonl"
_VERSION = 1
_COPY_CHUNK = 1 << 20


class OrderRows(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="orders"):
    """Ledger rows of orders already sent to the paper broker, waiting for their commit."""

    rows: tuple[LedgerOrder, ...]


Entry = Ack | Reject | Fill | Cancelled | OrderRows
"""One ledger write: a venue report, or the rows of orders sent to the paper broker."""

_KINDS: dict[type, str] = {
    OrderRows: "orders",
    Ack: "acks",
    Fill: "fills",
    Cancelled: "cancels",
    Reject: "rejects",
}


class SpillHeader(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="spill"):
    """The spill file's first line: whose writes it holds."""

    version: int
    database: str
    """The database the writes belong to (its URL, password hidden)."""
    account: str


class SpillError(AgentError):
    """The spill file or its directory cannot be used; the message names the path and the remedy."""


_encoder = msgspec.json.Encoder()
_entry_decoder = msgspec.json.Decoder(Entry)
_header_decoder = msgspec.json.Decoder(SpillHeader)


def spill_path(config: DaemonConfig, data_dir: str) -> Path:
    """The spill file: in ``daemon.spill_dir``, by default ``<data_dir>/spill``."""
    return Path(config.spill_dir or Path(data_dir) / "spill") / SPILL_NAME


def shared_disk(spill_dir: Path, database_file: Path | None) -> str | None:
    """The start's warning when ``spill_dir`` is on the filesystem of a SQLite ledger
    (``database_file``; ``None`` for a server database), else ``None``.

    A warning, not a refusal: the default layout (``<data_dir>/spill`` beside
    ``<data_dir>/tradeagent.db``) is one filesystem, and the spill file still carries the
    writes while the database is unavailable or locked and at a stop past its deadline; only a
    full disk under the ledger takes the spill file's room too, and then the pending writes
    live in memory until space is freed (lost if the process is killed meanwhile)."""
    if database_file is None:
        return None
    try:
        same = spill_dir.stat().st_dev == database_file.parent.stat().st_dev
    except OSError:
        return None
    if not same:
        return None
    return (
        f"daemon.spill_dir {spill_dir} is on the filesystem of the SQLite ledger {database_file}: "
        "if that disk fills, the ledger writes the database refuses cannot be spilled either and "
        "wait in memory (a kill loses them); set daemon.spill_dir to a directory on another disk"
    )


def read_spill(path: Path) -> tuple[SpillHeader, Iterator[Entry]]:
    """A spill file's header and an iterator over its entries, in order. :class:`SpillError`
    names the file and the line that is not a header or a ledger write."""
    with path.open("rb") as file:
        first = file.readline()
    try:
        header = _header_decoder.decode(first)
    except msgspec.DecodeError as exc:
        raise SpillError(
            f"{path}: line 1 is not a spill file header ({exc}): it is not a spill file of "
            "tradeagent; move it out of daemon.spill_dir"
        ) from None
    return header, _entries(path)


def _entries(path: Path) -> Iterator[Entry]:
    with path.open("rb") as file:
        file.readline()
        for number, line in enumerate(file, 2):
            try:
                yield _entry_decoder.decode(line)
            except msgspec.DecodeError as exc:
                raise SpillError(
                    f"{path}: line {number} is not a ledger write ({exc}); a last line cut short "
                    "was being written when the process died: remove it to start (the lines "
                    "before it are kept)"
                ) from None


def _line(message: Entry | SpillHeader) -> bytes:
    return _encoder.encode(message) + b"\n"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _open(path: Path) -> tuple[int, BinaryIO]:
    """The spill file for appends (a descriptor) and for reading."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        return fd, path.open("rb")
    except OSError:
        os.close(fd)
        raise


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Backlog:
    """The ordered queue of pending ledger writes (see the module docstring).

    ``append`` at the tail, ``head`` and ``popleft`` (once persisted) at the head; iterating
    gives the entries in memory, oldest first (the head's window). ``reported`` counts, per
    client order id, the venue reports waiting here: such an order was answered by its venue.
    """

    def __init__(self, path: Path, bound: int, *, account: str) -> None:
        self.path = path
        self.bound = bound
        self.account = account
        self.database = ""
        """The database named in the header of a new spill file (set by :meth:`adopt`)."""
        self.reported: collections.Counter[str] = collections.Counter()
        self.kinds: collections.Counter[str] = collections.Counter()
        """What waits, by kind: order rows (``orders``: an entry holds a decision's orders, one or
        more), acks, fills, cancels, rejects."""
        self._memory: collections.deque[tuple[Entry, int]] = collections.deque()
        """The head of the queue; each entry with its line's length in the file (0: not in it)."""
        self._tail: collections.deque[Entry] = collections.deque()
        """Entries behind the file's, kept in memory because appending to it failed."""
        self._fd: int | None = None
        """The spill file, open for appends, while there is one."""
        self._reader: BinaryIO | None = None
        self._consumed = 0
        """Offset of the first pending entry's line in the file."""
        self._loaded = 0
        """Offset after the last line loaded into memory."""
        self._end = 0
        self._unloaded = 0
        """Entries in the file behind the memory window."""
        self._spill_failed = False

    def __len__(self) -> int:
        return len(self._memory) + self._unloaded + len(self._tail)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __iter__(self) -> Iterator[Entry]:
        return (entry for entry, _ in self._memory)

    @property
    def spilling(self) -> bool:
        """True while a spill file holds pending entries."""
        return self._fd is not None

    def describe(self) -> dict[str, Any]:
        """What ``tradeagent ctl status`` shows as ``ledger_backlog``."""
        return {
            "pending": len(self),
            "in_memory": len(self._memory) + len(self._tail),
            "spill_file": str(self.path) if self.spilling else "",
            "kinds": dict(self.kinds),
        }

    # -- queue ---------------------------------------------------------------------------------

    def append(self, entry: Entry) -> None:
        """Queue ``entry`` behind every pending one: in memory while there is room, else in the
        spill file (in memory behind the file's entries when the file cannot be written)."""
        self._count(entry, 1)
        if self._fd is None and len(self._memory) >= self.bound and not self._spill_failed:
            try:
                self._spill(durable=False)
            except SpillError as exc:
                self._spill_failed = True
                log.error("%s; the ledger writes stay in memory, past daemon.write_queue", exc)
        if self._fd is None:
            self._memory.append((entry, 0))
        elif self._tail or not self._write(entry):
            self._tail.append(entry)

    def head(self) -> Entry:
        """The oldest pending entry (read from the spill file when the memory window is empty);
        :class:`SpillError` when the file cannot be read."""
        if not self._memory:
            self._load()
        return self._memory[0][0]

    def popleft(self) -> Entry:
        """Take the head entry off the queue: it has been persisted. The spill file goes once
        every entry in it has."""
        if not self._memory:
            self._load()
        entry, size = self._memory.popleft()
        self._count(entry, -1)
        self._consumed += size
        if not self._memory and not self._unloaded and self._fd is not None:
            self._close_file(remove=True)
            log.info("%s: every ledger write it held is persisted; removed", self.path)
            self._memory.extend((e, 0) for e in self._tail)
            self._tail.clear()
        if not self:
            self._spill_failed = False
        return entry

    def spill(self) -> None:
        """Put every pending entry in the spill file now, whatever the bound (fsynced), and
        append the next ones to it: the database's disk is full, and a process killed before it
        takes them again must lose nothing. Nothing to do while the file holds them already;
        when it cannot be written the entries stay in memory (logged once per backlog)."""
        if self._fd is not None or not self or self._spill_failed:
            return
        try:
            self._spill(durable=True)
        except SpillError as exc:
            self._spill_failed = True
            log.error("%s; the %d pending ledger writes stay in memory only", exc, len(self))

    def _count(self, entry: Entry, step: int) -> None:
        kind = _KINDS[type(entry)]
        self.kinds[kind] += step * len(entry.rows) if isinstance(entry, OrderRows) else step
        if not self.kinds[kind]:
            del self.kinds[kind]
        if not isinstance(entry, OrderRows):
            self.reported[entry.client_order_id] += step
            if not self.reported[entry.client_order_id]:
                del self.reported[entry.client_order_id]

    def _spill(self, *, durable: bool) -> None:
        """No spill file yet: every pending entry (all in memory) goes to a new one."""
        entries = [entry for entry, _ in self._memory]
        lines = [_line(entry) for entry in entries]
        self._rewrite(lines, durable=durable)
        self._memory = collections.deque(zip(entries, map(len, lines), strict=True))
        self._loaded = self._end
        log.warning("%d ledger writes pending: spilled to %s", len(entries), self.path)

    def _write(self, entry: Entry) -> bool:
        """Append ``entry`` to the spill file; False (logged) when the file cannot take it."""
        assert self._fd is not None
        line = _line(entry)
        try:
            _write_all(self._fd, line)
        except OSError as exc:
            self._spill_failed = True
            log.error(
                "%s: cannot append to the spill file (%s); newer ledger writes stay in memory", self.path, exc
            )
            return False
        self._end += len(line)
        if self._unloaded or len(self._memory) >= self.bound:
            self._unloaded += 1
        else:
            self._memory.append((entry, len(line)))
            self._loaded = self._end
        return True

    def _load(self) -> None:
        """Refill the memory window with the next entries of the spill file."""
        assert self._reader is not None and self._unloaded
        try:
            self._reader.seek(self._loaded)
            while self._unloaded and len(self._memory) < self.bound:
                line = self._reader.readline()
                entry = _entry_decoder.decode(line)
                self._memory.append((entry, len(line)))
                self._loaded += len(line)
                self._unloaded -= 1
        except (OSError, msgspec.DecodeError) as exc:
            raise SpillError(
                f"{self.path}: cannot read the pending ledger writes back at offset {self._loaded} ({exc}); "
                "they stay in the file: the next start replays them"
            ) from None

    # -- the file across processes ---------------------------------------------------------------

    def adopt(self, database: str, *, database_file: Path | None = None) -> int:
        """At start, before anything is queued: create ``spill_dir`` (0700) if needed, warn when
        it shares the filesystem of the SQLite ledger ``database_file`` (:func:`shared_disk`)
        and take a previous process's spill file as the queue, validated whole (a header of this
        ``database`` and account, then ledger writes only). Returns how many entries it holds.
        :class:`SpillError` names the file or directory and the remedy."""
        self.database = database
        directory = self.path.parent
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise SpillError(f"daemon.spill_dir: cannot create {directory}: {exc}") from None
        if not os.access(directory, os.W_OK | os.X_OK):
            raise SpillError(
                f"daemon.spill_dir: {directory} is not writable by this user: fix its permissions "
                "or set another directory"
            )
        warning = shared_disk(directory, database_file)
        if warning is not None:
            log.warning("%s", warning)
        try:
            self._temporary().unlink(missing_ok=True)  # a rewrite the previous process did not finish
            if not self.path.exists():
                return 0
            header, entries = read_spill(self.path)
            if (header.database, header.account) != (database, self.account):
                raise SpillError(
                    f"{self.path} holds the ledger writes of account {header.account!r} for "
                    f"{header.database}, not this daemon's (account {self.account!r}, {database}): "
                    "start the daemon of that database and account to replay them, or move the file aside"
                )
            count = 0
            for entry in entries:
                self._count(entry, 1)
                count += 1
            if not count:
                self.path.unlink()
                return 0
            self._fd, self._reader = _open(self.path)
            self._end = self.path.stat().st_size
        except OSError as exc:
            raise SpillError(f"{self.path}: cannot read the spill file: {exc}") from None
        self._consumed = self._loaded = len(_line(header))
        self._unloaded = count
        return count

    def keep(self) -> int:
        """The stop path: rewrite the spill file with exactly the pending entries, fsynced, for
        the next start to replay (none pending: no file). Returns how many it holds. When the
        rewrite cannot be written but the file holds every pending entry already (nothing waits
        behind it in memory), that file is fsynced and kept as it is: the entries before the
        pending ones were persisted, and the next start persisting them again changes nothing.
        :class:`SpillError` when the pending entries cannot all be kept (they stay where they
        were)."""
        if not self:
            if self._fd is not None:
                self._close_file(remove=True)
            return 0
        if self._fd is None:
            self._spill(durable=True)
            self._spill_failed = False
            return len(self)
        tail = list(self._tail)
        try:
            self._rewrite(itertools.chain(self._pending_bytes(), (_line(e) for e in tail)), durable=True)
        except SpillError as exc:
            if tail:
                raise
            self._sync_in_place(exc)
            return len(self)
        self._loaded = self._consumed + sum(size for _, size in self._memory)
        self._unloaded += len(tail)
        self._tail.clear()
        self._spill_failed = False
        return len(self)

    def _sync_in_place(self, failed: SpillError) -> None:
        """:meth:`keep`'s fallback: fsync the spill file as it stands (it holds every pending
        entry); :class:`SpillError` when even that fails."""
        assert self._fd is not None
        try:
            os.fsync(self._fd)
        except OSError as exc:
            raise SpillError(f"{self.path}: cannot write the spill file: {exc}") from None
        log.warning(
            "%s (%s): kept as it is, fsynced; it holds the pending ledger writes behind some already "
            "persisted, which the next start writes again (changing nothing)",
            self.path,
            failed,
        )

    def close(self) -> None:
        """Close the spill file (it stays, with what it holds)."""
        self._close_file(remove=False)

    def _pending_bytes(self) -> Iterator[bytes]:
        """The spill file's lines from the first pending entry on."""
        assert self._reader is not None
        self._reader.seek(self._consumed)
        left = self._end - self._consumed
        while left > 0:
            chunk = self._reader.read(min(left, _COPY_CHUNK))
            if not chunk:
                raise OSError(f"{self.path} is shorter than the {self._end} bytes written to it")
            left -= len(chunk)
            yield chunk

    def _temporary(self) -> Path:
        return self.path.with_name(self.path.name + ".tmp")

    def _rewrite(self, body: Iterable[bytes], *, durable: bool) -> None:
        """Write a header and ``body`` as the new spill file (a temporary file renamed into
        place; ``durable``: fsynced, and its directory after the rename) and switch to it; the
        offsets start after the header."""
        temporary = self._temporary()
        header = _line(SpillHeader(version=_VERSION, database=self.database, account=self.account))
        try:
            temporary.unlink(missing_ok=True)
            created = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            os.fchmod(created, 0o600)  # owner-only whatever the umask
            with os.fdopen(created, "wb") as out:
                out.write(header)
                for chunk in body:
                    out.write(chunk)
                out.flush()
                if durable:
                    os.fsync(out.fileno())
                size = out.tell()
            fd, reader = _open(temporary)
        except OSError as exc:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise SpillError(f"{self.path}: cannot write the spill file: {exc}") from None
        try:
            os.replace(temporary, self.path)
        except OSError as exc:
            os.close(fd)
            reader.close()
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise SpillError(f"{self.path}: cannot write the spill file: {exc}") from None
        self._close_file(remove=False)
        self._fd, self._reader = fd, reader
        self._consumed, self._end = len(header), size
        if not durable:
            return
        try:
            _fsync_dir(self.path.parent)
        except OSError as exc:  # the file is in place; only a power loss could still undo the rename
            log.warning("%s: directory not synced: %s", self.path.parent, exc)

    def _close_file(self, *, remove: bool) -> None:
        if self._fd is not None:
            os.close(self._fd)
        if self._reader is not None:
            self._reader.close()
        self._fd, self._reader = None, None
        self._consumed = self._loaded = self._end = 0
        if remove:
            try:
                self.path.unlink()
            except OSError as exc:
                log.warning(
                    "%s: persisted, but cannot be removed (%s): the next start replays it", self.path, exc
                )
