"""The job runner's one exception: its state directory cannot be read. Everything else the
runner meets (a bad binding, a command that cannot start, NVML down during a stop) is an
outcome value, because the agent must keep running its other jobs."""

from __future__ import annotations

import pathlib


class JobStateCorrupt(Exception):
    """A state file holds something the runner did not write. The agent must not guess which
    jobs it started (it could start one twice), so it stops with this message."""

    def __init__(self, path: pathlib.Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}. The job runner's state is damaged; move the file "
                         "away to start with an empty ledger, after checking by hand that none "
                         "of the jobs it names is still running")
        self.path = path
        self.reason = reason
