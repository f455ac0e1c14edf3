"""Relays on the links between local replicas, so that a live run can cut and slow them.

Each replica dials each peer through a relay of its own (one per directed link, on loopback),
which passes the bytes both ways unread: TLS runs end to end, so the peers still authenticate
each other. A replica sends only on the connection it dialed (consensus/runtime/peers.py), so
the link (a, b) carries a's messages to b and nothing else, and the nemesis can cut or slow
one direction alone, as the simulator does:

- a cut link closes its connections and refuses new ones at once (the dialer retries on its
  backoff), as a partition does to a dial that would time out, only sooner;
- a slowed link holds every chunk for `delay_s` before passing it on, in order; its queue is
  bounded, so a reader that falls behind stops reading and TCP pushes back on the sender.

Listeners bind before the replicas' configurations are written (their ports are in them), so
no other port picked afterwards can collide with them.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable
from dataclasses import dataclass, field

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from anyio.streams.stapled import MultiListener

from cellar.local_cluster import HOST

Link = tuple[int, int]  # (source, target): source's messages to target
CHUNKS_QUEUED_MAX = 256  # per direction of one connection, while a slowed link holds them
_CLOSED = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError)


@dataclass
class _LinkState:
    cut: bool = False
    delay_s: float = 0.0
    connections: list[anyio.CancelScope] = field(default_factory=list)


class LinkRelays:
    def __init__(self, replicas: int) -> None:
        self.links: list[Link] = [(source, target) for source in range(replicas)
                                  for target in range(replicas) if source != target]
        self.routes: dict[Link, int] = {}  # the relay's port for each link, once bound
        self._states = {link: _LinkState() for link in self.links}
        self._listeners: dict[Link, MultiListener[anyio.abc.SocketStream]] = {}
        self._target_ports: list[int] = []

    async def bind(self) -> None:
        """Listen on a fresh loopback port per link (see `routes`)."""
        for link in self.links:
            listener = await anyio.create_tcp_listener(local_host=HOST, local_port=0)
            self._listeners[link] = listener
            self.routes[link] = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def serve(self, target_ports: list[int], *,
                    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                    ) -> None:
        """Relay every link to its target's peer port until cancelled."""
        self._target_ports = list(target_ports)
        try:
            async with anyio.create_task_group() as group:
                for link, listener in self._listeners.items():
                    group.start_soon(listener.serve, functools.partial(self._relay, link))
                task_status.started()
        finally:
            with anyio.CancelScope(shield=True):  # serve ends by being cancelled
                await self.aclose()

    async def aclose(self) -> None:
        """Stop listening (again is harmless)."""
        for listener in self._listeners.values():
            with contextlib.suppress(*_CLOSED):
                await listener.aclose()

    def set_links(self, cut: Iterable[Link], slowed: Iterable[Link], delay_s: float) -> None:
        """The links cut and slowed from now on; every other link passes freely."""
        cut, slowed = set(cut), set(slowed)
        for link, state in self._states.items():
            state.delay_s = delay_s if link in slowed else 0.0
            if link in cut and not state.cut:
                for scope in state.connections:
                    scope.cancel()
            state.cut = link in cut

    async def _relay(self, link: Link, inbound: anyio.abc.SocketStream) -> None:
        state = self._states[link]
        with anyio.CancelScope() as scope:
            state.connections.append(scope)
            try:
                if state.cut:
                    return
                outbound = await anyio.connect_tcp(HOST, self._target_ports[link[1]])
                async with outbound, anyio.create_task_group() as group:
                    group.start_soon(self._direction, state, inbound, outbound, scope)
                    group.start_soon(self._direction, state, outbound, inbound, scope)
            except _CLOSED:
                pass
            finally:
                state.connections.remove(scope)
                await anyio.aclose_forcefully(inbound)

    async def _direction(self, state: _LinkState, source: anyio.abc.SocketStream,
                         sink: anyio.abc.SocketStream, scope: anyio.CancelScope) -> None:
        """Pass chunks from `source` to `sink`, each held for the link's delay when it came."""
        send, receive = anyio.create_memory_object_stream[tuple[float, bytes]](
            CHUNKS_QUEUED_MAX)
        async with anyio.create_task_group() as group:
            group.start_soon(self._write, receive, sink, scope)
            await self._read(state, source, send)
        scope.cancel()  # one direction ended: so does the connection

    @staticmethod
    async def _read(state: _LinkState, source: anyio.abc.SocketStream,
                    send: MemoryObjectSendStream[tuple[float, bytes]]) -> None:
        async with send:
            with contextlib.suppress(*_CLOSED):
                while True:
                    chunk = await source.receive()
                    await send.send((anyio.current_time() + state.delay_s, chunk))

    @staticmethod
    async def _write(receive: MemoryObjectReceiveStream[tuple[float, bytes]],
                     sink: anyio.abc.SocketStream, scope: anyio.CancelScope) -> None:
        async with receive:
            try:
                async for due, chunk in receive:
                    if due > anyio.current_time():
                        await anyio.sleep_until(due)
                    await sink.send(chunk)
            except _CLOSED:
                scope.cancel()
