"""Fitting pods into a cell: which nodes, and which GPUs inside each node.

A *view* says which GPUs a placement may use and counts them per cell, and records the GPUs a
plan has tentatively taken so that later pods of the same gang see them as gone:

- `FreeView`: only free GPUs (usable, neither held nor reserved); counts come from the
  maintained `free` counters, so it is cheap. Used for every first attempt.
- `PreemptView(priority)`: also GPUs whose holder and reserver both have a lower priority;
  counts are computed by scanning and cached. Used only when a guaranteed gang must preempt.
  `evictions(cell)` says how many GPUs and gangs taking the cell would evict, so the search
  can try the cells that cost the fewest victims first; `plan_evictions(pods)` says what the
  GPUs a plan chose evict, so the search can compare whole plans.

`fit_in_cell` places a gang's pods inside one cell: largest pod first, each on the node with
the fewest usable GPUs that still fit it (packing); inside a node, the GPUs come from the
lowest sub-cell that holds them all (best affinity: same PCIe switch, then socket), reached
through the sub-cells with the fewest usable GPUs. Ties go to the cell that evicts the fewest
GPUs and gangs (under preemption; none do in a `FreeView`), then by id.
Every choice is a deterministic function of the counts, evictions and ids.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from typing import ClassVar

from statemachine.bound_index import FREE_CEILING
from statemachine.cells import Cells
from statemachine.limits import FREE_PRIORITY
from statemachine.topology import Topology

Evictions = tuple[int, int, int]  # (highest priority evicted, GPUs, gangs): smaller is cheaper
NO_EVICTIONS: Evictions = (FREE_PRIORITY, 0, 0)


class FreeView:
    """Free GPUs only, minus what the plan has taken."""

    preempts: ClassVar[bool] = False
    __slots__ = ("_cells", "_delta", "_log", "_parent")

    def __init__(self, cells: Cells) -> None:
        self._cells = cells
        self._parent = cells.topology.parent
        self._delta: dict[int, int] = {}
        self._log: list[tuple[int, ...]] = []

    def base(self, cell: int) -> int:
        return self._cells.free[cell]

    def count(self, cell: int) -> int:
        return self._cells.free[cell] - self._delta.get(cell, 0)

    def unbound_count(self, cell: int) -> int:
        """`count` for a cell outside every tenant's binding (a buddy candidate)."""
        return self.count(cell)

    def ceiling(self) -> int:
        """A GPU is offered only if its holder's and reserver's priorities are both below it."""
        return FREE_CEILING

    def has_bad(self, cell: int) -> bool:
        return self._cells.bad[cell] > 0

    def binding_rank(self, cell: int, size: int) -> tuple[bool, int]:
        """A cell to bind, without preemption: healthy first, then fewest GPUs held (all by
        opportunistic gangs, in a cell no tenant holds)."""
        bad = self._cells.bad[cell]
        return bad > 0, size - self.count(cell) - bad

    def evictions(self, cell: int) -> Evictions:
        """What taking all of `cell` would evict: none, only free GPUs count."""
        return NO_EVICTIONS

    def plan_evictions(self, pods: Sequence[Sequence[int]]) -> Evictions:
        """What taking the GPUs `pods` name would evict: none, only free GPUs are offered."""
        return NO_EVICTIONS

    def take(self, leaves: Sequence[int]) -> None:
        for leaf in leaves:
            assert self.count(leaf) == 1, f"GPU {leaf} is not available"
        self._add(leaves, 1)
        self._log.append(tuple(leaves))

    def checkpoint(self) -> int:
        return len(self._log)

    def restore(self, checkpoint: int) -> None:
        while len(self._log) > checkpoint:
            self._add(self._log.pop(), -1)

    def _add(self, leaves: Sequence[int], step: int) -> None:
        """Add `step` per leaf to the delta of each leaf and ancestor, a level at a time."""
        parent, delta = self._parent, self._delta
        level: dict[int, int] = dict.fromkeys(leaves, step)
        while level:
            above: dict[int, int] = {}
            for cell, change in level.items():
                delta[cell] = delta.get(cell, 0) + change
                up = parent[cell]
                if up >= 0:
                    above[up] = above.get(up, 0) + change
            level = above


