"""A crash (simulated as an exception nothing catches, then the process's
files dropped) at every file operation of a compaction, and of the version-1 rewrite at open,
leaves a directory that opens to the same records, or their compacted equivalent."""

from __future__ import annotations

import contextlib
import os
import pathlib

import pytest

from consensus.record_log import compact_records
from consensus.runtime import storage
from consensus.runtime.storage import DurableLog
from tests.consensus.runtime.test_storage import due_to_compact_at_sync, reopen, version_1_log
from tests.consensus.runtime.workload import take


class Crash(BaseException):
    pass


STEPS = [("os", "open"), ("os", "write"), ("os", "fsync"), ("os", "replace"),
         ("durable_file", "fsync_directory"), ("os", "close")]


def crash_at(monkeypatch: pytest.MonkeyPatch, module: object, name: str, after: int) -> None:
    real = getattr(module, name)
    calls = [0]

    def call(*arguments, **keywords):
        calls[0] += 1
        if calls[0] > after:
            raise Crash(f"{name} #{calls[0]}")
        return real(*arguments, **keywords)

    monkeypatch.setattr(module, name, call)


def die(directory: pathlib.Path) -> None:
    """The process dies: the kernel closes every descriptor it held there (the lock too)."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(str(directory)):
                os.close(int(fd))
        except OSError:
            pass


def modules(step: tuple[str, str]) -> object:
    return os if step[0] == "os" else storage  # storage imports fsync_directory by name


@pytest.mark.parametrize("step", STEPS, ids=lambda step: step[1])
@pytest.mark.parametrize("after", [0, 1, 2])
def test_a_crash_anywhere_in_a_compaction_at_sync_leaves_a_log_that_opens(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, step: tuple[str, str],
        after: int) -> None:
    records = take(10, 120, snapshot_every=25)
    log = due_to_compact_at_sync(tmp_path, records)
    crash_at(monkeypatch, modules(step), step[1], after)
    with contextlib.suppress(Crash):
        log.sync()
    monkeypatch.undo()
    die(tmp_path)
    log._fd = log._lock._fd = -1  # white-box: closed by die()
    reopened = reopen(tmp_path)
    assert compact_records(reopened) == compact_records(records)


@pytest.mark.parametrize("step", STEPS, ids=lambda step: step[1])
@pytest.mark.parametrize("after", [0, 1, 2])
def test_a_crash_anywhere_in_a_compaction_at_append_leaves_the_old_log_or_the_new(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, step: tuple[str, str],
        after: int) -> None:
    """An append holding a snapshot compacts at once: the records it was given are in the
    new file only, so a crash before the rename leaves the old log as it was (the append
    never returned: nothing was acknowledged on them)."""
    old = take(11, 20)
    log = DurableLog.open(tmp_path, create=True, compact_after_bytes=1)
    log.records()
    log.append(old)
    log.sync()
    records = take(10, 120, snapshot_every=25)
    crash_at(monkeypatch, modules(step), step[1], after)
    with contextlib.suppress(Crash):
        log.append(records)
    monkeypatch.undo()
    die(tmp_path)
    log._fd = log._lock._fd = -1  # white-box: closed by die()
    assert reopen(tmp_path) in (old, compact_records([*old, *records]))


@pytest.mark.parametrize("step", STEPS, ids=lambda step: step[1])
def test_a_crash_anywhere_in_the_version_1_rewrite_leaves_a_log_that_opens(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, step: tuple[str, str]) -> None:
    records = take(11, 60, snapshot_every=0)
    version_1_log(tmp_path, records)
    crash_at(monkeypatch, modules(step), step[1], 3)
    with contextlib.suppress(Crash):
        DurableLog.open(tmp_path, create=False).close()
    monkeypatch.undo()
    die(tmp_path)
    assert reopen(tmp_path) == records


def test_every_directory_create_makes_is_fsynced_into_its_parent(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`create` makes missing parents too (mkdir(parents=True)) but fsynced only the data
    directory's own parent: the entry of each other new directory could vanish in a power
    failure, and the synced log with it."""
    synced: list[pathlib.Path] = []
    real = getattr(storage, "fsync_directory")  # noqa: B009 (patched where it is used)

    def spy(directory: pathlib.Path) -> None:
        synced.append(pathlib.Path(directory))
        real(directory)

    monkeypatch.setattr(storage, "fsync_directory", spy)
    directory = tmp_path / "a" / "b" / "c"
    with DurableLog.open(directory, create=True) as log:
        log.records()
    for made in (tmp_path / "a", tmp_path / "a" / "b", directory):
        assert made.parent in synced, f"{made.name}'s entry in {made.parent} never fsynced"
