"""The key-value client's batches (cellar/kv/put_batches.py), on asyncio and on trio: puts made
while a command is on its way go as one PUTS, within its bounds, in the order called; each caller
gets its own put's answer, or its own copy of the batch's error; a cancelled caller strands
nobody; a lone caller's puts go at once, one plain PUT each. The commands are applied by a real
KvMachine, so every answer is the machine's own."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, cast

import anyio
import pytest
from anyio import wait_all_tasks_blocked
from anyio.abc import TaskGroup

from cellar.kv import machine as kv_machine
from cellar.kv.codec import (
    ITEM_OVERHEAD_BYTES,
    OK_REPLY,
    PUT_FRAMING_BYTES,
    PUTS_BYTES_MAX,
    PUTS_FRAMING_BYTES,
    PUTS_MAX,
    PUTS_PREFIX,
    VALUE_BYTES_MAX,
    Code,
    decode_puts,
    decode_request,
    encode_put,
    encode_puts_reply,
    encode_reply,
)
from cellar.kv.machine import KvMachine
from cellar.kv.put_batches import not_applied
from cellar.kv.store import KvRefused, KvStore
from consensus.runtime.client import CellarClient, OutcomeUnknown
from tests.cellar.test_kv_machine import envelope, get

pytestmark = pytest.mark.anyio


class _Client:
    """A CellarClient's part a KvStore uses: each command applied to `machine` once `gate` opens,
    in its own session; what each caller's puts became is in `commands`."""

    def __init__(self, tasks: TaskGroup, *, error: Exception | None = None) -> None:
        self.machine = KvMachine()
        self.commands: list[bytes] = []
        self.gate = anyio.Event()
        self.started = 0  # tasks started for batches
        self._tasks = tasks
        self._error = error

    def start_soon(self, function: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        self.started += 1
        self._tasks.start_soon(function, *args)

    async def propose(self, body: bytes, *, not_applied: Callable[[bytes], str | None]
                      ) -> bytes:
        self.commands.append(body)
        session = f"s{len(self.commands)}"
        await self.gate.wait()
        if self._error is not None:
            raise self._error
        return self.machine.apply(envelope(session, 1, body))

    def puts_of(self, command: bytes) -> list[tuple[bytes, bytes]]:
        if command.startswith(PUTS_PREFIX):
            return decode_puts(command)
        _, key, value = decode_request(command)
        return [(key, value)]


def _store(client: _Client, puts_max: int = PUTS_MAX) -> KvStore:
    return KvStore(cast(CellarClient, client), puts_max=puts_max)


async def _put_all(store: KvStore, client: _Client, pairs: list[tuple[bytes, bytes]]
                   ) -> dict[bytes, BaseException | None]:
    """Every pair put by a caller of its own, all at once; what each caller saw, by key, in
    the order they called (trio starts tasks in an order of its own)."""
    seen: dict[bytes, BaseException | None] = {}

    async def caller(key: bytes, value: bytes) -> None:
        seen[key] = None  # the order called: the put joins its batch before its first await
        try:
            await store.put(key, value)
        except Exception as error:
            seen[key] = error

    async with anyio.create_task_group() as callers:
        for key, value in pairs:
            callers.start_soon(caller, key, value)
        await wait_all_tasks_blocked()
        client.gate.set()
    return seen


def _pairs(count: int, value_bytes: int = 4) -> list[tuple[bytes, bytes]]:
    return [(b"k%d" % number, bytes([number % 256]) * value_bytes) for number in range(count)]


async def test_puts_made_together_go_as_one_command_in_the_order_called() -> None:
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            client = _Client(tasks)
            pairs = _pairs(50)
            seen = await _put_all(_store(client), client, pairs)
    assert set(seen.values()) == {None}
    called = [(key, dict(pairs)[key]) for key in seen]
    # The first went at once, alone; the 49 made while it was on its way, as one PUTS
    assert [client.puts_of(command) for command in client.commands] == [called[:1], called[1:]]
    assert client.commands[0] == encode_put(*called[0])
    assert client.started == 1
    for key, value in pairs:
        assert get(client.machine, key) == value


async def test_a_lone_caller_sends_a_plain_put_each_and_starts_no_task() -> None:
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            client = _Client(tasks)
            client.gate.set()
            store = _store(client)
            for key, value in _pairs(5):
                await store.put(key, value)
    assert client.commands == [encode_put(*pair) for pair in _pairs(5)]
    assert client.started == 0


@pytest.mark.parametrize(("puts_max", "commands"), [(8, [1, 8, 8, 8, 5]), (1, [1] * 30)])
async def test_a_batch_closes_at_its_puts_max(puts_max: int, commands: list[int]) -> None:
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            client = _Client(tasks)
            pairs = _pairs(30)
            seen = await _put_all(_store(client, puts_max), client, pairs)
    assert set(seen.values()) == {None}
    # in the order sent (trio may start one batch's task before an earlier one's)
    assert sorted(len(client.puts_of(command)) for command in client.commands) == \
        sorted(commands)
    assert sorted(pair for command in client.commands for pair in client.puts_of(command)) == \
        sorted(pairs)


async def test_a_batch_closes_before_its_bytes_pass_the_bound() -> None:
    per_put_bytes = 2 + VALUE_BYTES_MAX + PUT_FRAMING_BYTES
    per_batch = (PUTS_BYTES_MAX - PUTS_FRAMING_BYTES) // per_put_bytes
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tasks:
            client = _Client(tasks)
            pairs = _pairs(10, VALUE_BYTES_MAX)
            seen = await _put_all(_store(client), client, pairs)
    assert set(seen.values()) == {None}
    sizes = sorted(len(client.puts_of(command)) for command in client.commands)
    assert sizes == sorted([1, per_batch, per_batch, 9 - 2 * per_batch])
    assert all(len(command) <= PUTS_BYTES_MAX for command in client.commands)


async def test_each_caller_gets_its_own_puts_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Room for two items of 2-byte keys and 4-byte values: two puts are stored, and every
    other refused alone (STORE_FULL), in the same batch; each caller told its own."""
    monkeypatch.setattr(kv_machine, "DATA_BYTES_MAX", 2 * (6 + ITEM_OVERHEAD_BYTES))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            client = _Client(tasks)
            pairs = _pairs(5)
            seen = await _put_all(_store(client), client, pairs)
    stored = [key for key, _ in pairs if get(client.machine, key) is not None]
    assert len(stored) == 2
    for key, _ in pairs:
        if key in stored:
            assert seen[key] is None
        else:
            assert isinstance(seen[key], KvRefused) and "STORE_FULL" in str(seen[key])
    assert len(client.commands) == 2


async def test_every_member_gets_its_own_copy_of_the_batchs_error() -> None:
    error = OutcomeUnknown("deadline passed")
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            client = _Client(tasks, error=error)
            seen = await _put_all(_store(client), client, _pairs(6))
    errors = list(seen.values())  # in the order called: the first went alone
    assert all(isinstance(each, OutcomeUnknown) and str(each) == "deadline passed"
               for each in errors)
    assert len({id(each) for each in errors}) == 6  # none shared: each has its own traceback
    assert all(each is not None and each.__cause__ is error for each in errors[1:])


async def test_a_cancelled_member_strands_nobody_and_its_put_goes_on() -> None:
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            client = _Client(tasks)
            store = _store(client)
            called: list[bytes] = []
            done: list[bytes] = []

            async def caller(key: bytes, scope: anyio.CancelScope) -> None:
                with scope:
                    called.append(key)
                    await store.put(key, b"v")
                    done.append(key)

            scopes = {b"k%d" % number: anyio.CancelScope() for number in range(4)}
            async with anyio.create_task_group() as callers:
                for key, scope in scopes.items():
                    callers.start_soon(caller, key, scope)
                await wait_all_tasks_blocked()
                cancelled = called[2]  # a member of the batch (the first went alone)
                scopes[cancelled].cancel()
                await wait_all_tasks_blocked()
                client.gate.set()
    assert sorted(done) == sorted(set(scopes) - {cancelled})
    assert get(client.machine, cancelled) == b"v"  # handed over before its caller left


async def _client_tasks(*, task_status: anyio.abc.TaskStatus[TaskGroup]) -> None:
    """A task group of the client's own, in a task of its own: cancelled alone."""
    async with anyio.create_task_group() as tasks:
        task_status.started(tasks)
        await anyio.sleep_forever()


async def test_a_client_closing_with_a_batch_on_its_way_fails_its_members() -> None:
    seen: dict[bytes, BaseException | None] = {}
    with anyio.fail_after(10):
        async with anyio.create_task_group() as outer:
            tasks = await outer.start(_client_tasks)
            client = _Client(tasks)
            store = _store(client)

            async def caller(key: bytes) -> None:
                seen[key] = None
                try:
                    await store.put(key, b"v")
                except OutcomeUnknown as error:
                    seen[key] = error

            async with anyio.create_task_group() as callers:
                for number in range(4):
                    callers.start_soon(caller, b"k%d" % number)
                await wait_all_tasks_blocked()
                tasks.cancel_scope.cancel()  # the client closing: its batch's task cancelled
                await wait_all_tasks_blocked()
                client.gate.set()
            outer.cancel_scope.cancel()
    first, *members = seen.values()
    assert first is None  # on its way from its caller's own task, which goes on
    assert all(isinstance(error, OutcomeUnknown) and "client closed" in str(error)
               for error in members) and len(members) == 3


def test_session_refusals_name_themselves_in_a_put_or_a_batch() -> None:
    for code in (Code.SESSIONS_FULL, Code.SESSION_TOO_OLD, Code.SESSION_EXPIRED):
        assert not_applied(encode_reply(code)) == code.name
    for reply in (OK_REPLY, encode_puts_reply([Code.OK, Code.STORE_FULL]),
                  encode_reply(Code.STORE_FULL), encode_reply(Code.STALE_SEQUENCE)):
        assert not_applied(reply) is None


def test_a_puts_max_past_the_codecs_bound_is_refused() -> None:
    for puts_max in (0, PUTS_MAX + 1):
        with pytest.raises(ValueError, match="puts_max"):
            _store(cast(_Client, object()), puts_max)
