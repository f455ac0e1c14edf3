"""A Tick's scheduling pass that runs out of budget is taken up where it stopped by the next.

A pass tries at most `schedule_attempts_max` gangs. On a Tick a guaranteed gang is tried with
preemption again whenever the change epoch moved (a gang placed or released anywhere), so under
churn between Ticks the same unplaceable gangs at the head of the queue are worth retrying at
every Tick. A Tick's pass that stops early keeps the queue key of the first gang it did not try;
the next Tick's pass starts there, goes to the end of the queue and wraps around to its head, so
every pending gang is tried within ceil(pending / attempts) Ticks. Here tenant a has ATTEMPTS
unplaceable priority-100 gangs, opportunistic gangs churn between Ticks, and tenant b's
priority-50 gang, which only needs to evict opportunistic gangs, is tried and placed at the
second Tick (every Tick's budget had gone to a's gangs, and it was still pending after
CHURN_TICKS Ticks, while one quiet Tick placed it). The cursor is journaled state like the
epochs, so it is in the snapshot (format 5; earlier formats load without one).
"""

from __future__ import annotations

import msgpack

from statemachine.commands import ReleaseGroup
from statemachine.pending import QueueKey
from statemachine.results import GroupPhase
from statemachine.sessions import Sessions
from statemachine.snapshot_codec import decode_snapshot, encode_snapshot
from statemachine.spec import PolicySpec
from statemachine.state import State
from tests.statemachine.builders import SCHEDULER, Driver, gang, rack_spec, vc

ATTEMPTS = PolicySpec().schedule_attempts_max  # gangs one pass tries (16)
CHURN_TICKS = 20  # Ticks, each after an opportunistic gang left and another came
OPPORTUNISTIC_GPUS = 16  # one-GPU opportunistic gangs filling the GPUs nobody guarantees


def starving_queue() -> Driver:
    """Two racks (4 nodes of 8 GPUs); tenants a and b are guaranteed one node each. a's node
    is held by a priority-100 gang and ATTEMPTS more of a's priority-100 gangs wait (they can
    neither fit nor preempt); b's priority-50 gang "late" waits behind them. The cluster is
    full of one-GPU opportunistic gangs; "late" could evict some of them."""
    driver = Driver()
    driver.configure(rack_spec(racks=2, quota=(vc("a", ("A100-RACK", "A100-NODE", 1)),
                                               vc("b", ("A100-RACK", "A100-NODE", 1)))))
    driver.register("n0", "n1", "n2", "n3")
    driver.submit(gang("a-held", "a", 100, (1, 8)))
    driver.submit(gang("b-held", "b", 60, (1, 8)))
    for index in range(OPPORTUNISTIC_GPUS):
        status = driver.submit(gang(f"o{index:03}", "a", -1, (1, 1)))
        assert status.phase is GroupPhase.ALLOCATED, status
    for index in range(ATTEMPTS):
        status = driver.submit(gang(f"a{index:02}", "a", 100, (1, 8)))
        assert status.phase is GroupPhase.PENDING, status
    assert driver.submit(gang("late", "b", 50, (1, 8))).phase is GroupPhase.PENDING
    # b's node comes free: its release's pass tries a's gangs only (its budget), and
    # opportunistic gangs take the node at once, so "late" must now evict some of them.
    driver.ok(ReleaseGroup(group="b-held", reason="done"), SCHEDULER)
    for index in range(OPPORTUNISTIC_GPUS, OPPORTUNISTIC_GPUS + 8):
        assert driver.submit(gang(f"o{index:03}", "a", -1, (1, 1))).phase is GroupPhase.ALLOCATED
    return driver


def churn(driver: Driver, serial: int) -> None:
    """An opportunistic gang leaves and another takes its GPU: the change epoch moves."""
    oldest = min(name for name, group in driver.state.groups.items()
                 if group.priority < 0 and group.phase is GroupPhase.ALLOCATED)
    driver.ok(ReleaseGroup(group=oldest, reason="done"), SCHEDULER)
    driver.submit(gang(f"o{serial:03}", "a", -1, (1, 1)))


def resume(state: State) -> QueueKey | None:
    """Where the next Tick's pass starts (read through a call: each Tick changes it)."""
    return state.schedule_resume


def test_a_gang_behind_a_full_budget_of_stuck_gangs_is_tried_under_churn() -> None:
    driver = starving_queue()
    late = driver.state.groups["late"]
    for tick in range(CHURN_TICKS):
        churn(driver, 100 + tick)
        driver.tick()
        if late.phase is not GroupPhase.PENDING:
            break
    assert late.phase is not GroupPhase.PENDING, late.why_pending
    assert tick + 1 <= -(-(ATTEMPTS + 1) // ATTEMPTS), tick
    assert late.phase is GroupPhase.ALLOCATED, late  # its victims had no pods started


def test_the_pass_resumes_where_it_stopped_wraps_around_and_a_full_pass_clears_it() -> None:
    """The first Tick tries a's ATTEMPTS gangs and stops at "late": the cursor is its key. The
    second starts there, places "late", wraps around to the head and stops at a's last gang;
    the third starts there and, having tried every pending gang within its budget, clears it."""
    driver = starving_queue()
    state = driver.state
    stuck = [f"a{index:02}" for index in range(ATTEMPTS)]
    churn(driver, 100)
    driver.tick()
    assert resume(state) == state.groups["late"].queue_key()
    churn(driver, 101)
    driver.tick()
    assert state.groups["late"].phase is GroupPhase.ALLOCATED
    assert resume(state) == state.groups[stuck[-1]].queue_key()
    assert all(state.groups[name].preempt_epoch == state.change_epoch for name in stuck[:-1])
    churn(driver, 102)
    driver.tick()
    assert resume(state) is None
    assert all(state.groups[name].preempt_epoch == state.change_epoch for name in stuck)
    assert all("no gangs below priority 100" in state.groups[name].why_pending
               for name in stuck)


def test_the_cursor_is_in_the_snapshot_and_absent_from_a_format_4_one() -> None:
    driver = starving_queue()
    churn(driver, 100)
    driver.tick()
    resume = driver.state.schedule_resume
    assert resume is not None
    snapshot = encode_snapshot(driver.state, Sessions(), 7)
    state, _, _ = decode_snapshot(snapshot)
    assert state.schedule_resume == resume
    assert encode_snapshot(state, Sessions(), 7) == snapshot
    raw = msgpack.unpackb(snapshot, strict_map_key=False)
    raw[1] = 4
    del raw[13:]
    for fields in raw[10]:
        del fields[21:]  # a gang's pod failure policy: none before format 6
    old, _, _ = decode_snapshot(msgpack.packb(raw))
    assert old.schedule_resume is None
