"""What can go wrong with a replica's data directory, said so an operator can act on it.

Every error names the file it is about and the fix, and carries the process exit status the
command line uses for it (`error.exit_code`, one distinct code per kind, after sysexits.h):

- `DataDirectoryMissing` (66): no data directory, or no log in it, and creating was not asked
  (or the directory holds other files, so it is not a new replica's);
- `DataDirectoryLocked` (75): another process holds the directory's lock;
- `LogCorrupt` (65): damage a crash cannot explain: a bad header, a bad checksum with valid
  records after it, a length beyond the cap, a checksummed record that does not decode;
- `LogVersionUnsupported` (76): an intact header of a format version this build cannot read;
- `DataDirectoryMismatch` (78): the directory is another replica's (`data_identity.py`);
- `DataDirectoryForgotten` (78): a peer heard this replica in a later life, or on another
  directory, than the one it opened: it was started over or restored (`peer_lives.py`);
- `StorageFailed` (74): a write, fsync or rename failed (disk full, EIO): the replica must stop.

None of them is a bug (those are `AssertionError`s); none is raised after data was changed to
make it go away: a log is only ever truncated at a torn tail, and that is reported, not raised.
"""

from __future__ import annotations

import errno
import os
import pathlib
from collections.abc import Sequence

EXIT_LOG_CORRUPT = 65
EXIT_DATA_DIRECTORY_MISSING = 66
EXIT_STORAGE_FAILED = 74
EXIT_DATA_DIRECTORY_LOCKED = 75
EXIT_LOG_VERSION_UNSUPPORTED = 76
EXIT_DATA_DIRECTORY_MISMATCH = 78  # EX_CONFIG: the configuration names another replica

_DELETING_IS_DANGEROUS = (
    "Do not simply delete the directory: the log holds this replica's promises (views, "
    "ballots, acceptances), and a replica that forgets them can let two different values be "
    "chosen, and one started over (an empty directory, or an older copy restored from a "
    "backup) reuses the command tags of its earlier incarnations, so commands run twice or "
    "are dropped as repeats: this holds even while every other replica keeps its log. Keep "
    "the directory as it is for diagnosis; the cluster serves on while a majority of its "
    "replicas runs. Only where the directory is truly lost, start the replica on a new, empty "
    "one with --rejoin while every other replica runs: it asks them what it promised before "
    "it takes part."
)

_FIXES = {
    errno.ENOSPC: "free space on its filesystem",
    errno.EDQUOT: "raise the disk quota or free space",
    errno.EFBIG: "raise the file size limit (ulimit -f) or free space",
    errno.EACCES: "give this user write access to the data directory",
    errno.EPERM: "give this user write access to the data directory",
    errno.EROFS: "mount the data directory's filesystem read-write",
    # data_dir under a file: a path to correct, not a disk to check
    errno.ENOTDIR: "point data_dir at a path whose every parent is a directory",
}


class StorageError(Exception):
    """Base of the data directory's environmental errors; `exit_code` is the process status."""

    exit_code = EXIT_STORAGE_FAILED

    def __init__(self, path: pathlib.Path, message: str) -> None:
        super().__init__(message)
        self.path = path


class DataDirectoryMissing(StorageError):
    """The data directory, or the log inside it, does not exist and creating it was not asked."""

    exit_code = EXIT_DATA_DIRECTORY_MISSING

    @classmethod
    def no_directory(cls, directory: pathlib.Path) -> DataDirectoryMissing:
        return cls(directory, f"{directory}: no such data directory. Fix: check the path, or "
                              "initialise a new replica there with --init (which creates it).")

    @classmethod
    def no_log(cls, directory: pathlib.Path, log: pathlib.Path) -> DataDirectoryMissing:
        return cls(log, f"{log}: the data directory {directory} holds no record log. Fix: for "
                        "a new replica, run with --init. If this replica ran here before, its "
                        f"log has been lost; {_DELETING_IS_DANGEROUS}")

    @classmethod
    def no_log_among(cls, directory: pathlib.Path, log: pathlib.Path,
                     names: Sequence[str]) -> DataDirectoryMissing:
        """--init on a directory that is not empty but holds no log: refused, not filled."""
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        return cls(log, f"{log}: the data directory {directory} holds no record log, yet it is "
                        f"not empty ({shown}), so --init does not create one there: a replica "
                        "has most likely run here and its log has been lost. Fix: for a new "
                        "replica, point data_dir at a directory that is empty or does not "
                        "exist yet (if a first start with --init was cut short before it made "
                        "the log, empty this directory and start again with --init). "
                        f"{_DELETING_IS_DANGEROUS}")


