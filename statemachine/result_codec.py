"""Replies as bytes: every result and rejection as a msgpack map, both ways.

A reply is `{"ok": false, "code": ..., "message": ...}` for a rejection, or `{"ok": true,
"type": ..., ...}` for a result. These bytes are what a session caches and what every replica
returns for the same log entry, so they are built in a fixed field order from sorted tuples.
Decoding is for clients and tests; it checks shapes like every other decoder.
"""

from __future__ import annotations

from typing import Any

from consensus.codec import pack
from statemachine import limits
from statemachine.effects import Effect
from statemachine.errors import Code, Rejection
from statemachine.record_codec import Record, unpack_body
from statemachine.results import (
    ConfigApplied,
    Done,
    GroupPhase,
    GroupStatus,
    NodeRegistered,
    PodAssignment,
    PodBound,
    PodPhase,
    PodView,
    Result,
)

REPLY_BYTES_MAX = 16 << 20


def encode_result(result: Result) -> bytes:
    return pack(result_to_plain(result))


def result_to_plain(result: Result) -> dict[str, Any]:
    if isinstance(result, Rejection):
        return {"ok": False, "code": result.code.value, "message": result.message}
    if isinstance(result, GroupStatus):
        body: dict[str, Any] = {"type": "group_status", **status_to_plain(result)}
    elif isinstance(result, ConfigApplied):
        body = {"type": "config_applied", "version": result.version,
                "downgraded": list(result.downgraded), "requeued": list(result.requeued)}
    elif isinstance(result, NodeRegistered):
        body = {"type": "node_registered", "node": result.node,
                "incarnation": result.incarnation,
                "pods": [{"group": pod.group, "pod_uid": pod.pod_uid,
                          "gpu_uuids": list(pod.gpu_uuids), "env": _env(pod.env),
                          "command": list(pod.command), "evicting": pod.evicting}
                         for pod in result.pods]}
    elif isinstance(result, PodBound):
        body = {"type": "pod_bound", "group": result.group, "member": result.member,
                "index": result.index, "pod_uid": result.pod_uid, "node": result.node,
                "gpu_uuids": list(result.gpu_uuids), "env": _env(result.env)}
    else:
        assert isinstance(result, Done)
        body = {"type": "done", "note": result.note}
    return {"ok": True, **body}


def _env(env: tuple[tuple[str, str], ...]) -> list[list[str]]:
    return [[name, value] for name, value in env]


def status_to_plain(status: GroupStatus) -> dict[str, Any]:
    return {"group": status.group, "vc": status.vc, "phase": status.phase.value,
            "priority": status.priority, "effective_priority": status.effective_priority,
            "chain": status.chain,
            "pods": [{"member": pod.member, "index": pod.index, "node": pod.node,
                      "gpu_indices": list(pod.gpu_indices), "pod_uid": pod.pod_uid,
                      "phase": pod.phase.value, "exit_code": pod.exit_code,
                      "exit_reason": pod.exit_reason} for pod in status.pods],
            "victims": list(status.victims), "evicting": status.evicting,
            "why_pending": status.why_pending, "failures": list(status.failures)}


def effect_to_plain(effect: Effect) -> dict[str, Any]:
    return {"index": effect.index, "kind": effect.kind.value, "node": effect.node,
            "group": effect.group, "pod_uid": effect.pod_uid,
            "gpu_uuids": list(effect.gpu_uuids), "env": _env(effect.env),
            "reason": effect.reason, "command": list(effect.command)}


def decode_result(data: bytes) -> Result:
    raw = unpack_body(data, bytes_max=REPLY_BYTES_MAX, what="reply")
    if type(raw) is dict and raw.get("ok") is False:
        record = Record(raw, "reply", ("ok", "code", "message"))
        return Rejection(code=Code(record.choice("code", tuple(Code))),
                         message=record.text("message", length_max=REPLY_BYTES_MAX))
    kind = raw.get("type") if type(raw) is dict else None
    fields = {"group_status": ("group", "vc", "phase", "priority", "effective_priority",
                               "chain", "pods", "victims", "evicting", "why_pending",
                               "failures"),
              "config_applied": ("version", "downgraded", "requeued"),
              "node_registered": ("node", "incarnation", "pods"),
              "pod_bound": ("group", "member", "index", "pod_uid", "node", "gpu_uuids", "env"),
              "done": ("note",)}.get(str(kind), ())
    record = Record(raw, "reply", ("ok", "type", *fields))
    plain = {name: record.raw[name] for name in fields if record.has(name)}
    if len(plain) != len(fields) or not fields:
        raise ValueError(f"reply: not a known result ({kind!r})")
    return _from_plain(str(kind), plain)


def _from_plain(kind: str, plain: dict[str, Any]) -> Result:
    if kind == "group_status":
        pods = tuple(PodView(member=pod["member"], index=pod["index"], node=pod["node"],
                             gpu_indices=tuple(pod["gpu_indices"]), pod_uid=pod["pod_uid"],
                             phase=PodPhase(pod["phase"]), exit_code=pod["exit_code"],
                             exit_reason=pod["exit_reason"]) for pod in plain.pop("pods"))
        return GroupStatus(**{**plain, "phase": GroupPhase(plain["phase"]), "pods": pods,
                              "victims": tuple(plain["victims"]),
                              "failures": tuple(plain["failures"])})
    if kind == "config_applied":
        return ConfigApplied(version=plain["version"], downgraded=tuple(plain["downgraded"]),
                             requeued=tuple(plain["requeued"]))
    if kind == "node_registered":
        return NodeRegistered(node=plain["node"], incarnation=plain["incarnation"], pods=tuple(
            PodAssignment(group=pod["group"], pod_uid=pod["pod_uid"],
                          gpu_uuids=tuple(pod["gpu_uuids"]),
                          env=tuple((name, value) for name, value in pod["env"]),
                          command=tuple(pod["command"]), evicting=bool(pod["evicting"]))
            for pod in plain["pods"]))
    if kind == "pod_bound":
        return PodBound(**{**plain, "gpu_uuids": tuple(plain["gpu_uuids"]),
                           "env": tuple((name, value) for name, value in plain["env"])})
    return Done(note=plain["note"])


assert REPLY_BYTES_MAX > limits.COMMAND_BYTES_MAX
