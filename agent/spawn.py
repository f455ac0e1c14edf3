"""Launching a job's command: its own session and process group, stdin from /dev/null, stdout
and stderr into its log file, the signals the agent may ignore reset to their defaults, and no
other descriptor of the agent's (as `Popen(close_fds=True)`): one the agent inherited, or a C
library such as NVML opened without close-on-exec, would stay open in jobs that outlive it.

`os.posix_spawn` does this without a `Popen` object, whose life would be tied to this agent
process: the runner waits for its children itself (`agent.process_watch`), and a job must
outlive an agent restart. Failures (not found, permission denied) raise `OSError`.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Mapping

# Dispositions a job must not inherit: Python ignores SIGPIPE and SIGXFSZ, and a daemon started
# under nohup ignores SIGHUP. Handlers are reset by exec anyway; ignored signals are not.
DEFAULT_SIGNALS = frozenset({signal.SIGPIPE, signal.SIGXFSZ, signal.SIGHUP, signal.SIGINT,
                             signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2,
                             signal.SIGCHLD})
FDS_DIR = "/proc/self/fd"
STDIO_FDS = 3  # 0, 1 and 2: set up for the job by the spawn itself


def resolve(program: str, env: Mapping[str, str]) -> str:
    """The executable's path: `program` itself when it names a path, else looked up in the
    job's PATH. Raises FileNotFoundError when there is none."""
    if "/" in program:
        return program
    found = shutil.which(program, path=env.get("PATH", os.defpath))
    if found is None:
        raise FileNotFoundError(2, f"command not found in PATH: {program}")
    return found


def spawn(command: tuple[str, ...], env: Mapping[str, str], log_fd: int) -> int:
    """Start `command` as a session leader and return its pid."""
    path = resolve(command[0], env)
    closes = [(os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable_fds() if fd != log_fd]
    return os.posix_spawn(
        path, list(command), dict(env),
        file_actions=[*closes,
                      (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                      (os.POSIX_SPAWN_DUP2, log_fd, 1),
                      (os.POSIX_SPAWN_DUP2, log_fd, 2)],
        setsid=True, setsigmask=(), setsigdef=DEFAULT_SIGNALS)


def _inheritable_fds() -> list[int]:
    """The agent's descriptors above stdio that exec would pass on (not close-on-exec)."""
    found = []
    for name in os.listdir(FDS_DIR):
        fd = int(name)
        if fd < STDIO_FDS:
            continue
        try:
            if os.get_inheritable(fd):
                found.append(fd)
        except OSError:  # the listing's own descriptor, closed since
            continue
    return sorted(found)
