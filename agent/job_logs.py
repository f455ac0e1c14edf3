"""Where each job's output goes: one file per pod under `<state dir>/logs/`, opened for
appending and handed to the job as its stdout and stderr.

The job writes the file directly, not through the agent, so that its output keeps flowing while
the agent restarts. The files share a disk with the agent's ledger and records, so both their
size and their number are bounded:

- A running job's log past its limit is cut `copytruncate`-style (`cap_log`): its tail is
  copied to `<log>.prev`, then the file is emptied. The job's descriptor appends (O_APPEND),
  so its next write lands at the new end, not past a hole. What it writes between the copy and
  the truncation is lost; between two checks a log may pass its limit by what the job writes
  meanwhile; while the agent is down, nothing cuts.
- The oldest files of jobs no longer running are removed, with their tails, beyond a count.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
from collections.abc import Collection

LOGS_NAME = "logs"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
READABLE_CHARS_MAX = 64
PREV_SUFFIX = ".prev"  # a cut log's tail: `<log>.prev`


def log_path(logs: pathlib.Path, pod_uid: str) -> pathlib.Path:
    """A file name for the pod: readable, safe for any uid, and distinct for distinct uids."""
    digest = hashlib.sha256(pod_uid.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    readable = _UNSAFE.sub("_", pod_uid)[:READABLE_CHARS_MAX]
    return logs / f"{readable}-{digest}.log"


def open_log(path: pathlib.Path) -> int:
    """A descriptor for appending to the log, closed on exec (the spawn duplicates it)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)


def prev_path(path: pathlib.Path) -> pathlib.Path:
    return path.with_name(path.name + PREV_SUFFIX)


def cap_log(path: pathlib.Path, bytes_max: int, tail_bytes: int) -> bool:
    """Cut the log if it holds over `bytes_max`: its last `tail_bytes` replace `<log>.prev`,
    then it is emptied (even when the copy fails: a full disk is the reason to cut). Returns
    whether it was cut."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    if size <= bytes_max:
        return False
    try:
        with path.open("rb") as source:
            source.seek(max(0, size - tail_bytes))
            prev_path(path).write_bytes(source.read(tail_bytes))
    finally:
        os.truncate(path, 0)
    return True


def prune_logs(logs: pathlib.Path, kept_max: int, keep: Collection[str]) -> None:
    """Remove the oldest log files beyond `kept_max` (and their tails), never one named in
    `keep`."""
    files = sorted(logs.glob("*.log"), key=_age_key)
    excess = len(files) - kept_max
    for path in files:
        if excess <= 0:
            return
        if str(path) not in keep:
            path.unlink(missing_ok=True)
            prev_path(path).unlink(missing_ok=True)
            excess -= 1


def _age_key(path: pathlib.Path) -> tuple[int, str]:
    try:
        return path.stat().st_mtime_ns, path.name
    except FileNotFoundError:
        return 0, path.name
