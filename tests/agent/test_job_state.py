"""The job runner's persistence: the bounded ledger of started pod uids (torn tails, corrupt
lines, compaction) and the records of running jobs (round trip, damage named clearly)."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from agent.binding import Binding
from agent.job_errors import JobStateCorrupt
from agent.job_logs import log_path, prune_logs
from agent.job_state import JobRecord, JobRecords
from agent.started_ledger import StartedLedger

RECORD = JobRecord(
    binding=Binding(group="g", pod_uid="p/1", gpu_uuids=("GPU-a", "GPU-b"),
                    command=("python", "-c", "print('é')"), env=(("A", "1"), ("B", ""))),
    pid=123, pgid=123, start_ticks=4567, started_unix_ns=1_700_000_000_000_000_000,
    log_path="/var/lib/cellar/logs/p_1.log")


def test_the_ledger_remembers_across_reloads(tmp_path: pathlib.Path) -> None:
    ledger = StartedLedger(tmp_path, remembered_max=10)
    for uid in ("a", "b\nwith a newline", "c"):
        ledger.remember(uid)
    again = StartedLedger(tmp_path, remembered_max=10)
    assert "b\nwith a newline" in again
    assert len(again) == 3
    assert "d" not in again


def test_the_ledger_keeps_only_the_most_recent_uids(tmp_path: pathlib.Path) -> None:
    ledger = StartedLedger(tmp_path, remembered_max=3)
    for index in range(10):
        ledger.remember(f"p{index}")
    assert [f"p{index}" in ledger for index in range(10)] == [False] * 7 + [True] * 3
    assert len(ledger.path.read_text().splitlines()) < 6  # compacted, not growing forever
    again = StartedLedger(tmp_path, remembered_max=3)
    assert [f"p{index}" in again for index in range(7, 10)] == [True] * 3
    assert "p6" not in again


def test_a_torn_last_line_is_dropped_and_appends_go_on(tmp_path: pathlib.Path) -> None:
    StartedLedger(tmp_path, remembered_max=10).remember("a")
    with (tmp_path / "started.log").open("ab") as file:
        file.write(b'"tor')
    ledger = StartedLedger(tmp_path, remembered_max=10)
    assert len(ledger) == 1
    ledger.remember("b")
    assert {"a", "b"} <= {json.loads(line) for line in ledger.path.read_text().splitlines()}


def test_a_damaged_ledger_line_is_named(tmp_path: pathlib.Path) -> None:
    (tmp_path / "started.log").write_text('"a"\nnot json\n"c"\n')
    with pytest.raises(JobStateCorrupt, match=r"started.log: line 2 is not JSON"):
        StartedLedger(tmp_path, remembered_max=10)


def test_job_records_round_trip(tmp_path: pathlib.Path) -> None:
    records = JobRecords(tmp_path)
    records.put(RECORD)
    assert JobRecords(tmp_path).all() == (RECORD,)
    records.forget("p/1", "unknown")
    assert JobRecords(tmp_path).all() == ()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["jobs.json"]


@pytest.mark.parametrize(("text", "message"), [
    ("{", "not JSON"),
    ('{"format": "other"}', "not a cellar-agent-jobs file"),
    ('{"format": "cellar-agent-jobs", "version": 9, "jobs": []}', "version 9"),
    ('{"format": "cellar-agent-jobs", "version": 1, "jobs": [{"pid": 1}]}', "malformed"),
])
def test_damaged_job_records_are_named(tmp_path: pathlib.Path, text: str, message: str
                                       ) -> None:
    (tmp_path / "jobs.json").write_text(text)
    with pytest.raises(JobStateCorrupt, match=message) as caught:
        JobRecords(tmp_path)
    assert "jobs.json" in str(caught.value)


def test_log_names_are_safe_and_distinct(tmp_path: pathlib.Path) -> None:
    names = {log_path(tmp_path, uid) for uid in ("a/b", "a_b", "../x", "a" * 500)}
    assert len(names) == 4
    assert all(path.parent == tmp_path and len(path.name) < 100 for path in names)


def test_old_logs_are_pruned_but_running_ones_kept(tmp_path: pathlib.Path) -> None:
    paths = [tmp_path / f"{index}.log" for index in range(5)]
    for index, path in enumerate(paths):
        path.write_text("x")
        os.utime(path, ns=(index * 10**9, index * 10**9))
    prune_logs(tmp_path, kept_max=2, keep={str(paths[0])})
    assert sorted(path.name for path in tmp_path.iterdir()) == ["0.log", "4.log"]
