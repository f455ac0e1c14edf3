"""One effect as compact bytes: the outbox keeps its effects packed, so that a snapshot of a
full outbox (tens of thousands of effects) is a list of byte strings, cheap to write and read,
and an effect is unpacked only when someone asks for it."""

from __future__ import annotations

from consensus.codec import pack, unpack
from statemachine.effects import Effect, EffectKind

EFFECT_BYTES_MAX = 1 << 16


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
