"""Accepting connections: a loop that outlives the failures of accept() itself, and the bounded
counts that shed connections beyond a limit at once.

anyio's `Listener.serve` ends at the first accept() that fails, and with it everything that
awaits it: a replica process. Yet two kinds of failure are conditions of the moment:

- capacity (EMFILE, ENFILE, ENOBUFS, ENOMEM): the process or the system is out of descriptors
  or buffers, e.g. under a flood of connections. The pending connection stays in the kernel's
  backlog; the loop sleeps `ACCEPT_BACKOFF_S` (connections closing meanwhile free descriptors)
  and tries again, instead of spinning on an accept() that fails at once;
- one connection's trouble (ECONNABORTED, ECONNRESET, EPROTO, EPERM from a firewall, ...): the
  client gave up between connecting and being accepted. The loop goes on at once.

Either is counted (`ACCEPT_ERRORS`) and logged once per burst: a warning at the first failure,
a line saying how many there were when an accept succeeds again. Any other error is a bug (or
a listener closed under the loop) and ends it, as before.

On trio, anyio reports a failed accept() as `BrokenResourceError` caused by the OSError; the
loop looks through it.

A listener that cannot bind (the port in use, an address not this host's) raises
`CannotListen`, naming the address: the bare OSError names none, and a replica binds three.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast

import anyio
import anyio.abc
from anyio.streams.stapled import MultiListener

from consensus.runtime.framing import HANDSHAKES_REFUSED_BARRED, HANDSHAKES_REFUSED_LIMIT, Metrics
from consensus.runtime.handshake_guard import HandshakeGuard

logger = logging.getLogger("cellar.transport")

T = TypeVar("T")
T_Stream = TypeVar("T_Stream")
T_Accepted_co = TypeVar("T_Accepted_co", covariant=True)
ACCEPT_BACKOFF_S = 0.1
ACCEPT_ERRORS = "transport.accept_errors"  # counter: accept() calls that failed and were retried
CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
CONNECTION_ERRNOS = frozenset(
    getattr(errno, name) for name in (
        "ECONNABORTED", "ECONNRESET", "EPROTO", "EPERM", "ENETDOWN", "ENETUNREACH",
        "EHOSTDOWN", "EHOSTUNREACH", "ENONET", "ENOPROTOOPT", "EOPNOTSUPP", "ETIMEDOUT",
        "ENOSR")
    if hasattr(errno, name))


class CannotListen(OSError):
    """A listening socket could not be bound on `address` (HOST:PORT)."""

    def __init__(self, address: str, error: OSError) -> None:
        super().__init__(error.errno, error.strerror)
        self.address = address

    def __str__(self) -> str:
        return f"cannot listen on {self.address} ({self.strerror})"


async def listen_tcp(host: str, port: int) -> MultiListener[anyio.abc.SocketStream]:
    """anyio's TCP listener on `host`:`port` (port 0: any); CannotListen if it cannot bind."""
    try:
        return await anyio.create_tcp_listener(local_host=host, local_port=port)
    except OSError as error:
        raise CannotListen(f"{host}:{port}", error) from error


class Accepting(Protocol[T_Accepted_co]):
    """What the loop needs of a listener (anyio's socket listeners, or a test's fake)."""

    async def accept(self) -> T_Accepted_co: ...


class Slots:
    """A count bounded by `limit`, taken without waiting: when none is free the caller sheds the
    connection at once (a waiting queue would itself be an unbounded resource)."""

    __slots__ = ("in_use", "limit")

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"a limit must be positive, got {limit}")
        self.limit = limit
        self.in_use = 0

    def take(self) -> bool:
        """Take one; False, taking nothing, when all are in use."""
        if self.in_use >= self.limit:
            return False
        self.in_use += 1
        return True

    def release(self) -> None:
        assert self.in_use > 0, "a slot released twice"
        self.in_use -= 1


@contextlib.contextmanager
def holding(slots: Slots, metrics: Metrics, refused: str) -> Iterator[bool]:
    """One of `slots` for the block (True), given back after it; False, counting `refused`,
    when none is free (the caller sheds the connection)."""
    if not slots.take():
        metrics[refused] += 1
        yield False
        return
    try:
        yield True
    finally:
        slots.release()


async def authenticated(stream: T_Stream, handshake: Callable[[T_Stream], Awaitable[T]],
                        handshakes: Slots, metrics: Metrics, *, guard: HandshakeGuard,
                        host: str | None) -> T | None:
    """`handshake(stream)` holding one of `handshakes` while it runs; None when it refused the
    connection (charged to `host` in `guard`), when `guard` bars `host`, or when no handshake
    place was free (each counted)."""
    if guard.barred(host):
        metrics[HANDSHAKES_REFUSED_BARRED] += 1
        return None
    with holding(handshakes, metrics, HANDSHAKES_REFUSED_LIMIT) as held:
        if not held:
            return None
        accepted = await handshake(stream)
    if accepted is None:
        guard.failed(host)
    return accepted


def retried_errno(error: BaseException) -> int | None:
    """The errno of an accept() failure the loop outlives, or None for any other error."""
    cause = error if isinstance(error, OSError) else error.__cause__
    if isinstance(cause, OSError) and cause.errno in CAPACITY_ERRNOS | CONNECTION_ERRNOS:
        return cause.errno
    return None


async def accept_forever(listener: anyio.abc.Listener[T_Stream],
                         handler: Callable[[T_Stream], Coroutine[Any, Any, Any]],
                         task_group: anyio.abc.TaskGroup, *, what: str, metrics: Metrics,
                         backoff_s: float = ACCEPT_BACKOFF_S) -> None:
    """`listener.serve(handler, task_group)` that outlives transient accept() failures (see the
    module docstring); `what` names the listener in log lines."""
    listeners = cast("Sequence[Accepting[T_Stream]]", listener.listeners
                     if isinstance(listener, MultiListener) else [listener])
    acceptor = _Acceptor(handler, task_group, what, metrics, backoff_s)
    async with anyio.create_task_group() as loops:
        for one in listeners:
            loops.start_soon(acceptor.accept_from, one)


@dataclass(frozen=True, slots=True)
class _Acceptor(Generic[T_Stream]):
    handler: Callable[[T_Stream], Coroutine[Any, Any, Any]]
    task_group: anyio.abc.TaskGroup  # where each connection's handler runs
    what: str
    metrics: Metrics
    backoff_s: float

    async def accept_from(self, listener: Accepting[T_Stream]) -> None:
        failures = 0  # in the burst under way
        while True:  # until cancelled, or an error no retry can mend
            try:
                stream = await listener.accept()
            except (OSError, anyio.BrokenResourceError) as error:
                code = retried_errno(error)
                if code is None:
                    raise
                self.metrics[ACCEPT_ERRORS] += 1
                if failures == 0:
                    logger.warning("%s: accept() failed: %s; going on (logged once per burst)",
                                   self.what, errno.errorcode.get(code, code))
                failures += 1
                if code in CAPACITY_ERRNOS:
                    await anyio.sleep(self.backoff_s)
                continue
            if failures:
                logger.warning("%s: accepting again after %d failed accept() calls", self.what,
                               failures)
                failures = 0
            self.task_group.start_soon(self.handler, stream)
