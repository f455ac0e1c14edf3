"""What the agent reads from /proc about processes: state, parent, process group, session and
start time (field 22 of /proc/<pid>/stat, in clock ticks after boot).

A pid alone names a process only until it is reused; a pid together with its start time names
one process for the life of the boot. Every liveness question here is asked with both. Zombies
(state Z) and dead tasks (X) count as not alive: they run nothing and hold no GPU context.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator
from dataclasses import dataclass

PROC = pathlib.Path("/proc")
KERNEL_BOOT_ID = PROC / "sys/kernel/random/boot_id"
NOT_RUNNING_STATES = frozenset({"Z", "X", "x"})
# Fields after the command name: state is field 3 of stat, start time field 22.
_STATE, _PPID, _PGID, _SID, _START = 0, 1, 2, 3, 19


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcStat:
    pid: int
    state: str
    ppid: int
    pgid: int
    sid: int
    start_ticks: int

    @property
    def running(self) -> bool:
        return self.state not in NOT_RUNNING_STATES


def boot_id(path: pathlib.Path = KERNEL_BOOT_ID) -> str:
    """The kernel's boot id (a pid and start time name a process within one boot only), or
    "" when it cannot be read."""
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, ValueError):
        return ""


def parse_stat(pid: int, text: str) -> ProcStat:
    """Parse /proc/<pid>/stat. The command name sits in parentheses and may itself hold spaces
    and parentheses, so the fields are counted from the last closing parenthesis."""
    fields = text[text.rindex(")") + 2:].split()
    return ProcStat(pid=pid, state=fields[_STATE], ppid=int(fields[_PPID]),
                    pgid=int(fields[_PGID]), sid=int(fields[_SID]),
                    start_ticks=int(fields[_START]))


def read_stat(pid: int, proc: pathlib.Path = PROC) -> ProcStat | None:
    """The process's stat, or None when there is no such process."""
    try:
        text = (proc / str(pid) / "stat").read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    return parse_stat(pid, text)


def start_ticks(pid: int) -> int | None:
    stat = read_stat(pid)
    return None if stat is None else stat.start_ticks


def is_alive(pid: int, ticks: int) -> bool:
    """Whether the process that started at `ticks` with this pid still runs (not a zombie, and
    the pid not reused by another process)."""
    stat = read_stat(pid)
    return stat is not None and stat.start_ticks == ticks and stat.running


def all_stats(proc: pathlib.Path = PROC) -> Iterator[ProcStat]:
    """Every process now, skipping those that exit while being read."""
    with os.scandir(proc) as entries:
        pids = [int(entry.name) for entry in entries if entry.name.isdigit()]
    for pid in pids:
        stat = read_stat(pid, proc)
        if stat is not None:
            yield stat


def environ_has(pid: int, name: str, value: str, proc: pathlib.Path = PROC) -> bool:
    """Whether the process started with `name=value` in its environment (False when it
    cannot be read: gone, or another user's)."""
    entry = f"{name}={value}".encode("utf-8", "surrogateescape")
    try:
        environ = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    return entry in environ.split(b"\0")


def marked_leaders(name: str, value: str) -> dict[int, int]:
    """The running session leaders started with `name=value` in their environment, pid to
    start ticks: a job's first process found by its mark alone, when no record names it."""
    return {stat.pid: stat.start_ticks for stat in all_stats()
            if stat.running and stat.sid == stat.pid and environ_has(stat.pid, name, value)}


def job_members(leader: int, leader_ticks: int, pgid: int,
                mark: tuple[str, str] | None = None) -> dict[int, ProcStat]:
    """The running processes of a job, by pid: its process group, its session (the
    job was started as a session leader, so its session id is the leader's pid), and every
    descendant of those that moved to a group or session of its own while its parent lived.

    The kernel does not reuse a pid while a group or session of that id has members, so group
    and session ids name the job until all of it is gone; a process holding the leader's pid
    with another start time shows that this happened, and then nothing is the job's. A process
    that double-forks out of the session escapes this: only a cgroup would hold it.

    Once the leader is gone, its pid may have been reused (the agent was down, the node
    rebooted) by a process that left a group or session of that id to a stranger; with `mark`
    (an environment variable the job was started with), only processes that carry it count
    then, and their descendants."""
    stats = list(all_stats())
    leader_stat = next((stat for stat in stats if stat.pid == leader), None)
    if leader_stat is not None and leader_stat.start_ticks != leader_ticks:
        return {}
    running = [stat for stat in stats if stat.running]
    members = {stat.pid: stat for stat in running
               if (stat.pgid == pgid or leader in (stat.sid, stat.pid))
               and stat.start_ticks >= leader_ticks}
    if leader_stat is None and mark is not None:
        members = {pid: stat for pid, stat in members.items() if environ_has(pid, *mark)}
    _add_descendants(members, running)
    return dict(sorted(members.items()))


def _add_descendants(members: dict[int, ProcStat], running: list[ProcStat]) -> None:
    children: dict[int, list[ProcStat]] = {}
    for stat in running:
        children.setdefault(stat.ppid, []).append(stat)
    pending = list(members)
    while pending:
        for child in children.get(pending.pop(), ()):
            if child.pid not in members:
                members[child.pid] = child
                pending.append(child.pid)
