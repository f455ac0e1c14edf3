"""Gang commands: SubmitGroup, BindPod, ReleaseGroup.

A submission is validated against the configuration (tenant, GPU model, shapes that can never
fit are refused up front, pai#4029 style: too many GPUs, a pod no place holds, and, from rules
version 4, pods that no way of packing them into the places they may go can hold, `never_fits`;
capacity down or held only makes a gang wait), queued, and tried at once; when that attempt freed
GPUs on the spot (victims with no pod to wait for), a scheduling pass hands what it left to the
queue. At most GROUPS_MAX gangs are held, pending ones included: past that a submission is
refused (GROUPS_FULL). Resubmitting the same id with the same spec returns the gang's current
status (idempotent); a different spec is a conflict. Binding claims the lowest free slot of a
member for a pod and puts the start effect, with the GPUs' UUIDs and the environment to inject,
in the outbox.
"""

from __future__ import annotations

from collections.abc import Sequence

from statemachine import limits
from statemachine.commands import BindPod, Member, ReleaseGroup, SubmitGroup
from statemachine.effects import EffectKind
from statemachine.errors import Code, refuse
from statemachine.groups import Group, make_pods
from statemachine.lifecycle import pod_env, pod_uuids, release
from statemachine.results import Done, GroupPhase, GroupStatus, PodBound, PodPhase
from statemachine.rules import PASS_AFTER_SUBMIT_FREES, PODS_PACKED_AT_SUBMIT
from statemachine.scheduler import schedule, try_place
from statemachine.state import Configured, State
from statemachine.topology import Chain, Topology
from statemachine.views import group_status


def submit_group(state: State, command: SubmitGroup) -> GroupStatus:
    config = state.configured()
    _check_shape(command)
    existing = state.groups.get(command.group)
    if existing is not None:
        if (existing.vc, existing.priority, existing.members, existing.gpu_model,
                existing.lazy_preemption, existing.on_pod_failure) != (
                command.vc, command.priority, command.members, command.gpu_model,
                command.lazy_preemption, command.on_pod_failure):
            raise refuse(Code.GROUP_CONFLICT,
                         f"gang {command.group!r} exists with a different spec")
        return group_status(state, existing)
    _check_against_config(config, command, state.rules_version)
    if len(state.groups) >= limits.GROUPS_MAX:  # every gang is kept until released
        raise refuse(Code.GROUPS_FULL, f"{len(state.groups)} gangs are held, at most "
                                       f"{limits.GROUPS_MAX}: release some first")
    group = Group(group=command.group, vc=command.vc, priority=command.priority,
                  effective_priority=command.priority, lazy_preemption=command.lazy_preemption,
                  gpu_model=command.gpu_model, members=command.members,
                  on_pod_failure=command.on_pod_failure, submit_index=state.next_submit,
                  submitted_ms=state.now_ms, pods=make_pods(command.members))
    state.set(state, "next_submit", state.next_submit + 1)
    state.journal.set_item(state.groups, group.group, group)
    state.enqueue(group)
    capacity_epoch = state.capacity_epoch
    try_place(state, group, preempt=True)
    if state.capacity_epoch != capacity_epoch and \
            state.rules_version >= PASS_AFTER_SUBMIT_FREES:
        # Its preemption freed GPUs or quota at once (a victim with no pod started left, a
        # lazy victim gave its cells back, a preemptor lost its reservation): what the gang
        # did not take goes to the queue now, not at the next command that runs a pass. A
        # rule of version 3 (statemachine/rules.py): a log written before replays as it ran.
        schedule(state)
    return group_status(state, group)


def _check_shape(command: SubmitGroup) -> None:
    def malformed(reason: str) -> Exception:
        return refuse(Code.MALFORMED, f"SubmitGroup.{reason}")

    if not limits.OPPORTUNISTIC_PRIORITY <= command.priority <= limits.PRIORITY_MAX:
        raise malformed(f"priority: {command.priority} is outside "
                        f"[{limits.OPPORTUNISTIC_PRIORITY}, {limits.PRIORITY_MAX}]")
    if not command.members or len(command.members) > limits.MEMBERS_MAX:
        raise malformed(f"members: between 1 and {limits.MEMBERS_MAX} needed")
    for index, member in enumerate(command.members):
        if not 1 <= member.pods <= limits.PODS_PER_MEMBER_MAX:
            raise malformed(f"members[{index}].pods: outside [1, {limits.PODS_PER_MEMBER_MAX}]")
        if not 1 <= member.gpus <= limits.GPUS_PER_NODE_MAX:
            raise malformed(f"members[{index}].gpus: outside [1, {limits.GPUS_PER_NODE_MAX}]")
    if sum(member.pods for member in command.members) > limits.PODS_PER_GANG_MAX:
        raise malformed(f"members: more than {limits.PODS_PER_GANG_MAX} pods")
    if _gpus(command.members) > limits.GPUS_PER_GANG_MAX:
        raise malformed(f"members: more than {limits.GPUS_PER_GANG_MAX} GPUs")


def _gpus(members: tuple[Member, ...]) -> int:
    return sum(member.pods * member.gpus for member in members)


def _check_against_config(config: Configured, command: SubmitGroup, rules_version: int) -> None:
    topology = config.topology
    if command.vc not in topology.quota:
        raise refuse(Code.UNKNOWN_VC, f"no virtual cluster {command.vc!r}")
    chains = [chain for chain in topology.chains
              if not command.gpu_model or chain.gpu_model == command.gpu_model]
    if not chains:
        raise refuse(Code.UNKNOWN_MODEL, f"no chain has GPUs of model {command.gpu_model!r}")
    guaranteed = command.priority > limits.OPPORTUNISTIC_PRIORITY
    if guaranteed:
        chains = [chain for chain in chains if any(topology.quota[command.vc][chain.index])]
        if not chains:
            raise refuse(Code.MODEL_NOT_IN_VC,
                         f"VC {command.vc} has no guaranteed cells of model "
                         f"{command.gpu_model or 'any'}")
    reason = never_fits(topology, command.vc, guaranteed, chains, command.members,
                        packed=rules_version >= PODS_PACKED_AT_SUBMIT)
    if reason is not None:
        raise refuse(Code.NEVER_SATISFIABLE, reason)


