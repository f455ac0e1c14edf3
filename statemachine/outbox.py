"""The outbox: numbered effects that node agents and schedulers watch, in log order.

Side effects never happen inside `apply`; they are recorded here for a dispatcher or an agent to
carry out: start a pod on a node, kill a pod, and gang events a scheduler follows (allocated,
preempting, released, downgraded, failing hardware). Effects are numbered from 1 without gaps;
each is idempotent by (kind, group, pod uid), so a new leader may resend them. A node agent asks
for the effects after the last index it has seen, filtered to its node. Only the newest
`OUTBOX_RETAINED_MAX` effects are kept.
"""

from __future__ import annotations

import bisect
import enum
from dataclasses import dataclass

from statemachine.journal import Journal
from statemachine.limits import OUTBOX_RETAINED_MAX

TRIM_CHUNK = 4096


class EffectKind(enum.StrEnum):
    START_POD = "start_pod"
    KILL_POD = "kill_pod"
    GANG_ALLOCATED = "gang_allocated"
    GANG_PREEMPTING = "gang_preempting"
    GANG_RELEASED = "gang_released"
    GANG_DOWNGRADED = "gang_downgraded"
    GANG_FAILURE = "gang_failure"  # hardware under the gang failed
    GANG_REQUEUED = "gang_requeued"  # a preemptor lost its reservation and waits again


@dataclass(frozen=True, slots=True, kw_only=True)
class Effect:
    index: int
    kind: EffectKind
    node: str  # "" for gang events, which concern schedulers rather than one node
    group: str
    pod_uid: str = ""
    gpu_uuids: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    reason: str = ""


class Outbox:
    __slots__ = ("_journal", "by_node", "effects", "first_index")

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self.effects: list[Effect] = []
        self.first_index = 1  # the index of effects[0]
        self.by_node: dict[str, list[int]] = {}  # node -> indices of its effects, ascending

    @property
    def next_index(self) -> int:
        return self.first_index + len(self.effects)

    def emit(self, kind: EffectKind, *, node: str, group: str, pod_uid: str = "",
             gpu_uuids: tuple[str, ...] = (), env: tuple[tuple[str, str], ...] = (),
             reason: str = "") -> None:
        effect = Effect(index=self.next_index, kind=kind, node=node, group=group,
                        pod_uid=pod_uid, gpu_uuids=gpu_uuids, env=env, reason=reason)
        self.load(effect)
        self._journal.record(self._unload)
        if len(self.effects) > OUTBOX_RETAINED_MAX + TRIM_CHUNK:
            self._trim()

    def load(self, effect: Effect) -> None:
        """Append an effect as it is (used by `emit` and by snapshot restore)."""
        assert effect.index == self.next_index
        self.effects.append(effect)
        self.by_node.setdefault(effect.node, []).append(effect.index)

    def since(self, after: int, node: str | None, limit: int) -> list[Effect]:
        """Effects with index > `after`, only those of `node` unless it is None."""
        if node is None:
            start = max(0, after + 1 - self.first_index)
            return self.effects[start:start + limit]
        indices = self.by_node.get(node, [])
        start = bisect.bisect_right(indices, after)
        return [self.effects[index - self.first_index] for index in indices[start:start + limit]]

    def _unload(self) -> None:
        effect = self.effects.pop()
        indices = self.by_node[effect.node]
        indices.pop()
        if not indices:
            del self.by_node[effect.node]

    def _trim(self) -> None:
        dropped = self.effects[:TRIM_CHUNK]
        self._drop(dropped)
        self._journal.record(lambda: self._undrop(dropped))

    def _drop(self, dropped: list[Effect]) -> None:
        del self.effects[:len(dropped)]
        self.first_index += len(dropped)
        for node in sorted({effect.node for effect in dropped}):
            indices = self.by_node[node]
            del indices[:bisect.bisect_left(indices, self.first_index)]
            if not indices:
                del self.by_node[node]

    def _undrop(self, dropped: list[Effect]) -> None:
        self.effects[:0] = dropped
        self.first_index -= len(dropped)
        for node in sorted({effect.node for effect in dropped}):
            restored = [effect.index for effect in dropped if effect.node == node]
            self.by_node[node] = restored + self.by_node.get(node, [])
