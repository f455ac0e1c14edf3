"""One effect as compact bytes: the outbox keeps its effects packed, so that a snapshot of a
full outbox (tens of thousands of effects) is a list of byte strings, cheap to write and read,
and an effect is unpacked only when someone asks for it."""

from __future__ import annotations

from consensus.codec import pack, unpack
from statemachine import limits
from statemachine.effects import Effect, EffectKind

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
