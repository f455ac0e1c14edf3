"""Buddy cell allocation: per-chain, per-level free lists, VC bindings, split, merge and safety.

A virtual cluster is guaranteed a number of cells per chain and level (its quota). Its gangs run
inside physical cells bound to it; a cell is bound on first use, taken from the free lists by
buddy allocation, and unbound (merging with its buddies) when no guaranteed gang of the VC
uses it any more (reference/hived.md 1.4-1.5).

State per chain: `free_lists[chain][level]`, the sorted ids of free cells not inside another
free cell; per cell, `in_free`, `split` (a descendant is bound) and `bound_vc` with
`bound_root` (the bound ancestor-or-self of every cell). Free-list order is canonical (by id),
so the lists are a function of the bindings alone and a snapshot only stores the bindings.

Safety (the condition of section 1.5, in its exact cumulative form): walking a chain from the
top, the free cells available at each level, plus those left over from the level above split
into their children, must cover the VCs' unbound guaranteed cells at that level. Every binding
is checked against it before it is made, so an in-quota request of another VC always fits.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from itertools import islice

from statemachine.bound_index import BoundIndex
from statemachine.journal import Journal
from statemachine.topology import Topology


class Buddy:
    __slots__ = ("bound", "bound_cells", "bound_root", "bound_vc", "demand", "free_lists",
                 "in_free", "journal", "split", "topology", "unbound")

    def __init__(self, topology: Topology, journal: Journal, bound: BoundIndex) -> None:
        count = topology.cell_count
        self.topology = topology
        self.journal = journal
        self.bound = bound  # the cells' index of bound cells by priority, told of each binding
        self.free_lists: list[list[list[int]]] = [
            [[] for _ in range(chain.top_level + 1)] for chain in topology.chains]
        self.in_free = [False] * count
        self.split = [False] * count
        self.bound_vc: list[str] = [""] * count
        self.bound_root: list[int] = [-1] * count
        # unbound[vc][chain][level]: guaranteed cells not bound yet; demand: their sum.
        self.unbound = {vc: [list(row) for row in topology.quota[vc]] for vc in topology.vc_names}
        self.demand = [[sum(topology.quota[vc][chain.index][level] for vc in topology.vc_names)
                        for level in range(chain.top_level + 1)] for chain in topology.chains]
        # bound_cells[vc][chain]: sorted ids of the cells bound to the VC.
        self.bound_cells: dict[str, list[list[int]]] = {
            vc: [[] for _ in topology.chains] for vc in topology.vc_names}
        for chain in topology.chains:
            for cell in chain.cells_at(chain.top_level):
                self.in_free[cell] = True
                self.free_lists[chain.index][chain.top_level].append(cell)

    # Reads.

    def free_ancestor(self, cell: int) -> int:
        """The free-list cell that contains `cell` (or is it), or -1 when there is none."""
        parent = self.topology.parent
        while cell >= 0 and not self.in_free[cell]:
            cell = parent[cell]
        return cell

    def has_binding(self, cell: int) -> bool:
        """Whether some GPU under `cell` is bound to a VC (the cell is bound, inside a bound
        cell, or split by a binding below it)."""
        return self.bound_root[cell] >= 0 or self.split[cell]

    def bindable(self, cell: int) -> bool:
        return self.bound_root[cell] < 0 and self.free_ancestor(cell) >= 0

    def candidates(self, chain: int, level: int, start: int = 0) -> Iterator[int]:
        """Bindable cells at `level`, in buddy order: cells already free at that level first,
        then those made by splitting the lowest free level above, each level by id. From the
        `start`th on, the ones before it skipped by arithmetic, not walked."""
        lists, size = self.free_lists[chain], self.topology.chains[chain].size
        descendants_at = self.topology.descendants_at
        if start < len(lists[level]):  # the common case, and the cheapest: no split
            yield from islice(lists[level], start, None) if start else lists[level]
            start = 0
        else:
            start -= len(lists[level])
        for above in range(level + 1, len(lists)):
            cells, inside = lists[above], size[above] // size[level]  # level cells in each
            first, start = divmod(start, inside)
            if first >= len(cells):
                start += (first - len(cells)) * inside
                continue
            yield from descendants_at(cells[first], level)[start:]
            for position in range(first + 1, len(cells)):
                yield from descendants_at(cells[position], level)
            start = 0

    def vc_of_leaf(self, leaf: int) -> str:
        root = self.bound_root[leaf]
        return self.bound_vc[root] if root >= 0 else ""

    # Safety.

    def feasible_after(self, chain: int, bindings: Sequence[int]) -> bool:
        """Whether the safety condition still holds once `bindings` (cells of `chain`, each
        bindable, pairwise disjoint) are bound."""
        after = CountsAfter(self, chain)
        for cell in bindings:
            after.add(cell)
        return after.feasible()

    # Journaled mutations.

    def bind(self, cell: int, vc: str) -> None:
        self._bind(cell, vc)
        self.journal.record(lambda: self._unbind(cell))

    def unbind(self, cell: int) -> None:
        vc = self.bound_vc[cell]
        self._unbind(cell)
        self.journal.record(lambda: self._bind(cell, vc))

    def _bind(self, cell: int, vc: str) -> None:
        topology = self.topology
        chain, level = topology.chain_of[cell], topology.level[cell]
        assert self.unbound[vc][chain][level] > 0, f"{vc} has no unbound cell at level {level}"
        top = self.free_ancestor(cell)
        assert top >= 0 and self.bound_root[cell] < 0, f"cell {cell} is not bindable"
        self._remove_free(top)
        walk = cell
        while walk != top:
            up = topology.parent[walk]
            self.split[up] = True
            for child in topology.children(up):
                if child != walk:
                    self._add_free(child)
            walk = up
        self.bound_vc[cell] = vc
        self._set_root(cell, cell)
        self.unbound[vc][chain][level] -= 1
        self.demand[chain][level] -= 1
        bisect.insort(self.bound_cells[vc][chain], cell)
        self.bound.bind(cell, vc)

    def _unbind(self, cell: int) -> None:
        topology = self.topology
        chain, level = topology.chain_of[cell], topology.level[cell]
        vc = self.bound_vc[cell]
        assert vc and self.bound_root[cell] == cell
        self.bound_vc[cell] = ""
        self._set_root(cell, -1)
        self.unbound[vc][chain][level] += 1
        self.demand[chain][level] += 1
        cells = self.bound_cells[vc][chain]
        del cells[bisect.bisect_left(cells, cell)]
        self.bound.unbind(cell)
        self._add_free(cell)
        up = topology.parent[cell]
        while up >= 0 and all(self.in_free[child] for child in topology.children(up)):
            for child in topology.children(up):
                self._remove_free(child)
            self.split[up] = False
            self._add_free(up)
            up = topology.parent[up]

    def _set_root(self, cell: int, root: int) -> None:
        for level in range(self.topology.level[cell], 0, -1):
            for inside in self.topology.descendants_at(cell, level):
                self.bound_root[inside] = root

    def _add_free(self, cell: int) -> None:
        assert not self.in_free[cell]
        self.in_free[cell] = True
        chain, level = self.topology.chain_of[cell], self.topology.level[cell]
        bisect.insort(self.free_lists[chain][level], cell)

    def _remove_free(self, cell: int) -> None:
        assert self.in_free[cell]
        self.in_free[cell] = False
        cells = self.free_lists[self.topology.chain_of[cell]][self.topology.level[cell]]
        del cells[bisect.bisect_left(cells, cell)]


class CountsAfter:
    """A chain's free-list counts per level and its unbound demand once some cells are bound
    (a plan's bindings, not made yet), kept up to date as each is added: whether one more
    binding keeps safety is a walk of its ancestors (O(levels)), not a replay of every binding
    added before it (a gang spread over 1,024 new bindings replayed half a million)."""
    __slots__ = ("_buddy", "_chain", "_free", "counts", "demand")

    def __init__(self, buddy: Buddy, chain: int) -> None:
        self._buddy = buddy
        self._chain = chain
        self._free: dict[int, bool] = {}  # cells whose in_free the added bindings changed
        self.counts = [len(cells) for cells in buddy.free_lists[chain]]
        self.demand = list(buddy.demand[chain])

    def add(self, cell: int) -> None:
        """Bind `cell` (bindable, apart from the cells added): its free ancestor leaves the
        free lists, split down to it (the other children of each cell on the way enter)."""
        path = self._path(cell)
        self._count(path, self.counts, self.demand)
        self._free[path[-1]] = False
        for position in range(len(path) - 1, 0, -1):
            for child in self._buddy.topology.children(path[position]):
                if child != path[position - 1]:
                    self._free[child] = True

    def feasible(self) -> bool:
        return feasible(self._buddy.topology.chains[self._chain].fanout, self.counts,
                        self.demand)

    def feasible_with(self, cell: int) -> bool:
        """Whether safety still holds once `cell` is bound too; changes nothing."""
        counts, demand = list(self.counts), list(self.demand)
        self._count(self._path(cell), counts, demand)
        return feasible(self._buddy.topology.chains[self._chain].fanout, counts, demand)

    def _path(self, cell: int) -> list[int]:
        """`cell` and its ancestors, up to the first free one once the added cells are bound."""
        in_free, parent = self._buddy.in_free, self._buddy.topology.parent
        path = [cell]
        while not self._free.get(path[-1], in_free[path[-1]]):
            path.append(parent[path[-1]])
            assert path[-1] >= 0, "binding outside any free cell"
        return path

    def _count(self, path: list[int], counts: list[int], demand: list[int]) -> None:
        """Binding `path[0]` takes its level's demand down by one, and the free cell at the
        top of `path` out of the counts; the other children of each cell on `path` come in."""
        topology = self._buddy.topology
        level = topology.level
        demand[level[path[0]]] -= 1
        counts[level[path[-1]]] -= 1
        for position in range(len(path) - 1, 0, -1):
            counts[level[path[position - 1]]] += len(topology.children(path[position])) - 1


def feasible(fanout: Sequence[int], counts: Sequence[int], demand: Sequence[int]) -> bool:
    """The cumulative safety condition for one chain (levels indexed from 1 to top)."""
    available = 0
    for level in range(len(counts) - 1, 0, -1):
        available += counts[level]
        if demand[level] > available:
            return False
        available = (available - demand[level]) * fanout[level]
    return True
