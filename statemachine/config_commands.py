"""ApplyConfig: replace the cluster configuration through the log, without a restart.

The new spec is validated (errors name the path), then installed as a whole: a new cell tree,
nodes carried over where their shape is unchanged, and every gang re-attached, those not told
to leave first, then by priority, then in submission order (HiveD's work-preserving
reconfiguration, reference/hived.md 1.12): allocated gangs keep their GPUs (found again by node
and GPU index) and, if guaranteed, have their tenant's cells bound again around them; a gang
that no longer fits its tenant is downgraded to opportunistic and listed in the reply.
Preempting gangs go back to the queue (listed too). A pending gang the new configuration
could never place (no chain of its model or of its tenant's cells, or, from rules version 4,
pods those cells or nodes can never hold, as submission would refuse them) is released.
Each list names its first gangs, by id, up to CONFIG_NAMES_BYTES_MAX, and counts those left
out. A configuration that would remove or reshape a node under a live gang is refused
(CONFIG_CONFLICT): drain it first.
"""

from __future__ import annotations

from dataclasses import replace

from statemachine.buddy import Buddy
from statemachine.commands import ApplyConfig
from statemachine.config_check import check_spec
from statemachine.effects import EffectKind
from statemachine.errors import Code, refuse
from statemachine.group_commands import never_fits
from statemachine.groups import Group
from statemachine.lifecycle import release
from statemachine.limits import CONFIG_NAMES_BYTES_MAX, OPPORTUNISTIC_PRIORITY
from statemachine.node_commands import carry_over
from statemachine.nodes import NodeRecord
from statemachine.results import ConfigApplied, GroupPhase
from statemachine.rules import PODS_PACKED_AT_SUBMIT
from statemachine.scheduler import eligible_chains, schedule
from statemachine.state import Configured, State, derive_uuid_owner, leaf_usable
from statemachine.topology import Topology
from statemachine.views import within_bytes


def apply_config(state: State, command: ApplyConfig) -> ConfigApplied:
    current = state.config.version if state.config is not None else 0
    if command.expected_version != current:
        raise refuse(Code.VERSION_MISMATCH,
                     f"expected version {command.expected_version}, current is {current}")
    topology = check_spec(command.spec)
    previous = state.config
    old = previous.topology if previous is not None else None
    if old is not None:
        _check_conflicts(state, old, topology)
    config = Configured(command.spec, current + 1, topology, state.journal)
    nodes = _carry_nodes(state, topology)
    usable = [leaf for chain in topology.chains for leaf in chain.cells_at(1)
              if leaf_usable(config, nodes, leaf)]
    if usable:
        config.cells._set_usable(usable, True)  # a fresh object: dropped whole on rollback
    state.set(state, "config", config)
    state.set(state, "nodes", nodes)
    state.set(state, "uuid_owner", derive_uuid_owner(nodes))
    downgraded, requeued = [], []
    # Those that keep their tenant's cells when they no longer all fit: gangs staying before
    # gangs told to leave, then by priority, then oldest first (lazy preemption's order).
    for group in sorted(state.groups.values(), key=lambda group: (
            bool(group.evicting), -group.effective_priority, group.submit_index)):
        outcome = _reattach(state, previous, config, group)
        if outcome == "downgraded":
            downgraded.append(group.group)
        elif outcome == "requeued":
            requeued.append(group.group)
    state.bump_capacity()
    schedule(state)
    downgraded_named, downgraded_omitted = within_bytes(tuple(sorted(downgraded)),
                                                        CONFIG_NAMES_BYTES_MAX)
    requeued_named, requeued_omitted = within_bytes(tuple(sorted(requeued)),
                                                    CONFIG_NAMES_BYTES_MAX)
    return ConfigApplied(version=config.version, downgraded=downgraded_named,
                         requeued=requeued_named, downgraded_omitted=downgraded_omitted,
                         requeued_omitted=requeued_omitted)


