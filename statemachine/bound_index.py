"""The cells bound to each tenant, by the lowest priority that holds a usable GPU of theirs.

A guaranteed gang's search may use, in its tenant's bound cells, only the GPUs its view offers:
free ones, or, preempting at priority p, those whose holder and reserver priorities are both
below p. A bound cell offers one exactly when its *floor* is below p: the lowest of
max(holder priority, reserver priority) over its usable GPUs (a free GPU's is FREE_PRIORITY, an
unusable one's UNUSABLE, above every priority). Keeping, per tenant and chain, the bound cells
in a bucket per floor answers "which bound cells could this search use" from the buckets below
p, so an attempt looks at those, not at every cell the tenant has bound (15,360 of them, all
held, cost 40 ms an attempt that could use none).

A change of GPU keys (a hold, release, reservation, downgrade or health change) recomputes the
floor of each bound cell it touched, a minimum over the cell's slice of the key array (at C
speed), and moves the cell between buckets in constant time (a bucket is a dict used as a set;
`below` sorts what it finds, so no answer depends on a bucket's order). The raw operations of
`cells` (each calls `refresh` with the GPUs it changed) and `buddy` (bindings) maintain it, so
the journal's undo keeps it exact and a restore rebuilds it.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from statemachine.limits import FREE_PRIORITY, PRIORITY_MAX
from statemachine.topology import Topology

UNUSABLE = PRIORITY_MAX + 1  # the key of a GPU no view offers
FREE_CEILING = FREE_PRIORITY + 1  # below(vc, chain, FREE_CEILING): the cells with a free GPU


class BoundIndex:
    __slots__ = ("_by_floor", "_floor", "_held", "_home", "_reserved", "_root", "_usable", "key",
                 "topology")

    def __init__(self, topology: Topology, usable: list[bool], held: list[int],
                 reserved: list[int]) -> None:
        """`usable`, `held` and `reserved`: the per-GPU arrays of `cells` (usable, holder and
        reserver priorities), read when `refresh` is told some of them changed."""
        count = topology.cell_count
        self.topology = topology
        self._usable, self._held, self._reserved = usable, held, reserved
        self.key: list[int] = [UNUSABLE] * count  # per GPU, as above
        self._root: list[int] = [-1] * count  # per GPU: the bound cell it lies in, or -1
        self._floor: dict[int, int] = {}  # bound cell: its lowest key
        # _by_floor[vc][chain]: the VC's bound cells on the chain, by floor.
        self._by_floor: dict[str, list[_ByFloor]] = {
            vc: [_ByFloor() for _ in topology.chains] for vc in topology.vc_names}
        self._home: dict[int, _ByFloor] = {}  # bound cell: its VC's _by_floor on its chain

    def below(self, vc: str, chain: int, priority: int) -> list[int]:
        """The VC's bound cells on `chain` with a usable GPU whose holder and reserver
        priorities are both below `priority`, by id."""
        return self._by_floor[vc][chain].below(priority)

    def bind(self, cell: int, vc: str) -> None:
        leaves = self.topology.leaves(cell)
        self._root[leaves.start:leaves.stop] = [cell] * len(leaves)
        home = self._by_floor[vc][self.topology.chain_of[cell]]
        self._floor[cell], self._home[cell] = min(self.key[leaves.start:leaves.stop]), home
        home.add(self._floor[cell], cell)

    def unbind(self, cell: int) -> None:
        leaves = self.topology.leaves(cell)
        self._root[leaves.start:leaves.stop] = [-1] * len(leaves)
        self._home.pop(cell).remove(self._floor.pop(cell), cell)

    def refresh(self, leaves: Sequence[int]) -> None:
        """The usability or priorities of `leaves` changed: their keys are read again, and
        their bound cells move to their new floors."""
        key, root, usable, held, reserved = (self.key, self._root, self._usable, self._held,
                                             self._reserved)
        touched: dict[int, None] = {}
        for leaf in leaves:
            holder, reserver = held[leaf], reserved[leaf]
            key[leaf] = UNUSABLE if not usable[leaf] else holder if holder >= reserver else reserver
            if root[leaf] >= 0:
                touched[root[leaf]] = None
        for cell in touched:
            inside = self.topology.leaves(cell)
            floor, old = min(key[inside.start:inside.stop]), self._floor[cell]
            if floor != old:
                self._home[cell].remove(old, cell)
                self._home[cell].add(floor, cell)
                self._floor[cell] = floor

    def contents(self) -> tuple[object, ...]:
        """Everything the index holds: for comparing with a recomputation."""
        by_floor = {vc: [chain.contents() for chain in chains]
                    for vc, chains in self._by_floor.items()}
        return self.key, self._root, self._floor, by_floor


class _ByFloor:
    """One tenant's bound cells on one chain: a bucket of cells per floor, and the floors
    present, sorted."""
    __slots__ = ("buckets", "floors")

    def __init__(self) -> None:
        self.buckets: dict[int, dict[int, None]] = {}
        self.floors: list[int] = []

    def add(self, floor: int, cell: int) -> None:
        bucket = self.buckets.get(floor)
        if bucket is None:
            bucket = self.buckets[floor] = {}
            bisect.insort(self.floors, floor)
        bucket[cell] = None

    def remove(self, floor: int, cell: int) -> None:
        bucket = self.buckets[floor]
        del bucket[cell]
        if not bucket:
            del self.buckets[floor]
            del self.floors[bisect.bisect_left(self.floors, floor)]

    def below(self, priority: int) -> list[int]:
        end = bisect.bisect_left(self.floors, priority)
        return sorted(cell for floor in self.floors[:end] for cell in self.buckets[floor])

    def contents(self) -> list[tuple[int, list[int]]]:
        return [(floor, sorted(self.buckets[floor])) for floor in self.floors]
