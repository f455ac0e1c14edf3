"""Waiting for a job's process to end, on any anyio backend.

A pidfd (Linux 5.3 and later) becomes readable when its process ends, so a task can wait for
it like for a socket, with no polling and no SIGCHLD handler shared with the event loop. Where
there is none, the wait polls every `poll_s`.

- The agent's own children are reaped with `waitpid(pid)` (never `waitpid(-1)`, which would
  steal another library's children), which gives the exit status.
- A job adopted after an agent restart is someone else's child: its end is seen (pidfd or
  /proc), its status never is. It is named by pid and start time, and the start time is checked
  after the pidfd is opened, so the descriptor cannot follow a reused pid.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os

import anyio

from agent import procfs

logger = logging.getLogger("cellar.agent.jobs")


@functools.cache
def pidfd_supported() -> bool:
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # ENOSYS on kernels before 5.3, EPERM under some seccomp profiles
        return False
    return True


def _pidfd(pid: int) -> int | None:
    """A pidfd for `pid`, or None to poll instead (no pidfd support, or no descriptor to
    spare). Raises ProcessLookupError when there is no such process."""
    if not pidfd_supported():
        return None
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        raise
    except OSError as error:
        logger.warning("watching pid %d by polling: %s", pid, error)
        return None


async def _wait_readable_then_close(fd: int) -> None:
    try:
        await anyio.wait_readable(fd)
    finally:
        os.close(fd)


async def wait_child(pid: int, poll_s: float) -> int | None:
    """Wait for the agent's child `pid` to end, reap it, and return its wait status, or None
    when it was reaped by someone else."""
    with contextlib.suppress(ProcessLookupError):  # reaped elsewhere: waitpid will say so
        fd = _pidfd(pid)
        if fd is not None:
            await _wait_readable_then_close(fd)
    try:
        while True:
            reaped, status = os.waitpid(pid, os.WNOHANG)
            if reaped == pid:
                return status
            await anyio.sleep(poll_s)
    except ChildProcessError:
        return None


async def wait_adopted(pid: int, start_ticks: int, poll_s: float) -> None:
    """Wait until the process `pid` that started at `start_ticks` is no longer running."""
    try:
        fd = _pidfd(pid)
    except ProcessLookupError:
        return
    if fd is not None:
        if procfs.is_alive(pid, start_ticks):  # checked after opening: fd names that process
            await _wait_readable_then_close(fd)
        else:
            os.close(fd)
        return
    while procfs.is_alive(pid, start_ticks):
        await anyio.sleep(poll_s)
