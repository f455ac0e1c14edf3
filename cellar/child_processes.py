"""The processes a command starts (replicas, agents, peers under benchmark): they end with it,
and stopping them takes one grace period.

- `dies_with_parent`: a child started with it gets SIGTERM when the command's process ends,
  however it ends (Linux's PR_SET_PDEATHSIG). A `cellar dev` killed by SIGKILL (the OOM
  killer, a CI runner's timeout) or by a SIGHUP had left its replicas running for good,
  holding their ports, under a directory the next run deleted.
- `stop_processes`: SIGTERM to all at once, then SIGKILL to those still running after one
  shared grace period, so that stopping n processes takes one grace period at most.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

PR_SET_PDEATHSIG = 1  # prctl(2)
EXIT_PARENT_GONE = 70  # the parent ended before the child could bind its fate to it


def dies_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` for `subprocess.Popen` that has the child get SIGTERM when this process
    ends; None where that cannot be had (not Linux), or would misfire: the signal comes when
    the *thread* that started the child ends, so only the main thread may use it."""
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    parent = os.getpid()

    def bind_to_parent() -> None:  # runs in the child, between fork and exec
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent ended before the line above
            os._exit(EXIT_PARENT_GONE)

    return bind_to_parent


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