class PreemptView(FreeView):
    """GPUs a gang of `priority` may take: free, or held and reserved only below it."""

    preempts: ClassVar[bool] = True
    __slots__ = ("_cache", "_gang_gpus", "_priority")

    def __init__(self, cells: Cells, priority: int, gang_gpus: Callable[[str], int]) -> None:
        """`gang_gpus`: the GPUs a gang holds or reserves in all, by name, for
        `plan_evictions` to count the GPUs a plan's victims give up."""
        super().__init__(cells)
        self._priority = priority
        self._gang_gpus = gang_gpus
        self._cache: dict[int, int] = {}

    def base(self, cell: int) -> int:
        found = self._cache.get(cell)
        if found is None:
            cells, priority = self._cells, self._priority
            usable, held, reserved = cells.usable, cells.holder_priority, cells.reserver_priority
            found = sum(1 for leaf in cells.topology.leaves(cell)
                        if usable[leaf] and held[leaf] < priority and reserved[leaf] < priority)
            self._cache[cell] = found
        return found

    def count(self, cell: int) -> int:
        return self.base(cell) - self._delta.get(cell, 0)

    def ceiling(self) -> int:
        return self._priority

    def unbound_count(self, cell: int) -> int:
        """Outside every tenant's binding all holders are opportunistic (priority -1, below any
        preemptor) and nothing is reserved, so every usable GPU is available: no scan."""
        topology = self._cells.topology
        return topology.size_of(cell) - self._cells.bad[cell] - self._delta.get(cell, 0)

    def plan_evictions(self, pods: Sequence[Sequence[int]]) -> Evictions:
        """(highest priority, GPUs, gangs) that taking the GPUs `pods` name would evict: the
        highest priority among their holders and reservers, how many GPUs those hold in all
        (a victim leaves whole) and how many distinct holders and reservers. One read per GPU
        and one call per gang."""
        cells = self._cells
        top, gangs = FREE_PRIORITY, set[str]()
        for pod in pods:
            for leaf in pod:
                if not cells.is_free(leaf):
                    top = max(top, cells.leaf_priority(leaf))
                    gangs.update(name for name in (cells.holder[leaf], cells.reserver[leaf])
                                 if name)
        return top, sum(map(self._gang_gpus, gangs)), len(gangs)

    def evictions(self, cell: int) -> Evictions:
        """(highest priority, GPUs, gangs) that taking every GPU this view offers under `cell`
        would evict: the GPUs held or reserved below the priority and not yet taken by the
        plan, the highest priority among their holders and reservers, and how many distinct
        ones there are. Ranked in that order, a preemptor evicts the lowest priorities it can
        (HiveD takes a node's lowest-priority GPUs first), then the fewest GPUs and gangs. One
        scan of the cell's GPUs; none when every usable one is free."""
        cells = self._cells
        if cells.free[cell] + cells.bad[cell] == cells.topology.size_of(cell):
            return NO_EVICTIONS
        usable, priority, taken = cells.usable, self._priority, self._delta
        held, reserved = cells.holder_priority, cells.reserver_priority
        top, gpus, gangs = FREE_PRIORITY, 0, set[str]()
        for leaf in cells.topology.leaves(cell):
            if usable[leaf] and not cells.is_free(leaf) and held[leaf] < priority \
                    and reserved[leaf] < priority and not taken.get(leaf):
                gpus += 1
                top = max(top, held[leaf], reserved[leaf])
                gangs.update(name for name in (cells.holder[leaf], cells.reserver[leaf]) if name)
        return top, gpus, len(gangs)


def fit_in_cell(topology: Topology, view: FreeView, cell: int,
                pods: Sequence[int]) -> list[list[int]] | None:
    """GPUs for each pod (in the order given) inside `cell`, taken in `view`; or None, with
    `view` unchanged."""
    if view.count(cell) < sum(pods):
        return None
    chain = topology.chain_for(cell)
    level = topology.level[cell]
    if level <= chain.node_level:
        roots: Iterable[int] = (cell,)
    else:
        roots = topology.descendants_at(cell, chain.node_level)
    return fit_on_roots(topology, view, roots, pods)


