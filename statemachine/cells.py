"""Who holds, reserves and may use every GPU, and the per-cell counters derived from that.

Per leaf (GPU): the group holding it and that group's effective priority, the preempting group
reserving it and its priority, and whether it is usable for a new placement (its node is Up,
registered, not cordoned or draining, the GPU not failed or marked bad). A leaf's state follows
HiveD (reference/hived.md 1.7): Free (neither), Used (holder), Reserved (reserver), Reserving
(both: a victim still runs where a preemptor waits).

Per cell, maintained incrementally: `free` (usable leaves with neither holder nor reserver) and
`bad` (unusable leaves), plus a best-fit index at the node level and above; per chain, its free
GPUs in all (`chain_free`, the sum of `free` over its top-level cells, read on every
opportunistic attempt without a walk of the chain's racks); per tenant, its bound
cells by the lowest priority holding a usable GPU of theirs (`bound`, whose bindings `buddy`
keeps). Every mutation is batched over a list of leaves, journaled as its exact inverse, and
touches each ancestor once.
"""

from __future__ import annotations

from collections.abc import Sequence

from statemachine.bound_index import BoundIndex
from statemachine.free_index import FreeIndex
from statemachine.journal import Journal
from statemachine.limits import FREE_PRIORITY
from statemachine.topology import Topology


