"""Node commands: registration, heartbeats, GPU health, pod acknowledgements and exits (from the
node's own agent), and the admin's marks, cordon, drain and deregistration.

Deregistering forgets a registration, not what is known of the node: the admin's cordon, drain
and marks and the boards' health stay, as they do across a reboot or a new configuration
(config_commands._carry_nodes), until Uncordon, ClearBad or enough passing reports.

Agent commands carry the incarnation that registration handed out; an older one is refused
(STALE_INCARNATION), which fences a rebooted agent's late messages. A new incarnation means the
node rebooted: its running pods are marked bound again and listed in the reply, for the agent
to start anew. A pod of a gang being evicted is told to stop again at each registration: an
agent cut off long enough misses effects trimmed from the outbox, its kill among them, and the
gang would wait for that pod for ever; the reply marks such a pod evicting, so that an agent
that never ran it reports it exited rather than starting it. Health changes refresh the GPUs'
usability; GPUs that fail under gangs are reported on those gangs (and the gangs released where
their tenant's policy says so). A pod's first exit report is announced (POD_EXITED); a failed
one (a code other than 0) evicts its gang where the gang's pod failure policy says so.

A registration carries the agent's health reading of the GPUs it registers and applies it as a
health report would, before its scheduling pass: the store keeps a GPU's health across
registrations, and a GPU lost while the agent was away still passed in that pass.
"""

from __future__ import annotations

from dataclasses import replace

from statemachine.commands import (
    AckPodStarted,
    ClearBad,
    Cordon,
    Deregister,
    Drain,
    GpuInventory,
    GpuLink,
    HealthReport,
    HealthStatus,
    Heartbeat,
    MarkBad,
    RegisterNode,
    ReportHealth,
    ReportPodExit,
    Uncordon,
)
from statemachine.errors import Code, refuse
from statemachine.groups import Group, Pod
from statemachine.lifecycle import (
    LIVE_PHASES,
    evict,
    hardware_failed,
    kill_pod,
    pod_env,
    pod_exited,
    pod_uuids,
    release,
    requeue,
)
from statemachine.nodes import GpuHealth, Liveness, NodeRecord
from statemachine.results import Done, GroupPhase, NodeRegistered, PodAssignment, PodPhase
from statemachine.rules import ONE_REPORT_PER_GPU
from statemachine.scheduler import schedule
from statemachine.state import State, refresh_usable


def register_node(state: State, command: RegisterNode) -> NodeRegistered:
    config = state.configured()
    record = state.node(command.node)
    gpus = _check_inventory(state, record, command.gpus)
    links = _check_links(record, command.links, len(gpus))
    _check_health(state, record, command.health, gpus)
    if not (record.registered and record.boot_id == command.boot_id and record.gpus == gpus):
        _record_boot(state, record, command.boot_id, gpus)
    if record.links != links:
        state.set(record, "links", links)
    state.set(record, "lease_expires_ms", state.now_ms + config.spec.policy.lease_ms)
    if record.liveness is not Liveness.UP:
        state.set(record, "liveness", Liveness.UP)
    failed, _ = _apply_reports(state, record, command.health)
    _health_changed(state, record, failed)
    for group, _, pod in _pods_on(state, record):
        if group.evicting and pod.phase in LIVE_PHASES:  # its kill may have gone unseen
            kill_pod(state, group, pod, group.evicting)
    pods = [PodAssignment(group=group.group, pod_uid=pod.pod_uid,
                          gpu_uuids=pod_uuids(state, group, position),
                          env=pod_env(pod_uuids(state, group, position)), command=pod.command,
                          evicting=bool(group.evicting))
            for group, position, pod in _pods_on(state, record)
            if pod.phase in (PodPhase.BOUND, PodPhase.RUNNING)]
    return NodeRegistered(node=record.node, incarnation=record.incarnation, pods=tuple(pods))


def _check_inventory(state: State, record: NodeRecord,
                     gpus: tuple[GpuInventory, ...]) -> tuple[GpuInventory, ...]:
    topology = state.configured().topology
    chain = topology.chains[topology.node_chain[record.index]]
    expected = topology.node_gpu_count(record.index)

    def mismatch(reason: str) -> Exception:
        return refuse(Code.INVENTORY_MISMATCH, f"node {record.node}: {reason}")

    ordered = tuple(sorted(gpus, key=lambda gpu: gpu.index))
    if [gpu.index for gpu in ordered] != list(range(expected)):
        raise mismatch(f"expected GPU indices 0..{expected - 1}, got "
                       f"{sorted(gpu.index for gpu in gpus)}")
    for gpu in ordered:
        if gpu.model != chain.gpu_model:
            raise mismatch(f"GPU {gpu.index} is a {gpu.model}, the configuration says "
                           f"{chain.gpu_model}")
        owner = state.uuid_owner.get(gpu.uuid, record.node)
        if owner != record.node:
            raise mismatch(f"GPU {gpu.uuid} is already registered on node {owner}")
    if len({gpu.uuid for gpu in ordered}) != len(ordered):
        raise mismatch("duplicate GPU UUIDs")
    return ordered


