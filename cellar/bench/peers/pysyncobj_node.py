"""One PySyncObj Raft node of the peer benchmark, and the wire format its clients speak.

Run as a script by the python of the PySyncObj virtual environment that the benchmark creates,
so it imports only the standard library and (inside `main`) `pysyncobj`: never cellar. The
benchmark's client (`pysyncobj_peer.py`) imports the framing functions from here, so both sides
share one codec.

The node holds a key-value map in a `SyncObjConsumer` with two `@replicated` methods. Both
`put` *and* `get` go through the Raft log: a get is a log entry whose applied result is the
value, so reads are linearizable (PySyncObj has no lease or read-index read).

PySyncObj 0.3.17 defaults that matter, all kept unless `--conf KEY=VALUE` overrides them:
`appendEntriesUseBatch=True` (the leader sends queued entries on its next AppendEntries round,
every `appendEntriesPeriod=0.1` s, rather than at once), `autoTickPeriod=0.05` s (the tick
thread's poll timeout), `raftMinTimeout=0.4`/`raftMaxTimeout=1.4` s (election timeouts),
`appendEntriesBatchSizeBytes=64 KiB`, `commandsQueueSize=100000`, `logCompactionMinEntries=5000`
(a forked full dump to the dump file). The journal is a memory-mapped file; PySyncObj never
fsyncs or msyncs it while running (`FileJournal.flush` exists but only `destroy` calls it) and has
no option to, so an acknowledged write survives a process crash but not a machine crash.

Wire format, both ways: a 4-byte big-endian payload length, then the payload (at most 1 MiB).
Request payload: op (1 byte), request id (8 bytes), key length (2 bytes), key, value (the rest).
Reply payload: status (1 byte), request id (8 bytes), body (the rest). Replies carry the request
id, so one connection pipelines many concurrent requests.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import functools
import importlib
import signal
import struct
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAX_FRAME_BYTES = 1 << 20
LENGTH = struct.Struct(">I")
REQUEST_HEAD = struct.Struct(">BQH")  # op, request id, key length
REPLY_HEAD = struct.Struct(">BQ")  # status, request id

OP_PUT = 1
OP_GET = 2
OP_STATUS = 3  # body of the reply: b"L" or b"F" (leader or not), then the leader's raft address

STATUS_OK = 0  # put done, or get found the key (body = value)
STATUS_ABSENT = 1  # get: no such key
STATUS_NOT_LEADER = 2  # body: the leader's raft address ("host:port"), empty when unknown
STATUS_RETRY = 3  # PySyncObj failed the command (body: its FAIL_REASON byte); try again
STATUS_BAD_REQUEST = 4

# PySyncObj's FAIL_REASON codes, for messages (the node sends the number).
FAIL_REASONS = {1: "QUEUE_FULL", 2: "MISSING_LEADER", 3: "DISCARDED", 4: "NOT_LEADER",
                5: "LEADER_CHANGED", 6: "REQUEST_DENIED", 7: "UNKNOWN_OUTCOME"}


class FrameError(ValueError):
    """A frame or payload that breaks the wire format: the connection is closed."""


@dataclass(frozen=True, slots=True)
class Request:
    op: int
    request_id: int
    key: bytes
    value: bytes


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    request_id: int
    body: bytes


def _framed(payload: bytes) -> bytes:
    if len(payload) > MAX_FRAME_BYTES:
        raise FrameError(f"payload of {len(payload)} bytes exceeds {MAX_FRAME_BYTES}")
    return LENGTH.pack(len(payload)) + payload


def encode_request(request: Request) -> bytes:
    """The whole frame (length prefix included) for `request`."""
    if len(request.key) > 0xFFFF:
        raise FrameError(f"key of {len(request.key)} bytes exceeds 65535")
    head = REQUEST_HEAD.pack(request.op, request.request_id, len(request.key))
    return _framed(head + request.key + request.value)


def decode_request(payload: bytes) -> Request:
    if len(payload) < REQUEST_HEAD.size:
        raise FrameError(f"request payload of {len(payload)} bytes is too short")
    op, request_id, key_bytes = REQUEST_HEAD.unpack_from(payload)
    if op not in (OP_PUT, OP_GET, OP_STATUS):
        raise FrameError(f"unknown op {op}")
    key_end = REQUEST_HEAD.size + key_bytes
    if key_end > len(payload):
        raise FrameError("key runs past the end of the payload")
    return Request(op, request_id, payload[REQUEST_HEAD.size:key_end], payload[key_end:])


def encode_reply(reply: Reply) -> bytes:
    return _framed(REPLY_HEAD.pack(reply.status, reply.request_id) + reply.body)


def decode_reply(payload: bytes) -> Reply:
    if len(payload) < REPLY_HEAD.size:
        raise FrameError(f"reply payload of {len(payload)} bytes is too short")
    status, request_id = REPLY_HEAD.unpack_from(payload)
    if status > STATUS_BAD_REQUEST:
        raise FrameError(f"unknown status {status}")
    return Reply(status, request_id, payload[REPLY_HEAD.size:])


def split_frames(buffer: bytearray) -> list[bytes]:
    """Remove every complete frame from the front of `buffer` and return their payloads; a
    length prefix over `MAX_FRAME_BYTES` raises `FrameError` before its payload arrives."""
    payloads: list[bytes] = []
    start = 0
    while len(buffer) - start >= LENGTH.size:
        (size,) = LENGTH.unpack_from(buffer, start)
        if size > MAX_FRAME_BYTES:
            raise FrameError(f"frame of {size} bytes exceeds {MAX_FRAME_BYTES}")
        end = start + LENGTH.size + size
        if end > len(buffer):
            break
        payloads.append(bytes(buffer[start + LENGTH.size:end]))
        start = end
    del buffer[:start]
    return payloads


# --- the node: everything below runs only in the PySyncObj virtual environment -----------------

Completion = tuple["ClientConnection", int, int, Any, int]  # conn, request id, op, result, error


class ClientConnection(asyncio.Protocol):
    """One client's TCP connection: frames in, requests handed to the node, replies out."""

    def __init__(self, node: NodeServer) -> None:
        self.node = node
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        try:
            for payload in split_frames(self.buffer):
                self.node.handle(self, decode_request(payload))
        except FrameError as error:
            print(f"closing a client connection: {error}", file=sys.stderr)
            if self.transport is not None:
                self.transport.close()

    def send(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)


