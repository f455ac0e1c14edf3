"""Snapshots: the whole replicated state as canonical bytes, and back.

Only primary state is written (see `state`): the configuration, logical time and counters, the
nodes, the VC bindings, the gangs, the outbox, the sessions, where the next Tick's scheduling
pass starts and the latest Tick's stamp, every collection sorted by its key and every record a
fixed-order array. Equal states therefore give equal bytes, in any process and under any
PYTHONHASHSEED, and the digest is the SHA-256 of those bytes. Restoring decodes the primary
state and recomputes the derived state (cell counters, free lists, queue) exactly as the
invariant checker does.
"""

from __future__ import annotations

import hashlib
from typing import Any

from consensus.codec import pack, unpack
from statemachine.codec import POD_FAILURE_POLICY_ABSENT
from statemachine.commands import GpuInventory, GpuLink, HealthStatus, Member
from statemachine.config_check import check_spec
from statemachine.groups import Group, Pod
from statemachine.nodes import GpuHealth, Liveness, NodeRecord
from statemachine.record_codec import Record
from statemachine.results import GroupPhase, PodPhase
from statemachine.rules import RULES_BEFORE_VERSIONS
from statemachine.sessions import NO_CHECKSUM, Session, Sessions
from statemachine.spec import FailurePolicy
from statemachine.spec_codec import SPEC_FIELDS, decode_spec, encode_spec
from statemachine.state import (
    Configured,
    State,
    bindings_of,
    derive,
    derive_queue,
    derive_uuid_owner,
)

SNAPSHOT_TAG = "cellar-statemachine-snapshot"
SNAPSHOT_FORMAT = 7  # 3: a gang's failures are (GPU, why) pairs; 4: sessions' checksums;
# 5: where the next Tick's scheduling pass starts, and the latest Tick's stamp; 6: a gang's
# pod failure policy, after its pods; 7: the rules version (statemachine/rules.py)
SNAPSHOT_FORMATS_READ = (2, 3, 4, 5, 6, 7)  # 2: a gang's failures were "GPU: why" lines
SCHEDULE_RESUME_SINCE = 5  # the format that added both (None when read from an older one)
RULES_VERSION_SINCE = 7  # older formats: the rules before versions


def _later_fields(version: int) -> int:
    """How many fields follow the sessions in a snapshot of format `version`."""
    if version < SCHEDULE_RESUME_SINCE:
        return 0
    return 2 if version < RULES_VERSION_SINCE else 3
POD_FAILURE_POLICY_SINCE = 6  # older formats' gangs: submitted before the policy (codec.py)
SNAPSHOT_BYTES_MAX = 1 << 30


def encode_snapshot(state: State, sessions: Sessions, applied_index: int) -> bytes:
    config = state.config
    return pack([
        SNAPSHOT_TAG, SNAPSHOT_FORMAT, applied_index, state.now_ms, state.next_submit,
        state.capacity_epoch, state.change_epoch,
        None if config is None else [config.version, encode_spec(config.spec)],
        [_node(state.nodes[name]) for name in sorted(state.nodes)],
        [] if config is None else [[cell, vc] for cell, vc in bindings_of(config.buddy)],
        [_group(state.groups[name]) for name in sorted(state.groups)],
        [state.outbox.first_index, state.outbox.nodes, state.outbox.packed],
        [[key, session.last_sequence, session.expires_ms, session.reply, session.checksum]
         for key, session in sorted(sessions.table.items())],
        None if state.schedule_resume is None else list(state.schedule_resume),
        state.tick_ms,
        state.rules_version,
    ])


def digest_of(snapshot: bytes) -> bytes:
    return hashlib.sha256(snapshot).digest()


def _node(record: NodeRecord) -> list[Any]:
    return [record.node, record.index, record.liveness.value, record.boot_id,
            record.incarnation, record.lease_expires_ms, record.cordoned, record.draining,
            record.admin_bad,
            [[gpu.uuid, gpu.index, gpu.pci_bus_id, gpu.model, gpu.memory_mib, gpu.numa_node,
              gpu.mig_enabled] for gpu in record.gpus],
            [[health.status.value, health.reason, health.since_ms, health.failed,
              health.passes, health.admin_bad] for health in record.health],
            [[link.a, link.b, link.level, link.nvlinks] for link in record.links]]


def _group(group: Group) -> list[Any]:
    return [group.group, group.vc, group.priority, group.effective_priority,
            group.lazy_preemption, group.gpu_model,
            [[member.pods, member.gpus] for member in group.members],
            group.submit_index, group.submitted_ms, group.phase.value, group.chain,
            list(group.victims), group.deadline_ms, list(group.preempted_by), group.evicting,
            group.downgraded, [[gpu, why] for gpu, why in group.failures],
            group.why_pending, group.attempt_epoch,
            group.preempt_epoch,
            [[pod.member, pod.index, pod.gpus, pod.node, list(pod.leaves), pod.pod_uid,
              list(pod.command), pod.phase.value, pod.exit_code, pod.exit_reason]
             for pod in group.pods],
            None if group.on_pod_failure is None else group.on_pod_failure.value]


