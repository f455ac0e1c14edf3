"""A command body that is not valid msgpack gets the same reply on every replica, whichever
msgpack implementation it runs: the reply is cached in the client's session and so is part of
the snapshot, and the C extension and the pure-Python fallback word their errors differently
(a reserved byte is "" to one, "Unknown header: 0xc1" to the other). A rule of the machine's
version 3 (`statemachine.rules`): under the rules a log was written by before, the reply quotes
the library as it did then."""

from __future__ import annotations

import importlib

import msgpack
import pytest

from statemachine import Machine
from statemachine.errors import Code, Rejection
from statemachine.rules import PLAIN_MSGPACK_REFUSALS, system_tick
from tests.statemachine.builders import SCHEDULER, SYSTEM
from tests.statemachine.test_machine import envelope, run

FALLBACK = importlib.import_module("msgpack.fallback")  # the pure-Python implementation
NOT_MSGPACK = [b"\xc1", b"\x81\x01\x02", b"\xd6\xff\x00\x00\x00\x01"]


def _machine(*, rules_raised: bool) -> Machine:
    machine = Machine()
    if rules_raised:
        run(machine, system_tick(), SYSTEM)
        assert machine.state.rules_version >= PLAIN_MSGPACK_REFUSALS
    return machine


def _apply(machine: Machine, body: bytes) -> bytes:
    return machine.apply(envelope(body, SCHEDULER, session="s", sequence=1))


@pytest.mark.parametrize("body", NOT_MSGPACK)
def test_every_msgpack_implementation_gives_the_same_reply_and_snapshot(
        body: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    extension, fallback = _machine(rules_raised=True), _machine(rules_raised=True)
    replied = _apply(extension, body)
    with monkeypatch.context() as patched:
        patched.setattr(msgpack, "unpackb", FALLBACK.unpackb)
        assert _apply(fallback, body) == replied
    assert extension.digest() == fallback.digest()
    refused = run(_machine(rules_raised=True), body, SCHEDULER)
    assert refused == Rejection(code=Code.MALFORMED, message="command: not valid msgpack")


def test_under_the_rules_before_the_reply_quotes_the_library_as_it_did() -> None:
    refused = run(_machine(rules_raised=False), b"\x81\x01\x02", SCHEDULER)
    assert isinstance(refused, Rejection) and refused.code is Code.MALFORMED
    assert refused.message.startswith("command: not valid msgpack (")  # and the library's words
