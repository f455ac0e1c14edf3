"""A key-value client's batches: its callers' concurrent puts, coalesced into PUTS commands.

Most of a small put's cost is the command's, not the put's: its session, envelope, reply, and
the request and its waiter, on the client and on every replica. A batch pays that once for
all its puts (cellar/kv/codec.py, PUTS). A put made while another command of this client is on
its way joins the open batch; the batch's own task, in the client's task group, closes it a
turn of the loop later (or once it holds `puts_max` puts or PUTS_BYTES_MAX bytes) and proposes
it, a batch of one as a plain PUT. A put made with nothing on its way goes at once, from its
caller's coroutine: a lone caller waits no turn of the loop and starts no task.

Each put stays linearizable on its own: its batch is proposed after every member was called
and answered before any returns, and its puts are applied in order, in one slot. Each member
gets its own put's code, or the batch's error (a copy of it, chained to it): OutcomeUnknown
when the batch may have been applied. A member cancelled while it waits leaves the batch to
go on, as a put cancelled on its way does; the client closing with a batch on its way fails its
members with OutcomeUnknown.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable
from dataclasses import dataclass, field

import anyio

from cellar.kv.codec import (
    PUT_FRAMING_BYTES,
    PUTS_BYTES_MAX,
    PUTS_FRAMING_BYTES,
    PUTS_MAX,
    Code,
    decode_puts_reply,
    decode_reply,
    encode_put,
    encode_puts_fields,
    encode_reply,
)
from consensus.runtime.client import CellarClient, OutcomeUnknown

# The session's refusals, which it does not remember (statemachine/sessions.py): after a retry
# the client raises OutcomeUnknown for them, as a copy sent earlier may still be applied. And
# SESSION_EXPIRED: a copy ran, and its reply is gone. The machine answers each alone, whether
# the command was a PUT or a PUTS, so its reply's bytes name it.
_SESSION_REFUSALS = (Code.SESSION_TOO_OLD, Code.SESSIONS_FULL, Code.SESSION_EXPIRED)
_NOT_APPLIED = {encode_reply(code): code.name for code in _SESSION_REFUSALS}
not_applied = _NOT_APPLIED.get


@dataclass(eq=False)
class _Batch:
    fields: list[bytes]  # key, value, key, value, ...
    bytes_total: int
    # How its members wait: on asyncio a future each, made on `loop`, whose result is the
    # member's code (a member cancelled cancels only its own); anyio's Event (a future each
    # too, behind two layers of calls) took a third of the client's CPU at 4096 callers. On
    # any other loop, `event`.
    loop: asyncio.AbstractEventLoop | None
    futures: list[asyncio.Future[Code]] = field(default_factory=list)
    event: anyio.Event | None = None
    codes: list[Code] = field(default_factory=list)
    error: Exception | None = None

    def __post_init__(self) -> None:
        if self.loop is None:
            self.event = anyio.Event()

    def finish(self) -> None:
        """Answer every member still waiting: its put's code, or its copy of the error."""
        for index, future in enumerate(self.futures):
            if future.done():  # its member was cancelled
                continue
            if self.error is None:
                future.set_result(self.codes[index])
            else:
                future.set_exception(_raised_copy(self.error))
        if self.event is not None:
            self.event.set()

    def code(self, index: int) -> Code:
        """The code of the batch's `index`th put, or the batch's error raised."""
        if self.error is not None:
            raise _raised_copy(self.error)
        return self.codes[index]


def _asyncio_loop() -> asyncio.AbstractEventLoop | None:
    """The running loop if it is asyncio's, else None (trio runs none)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _raised_copy(error: Exception) -> Exception:
    """A copy for one member to raise, chained to `error`: a shared exception raised by each
    would gather every member's frames on one traceback."""
    try:
        own = copy.copy(error)
    except Exception:  # an error that cannot be rebuilt from its arguments
        own = OutcomeUnknown(f"a batch of puts failed: {error!r}")
    own.__cause__ = error  # as `raise own from error`
    own.__suppress_context__ = True
    return own


class PutBatches:
    """The puts of one client's callers, coalesced (module docstring)."""

    def __init__(self, client: CellarClient, puts_max: int = PUTS_MAX) -> None:
        if not 1 <= puts_max <= PUTS_MAX:
            raise ValueError(f"puts_max {puts_max}: from 1 (no batches) to {PUTS_MAX}")
        self._client = client
        self._puts_max = puts_max
        self._open: _Batch | None = None  # the batch a put joins, until its task takes it
        self._on_the_way = 0  # commands sent and unanswered, and the open batch

    def submit(self, key: bytes, value: bytes) -> Awaitable[Code]:
        """The put, to await for its code once applied (its key and value checked by the
        caller): on asyncio a put that joins a batch is the batch's future for it, so its
        caller's await reaches the future through no coroutine of ours (this runs per put)."""
        if self._on_the_way == 0 or self._puts_max == 1:
            return self._put_alone(key, value)
        batch, index = self._join(key, value)
        if batch.loop is None:
            return self._wait_for(batch, index)
        future: asyncio.Future[Code] = batch.loop.create_future()
        batch.futures.append(future)
        return future

    @staticmethod
    async def _wait_for(batch: _Batch, index: int) -> Code:
        """A member's put, on a loop other than asyncio's."""
        assert batch.event is not None
        await batch.event.wait()
        return batch.code(index)

    def _join(self, key: bytes, value: bytes) -> tuple[_Batch, int]:
        put_bytes = len(key) + len(value) + PUT_FRAMING_BYTES
        batch = self._open
        if batch is None or batch.bytes_total + put_bytes > PUTS_BYTES_MAX:
            batch = _Batch([], PUTS_FRAMING_BYTES, _asyncio_loop())
            self._client.start_soon(self._send, batch)  # first: it raises if the client closed
            self._open = batch
            self._on_the_way += 1
        index = len(batch.fields) >> 1
        batch.fields += (key, value)
        batch.bytes_total += put_bytes
        if index + 1 == self._puts_max:
            self._open = None  # full: the next put opens another
        return batch, index

    async def _put_alone(self, key: bytes, value: bytes) -> Code:
        """One put, a command of its own: a plain PUT."""
        self._on_the_way += 1
        try:
            return await self._propose_alone(key, value)
        finally:
            self._on_the_way -= 1

    async def _propose_alone(self, key: bytes, value: bytes) -> Code:
        code, _ = decode_reply(await self._client.propose(encode_put(key, value),
                                                          not_applied=not_applied))
        return code

    async def _send(self, batch: _Batch) -> None:
        if self._open is batch:
            self._open = None
        fields = batch.fields
        try:
            if len(fields) == 2:
                batch.codes = [await self._propose_alone(*fields)]
            else:
                reply = await self._client.propose(encode_puts_fields(fields),
                                                   not_applied=not_applied)
                batch.codes = decode_puts_reply(reply, len(fields) >> 1)
        except Exception as error:  # the members' to raise, each its own copy
            batch.error = error
        except BaseException:  # cancelled: the client is closing
            batch.error = OutcomeUnknown("the client closed with a batch of puts on its way")
            raise
        finally:
            self._on_the_way -= 1
            batch.finish()