def _check_links(record: NodeRecord, links: tuple[GpuLink, ...],
                 gpu_count: int) -> tuple[GpuLink, ...]:
    ordered = tuple(sorted(links, key=lambda link: (link.a, link.b)))
    for link in ordered:
        if not 0 <= link.a < link.b < gpu_count:
            raise refuse(Code.INVENTORY_MISMATCH,
                         f"node {record.node}: a link joins GPUs {link.a} and {link.b}; it "
                         f"must name two GPUs among 0..{gpu_count - 1}, the lower first")
    if len({(link.a, link.b) for link in ordered}) != len(ordered):
        raise refuse(Code.INVENTORY_MISMATCH, f"node {record.node}: a pair of GPUs is "
                                              "linked twice")
    return ordered


def _check_health(state: State, record: NodeRecord, reports: tuple[HealthReport, ...],
                  gpus: tuple[GpuInventory, ...]) -> None:
    registered = {gpu.uuid for gpu in gpus}
    for report in reports:
        if report.uuid not in registered:
            raise refuse(Code.UNKNOWN_GPU,
                         f"node {record.node} registers no GPU {report.uuid}")
    _check_once(state, record, reports)


def _check_once(state: State, record: NodeRecord, reports: tuple[HealthReport, ...]) -> None:
    """One report per GPU: a GPU named twice would count its passes twice, and a failed GPU
    would come back before `recover_reports` reports in a row. A rule of version 2
    (`statemachine.rules`): a log written before applies such a report as it did then."""
    if state.rules_version < ONE_REPORT_PER_GPU:
        return
    seen: set[str] = set()
    for report in reports:
        if report.uuid in seen:
            raise refuse(Code.MALFORMED, f"node {record.node}: GPU {report.uuid} is reported "
                                         "twice in one report")
        seen.add(report.uuid)


def _record_boot(state: State, record: NodeRecord, boot_id: str,
                 gpus: tuple[GpuInventory, ...]) -> None:
    if record.registered:  # a deregistered node's boards own no UUIDs (deregister)
        for gpu in record.gpus:
            state.journal.del_item(state.uuid_owner, gpu.uuid)
    for gpu in gpus:
        state.journal.set_item(state.uuid_owner, gpu.uuid, record.node)
    # Health belongs to a GPU, not to a slot: a board that stays keeps its failures and admin
    # marks (only ClearBad or passing reports clear them), through a deregistration too; a new
    # board starts healthy.
    known = {gpu.uuid: health for gpu, health in zip(record.gpus, record.health, strict=True)}
    health = tuple(known[gpu.uuid] if gpu.uuid in known else GpuHealth(since_ms=state.now_ms)
                   for gpu in gpus)
    if record.boot_id != boot_id or not record.registered:
        state.set(record, "incarnation", record.incarnation + 1)
        for _, _, pod in _pods_on(state, record):
            if pod.phase is PodPhase.RUNNING:
                state.set(pod, "phase", PodPhase.BOUND)
    state.set(record, "boot_id", boot_id)
    state.set(record, "gpus", gpus)
    state.set(record, "health", health)


def _pods_on(state: State, record: NodeRecord) -> list[tuple[Group, int, Pod]]:
    """The placed pods on a node, by gang id then pod position. A placed gang holds (or, while
    preempting, reserves) every GPU of its pods, so the gangs with a pod there are those the
    node's GPUs name (`_gangs_on`): found from the node's few GPUs, not a sort of every gang."""
    found = []
    for name in _gangs_on(state, record):
        group = state.groups[name]
        for position, pod in enumerate(group.pods):
            if pod.node == record.index and group.phase is not GroupPhase.PENDING:
                found.append((group, position, pod))
    return found


def _fenced(state: State, node: str, incarnation: int) -> NodeRecord:
    record = state.node(node)
    if not record.registered:
        raise refuse(Code.NOT_REGISTERED, f"node {node} is not registered")
    if incarnation != record.incarnation:
        raise refuse(Code.STALE_INCARNATION,
                     f"node {node}: incarnation {incarnation}, current {record.incarnation}")
    return record


