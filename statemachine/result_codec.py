"""Replies as bytes: every result and rejection as a msgpack map, both ways.

A reply is `{"ok": false, "code": ..., "message": ...}` for a rejection, or `{"ok": true,
"type": ..., ...}` for a result. These bytes are what a session caches and what every replica
returns for the same log entry, so they are built in a fixed field order from sorted tuples.
Decoding is for clients and tests; it checks shapes like every other decoder.
"""

from __future__ import annotations

from typing import Any

from consensus.codec import pack
from consensus.validation import expect_fields, expect_int, expect_list, expect_str
from statemachine import limits
from statemachine.effects import Effect
from statemachine.errors import Code, Rejection
from statemachine.record_codec import DecodeError, Record, checked, unpack_body
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
                "downgraded": list(result.downgraded), "requeued": list(result.requeued),
                "downgraded_omitted": result.downgraded_omitted,
                "requeued_omitted": result.requeued_omitted}
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
            "why_pending": status.why_pending, "failures": list(status.failures),
            "failures_omitted": status.failures_omitted}


def effect_to_plain(effect: Effect) -> dict[str, Any]:
    return {"index": effect.index, "kind": effect.kind.value, "node": effect.node,
            "group": effect.group, "pod_uid": effect.pod_uid,
            "gpu_uuids": list(effect.gpu_uuids), "env": _env(effect.env),
            "reason": effect.reason, "command": list(effect.command)}


def decode_result(data: bytes) -> Result:
    """The reply a command got, as the client sees it; DecodeError, naming the field, when it
    is not one (a reply from a replica of another version, or a corrupted one): every nested
    field is checked, as `decode_command` checks a command's, so nothing else comes out."""
    raw = unpack_body(data, bytes_max=REPLY_BYTES_MAX, what="reply")
    if type(raw) is dict and raw.get("ok") is False:
        record = Record(raw, "reply", ("ok", "code", "message"))
        return Rejection(code=Code(record.choice("code", tuple(Code))),
                         message=_text(record, "message"))
    kind = raw.get("type") if type(raw) is dict else None
    fields = _FIELDS.get(kind, ()) if type(kind) is str else ()
    record = Record(raw, "reply", ("ok", "type", *fields))
    if not fields or not all(record.has(name) for name in fields):
        raise DecodeError(Code.MALFORMED, f"reply: not a known result ({str(kind)[:64]!r})")
    if kind == "group_status":
        return _group_status(record)
    if kind == "config_applied":
        return ConfigApplied(version=record.integer("version"),
                             downgraded=_texts(record, "downgraded"),
                             requeued=_texts(record, "requeued"),
                             downgraded_omitted=record.integer("downgraded_omitted"),
                             requeued_omitted=record.integer("requeued_omitted"))
    if kind == "node_registered":
        return NodeRegistered(
            node=_text(record, "node"), incarnation=record.integer("incarnation"),
            pods=tuple(PodAssignment(
                group=_text(pod, "group"), pod_uid=_text(pod, "pod_uid"),
                gpu_uuids=_texts(pod, "gpu_uuids"), env=_env_of(pod),
                command=_texts(pod, "command"), evicting=pod.flag("evicting"))
                for pod in record.records("pods", _ASSIGNMENT_FIELDS, length_max=_ITEMS_MAX)))
    if kind == "pod_bound":
        return PodBound(group=_text(record, "group"), member=record.integer("member"),
                        index=record.integer("index"), pod_uid=_text(record, "pod_uid"),
                        node=_text(record, "node"), gpu_uuids=_texts(record, "gpu_uuids"),
                        env=_env_of(record))
    return Done(note=_text(record, "note"))


# A reply's fields, by type. Decoding checks their types and shapes; its length caps are the
# reply's own size (REPLY_BYTES_MAX bounds everything already): the encoder's limits belong to
# the replica's version, which a client need not share.
_FIELDS = {"group_status": ("group", "vc", "phase", "priority", "effective_priority", "chain",
                            "pods", "victims", "evicting", "why_pending", "failures",
                            "failures_omitted"),
           "config_applied": ("version", "downgraded", "requeued", "downgraded_omitted",
                              "requeued_omitted"),
           "node_registered": ("node", "incarnation", "pods"),
           "pod_bound": ("group", "member", "index", "pod_uid", "node", "gpu_uuids", "env"),
           "done": ("note",)}
_ASSIGNMENT_FIELDS = ("group", "pod_uid", "gpu_uuids", "env", "command", "evicting")
_POD_VIEW_FIELDS = ("member", "index", "node", "gpu_indices", "pod_uid", "phase", "exit_code",
                    "exit_reason")
_ITEMS_MAX = REPLY_BYTES_MAX
_INT64_MIN = -(1 << 63)


def _group_status(record: Record) -> GroupStatus:
    return GroupStatus(
        group=_text(record, "group"), vc=_text(record, "vc"),
        phase=GroupPhase(record.choice("phase", tuple(GroupPhase))),
        priority=record.integer("priority", low=_INT64_MIN),
        effective_priority=record.integer("effective_priority", low=_INT64_MIN),
        chain=_text(record, "chain"),
        pods=tuple(PodView(
            member=pod.integer("member"), index=pod.integer("index"), node=_text(pod, "node"),
            gpu_indices=tuple(checked(expect_int, item, f"{pod.path}.gpu_indices[{at}]")
                              for at, item in enumerate(pod.items("gpu_indices",
                                                                  length_max=_ITEMS_MAX))),
            pod_uid=_text(pod, "pod_uid"), phase=PodPhase(pod.choice("phase", tuple(PodPhase))),
            exit_code=pod.integer("exit_code", low=_INT64_MIN),
            exit_reason=_text(pod, "exit_reason"))
            for pod in record.records("pods", _POD_VIEW_FIELDS, length_max=_ITEMS_MAX)),
        victims=_texts(record, "victims"), evicting=_text(record, "evicting"),
        why_pending=_text(record, "why_pending"), failures=_texts(record, "failures"),
        failures_omitted=record.integer("failures_omitted"))


def _text(record: Record, name: str) -> str:
    return record.text(name, length_max=REPLY_BYTES_MAX, allow_empty=True)


def _texts(record: Record, name: str) -> tuple[str, ...]:
    return tuple(_checked_text(item, f"{record.path}.{name}[{at}]")
                 for at, item in enumerate(record.items(name, length_max=_ITEMS_MAX)))


def _env_of(record: Record) -> tuple[tuple[str, str], ...]:
    """An environment: a list of [name, value] pairs."""
    env = []
    for at, pair in enumerate(record.items("env", length_max=_ITEMS_MAX)):
        path = f"{record.path}.env[{at}]"
        name, value = checked(expect_fields, checked(expect_list, pair, path, length_max=2),
                              path, count=2)
        env.append((_checked_text(name, f"{path}[0]"), _checked_text(value, f"{path}[1]")))
    return tuple(env)


def _checked_text(value: object, path: str) -> str:
    return checked(expect_str, value, path, length_max=REPLY_BYTES_MAX, allow_empty=True)


assert REPLY_BYTES_MAX > limits.COMMAND_BYTES_MAX