class DataDirectoryLocked(StorageError):
    """Another process (or another open log in this one) holds the directory's lock."""

    exit_code = EXIT_DATA_DIRECTORY_LOCKED

    def __init__(self, directory: pathlib.Path, lock: pathlib.Path, holder: int | None) -> None:
        who = f"process {holder}" if holder is not None else "another process"
        super().__init__(lock, f"{directory}: the data directory is in use by {who} (it holds "
                               f"the lock {lock}). Two replicas must never share a data "
                               "directory. Fix: stop the other process, or give this one its "
                               "own directory.")
        self.holder = holder


class LogCorrupt(StorageError):
    """The log is damaged somewhere a crash cannot explain; nothing was changed on disk."""

    exit_code = EXIT_LOG_CORRUPT

    def __init__(self, path: pathlib.Path, offset: int, problem: str) -> None:
        super().__init__(path, f"{path}: corrupt at byte offset {offset}: {problem}. Cellar "
                               "refused to open it and changed nothing. Fix: leave this "
                               "replica stopped and its directory untouched (check the disk: "
                               f"dmesg, SMART). {_DELETING_IS_DANGEROUS}")
        self.offset = offset
        self.problem = problem


class LogVersionUnsupported(StorageError):
    """An intact log header of a format version this build cannot read."""

    exit_code = EXIT_LOG_VERSION_UNSUPPORTED

    def __init__(self, path: pathlib.Path, found: int, supported: Sequence[int]) -> None:
        *earlier, last = [str(version) for version in supported]
        versions = f"{', '.join(earlier)} and {last}" if earlier else last
        super().__init__(path, f"{path}: record log format version {found}, but this build of "
                               f"Cellar reads versions {versions} only. Nothing was changed. "
                               "Fix: run the Cellar release that wrote it (or a newer one that "
                               f"reads it). {_DELETING_IS_DANGEROUS}")
        self.found = found


class DataDirectoryMismatch(StorageError):
    """The data directory names another replica as its owner; nothing was changed."""

    exit_code = EXIT_DATA_DIRECTORY_MISMATCH

    def __init__(self, path: pathlib.Path, *, found: str, configured: str) -> None:
        super().__init__(path, f"{path}: this data directory is {found}'s, but the "
                               f"configuration is {configured}'s. Cellar refused to open it "
                               "and changed nothing: a replica answering with another's log "
                               "could let two values be chosen for one instance. Fix: point "
                               "data_dir at this replica's own directory (or start the "
                               f"replica it belongs to there). {_DELETING_IS_DANGEROUS}")
        self.found = found
        self.configured = configured


class DataDirectoryForgotten(StorageError):
    """A peer heard this replica in a life its data directory does not hold: the directory
    was started over (empty, or another) or restored from an older copy."""

    exit_code = EXIT_DATA_DIRECTORY_MISMATCH

    def __init__(self, path: pathlib.Path, *, peer: int, reason: str) -> None:
        super().__init__(path, f"{path.parent}: replica {peer} heard this replica before, "
                               f"and {reason}. The replica stopped: it has forgotten promises "
                               "and acceptances a quorum may count on, and serving with them "
                               "forgotten could let two values be chosen for one instance. "
                               "Fix: start it on its own latest data directory if that still "
                               "exists (where only its identity.json was lost or rewritten, "
                               "the log intact, put back the disk id the peer heard). "
                               "If that directory is lost, move what is left aside and start "
                               "the replica with --rejoin on a new, empty one while every "
                               "other replica runs: it asks them what its lost life promised "
                               "before it takes part. Meanwhile the cluster serves on while a "
                               "majority of its replicas runs.")
        self.peer = peer


class StorageFailed(StorageError):
    """A write, fsync or rename failed; the replica must stop and never carry on.

    After a failed fsync the kernel may have dropped the dirty pages it could not write, so
    what is on disk is unknown: retrying could report success for data that is gone. The log
    refuses every later call; a restart recovers whatever was durable.
    """

    exit_code = EXIT_STORAGE_FAILED

    def __init__(self, path: pathlib.Path, operation: str, error: OSError) -> None:
        code = errno.errorcode.get(error.errno or 0, "unknown error")
        reason = error.strerror or os.strerror(error.errno or 0)
        fix = _FIXES.get(error.errno or 0, "check the disk (dmesg, SMART) and its filesystem")
        super().__init__(path, f"{path}: {operation} failed: {reason} ({code}). The replica "
                               "stopped: after a failed write or fsync the disk's state is "
                               f"unknown, so it must not go on. Fix: {fix}, then restart it; "
                               "it recovers every record that was synced.")
        self.errno = error.errno
