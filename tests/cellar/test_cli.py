"""The `cellar` entry point: SIGTERM ends a command the way Ctrl-C does (its `finally` blocks
run, so the processes and directories it started go with it), unless SIGTERM was ignored."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
from collections.abc import Iterator

import pytest

from cellar import cli


@pytest.fixture
def command(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A `cellar` subcommand whose handler sends this process `signal` and records what ran."""
    ran: list[str] = []

    def configure(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("signal", type=int)
        parser.set_defaults(handler=handler)

    def handler(args: argparse.Namespace) -> int:
        try:
            os.kill(os.getpid(), args.signal)
            ran.append("after the signal")
            return 0
        finally:
            ran.append("cleanup")

    module = argparse.Namespace(configure=configure)
    monkeypatch.setattr(cli, "COMMANDS", {"signalled": ("fake.module", "test")})
    monkeypatch.setattr(importlib, "import_module", lambda name: module)
    yield ran
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back as found


def test_sigterm_runs_the_command_s_cleanup_and_exits_143(command: list[str]) -> None:
    assert cli.main(["signalled", str(int(signal.SIGTERM))]) == 143
    assert command == ["cleanup"]


def test_ctrl_c_still_exits_130(command: list[str]) -> None:
    assert cli.main(["signalled", str(int(signal.SIGINT))]) == 130
    assert command == ["cleanup"]


def test_an_ignored_sigterm_stays_ignored(command: list[str]) -> None:
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        assert cli.main(["signalled", str(int(signal.SIGTERM))]) == 0
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert command == ["after the signal", "cleanup"]
