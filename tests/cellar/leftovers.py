"""Processes a test's command left behind: found by a path in their command line, reported,
and killed, so that a failing test never leaves replicas running."""

from __future__ import annotations

import pathlib
import subprocess


def kill_leftovers(path: pathlib.Path) -> str:
    """SIGKILL every process whose command line names `path`; what `pgrep` listed first."""
    found = subprocess.run(["pgrep", "-f", str(path)], capture_output=True, text=True,
                           check=False).stdout
    subprocess.run(["pkill", "-KILL", "-f", str(path)], check=False)
    return found
