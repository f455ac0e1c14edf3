"""Signalling every process of a job: the process group the job was started as, and those of
its processes that left the group (found through /proc, see `procfs.job_members`).

`killpg` reaches the group in one call, grandchildren included. It is sent only while /proc
shows processes of the job: the kernel does not hand a group's id to a new process while the
group has members, so the signal cannot reach a stranger that reused the number. Members
outside the group are signalled one by one, named by the pid just read with its start time.
"""

from __future__ import annotations

import contextlib
import os
import signal

from agent import procfs
from agent.binding import POD_UID_MARK
from agent.job_state import JobRecord


def members(record: JobRecord, *, marked_only: bool = False) -> dict[int, int]:
    """The job's running processes now, pid to start ticks; `marked_only`: once its first
    process is gone, only those started with the job's mark (see `procfs.job_members`)."""
    found = _found(record, marked_only)
    return {pid: stat.start_ticks for pid, stat in found.items()}


def signal_job(record: JobRecord, sig: signal.Signals, *, marked_only: bool = False
               ) -> dict[int, int]:
    """Send `sig` to every running process of the job; return those it was sent to."""
    found = _found(record, marked_only)
    if not found:
        return {}
    if any(stat.pgid == record.pgid for stat in found.values()):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pgid, sig)
    for stat in found.values():
        if stat.pgid != record.pgid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stat.pid, sig)
    return {pid: stat.start_ticks for pid, stat in found.items()}


def _found(record: JobRecord, marked_only: bool) -> dict[int, procfs.ProcStat]:
    mark = (POD_UID_MARK, record.binding.pod_uid) if marked_only else None
    return procfs.job_members(record.pid, record.start_ticks, record.pgid, mark=mark)