class NodeServer:
    """Hands client requests to PySyncObj and its completions back to the event loop.

    PySyncObj calls the completion callbacks on its tick thread; they only append to a deque
    and, when no drain is pending, schedule one with `call_soon_threadsafe`. So the tick thread
    never blocks, and one wake-up of the loop carries every reply of a committed batch, written
    with one `write` per connection."""

    def __init__(self, loop: asyncio.AbstractEventLoop, store: Any, syncobj: Any) -> None:
        self.loop = loop
        self.store = store
        self.syncobj = syncobj
        self.completed: deque[Completion] = deque()
        self.drain_scheduled = False

    def leader_address(self) -> bytes:
        leader = self.syncobj._getLeader()
        return b"" if leader is None else str(leader.address).encode()

    def handle(self, conn: ClientConnection, request: Request) -> None:
        if request.op == OP_STATUS:
            role = b"L" if self.syncobj._isLeader() else b"F"
            conn.send(encode_reply(Reply(STATUS_OK, request.request_id,
                                         role + self.leader_address())))
            return
        if not self.syncobj._isLeader():
            conn.send(encode_reply(Reply(STATUS_NOT_LEADER, request.request_id,
                                         self.leader_address())))
            return
        callback = functools.partial(self.on_applied, conn, request.request_id, request.op)
        if request.op == OP_PUT:
            self.store.put(request.key, request.value, callback=callback)
        else:
            self.store.get(request.key, callback=callback)

    def on_applied(self, conn: ClientConnection, request_id: int, op: int, result: Any,
                   error: int) -> None:
        """Called on PySyncObj's tick thread: queue, and wake the loop once per batch."""
        self.completed.append((conn, request_id, op, result, error))
        if not self.drain_scheduled:
            self.drain_scheduled = True
            self.loop.call_soon_threadsafe(self.drain)

    def drain(self) -> None:
        self.drain_scheduled = False
        out: dict[ClientConnection, list[bytes]] = {}
        completed = self.completed
        while completed:
            conn, request_id, op, result, error = completed.popleft()
            out.setdefault(conn, []).append(encode_reply(reply_for(request_id, op, result, error)))
        for conn, frames in out.items():
            conn.send(b"".join(frames))


