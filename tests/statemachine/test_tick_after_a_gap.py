"""Node liveness judged on Tick after a gap in logical time.

A node's lease is judged only on Tick. When no Tick came for a while (the store itself had no
quorum, or a sequencer whose clock is ahead stamped a Tick far in the future), the first Tick
after the gap took every node straight from Up to Down in one step: the Suspect grace
(`down_after_ms`, "no new placements; allocations kept") was never observed, no agent had a
chance to heartbeat (they could not reach the store either), and every gang of a RELEASE
tenant was released at once, with a KILL_POD sent to each of its running pods. Down now comes
`down_after_ms` after the Tick that saw the lease run out.
"""

from __future__ import annotations

from statemachine.commands import Heartbeat
from statemachine.effects import EffectKind
from statemachine.limits import STAMP_LEAD_MS_MAX
from statemachine.nodes import Liveness
from statemachine.results import GroupPhase
from statemachine.spec import FailurePolicy, PolicySpec
from tests.statemachine.builders import Driver, gang, node_principal, rack_spec, vc
from tests.statemachine.test_scenarios import started

POLICY = PolicySpec(lease_ms=10_000, down_after_ms=20_000)
NODES = ("n0", "n1", "n2", "n3")


def _cluster() -> Driver:
    driver = Driver()
    driver.configure(rack_spec(racks=2, policy=POLICY, quota=(
        vc("a", ("A100-RACK", "A100-RACK", 2), on_failure=FailurePolicy.RELEASE),)))
    driver.register(*NODES)
    for name in ("G0", "G1"):
        assert driver.submit(gang(name, "a", 0, (2, 8))).phase is GroupPhase.ALLOCATED
        started(driver, name)
    driver.heartbeat_all()
    driver.tick()
    assert all(driver.state.nodes[node].liveness is Liveness.UP for node in NODES)
    return driver


def _kills(driver: Driver) -> list[str]:
    return [effect.pod_uid for effect in driver.state.outbox.effects
            if effect.kind is EffectKind.KILL_POD]


def test_first_tick_after_a_store_outage_does_not_take_every_node_down() -> None:
    """The store had no quorum for 60 s (no Tick, no heartbeat could be applied). Its first
    Tick after recovery must leave the agents the Suspect grace to heartbeat again: it may
    judge the nodes Suspect, not Down, and must not release every gang and kill its pods."""
    driver = _cluster()
    driver.tick(step_ms=60_000)  # the first Tick the recovered store applies
    down = [node for node in NODES if driver.state.nodes[node].liveness is Liveness.DOWN]
    assert down == [], f"one Tick after the outage took {down} straight from Up to Down"
    assert {"G0", "G1"} <= set(driver.state.groups), "every gang was released"
    assert _kills(driver) == [], "every running pod was told to stop"
    # The agents get back through and heartbeat within the grace: all is as before.
    driver.heartbeat_all()
    driver.tick(step_ms=1_000)
    assert all(driver.state.nodes[node].liveness is Liveness.UP for node in NODES)
    assert {"G0", "G1"} <= set(driver.state.groups)


def test_a_tick_stamped_by_a_sequencer_clock_far_ahead_does_not_down_every_node() -> None:
    """A failover to a replica whose wall clock is 5 minutes ahead: its first Tick (stamped
    1 s after the last heartbeats, by real time) jumps logical time by 5 minutes. Every
    node was heartbeating a second ago; none may be judged Down by that one Tick."""
    driver = _cluster()
    driver.heartbeat_all()
    driver.tick(step_ms=300_000)
    down = [node for node in NODES if driver.state.nodes[node].liveness is Liveness.DOWN]
    assert down == [], f"a clock jump took {down} Down at once"
    assert {"G0", "G1"} <= set(driver.state.groups)


