"""Tick: logical time moves on, and everything that depends on time happens, in a fixed order.

1. Node leases, by node id: Up -> Suspect when the lease ran out (no new placements there),
   Suspect -> Down `down_after_ms` after the Tick that saw the lease run out, never in that
   same Tick (its GPUs count as failed: the gangs on it are told, and released where their
   tenant's policy says so).
2. Preemption deadlines, by gang id: victims that have not left get their kills re-sent, or
   are released outright when every node they run on is Down.
3. Evictions with no preemptor waiting (a drain, a cancelled or released preemptor), by gang
   id: a gang whose live pods are all on Down nodes is released (none can report its exit).
4. One bounded scheduling pass, the only one besides submission that may preempt.

Session expiry is the machine's, right after (sessions live beside the state).
"""

from __future__ import annotations

from statemachine.commands import Tick
from statemachine.groups import Group
from statemachine.lifecycle import LIVE_PHASES, hardware_failed, release, resend_kills
from statemachine.nodes import Liveness
from statemachine.results import Done, GroupPhase
from statemachine.rules import raise_rules
from statemachine.scheduler import schedule
from statemachine.state import State, refresh_usable


def tick(state: State, command: Tick) -> Done:
    raise_rules(state, command.rules)
    if state.config is None:
        return Done(note=f"now {state.now_ms}; no configuration")
    suspect, down = _expire_leases(state)
    resent = _preemption_deadlines(state)
    _forced_evictions(state)
    schedule(state, preempt=True)
    return Done(note=f"now {state.now_ms}; {suspect} suspect, {down} down, "
                     f"{resent} kills resent")


def _expire_leases(state: State) -> tuple[int, int]:
    config = state.configured()
    policy = config.spec.policy
    topology = config.topology
    suspect = down = 0
    failed: list[int] = []  # the GPUs of the nodes now Down, told to their gangs at once
    for name in sorted(state.nodes):
        record = state.nodes[name]
        if record.liveness is Liveness.UP and state.now_ms > record.lease_expires_ms:
            state.set(record, "liveness", Liveness.SUSPECT)
            # Down comes `down_after_ms` after a Tick saw the lease run out, never in the
            # same Tick: after a gap in Ticks (the store had no quorum, so no agent could
            # heartbeat either; a sequencer's clock stepped ahead) the first Tick would
            # otherwise take every node from Up to Down at once and release their gangs.
            state.set(record, "lease_expires_ms", state.now_ms)
            refresh_usable(state, record)
            suspect += 1
        if (record.liveness is Liveness.SUSPECT
                and state.now_ms > record.lease_expires_ms + policy.down_after_ms):
            state.set(record, "liveness", Liveness.DOWN)
            refresh_usable(state, record)
            failed.extend(topology.leaves(topology.node_cell[record.index]))
            down += 1
    if failed:  # once, not per node: a gang over many nodes is updated and told once
        hardware_failed(state, failed)
    return suspect, down


def _all_live_pods_down(state: State, group: Group) -> bool:
    topology = state.configured().topology
    nodes = sorted({pod.node for pod in group.pods if pod.phase in LIVE_PHASES})
    return all(state.nodes[topology.node_ids[node]].liveness is Liveness.DOWN for node in nodes)


def _forced_evictions(state: State) -> None:
    due = sorted(name for name, group in state.groups.items()
                 if group.evicting and not group.preempted_by)
    for name in due:
        group = state.groups.get(name)
        if (group is not None and group.evicting and not group.preempted_by
                and _all_live_pods_down(state, group)):
            release(state, group, f"{group.evicting}; forced: its nodes are down")


def _preemption_deadlines(state: State) -> int:
    resent = 0
    due = sorted(name for name, group in state.groups.items()
                 if group.phase is GroupPhase.PREEMPTING and group.deadline_ms <= state.now_ms)
    for name in due:
        group = state.groups.get(name)
        if group is None or group.phase is not GroupPhase.PREEMPTING:
            continue
        for victim_name in group.victims:
            victim = state.groups.get(victim_name)
            if victim is None or group.group not in victim.preempted_by:
                continue  # gone (a later gang may reuse its id: only a victim names us)
            # Only nodes where a pod still runs matter: one whose pod exited has left.
            if _all_live_pods_down(state, victim):
                release(state, victim, "preemption forced: its nodes are down")
            else:
                resend_kills(state, victim)
                resent += 1
        if group.group in state.groups and group.phase is GroupPhase.PREEMPTING:
            state.set(group, "deadline_ms", state.now_ms + state.policy.preemption_grace_ms)
    return resent
