"""The `cellar` entry point: SIGTERM ends a command the way Ctrl-C does (its `finally` blocks
run, so the processes and directories it started go with it), unless SIGTERM was ignored."""

from __future__ import annotations

import argparse
import importlib
import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from cellar import cli

ROOT = str(pathlib.Path(__file__).resolve().parents[2])


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
    # Ctrl-C's meaning in a terminal: a shell without job control starts its background
    # commands with SIGINT ignored, and a test run started that way failed here.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield ran
    signal.signal(signal.SIGINT, before)
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


def test_sigterm_goes_to_whatever_handles_ctrl_c(command: list[str]) -> None:
    """Inside an event loop that is the loop's own handler, which unwinds it safely."""
    calls: list[int] = []

    def on_sigint(signum: int, frame: object) -> None:
        calls.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        assert cli.main(["signalled", str(int(signal.SIGTERM))]) == 143
    finally:
        signal.signal(signal.SIGINT, previous)
    assert calls == [signal.SIGINT] and command == ["cleanup"]


def test_sigterm_interrupts_even_with_ctrl_c_ignored(command: list[str]) -> None:
    """A shell without job control starts background commands with SIGINT ignored."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert cli.main(["signalled", str(int(signal.SIGTERM))]) == 143
    finally:
        signal.signal(signal.SIGINT, previous)
    assert command == ["cleanup"]


@pytest.mark.parametrize(("argv", "message"), [
    (["dev", "--seconds", "-1"], "argument --seconds: must be above 0 and finite, not -1"),
    (["dev", "--seconds", "nan"], "argument --seconds: must be above 0 and finite, not nan"),
    (["dev", "--nodes", "0"], "argument --nodes: must be at least 4, not 0"),
    (["dev", "--nodes", "5"], "argument --nodes: must be a multiple of 4, not 5"),
    (["sim", "run", "--seed", "-1"], "argument --seed: must be at least 0, not -1"),
    (["live", "--seed", "-1"], "argument --seed: must be at least 0, not -1"),
    (["demo", "--seed", "-1"], "argument --seed: must be at least 0, not -1"),
    (["dev", "--seed", "-1"], "argument --seed: must be at least 0, not -1"),
    (["bench", "statemachine", "--seed", "-1"], "argument --seed: must be at least 0, not -1"),
    (["check", "h.jsonl", "--model", "register", "--jsn"], "unrecognized arguments: --jsn"),
    (["live", "--no-such-option"], "unrecognized arguments: --no-such-option"),
    (["sim", "run", "--seed", "1", "--bogus"], "unrecognized arguments: --bogus"),
    (["demo", "--pace", "-1"], "argument --pace: must be 0 or more and finite, not -1"),
    (["demo", "--rounds", "0"], "argument --rounds: must be at least 1, not 0"),
    (["sim", "run", "--seed", "1", "--safety-ms", "-5"],
     "argument --safety-ms: must be at least 1, not -5"),
    (["sim", "latency", "--seconds", "0"], "argument --seconds: must be at least 1, not 0"),
    (["check", "--model", "cas-register", "--timeout", "-1", "history.json"],
     "argument --timeout: must be 0 or more and finite, not -1"),
    (["certs", "init", "dir", "--days", "0"], "argument --days: must be at least 1, not 0"),
    (["status", "--timeout", "0"], "argument --timeout: must be above 0 and finite, not 0"),
    (["bench", "cluster", "--clients", "0"], "argument --clients: must be at least 1, not 0"),
    (["bench", "statemachine", "--samples", "x"], "argument --samples: not a whole number"),
    (["bench", "agent", "--seconds", "inf"], "argument --seconds: must be above 0 and finite"),
])
def test_a_bad_number_is_refused_before_anything_starts(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        cli.main(argv)
    # check's, live's and sim's 0-2 are verdicts; status's too (its usage errors: EX_USAGE)
    assert stopped.value.code == {"check": 3, "live": 3, "sim": 3, "status": 64}.get(argv[0], 2)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["dev", "--insecure"], ["bench", "cluster", "--insecure"]])
def test_commands_whose_clients_act_as_nodes_offer_no_plain_tcp(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Without TLS every client is one administrator identity, from which the state machine
    refuses node commands: `dev --insecure` bound nothing and `bench cluster --insecure` died.
    The option is gone: a usage error before anything starts."""
    with pytest.raises(SystemExit) as stopped:
        cli.build_parser().parse_args(argv)
    assert stopped.value.code == 2
    assert "unrecognized arguments: --insecure" in capsys.readouterr().err


# A command whose output outruns a reader that stops after the first line.
FLOODS_STDOUT = """
import argparse, sys
from cellar import cli
parser = argparse.ArgumentParser()
parser.set_defaults(handler=lambda args: [print("x" * 4096) for _ in range(10_000)] and 0)
cli.build_parser = lambda: parser
sys.exit(cli.main([]))
"""


def test_a_reader_that_stops_early_ends_the_command_quietly() -> None:
    """`cellar admin nodes | head` had ended in a BrokenPipeError traceback."""
    process = subprocess.Popen([sys.executable, "-c", FLOODS_STDOUT], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": ROOT})
    assert process.stdout is not None and process.stderr is not None
    process.stdout.readline()
    process.stdout.close()  # as `head -1` does
    assert process.wait(timeout=30) == 128 + signal.SIGPIPE
    assert process.stderr.read() == b""
