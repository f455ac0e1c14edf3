"""The rules version (`statemachine.rules`): a system Tick raises it, at one log entry for
every replica whichever snapshot it replayed from; nothing lowers it; a Tick naming rules this
build does not know stops the replica (exit 76) instead of applying commands by rules it does
not have; snapshots keep it (format 7) and older ones read as the rules before versions."""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import anyio
import msgpack
import pytest
from anyio.abc import TaskStatus

from cellar import replica_cli
from cellar.cli import main
from cellar.local_cluster import Layout
from statemachine import Machine
from statemachine.codec import decode_command, encode_command
from statemachine.commands import ApplyConfig, Cordon, Tick
from statemachine.errors import Code, Rejection
from statemachine.rules import (
    RULES_BEFORE_VERSIONS,
    RULES_VERSION,
    RulesTooNew,
    system_tick,
)
from statemachine.sessions import Sessions
from statemachine.snapshot_codec import decode_snapshot, encode_snapshot
from tests.statemachine.builders import ADMIN, SCHEDULER, SYSTEM, rack_spec
from tests.statemachine.test_machine import envelope, run


def test_a_system_tick_raises_the_rules_and_nothing_lowers_them() -> None:
    machine = Machine()
    assert machine.state.rules_version == RULES_BEFORE_VERSIONS == 0
    run(machine, system_tick(), SYSTEM)
    assert machine.state.rules_version == RULES_VERSION >= 1
    run(machine, Tick(), SYSTEM)  # a build from before versions: it names none
    assert machine.state.rules_version == RULES_VERSION


def test_a_tick_without_rules_encodes_as_before_versions() -> None:
    assert encode_command(Tick()) == encode_command(Tick(rules=0))
    assert b"rules" not in encode_command(Tick())  # an old build's Tick reads the same
    assert decode_command(encode_command(Tick())) == Tick(rules=RULES_BEFORE_VERSIONS)
    assert decode_command(encode_command(system_tick())) == Tick(rules=RULES_VERSION)


def test_a_tick_naming_unknown_rules_stops_the_replica_but_a_clients_never_does() -> None:
    machine = Machine()
    later = Tick(rules=RULES_VERSION + 1)
    refused = run(machine, later, SCHEDULER)  # only the system may Tick: refused first
    assert isinstance(refused, Rejection) and refused.code is Code.UNAUTHORIZED
    with pytest.raises(RulesTooNew, match=f"version {RULES_VERSION + 1}.*upgrade"):
        machine.apply(envelope(later, SYSTEM))


def _log(tick_at: int, length: int) -> list[bytes]:
    """A configuration, then cordons (a command whose outcome the state keeps), with the
    upgraded build's first system Tick at `tick_at`."""
    entries = [envelope(ApplyConfig(expected_version=0, spec=rack_spec()), ADMIN)]
    for position in range(1, length):
        command: Any = system_tick() if position == tick_at else Cordon(node=f"n{position % 2}")
        principal = SYSTEM if position == tick_at else ADMIN
        entries.append(envelope(command, principal, now_ms=1_000 + position))
    return entries


@pytest.mark.parametrize("snapshot_at", [0, 3, 5, 6, 9])
def test_replicas_replaying_from_different_snapshots_switch_rules_at_the_same_entry(
        snapshot_at: int) -> None:
    entries = _log(tick_at=5, length=10)
    whole = Machine()
    versions = []
    for entry in entries:
        whole.apply(entry)
        versions.append(whole.state.rules_version)
    assert versions == [0] * 5 + [RULES_VERSION] * 5  # from the Tick on, for every replica
    early = Machine()
    for entry in entries[:snapshot_at]:
        early.apply(entry)
    replayed = Machine()
    replayed.restore(early.snapshot())
    for entry in entries[snapshot_at:]:
        replayed.apply(entry)
    assert replayed.state.rules_version == RULES_VERSION
    assert replayed.digest() == whole.digest()


def test_a_snapshot_keeps_the_rules_and_an_older_one_reads_as_before_versions() -> None:
    machine = Machine()
    run(machine, system_tick(), SYSTEM)
    snapshot = encode_snapshot(machine.state, Sessions(), 3)
    state, _, _ = decode_snapshot(snapshot)
    assert state.rules_version == RULES_VERSION
    raw = msgpack.unpackb(snapshot, strict_map_key=False)
    raw[1] = 6
    del raw[15:]  # the rules version: none before format 7
    older, _, _ = decode_snapshot(msgpack.packb(raw))
    assert older.rules_version == RULES_BEFORE_VERSIONS
    raw[1] = 7
    raw.append("1")
    with pytest.raises(ValueError, match="rules version"):
        decode_snapshot(msgpack.packb(raw))


class TooNewNode:
    """A replica node whose log names rules past this build's: applying it raises."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await anyio.sleep(0)
        raise RulesTooNew(RULES_VERSION + 1)


def test_the_replica_stops_with_exit_76_and_says_to_upgrade(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(replica_cli, "start_logging", lambda args: None)
    monkeypatch.setattr(replica_cli, "ReplicaNode", TooNewNode)
    layout = Layout(tmp_path / "cluster", 3, insecure=True, loop="asyncio")
    layout.write()
    switch_interval_s = sys.getswitchinterval()
    try:
        assert main(["replica", "--config", str(layout.config_path(0)), "--init"]) == 76
    finally:
        sys.setswitchinterval(switch_interval_s)
    error = capsys.readouterr().err
    assert "upgrade this replica" in error and "Traceback" not in error
