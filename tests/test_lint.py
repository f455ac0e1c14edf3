"""ruff and mypy run as part of the test suite, so a lint or type error fails `make test`."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run_tool(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_ruff_is_clean() -> None:
    result = run_tool("ruff", "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean() -> None:
    result = run_tool("mypy", "cellar", "consensus", "statemachine", "agent", "jepsen", "tests")
    assert result.returncode == 0, result.stdout + result.stderr
