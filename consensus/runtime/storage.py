"""A replica's durable records: a checksummed append-only log in a locked data directory.

The driver hands `Ready.records` to `DurableLog.append`, calls `sync` when `Ready.must_sync` is
set, and only then lets `Ready.messages_after_persist` leave; `DurableLog.records()` is what a
restarted replica replays (`Replica.restore`). Every call blocks: the driver runs them in a
worker thread, one at a time (the log is not thread-safe).

The data directory holds `records.log` (format: `consensus.runtime.storage_format`) and
`cellar.lock` (`consensus.runtime.storage_lock`). Opening takes the lock, fdatasyncs the log
and fsyncs the directory (what a process killed before its fdatasync wrote, and a rename it
made but killed before the directory's fsync, are made durable before they are replayed as
durable), reads and checks the whole log, cuts off a torn tail (reported in `Recovery.lines()`
and the log), and refuses anything else that is wrong (`consensus.runtime.storage_errors`). A
log of an older format version is rewritten in the current one as it is opened, the way
compaction rewrites one, so every frame appended is of the current version. A failed write or
fsync makes the log refuse every later call: the replica must stop. It first cuts the file back
to where the last successful `sync` left it (best effort): after a failed fdatasync the kernel
may have marked the pages it could not write clean, so a restart in the same boot would read
the records of that batch from the page cache, and the open's fdatasync would report success
for them without writing them. They were never acknowledged (the driver stops before the
messages that promised them leave), so replaying them as durable, or refusing the log for a
page of them read back from the disk as a hole before valid frames, must not be the outcome.

Creating (`--init`): a log is made only in a directory that was not there or is empty. One
that holds other files but no log (its lock file, say) is a replica's whose log was lost, and
a new empty log there would make it forget its promises: it is refused, as without `--init`.

Compaction: once a snapshot record is durable and the file has grown by
`max(compact_after_bytes, size after the last compaction)` since the last compaction (or since
it was opened), `sync` rewrites the log as `compact_records(...)` (with a new salt) into
`records.log.compacting`, fsyncs it, renames it over `records.log` and fsyncs the directory. A
crash before the rename leaves the old log whole (the leftover is removed on open); after it,
the new one, which replays to the same replica. Growth of at least the compacted size between
compactions bounds the rewriting to about one extra write of every byte appended.
`compaction_due` says beforehand whether the next `sync` will compact: the driver then runs
that sync in its worker thread, never on the event loop. An append that holds a snapshot,
once the file has grown that much, is itself the compaction: the old records and the new go
into `records.log.compacting` the same way, and are durable when it returns. The state, up
to a GiB, is then written once, not appended and rewritten at the next sync (under load on
the 2-core VM, a 147 MB snapshot took 0.7 to 2.4 s to append and 0.4 to 0.6 s more to
compact; written once, 0.7 s); a crash before the rename leaves the old log,
without the records of an append that never returned. The driver writes every Ready holding
a snapshot in its worker thread. A snapshot record's state is written as a part of its own
(`encode_records_parted`, `write_parts`), never copied into an encoding or a joined buffer.

Space written ahead. An fdatasync of records that made the file longer also commits the new
size (ext4 journals it): 113 to 200 µs here for one small append, against 89 to 125 µs when
the records land in space the file already has, written and synced beforehand (`cellar bench
storage`: 1.27 to 1.32 times the synced batches a second). Space reserved without being
written (fallocate) saves nothing once appends cross into new blocks: those extents are marked
written at each sync instead. So a synced log keeps up to `preallocate_bytes` of zeros,
synced, after its records: opening writes them, and when less than half is left, the next
`sync`, after its fdatasync of the records, writes zeros to `preallocate_bytes` past them and
syncs them (16 MiB: about 8 ms, once per 8 MiB appended; `sync_is_long` says so beforehand,
and the driver runs that sync in its worker thread). Appends are written at their offset
(pwritev), into those zeros; a record larger than the space left extends the file as before.
Reading stops at the zeros (`storage_format.scan` tells them from a torn tail) and keeps them;
a torn tail is cut off with them. A sync of more than `ZEROS_BATCH_BYTES_MAX` (64 KiB) of
records writes no zeros: under a load that batches that much, the few syncs a second gain less
than writing every byte twice costs (1 KB puts at full load, 200 a batch: in the second
phase of a probe, 1.5 to 3.9 µs of system CPU a put on each replica with zeros, 1.7 to 2.5
without), and the records extend the file until a smaller batch comes. A log that is not
synced (`synced=False`) writes no zeros: it would gain nothing. A failure to write or sync the
zeros fails the log as any other write: a disk that cannot take 16 MiB more is about to refuse
the records too.

Why a log and not SQLite. `cellar bench storage --runs 7` on the 2-core development VM (ext4
on a virtio disk that other jobs share); the same records (mostly C-accepts of one 110-byte
command) and codec for both, one fdatasync (the log) or one WAL commit with synchronous=FULL
(SQLite) per batch; medians:

| batch | log syncs/s | log records/s | SQLite syncs/s | SQLite records/s |
| ---: | ---: | ---: | ---: | ---: |
| 1 | 3,071 | 3,071 | 2,341 | 2,341 |
| 16 | 2,647 | 42,346 | 2,032 | 32,505 |
| 256 | 791 | 202,465 | 623 | 159,391 |

Opening 100k records: log 0.97 s, SQLite 1.34 s, decoding them alone 0.82 s (checking the
frames costs the log about 0.1 s). When the disk was busy (3 ms a sync) both fell to about 440
syncs/s at batch 1, within 2% of each other. So speed never argues for SQLite; what decides is
what each can promise when something goes wrong. The log tells a torn tail from damage and
names the offset; it refuses a length beyond the record cap before reading it; it never drops
a synced record. SQLite says "database disk image is malformed" without a place, and its WAL
is valid only up to the first frame whose checksum fails, so damage there discards the
committed transactions after it without a word: the silent truncation the design forbids.
Compaction by rename is simple on a log; in SQLite it is a DELETE plus a VACUUM.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from consensus.codec import decode_record, encode_records, encode_records_parted
from consensus.errors import InvalidMessage
from consensus.record_log import PROMISE_RECORDS, compact_records, holds_snapshot
from consensus.records import Record, SnapshotRecord
from consensus.runtime.data_identity import DataIdentity, claim
from consensus.runtime.durable_file import (
    fsync_directory,
    write_file_durably,
    write_parts,
    write_zeros,
)
from consensus.runtime.storage_errors import (
    DataDirectoryMissing,
    LogCorrupt,
    StorageError,
    StorageFailed,
)
from consensus.runtime.storage_format import (
    VERSION,
    FrameKey,
    frame_key,
    frame_parts,
    frames,
    header,
    new_salt,
    scan,
)
from consensus.runtime.storage_lock import DirectoryLock

LOG_NAME = "records.log"
COMPACTING_NAME = "records.log.compacting"
COMPACT_AFTER_BYTES = 16 << 20
PREALLOCATE_BYTES = 16 << 20  # zeros kept after the records of a synced log (docstring)
ZEROS_BATCH_BYTES_MAX = 64 << 10  # a sync of more writes no zeros (docstring)

logger = logging.getLogger(__name__)
logger.addHandler(logging.NullHandler())  # a library logs only where the application says


@dataclass(frozen=True, slots=True)
class Recovery:
    """What opening the log found, and the little it changed."""

    path: pathlib.Path
    records: int
    created: bool = False
    removed_compaction: bool = False
    torn_offset: int = 0
    torn_bytes: int = 0
    torn_reason: str = ""
    upgraded_from: int = 0  # the format version the log was rewritten from; 0 when it was not

    def lines(self) -> list[str]:
        """One line per thing an operator should know, for the caller to print."""
        found = []
        if self.created:
            found.append(f"{self.path}: created a new, empty record log")
        if self.removed_compaction:
            found.append(f"{self.path.parent / COMPACTING_NAME}: removed an unfinished "
                         f"compaction (a crash came before its rename; {self.path} is whole)")
        if self.torn_bytes:
            found.append(f"{self.path}: cut the last {self.torn_bytes} bytes off, from offset "
                         f"{self.torn_offset} ({self.torn_reason}): an append cut short by a "
                         "crash. It was never synced, so nothing acknowledged is lost.")
        if self.upgraded_from:
            found.append(f"{self.path}: rewrote the log (the same records) from format version "
                         f"{self.upgraded_from} in version {VERSION}")
        return found


@dataclass(frozen=True, slots=True)
class LogStatistics:
    records: int  # records in the file now (after compactions)
    size_bytes: int
    syncs: int
    compactions: int


class DurableLog:
    """The open log of one data directory; `open` is the constructor."""

    __slots__ = (
        "_compact_after_bytes",
        "_compacted_from",
        "_compacted_size",
        "_compactions",
        "_directory",
        "_failed",
        "_fd",
        "_key",
        "_lock",
        "_path",
        "_preallocate_bytes",
        "_records",
        "_recovered",
        "_size",
        "_snapshot_durable",
        "_snapshot_unsynced",
        "_synced",
        "_synced_size",
        "_syncs",
        "_unsynced",
        "_zeroed_end",
        "identity",
        "recovery",
    )

    def __init__(self, directory: pathlib.Path, lock: DirectoryLock, fd: int, *,
                 records: list[Record], size: int, key: FrameKey, recovery: Recovery,
                 compact_after_bytes: int, synced: bool, zeroed_end: int,
                 preallocate_bytes: int) -> None:
        self._directory = directory
        self._key = key  # what every frame appended to the file is made with
        self._synced = synced
        self._path = directory / LOG_NAME
        self._lock = lock
        self._fd = fd
        self._recovered: list[Record] | None = records
        self._records = list(records)
        self._size = size
        self._synced_size = size  # where the last successful sync left the file
        self._compacted_from = size  # growth is counted from here
        self._compacted_size = 0  # unknown until the first compaction
        self._compact_after_bytes = compact_after_bytes
        self._zeroed_end = zeroed_end  # the zeros written ahead end here (the file's end)
        self._preallocate_bytes = preallocate_bytes if synced else 0
        self._unsynced = False
        self._snapshot_unsynced = False
        self._snapshot_durable = _compaction_would_gain(records)
        self._failed: StorageError | None = None
        self._syncs = 0
        self._compactions = 0
        self.recovery = recovery
        # Whose directory this is, with its disk id; None where it was opened without one
        # (tests of the log itself).
        self.identity: DataIdentity | None = None

    @classmethod
    def open(cls, directory: pathlib.Path, *, create: bool,
             compact_after_bytes: int = COMPACT_AFTER_BYTES, synced: bool = True,
             identity: DataIdentity | None = None,
             preallocate_bytes: int = PREALLOCATE_BYTES) -> DurableLog:
        """Lock `directory`, check and load its log (creating both when `create`).

        `create` makes a log only where there is no directory yet, or an empty one: a directory
        that holds other files but no log is a replica's whose log was lost, refused as when
        `create` is not given.

        `synced=False` skips the fdatasync of appended records (compaction still syncs): writes
        reach the page cache only, so a power failure can lose acknowledged commands. It exists
        to compare with stores that do not sync; never run a real cluster that way.

        `identity`: the replica the directory must belong to (`data_identity.py`; a replica
        always gives it, and only tests of the log itself leave it out).

        `preallocate_bytes`: the zeros kept written ahead of the records (module docstring);
        0 writes none."""
        assert compact_after_bytes > 0 and preallocate_bytes >= 0
        directory = pathlib.Path(directory)
        may_create = _prepare_directory(directory, create=create)  # before the lock file
        lock = DirectoryLock.acquire(directory)
        try:
            if identity is not None:  # before the log: a stranger's is left untouched
                identity = claim(directory, identity)
            records, size, zeroed_end, key, recovery = _load(directory, may_create=may_create)
            fd = _open_for_writing(directory / LOG_NAME)
        except BaseException:
            lock.release()
            raise
        repaired = recovery.torn_bytes or recovery.removed_compaction
        for line in recovery.lines():
            logger.log(logging.WARNING if repaired else logging.INFO, "%s", line)
        log = cls(directory, lock, fd, records=records, size=size, key=key,
                  recovery=recovery, compact_after_bytes=compact_after_bytes, synced=synced,
                  zeroed_end=zeroed_end, preallocate_bytes=preallocate_bytes)
        log.identity = identity
        if log._zeros_wanted():  # before any record: the first syncs are short too
            try:
                log._write_zeros_ahead()
            except BaseException:
                log.close()
                raise
        return log

    @property
    def path(self) -> pathlib.Path:
        return self._path

    def records(self) -> list[Record]:
        """Everything that was durable when the log was opened, in order.

        Handed over once: the log keeps no reference to them afterwards, so the records a
        replica was restored from are not held for the life of the process."""
        if self._recovered is None:
            raise RuntimeError("DurableLog.records() hands the opened records over only once")
        recovered, self._recovered = self._recovered, None
        return recovered

    def append(self, records: Sequence[Record]) -> None:
        """Write `records` after the others; they are durable only once `sync` returns.

        Records holding a snapshot, once the file has grown enough to compact, go straight
        into the compacted log, durable on return: the state is written once, where appending
        it and compacting at the next sync wrote it twice (hundreds of MB each)."""
        self._check_usable()
        if not records:
            return
        snapshot = holds_snapshot(records)
        # A snapshot's state stays a part of its own, not copied into its record's encoding.
        payloads = encode_records_parted(records) if snapshot else encode_records(records)
        parts = frame_parts(payloads, self._key)
        size = sum(map(len, parts))
        if snapshot and self._grown_to_compact(size):
            self._compact([*self._records, *records])
            return
        try:
            write_parts(self._fd, parts, self._size)  # into the zeros written ahead, if any
        except OSError as error:
            self._cut_unsynced()
            raise self._fail(StorageFailed(self._path, "appending records", error)) from error
        self._records.extend(records)
        self._size += size
        self._unsynced = True
        if snapshot:
            self._snapshot_unsynced = True

    @property
    def compaction_due(self) -> bool:
        """Whether the next `sync` rewrites the log: records wait for it, a snapshot is or will
        then be durable, and the file has grown enough since the last compaction."""
        return self._unsynced and (self._snapshot_durable or self._snapshot_unsynced) and \
            self._grown_to_compact(0)

    @property
    def sync_is_long(self) -> bool:
        """Whether the next `sync` does more than an fdatasync of the records: it compacts the
        log, or writes the next stretch of zeros ahead of them (milliseconds: never on the
        event loop)."""
        return self.compaction_due or \
            (self._unsynced and self._small_batch() and self._zeros_wanted())

    def _zeros_wanted(self) -> bool:
        """Whether less than half of `preallocate_bytes` is left written ahead."""
        return self._preallocate_bytes > 0 and \
            self._zeroed_end - self._size < self._preallocate_bytes // 2

    def _small_batch(self) -> bool:
        """Whether the records waiting for the next sync are few enough bytes for zeros
        ahead to pay (module docstring)."""
        return self._size - self._synced_size <= ZEROS_BATCH_BYTES_MAX

    def _grown_to_compact(self, appending_bytes: int) -> bool:
        """Whether the file, with `appending_bytes` more, has grown enough since the last
        compaction to be compacted again (module docstring)."""
        grown = self._size + appending_bytes - self._compacted_from
        return grown >= max(self._compact_after_bytes, self._compacted_size)

    def sync(self, *, always: bool = False) -> None:
        """Make every appended record durable (fdatasync), then compact if that is due.
        `always`: fdatasync even in a log opened with `synced=False`, for the records a node
        writes before its core starts (a rejoin, a start's epoch), which its peers' checks
        count on being on disk."""
        self._check_usable()
        if not self._unsynced:
            return
        compact, small_batch = self.compaction_due, self._small_batch()
        try:
            if self._synced or always:
                _datasync(self._fd)
        except OSError as error:
            self._cut_unsynced()  # never retried: module docstring
            raise self._fail(StorageFailed(self._path, "fdatasync", error)) from error
        self._unsynced = False
        self._synced_size = self._size
        self._syncs += 1
        if self._snapshot_unsynced:
            self._snapshot_durable, self._snapshot_unsynced = True, False
        if compact:
            self._compact(self._records)
        if small_batch and self._zeros_wanted():
            self._write_zeros_ahead()

    def close(self) -> None:
        """Release the file and the lock; unsynced records may or may not survive."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._lock.release()

    def statistics(self) -> LogStatistics:
        return LogStatistics(len(self._records), self._size, self._syncs, self._compactions)

    def __enter__(self) -> DurableLog:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def _check_usable(self) -> None:
        assert self._fd >= 0, f"{self._path}: the log is used after close"
        if self._failed is not None:
            raise self._failed

    def _cut_unsynced(self) -> None:
        """Cut the file back to where the last successful sync left it, after a failed write or
        fdatasync (module docstring), best effort: the replica stops whatever happens here, and
        a cut that does not reach the disk leaves what a crash before the sync leaves."""
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, self._synced_size)
            os.fsync(self._fd)  # the cut's metadata, not a retry: the records stay refused

    def _fail(self, error: StorageError) -> StorageError:
        self._failed = error
        return error

    def _write_zeros_ahead(self) -> None:
        """Zeros, synced, from the end of those written ahead (or of the records) to
        `preallocate_bytes` past the records (module docstring)."""
        start = max(self._zeroed_end, self._size)
        end = self._size + self._preallocate_bytes
        try:
            write_zeros(self._fd, start, end - start)
            os.fsync(self._fd)  # the point is the metadata: the file's size and its extents
        except OSError as error:
            self._cut_unsynced()
            raise self._fail(StorageFailed(self._path, "writing zeros ahead of the records",
                                           error)) from error
        self._zeroed_end = end

    def _compact(self, records: list[Record]) -> None:
        """Rewrite the log as the compacted equivalent of `records` (every record in it and
        those being appended), which are all durable once it returns."""
        compacted = compact_records(records)
        salt = new_salt()  # a new file, a new salt
        parts = [header(salt), *frame_parts(encode_records_parted(compacted), frame_key(salt))]
        try:
            _replace_file(self._directory, self._path, parts)
            fd = _open_for_writing(self._path)
        except StorageError as error:
            raise self._fail(error) from error
        os.close(self._fd)
        self._fd = fd
        self._key = frame_key(salt)
        self._records = compacted
        self._size = self._synced_size = self._compacted_from = self._compacted_size = \
            self._zeroed_end = sum(map(len, parts))
        self._unsynced = self._snapshot_unsynced = self._snapshot_durable = False
        self._compactions += 1


