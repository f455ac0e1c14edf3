"""Gang transitions: allocate, preempt, settle, evict, downgrade, requeue, pod exits and release.

Each function takes a decided plan or event and commits it through journaled writes, keeping
three couplings intact in the same apply:

- a preemptor becomes Allocated the moment the last GPU it reserved is no longer held
  (`settle`), so completing a preemption needs no command of its own;
- a VC cell is unbound (and merges with its buddies) as soon as no guaranteed gang of that VC
  holds or reserves a GPU in it (`release_unused_bindings`);
- every decision an agent must act on is put in the outbox (start and kill pods) and every
  change a scheduler follows is announced there too.
"""

from __future__ import annotations

from collections.abc import Sequence

from statemachine.effects import EffectKind
from statemachine.groups import Group, Pod
from statemachine.limits import OPPORTUNISTIC_PRIORITY
from statemachine.results import GroupPhase, PodPhase
from statemachine.search import Plan
from statemachine.spec import FailurePolicy
from statemachine.state import State

LIVE_PHASES = (PodPhase.BOUND, PodPhase.RUNNING)


def pod_env(gpu_uuids: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """The environment a pod's process gets: its GPUs by UUID, numbered in PCI order."""
    visible = ",".join(gpu_uuids)
    return (("CUDA_DEVICE_ORDER", "PCI_BUS_ID"), ("CUDA_VISIBLE_DEVICES", visible),
            ("NVIDIA_VISIBLE_DEVICES", visible))


def pod_uuids(state: State, group: Group, index: int) -> tuple[str, ...]:
    topology = state.configured().topology
    pod = group.pods[index]
    record = state.nodes[topology.node_ids[pod.node]]
    assert record.gpus, f"pod {index} of {group.group} is on an unregistered node"
    return tuple(record.gpus[topology.gpu_index(leaf)].uuid for leaf in pod.leaves)


def _place_pods(state: State, group: Group, plan: Plan) -> list[int]:
    topology = state.configured().topology
    leaves: list[int] = []
    for pod, pod_leaves in zip(group.pods, plan.pods, strict=True):
        assert len(pod_leaves) == pod.gpus, (group.group, pod.index)
        node = topology.node_of[pod_leaves[0]]
        assert all(topology.node_of[leaf] == node for leaf in pod_leaves)
        state.set(pod, "node", node)
        state.set(pod, "leaves", tuple(pod_leaves))
        leaves.extend(pod_leaves)
    assert len(set(leaves)) == len(leaves)
    state.set(group, "chain", plan.chain)
    state.set(group, "why_pending", "")
    return leaves


def allocate(state: State, group: Group, plan: Plan) -> None:
    """Commit a plan that needs nobody to leave: bind its cells, hold its GPUs."""
    config = state.configured()
    assert group.phase is GroupPhase.PENDING and not plan.victims and not plan.cancelled
    for cell in plan.bindings:
        config.buddy.bind(cell, group.vc)
    leaves = _place_pods(state, group, plan)
    assert all(config.cells.is_free(leaf) for leaf in leaves), "placement on a busy or bad GPU"
    if group.guaranteed:
        assert all(config.buddy.vc_of_leaf(leaf) == group.vc for leaf in leaves)
    state.dequeue(group)
    config.cells.hold(leaves, group.group, group.effective_priority)
    state.set(group, "phase", GroupPhase.ALLOCATED)
    state.bump_change()
    state.outbox.emit(EffectKind.GANG_ALLOCATED, node="", group=group.group,
                      reason=f"{len(leaves)} GPUs on {config.topology.chains[plan.chain].name}")


def start_preemption(state: State, group: Group, plan: Plan) -> None:
    """Commit a plan that evicts victims: reserve its GPUs now (so no later gang can take
    them), tell the victims to leave, and wait; lower preemptors in the way are requeued."""
    config = state.configured()
    assert group.phase is GroupPhase.PENDING and group.guaranteed
    freed: list[int] = []
    for name in plan.cancelled:
        freed.extend(requeue(state, state.groups[name], f"reservation taken by {group.group}",
                             unbind=False))
    for cell in plan.bindings:
        config.buddy.bind(cell, group.vc)
    leaves = _place_pods(state, group, plan)
    for leaf in leaves:
        assert config.cells.usable[leaf] and not config.cells.reserver[leaf]
        assert config.cells.holder_priority[leaf] < group.priority
        assert config.buddy.vc_of_leaf(leaf) == group.vc
    state.dequeue(group)
    config.cells.reserve(leaves, group.group, group.effective_priority)
    release_unused_bindings(state, freed)
    state.set(group, "phase", GroupPhase.PREEMPTING)
    state.bump_change()
    state.set(group, "victims", tuple(plan.victims))
    state.set(group, "deadline_ms", state.now_ms + state.policy.preemption_grace_ms)
    state.outbox.emit(EffectKind.GANG_PREEMPTING, node="", group=group.group,
                      reason=f"victims: {', '.join(plan.victims)}")
    for name in plan.victims:
        victim = state.groups[name]
        state.set(victim, "preempted_by", tuple(sorted({*victim.preempted_by, group.group})))
    for name in plan.victims:
        evicted = state.groups.get(name)
        if evicted is not None and not evicted.evicting:
            evict(state, evicted, f"preempted by {group.group}")
    settle(state, group)


def settle(state: State, group: Group) -> None:
    """A preemptor whose reserved GPUs are all vacated takes them and is Allocated; if one of
    them can no longer be used (failed, marked bad, its node not up), it goes back to the
    queue instead."""
    if group.phase is not GroupPhase.PREEMPTING:
        return
    cells = state.configured().cells
    leaves = group.leaves()
    if any(cells.holder[leaf] for leaf in leaves):
        return
    if not all(cells.usable[leaf] for leaf in leaves):
        requeue(state, group, "a GPU it had reserved can no longer be used")
        return
    cells.unreserve(leaves)
    cells.hold(leaves, group.group, group.effective_priority)
    state.set(group, "phase", GroupPhase.ALLOCATED)
    state.set(group, "victims", ())
    state.set(group, "deadline_ms", 0)
    state.outbox.emit(EffectKind.GANG_ALLOCATED, node="", group=group.group,
                      reason="preemption complete")


def _drop_reservation(state: State, group: Group) -> list[int]:
    assert group.phase is GroupPhase.PREEMPTING
    leaves = group.leaves()
    state.configured().cells.unreserve(leaves)
    for name in group.victims:
        victim = state.groups.get(name)
        if victim is not None:
            state.set(victim, "preempted_by",
                      tuple(other for other in victim.preempted_by if other != group.group))
    for pod in group.pods:
        state.set(pod, "node", -1)
        state.set(pod, "leaves", ())
    state.set(group, "chain", -1)
    state.set(group, "victims", ())
    state.set(group, "deadline_ms", 0)
    return leaves


def requeue(state: State, group: Group, reason: str, *, unbind: bool = True) -> list[int]:
    """Cancel a preemptor: drop its reservations and send it back to the queue. Kills already
    sent to its victims stand. Returns the GPUs it had reserved."""
    leaves = _drop_reservation(state, group)
    state.set(group, "phase", GroupPhase.PENDING)
    state.set(group, "why_pending", reason)
    state.set(group, "attempt_epoch", -1)
    state.set(group, "preempt_epoch", -1)
    state.enqueue(group)
    state.outbox.emit(EffectKind.GANG_REQUEUED, node="", group=group.group, reason=reason)
    if unbind:
        release_unused_bindings(state, leaves)
    state.bump_capacity()  # the GPUs it reserved and nobody held are free again
    return leaves


def evict(state: State, group: Group, reason: str) -> None:
    """Tell a gang to leave: kill its live pods; with none live, release it now."""
    assert group.phase is GroupPhase.ALLOCATED
    state.set(group, "evicting", reason)
    _kill_live_pods(state, group, reason)
    if not any(pod.phase in LIVE_PHASES for pod in group.pods):
        release(state, group, reason)


def _kill_live_pods(state: State, group: Group, reason: str) -> None:
    for pod in group.pods:
        if pod.phase in LIVE_PHASES:
            kill_pod(state, group, pod, reason)


def kill_pod(state: State, group: Group, pod: Pod, reason: str) -> None:
    """Tell the pod's node to stop it (an effect: the agent reports the exit)."""
    state.outbox.emit(EffectKind.KILL_POD, node=state.configured().topology.node_ids[pod.node],
                      group=group.group, pod_uid=pod.pod_uid, reason=reason)


def resend_kills(state: State, group: Group) -> None:
    _kill_live_pods(state, group, group.evicting)


def pod_exited(state: State, group: Group, pod: Pod, exit_code: int, reason: str) -> None:
    """A pod's first exit report: record and announce it, then evict the gang if the pod
    failed and the gang's pod failure policy says so, or release it if it is done."""
    assert pod.phase is not PodPhase.EXITED
    state.set(pod, "phase", PodPhase.EXITED)
    state.set(pod, "exit_code", exit_code)
    state.set(pod, "exit_reason", reason)
    outcome = _exit_outcome(exit_code, reason)
    if group.on_pod_failure is not None:  # None: submitted before exits were announced
        state.outbox.emit(EffectKind.POD_EXITED, node="", group=group.group,
                          pod_uid=pod.pod_uid, reason=outcome)
    if _fails_gang(group, exit_code):
        evict(state, group, f"pod {pod.pod_uid} failed with {outcome}")
    else:
        finish_if_done(state, group)


def _exit_outcome(exit_code: int, reason: str) -> str:
    return f"exit code {exit_code}" + (f": {reason}" if reason else "")


def _fails_gang(group: Group, exit_code: int) -> bool:
    """Whether a pod's exit with `exit_code` evicts its gang: it failed (a lost pod's code is
    not 0 either) while the gang ran, told to leave by nobody, under policy RELEASE. A pod of
    a gang already leaving (a victim's pod killed, 137 or 143) keeps the eviction's reason."""
    return (exit_code != 0 and group.phase is GroupPhase.ALLOCATED and not group.evicting
            and group.on_pod_failure is FailurePolicy.RELEASE)


def finish_if_done(state: State, group: Group) -> None:
    """After a pod exit: an evicted gang with no live pod, or a gang whose pods all exited,
    is released."""
    if group.phase is not GroupPhase.ALLOCATED:
        return
    if group.evicting and not any(pod.phase in LIVE_PHASES for pod in group.pods):
        release(state, group, group.evicting)
    elif all(pod.phase is PodPhase.EXITED for pod in group.pods):
        release(state, group, "all pods exited")


def release(state: State, group: Group, reason: str) -> None:
    """Remove a gang in any phase, free or unreserve its GPUs, merge cells it no longer needs,
    and let the preemptors waiting on it take their GPUs."""
    config = state.configured()
    leaves = group.leaves()
    if group.phase is GroupPhase.PENDING:
        state.dequeue(group)
    elif group.phase is GroupPhase.PREEMPTING:
        _drop_reservation(state, group)
    else:
        _kill_live_pods(state, group, reason)
        config.cells.unhold(leaves)
    release_unused_bindings(state, leaves)
    waiting = group.preempted_by
    state.journal.del_item(state.groups, group.group)
    state.outbox.emit(EffectKind.GANG_RELEASED, node="", group=group.group, reason=reason)
    state.bump_capacity()
    for name in waiting:
        preemptor = state.groups.get(name)
        if preemptor is not None:
            # Forget the victim by name: a later gang may take the same id.
            state.set(preemptor, "victims",
                      tuple(victim for victim in preemptor.victims if victim != group.group))
            settle(state, preemptor)


def downgrade(state: State, group: Group, preemptor: str) -> None:
    """Lazy preemption: the gang keeps running but as opportunistic, off its VC's quota."""
    assert group.guaranteed and group.phase is GroupPhase.ALLOCATED
    leaves = group.leaves()
    state.set(group, "effective_priority", OPPORTUNISTIC_PRIORITY)
    state.set(group, "downgraded", f"lazily preempted by {preemptor}")
    state.configured().cells.set_holder_priority(leaves, OPPORTUNISTIC_PRIORITY)
    release_unused_bindings(state, leaves)
    state.outbox.emit(EffectKind.GANG_DOWNGRADED, node="", group=group.group,
                      reason=group.downgraded)
    state.bump_capacity()


def release_unused_bindings(state: State, leaves: Sequence[int]) -> None:
    """Unbind every VC cell over `leaves` that no guaranteed gang of its VC uses any more."""
    config = state.configured()
    buddy, cells, topology = config.buddy, config.cells, config.topology
    roots = sorted({buddy.bound_root[leaf] for leaf in leaves} - {-1})
    for root in roots:
        vc = buddy.bound_vc[root]
        in_use = False
        for leaf in topology.leaves(root):
            for name in (cells.holder[leaf], cells.reserver[leaf]):
                user = state.groups.get(name) if name else None
                if user is not None and user.vc == vc and user.guaranteed:
                    in_use = True
                    break
            if in_use:
                break
        if not in_use:
            buddy.unbind(root)


def _gpu_name(state: State, leaf: int) -> str:
    """The GPU at a leaf as a gang's failures name it: its UUID (node/index if unknown)."""
    topology = state.configured().topology
    record = state.nodes[topology.node_ids[topology.node_of[leaf]]]
    index = topology.gpu_index(leaf)
    return record.gpus[index].uuid if record.gpus else f"{record.node}/{index}"


def latest_failures(state: State, group: Group, new: Sequence[tuple[str, str]]
                    ) -> tuple[tuple[str, str], ...]:
    """A gang's failures with `new` (GPU, why) ones added: the latest of each GPU, and only
    GPUs now under the gang. So the list is never longer than the gang's GPUs: a GPU that
    fails again and again adds nothing, and one no longer under the gang (a board replaced
    under a new UUID, a gang placed again elsewhere) is dropped at the next failure."""
    under = {_gpu_name(state, leaf) for leaf in group.leaves()}
    by_gpu = {gpu: why for gpu, why in (*group.failures, *new) if gpu in under}
    return tuple(sorted(by_gpu.items()))


def hardware_failed(state: State, leaves: Sequence[int]) -> None:
    """GPUs under gangs failed (a fail report, an admin mark, a Down node): record it on each
    gang, announce it, and release the gang if its VC's policy says so."""
    config = state.configured()
    topology, cells = config.topology, config.cells
    touched: dict[str, list[tuple[str, str]]] = {}
    for leaf in leaves:
        record = state.nodes[topology.node_ids[topology.node_of[leaf]]]
        why = record.failing(topology.gpu_index(leaf))
        for name in (cells.holder[leaf], cells.reserver[leaf]):
            if name and why:
                touched.setdefault(name, []).append((_gpu_name(state, leaf), why))
    for name in sorted(touched):
        group = state.groups.get(name)
        if group is None:
            continue
        state.set(group, "failures", latest_failures(state, group, touched[name]))
        state.outbox.emit(EffectKind.GANG_FAILURE, node="", group=name, reason="; ".join(
            sorted({f"{gpu}: {why}" for gpu, why in touched[name]})))
        if group.phase is GroupPhase.PREEMPTING:
            # It only reserved the GPU and never ran there: back to the queue, whatever the
            # tenant's policy (as on a drain or a forced deregistration).
            requeue(state, group, "a GPU it had reserved failed")
        elif (group.phase is GroupPhase.ALLOCATED
              and config.failure_policy.get(group.vc) is FailurePolicy.RELEASE):
            release(state, group, "hardware failed")