class Cells:
    __slots__ = ("bad", "bound", "chain_free", "free", "holder", "holder_priority", "indexes",
                 "journal", "reserver", "reserver_priority", "topology", "usable")

    def __init__(self, topology: Topology, journal: Journal) -> None:
        count = topology.cell_count
        self.topology = topology
        self.journal = journal
        self.holder: list[str] = [""] * count
        self.holder_priority: list[int] = [FREE_PRIORITY] * count
        self.reserver: list[str] = [""] * count
        self.reserver_priority: list[int] = [FREE_PRIORITY] * count
        self.usable: list[bool] = [False] * count
        self.free: list[int] = [0] * count
        self.bad: list[int] = [topology.size_of(cell) for cell in range(count)]
        self.indexes = [FreeIndex(chain.top_level) for chain in topology.chains]
        self.chain_free: list[int] = [0] * len(topology.chains)  # by chain index
        self.bound = BoundIndex(topology, self.usable, self.holder_priority,
                                self.reserver_priority)

    # Reads.

    def is_free(self, leaf: int) -> bool:
        return self.usable[leaf] and not self.holder[leaf] and not self.reserver[leaf]

    def leaf_priority(self, leaf: int) -> int:
        """The priority a preemptor must beat to take this leaf."""
        return max(self.holder_priority[leaf], self.reserver_priority[leaf])

    def holders_in(self, cell: int) -> list[str]:
        """The distinct groups holding or reserving leaves under `cell`, sorted."""
        found = {name for leaf in self.topology.leaves(cell)
                 for name in (self.holder[leaf], self.reserver[leaf]) if name}
        return sorted(found)

    # Journaled mutations, each batched over leaves.

    def hold(self, leaves: Sequence[int], group: str, priority: int) -> None:
        self._hold(leaves, group, priority)
        self.journal.record(lambda: self._unhold(leaves))

    def unhold(self, leaves: Sequence[int]) -> None:
        group, priority = self.holder[leaves[0]], self.holder_priority[leaves[0]]
        assert all(self.holder[leaf] == group for leaf in leaves)
        self._unhold(leaves)
        self.journal.record(lambda: self._hold(leaves, group, priority))

    def reserve(self, leaves: Sequence[int], group: str, priority: int) -> None:
        self._reserve(leaves, group, priority)
        self.journal.record(lambda: self._unreserve(leaves))

    def unreserve(self, leaves: Sequence[int]) -> None:
        group, priority = self.reserver[leaves[0]], self.reserver_priority[leaves[0]]
        assert all(self.reserver[leaf] == group for leaf in leaves)
        self._unreserve(leaves)
        self.journal.record(lambda: self._reserve(leaves, group, priority))

    def set_holder_priority(self, leaves: Sequence[int], priority: int) -> None:
        old = self.holder_priority[leaves[0]]
        assert all(self.holder[leaf] and self.holder_priority[leaf] == old for leaf in leaves)
        self._set_priorities(leaves, priority)
        self.journal.record(lambda: self._set_priorities(leaves, old))

    def set_usable(self, leaves: Sequence[int], usable: bool) -> None:
        changed = [leaf for leaf in leaves if self.usable[leaf] != usable]
        if changed:
            self._set_usable(changed, usable)
            self.journal.record(lambda: self._set_usable(changed, not usable))

    # The raw operations behind them (and behind their undo).

    def _hold(self, leaves: Sequence[int], group: str, priority: int) -> None:
        assert group and priority > FREE_PRIORITY
        delta = {}
        for leaf in leaves:
            assert not self.holder[leaf], (leaf, self.holder[leaf], group)
            if self.usable[leaf] and not self.reserver[leaf]:
                delta[leaf] = -1
            self.holder[leaf] = group
            self.holder_priority[leaf] = priority
        self._add_free(delta)
        self.bound.refresh(leaves)

    def _unhold(self, leaves: Sequence[int]) -> None:
        delta = {}
        for leaf in leaves:
            assert self.holder[leaf]
            self.holder[leaf] = ""
            self.holder_priority[leaf] = FREE_PRIORITY
            if self.usable[leaf] and not self.reserver[leaf]:
                delta[leaf] = 1
        self._add_free(delta)
        self.bound.refresh(leaves)

    def _reserve(self, leaves: Sequence[int], group: str, priority: int) -> None:
        assert group and priority >= 0
        delta = {}
        for leaf in leaves:
            assert not self.reserver[leaf], (leaf, self.reserver[leaf], group)
            if self.usable[leaf] and not self.holder[leaf]:
                delta[leaf] = -1
            self.reserver[leaf] = group
            self.reserver_priority[leaf] = priority
        self._add_free(delta)
        self.bound.refresh(leaves)

    def _unreserve(self, leaves: Sequence[int]) -> None:
        delta = {}
        for leaf in leaves:
            assert self.reserver[leaf]
            self.reserver[leaf] = ""
            self.reserver_priority[leaf] = FREE_PRIORITY
            if self.usable[leaf] and not self.holder[leaf]:
                delta[leaf] = 1
        self._add_free(delta)
        self.bound.refresh(leaves)

    def _set_priorities(self, leaves: Sequence[int], priority: int) -> None:
        for leaf in leaves:
            self.holder_priority[leaf] = priority
        self.bound.refresh(leaves)

    def _set_usable(self, leaves: Sequence[int], usable: bool) -> None:
        step = 1 if usable else -1
        free_delta = {}
        bad_delta = {}
        for leaf in leaves:
            assert self.usable[leaf] != usable
            self.usable[leaf] = usable
            bad_delta[leaf] = -step
            if not self.holder[leaf] and not self.reserver[leaf]:
                free_delta[leaf] = step
        self._add_free(free_delta)
        self._add_bad(bad_delta)
        self.bound.refresh(leaves)

    def _add_free(self, delta: dict[int, int]) -> None:
        """Add per-leaf deltas to `free` of every ancestor, one level at a time."""
        parent, level, chain_of = self.topology.parent, self.topology.level, self.topology.chain_of
        free = self.free
        while delta:
            above: dict[int, int] = {}
            for cell, change in delta.items():
                if change:
                    old = free[cell]
                    free[cell] = old + change
                    chain = self.topology.chains[chain_of[cell]]
                    if level[cell] >= chain.node_level:
                        self.indexes[chain.index].move(level[cell], cell, old, old + change)
                    if parent[cell] < 0:  # a top-level cell: the chain's total moves too
                        self.chain_free[chain.index] += change
                up = parent[cell]
                if up >= 0:
                    above[up] = above.get(up, 0) + change
            delta = above

    def _add_bad(self, delta: dict[int, int]) -> None:
        parent, bad = self.topology.parent, self.bad
        while delta:
            above: dict[int, int] = {}
            for cell, change in delta.items():
                bad[cell] += change
                up = parent[cell]
                if up >= 0:
                    above[up] = above.get(up, 0) + change
            delta = above