def _compaction_would_gain(records: list[Record]) -> bool:
    """Whether a snapshot covers records that compaction would drop: a log it already
    compacted has nothing but promises before its last snapshot."""
    last = max((position for position, record in enumerate(records)
                if isinstance(record, SnapshotRecord)), default=None)
    return last is not None and not all(
        isinstance(record, PROMISE_RECORDS) for record in records[:last])


# --- Files -----------------------------------------------------------------------------------


def _prepare_directory(directory: pathlib.Path, *, create: bool) -> bool:
    """Check the data directory before its lock file is made there, creating it when `create`
    and it is not there; whether a log may be created in it: only when `create` and the
    directory was not there or is empty. A directory with other files (a lock file, an
    unfinished compaction) but no log is one whose log was lost: a new empty log there would
    make the replica forget its promises."""
    log = directory / LOG_NAME
    if directory.is_dir():
        if log.exists():
            return False
        if not create:
            raise DataDirectoryMissing.no_log(directory, log)
        try:
            others = sorted(os.listdir(directory))
        except OSError as error:
            raise StorageFailed(directory, "listing the data directory", error) from error
        if others:
            raise DataDirectoryMissing.no_log_among(directory, log, others)
        return True
    if directory.exists():
        raise DataDirectoryMissing(directory, f"{directory}: exists but is not a directory. "
                                              "Fix: point the replica at a directory.")
    if not create:
        raise DataDirectoryMissing.no_directory(directory)
    missing = [directory, *[parent for parent in directory.parents if not parent.exists()]]
    try:
        for made in reversed(missing):  # each new directory's entry durable in its parent
            made.mkdir()
            fsync_directory(made.parent)
    except OSError as error:
        raise StorageFailed(directory, "creating the data directory", error) from error
    return True


