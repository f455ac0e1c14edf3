"""Durable writes, shared by the replica's log and the agent's state files: whole-file
replacement that is atomic across a crash, and appends that are on disk when the call returns.

`replace_file` writes a temporary file beside the target, fsyncs it, renames it over the target
and fsyncs the directory, so a reader after any crash sees the old content or the new, never a
mix. `append_durably` adds bytes at the end and fsyncs the file, then the directory (every
time: a process killed between creating the file and the directory's fsync left a file whose
name a power failure could take, with every line appended to it later); a failed append is cut
off again, but a crash mid-append can leave a torn last line, which readers must ignore. Errors
are `OSError`s, for the caller to name the file.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
from collections.abc import Sequence

TEMPORARY_SUFFIX = ".new"
ZEROS_CHUNK_BYTES = 1 << 20
IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024


def replace_file(path: pathlib.Path, data: bytes) -> None:
    temporary = path.with_name(path.name + TEMPORARY_SUFFIX)
    write_file_durably(temporary, data)
    try:
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def write_file_durably(path: pathlib.Path, data: bytes | Sequence[bytes],
                       mode: int = 0o600) -> None:
    """Create (or empty) `path`, write `data` (bytes, or parts one after another) and fsync
    it; on failure the file is removed (the space given back), so only the rename that
    follows can publish it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
        try:
            write_parts(fd, [data] if isinstance(data, bytes) else data)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        path.unlink(missing_ok=True)
        raise


def append_durably(path: pathlib.Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        size = os.fstat(fd).st_size
        try:
            write_all(fd, data)
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):  # no torn line for the next append to extend
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)
    fsync_directory(path.parent)


def write_zeros(fd: int, offset: int, count: int) -> None:
    """Write `count` zero bytes at `offset`, a MiB at a time."""
    chunk = bytes(min(count, ZEROS_CHUNK_BYTES))
    end = offset + count
    while offset < end:
        written = os.pwrite(fd, memoryview(chunk)[:end - offset], offset)
        assert written > 0, "pwrite wrote nothing"
        offset += written


def fsync_directory(directory: pathlib.Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    write_parts(fd, [data])


def write_parts(fd: int, parts: Sequence[bytes], offset: int | None = None) -> None:
    """Write `parts` one after another, at most IOV_MAX of them a call (os.writev): no joined
    copy of them first, which for a log's snapshot record is a copy of the whole state. With
    `offset`, from there on in the file (os.pwritev), else at the file's position."""
    pending: list[bytes | memoryview] = list(parts)
    start = 0
    while start < len(pending):
        window = pending[start:start + IOV_MAX]
        if offset is None:
            written = os.writev(fd, window)
        else:
            written = os.pwritev(fd, window, offset)
            offset += written
        assert written > 0 or not any(window), "writev wrote nothing"
        for part in window:
            if written < len(part):  # cut inside this part: the rest of it goes next
                pending[start] = memoryview(part)[written:]
                break
            written -= len(part)
            start += 1