def decode_snapshot(data: bytes) -> tuple[State, Sessions, int]:
    """Bytes from `encode_snapshot` to a state with its derived parts rebuilt. Snapshots come
    from replicas, not clients: a malformed one is a corrupt data directory, and fails loudly."""
    raw = unpack(data, bytes_max=SNAPSHOT_BYTES_MAX, what="snapshot")
    (tag, version, applied_index, now_ms, next_submit, capacity_epoch, change_epoch, config,
     nodes, bindings, groups, outbox, sessions, *later) = raw
    if tag != SNAPSHOT_TAG or version not in SNAPSHOT_FORMATS_READ:
        raise ValueError(f"not a Cellar snapshot of format {SNAPSHOT_FORMATS_READ}: {tag!r} "
                         f"{version!r}")
    if len(later) != _later_fields(version):
        raise ValueError(f"a snapshot of format {version} with {len(raw)} fields")
    state = State()
    state.now_ms, state.next_submit = now_ms, next_submit
    state.capacity_epoch, state.change_epoch = capacity_epoch, change_epoch
    resume, state.tick_ms = later[:2] if later else (None, None)  # none before format 5
    state.rules_version = later[2] if len(later) > 2 else RULES_BEFORE_VERSIONS  # before 7
    if type(state.rules_version) is not int or state.rules_version < 0:
        raise ValueError(f"a snapshot's rules version {state.rules_version!r}")
    if resume is not None:
        priority, submit_index, group = resume
        state.schedule_resume = (priority, submit_index, group)
    state.nodes = {fields[0]: _load_node(fields) for fields in nodes}
    state.groups = {fields[0]: _load_group(fields, version) for fields in groups}
    if config is not None:
        spec = decode_spec(Record(config[1], "snapshot.spec", SPEC_FIELDS))
        state.config = Configured(spec, config[0], check_spec(spec), state.journal)
        state.config.cells, state.config.buddy = derive(
            state.config, state.nodes, state.groups,
            [(cell, vc) for cell, vc in bindings], state.journal)
    state.queue.keys = derive_queue(state.groups)
    state.uuid_owner = derive_uuid_owner(state.nodes)
    state.outbox.first_index = outbox[0]
    for node, packed in zip(outbox[1], outbox[2], strict=True):
        state.outbox.load(node, packed)
    table = Sessions()
    for key, last_sequence, expires_ms, reply, *checksum in sessions:  # none before format 4
        table.load(key, Session(last_sequence=last_sequence, reply=reply, expires_ms=expires_ms,
                                checksum=checksum[0] if checksum else NO_CHECKSUM))
    return state, table, applied_index


def _load_node(fields: list[Any]) -> NodeRecord:
    (node, index, liveness, boot_id, incarnation, lease, cordoned, draining, admin_bad,
     gpus, health, links) = fields
    return NodeRecord(
        node=node, index=index, liveness=Liveness(liveness), boot_id=boot_id,
        incarnation=incarnation, lease_expires_ms=lease, cordoned=cordoned, draining=draining,
        admin_bad=admin_bad,
        gpus=tuple(GpuInventory(uuid=uuid, index=gpu_index, pci_bus_id=pci, model=model,
                                memory_mib=memory, numa_node=numa, mig_enabled=mig)
                   for uuid, gpu_index, pci, model, memory, numa, mig in gpus),
        links=tuple(GpuLink(a=a, b=b, level=level, nvlinks=nvlinks)
                    for a, b, level, nvlinks in links),
        health=tuple(GpuHealth(status=HealthStatus(status), reason=reason, since_ms=since,
                               failed=failed, passes=passes, admin_bad=bad)
                     for status, reason, since, failed, passes, bad in health))


def _load_group(fields: list[Any], version: int) -> Group:
    (group, vc, priority, effective, lazy, model, members, submit_index, submitted_ms, phase,
     chain, victims, deadline, preempted_by, evicting, downgraded, failures, why_pending,
     attempt_epoch, preempt_epoch, pods, *later) = fields
    if len(later) != (1 if version >= POD_FAILURE_POLICY_SINCE else 0):
        raise ValueError(f"gang {group!r} of a snapshot of format {version} has "
                         f"{len(fields)} fields")
    return Group(
        group=group, vc=vc, priority=priority, effective_priority=effective,
        lazy_preemption=lazy, gpu_model=model,
        on_pod_failure=FailurePolicy(later[0]) if later and later[0] is not None
        else POD_FAILURE_POLICY_ABSENT,
        members=tuple(Member(pods=count, gpus=gpus) for count, gpus in members),
        submit_index=submit_index, submitted_ms=submitted_ms, phase=GroupPhase(phase),
        chain=chain, victims=tuple(victims), deadline_ms=deadline,
        preempted_by=tuple(preempted_by), evicting=evicting, downgraded=downgraded,
        failures=_load_failures(failures, version), why_pending=why_pending,
        attempt_epoch=attempt_epoch,
        preempt_epoch=preempt_epoch,
        pods=tuple(Pod(member=member, index=index, gpus=gpus, node=node, leaves=tuple(leaves),
                       pod_uid=uid, command=tuple(command), phase=PodPhase(pod_phase),
                       exit_code=exit_code, exit_reason=exit_reason)
                   for member, index, gpus, node, leaves, uid, command, pod_phase, exit_code,
                   exit_reason in pods))


def _load_failures(failures: list[Any], version: int) -> tuple[tuple[str, str], ...]:
    """A gang's (GPU, why) pairs; format 2 held them as "GPU: why" lines (the UUIDs NVML gives
    hold no ": ", so the first one splits them)."""
    if version == 2:
        return tuple((gpu, why) for gpu, _, why in (line.partition(": ") for line in failures))
    return tuple((gpu, why) for gpu, why in failures)