def _load(directory: pathlib.Path, *,
          may_create: bool) -> tuple[list[Record], int, int, FrameKey, Recovery]:
    """Read the log (creating an empty one when it may), cutting off a torn tail and rewriting
    a log of an older format version; its records, where they end, where the zeros written
    ahead of them end (the file's size), and its frame key."""
    path = directory / LOG_NAME
    leftover = directory / COMPACTING_NAME
    removed = leftover.exists()
    if removed:
        _remove(leftover, directory)
    created = not path.exists()
    if created:
        if not may_create:
            raise DataDirectoryMissing.no_log(directory, path)
        _replace_file(directory, path, header(new_salt()))
    # A process killed between its write and its fdatasync leaves records in the page cache
    # only: make them durable before replaying them as durable (a sync after the replay could
    # come too late, the replica having acted on them).
    _datasync_path(path)
    # Likewise the directory: a process killed between a rename and the directory's fsync (a
    # compaction's, this log's format rewrite, the identity file's) leaves the new name in the
    # page cache only. Records appended and synced to the new file would then be lost with
    # its name in a power failure, the old file coming back in its place.
    _fsync_directory(directory)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise StorageFailed(path, "reading the log", error) from error
    scanned = scan(data, path)
    records = [_decode(path, offset, payload) for offset, payload in scanned.payloads]
    size, key, upgraded_from = scanned.end, scanned.header.key, 0
    zeroed_end = size + scanned.zeroed_bytes
    if scanned.header.version != VERSION:
        # Rewritten as a compaction is (the torn tail, if any, left out), so that every frame
        # appended from now on is of the current version.
        salt = new_salt()
        key = frame_key(salt)
        rewritten = header(salt) + frames([payload for _, payload in scanned.payloads], key)
        _replace_file(directory, path, rewritten)
        size = zeroed_end = len(rewritten)
        upgraded_from = scanned.header.version
    elif scanned.torn:
        _truncate(path, scanned.end)
    recovery = Recovery(path, len(records), created=created, removed_compaction=removed,
                        torn_offset=scanned.end,
                        torn_bytes=len(data) - scanned.end if scanned.torn else 0,
                        torn_reason=scanned.torn, upgraded_from=upgraded_from)
    return records, size, zeroed_end, key, recovery