def never_fits(topology: Topology, vc: str, guaranteed: bool, chains: Sequence[Chain],
               members: tuple[Member, ...], *, packed: bool) -> str | None:
    """Why no placement of the gang's pods can exist on any of `chains`, every GPU free and
    usable, or None when one may: a guaranteed gang's pods go inside its tenant's guaranteed
    cells, an opportunistic gang's on the chain's nodes, each pod inside one node (or one cell
    below a node). Capacity that is down, failed or held is not looked at: a gang waits for it.

    The total and the largest pod are always checked; `packed` (the rules from
    `rules.PODS_PACKED_AT_SUBMIT` on) also checks, for each pod size, that the places a pod
    may go have room for all the pods of that size or more, as many to a place as fit whole
    (three pods of 5 GPUs on two nodes of 8 never fit, though 15 <= 16). A necessary
    condition: a gang it passes may still not pack, but one it refuses never could."""
    largest_pod = max(member.gpus for member in members)
    total = _gpus(members)
    sizes = sorted({member.gpus for member in members})
    reasons = []
    for chain in chains:
        quota = topology.quota[vc][chain.index] if guaranteed else None
        if quota is not None:
            cell = max(chain.size[level] for level in range(1, chain.top_level + 1)
                       if quota[level])
            room = sum(quota[level] * chain.size[level] for level in range(len(quota)))
        else:
            cell = chain.size[chain.node_level]
            room = chain.size[chain.top_level] * chain.level_count[chain.top_level]
        pod_room = min(cell, chain.size[chain.node_level])
        if largest_pod > pod_room or total > room:
            reasons.append(f"{chain.name}: pods of at most {pod_room} GPUs, {room} GPUs in all")
            continue
        short = _first_short_size(chain, quota, members, sizes) if packed else None
        if short is None:
            return None
        size, places = short
        pods = sum(member.pods for member in members if member.gpus >= size)
        where = f"VC {vc}'s cells" if quota is not None else "its nodes"
        reasons.append(f"{chain.name}: {where} have room for {places} of its {pods} pods of "
                       f"{size} GPUs or more")
    return (f"{total} GPUs in pods of up to {largest_pod} can never fit: "
            + "; ".join(reasons))


def _first_short_size(chain: Chain, quota: tuple[int, ...] | None,
                      members: tuple[Member, ...], sizes: Sequence[int]) -> tuple[int, int] | None:
    """The smallest pod size whose pods (with the larger ones) outnumber the places for them,
    as (size, places), or None. A place is a node, or a guaranteed cell below the node level;
    one of `gpus` GPUs holds `gpus // size` pods of `size` or more."""
    node = chain.node_level
    if quota is None:
        places = [(chain.size[node], chain.level_count[node])]
    else:
        places = [(chain.size[min(level, node)],
                   quota[level] * (chain.size[level] // chain.size[node] if level >= node else 1))
                  for level in range(1, chain.top_level + 1) if quota[level]]
    for size in sizes:
        pods = sum(member.pods for member in members if member.gpus >= size)
        room = sum(count * (gpus // size) for gpus, count in places)
        if pods > room:
            return size, room
    return None


def bind_pod(state: State, command: BindPod) -> PodBound:
    group = state.group(command.group)
    if group.phase is not GroupPhase.ALLOCATED or group.evicting:
        why = group.evicting or group.phase.value
        raise refuse(Code.GROUP_NOT_ALLOCATED, f"gang {group.group} is {why}")
    if not 0 <= command.member < len(group.members):
        raise refuse(Code.UNKNOWN_POD, f"gang {group.group} has no member {command.member}")
    slot = -1
    for position, pod in enumerate(group.pods):
        if pod.pod_uid == command.pod_uid:
            if pod.member != command.member:
                raise refuse(Code.POD_MISMATCH, f"pod {command.pod_uid!r} is bound to member "
                                                f"{pod.member}, not {command.member}")
            return _bound(state, group, position)
        if slot < 0 and pod.member == command.member and pod.phase is PodPhase.UNBOUND:
            slot = position
    if slot < 0:
        raise refuse(Code.NO_FREE_SLOT,
                     f"member {command.member} of gang {group.group} has no free slot")
    pod = group.pods[slot]
    state.set(pod, "pod_uid", command.pod_uid)
    state.set(pod, "command", command.command)
    state.set(pod, "phase", PodPhase.BOUND)
    reply = _bound(state, group, slot)
    state.outbox.emit(EffectKind.START_POD, node=reply.node, group=group.group,
                      pod_uid=command.pod_uid, gpu_uuids=reply.gpu_uuids, env=reply.env,
                      command=command.command)
    return reply


def _bound(state: State, group: Group, position: int) -> PodBound:
    pod = group.pods[position]
    uuids = pod_uuids(state, group, position)
    return PodBound(group=group.group, member=pod.member, index=pod.index,
                    pod_uid=pod.pod_uid, node=state.configured().topology.node_ids[pod.node],
                    gpu_uuids=uuids, env=pod_env(uuids))


def release_group(state: State, command: ReleaseGroup) -> Done:
    group = state.group(command.group)
    phase = group.phase.value
    release(state, group, command.reason or "released by client")
    schedule(state)
    return Done(note=f"released {command.group} ({phase})")
