"""Stopping the processes a command started (replicas, peers under benchmark): SIGTERM to all
at once, then SIGKILL to those still running after one shared grace period, so that stopping
n processes takes one grace period at most, not n of them."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any


def stop_processes(processes: Sequence[subprocess.Popen[Any]], grace_s: float) -> None:
    """SIGTERM every process still running, then SIGKILL those not gone within `grace_s`."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
