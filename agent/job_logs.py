"""Where each job's output goes: one file per pod under `<state dir>/logs/`, opened for
appending and handed to the job as its stdout and stderr.

The job writes the file directly, not through the agent, so that its output keeps flowing while
the agent restarts. The runner does not cap a file's size (a job with O_APPEND output can be
cut with `copytruncate`-style rotation); it caps how many files are kept, removing the oldest
ones of jobs no longer running.
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


def log_path(logs: pathlib.Path, pod_uid: str) -> pathlib.Path:
    """A file name for the pod: readable, safe for any uid, and distinct for distinct uids."""
    digest = hashlib.sha256(pod_uid.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    readable = _UNSAFE.sub("_", pod_uid)[:READABLE_CHARS_MAX]
    return logs / f"{readable}-{digest}.log"


def open_log(path: pathlib.Path) -> int:
    """A descriptor for appending to the log, closed on exec (the spawn duplicates it)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)


def prune_logs(logs: pathlib.Path, kept_max: int, keep: Collection[str]) -> None:
    """Remove the oldest log files beyond `kept_max`, never one named in `keep`."""
    files = sorted(logs.glob("*.log"), key=_age_key)
    excess = len(files) - kept_max
    for path in files:
        if excess <= 0:
            return
        if str(path) not in keep:
            path.unlink(missing_ok=True)
            excess -= 1


def _age_key(path: pathlib.Path) -> tuple[int, str]:
    try:
        return path.stat().st_mtime_ns, path.name
    except FileNotFoundError:
        return 0, path.name
