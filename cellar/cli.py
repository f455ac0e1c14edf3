"""The `cellar` command line: one entry point with one subcommand per job.

Each subcommand lives in its own module, which exposes `configure(parser)`: it adds the
subcommand's arguments and sets `handler`, a function of the parsed arguments that returns the
exit status. Modules import their heavy dependencies inside the handler, so `cellar --help` and
`cellar check` stay quick and never load an event loop they do not need.

SIGTERM stops a command as Ctrl-C does: the commands that start processes and directories of
their own (`dev`, `bench`, `demo`) stop them on the way out, where the signal's default would
kill the command alone and leave its replicas running and their data behind. Daemons that
handle SIGTERM themselves (`replica`, `agent`) take it over once they run.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from types import FrameType

# name -> (module that configures it, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "dev": ("cellar.dev.command", "a local cluster (3 or 5 replicas) with simulated nodes at work"),
    "agent": ("cellar.agent_cli", "the node agent daemon: GPU health and jobs for one node"),
    "demo": ("cellar.demo", "show the GPU-allocation state machine at work on a large cluster"),
    "bench": ("cellar.bench", "benchmarks that print figures (medians of several runs)"),
    "check": ("jepsen.check_cli", "check a recorded history for linearizability"),
    "sim": ("jepsen.sim.cli", "the deterministic cluster simulator: run, sweep, latency"),
    "live": ("cellar.live.command", "a local cluster under the nemesis, its history checked"),
    "replica": ("cellar.replica_cli", "run one replica of the store"),
    "status": ("cellar.ops_cli", "each replica's role, view, sequencer, progress and lag"),
    "admin": ("cellar.admin_cli", "admin commands and queries against a live cluster"),
    "certs": ("consensus.runtime.certs_cli", "make the cluster's CA and TLS certificates"),
}

Handler = Callable[[argparse.Namespace], int]


def add_subcommands(
    parser: argparse.ArgumentParser, table: dict[str, tuple[str, str]], *, dest: str
) -> None:
    """Add one subparser per entry of `table`, each configured by its module."""
    subparsers = parser.add_subparsers(dest=dest, metavar="COMMAND", required=True)
    for name, (module_name, help_text) in table.items():
        subparser = subparsers.add_parser(name, help=help_text, description=help_text)
        module = importlib.import_module(module_name)
        module.configure(subparser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cellar",
        description="Cellar: a replicated cluster-state store for GPU clusters.",
    )
    add_subcommands(parser, COMMANDS, dest="command")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # refused with the command's own usage status where it has one
        refuse = getattr(args, "usage_error", parser.error)
        refuse(f"unrecognized arguments: {' '.join(unknown)}")
    handler: Handler = args.handler
    with _SigtermInterrupts() as sigterm:
        try:
            return handler(args)
        except KeyboardInterrupt:
            return 128 + (signal.SIGTERM if sigterm.seen else signal.SIGINT)
        except BrokenPipeError:  # the reader went away (`cellar admin nodes | head`)
            _quiet_stdout()
            return 128 + signal.SIGPIPE


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's flush at exit, into the pipe that
    broke, raises no second error."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


class _SigtermInterrupts:
    """While entered, SIGTERM interrupts as Ctrl-C does (unless SIGTERM is ignored, as its
    parent may have asked); `seen` tells whether it came.

    It hands the signal to whatever handles SIGINT at that moment: inside an event loop that is
    the loop's own handler (asyncio's runner cancels the main task, trio raises where it is
    safe), so the loop unwinds as it does for Ctrl-C instead of taking a KeyboardInterrupt in
    the middle of its own bookkeeping; outside one, Python's, which raises KeyboardInterrupt.
    """

    def __init__(self) -> None:
        self.seen = False
        self._installed = False

    def __enter__(self) -> _SigtermInterrupts:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self._interrupt)
            self._installed = True
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def _interrupt(self, signum: int, frame: FrameType | None) -> None:
        self.seen = True
        on_sigint = signal.getsignal(signal.SIGINT)
        if callable(on_sigint):
            on_sigint(signal.SIGINT, frame)
        else:  # SIGINT ignored or left to the system: interrupt anyway
            raise KeyboardInterrupt("SIGTERM")
