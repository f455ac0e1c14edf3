"""The record of each job this node runs, kept in `jobs.json` in the state directory, so that a
restarted agent can find its jobs again (see `JobRunner.reconcile`).

A record is written, atomically and durably, after the launch and before `start` returns, and
removed once the job's exit has been seen. The file is one JSON object:

    {"format": "cellar-agent-jobs", "version": 1,
     "jobs": [{"group", "pod_uid", "gpu_uuids", "command", "env": [[name, value], ...],
               "pid", "pgid", "start_ticks", "started_unix_ns", "log_path", "boot_id"}, ...]}

with the jobs sorted by pod uid. `start_ticks` is field 22 of /proc/<pid>/stat: with the pid
it names the process across pid reuse, within the boot `boot_id` names (the kernel's; absent
from records written before it was kept).
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass
from typing import Any

from agent.binding import Binding
from agent.job_errors import JobStateCorrupt
from consensus.runtime.durable_file import replace_file

JOBS_NAME = "jobs.json"
FORMAT = "cellar-agent-jobs"
VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRecord:
    binding: Binding
    pid: int
    pgid: int
    start_ticks: int
    started_unix_ns: int
    log_path: str
    boot_id: str = ""  # the kernel's boot id at the launch; "" when not known


class JobRecords:
    """The records of running jobs, by pod uid, mirrored in `jobs.json`."""

    def __init__(self, directory: pathlib.Path) -> None:
        self.path = directory / JOBS_NAME
        self._records = _load(self.path)

    def all(self) -> tuple[JobRecord, ...]:
        return tuple(self._records[uid] for uid in sorted(self._records))

    def put(self, record: JobRecord) -> None:
        """Add or replace a record and persist; raises OSError when the disk refuses."""
        self._save({**self._records, record.binding.pod_uid: record})

    def forget(self, *pod_uids: str) -> None:
        if any(uid in self._records for uid in pod_uids):
            self._save({uid: record for uid, record in self._records.items()
                        if uid not in pod_uids})

    def _save(self, records: dict[str, JobRecord]) -> None:
        jobs = [_encode(records[uid]) for uid in sorted(records)]
        data = json.dumps({"format": FORMAT, "version": VERSION, "jobs": jobs}, indent=1)
        replace_file(self.path, data.encode("utf-8") + b"\n")
        self._records = records


def _encode(record: JobRecord) -> dict[str, Any]:
    binding = record.binding
    return {"group": binding.group, "pod_uid": binding.pod_uid,
            "gpu_uuids": list(binding.gpu_uuids), "command": list(binding.command),
            "env": [list(pair) for pair in binding.env], "pid": record.pid,
            "pgid": record.pgid, "start_ticks": record.start_ticks,
            "started_unix_ns": record.started_unix_ns, "log_path": record.log_path,
            "boot_id": record.boot_id}


def _load(path: pathlib.Path) -> dict[str, JobRecord]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    try:
        document = json.loads(text)
    except ValueError as error:
        raise JobStateCorrupt(path, f"not JSON ({error})") from error
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise JobStateCorrupt(path, f"not a {FORMAT} file")
    if document.get("version") != VERSION:
        raise JobStateCorrupt(path, f"version {document.get('version')!r}, this agent reads "
                                    f"version {VERSION}")
    try:
        records = [_decode(job) for job in document["jobs"]]
    except (KeyError, TypeError, ValueError) as error:
        raise JobStateCorrupt(path, f"a job record is malformed ({error!r})") from error
    return {record.binding.pod_uid: record for record in records}


def _decode(job: dict[str, Any]) -> JobRecord:
    binding = Binding(group=_text(job["group"]), pod_uid=_text(job["pod_uid"]),
                      gpu_uuids=tuple(_text(uuid) for uuid in job["gpu_uuids"]),
                      command=tuple(_text(arg) for arg in job["command"]),
                      env=tuple((_text(name), _text(value)) for name, value in job["env"]))
    return JobRecord(binding=binding, pid=_number(job["pid"]), pgid=_number(job["pgid"]),
                     start_ticks=_number(job["start_ticks"]),
                     started_unix_ns=_number(job["started_unix_ns"]),
                     log_path=_text(job["log_path"]), boot_id=_text(job.get("boot_id", "")))


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, found {value!r}")
    return value


def _number(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TypeError(f"expected a non-negative integer, found {value!r}")
    return value
