"""Number types for the command lines: a value is checked where argparse reads it.

A bad count or duration is then refused before any work starts (no cluster started only to
stop at once, no negative phase run as if it were empty), with its flag and value named in
argparse's own words (`argument --runs: must be at least 1, not 0`) and exit status 2, the
same in every command. It lives here, at the lowest layer with a command line (`cellar certs`),
so that every layer above can use it.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
from collections.abc import Callable
from typing import NoReturn


def at_least(least: int, *, most: int | None = None) -> Callable[[str], int]:
    """A whole number no smaller than `least` (and no larger than `most`, if given)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, not {value}")
        if most is not None and value > most:
            raise argparse.ArgumentTypeError(f"must be at most {most}, not {value}")
        return value

    return parse


def existing_directory(text: str) -> pathlib.Path:
    """A directory that exists: one to make temporary files under (`--dir`), checked before a
    benchmark starts rather than met as a traceback once it tries to write there."""
    path = pathlib.Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is not a directory")
    return path


def seconds(*, zero_ok: bool = False, most: float = math.inf) -> Callable[[str], float]:
    """A finite duration above zero (or from zero, with `zero_ok`), at most `most`."""
    bound = "0 or more" if zero_ok else "above 0"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
            raise argparse.ArgumentTypeError(f"must be {bound} and finite, not {text}")
        if value > most:
            raise argparse.ArgumentTypeError(f"must be at most {most:g}, not {text}")
        return value

    return parse


def usage_errors_exit(parser: argparse.ArgumentParser, status: int) -> None:
    """Make `parser` refuse bad arguments with `status` instead of argparse's 2, for a command
    whose 2 already means something else (a verdict left unknown)."""

    def error(message: str) -> NoReturn:
        parser.print_usage(sys.stderr)
        parser.exit(status, f"{parser.prog}: error: {message}\n")

    parser.error = error  # type: ignore[method-assign]
    # Arguments no parser knew are refused by the top one (`cellar`), whose status is 2: it
    # looks this up to refuse them with the command's own (cellar/cli.py).
    parser.set_defaults(usage_error=error)