def test_a_node_is_suspect_for_down_after_ms_of_ticks_before_down() -> None:
    """nodes.py: "Up, then Suspect after `lease_ms` without a heartbeat, then Down
    `down_after_ms` later". A silent node still goes Down, after the grace."""
    driver = _cluster()
    seen = set()
    for _ in range(40):  # n0 and n1 keep heartbeating; n2 and n3 go silent
        for node in ("n0", "n1"):
            driver.ok(Heartbeat(node=node, incarnation=driver.incarnations[node]),
                      node_principal(node))
        driver.tick(step_ms=1_000)
        seen.add(driver.state.nodes["n2"].liveness)
    assert Liveness.SUSPECT in seen
    assert driver.state.nodes["n2"].liveness is Liveness.DOWN
    assert driver.state.nodes["n3"].liveness is Liveness.DOWN
    assert driver.state.nodes["n0"].liveness is Liveness.UP


def test_one_heartbeat_stamped_by_a_replica_clock_ahead_does_not_down_the_others() -> None:
    """Any replica stamps the commands it is sent with its own clock, not just the sequencer.
    One heartbeat (n0's) served by a replica whose clock is 5 minutes ahead moves logical time
    5 minutes on; the sequencer's next Tick, a second later by real time, is clamped to it:
    every other node, heartbeating every 2 s, was judged Down by that Tick."""
    driver = _cluster()
    driver.heartbeat_all()
    real_ms = driver.now_ms
    driver.now_ms = real_ms + 300_000  # the skewed replica's stamp
    driver.ok(Heartbeat(node="n0", incarnation=driver.incarnations["n0"]), node_principal("n0"))
    driver.now_ms = real_ms  # the sequencer's clock is right
    driver.tick(step_ms=1_000)
    down = [node for node in NODES if driver.state.nodes[node].liveness is Liveness.DOWN]
    assert down == [], f"one skewed stamp took {down} Down"
    assert {"G0", "G1"} <= set(driver.state.groups)



def _skewed_heartbeat(driver: Driver, node: str, ahead_ms: int) -> None:
    """`node`'s heartbeat, served by a replica whose clock is `ahead_ms` ahead."""
    real_ms = driver.now_ms
    driver.now_ms += ahead_ms
    driver.ok(Heartbeat(node=node, incarnation=driver.incarnations[node]), node_principal(node))
    driver.now_ms = real_ms + 1


def test_a_heartbeat_stamped_an_hour_ahead_does_not_hide_a_dead_node() -> None:
    """One heartbeat (n0's) served by a replica whose clock is an hour ahead (NTP broken
    there) moved logical time an hour on; every lease renewed after it ran to that hour plus
    `lease_ms`, and the sequencer's Ticks, stamped by real time, were clamped to it: a node
    that died was not judged Suspect or Down for the whole hour. Only Ticks move logical time
    freely; any other command moves it at most `STAMP_LEAD_MS_MAX` past the latest Tick."""
    driver = _cluster()
    tick_ms = driver.now_ms
    _skewed_heartbeat(driver, "n0", 3_600_000)
    assert driver.state.now_ms <= tick_ms + STAMP_LEAD_MS_MAX
    driver.heartbeat_all()  # n3's last heartbeat, right after the skewed one
    for _ in range(120):  # two minutes of real time: n3 is dead, the others heartbeat
        _skewed_heartbeat(driver, "n0", 3_600_000)  # the skewed replica serves n0 throughout
        for node in ("n1", "n2"):
            driver.ok(Heartbeat(node=node, incarnation=driver.incarnations[node]),
                      node_principal(node))
        driver.tick(step_ms=1_000)
        # The lead is counted from the Tick's stamp, not from logical time: it does not pile
        # up Tick after Tick (logical time would run 6 times as fast as real time).
        assert driver.state.now_ms <= driver.now_ms + STAMP_LEAD_MS_MAX
    assert driver.state.nodes["n3"].liveness is Liveness.DOWN, "a dead node passed for live"
    assert all(driver.state.nodes[node].liveness is Liveness.UP for node in ("n0", "n1", "n2"))
