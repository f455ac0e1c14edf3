"""The processes a command starts (replicas, agents, peers under benchmark): they end with it,
and stopping them takes one grace period.

- `bound_to_parent`: a child started with it gets SIGTERM (or SIGKILL, for a child that may
  be SIGSTOPped) when the command's process ends,
  however it ends (Linux's PR_SET_PDEATHSIG). A `cellar dev` killed by SIGKILL (the OOM
  killer, a CI runner's timeout) or by a SIGHUP had left its replicas running for good,
  holding their ports, under a directory the next run deleted.
- `bound_yet`: whether such a child has armed that signal yet (it has left the small
  trampoline that arms it for its real command); a child must not be SIGSTOPped before, or a
  parent killed meanwhile leaves it stopped and unbound for good (a live run's pause that
  held a replica just restarted by the end of a crash).
- `stop_processes`: SIGTERM to all at once, then SIGKILL to those still running after one
  shared grace period, so that stopping n processes takes one grace period at most.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

PR_SET_PDEATHSIG = 1  # prctl(2)
EXIT_PARENT_GONE = 70  # the parent ended before the child could bind its fate to it
# Run first in the child: bind it to its parent (SIGTERM when the parent ends; PR_SET_PDEATHSIG
# survives execve), give up if the parent is gone already, then become the real command. No
# code runs between fork and exec in the parent's image (a `preexec_fn` is unsafe when the
# parent has threads: the child may deadlock on a lock another thread held at the fork).
# Python ignores SIGPIPE and SIGXFSZ at start, and an ignored signal stays ignored across
# execve: both go back to their defaults first, as Popen's restore_signals leaves them.
_TRAMPOLINE = (
    "import ctypes, os, signal, sys\n"
    f"ctypes.CDLL(None, use_errno=True).prctl({PR_SET_PDEATHSIG}, int(sys.argv[2]))\n"
    f"os.getppid() == int(sys.argv[1]) or os._exit({EXIT_PARENT_GONE})\n"
    "for number in (signal.SIGPIPE, signal.SIGXFSZ):\n"
    "    signal.signal(number, signal.SIG_DFL)\n"
    "os.execvp(sys.argv[3], sys.argv[3:])\n")


def child_environment() -> dict[str, str]:
    """This process's environment for a child that starts in another directory: relative
    entries of PYTHONPATH made absolute against this process's directory, so the child
    imports the same code, and PYTHONUNBUFFERED set, so its log is written as it goes. A
    replica starts in its data directory: `PYTHONPATH=.` named that directory there, and a
    side-by-side benchmark of a checkout ran the installed code in its replicas."""
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    path = environment.get("PYTHONPATH")
    if path:
        environment["PYTHONPATH"] = os.pathsep.join(
            os.path.abspath(entry or os.curdir) for entry in path.split(os.pathsep))
    return environment


def bound_to_parent(command: Sequence[str],
                    death_signal: signal.Signals = signal.SIGTERM) -> list[str]:
    """`command`, started so that it gets `death_signal` (SIGTERM) when this process ends
    (Linux): as it is where that cannot be had (not Linux) or would misfire: the signal comes
    when the *thread* that started the child ends, so only the main thread may bind a child.
    A child that may be stopped (SIGSTOP, a live run's pause) needs SIGKILL: a stopped process
    holds any other signal pending for as long as nobody continues it."""
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return list(command)
    return [sys.executable, "-I", "-S", "-c", _TRAMPOLINE, str(os.getpid()),
            str(int(death_signal)), *command]


def bound_yet(process: subprocess.Popen[Any]) -> bool:
    """Whether a child started with `bound_to_parent` has bound its fate to this process: it
    left the trampoline for its real command, so its death signal is armed. Stopping it
    (SIGSTOP) before then would leave it stopped for good, unbound, if this process died.
    True for a child started otherwise, or one whose command line cannot be read (ended)."""
    arguments = [os.fsencode(str(argument)) for argument in process.args] \
        if isinstance(process.args, list) else []
    if arguments[3:5] != [b"-c", _TRAMPOLINE.encode()]:
        return True
    try:
        # Popen returns once the child has exec'd the trampoline: never the parent's image
        line = pathlib.Path(f"/proc/{process.pid}/cmdline").read_bytes()
    except OSError:
        return True
    return line.split(b"\0")[:-1] != arguments


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
