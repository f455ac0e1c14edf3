"""Real processes, real `kill -9`: every record a child acknowledged (printed `synced N` for,
after `sync` returned) is there after a restart, unchanged, and nothing else is there but
records the child really wrote; a crash in the middle of a compaction leaves a usable log; a
second process is kept out of a directory another one holds.
"""

from __future__ import annotations

import pathlib
import random
import subprocess
import sys
import time
from typing import IO

import pytest

from consensus.record_log import compact_records
from consensus.records import Record
from consensus.runtime.storage import COMPACTING_NAME, DurableLog
from consensus.runtime.storage_errors import DataDirectoryLocked
from tests.consensus.runtime.child import BATCH_MAX, SNAPSHOT_EVERY
from tests.consensus.runtime.workload import take

ROOT = pathlib.Path(__file__).resolve().parents[3]
KILLS = 14


def spawn(*arguments: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.consensus.runtime.child", *arguments],
                            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def expect_line(child: subprocess.Popen[str], prefix: str) -> str:
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line.startswith(prefix):
        child.kill()
        raise AssertionError(f"child printed {line!r}, wanted {prefix!r}: {errors(child)}")
    return line


def errors(child: subprocess.Popen[str]) -> str:
    child.wait()
    stream: IO[str] | None = child.stderr
    return stream.read() if stream else ""


def kill_at_random(child: subprocess.Popen[str], prng: random.Random) -> int:
    """Let the child sync a random number of batches, kill -9 it a moment later, and return
    the most records it acknowledged."""
    syncs = prng.randint(1, 12)
    acknowledged = 0
    for _ in range(syncs):
        acknowledged = int(expect_line(child, "synced ").split()[1])
    time.sleep(prng.uniform(0, 0.003))
    child.kill()
    assert child.stdout is not None
    for line in child.stdout.read().splitlines():  # printed before the kill landed
        acknowledged = max(acknowledged, int(line.split()[1]))
    assert child.wait() == -9, errors(child)
    return acknowledged


@pytest.mark.live
def test_acknowledged_records_survive_kill_9(tmp_path: pathlib.Path) -> None:
    """One directory, killed and reopened again and again: the log is always an exact prefix
    of what the child wrote, at least as long as what it acknowledged."""
    prng, seed = random.Random(20), 20
    recovered: list[Record] = []
    for _ in range(KILLS):
        child = spawn("append", str(tmp_path), str(seed))
        assert expect_line(child, "opened ") == f"opened {len(recovered)}\n"
        acknowledged = kill_at_random(child, prng)
        with DurableLog.open(tmp_path, create=False) as log:
            recovered = log.records()
        assert len(recovered) >= acknowledged
        assert len(recovered) <= acknowledged + BATCH_MAX
        assert recovered == take(seed, len(recovered))


@pytest.mark.live
def test_acknowledged_records_survive_kill_9_while_compacting(tmp_path: pathlib.Path) -> None:
    """Snapshots every 25 records and compaction every 4 kB: kills land in appends, syncs and
    compactions; the log replays like some prefix the child wrote, no shorter than what it
    acknowledged."""
    prng = random.Random(21)
    compactions = 0
    for kill in range(KILLS):
        directory, seed = tmp_path / str(kill), 100 + kill
        child = spawn("append", str(directory), str(seed), "--snapshots",
                      "--compact-bytes", "4096")
        expect_line(child, "opened 0")
        acknowledged = kill_at_random(child, prng)
        with DurableLog.open(directory, create=False) as log:
            recovered = log.records()
        written = take(seed, acknowledged + BATCH_MAX, snapshot_every=SNAPSHOT_EVERY)
        normal = compact_records(recovered)
        assert any(normal == compact_records(written[:count])
                   for count in range(acknowledged, len(written) + 1)), (kill, acknowledged)
        compactions += len(recovered) < acknowledged
    assert compactions > 0  # the kills did find compacted logs


@pytest.mark.live
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_crash_during_compaction_leaves_a_usable_log(tmp_path: pathlib.Path,
                                                       when: str) -> None:
    child = spawn("compact-then-die", str(tmp_path), "30", "--when", when)
    assert child.wait(timeout=60) == -9, errors(child)
    written = take(30, 60, snapshot_every=SNAPSHOT_EVERY)
    leftover = (tmp_path / COMPACTING_NAME).exists()
    assert leftover == (when == "before")
    with DurableLog.open(tmp_path, create=False) as log:
        recovered = log.records()
        assert log.recovery.removed_compaction == (when == "before")
    assert not (tmp_path / COMPACTING_NAME).exists()
    # Before the rename the old log is whole; after it the compacted one is in place.
    assert recovered == (written if when == "before" else compact_records(written))


@pytest.mark.live
def test_a_directory_held_by_another_process_is_refused(tmp_path: pathlib.Path) -> None:
    child = spawn("hold", str(tmp_path), "0")
    try:
        expect_line(child, "locked")
        with pytest.raises(DataDirectoryLocked) as raised:
            DurableLog.open(tmp_path, create=False)
        assert raised.value.holder == child.pid
        assert f"process {child.pid}" in str(raised.value)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        assert child.wait(timeout=60) == 0, errors(child)
    with DurableLog.open(tmp_path, create=False):  # free again once the holder is gone
        pass
