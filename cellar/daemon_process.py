"""What the long-running commands (`cellar replica`, `cellar agent`) share: their logging
options, the event loop a configuration asks for, and running a service until SIGTERM or SIGINT
stops it cleanly."""

from __future__ import annotations

import argparse
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.abc import TaskStatus

from consensus.runtime.logs import configure_logging

EXIT_CONFIG = 78  # EX_CONFIG: a bad configuration file
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: a port to listen on is taken (or not this host's)
logger = logging.getLogger("cellar")
Service = Callable[..., Awaitable[None]]  # async def run(*, task_status) -> None


def add_logging_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", default="info",
                        choices=("debug", "info", "warning", "error"))
    parser.add_argument("--plain-logs", action="store_true",
                        help="human-readable log lines instead of JSON")


def start_logging(args: argparse.Namespace) -> None:
    """Logging as `add_logging_arguments`'s options ask: JSON lines unless --plain-logs."""
    configure_logging(args.log_level, json_lines=not args.plain_logs)


def loop_options(loop: str) -> tuple[str, dict[str, Any]]:
    """anyio's backend and options for `loop` (asyncio, uvloop or trio); uvloop falls back to
    plain asyncio, with a warning, where it is not installed."""
    if loop == "trio":
        return "trio", {}
    if loop == "uvloop":
        try:
            import uvloop  # noqa: F401, PLC0415 - only to know whether it is there
        except ImportError:
            logger.warning("uvloop is not installed; running on plain asyncio")
            return "asyncio", {}
        return "asyncio", {"use_uvloop": True}
    return "asyncio", {}


async def serve_until_signalled(run: Service) -> None:
    """Start `run` and stop it on the first SIGTERM or SIGINT."""
    async with anyio.create_task_group() as tasks:
        await tasks.start(_started, run)
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for received in signals:
                logger.info("stopping on signal %s", signal.Signals(received).name)
                tasks.cancel_scope.cancel()
                break


async def _started(run: Service, *, task_status: TaskStatus[None]) -> None:
    await run(task_status=task_status)
