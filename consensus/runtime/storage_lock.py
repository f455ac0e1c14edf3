"""The data directory's lock: one process at a time may hold a replica's records.

Two processes appending to one log would interleave their records and break every promise
either made. `DirectoryLock.acquire` takes an exclusive `flock` on `cellar.lock` in the data
directory without waiting, and writes its pid there so a second opener can say who holds it.
The kernel drops the lock when the holder exits or is killed, so a crash never leaves the
directory locked; the file itself stays (deleting it would let two openers lock two different
files). `flock` is advisory and local: it does not protect a directory shared over NFS.
"""

from __future__ import annotations

import fcntl
import os
import pathlib

from consensus.runtime.storage_errors import DataDirectoryLocked, StorageFailed

LOCK_NAME = "cellar.lock"
_PID_BYTES_MAX = 32


class DirectoryLock:
    """An exclusive lock on a data directory, held until `release` (or the process ends)."""

    __slots__ = ("_fd", "path")

    def __init__(self, path: pathlib.Path, fd: int) -> None:
        self.path = path
        self._fd = fd

    @classmethod
    def acquire(cls, directory: pathlib.Path) -> DirectoryLock:
        path = directory / LOCK_NAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise StorageFailed(path, "opening the lock file", error) from error
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise DataDirectoryLocked(directory, path, holder) from None
        except OSError as error:
            os.close(fd)
            raise StorageFailed(path, "locking", error) from error
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as error:
            os.close(fd)
            raise StorageFailed(path, "writing the pid into the lock file", error) from error
        return cls(path, fd)

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        """Drop the lock; releasing twice does nothing."""
        if self._fd >= 0:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = -1


def _holder(fd: int) -> int | None:
    """The pid the lock's holder wrote, if it has written one yet."""
    try:
        text = os.pread(fd, _PID_BYTES_MAX, 0).decode("ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
