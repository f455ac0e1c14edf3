"""The outbox: numbered effects that node agents and schedulers watch, in log order.

Side effects never happen inside `apply`; they are recorded here for a dispatcher or an agent to
carry out: start a pod on a node, kill a pod, and gang events a scheduler follows (allocated,
preempting, released, downgraded, failing hardware, requeued, a pod exited). Effects are
numbered from 1 without gaps; each is idempotent by (kind, group, pod uid), so a new leader may
resend them. A node agent asks for the effects after the last index it has seen, filtered to
its node. Only the newest `OUTBOX_RETAINED_MAX` effects, and at most
`OUTBOX_RETAINED_BYTES_MAX` bytes of them, are kept, packed (see `effect_codec`), with the node
of each beside it so the per-node index can be rebuilt on restore. A page of effects is bounded
by count and by packed bytes, so that any page fits in a connection's frame.
"""

from __future__ import annotations

import bisect

from statemachine.effect_codec import pack_effect, unpack_effect
from statemachine.effects import Effect, EffectKind
from statemachine.journal import Journal
from statemachine.limits import (
    EFFECT_REASON_LENGTH_MAX,
    OUTBOX_RETAINED_BYTES_MAX,
    OUTBOX_RETAINED_MAX,
)

TRIM_CHUNK = 4096


class Outbox:
    __slots__ = ("_journal", "by_node", "first_index", "nodes", "packed", "packed_bytes")

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self.packed: list[bytes] = []  # the effects, oldest first
        self.nodes: list[str] = []  # the node of each
        self.first_index = 1  # the index of packed[0]
        self.by_node: dict[str, list[int]] = {}  # node -> indices of its effects, ascending
        self.packed_bytes = 0  # len(packed[i]) summed

    @property
    def next_index(self) -> int:
        return self.first_index + len(self.packed)

    @property
    def effects(self) -> list[Effect]:
        """Every retained effect, unpacked (for tests and small outboxes)."""
        return [unpack_effect(data) for data in self.packed]

    def emit(self, kind: EffectKind, *, node: str, group: str, pod_uid: str = "",
             gpu_uuids: tuple[str, ...] = (), env: tuple[tuple[str, str], ...] = (),
             reason: str = "", command: tuple[str, ...] = ()) -> None:
        effect = Effect(index=self.next_index, kind=kind, node=node, group=group,
                        pod_uid=pod_uid, gpu_uuids=gpu_uuids, env=env, reason=clip(reason),
                        command=command)
        self.load(node, pack_effect(effect))
        self._journal.record(self._unload)
        if (len(self.packed) > OUTBOX_RETAINED_MAX + TRIM_CHUNK
                or self.packed_bytes > OUTBOX_RETAINED_BYTES_MAX):
            self._trim()

    def load(self, node: str, data: bytes) -> None:
        """Append a packed effect (used by `emit` and by snapshot restore)."""
        self.by_node.setdefault(node, []).append(self.next_index)
        self.packed.append(data)
        self.nodes.append(node)
        self.packed_bytes += len(data)

    def since(self, after: int, node: str | None, limit: int,
              bytes_max: int | None = None) -> list[Effect]:
        """Effects with index > `after`, only those of `node` unless it is None: at most
        `limit` of them and, past the first, at most `bytes_max` packed bytes in all."""
        taken: list[bytes] = []
        size_bytes = 0
        for data in self._packed_since(after, node, limit):
            size_bytes += len(data)
            if taken and bytes_max is not None and size_bytes > bytes_max:
                break
            taken.append(data)
        return [unpack_effect(data) for data in taken]

    def newest_index(self, node: str | None) -> int:
        """The index of the newest effect kept, of `node` unless it is None; 0 for none."""
        if node is None:
            return self.next_index - 1 if self.packed else 0
        indices = self.by_node.get(node)
        return indices[-1] if indices else 0

    def _packed_since(self, after: int, node: str | None, limit: int) -> list[bytes]:
        if node is None:
            start = max(0, after + 1 - self.first_index)
            return self.packed[start:start + limit]
        indices = self.by_node.get(node, [])
        start = bisect.bisect_right(indices, after)
        return [self.packed[index - self.first_index] for index in indices[start:start + limit]]

    def _unload(self) -> None:
        self.packed_bytes -= len(self.packed.pop())
        node = self.nodes.pop()
        indices = self.by_node[node]
        indices.pop()
        if not indices:
            del self.by_node[node]

    def _trim(self) -> None:
        """Drop TRIM_CHUNK effects, or more while the bytes kept are over an eighth below
        OUTBOX_RETAINED_BYTES_MAX (so that a byte trim too is not made at every effect)."""
        count = min(TRIM_CHUNK, len(self.packed) - 1)  # the newest effect always stays
        kept = self.packed_bytes - sum(map(len, self.packed[:count]))
        while count < len(self.packed) - 1 and \
                kept > OUTBOX_RETAINED_BYTES_MAX - OUTBOX_RETAINED_BYTES_MAX // 8:
            kept -= len(self.packed[count])
            count += 1
        dropped = (self.packed[:count], self.nodes[:count])
        self._drop(len(dropped[0]))
        self._journal.record(lambda: self._undrop(*dropped))

    def _drop(self, count: int) -> None:
        gone = sorted(set(self.nodes[:count]))
        self.packed_bytes -= sum(map(len, self.packed[:count]))
        del self.packed[:count]
        del self.nodes[:count]
        self.first_index += count
        for node in gone:
            indices = self.by_node[node]
            del indices[:bisect.bisect_left(indices, self.first_index)]
            if not indices:
                del self.by_node[node]

    def _undrop(self, packed: list[bytes], nodes: list[str]) -> None:
        self.packed[:0] = packed
        self.nodes[:0] = nodes
        self.packed_bytes += sum(map(len, packed))
        self.first_index -= len(packed)
        for node in sorted(set(nodes)):
            restored = [self.first_index + position for position, name in enumerate(nodes)
                        if name == node]
            self.by_node[node] = restored + self.by_node.get(node, [])


def clip(reason: str) -> str:
    """`reason` cut to EFFECT_REASON_LENGTH_MAX characters, saying how much was cut. Every
    other field of an effect is bounded; a reason may list a gang's victims (hundreds of
    names), and a packed effect over EFFECT_BYTES_MAX could never be read back."""
    if len(reason) <= EFFECT_REASON_LENGTH_MAX:
        return reason
    kept = EFFECT_REASON_LENGTH_MAX - 40
    return f"{reason[:kept]}... ({len(reason) - kept} more characters)"
