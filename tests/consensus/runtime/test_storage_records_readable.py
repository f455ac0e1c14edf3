"""Records the replica writes must be records its log can read back.

The log refuses, at open, a checksummed record that does not decode (LogCorrupt). So anything
the core persists and the decoder would refuse turns a clean restart into a replica that no
longer opens: the codec's limits must hold for what is written, not only for what peers send.
"""

from __future__ import annotations

import pathlib

import anyio
import pytest

from consensus.codec import BATCH_COMMANDS_MAX, ENVELOPE_BYTES_MAX
from consensus.config import ConfigError, ReplicaConfig
from consensus.leader import ProposalDropped
from consensus.prng import Prng
from consensus.replica import Replica
from consensus.runtime.driver import Driver, DriverConfig
from consensus.runtime.metrics import Metrics
from consensus.runtime.node_config import NodeConfigError, _limits
from consensus.runtime.storage import DurableLog
from tests.consensus.runtime.kv_machine import SessionKv
from tests.consensus.runtime.local import MemoryStore


def persist_a_few_readies(replica: Replica, log: DurableLog) -> None:
    for _ in range(4):
        ready = replica.ready()
        log.append(ready.records)
        log.sync()
        replica.advance()


def test_a_command_the_log_cannot_read_back_is_not_persisted(tmp_path: pathlib.Path) -> None:
    """Replica.propose takes any payload; its own C-accept record then holds a command of
    more than ENVELOPE_BYTES_MAX bytes, which decode_record refuses: the next open raised
    LogCorrupt and the replica never started again."""
    replica = Replica(ReplicaConfig(replica_id=1, replica_count=3), Prng(1))
    with DurableLog.open(tmp_path, create=True) as log:
        log.records()
        try:
            replica.propose(b"x" * (ENVELOPE_BYTES_MAX + 1))
        except (ProposalDropped, ValueError):
            return  # refused up front: nothing unreadable can reach the disk
        persist_a_few_readies(replica, log)
    with DurableLog.open(tmp_path, create=False) as log:  # LogCorrupt before the fix
        assert log.records()


def test_a_batch_the_log_cannot_read_back_is_refused_by_the_config() -> None:
    """batch_commands_max past the codec's BATCH_COMMANDS_MAX makes C-accepts (and their
    records) that no peer and no restart can decode."""
    with pytest.raises(ConfigError):
        ReplicaConfig(replica_id=0, replica_count=3,
                      batch_commands_max=BATCH_COMMANDS_MAX + 1).validate()


def test_a_batch_past_the_codecs_cap_never_reaches_the_log(tmp_path: pathlib.Path) -> None:
    """What the missing bound does: with `limits.batch_commands_max` past BATCH_COMMANDS_MAX
    (a node config accepts any positive number), a busy leader's own C-accept record holds
    more commands than decode_record takes, and the replica's log no longer opens."""
    try:
        config = ReplicaConfig(replica_id=1, replica_count=3,
                               batch_commands_max=BATCH_COMMANDS_MAX + 1).validate()
    except ConfigError:
        return  # refused up front
    replica = Replica(config, Prng(1))
    with DurableLog.open(tmp_path, create=True) as log:
        log.records()
        for _ in range(BATCH_COMMANDS_MAX + 1):
            replica.propose(b"c")
        persist_a_few_readies(replica, log)
    with DurableLog.open(tmp_path, create=False) as log:  # LogCorrupt before the fix
        assert log.records()


def test_a_node_config_refuses_a_batch_past_the_codecs_cap() -> None:
    with pytest.raises(NodeConfigError, match="batch_commands_max"):
        _limits({"batch_commands_max": BATCH_COMMANDS_MAX + 1})


def test_the_driver_refuses_an_oversized_command_and_keeps_running() -> None:
    """Driver.submit (the library's way in) passed any size to the core; it is refused at
    once now, and the driver's loop never sees it."""
    replica = Replica(ReplicaConfig(replica_id=1, replica_count=3), Prng(1))
    driver = Driver(replica, MemoryStore(), SessionKv(), lambda target, frame: True, Metrics(),
                    config=DriverConfig())
    outcomes: list[tuple[bytes | None, Exception | None]] = []

    async def main() -> None:
        async with anyio.create_task_group() as tasks:
            await tasks.start(driver.run)
            driver.submit(b"x" * (ENVELOPE_BYTES_MAX + 1), 1.0,
                          lambda reply, error: outcomes.append((reply, error)))
            await anyio.sleep(0.1)
            assert driver.running
            tasks.cancel_scope.cancel()

    anyio.run(main)
    assert len(outcomes) == 1 and outcomes[0][0] is None and outcomes[0][1] is not None
    assert driver.proposal_bytes == 0
