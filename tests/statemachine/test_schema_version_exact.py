"""A command body's schema version must be an integer, not merely equal to one.

`open_body` compared `v` with `==`: Python's bool is an int and 1.0 == 1, so a body with
`"v": true` or `"v": 1.0` was applied as version 1, though every other integer field of a
command (`consensus.validation.expect_int`) refuses a bool or a float. Such a body is now
refused MALFORMED, in the words of those fields. A rule of the machine's version 4
(`statemachine.rules`): under the rules a log was written by before, the body applies as it
did then. Queries, answered by one replica and never replicated, refuse it always.
"""

from __future__ import annotations

from typing import Any

import pytest

from consensus.codec import pack
from statemachine import Machine, limits
from statemachine.codec import decode_command, encode_command
from statemachine.errors import Code, Rejection
from statemachine.query_codec import decode_query
from statemachine.record_codec import DecodeError
from statemachine.results import Done
from statemachine.rules import EXACT_SCHEMA_VERSION, system_tick
from tests.statemachine.builders import SYSTEM
from tests.statemachine.test_machine import run

NOT_INTEGERS: list[tuple[Any, str]] = [(True, "bool"), (1.0, "float"), ("1", "str")]


def _tick_body(version: Any) -> bytes:
    return pack({"v": version, "type": "tick"})


def _machine(*, rules_raised: bool) -> Machine:
    machine = Machine()
    if rules_raised:
        run(machine, system_tick(), SYSTEM)
        assert machine.state.rules_version >= EXACT_SCHEMA_VERSION
    return machine


@pytest.mark.parametrize(("version", "kind"), NOT_INTEGERS)
def test_a_version_that_is_not_an_integer_is_malformed(version: Any, kind: str) -> None:
    refused = run(_machine(rules_raised=True), _tick_body(version), SYSTEM)
    assert refused == Rejection(code=Code.MALFORMED,
                                message=f"command.v: expected an integer, got {kind}")
    with pytest.raises(DecodeError) as raised:
        decode_command(_tick_body(version))
    assert raised.value.rejection.code is Code.MALFORMED


def test_an_integer_version_is_read_as_before() -> None:
    machine = _machine(rules_raised=True)
    assert isinstance(run(machine, encode_command(system_tick()), SYSTEM), Done)
    refused = run(machine, _tick_body(2), SYSTEM)
    assert isinstance(refused, Rejection) and refused.code is Code.UNSUPPORTED_VERSION
    missing = run(machine, pack({"type": "tick"}), SYSTEM)  # no version: not this schema
    assert isinstance(missing, Rejection) and missing.code is Code.UNSUPPORTED_VERSION


@pytest.mark.parametrize("version", [True, 1.0])
def test_under_the_rules_before_it_applies_as_version_1(version: Any) -> None:
    machine = _machine(rules_raised=False)
    assert machine.state.rules_version < EXACT_SCHEMA_VERSION
    assert isinstance(run(machine, pack({"v": version, "type": "tick", "rules": 0}), SYSTEM),
                      Done)
    assert decode_command(_tick_body(version), exact_version=False) == decode_command(
        _tick_body(limits.SCHEMA_VERSION))


@pytest.mark.parametrize(("version", "kind"), NOT_INTEGERS)
def test_a_query_with_such_a_version_is_malformed(version: Any, kind: str) -> None:
    with pytest.raises(DecodeError) as raised:
        decode_query(pack({"v": version, "type": "cluster"}))
    assert raised.value.rejection == Rejection(
        code=Code.MALFORMED, message=f"query.v: expected an integer, got {kind}")
