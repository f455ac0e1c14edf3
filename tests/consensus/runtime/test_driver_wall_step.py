"""A step of the sequencer's wall clock, through the driver and the server: the next Tick, and
the next command served, are stamped by the replica's one stamp clock (consensus/runtime/
stamp_clock.py), seconds after the last, not an hour. Before it, the Tick after an hour's step
was stamped an hour on and expired every node lease and session in the state machine."""

from __future__ import annotations

from consensus.codec import decode_envelope
from consensus.config import ReplicaConfig
from consensus.prng import Prng
from consensus.replica import Replica
from consensus.runtime.clock_agreement import ClockAgreement
from consensus.runtime.driver import Driver
from consensus.runtime.metrics import Metrics
from consensus.runtime.server import ClientServer
from tests.consensus.runtime.hand_clocks import Clocks
from tests.consensus.runtime.kv_machine import SessionKv
from tests.consensus.runtime.local import MemoryStore

HOUR_MS = 3_600_000


def sequencer_driver(clocks: Clocks, clock_agreement: ClockAgreement | None = None,
                     replica_id: int = 0) -> tuple[Driver, list[int]]:
    """The sequencer of a fresh cluster (replica 0, view 0), or with `replica_id` a follower,
    its Ticks' stamps noted; its Ticks wait for `clock_agreement` where one is given."""
    replica = Replica(ReplicaConfig(replica_id=replica_id, replica_count=3), Prng(0))
    assert replica.inspect.is_sequencer == (replica_id == 0)
    stamps: list[int] = []

    def noting_propose(payload: bytes) -> int:
        stamps.append(decode_envelope(payload).now_ms)
        return len(stamps)

    replica.propose = noting_propose  # type: ignore[method-assign]
    driver = Driver(replica, MemoryStore(), SessionKv(), lambda target, frame: True, Metrics(),
                    clock=clocks.monotonic_s, wall_ms=clocks.wall_ms,
                    system_command=lambda now_ms: b"tick", clock_agreement=clock_agreement)
    return driver, stamps


def test_a_tick_after_the_sequencers_wall_clock_jumps_an_hour_is_stamped_seconds_later(
        ) -> None:
    """The bug: the Tick after the step was stamped an hour on, and expired every lease and
    session in the state machine."""
    clocks = Clocks()
    driver, stamps = sequencer_driver(clocks)
    driver._maybe_system_command()
    clocks.pass_ms(1000)
    clocks.wall += HOUR_MS
    driver._maybe_system_command()
    assert len(stamps) == 2
    assert 0 <= stamps[1] - stamps[0] <= 2_000  # one second passed, not an hour
    assert driver.stamp_clock.steps_detected == 1


def test_the_server_stamps_by_the_drivers_clock() -> None:
    """One stamp clock per replica: a command served after the step is stamped as the Ticks
    are, not by the raw wall clock."""
    clocks = Clocks()
    driver, stamps = sequencer_driver(clocks)
    server = ClientServer(driver)
    driver._maybe_system_command()
    clocks.pass_ms(1000)
    clocks.wall += HOUR_MS
    served = server._stamp_ms(0)
    assert 0 <= served - stamps[0] <= 2_000
    clocks.pass_ms(1000)
    driver._maybe_system_command()
    assert stamps[1] >= served and driver.stamp_clock.steps_detected == 1
