"""A frame reader's short way from the socket: anyio's TLS stream, read without its awaits.

`TLSStream.receive` over anyio's asyncio `SocketStream` calls `SSLObject.read`; when that wants
more bytes it awaits the socket stream's `receive`, which enters a guard, resumes the
transport's reading, waits for a chunk, pauses the reading again (or, where a chunk is already
there, yields to the loop once more), and hands the chunk back to be written to the TLS read
BIO. On uvloop each resume and pause is a change to the loop's poller, a system call: two for
every chunk received, and a few hundred bytecodes more.

`DirectRead` does the same work without them: the same `SSLObject.read` (the C read it
wraps, called without the wrapper's frame; only where that wrapper is the standard
library's own), fed from the same
protocol `read_queue` (the oldest chunk taken, the protocol's `read_event` cleared once the
queue is empty, as anyio does) into the same read BIO, so the bytes handed out are unchanged.
It awaits only when the queue is empty, on the protocol's `read_event`, inside the stream's
receive guard: a future of the loop, put among the event's waiters as `Event.wait` does, but
without its look-up of the running loop, which costs a getpid system call at every wait (one
per message received at one caller: about 1 µs each on the 2-core VM). A chunk taken from
the queue is written to the BIO before any await, so a reader cancelled while waiting loses
nothing, and its future leaves the event's waiters.

It calls `SSLObject.read` only where the read may give something: bytes in the read BIO, bytes
of a record already decrypted (`SSLObject.pending`), or TLS bytes waiting to be sent. With none
of them the read can only raise SSLWantReadError: OpenSSL takes no record bytes from the BIO
ahead of the record it is reading (read-ahead is off, as the standard library leaves it), so
there is nothing else it could decrypt. Then the reader takes a chunk first. After a sleep, as
between one caller's requests, that spared read and its exception cost 8 to 13 µs of a cold
processor (timed read by read on the 2-core VM), against about 1 µs warm, on each chunk
received.

Reading is left on between receives instead of paused after each. The bytes waiting are still
bounded: the protocol's queue is swapped, once, for a `_MeteredQueue` that counts its bytes and
pauses the transport when they pass `RECEIVE_QUEUE_BYTES_MAX`, from the protocol's
`data_received` itself, so a reader that stops reading holds at most that bound plus one
chunk (one read of the transport). A reader that must wait, with the queue empty, resumes the
transport first. anyio's own `receive` (still used for the handshake, and as the fallback)
stays right beside this: it resumes before it waits and pauses after, and the queue's count
follows its takes.

Anything unusual is left to anyio's own code, which then waits, flushes or raises as it always
did: an empty queue with the stream at EOF, closed, aborted or failed (its `receive` raises
EndOfStream, ClosedResourceError or BrokenResourceError); a broken TLS stream; and any outcome of
`SSLObject.read` other than data or "wants more bytes" with nothing to send (SSLWantWriteError,
a failed record, a close_notify's empty read, TLS bytes waiting in the write BIO such as a key
update's answer). Such an outcome is replayed through anyio's `_call_sslobject_method`, so the
very same exception meets anyio's mapping, and no error is mapped here.

A reader that takes this way does not yield when bytes are already there, as `FrameReader`
does not for frames already decoded: it yields when the queue is empty, so it reads at most
the bound plus one chunk in one go.

Only anyio's asyncio backend is known here (its private fields are read, checked once when the
reader is made, with the running loop its waits use): any other stream (trio's, a memory
stream in tests, a future anyio without these fields, or a reader made outside a running loop)
gets `None` from `direct_read` and goes anyio's way.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import Callable, Iterable
from typing import Any

import anyio
from anyio.streams.tls import TLSStream

from consensus.runtime.deadlines import running_asyncio_loop
from consensus.runtime.direct_write import asyncio_streams

# Bytes received but not yet read, past which the transport stops reading (back-pressure).
RECEIVE_QUEUE_BYTES_MAX = 64 << 10

_popleft = collections.deque.popleft
_append = collections.deque.append
_appendleft = collections.deque.appendleft


class _MeteredQueue(collections.deque[bytes]):
    """anyio's protocol read queue, counting its bytes: past `bytes_max` the transport stops
    reading. anyio's protocol appends, its `receive` takes from the left and puts back what
    it split off; nothing else changes the queue."""

    __slots__ = ("_transport", "bytes_max", "queued_bytes")

    def __init__(self, chunks: Iterable[bytes], transport: Any, bytes_max: int) -> None:
        super().__init__(chunks)
        self._transport = transport
        self.bytes_max = bytes_max
        self.queued_bytes = sum(map(len, self))

    def append(self, chunk: bytes, /) -> None:
        _append(self, chunk)
        self.queued_bytes += len(chunk)
        if self.queued_bytes > self.bytes_max and self._transport.is_reading():
            self._transport.pause_reading()

    def appendleft(self, chunk: bytes, /) -> None:
        _appendleft(self, chunk)
        self.queued_bytes += len(chunk)

    def popleft(self) -> bytes:
        chunk: bytes = _popleft(self)
        self.queued_bytes -= len(chunk)
        return chunk


class DirectRead:
    """Reads from one anyio asyncio socket stream, through its TLS object if it has one."""

    __slots__ = ("_decrypted_bytes", "_guard", "_loop", "_protocol", "_queue", "_read",
                 "_read_bio", "_socket", "_tls", "_transport", "_write_bio")

    def __init__(self, tls: TLSStream | None, socket: Any,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._tls = tls
        # SSLObject.read(n) is `self._sslobj.read(n)`: that one call, without its frame
        self._read: Callable[[int], bytes] | None = None if tls is None else \
            tls._ssl_object._sslobj.read  # type: ignore[attr-defined]
        # SSLObject.pending(): bytes of a record decrypted and not yet read
        self._decrypted_bytes: Callable[[], int] | None = None if tls is None else \
            tls._ssl_object._sslobj.pending  # type: ignore[attr-defined]
        self._read_bio: ssl.MemoryBIO | None = None if tls is None else tls._read_bio
        self._write_bio: ssl.MemoryBIO | None = None if tls is None else tls._write_bio
        self._socket = socket
        self._loop = loop  # the stream's, found once: the waits need it
        self._guard: Any = socket._receive_guard
        self._transport: Any = socket._transport  # uvloop's is no asyncio.Transport
        protocol = self._protocol = socket._protocol
        queue = protocol.read_queue
        if type(queue) is not _MeteredQueue:  # swapped once, by the first reader made
            queue = protocol.read_queue = _MeteredQueue(queue, self._transport,
                                                        RECEIVE_QUEUE_BYTES_MAX)
        self._queue: _MeteredQueue = queue

    @property
    def queued_bytes(self) -> int:
        """Bytes received from the transport and not yet taken (at most the bound plus one
        chunk)."""
        return self._queue.queued_bytes

    async def receive(self, max_bytes: int) -> bytes:
        """What the stream's `receive(max_bytes)` gives, raising what it raises."""
        tls = self._tls
        assert tls is not None and self._read is not None
        assert self._read_bio is not None and self._write_bio is not None
        if max_bytes < 1 or tls._broken:  # anyio's way raises
            return await tls.receive(max_bytes)
        read, read_bio, write_bio, queue = self._read, self._read_bio, self._write_bio, self._queue
        decrypted_bytes = self._decrypted_bytes
        assert decrypted_bytes is not None
        while True:
            # With the read BIO empty and no record's bytes left decrypted, a read can only
            # say it wants more: take a chunk first, sparing the read and its exception
            if not (read_bio.pending or decrypted_bytes() or write_bio.pending):
                if not queue and not await self._chunk_arrived():
                    return await tls.receive(max_bytes)
                chunk = _popleft(queue)
                queue.queued_bytes -= len(chunk)
                if not queue:
                    self._protocol.read_event.clear()
                read_bio.write(chunk)  # before any await: a cancelled reader loses nothing
                continue
            try:
                data = read(max_bytes)
            except ssl.SSLWantReadError as wants:
                if write_bio.pending:  # anyio's way sends those bytes first
                    return await self._anyio_way(wants, max_bytes)
                continue  # OpenSSL took the BIO's bytes (a record's first piece): take more
            except Exception as error:  # SSLWantWriteError, a failed record, ...
                return await self._anyio_way(error, max_bytes)
            if not data or write_bio.pending:  # close_notify; or TLS has bytes to send
                return await self._anyio_way(data, max_bytes)
            return data

    async def _chunk_arrived(self) -> bool:
        """Wait on the protocol's `read_event`, inside the stream's receive guard and with the
        transport reading, for a chunk in the empty queue; whether one came. False, at once,
        where the stream is at EOF, closed, aborted or failed, or another task is receiving,
        and once woken by the stream ending or breaking: anyio's way says what that means."""
        protocol, transport, guard = self._protocol, self._transport, self._guard
        if protocol.read_event.is_set() or self._socket._closed or \
                protocol.exception is not None or protocol.is_at_eof or \
                transport.is_closing() or guard._guarded:
            return False
        if not transport.is_reading():
            transport.resume_reading()
        # `read_event.wait()`, with the loop known: the Event looks it up at every wait, and
        # asyncio's lookup asks the kernel for the process id (getpid) each time
        waiter = self._loop.create_future()
        waiters = protocol.read_event._waiters
        waiters.append(waiter)
        guard._guarded = True  # as anyio's receive guard
        try:
            await waiter
        finally:
            guard._guarded = False
            waiters.remove(waiter)
        return bool(self._queue)

    async def _anyio_way(self, outcome: bytes | Exception, max_bytes: int) -> bytes:
        """`TLSStream.receive`, its first `SSLObject.read` giving `outcome` (what the read
        here just gave): anyio flushes, waits, maps errors and ends as it always does."""
        tls, read = self._tls, self._read
        assert tls is not None and read is not None
        replayed = False

        def replay(n: int) -> bytes:
            nonlocal replayed
            if replayed:
                return read(n)
            replayed = True
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

        data = await tls._call_sslobject_method(replay, max_bytes)
        if not data:
            raise anyio.EndOfStream
        return data