def _check_conflicts(state: State, old: Topology, new: Topology) -> None:
    for name in sorted(state.groups):
        group = state.groups[name]
        if group.phase is not GroupPhase.ALLOCATED:
            continue
        chains = set()
        for pod in group.pods:
            node = old.node_ids[pod.node]
            index = new.node_index.get(node)
            if index is None:
                raise refuse(Code.CONFIG_CONFLICT,
                             f"node {node} holds gang {name}; drain it before removing it")
            same_shape = (new.node_gpu_count(index) == old.node_gpu_count(pod.node) and
                          new.chains[new.node_chain[index]].gpu_model ==
                          old.chains[old.node_chain[pod.node]].gpu_model)
            if not same_shape:
                raise refuse(Code.CONFIG_CONFLICT,
                             f"node {node} holds gang {name}; its GPUs would change")
            chains.add(new.node_chain[index])
        if len(chains) > 1:
            raise refuse(Code.CONFIG_CONFLICT,
                         f"gang {name} would span chains "
                         f"{', '.join(sorted(new.chains[chain].name for chain in chains))}")


def _carry_nodes(state: State, topology: Topology) -> dict[str, NodeRecord]:
    nodes = {}
    for index, node in enumerate(topology.node_ids):
        old = state.nodes.get(node)
        model = topology.chains[topology.node_chain[index]].gpu_model
        if old is None:
            nodes[node] = NodeRecord(node=node, index=index)
        elif not old.gpus or (len(old.gpus) == topology.node_gpu_count(index)
                              and all(gpu.model == model for gpu in old.gpus)):
            nodes[node] = carry_over(old, index)
        else:
            # Its registration goes (the agent registers the new shape), but not what is known
            # of its boards: health belongs to a GPU, not to a slot, and the next registration
            # of the same boards takes it up again by UUID (node_commands._record_boot), as
            # after a deregistration. Boards past the new GPU count are dropped.
            kept = [(gpu, health) for gpu, health in zip(old.gpus, old.health, strict=True)
                    if gpu.index < topology.node_gpu_count(index)]
            nodes[node] = NodeRecord(node=node, index=index, incarnation=old.incarnation,
                                     gpus=tuple(gpu for gpu, _ in kept),
                                     health=tuple(replace(health) for _, health in kept),
                                     cordoned=old.cordoned, draining=old.draining,
                                     admin_bad=old.admin_bad)
    return nodes


def _reattach(state: State, previous: Configured | None, config: Configured,
              group: Group) -> str:
    vc_exists = group.vc in config.topology.quota
    requeued = group.phase is GroupPhase.PREEMPTING
    if requeued:  # its reservation was on the old cells: it queues again for the new ones
        _unplace(state, group)
    if group.phase is GroupPhase.PENDING:
        state.set(group, "attempt_epoch", -1)
        state.set(group, "preempt_epoch", -1)
        if not vc_exists and group.guaranteed:
            release(state, group, f"the configuration no longer has VC {group.vc}")
            return "released"
        chains = eligible_chains(config, group)
        if not chains:
            # As submission would refuse it (UNKNOWN_MODEL, MODEL_NOT_IN_VC): it could never
            # be placed, and would wait for ever.
            what = (f"guaranteed cells of VC {group.vc}" if group.guaranteed else "GPUs")
            release(state, group, f"the configuration no longer has {what} of model "
                                  f"{group.gpu_model or 'any'}")
            return "released"
        if state.rules_version >= PODS_PACKED_AT_SUBMIT:
            # As submission would refuse it (NEVER_SATISFIABLE): its tenant's cells, or the
            # chains' nodes, shrank under it. A rule of version 4 (statemachine/rules.py).
            reason = never_fits(config.topology, group.vc, group.guaranteed, chains,
                                group.members, packed=True)
            if reason is not None:
                release(state, group, f"the configuration can never place it: {reason}")
                return "released"
        if requeued:
            state.outbox.emit(EffectKind.GANG_REQUEUED, node="", group=group.group,
                              reason=group.why_pending)
        return "requeued" if requeued else "kept"
    assert previous is not None
    levels = _bound_levels(previous, config.topology, group)
    leaves = _remap(state, previous.topology, config.topology, group)
    outcome = "kept"
    if group.guaranteed:
        mark = state.journal.mark()
        if not (vc_exists and _rebind(config, group.vc, leaves, levels)):
            state.journal.rollback(mark)
            state.set(group, "effective_priority", OPPORTUNISTIC_PRIORITY)
            state.set(group, "downgraded", "no longer fits its VC after reconfiguration")
            state.outbox.emit(EffectKind.GANG_DOWNGRADED, node="", group=group.group,
                              reason=group.downgraded)
            outcome = "downgraded"
    config.cells.hold(leaves, group.group, group.effective_priority)
    return outcome


