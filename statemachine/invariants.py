"""The invariant checker (reference/hived.md 3.5): callable after any command, in tests always.

It recomputes everything derived from the primary state and compares it with what `apply`
maintained incrementally, then checks the rules that hold between primary facts:

1. no GPU held by two gangs or reserved by two (checked on the placements themselves);
2. holders, reservers, priorities, usability, free and bad counters and the best-fit index
   equal a recomputation; every placed pod's GPUs lie on its node and in the gang's chain;
3. free lists and split flags equal a from-scratch recomputation from the bindings (maximal
   cells with nothing bound inside; buddies always merged), and VC counters equal the quota
   minus the bound cells;
4. the safety condition holds on every chain;
5. every guaranteed gang lies inside cells bound to its own VC, and every bound cell holds or
   reserves a GPU for a guaranteed gang of its VC (else it should have been unbound);
6. gang integrity: complete placements, a pending gang has none and is queued, preemptors and
   victims name each other, victims rank strictly lower; a preemptor's reserved GPUs are held
   only by its victims, and by at least one (else it should have settled); a gang's effective
   priority is its own unless it was downgraded;
7. the queue, the UUID registry and the outbox numbering equal a recomputation.

`violations` lists what is wrong (empty when nothing is); `check_invariants` raises an
AssertionError with that list, since a broken invariant is a bug.
"""

from __future__ import annotations

from collections.abc import Sequence

from statemachine.buddy import Buddy, feasible
from statemachine.groups import Group
from statemachine.journal import Journal
from statemachine.results import GroupPhase, PodPhase
from statemachine.state import (
    Configured,
    State,
    bindings_of,
    derive,
    derive_queue,
    derive_uuid_owner,
)
from statemachine.topology import Topology


def check_invariants(state: State) -> None:
    found = violations(state)
    if found:
        raise AssertionError("invariants broken:\n  " + "\n  ".join(found))


def violations(state: State) -> list[str]:
    found: list[str] = []
    found += _placements(state)
    if found:
        return found  # the recomputation below assumes placements are disjoint
    found += _groups(state)
    if state.config is not None:
        found += _derived(state, state.config)
        found += _buddy(state.config.buddy)
        found += _safety_and_quota(state, state.config)
        found += _bindings_in_use(state, state.config)
    if state.queue.keys != derive_queue(state.groups):
        found.append("pending queue differs from the pending gangs")
    if state.uuid_owner != derive_uuid_owner(state.nodes):
        found.append("GPU UUID registry differs from the registered inventories")
    outbox = state.outbox
    if [effect.index for effect in outbox.effects] != list(range(outbox.first_index,
                                                                 outbox.next_index)):
        found.append("outbox indices are not contiguous")
    if outbox.packed_bytes != sum(len(data) for data in outbox.packed):
        found.append("outbox byte count differs from its effects'")
    return found


def _placements(state: State) -> list[str]:
    found = []
    holders: dict[int, str] = {}
    reservers: dict[int, str] = {}
    for name in sorted(state.groups):
        group = state.groups[name]
        table = reservers if group.phase is GroupPhase.PREEMPTING else holders
        for leaf in group.leaves():
            if leaf in table:
                found.append(f"GPU cell {leaf} is claimed by both {table[leaf]} and {name}")
            table[leaf] = name
    return found


def _groups(state: State) -> list[str]:
    found = []
    topology = state.config.topology if state.config is not None else None
    for name in sorted(state.groups):
        group = state.groups[name]
        if group.group != name:
            found.append(f"gang {name} is filed under another id ({group.group})")
        if group.submit_index >= state.next_submit:
            found.append(f"gang {name} has a submission index from the future")
        gpus = [gpu for gpu, _ in group.failures]
        if len(gpus) > group.gpus or gpus != sorted(set(gpus)):
            found.append(f"gang {name} has {len(gpus)} failures, not one per GPU of its "
                         f"{group.gpus}, by GPU")
        found += _pods(group, topology)
        found += _preemption_links(state, group)
    return found


def _pods(group: Group, topology: Topology | None) -> list[str]:
    found = []
    name = group.group
    placed = group.phase is not GroupPhase.PENDING
    uids = [pod.pod_uid for pod in group.pods if pod.pod_uid]
    if len(set(uids)) != len(uids):
        found.append(f"gang {name} binds one pod uid to two slots")
    if group.evicting and group.phase is not GroupPhase.ALLOCATED:
        found.append(f"gang {name} is evicting while {group.phase}")
    for pod in group.pods:
        where = f"gang {name} pod {pod.member}/{pod.index}"
        if (pod.phase is PodPhase.UNBOUND) != (not pod.pod_uid):
            found.append(f"{where}: phase {pod.phase} with uid {pod.pod_uid!r}")
        if not placed:
            if pod.leaves or pod.node >= 0 or pod.pod_uid:
                found.append(f"{where}: pending but placed or bound")
            continue
        if len(pod.leaves) != pod.gpus:
            found.append(f"{where}: {len(pod.leaves)} GPUs placed, {pod.gpus} asked")
        assert topology is not None
        for leaf in pod.leaves:
            if topology.level[leaf] != 1 or topology.node_of[leaf] != pod.node:
                found.append(f"{where}: cell {leaf} is not a GPU of its node")
            elif topology.chain_of[leaf] != group.chain:
                found.append(f"{where}: GPU {leaf} is off the gang's chain")
    if placed and group.chain < 0:
        found.append(f"gang {name} is placed without a chain")
    return found


