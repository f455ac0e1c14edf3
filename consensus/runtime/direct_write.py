"""A frame writer's short way to the socket: anyio's TLS stream, written without its awaits.

`TLSStream.send` over anyio's asyncio `SocketStream` encrypts into a memory BIO, then awaits
the socket stream's `send`, which walks the task's cancel scopes, writes to the transport, and
yields to the loop once more inside a new shielded cancel scope. That is about 320 bytecodes
and a turn of the loop for each write: at one caller, the sequencer's replica makes nine writes
a put, and they were an eighth of its bytecodes (valgrind and an opcode trace, put by put).

`DirectWrite` does the same work without the awaits when nothing needs waiting for: the same
`SSLObject.write` (the C write it wraps, called without the wrapper's frame; only where that
wrapper is the standard library's own), the same bytes read out of the same BIO, the same
`transport.write`, so the bytes on the wire are unchanged. It takes the write only while the
transport accepts data (its protocol's write event set: not paused above the high-water mark),
the stream is neither closed, broken nor failed, and the TLS object takes the data at once;
otherwise it declines, and the caller takes anyio's way, which waits, raises or fails as it
always did. After a write that filled the transport's buffer past the high-water mark, `drain`
waits for it to empty below it and raises what anyio's `send` would then raise, as anyio's does.

A writer that takes this way does not yield after each write. Frame writers are fed by other
tasks (the driver's sends, the server's answers) and wait on their queue once it is empty, so
a writer still yields, to its producers, between batches.

Only anyio's asyncio backend is known here (its private fields are read, checked once when the
writer is made): any other stream (trio's, a plain memory stream in tests, a future anyio
without these fields) gets `None` from `direct_write` and goes anyio's way.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Any

import anyio
from anyio.streams.tls import TLSStream


class DirectWrite:
    """Writes to one anyio asyncio socket stream, through its TLS object if it has one."""

    __slots__ = ("_bio", "_protocol", "_seal", "_socket", "_tls", "_transport")

    def __init__(self, tls: TLSStream | None, socket: Any) -> None:
        self._tls = tls
        # SSLObject.write(data) is `self._sslobj.write(data)`: that one call, without its frame
        self._seal: Callable[[bytes], int] | None = None if tls is None else \
            tls._ssl_object._sslobj.write  # type: ignore[attr-defined]
        self._bio: ssl.MemoryBIO | None = None if tls is None else tls._write_bio
        self._socket = socket
        self._transport: asyncio.Transport = socket._transport
        self._protocol: Any = socket._protocol

    def write(self, data: bytes) -> bool:
        """Whether `data` went to the transport here; False: nothing was written, the caller
        sends it anyio's way."""
        protocol = self._protocol
        if self._socket._closed or protocol.exception is not None or \
                not protocol.write_event.is_set() or self._transport.is_closing():
            return False
        if self._seal is None:
            self._transport.write(data)
            return True
        assert self._tls is not None and self._bio is not None
        if self._tls._broken or self._bio.pending:  # anyio's way flushes or raises
            return False
        try:
            self._seal(data)
        except ssl.SSLError:  # nothing taken (a handshake or renegotiation under way)
            return False
        self._transport.write(self._bio.read())
        return True

    @property
    def paused(self) -> bool:
        """Whether the transport's buffer is past its high-water mark (call `drain`)."""
        return not self._protocol.write_event.is_set()

    async def drain(self) -> None:
        """Wait for the transport to take data again, as anyio's `send` does after a write."""
        protocol = self._protocol
        await protocol.write_event.wait()
        if self._socket._closed:
            raise anyio.ClosedResourceError
        if protocol.exception is not None:
            raise anyio.BrokenResourceError from protocol.exception


def asyncio_streams(stream: object, transport_methods: tuple[str, ...], event: str,
                    ) -> tuple[TLSStream | None, Any] | None:
    """(the TLS stream, or None, and the socket stream) where `stream` is anyio's TLS stream
    over its asyncio `SocketStream`, or that socket stream alone, with the private fields a
    direct writer or reader reads: the socket stream's `_closed`, its transport's
    `transport_methods`, its protocol's `exception` and asyncio Event `event`, and the TLS
    stream's SSL object, write BIO and `_broken`. Else None: only anyio's way may be used."""
    tls = stream if type(stream) is TLSStream else None
    socket = stream if tls is None else tls.transport_stream
    kind = type(socket)
    if kind.__name__ != "SocketStream" or kind.__module__ != "anyio._backends._asyncio":
        return None
    protocol = getattr(socket, "_protocol", None)
    transport = getattr(socket, "_transport", None)  # uvloop's is no asyncio.Transport
    if not all(callable(getattr(transport, name, None)) for name in transport_methods) or \
            not isinstance(getattr(protocol, event, None), asyncio.Event) or \
            not hasattr(protocol, "exception") or not hasattr(socket, "_closed"):
        return None
    if tls is not None and (
            not isinstance(getattr(tls, "_ssl_object", None), ssl.SSLObject) or
            # only the standard library's own SSLObject is known to read and write through
            # its `_sslobj` alone
            type(tls._ssl_object).read is not ssl.SSLObject.read or
            type(tls._ssl_object).write is not ssl.SSLObject.write or
            not all(callable(getattr(getattr(tls._ssl_object, "_sslobj", None), name, None))
                    for name in ("read", "write", "pending")) or
            not isinstance(getattr(tls, "_write_bio", None), ssl.MemoryBIO) or
            not isinstance(getattr(tls, "_broken", None), bool)):
        return None
    return tls, socket


def direct_write(stream: object) -> DirectWrite | None:
    """A `DirectWrite` for `stream` (anyio's TLS stream over its asyncio socket stream, or
    that socket stream alone), or None where only anyio's `send` may be used."""
    found = asyncio_streams(stream, ("write", "is_closing"), "write_event")
    return None if found is None else DirectWrite(*found)