class _PlainDirectRead(DirectRead):
    """A `DirectRead` for anyio's asyncio socket stream alone (plain TCP)."""

    __slots__ = ()

    async def receive(self, max_bytes: int) -> bytes:
        queue = self._queue
        if max_bytes < 1 or (not queue and not await self._chunk_arrived()):  # anyio's way
            return await self._socket.receive(max_bytes)  # type: ignore[no-any-return]
        chunk = _popleft(queue)
        if len(chunk) > max_bytes:  # split, as anyio does
            chunk, leftover = chunk[:max_bytes], chunk[max_bytes:]
            _appendleft(queue, leftover)
            queue.queued_bytes -= max_bytes
        else:
            queue.queued_bytes -= len(chunk)
        if not queue:
            self._protocol.read_event.clear()
        return chunk


def direct_read(stream: object) -> DirectRead | None:
    """A `DirectRead` for `stream` (anyio's TLS stream over its asyncio socket stream, or
    that socket stream alone), or None where only anyio's `receive` may be used."""
    found = asyncio_streams(stream, ("is_reading", "pause_reading", "resume_reading",
                                     "is_closing"), "read_event")
    if found is None:
        return None
    tls, socket = found
    loop = running_asyncio_loop()  # None outside a running loop: anyio's way
    protocol = socket._protocol
    if type(getattr(protocol, "read_queue", None)) not in (collections.deque, _MeteredQueue) or \
            not isinstance(getattr(protocol.read_event, "_waiters", None), collections.deque) or \
            not hasattr(protocol, "is_at_eof") or \
            not isinstance(getattr(getattr(socket, "_receive_guard", None), "_guarded", None),
                           bool) or \
            not callable(getattr(socket, "receive", None)) or loop is None:
        return None
    if tls is None:
        return _PlainDirectRead(None, socket, loop)
    if not isinstance(getattr(tls, "_read_bio", None), ssl.MemoryBIO) or \
            not callable(getattr(tls, "_call_sslobject_method", None)):
        return None
    return DirectRead(tls, socket, loop)