def reply_for(request_id: int, op: int, result: Any, error: int) -> Reply:
    if error != 0:
        return Reply(STATUS_RETRY, request_id, bytes([error & 0xFF]))
    if op == OP_GET and result is None:
        return Reply(STATUS_ABSENT, request_id, b"")
    return Reply(STATUS_OK, request_id, result if op == OP_GET else b"")


def make_store() -> Any:
    """The replicated key-value map (a consumer of the node's SyncObj)."""
    pysyncobj = importlib.import_module("pysyncobj")
    replicated = pysyncobj.replicated
    consumer: Any = pysyncobj.SyncObjConsumer

    class KvStore(consumer):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.data: dict[bytes, bytes] = {}

        @replicated  # type: ignore[untyped-decorator]
        def put(self, key: bytes, value: bytes) -> None:
            self.data[key] = value

        @replicated  # type: ignore[untyped-decorator]
        def get(self, key: bytes) -> bytes | None:
            return self.data.get(key)

    return KvStore()


@dataclass(frozen=True, slots=True)
class NodeOptions:
    self_address: str
    partners: tuple[str, ...]
    client_port: int
    journal_file: str
    dump_file: str
    conf: tuple[tuple[str, object], ...]  # SyncObjConf overrides


def parse_options(argv: list[str]) -> NodeOptions:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--self", dest="self_address", required=True, help="host:port (Raft)")
    parser.add_argument("--partners", default="", help="comma-separated host:port (Raft)")
    parser.add_argument("--client-port", type=int, required=True)
    parser.add_argument("--journal", required=True)
    parser.add_argument("--dump", required=True)
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a SyncObjConf override, VALUE a Python literal")
    args = parser.parse_args(argv)
    conf = tuple((item.split("=", 1)[0], ast.literal_eval(item.split("=", 1)[1]))
                 for item in args.conf)
    partners = tuple(part for part in args.partners.split(",") if part)
    return NodeOptions(args.self_address, partners, args.client_port, args.journal, args.dump,
                       conf)


async def serve(options: NodeOptions) -> None:
    pysyncobj = importlib.import_module("pysyncobj")
    conf = pysyncobj.SyncObjConf(journalFile=options.journal_file, fullDumpFile=options.dump_file,
                       **dict(options.conf))
    store = make_store()
    syncobj = pysyncobj.SyncObj(options.self_address, list(options.partners), conf,
                                consumers=[store])
    loop = asyncio.get_running_loop()
    node = NodeServer(loop, store, syncobj)
    factory: Callable[[], ClientConnection] = functools.partial(ClientConnection, node)
    server = await loop.create_server(factory, "127.0.0.1", options.client_port)
    stopped = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopped.set)
    print(f"serving clients on 127.0.0.1:{options.client_port}", file=sys.stderr, flush=True)
    try:
        await stopped.wait()
    finally:
        server.close()
        syncobj.destroy()


def main(argv: list[str] | None = None) -> None:
    asyncio.run(serve(parse_options(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    main()
