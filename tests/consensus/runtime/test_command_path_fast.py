"""The per-command fast paths of the replica's server and driver and of the client, each
pinned to the general path it stands for: the same bytes, objects, refusals and counts.

- client_codec.decode_request_fields: a valid propose as its fields, anything else as
  decode_request returns it (or refuses it, in the same words);
- the server's envelope (packed inline) and OK answer: encode_envelope_of's and encode_ok's
  bytes, the stamp clamped by the client's send time as `_stamp_ms` clamps it;
- the server's stamp (`_TurnStamp`): one reading of the clock per turn of the event loop,
  every reading outside an asyncio loop;
- KvStore.put: encode_put's bytes, an OK taken without decoding;
- Histogram.observe_many / Metrics.observe_many: the counts and total of observing each;
- KvMachine.apply's path for a session's next command: the replies and state of the general
  path (lookup, then record), against a copy of the apply that always takes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellar.kv import machine as kv_machine
from cellar.kv.codec import Code, Operation, encode_put, encode_reply
from cellar.kv.codec import decode_request as decode_kv_request
from cellar.kv.machine import KvMachine
from cellar.kv.store import KvStore
from consensus.codec import decode_envelope_fields, encode_envelope_of, pack
from consensus.envelope import Principal, Role
from consensus.errors import InvalidMessage
from consensus.runtime import server as server_module
from consensus.runtime.client_codec import (
    Propose,
    decode_request,
    decode_request_fields,
    encode_ok,
    encode_propose,
)
from consensus.runtime.metrics import Histogram, Metrics
from consensus.runtime.server import SENT_MS_SLACK_MS, ClientServer
from statemachine.sessions import command_checksum, session_key
from tests.consensus.runtime.driver_stub import DriverStub
from tests.consensus.runtime.local import Sink

pytestmark = pytest.mark.anyio


def outcome(decode: Callable[[], object]) -> object:
    """What `decode()` returns, or the words it refuses the input in."""
    try:
        return decode()
    except InvalidMessage as error:
        return ("refused", error.reason)

ints = st.one_of(st.integers(-5, 5), st.integers(-2**63, 2**64 - 1))
fields = st.one_of(ints, st.text(max_size=5), st.binary(max_size=5), st.none(), st.booleans())
proposes = st.tuples(st.integers(0, 2**63 - 1), st.text(max_size=40), st.integers(0, 2**63 - 1),
                     st.binary(max_size=40), st.integers(0, 600_000), st.integers(0, 2**63 - 1))


@given(proposes)
def test_a_valid_propose_comes_back_as_its_fields(propose: tuple[Any, ...]) -> None:
    data = encode_propose(propose[0], propose[1], propose[2], propose[3],
                          timeout_ms=propose[4], sent_ms=propose[5])
    raw = decode_request_fields(data)
    assert type(raw) is list and raw == [1, *propose]
    assert decode_request(data) == Propose(*propose)


@settings(max_examples=300)
@given(st.lists(fields, max_size=8), st.integers(1, 5))
def test_anything_else_decodes_or_is_refused_as_decode_request_does(
        raw: list[Any], kind: int) -> None:
    data = pack([kind, *raw[1:]] if raw else raw)
    fast = outcome(lambda: decode_request_fields(data))
    general = outcome(lambda: decode_request(data))
    if isinstance(fast, list):
        fast = Propose(*fast[1:])
    assert fast == general


def test_a_propose_of_an_earlier_build_is_a_propose_object() -> None:
    assert decode_request_fields(pack([1, 7, "s", 1, b"x", 100])) == Propose(7, "s", 1, b"x",
                                                                              100, 0)


class CapturingDriver(DriverStub):
    """What the server hands the driver, with a fixed stamp clock."""

    def __init__(self, stamp_ms: int) -> None:
        super().__init__()
        self.submitted: list[tuple[bytes, float, bool]] = []
        self.stamp_ms = lambda: stamp_ms  # type: ignore[method-assign]

    def submit(self, command: bytes, timeout_s: float, done: Callable[..., None], *,
               reserved: bool = False, released: Callable[[], None] | None = None) -> None:
        self.submitted.append((command, timeout_s, reserved))
        done(b"reply", None)


@pytest.mark.parametrize("role", list(Role))
@pytest.mark.parametrize("sent_ms", [0, 1, 5_000_000, 10_000_000])
def test_the_servers_envelope_and_answer_are_the_general_encoders_bytes(
        role: Role, sent_ms: int) -> None:
    now_ms = 5_000_000 + SENT_MS_SLACK_MS
    driver = CapturingDriver(now_ms)
    server = ClientServer(driver)  # type: ignore[arg-type]
    principal = Principal(role, "n1")
    answers = server_module._Answers(Sink(), anyio.Semaphore(8), driver.metrics,
                                     server_module._AnswerBudget(1 << 20))
    frame = encode_propose(42, "sess", 3, b"body", timeout_ms=7, sent_ms=sent_ms)
    server._dispatch(principal, frame, answers, None)  # type: ignore[arg-type]
    [(command, timeout_s, reserved)] = driver.submitted
    stamp_ms = min(now_ms, sent_ms + SENT_MS_SLACK_MS) if sent_ms else now_ms
    assert command == encode_envelope_of(principal, "sess", 3, stamp_ms, b"body")
    assert timeout_s == server_module.WAIT_MS_MIN / 1000
    assert reserved is (role is Role.NODE)
    assert answers.outbox._frames[-1] == encode_ok(42, b"reply")


def test_outside_an_asyncio_loop_every_command_reads_the_clock() -> None:
    readings = iter(range(100))
    stamp = server_module._TurnStamp(lambda: next(readings))
    assert [stamp.now_ms() for _ in range(3)] == [0, 1, 2]


async def test_one_reading_per_turn_of_the_loop(anyio_backend: str) -> None:
    """On asyncio; on trio (no loop to hook) every command reads the clock, as before."""
    readings = iter(range(100))
    stamp = server_module._TurnStamp(lambda: next(readings))
    if anyio_backend != "asyncio":
        assert [stamp.now_ms() for _ in range(3)] == [0, 1, 2]
        return
    assert [stamp.now_ms() for _ in range(3)] == [0, 0, 0]
    await anyio.sleep(0)
    await anyio.sleep(0)
    assert [stamp.now_ms() for _ in range(2)] == [1, 1]


async def test_a_kv_put_sends_encode_puts_bytes_and_takes_an_ok() -> None:
    sent: list[bytes] = []

    class Client:
        async def propose(self, body: bytes, **_: Any) -> bytes:
            sent.append(body)
            return pack([0])  # OK_REPLY

    await KvStore(Client()).put(b"k", b"v")  # type: ignore[arg-type]
    assert sent == [encode_put(b"k", b"v")]


@given(st.lists(st.floats(0, 10, allow_nan=False), max_size=40))
def test_observing_many_is_observing_each(values: list[float]) -> None:
    one, many = Histogram(), Histogram()
    for value in values:
        one.observe(value)
    many.observe_many(values)
    assert (many.counts, many.count, many.total) == (one.counts, one.count, one.total)
    metrics = Metrics()
    metrics.observe_many("x", values)
    assert ("x" in metrics._histograms) is bool(values)


class GeneralPathKvMachine(KvMachine):
    """KvMachine.apply as it was before the fast path: every command with a session through
    Sessions.lookup, then Sessions.record."""

    __slots__ = ()

    def apply(self, command: bytes) -> bytes:
        try:
            principal, session, sequence, stamp_ms, body = \
                decode_envelope_fields(command)
            operation, key, value = decode_kv_request(body)
        except InvalidMessage:
            return encode_reply(Code.BAD_REQUEST)
        if operation is not Operation.PUT:
            return encode_reply(Code.BAD_REQUEST)
        if not sequence:
            self.now_ms = max(self.now_ms, stamp_ms)
            return self._put(key, value)
        sessions = self.sessions
        name = session_key(principal, session)
        now_ms = max(self.now_ms, stamp_ms)
        if name not in sessions.table:
            self.now_ms = now_ms
        checksum = command_checksum(body)
        verdict, cached = sessions.lookup(name, sequence, stamp_ms, now_ms, checksum)
        if verdict == "retry":
            return cached
        if verdict != "new":
            return encode_reply(kv_machine._REFUSALS[verdict])
        self.now_ms = now_ms
        reply = self._put(key, value)
        sessions.record(name, sequence, reply, now_ms + kv_machine.SESSION_TTL_MS, checksum)
        return reply


commands = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 5), st.binary(max_size=3),
                              st.binary(max_size=8), st.integers(0, 2_000_000)), max_size=60)


@settings(max_examples=200)
@given(commands)
def test_a_sessions_next_command_is_applied_as_the_general_path_applies_it(
        script: list[tuple[int, int, bytes, bytes, int]]) -> None:
    fast, general = KvMachine(), GeneralPathKvMachine()
    principal = Principal(Role.ADMIN, "bench")
    for session, sequence, key, value, stamp_ms in script:
        command = encode_envelope_of(principal, f"s{session}", sequence, stamp_ms,
                                     encode_put(key, value))
        assert fast.apply(command) == general.apply(command)
        assert fast.snapshot() == general.snapshot()
        assert fast.sessions.reply_bytes == general.sessions.reply_bytes