def heartbeat(state: State, command: Heartbeat) -> Done:
    record = _fenced(state, command.node, command.incarnation)
    state.set(record, "lease_expires_ms", state.now_ms + state.policy.lease_ms)
    if record.liveness is Liveness.UP:
        return Done(note="lease renewed")
    was = record.liveness.value
    state.set(record, "liveness", Liveness.UP)
    refresh_usable(state, record)
    schedule(state)
    return Done(note=f"lease renewed; node {was} -> up")


def report_health(state: State, command: ReportHealth) -> Done:
    record = _fenced(state, command.node, command.incarnation)
    for report in command.reports:
        if record.gpu_by_uuid(report.uuid) < 0:
            raise refuse(Code.UNKNOWN_GPU, f"node {record.node} has no GPU {report.uuid}")
    _check_once(state, record, command.reports)
    failed, recovered = _apply_reports(state, record, command.reports)
    return _after_health_change(state, record, failed,
                                f"{len(failed)} failed, {recovered} recovered")


def _apply_reports(state: State, record: NodeRecord,
                   reports: tuple[HealthReport, ...]) -> tuple[list[int], int]:
    """Fold reports on the node's GPUs (each one known) into their health, in order: the
    indices of the GPUs that just failed, and how many just recovered."""
    failed, recovered = [], 0
    for report in reports:
        index = record.gpu_by_uuid(report.uuid)
        assert index >= 0, f"node {record.node} has no GPU {report.uuid}"
        change = _apply_report(state, record.health[index], report)
        if change < 0:
            failed.append(index)
        recovered += change > 0
    return failed, recovered


def _apply_report(state: State, health: GpuHealth, report: HealthReport) -> int:
    """Fold one report into a GPU's health: -1 if it just failed, 1 if it just recovered."""
    change = 0
    if report.status is HealthStatus.PASS:
        state.set(health, "passes", health.passes + 1)
        if health.failed and health.passes >= state.policy.recover_reports:
            state.set(health, "failed", False)
            change = 1
    else:
        state.set(health, "passes", 0)
        if report.status is HealthStatus.FAIL and not health.failed:
            state.set(health, "failed", True)
            change = -1
    if health.status is not report.status:
        state.set(health, "since_ms", state.now_ms)
    state.set(health, "status", report.status)
    state.set(health, "reason", report.reason)
    return change


def _after_health_change(state: State, record: NodeRecord, failing: list[int],
                         note: str) -> Done:
    _health_changed(state, record, failing)
    return Done(note=note)


def _health_changed(state: State, record: NodeRecord, failing: list[int]) -> None:
    """Refresh the node's usability, report its `failing` GPUs on the gangs they are under,
    then schedule."""
    refresh_usable(state, record)
    if failing:
        topology = state.configured().topology
        hardware_failed(state, [topology.leaf_of(record.index, index) for index in failing])
    schedule(state)


def _find_pod(state: State, record: NodeRecord, group_id: str,
              pod_uid: str) -> tuple[Group, int]:
    group = state.group(group_id)
    for position, pod in enumerate(group.pods):
        if pod.pod_uid == pod_uid:
            if pod.node != record.index:
                raise refuse(Code.POD_MISMATCH, f"pod {pod_uid} is not placed on {record.node}")
            return group, position
    raise refuse(Code.UNKNOWN_POD, f"gang {group_id} has no pod {pod_uid!r}")


def ack_pod_started(state: State, command: AckPodStarted) -> Done:
    record = _fenced(state, command.node, command.incarnation)
    group, position = _find_pod(state, record, command.group, command.pod_uid)
    pod = group.pods[position]
    expected = pod_uuids(state, group, position)
    if tuple(command.gpu_uuids) != expected:
        raise refuse(Code.POD_MISMATCH, f"pod {pod.pod_uid} was given {', '.join(expected)}, "
                                        f"not {', '.join(command.gpu_uuids)}")
    if pod.phase is PodPhase.EXITED:
        raise refuse(Code.POD_MISMATCH, f"pod {pod.pod_uid} has already exited")
    state.set(pod, "phase", PodPhase.RUNNING)
    return Done(note=f"pod {pod.pod_uid} running")


def report_pod_exit(state: State, command: ReportPodExit) -> Done:
    record = _fenced(state, command.node, command.incarnation)
    group, position = _find_pod(state, record, command.group, command.pod_uid)
    pod = group.pods[position]
    if pod.phase is not PodPhase.EXITED:
        pod_exited(state, group, pod, command.exit_code, command.reason)
        schedule(state)
    why = f" ({command.reason})" if command.reason else ""
    return Done(note=f"pod {pod.pod_uid} exited with {command.exit_code}{why}")


