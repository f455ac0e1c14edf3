"""Read-only renderings of state for replies and queries: gang status, doomed cells.

Everything here reads and never writes, and every list comes out sorted, so a reply built from
it is the same bytes on every replica.
"""

from __future__ import annotations

from statemachine.groups import Group
from statemachine.limits import GROUP_FAILURES_BYTES_MAX
from statemachine.results import GroupStatus, PodView
from statemachine.state import Configured, State

_STR_HEADER_BYTES = 3  # msgpack's before a string of up to 64 KiB


def group_status(state: State, group: Group) -> GroupStatus:
    topology = state.config.topology if state.config is not None else None
    pods = []
    for pod in group.pods:
        node = topology.node_ids[pod.node] if topology is not None and pod.node >= 0 else ""
        indices = tuple(topology.gpu_index(leaf) for leaf in pod.leaves) if topology else ()
        pods.append(PodView(member=pod.member, index=pod.index, node=node, gpu_indices=indices,
                            pod_uid=pod.pod_uid, phase=pod.phase, exit_code=pod.exit_code,
                            exit_reason=pod.exit_reason))
    chain = topology.chains[group.chain].name if topology is not None and group.chain >= 0 else ""
    failures, omitted = within_bytes(failure_lines(group), GROUP_FAILURES_BYTES_MAX)
    return GroupStatus(group=group.group, vc=group.vc, phase=group.phase,
                       priority=group.priority, effective_priority=group.effective_priority,
                       chain=chain, pods=tuple(pods), victims=group.victims,
                       evicting=group.evicting, why_pending=group.why_pending,
                       failures=failures, failures_omitted=omitted)


def failure_lines(group: Group) -> tuple[str, ...]:
    """A gang's failures as GroupStatus shows them: "uuid: reason", sorted."""
    return tuple(sorted(f"{gpu}: {why}" for gpu, why in group.failures))


def within_bytes(lines: tuple[str, ...], bytes_max: int) -> tuple[tuple[str, ...], int]:
    """The first of `lines` that fit `bytes_max`, packed, and how many did not (a gang's
    failure lines could outgrow a client's frame: GPUS_PER_GANG_MAX of them, each up to a UUID
    and a reason of 4-byte characters; so could a reconfiguration's gang ids)."""
    size_bytes = 0
    for count, line in enumerate(lines):
        size_bytes += len(line.encode()) + _STR_HEADER_BYTES
        if size_bytes > bytes_max:
            return lines[:count], len(lines) - count
    return lines, 0


def healthy_obtainable(config: Configured, chain_index: int) -> list[int]:
    """Per level: the cells with no unusable GPU that buddy allocation could still bind."""
    topology, cells, buddy = config.topology, config.cells, config.buddy
    chain = topology.chains[chain_index]
    counts = [0] * (chain.top_level + 1)
    for above in range(1, chain.top_level + 1):
        for cell in buddy.free_lists[chain_index][above]:
            for level in range(1, above + 1):
                if cells.bad[cell] == 0:
                    counts[level] += chain.size[above] // chain.size[level]
                else:
                    counts[level] += sum(1 for inside in topology.descendants_at(cell, level)
                                         if cells.bad[inside] == 0)
    return counts


def doomed(config: Configured, vc: str, chain_index: int) -> list[int]:
    """Per level: how many of the VC's unbound cells must land on unusable hardware, compared
    VC by VC as HiveD does (reference/hived.md 1.9)."""
    healthy = healthy_obtainable(config, chain_index)
    unbound = config.buddy.unbound[vc][chain_index]
    return [max(0, unbound[level] - healthy[level]) for level in range(len(unbound))]