def _decode(path: pathlib.Path, offset: int, payload: bytes) -> Record:
    try:
        return decode_record(payload)
    except InvalidMessage as error:
        raise LogCorrupt(path, offset, f"a record whose checksum matches but which does not "
                                       f"decode ({error.reason})") from error


def _replace_file(directory: pathlib.Path, path: pathlib.Path,
                  data: bytes | list[bytes]) -> None:
    """Put a file holding `data` (bytes, or parts one after another) at `path` atomically
    and durably: write a temporary file, fsync it, rename it over `path`, fsync the
    directory."""
    temporary = directory / COMPACTING_NAME
    try:
        write_file_durably(temporary, data, 0o644)  # on failure the old file is whole
    except OSError as error:
        raise StorageFailed(temporary, "writing the new log", error) from error
    try:
        os.replace(temporary, path)
        fsync_directory(directory)
    except OSError as error:
        raise StorageFailed(path, "renaming the new log into place", error) from error


def _open_for_writing(path: pathlib.Path) -> int:
    """The log opened for writing at offsets (records go into the zeros written ahead, so
    not O_APPEND)."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except OSError as error:
        raise StorageFailed(path, "opening the log for appending", error) from error


def _truncate(path: pathlib.Path, size: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as error:
        raise StorageFailed(path, "cutting off the torn tail", error) from error


def _remove(path: pathlib.Path, directory: pathlib.Path) -> None:
    try:
        path.unlink()
        fsync_directory(directory)
    except OSError as error:
        raise StorageFailed(path, "removing an unfinished compaction", error) from error


def _fsync_directory(directory: pathlib.Path) -> None:
    try:
        fsync_directory(directory)
    except OSError as error:
        raise StorageFailed(directory, "fsync of the data directory before reading the log",
                            error) from error


def _datasync_path(path: pathlib.Path) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            _datasync(fd)
        finally:
            os.close(fd)
    except OSError as error:
        raise StorageFailed(path, "fdatasync before reading the log", error) from error


def _datasync(fd: int) -> None:
    sync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync
    sync(fd)
