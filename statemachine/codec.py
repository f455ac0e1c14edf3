"""Command bodies as bytes: msgpack maps with a schema version, checked field by field.

A command body is a msgpack map `{"v": 1, "type": "submit_group", ...fields}`. Decoding refuses
with a code and a message naming the field (see `record_codec`): TOO_LARGE for a body over the
cap, MALFORMED for anything that is not a valid command (a schema version that is not an
integer included), UNKNOWN_COMMAND for an unknown type, UNSUPPORTED_VERSION for another schema
version.
Unknown fields are refused, not ignored, so a newer client cannot be half understood.

msgpack itself is reached through `consensus.codec` (pack with bin types, unpack with size caps,
string keys only); this module and the other `*_codec` modules only shape values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from consensus.codec import pack
from consensus.validation import expect_str
from statemachine import limits
from statemachine.commands import (
    AckPodStarted,
    ApplyConfig,
    BindPod,
    ClearBad,
    Command,
    Cordon,
    Deregister,
    Drain,
    GpuInventory,
    GpuLink,
    HealthReport,
    HealthStatus,
    Heartbeat,
    MarkBad,
    Member,
    RegisterNode,
    ReleaseGroup,
    ReportHealth,
    ReportPodExit,
    SubmitGroup,
    Tick,
    Uncordon,
)
from statemachine.errors import Code
from statemachine.record_codec import DecodeError, Record, checked, open_body, pod_command
from statemachine.rules import RULES_BEFORE_VERSIONS
from statemachine.spec import FailurePolicy
from statemachine.spec_codec import SPEC_FIELDS, decode_spec, encode_spec

# A submission from before gangs had a pod failure policy (a client of then, an entry of a log
# written then) is read as it was applied then: a failed pod left its gang running, and no exit
# was announced. Read as RELEASE, a log replayed from before a format-5 snapshot would diverge
# from that snapshot, whose gangs restore so too (statemachine/snapshot_codec.py); read as
# KEEP, its exit reports would put out POD_EXITED effects the build of then did not, and the
# replayed outbox would be numbered differently from the snapshot's.
POD_FAILURE_POLICY_ABSENT = None


def decode_command(data: bytes, *, exact_version: bool = True) -> Command:
    """Bytes to a command, or `DecodeError` with the rejection to reply with. Not
    `exact_version`: a schema version of `true` or `1.0` reads as 1, as under the rules before
    `rules.EXACT_SCHEMA_VERSION` (the machine says which rules are in force)."""
    kind, raw = open_body(data, bytes_max=limits.COMMAND_BYTES_MAX, what="command",
                          types=tuple(COMMANDS), exact_version=exact_version)
    fields, decode, _ = COMMANDS[kind]
    command: Command = decode(Record(raw, kind, ("v", "type", *fields)))
    return command


def encode_command(command: Command) -> bytes:
    kind = NAMES[type(command)]
    _, _, encode = COMMANDS[kind]
    return pack({"v": limits.SCHEMA_VERSION, "type": kind, **encode(command)})


# One entry per command: fields, decoder, encoder.

_NODE_FIELDS = ("node", "incarnation")


INVENTORY_FIELDS = ("uuid", "index", "pci_bus_id", "model", "memory_mib", "numa_node",
                    "mig_enabled")
LINK_FIELDS = ("a", "b", "level", "nvlinks")
REPORT_FIELDS = ("uuid", "status", "reason")


def decode_inventory(raw: object, path: str) -> GpuInventory:
    """One GPU's registration fields, checked as a RegisterNode's are, from a map that may
    carry others (a node query's answer, which a node agent reads back)."""
    if type(raw) is not dict:
        raise DecodeError(Code.MALFORMED, f"{path}: expected a map")
    return _inventory(Record({name: raw[name] for name in INVENTORY_FIELDS if name in raw},
                             path, INVENTORY_FIELDS))


def _inventory(record: Record) -> GpuInventory:
    return GpuInventory(uuid=record.text("uuid", length_max=limits.UUID_LENGTH_MAX),
                        index=record.integer("index", high=limits.GPUS_PER_NODE_MAX - 1),
                        pci_bus_id=record.text("pci_bus_id",
                                               length_max=limits.PCI_BUS_ID_LENGTH_MAX),
                        model=record.text("model"),
                        memory_mib=record.integer("memory_mib"),
                        numa_node=record.integer("numa_node", low=-1,
                                                 high=limits.NUMA_NODE_MAX)
                        if record.has("numa_node") else -1,
                        mig_enabled=record.flag("mig_enabled") if record.has("mig_enabled")
                        else False)


def _link(record: Record) -> GpuLink:
    last = limits.GPUS_PER_NODE_MAX - 1
    return GpuLink(a=record.integer("a", high=last), b=record.integer("b", high=last),
                   level=record.integer("level", high=limits.TOPOLOGY_LEVEL_MAX),
                   nvlinks=record.integer("nvlinks", high=limits.NVLINKS_PER_PAIR_MAX))


def _register(record: Record) -> RegisterNode:
    gpus = record.records("gpus", INVENTORY_FIELDS, length_max=limits.GPUS_PER_NODE_MAX)
    links = record.records("links", LINK_FIELDS, length_max=limits.GPU_LINKS_MAX) \
        if record.has("links") else []
    health = record.records("health", REPORT_FIELDS, length_max=limits.HEALTH_REPORTS_MAX) \
        if record.has("health") else []
    return RegisterNode(node=record.text("node"), boot_id=record.text("boot_id"),
                        gpus=tuple(_inventory(gpu) for gpu in gpus),
                        links=tuple(_link(link) for link in links),
                        health=tuple(_report(report) for report in health))


def _encode_reports(reports: tuple[HealthReport, ...]) -> list[dict[str, Any]]:
    return [{"uuid": report.uuid, "status": report.status.value, "reason": report.reason}
            for report in reports]


def _encode_register(command: RegisterNode) -> dict[str, Any]:
    body: dict[str, Any] = {"node": command.node, "boot_id": command.boot_id, "gpus": [
        {"uuid": gpu.uuid, "index": gpu.index, "pci_bus_id": gpu.pci_bus_id,
         "model": gpu.model, "memory_mib": gpu.memory_mib, "numa_node": gpu.numa_node,
         "mig_enabled": gpu.mig_enabled} for gpu in command.gpus],
        "links": [{"a": link.a, "b": link.b, "level": link.level, "nvlinks": link.nvlinks}
                  for link in command.links]}
    if command.health:  # optional: a registration without it encodes as before it existed
        body["health"] = _encode_reports(command.health)
    return body


def _report(record: Record) -> HealthReport:
    return HealthReport(uuid=record.text("uuid", length_max=limits.UUID_LENGTH_MAX),
                        status=HealthStatus(record.choice("status", tuple(HealthStatus))),
                        reason=record.text("reason", length_max=limits.REASON_LENGTH_MAX,
                                           allow_empty=True))


def _health(record: Record) -> ReportHealth:
    reports = record.records("reports", REPORT_FIELDS, length_max=limits.HEALTH_REPORTS_MAX)
    return ReportHealth(node=record.text("node"), incarnation=record.integer("incarnation"),
                        reports=tuple(_report(report) for report in reports))


def _submit(record: Record) -> SubmitGroup:
    members = record.records("members", ("pods", "gpus"), length_max=limits.MEMBERS_MAX)
    return SubmitGroup(
        group=record.text("group"), vc=record.text("vc"),
        priority=record.integer("priority", low=limits.OPPORTUNISTIC_PRIORITY,
                                high=limits.PRIORITY_MAX),
        members=tuple(Member(pods=member.integer("pods", low=1,
                                                 high=limits.PODS_PER_MEMBER_MAX),
                             gpus=member.integer("gpus", low=1, high=limits.GPUS_PER_NODE_MAX))
                      for member in members),
        gpu_model=record.text("gpu_model", allow_empty=True),
        lazy_preemption=record.flag("lazy_preemption"),
        on_pod_failure=FailurePolicy(record.choice("on_pod_failure", tuple(FailurePolicy)))
        if record.has("on_pod_failure") else POD_FAILURE_POLICY_ABSENT)


def _apply_config(record: Record) -> ApplyConfig:
    return ApplyConfig(expected_version=record.integer("expected_version"),
                       spec=decode_spec(record.record("spec", SPEC_FIELDS)))


def _encode_apply_config(command: ApplyConfig) -> dict[str, Any]:
    return {"expected_version": command.expected_version, "spec": encode_spec(command.spec)}


def _reason(record: Record) -> str:
    return record.text("reason", length_max=limits.REASON_LENGTH_MAX, allow_empty=True)


def _bind(record: Record) -> BindPod:
    return BindPod(group=record.text("group"),
                   member=record.integer("member", high=limits.MEMBERS_MAX - 1),
                   pod_uid=record.text("pod_uid"), command=pod_command(record))


def _pod_exit(record: Record) -> ReportPodExit:
    return ReportPodExit(
        node=record.text("node"), incarnation=record.integer("incarnation"),
        group=record.text("group"), pod_uid=record.text("pod_uid"),
        exit_code=record.integer("exit_code", low=-(1 << 31), high=(1 << 31) - 1),
        reason=_reason(record) if record.has("reason") else "")


COMMANDS: dict[str, tuple[tuple[str, ...], Callable[[Record], Any], Callable[[Any],
                                                                             dict[str, Any]]]] = {
    "apply_config": (("expected_version", "spec"), _apply_config, _encode_apply_config),
    "register_node": (("node", "boot_id", "gpus", "links", "health"), _register, _encode_register),
    "heartbeat": (
        _NODE_FIELDS,
        lambda record: Heartbeat(node=record.text("node"),
                                 incarnation=record.integer("incarnation")),
        lambda command: {"node": command.node, "incarnation": command.incarnation}),
    "report_health": (
        (*_NODE_FIELDS, "reports"), _health,
        lambda command: {"node": command.node, "incarnation": command.incarnation,
                         "reports": _encode_reports(command.reports)}),
    "ack_pod_started": (
        (*_NODE_FIELDS, "group", "pod_uid", "gpu_uuids"),
        lambda record: AckPodStarted(
            node=record.text("node"), incarnation=record.integer("incarnation"),
            group=record.text("group"), pod_uid=record.text("pod_uid"),
            gpu_uuids=tuple(checked(expect_str, uuid, f"{record.path}.gpu_uuids[{index}]",
                                     length_max=limits.UUID_LENGTH_MAX, allow_empty=False)
                            for index, uuid in enumerate(record.items(
                                "gpu_uuids", length_max=limits.GPUS_PER_NODE_MAX)))),
        lambda command: {"node": command.node, "incarnation": command.incarnation,
                         "group": command.group, "pod_uid": command.pod_uid,
                         "gpu_uuids": list(command.gpu_uuids)}),
    "report_pod_exit": (
        (*_NODE_FIELDS, "group", "pod_uid", "exit_code", "reason"), _pod_exit,
        lambda command: {"node": command.node, "incarnation": command.incarnation,
                         "group": command.group, "pod_uid": command.pod_uid,
                         "exit_code": command.exit_code, "reason": command.reason}),
    "mark_bad": (
        ("node", "gpu", "reason"),
        lambda record: MarkBad(node=record.text("node"),
                               gpu=record.text("gpu", length_max=limits.UUID_LENGTH_MAX,
                                               allow_empty=True),
                               reason=record.text("reason", length_max=limits.REASON_LENGTH_MAX)),
        lambda command: {"node": command.node, "gpu": command.gpu, "reason": command.reason}),
    "clear_bad": (
        ("node", "gpu"),
        lambda record: ClearBad(node=record.text("node"),
                                gpu=record.text("gpu", length_max=limits.UUID_LENGTH_MAX,
                                                allow_empty=True)),
        lambda command: {"node": command.node, "gpu": command.gpu}),
    "cordon": (("node",), lambda record: Cordon(node=record.text("node")),
               lambda command: {"node": command.node}),
    "uncordon": (("node",), lambda record: Uncordon(node=record.text("node")),
                 lambda command: {"node": command.node}),
    "drain": (("node",), lambda record: Drain(node=record.text("node")),
              lambda command: {"node": command.node}),
    "deregister": (
        ("node", "force"),
        lambda record: Deregister(node=record.text("node"), force=record.flag("force")),
        lambda command: {"node": command.node, "force": command.force}),
    "submit_group": (
        ("group", "vc", "priority", "members", "gpu_model", "lazy_preemption",
         "on_pod_failure"), _submit,
        lambda command: {"group": command.group, "vc": command.vc,
                         "priority": command.priority,
                         "members": [{"pods": member.pods, "gpus": member.gpus}
                                     for member in command.members],
                         "gpu_model": command.gpu_model,
                         "lazy_preemption": command.lazy_preemption,
                         **({} if command.on_pod_failure is None else
                            {"on_pod_failure": command.on_pod_failure.value})}),
    "bind_pod": (
        ("group", "member", "pod_uid", "command"), _bind,
        lambda command: {"group": command.group, "member": command.member,
                         "pod_uid": command.pod_uid, "command": list(command.command)}),
    "release_group": (
        ("group", "reason"),
        lambda record: ReleaseGroup(group=record.text("group"), reason=_reason(record)),
        lambda command: {"group": command.group, "reason": command.reason}),
    "tick": (("rules",), lambda record: Tick(
        rules=record.integer("rules", high=limits.RULES_VERSION_MAX) if record.has("rules")
        else RULES_BEFORE_VERSIONS),
        lambda command: {"rules": command.rules} if command.rules else {}),
}

NAMES: dict[type[Any], str] = {
    ApplyConfig: "apply_config", RegisterNode: "register_node", Heartbeat: "heartbeat",
    ReportHealth: "report_health", AckPodStarted: "ack_pod_started",
    ReportPodExit: "report_pod_exit", MarkBad: "mark_bad", ClearBad: "clear_bad",
    Cordon: "cordon", Uncordon: "uncordon", Drain: "drain", Deregister: "deregister",
    SubmitGroup: "submit_group", BindPod: "bind_pod", ReleaseGroup: "release_group",
    Tick: "tick",
}
assert sorted(NAMES.values()) == sorted(COMMANDS)