def mark_bad(state: State, command: MarkBad) -> Done:
    record = state.node(command.node)
    state.configured()
    if command.gpu:
        index = _gpu_index(record, command.gpu)
        before = bool(record.failing(index))
        state.set(record.health[index], "admin_bad", command.reason)
        failing = [] if before else [index]
    else:
        failing = [index for index in range(len(record.gpus)) if not record.failing(index)]
        state.set(record, "admin_bad", command.reason)
    if not record.registered:
        failing = []
    return _after_health_change(state, record, failing, f"marked bad: {command.reason}")


def clear_bad(state: State, command: ClearBad) -> Done:
    record = state.node(command.node)
    if command.gpu:
        health = record.health[_gpu_index(record, command.gpu)]
        state.set(health, "admin_bad", "")
        state.set(health, "failed", False)
        state.set(health, "passes", 0)
    else:  # the whole node: its own mark and every GPU's
        state.set(record, "admin_bad", "")
        for health in record.health:
            if health.admin_bad:
                state.set(health, "admin_bad", "")
    return _after_health_change(state, record, [], "cleared")


def _gpu_index(record: NodeRecord, uuid: str) -> int:
    index = record.gpu_by_uuid(uuid)
    if index < 0:
        raise refuse(Code.UNKNOWN_GPU, f"node {record.node} has no GPU {uuid}")
    return index


def cordon(state: State, command: Cordon) -> Done:
    record = state.node(command.node)
    state.set(record, "cordoned", True)
    refresh_usable(state, record)
    return Done(note=f"node {record.node} cordoned")


def uncordon(state: State, command: Uncordon) -> Done:
    record = state.node(command.node)
    state.set(record, "cordoned", False)
    state.set(record, "draining", False)
    refresh_usable(state, record)
    schedule(state)
    return Done(note=f"node {record.node} uncordoned")


def drain(state: State, command: Drain) -> Done:
    record = state.node(command.node)
    state.set(record, "cordoned", True)
    state.set(record, "draining", True)
    refresh_usable(state, record)
    names = _gangs_on(state, record)
    for name in names:
        group = state.groups.get(name)
        if group is None:
            continue
        if group.phase is GroupPhase.PREEMPTING:
            requeue(state, group, f"node {record.node} is draining")
        elif not group.evicting:
            evict(state, group, f"node {record.node} drained")
    schedule(state)
    return Done(note=f"node {record.node} draining; evicting {', '.join(names) or 'nothing'}")


def _gangs_on(state: State, record: NodeRecord) -> list[str]:
    config = state.configured()
    cells = config.cells
    leaves = config.topology.leaves(config.topology.node_cell[record.index])
    return sorted({name for leaf in leaves for name in (cells.holder[leaf], cells.reserver[leaf])
                   if name})


def deregister(state: State, command: Deregister) -> Done:
    record = state.node(command.node)
    state.configured()
    names = _gangs_on(state, record)
    if names and not command.force:
        raise refuse(Code.NODE_BUSY, f"node {record.node} holds gangs {', '.join(names)}")
    # A preemptor only reserved GPUs here (it never ran): back to the queue, as on a drain,
    # and first, or a victim's release would settle it onto this node just to release it.
    requeued = [name for name in names
                if state.groups[name].phase is GroupPhase.PREEMPTING]
    for name in requeued:
        requeue(state, state.groups[name], f"node {record.node} deregistered")
    released = [name for name in names if name not in requeued]
    for name in released:
        group = state.groups.get(name)
        if group is not None and group.phase is not GroupPhase.PENDING:
            release(state, group, f"node {record.node} deregistered")
    if record.registered:
        for gpu in record.gpus:
            state.journal.del_item(state.uuid_owner, gpu.uuid)
    # The registration goes (liveness, boot, lease, the UUIDs it owned); what the admin and
    # the agent said of the node stays: its cordon, drain and mark, and its boards' health,
    # which the next registration of the same boards takes up again (_record_boot). The agent
    # registers again at once (agent/store_link.py): a wiped record put a cordoned or marked
    # node with a failed GPU back in the pool.
    state.set(record, "liveness", Liveness.UNREGISTERED)
    state.set(record, "boot_id", "")
    state.set(record, "lease_expires_ms", 0)
    refresh_usable(state, record)
    schedule(state)
    note = f"node {record.node} deregistered; released {', '.join(released) or 'none'}"
    return Done(note=note + (f"; requeued {', '.join(requeued)}" if requeued else ""))


def carry_over(record: NodeRecord, index: int) -> NodeRecord:
    """A node record for a new configuration: the same node at its new topology index."""
    return replace(record, index=index, health=tuple(replace(health) for health in
                                                        record.health))