def _preemption_links(state: State, group: Group) -> list[str]:
    found = []
    name = group.group
    if group.phase is not GroupPhase.PREEMPTING and group.victims:
        found.append(f"gang {name} lists victims while {group.phase}")
    for victim_name in group.victims:
        victim = state.groups.get(victim_name)
        if victim is None:
            continue  # it left; the preemptor settles once its GPUs are all vacated
        if name not in victim.preempted_by:
            found.append(f"victim {victim_name} does not name its preemptor {name}")
        if victim.effective_priority >= group.priority:
            found.append(f"victim {victim_name} does not rank below its preemptor {name}")
    if (group.effective_priority != group.priority) != bool(group.downgraded):
        found.append(f"gang {name} has effective priority {group.effective_priority} (its own "
                     f"{group.priority}) but downgraded={group.downgraded!r}")
    if group.phase is GroupPhase.PREEMPTING and state.config is not None:
        cells = state.config.cells
        holders = {cells.holder[leaf] for leaf in group.leaves()} - {""}
        if not holders:
            found.append(f"preemptor {name} waits with all its GPUs vacated")
        for holder in sorted(holders - set(group.victims)):
            found.append(f"preemptor {name} waits on {holder}, not one of its victims")
    for preemptor_name in group.preempted_by:
        preemptor = state.groups.get(preemptor_name)
        if preemptor is None or name not in preemptor.victims:
            found.append(f"gang {name} names {preemptor_name} as preemptor, which does not "
                         f"name it")
        if not group.evicting:
            found.append(f"gang {name} is a victim but not evicting")
    return found


def _derived(state: State, config: Configured) -> list[str]:
    cells, buddy = derive(config, state.nodes, state.groups, bindings_of(config.buddy),
                          Journal())
    found = []
    live = config.cells
    for field in ("holder", "holder_priority", "reserver", "reserver_priority", "usable",
                  "free", "bad", "chain_free"):
        found += _first_difference(f"cells.{field}", getattr(live, field), getattr(cells, field))
    for chain, (mine, theirs) in enumerate(zip(live.indexes, cells.indexes, strict=True)):
        if mine.contents() != theirs.contents():
            found.append(f"best-fit index of chain {chain} differs from a recomputation")
    if live.bound.contents() != cells.bound.contents():
        found.append("bound-cell index differs from a recomputation")
    for field in ("free_lists", "in_free", "split", "bound_root", "unbound", "demand",
                  "bound_cells"):
        if getattr(config.buddy, field) != getattr(buddy, field):
            found.append(f"buddy.{field} differs from a recomputation")
    return found


def _first_difference(what: str, live: Sequence[object], fresh: Sequence[object]) -> list[str]:
    for cell, (mine, theirs) in enumerate(zip(live, fresh, strict=True)):
        if mine != theirs:
            return [f"{what}[{cell}] is {mine!r}, a recomputation gives {theirs!r}"]
    return []


def _buddy(buddy: Buddy) -> list[str]:
    """Free lists and split flags from scratch: a cell is occupied when a cell at or above it
    is bound or a cell below it is; free-list cells are the maximal unoccupied ones."""
    topology = buddy.topology
    occupied = [root >= 0 for root in buddy.bound_root]
    for cell in range(topology.cell_count - 1, -1, -1):  # children have higher ids
        if occupied[cell] and topology.parent[cell] >= 0:
            occupied[topology.parent[cell]] = True
    found = []
    for cell in range(topology.cell_count):
        parent = topology.parent[cell]
        free = not occupied[cell] and (parent < 0 or occupied[parent])
        split = occupied[cell] and buddy.bound_root[cell] < 0
        if buddy.in_free[cell] != free:
            found.append(f"cell {topology.address[cell]} in_free={buddy.in_free[cell]}, "
                         f"expected {free}")
        if buddy.split[cell] != split:
            found.append(f"cell {topology.address[cell]} split={buddy.split[cell]}, "
                         f"expected {split}")
        if len(found) > 8:
            break
    return found


def _safety_and_quota(state: State, config: Configured) -> list[str]:
    topology, buddy = config.topology, config.buddy
    found = []
    for chain in topology.chains:
        counts = [len(cells) for cells in buddy.free_lists[chain.index]]
        if not feasible(chain.fanout, counts, buddy.demand[chain.index]):
            found.append(f"chain {chain.name}: safety broken (free {counts}, demand "
                         f"{buddy.demand[chain.index]})")
        for vc in topology.vc_names:
            for level in range(1, chain.top_level + 1):
                bound = sum(1 for cell in buddy.bound_cells[vc][chain.index]
                            if topology.level[cell] == level)
                if bound + buddy.unbound[vc][chain.index][level] != (
                        topology.quota[vc][chain.index][level]) or bound < 0:
                    found.append(f"VC {vc} chain {chain.name} level {level}: {bound} bound, "
                                 f"{buddy.unbound[vc][chain.index][level]} unbound")
    for name in sorted(state.groups):
        group = state.groups[name]
        if group.guaranteed and group.phase is not GroupPhase.PENDING:
            outside = [leaf for leaf in group.leaves() if buddy.vc_of_leaf(leaf) != group.vc]
            if outside:
                found.append(f"guaranteed gang {name} uses GPUs outside VC {group.vc}: "
                             f"{outside[:4]}")
    return found


def _bindings_in_use(state: State, config: Configured) -> list[str]:
    topology, buddy, cells = config.topology, config.buddy, config.cells
    found = []
    for vc in topology.vc_names:
        for chain in topology.chains:
            for root in buddy.bound_cells[vc][chain.index]:
                users = {name for leaf in topology.leaves(root)
                         for name in (cells.holder[leaf], cells.reserver[leaf]) if name}
                if not any((group := state.groups.get(name)) is not None and group.vc == vc
                           and group.guaranteed for name in users):
                    found.append(f"cell {topology.address[root]} is bound to VC {vc} but no "
                                 f"guaranteed gang of it uses it")
    return found