def _unplace(state: State, group: Group) -> None:
    """A preempting gang back to the queue: the cells it reserved belong to the old tree."""
    for pod in group.pods:
        state.set(pod, "node", -1)
        state.set(pod, "leaves", ())
    state.set(group, "phase", GroupPhase.PENDING)
    state.set(group, "chain", -1)
    state.set(group, "victims", ())
    state.set(group, "deadline_ms", 0)
    state.set(group, "why_pending", "its reservation was dropped by a reconfiguration")
    state.enqueue(group)


def _remap(state: State, old: Topology, new: Topology, group: Group) -> list[int]:
    leaves: list[int] = []
    for pod in group.pods:
        node = new.node_index[old.node_ids[pod.node]]
        pod_leaves = tuple(new.leaf_of(node, old.gpu_index(leaf)) for leaf in pod.leaves)
        state.set(pod, "node", node)
        state.set(pod, "leaves", pod_leaves)
        leaves.extend(pod_leaves)
    state.set(group, "chain", new.node_chain[group.pods[0].node])
    state.set(group, "preempted_by", ())  # preemptors are all requeued
    return leaves


def _bound_levels(previous: Configured, new: Topology, group: Group) -> list[int]:
    """Per GPU of an allocated gang (in placement order): the level, in the new tree, of the
    type of the cell its tenant had bound around it, or where the new chain has no type of
    that name (a type renamed), the same level if its cells have as many GPUs; 0 where there
    is neither."""
    old, buddy = previous.topology, previous.buddy
    levels = []
    for pod in group.pods:
        chain = new.chains[new.node_chain[new.node_index[old.node_ids[pod.node]]]]
        for leaf in pod.leaves:
            root = buddy.bound_root[leaf]
            if root < 0:
                levels.append(0)
                continue
            old_chain, old_level = old.chain_for(root), old.level[root]
            level = chain.level_of_type(old_chain.type_names[old_level])
            if not level and old_level <= chain.top_level and \
                    chain.size[old_level] == old_chain.size[old_level]:
                level = old_level
            levels.append(level)
    return levels


def _rebind(config: Configured, vc: str, leaves: list[int], levels: list[int]) -> bool:
    """Bind, around each GPU of a guaranteed gang, a cell the VC may still bind: first one of
    the type it was bound in before, then the lowest. (Lowest first alone would take a small
    cell around a gang's first GPUs and leave none for the rest of a larger cell.)"""
    topology, buddy = config.topology, config.buddy
    for leaf, before in zip(leaves, levels, strict=True):
        root = buddy.bound_root[leaf]
        if root >= 0:
            if buddy.bound_vc[root] != vc:
                return False
            continue
        chain = topology.chain_for(leaf)
        ancestors = [leaf, *topology.ancestors(leaf)]  # by level, from 1
        order = [before] if before else []
        order += [level for level in range(1, chain.top_level + 1) if level != before]
        if not any(_try_bind(buddy, vc, ancestors[level - 1]) for level in order):
            return False
    return True


def _try_bind(buddy: Buddy, vc: str, cell: int) -> bool:
    topology = buddy.topology
    chain, level = topology.chain_of[cell], topology.level[cell]
    if buddy.unbound[vc][chain][level] <= 0 or not buddy.bindable(cell):
        return False
    if not buddy.feasible_after(chain, [cell]):
        return False
    buddy.bind(cell, vc)
    return True
