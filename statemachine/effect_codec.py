"""One effect as compact bytes: the outbox keeps its effects packed, so that a snapshot of a
full outbox (tens of thousands of effects) is a list of byte strings, cheap to write and read,
and an effect is unpacked only when someone asks for it.

`decode_effect` reads an effect as an effects query answers it (a plain map,
`result_codec.effect_to_plain`) back into a typed `Effect` for a client that acts on it (a node
agent), checking every field's type and size as the command decoders do, and raising
`DecodeError` naming the field otherwise: `UnknownEffectKind` for a kind this build does not
know (a newer replica's), which a client skips rather than refuses as broken.
"""

from __future__ import annotations

from typing import Any

from consensus.codec import pack, unpack
from consensus.validation import expect_fields, expect_list, expect_str
from statemachine import limits
from statemachine.effects import Effect, EffectKind
from statemachine.errors import Code
from statemachine.record_codec import DecodeError, Record, checked, pod_command

# The most a packed effect can take. A START_POD names its pod's GPUs three times (the list and
# the two *_VISIBLE_DEVICES variables, statemachine/lifecycle.py: pod_env) and carries its
# argv; limits count characters, each up to 4 UTF-8 bytes, and a string's header is at most 3
# bytes below 64 KiB (5 above). 64 KiB was short of a 64-GPU pod with long UUIDs: the effect
# was kept but could never be unpacked, so no effects page could get past it.
_CHAR_BYTES = 4
_UUID_BYTES = limits.UUID_LENGTH_MAX * _CHAR_BYTES
_VISIBLE_BYTES = limits.GPUS_PER_NODE_MAX * (_UUID_BYTES + 1) + 5  # "uuid,uuid,..."
EFFECT_WORST_BYTES = (
    64  # the array, its index and kind
    + 3 * (limits.NAME_LENGTH_MAX * _CHAR_BYTES + 3)  # node, group, pod uid
    + 3 + limits.GPUS_PER_NODE_MAX * (_UUID_BYTES + 3)  # gpu_uuids
    + 64 + 2 * _VISIBLE_BYTES  # env: three pairs, two of them the UUIDs joined
    + limits.EFFECT_REASON_LENGTH_MAX * _CHAR_BYTES + 3  # reason
    + 3 + limits.POD_COMMAND_BYTES_MAX + limits.POD_COMMAND_ARGS_MAX * 5)  # command
EFFECT_BYTES_MAX = 1 << 17
assert EFFECT_WORST_BYTES <= EFFECT_BYTES_MAX, EFFECT_WORST_BYTES


def pack_effect(effect: Effect) -> bytes:
    return pack([effect.index, effect.kind.value, effect.node, effect.group, effect.pod_uid,
                 list(effect.gpu_uuids), [[name, value] for name, value in effect.env],
                 effect.reason, list(effect.command)])


def unpack_effect(data: bytes) -> Effect:
    index, kind, node, group, pod_uid, uuids, env, reason, command = unpack(
        data, bytes_max=EFFECT_BYTES_MAX, what="effect")
    return Effect(index=index, kind=EffectKind(kind), node=node, group=group, pod_uid=pod_uid,
                  gpu_uuids=tuple(uuids), env=tuple((name, value) for name, value in env),
                  reason=reason, command=tuple(command))


# An effect as an effects query answers it. The fields after `group` may be left out (an older
# encoder, a gang event): they take the `Effect` defaults.
EFFECT_FIELDS = ("index", "kind", "node", "group", "pod_uid", "gpu_uuids", "env", "reason",
                 "command")
EFFECT_ENV_VARS_MAX = 64  # the store sets three (lifecycle.pod_env)
_ENV_VALUE_LENGTH_MAX = limits.GPUS_PER_NODE_MAX * (limits.UUID_LENGTH_MAX + 1)
_KINDS = tuple(kind.value for kind in EffectKind)


class UnknownEffectKind(DecodeError):
    """An effect of a kind this build does not know: a newer replica's, to skip."""

    def __init__(self, index: int, kind: str) -> None:
        super().__init__(Code.MALFORMED, f"effect {index}: unknown kind {kind[:64]!r}")
        self.index = index
        self.kind = kind


def decode_effect(raw: object) -> Effect:
    """The typed effect of one map of an effects answer; DecodeError naming the field when it
    is not one (UnknownEffectKind when only its kind is unknown here)."""
    path = f"effect {raw.get('index')!r}" if type(raw) is dict else "effect"
    record = Record(raw, path, EFFECT_FIELDS)
    index = record.integer("index")
    kind = record.text("kind", length_max=64)
    if kind not in _KINDS:
        raise UnknownEffectKind(index, kind)
    return Effect(
        index=index, kind=EffectKind(kind),
        node=record.text("node", allow_empty=True), group=record.text("group"),
        pod_uid=_optional_text(record, "pod_uid", limits.NAME_LENGTH_MAX),
        gpu_uuids=_texts(record, "gpu_uuids", limits.GPUS_PER_NODE_MAX,
                         limits.UUID_LENGTH_MAX),
        env=_env(record),
        reason=_optional_text(record, "reason", limits.EFFECT_REASON_LENGTH_MAX),
        command=pod_command(record))


def _optional_text(record: Record, name: str, length_max: int) -> str:
    if not record.has(name):
        return ""
    return record.text(name, length_max=length_max, allow_empty=True)


def _texts(record: Record, name: str, items_max: int, length_max: int) -> tuple[str, ...]:
    if not record.has(name):
        return ()
    return tuple(checked(expect_str, item, f"{record.path}.{name}[{at}]",
                         length_max=length_max, allow_empty=True)
                 for at, item in enumerate(record.items(name, length_max=items_max)))


def _env(record: Record) -> tuple[tuple[str, str], ...]:
    if not record.has("env"):
        return ()
    env: list[tuple[str, str]] = []
    for at, pair in enumerate(record.items("env", length_max=EFFECT_ENV_VARS_MAX)):
        path = f"{record.path}.env[{at}]"
        fields: Any = checked(expect_fields, checked(expect_list, pair, path, length_max=2),
                              path, count=2)
        env.append((checked(expect_str, fields[0], f"{path}[0]", length_max=limits.NAME_LENGTH_MAX),
                    checked(expect_str, fields[1], f"{path}[1]",
                            length_max=_ENV_VALUE_LENGTH_MAX, allow_empty=True)))
    return tuple(env)
