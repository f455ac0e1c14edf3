"""A sequencer's Ticks wait for its stamps to agree with a majority of its group's
(consensus/runtime/clock_agreement.py): the arithmetic against a naive count; a sequencer
booted an hour ahead withholds its Ticks, says so once, and ticks again once its peers agree;
the offsets travel in the peers' hellos, over loopback, and only the replica that is off
disagrees. Before, the first Tick of a sequencer booted with its clock an hour ahead expired
every node lease and session in the state machine."""

from __future__ import annotations

import logging
import pathlib

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellar.local_cluster import Layout
from consensus.runtime.clock_agreement import SKEW_MS_MAX, ClockAgreement
from consensus.runtime.driver import Driver
from consensus.runtime.peers import PEER_HELLO, Hello, LinkTiming
from tests.consensus.runtime.hand_clocks import Clocks
from tests.consensus.runtime.kv_node import kv_replica_node
from tests.consensus.runtime.test_driver_wall_step import sequencer_driver
from tests.consensus.runtime.test_peers import (
    TIME_LIMIT_S,
    Inbox,
    eventually,
    free_ports,
    mesh_of,
    start,
)

HOUR_MS = 3_600_000


@given(st.integers(1, 7), st.data())
def test_agrees_when_a_majority_counting_itself_is_within_the_bound(
        replica_count: int, data: st.DataObject) -> None:
    heard = data.draw(st.dictionaries(st.integers(1, replica_count - 1) if replica_count > 1
                                      else st.nothing(),
                                      st.integers(-3 * SKEW_MS_MAX, 3 * SKEW_MS_MAX)))
    agreement = ClockAgreement(replica_count)
    for peer, offset in heard.items():
        agreement.heard(peer, 5_000 + offset, 5_000)
    within = [peer for peer, offset in heard.items() if -SKEW_MS_MAX <= offset <= SKEW_MS_MAX]
    assert agreement.agrees() == (len(within) + 1 >= replica_count // 2 + 1)
    assert agreement.offsets_ms == dict(sorted(heard.items()))


def test_the_latest_hello_of_a_peer_counts() -> None:
    agreement = ClockAgreement(3)
    agreement.heard(1, HOUR_MS, 0)
    assert not agreement.agrees()
    agreement.heard(1, 10, 0)  # it reconnected, its clock set right
    assert agreement.agrees() and agreement.offsets_ms == {1: 10}


def test_a_group_of_one_agrees_with_itself_and_bad_sizes_are_refused() -> None:
    assert ClockAgreement(1).agrees()
    assert not ClockAgreement(3).agrees()  # no peer heard yet
    with pytest.raises(ValueError, match="at least 1"):
        ClockAgreement(0)
    with pytest.raises(ValueError):
        ClockAgreement(3, skew_ms_max=-1)


def _tick_due(driver: Driver, clocks: Clocks) -> None:
    clocks.pass_ms(driver.config.system_every_ms)
    driver._maybe_system_command()


def test_a_sequencer_booted_an_hour_ahead_withholds_its_ticks_until_its_peers_agree(
        caplog: pytest.LogCaptureFixture) -> None:
    clocks = Clocks()
    clocks.wall += HOUR_MS  # its clock, set an hour ahead before it started
    agreement = ClockAgreement(3)
    driver, stamps = sequencer_driver(clocks, agreement)
    with caplog.at_level(logging.INFO, logger="cellar.clock_agreement"):
        _tick_due(driver, clocks)  # no peer heard yet, as at boot: withheld, without a word
        assert stamps == [] and caplog.records == []
        ours = driver.stamp_ms()
        agreement.heard(1, ours - HOUR_MS, ours)
        agreement.heard(2, ours - HOUR_MS + 3, ours)
        for _ in range(3):
            _tick_due(driver, clocks)
        assert stamps == []
        assert driver.metrics.snapshot()["driver.system_commands_withheld"] == 4
        errors = [record for record in caplog.records if record.levelno == logging.ERROR]
        assert len(errors) == 1 and "withholds its Ticks" in errors[0].getMessage()
        # Its clock set right and the process restarted: a fresh stamp clock, heard again
        clocks.wall -= HOUR_MS
        driver.stamp_clock = clocks.clock()
        ours = driver.stamp_ms()
        agreement.heard(1, ours + 4, ours)
        _tick_due(driver, clocks)
        assert len(stamps) == 1 and abs(stamps[0] - clocks.wall) <= SKEW_MS_MAX
        assert any("Ticks resume" in record.getMessage() for record in caplog.records)


def test_a_sequencer_whose_peers_agree_ticks_as_before() -> None:
    clocks = Clocks()
    agreement = ClockAgreement(3)
    driver, stamps = sequencer_driver(clocks, agreement)
    agreement.heard(2, driver.stamp_ms() - 250, driver.stamp_ms())
    _tick_due(driver, clocks)
    _tick_due(driver, clocks)
    assert len(stamps) == 2
    assert "driver.system_commands_withheld" not in driver.metrics.snapshot()


def _judged(driver: Driver) -> list[tuple[bool, bool]]:
    """The clock judgements the driver hands its core."""
    judged: list[tuple[bool, bool]] = []
    driver.replica.judge_clocks = (  # type: ignore[method-assign]
        lambda agrees, sequencer_off: judged.append((agrees, sequencer_off)))
    return judged


def test_each_system_period_the_driver_tells_its_core_what_the_hellos_say() -> None:
    """A follower hearing its sequencer (replica 0) an hour off and replica 2 near tells its
    core that it agrees and the sequencer is off, which is what starts the sequencer's
    replacement (tests/consensus/test_clock_replacement.py); the sequencer, hearing both an
    hour behind, tells its own core that it disagrees."""
    clocks = Clocks()
    agreement = ClockAgreement(3)
    follower, stamps = sequencer_driver(clocks, agreement, replica_id=1)
    judged = _judged(follower)
    _tick_due(follower, clocks)
    assert judged == [(False, False)]  # no peer heard yet: nobody judged off
    ours = follower.stamp_ms()
    agreement.heard(0, ours + HOUR_MS, ours)
    agreement.heard(2, ours - 12, ours)
    assert agreement.is_off(0) and not agreement.is_off(2) and not agreement.is_off(1)
    _tick_due(follower, clocks)
    follower._maybe_system_command()  # not due again yet: judged once a period
    assert judged == [(False, False), (True, True)] and stamps == []

    sequencer_agreement = ClockAgreement(3)
    sequencer, stamps = sequencer_driver(clocks, sequencer_agreement)
    judged = _judged(sequencer)
    ours = sequencer.stamp_ms()
    sequencer_agreement.heard(1, ours - HOUR_MS, ours)
    sequencer_agreement.heard(2, ours - HOUR_MS, ours)
    _tick_due(sequencer, clocks)
    assert judged == [(False, False)] and stamps == []


def test_a_hello_carries_the_dialers_stamp() -> None:
    hello = Hello(2, LinkTiming(), stamp_ms=1_700_000_000_123)
    parsed = Hello.parse(hello.encode())
    assert parsed == hello and parsed is not None and parsed.stamp_ms == 1_700_000_000_123
    without = Hello(2, LinkTiming())
    assert b"stamp_ms" not in without.encode()
    assert Hello.parse(without.encode()) == without  # no stamp: heard as none
    for bad in (b'"soon"', b"1.5", b"true", b"null"):
        frame = hello.encode().replace(b"1700000000123", bad)
        assert frame.startswith(PEER_HELLO) and Hello.parse(frame) is None


@pytest.mark.anyio
async def test_the_offsets_travel_in_the_hellos_and_only_the_replica_off_disagrees() -> None:
    """Three meshes over loopback, replica 0's stamps an hour ahead: it hears both peers an
    hour behind it and disagrees; the other two each hear one peer near and agree."""
    ports = dict(enumerate(free_ports(3)))
    agreements = {replica: ClockAgreement(3) for replica in ports}
    ahead_ms = {0: HOUR_MS, 1: 0, 2: 0}
    base_ms = Clocks().wall
    meshes = [mesh_of(None, replica, ports, Inbox(),
                      stamp_ms=lambda replica=replica: base_ms + ahead_ms[replica],
                      on_stamp=agreements[replica].heard) for replica in ports]
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            running = [await start(group, mesh) for mesh in meshes]
            await eventually(lambda: all(len(agreement.offsets_ms) == 2
                                         for agreement in agreements.values()))
            for each in running:
                await each.stop()
    assert agreements[0].offsets_ms == {1: -HOUR_MS, 2: -HOUR_MS}
    assert not agreements[0].agrees()
    assert agreements[1].offsets_ms == {0: HOUR_MS, 2: 0} and agreements[1].agrees()
    assert agreements[2].offsets_ms == {0: HOUR_MS, 1: 0} and agreements[2].agrees()


def test_a_replica_node_wires_its_hellos_to_its_drivers_ticks(tmp_path: pathlib.Path) -> None:
    """The node's mesh says the driver's stamps and hears into the agreement the driver's
    Ticks wait for; the status and the metrics page show it."""
    layout = Layout(tmp_path / "cluster", 5, insecure=True, loop="asyncio", machine="kv")
    layout.write()
    with kv_replica_node(layout, 1) as node:
        assert node.driver.clock_agreement is node.clock_agreement
        assert node.mesh.stamp_ms == node.driver.stamp_ms
        assert node.clock_agreement.replica_count == 5
        status = node.status()
        assert status["clock_agrees"] is False and status["clock_offsets_ms"] == {}
        assert node.mesh.on_stamp is not None and node.mesh.stamp_ms is not None
        ours = node.mesh.stamp_ms()
        node.mesh.on_stamp(0, ours + 20, ours)
        node.mesh.on_stamp(3, ours - HOUR_MS, ours)
        assert not node.status()["clock_agrees"]  # two of five
        node.mesh.on_stamp(4, ours - 7, ours)
        status = node.status()
        page = node.render_metrics().splitlines()
    assert status["clock_agrees"] is True
    assert status["clock_offsets_ms"] == {"0": 20, "3": -HOUR_MS, "4": -7}
    assert "cellar_stamp_clock_agrees 1" in page
    assert not any("ticks_withheld" in line for line in page)  # the driver's counter says it
