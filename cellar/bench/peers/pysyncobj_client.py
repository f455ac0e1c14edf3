"""The PySyncObj client of `cellar bench peers`: puts and gets on asyncio streams.

It speaks the small framed protocol of `pysyncobj_node` (whose codec it imports; that module
imports pysyncobj only when run as a node) over one connection to the leader that many
concurrent callers share, pipelined by request id; a node that is not the leader names the
leader, and the client reconnects there.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from cellar.bench.peers import pysyncobj_node as wire

CALL_TIMEOUT_S = 10.0
RETRY_PAUSE_S = 0.02
READ_CHUNK_BYTES = 1 << 16


class NotLeader(Exception):
    """The node is not the leader; `leader` is its raft address when it knows one."""

    def __init__(self, leader: str) -> None:
        super().__init__(f"not the leader (leader: {leader or 'unknown'})")
        self.leader = leader


class _Connection:
    """One TCP connection to a node: requests out (writes coalesced per loop turn), replies
    matched to their callers by request id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.pending: dict[int, asyncio.Future[wire.Reply]] = {}
        self.outgoing: list[bytes] = []
        self.ids = itertools.count(1)
        self.closed = False
        self.reader_task = asyncio.get_running_loop().create_task(self._read_replies(reader))

    @classmethod
    async def open(cls, address: tuple[str, int], timeout_s: float) -> _Connection:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(*address)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer)

    def request(self, op: int, key: bytes,
                value: bytes = b"") -> tuple[int, asyncio.Future[wire.Reply]]:
        """Send (at the end of this loop turn) and return the request id and reply future."""
        if self.closed:
            raise ConnectionError("connection closed")
        request_id = next(self.ids)
        future: asyncio.Future[wire.Reply] = asyncio.get_running_loop().create_future()
        self.pending[request_id] = future
        if not self.outgoing:
            asyncio.get_running_loop().call_soon(self._flush)
        self.outgoing.append(wire.encode_request(wire.Request(op, request_id, key, value)))
        return request_id, future

    def forget(self, request_id: int) -> None:
        """Stop waiting for `request_id` (answered, timed out or cancelled)."""
        self.pending.pop(request_id, None)

    def _flush(self) -> None:
        data, self.outgoing = b"".join(self.outgoing), []
        if not self.closed:
            self.writer.write(data)

    async def _read_replies(self, reader: asyncio.StreamReader) -> None:
        buffer = bytearray()
        error: Exception = ConnectionError("connection closed by the node")
        try:
            while chunk := await reader.read(READ_CHUNK_BYTES):
                buffer += chunk
                for payload in wire.split_frames(buffer):
                    reply = wire.decode_reply(payload)
                    future = self.pending.pop(reply.request_id, None)
                    if future is not None and not future.done():
                        future.set_result(reply)
        except (OSError, wire.FrameError) as failure:
            error = ConnectionError(f"connection failed: {failure}")
        finally:
            self._fail_all(error)

    def _fail_all(self, error: Exception) -> None:
        self.closed = True
        self.writer.close()
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)

    async def aclose(self) -> None:
        self._fail_all(ConnectionError("connection closed by the client"))
        self.reader_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await self.reader_task


@dataclass
class PySyncObjClient:
    """A KvClient: one connection to the leader, shared by every concurrent caller. A call
    that meets a non-leader, a failed command or a lost connection finds the leader again and
    retries (puts overwrite, so a retried put is harmless) until its `timeout_s` runs out."""

    nodes: Mapping[str, tuple[str, int]]  # raft address -> client address, per node
    timeout_s: float = CALL_TIMEOUT_S
    connection: _Connection | None = None
    leader_hint: str = ""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def put(self, key: bytes, value: bytes) -> None:
        await self._call(wire.OP_PUT, key, value)

    async def get(self, key: bytes) -> bytes | None:
        reply = await self._call(wire.OP_GET, key, b"")
        return None if reply.status == wire.STATUS_ABSENT else reply.body

    async def aclose(self) -> None:
        if self.connection is not None:
            await self.connection.aclose()
            self.connection = None

    async def _call(self, op: int, key: bytes, value: bytes) -> wire.Reply:
        async with asyncio.timeout(self.timeout_s):
            while True:
                connection = await self._leader_connection()
                request_id, future = connection.request(op, key, value)
                try:
                    reply = await future
                except ConnectionError:
                    await self._drop(connection)
                    continue
                finally:
                    connection.forget(request_id)
                if reply.status in (wire.STATUS_OK, wire.STATUS_ABSENT):
                    return reply
                if reply.status == wire.STATUS_BAD_REQUEST:
                    raise ValueError(f"pysyncobj node rejected the request: {reply.body!r}")
                if reply.status == wire.STATUS_NOT_LEADER:
                    self.leader_hint = reply.body.decode(errors="replace")
                    await self._drop(connection)
                else:
                    await asyncio.sleep(RETRY_PAUSE_S)

    async def _drop(self, connection: _Connection) -> None:
        async with self.lock:
            if self.connection is connection:
                self.connection = None
                await connection.aclose()

    async def _leader_connection(self) -> _Connection:
        current = self.connection
        if current is not None and not current.closed:
            return current
        async with self.lock:
            while self.connection is None or self.connection.closed:
                self.connection = await self._find_leader()
            return self.connection

    async def _find_leader(self) -> _Connection | None:
        """A connection to the node that says it leads, or None after a short pause."""
        hint = self.nodes.get(self.leader_hint)
        for address in [hint] if hint else list(self.nodes.values()):
            connection, leader = await _ask_status(address)
            if connection is not None:
                return connection
            self.leader_hint = leader
            if leader in self.nodes:
                return None
        self.leader_hint = ""
        await asyncio.sleep(RETRY_PAUSE_S)
        return None


async def _ask_status(address: tuple[str, int]) -> tuple[_Connection | None, str]:
    """(an open connection, "") when the node at `address` leads, else (None, the leader it
    names, "" when none or when it cannot be reached)."""
    try:
        connection = await _Connection.open(address, timeout_s=1.0)
    except (OSError, TimeoutError):
        return None, ""
    try:
        async with asyncio.timeout(1.0):
            status = await connection.request(wire.OP_STATUS, b"")[1]
    except (OSError, TimeoutError):
        await connection.aclose()
        return None, ""
    if status.body[:1] == b"L":
        return connection, ""
    await connection.aclose()
    return None, status.body[1:].decode(errors="replace")