def fit_on_roots(topology: Topology, view: FreeView, roots: Iterable[int],
                 pods: Sequence[int]) -> list[list[int]] | None:
    """Place each pod inside one of `roots` (nodes, or one sub-node cell), best fit first: the
    root with the fewest available GPUs that fit it; among those, the one that evicts the
    fewest GPUs and gangs, then by id."""
    checkpoint = view.checkpoint()
    buckets: dict[int, list[tuple[Evictions, int]]] = {}  # (evictions, root) by count
    for root in roots:
        available = view.count(root)
        if available > 0:
            bisect.insort(buckets.setdefault(available, []), (view.evictions(root), root))
    counts = sorted(buckets)
    placed: list[list[int]] = [[] for _ in pods]
    for position in sorted(range(len(pods)), key=lambda index: (-pods[index], index)):
        need = pods[position]
        slot = bisect.bisect_left(counts, need)
        if slot == len(counts):
            view.restore(checkpoint)
            return None
        available = counts[slot]
        _, root = buckets[available].pop(0)
        if not buckets[available]:
            del buckets[available]
            del counts[slot]
        leaves: list[int] = []
        pick_leaves(topology, view, root, need, leaves)
        view.take(leaves)
        placed[position] = leaves
        left = available - need
        if left > 0:
            if left not in buckets:
                buckets[left] = []
                bisect.insort(counts, left)
            bisect.insort(buckets[left], (view.evictions(root), root))
    return placed


def pick_leaves(topology: Topology, view: FreeView, cell: int, need: int,
                out: list[int]) -> None:
    """Append `need` available GPUs under `cell` to `out`, from the lowest sub-cell that holds
    them all: find the lowest level where some cell under `cell` has `need` available, and
    descend to one such cell through the child with the fewest available GPUs (packing); where
    no lower cell holds them, span the children with the most available first. Ties go to the
    child that evicts the fewest GPUs and gangs, then by id.
    Each call reads the counts of the cells under `cell` a bounded number of times (levels x
    fanout per level); recursion depth is the number of levels below the node."""
    available = view.count(cell)
    assert 0 < need <= available
    if topology.level[cell] == 1:
        out.append(cell)
        return
    if need == available:  # all of them: no choice to make below
        out.extend(leaf for leaf in topology.leaves(cell) if view.count(leaf))
        return
    holding = _holding_level(topology, view, cell, need)
    if holding < topology.level[cell]:
        inner = cell
        while topology.level[inner] > holding:
            inner = _toward(topology, view, inner, need, holding)
        pick_leaves(topology, view, inner, need, out)
        return
    children = topology.children(cell)
    for child in sorted(children, key=lambda child: (-view.count(child), view.evictions(child),
                                                     child)):
        available = view.count(child)
        if need == 0 or available == 0:
            break
        share = min(available, need)
        pick_leaves(topology, view, child, share, out)
        need -= share
    assert need == 0


def _holding_level(topology: Topology, view: FreeView, cell: int, need: int) -> int:
    """The lowest level at which a cell under `cell` has `need` GPUs available (the level of
    `cell` when none below has)."""
    for level in range(1, topology.level[cell]):
        if any(view.count(inner) >= need for inner in topology.descendants_at(cell, level)):
            return level
    return topology.level[cell]


def _toward(topology: Topology, view: FreeView, cell: int, need: int, holding: int) -> int:
    """The child of `cell` with the fewest available GPUs among those holding, at level
    `holding`, a cell with `need` available; ties by fewest evictions, then by id."""
    ranked = sorted((count, view.evictions(child), child) for child in topology.children(cell)
                    if (count := view.count(child)) >= need)
    for _, _, child in ranked:
        if any(view.count(inner) >= need for inner in topology.descendants_at(child, holding)):
            return child
    raise AssertionError(f"no child of cell {cell} holds {need} GPUs at level {holding}")
