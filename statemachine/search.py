"""Placement search: a plan (which GPUs for each pod, which cells to bind, whom to evict) for one
gang on one chain, computed on a read-only state.

Guaranteed gangs (priority 0..1000) run inside their tenant's cells: cells already bound to the
VC (only those with a GPU the view offers are looked at, found through `buddy.bound`), or new
ones bound by buddy allocation from the VC's unbound quota, each binding checked for safety
first. The search tries to pack the whole gang into one cell, smallest level first (bound
cells before new bindings, fewest free GPUs first; when preempting, the cells with the fewest
victims first); only a gang too big for any one cell is spread pod by pod over several.
Under preemption with `least` (rules version 4 on, `statemachine/rules.py`), the search does
not stop at the first cell that fits: of every cell it would have tried, it takes the plan
whose victims' highest priority is lowest, then that evicts the fewest GPUs and gangs, and
among equals the first in the order above (packing). Before, a priority-9 gang in a socket
cell was preempted where a priority-1 gang in a node cell would do, the smaller level being
tried first. It tries no more cells than a search that finds nothing. A spread with `least`
weighs, per pod, the first `SPREAD_CHOICES_MAX` bound cells that fit it and a new binding, and
takes the one whose GPUs evict least (a bound cell among equals); before, a pod went to the
first bound cell that fit, whoever it evicted, and a new binding only when none did.
Opportunistic gangs (-1) take free GPUs anywhere on the chain, in the smallest cell that fits,
found through the best-fit index, away from the cells bound to tenants where they can.

All loops are bounded: per level at most `BUDDY_SCAN_MAX` free cells are looked at and
`BUDDY_CANDIDATES_MAX` of them tried for a binding, and `FIT_SCAN_MAX` cells looked at and
`FIT_CANDIDATES_MAX` tried for the smallest cell that fits; a spread with `least` fits each pod
into at most `SPREAD_CHOICES_MAX` bound cells and one new binding.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Generic, TypeVar

from statemachine.buddy import Buddy, CountsAfter
from statemachine.cells import Cells
from statemachine.fit import NO_EVICTIONS, Evictions, FreeView, fit_in_cell, fit_on_roots
from statemachine.limits import (
    BUDDY_CANDIDATES_MAX,
    BUDDY_SCAN_MAX,
    FIT_CANDIDATES_MAX,
    FIT_SCAN_MAX,
)
from statemachine.topology import Chain, Topology

Choice = TypeVar("Choice")
SPREAD_CHOICES_MAX = 4  # bound cells a spread with `least` weighs per pod


@dataclass(slots=True)
class Plan:
    chain: int
    pods: list[list[int]]  # GPUs (leaf ids) per pod, in the gang's pod order
    bindings: list[int] = field(default_factory=list)  # cells to bind to the gang's VC
    victims: list[str] = field(default_factory=list)  # holders to evict, sorted
    cancelled: list[str] = field(default_factory=list)  # preemptors whose GPUs it takes, sorted


class Planned:
    """The cells a plan will bind on one chain, in order, with what checking one more needs,
    kept up to date as each is added: the cells and their ancestors (whether a candidate
    overlaps one is a few set lookups, one per level, not a walk of the list), the free-list
    counts once they are bound (whether one more keeps safety is a walk of its ancestors, not
    a replay of them all), and per level how many of the first buddy candidates overlap them
    (a scan for the next starts past those, as the buddy is not changed while a plan is made)."""
    __slots__ = ("after", "cells", "chosen", "covered", "passed")

    def __init__(self, buddy: Buddy, chain: int) -> None:
        self.cells: list[int] = []
        self.chosen: set[int] = set()
        self.covered: set[int] = set()  # the chosen cells and their ancestors
        self.after = CountsAfter(buddy, chain)
        self.passed: dict[int, int] = {}  # level: leading candidates there that overlap

    def add(self, topology: Topology, cell: int) -> None:
        self.cells.append(cell)
        self.chosen.add(cell)
        self.after.add(cell)
        while cell >= 0 and cell not in self.covered:
            self.covered.add(cell)
            cell = topology.parent[cell]

    def overlaps(self, topology: Topology, cell: int) -> bool:
        """Whether `cell` is a planned cell, holds one, or lies inside one."""
        if cell in self.covered:
            return True
        cell = topology.parent[cell]
        while cell >= 0:
            if cell in self.chosen:
                return True
            cell = topology.parent[cell]
        return False


@dataclass(frozen=True, slots=True)
class Request:
    vc: str
    pods: tuple[int, ...]  # GPUs per pod, in pod order

    @property
    def gpus(self) -> int:
        return sum(self.pods)


class Cheapest(Generic[Choice]):
    """Of the choices offered, in order, the one whose GPUs evict least
    (`FreeView.plan_evictions`: lowest highest priority, then fewest GPUs, then fewest gangs);
    the first of equals wins. The view is rolled back after each offer, and `result` takes the
    winner's GPUs in it."""

    __slots__ = ("_best", "_checkpoint", "_view")

    def __init__(self, view: FreeView) -> None:
        self._view = view
        self._checkpoint = view.checkpoint()
        self._best: tuple[Evictions, Choice, list[list[int]]] | None = None

    def offer(self, pods: list[list[int]], choice: Choice) -> bool:
        """Weigh `choice`, whose GPUs `pods` are taken in the view; True when no choice can
        evict less."""
        evictions = self._view.plan_evictions(pods)
        self._view.restore(self._checkpoint)
        if self._best is None or evictions < self._best[0]:
            self._best = (evictions, choice, pods)
        return evictions == NO_EVICTIONS

    def result(self) -> Choice | None:
        if self._best is None:
            return None
        _, choice, pods = self._best
        self._view.take([leaf for pod in pods for leaf in pod])
        return choice


def plan_guaranteed(topology: Topology, buddy: Buddy, view: FreeView, chain: Chain,
                    request: Request, *, least: bool = False) -> Plan | None:
    """A plan for a guaranteed gang on `chain`, its GPUs taken in `view`; with `least` and a
    view that preempts, the one-cell plan that evicts least."""
    least = least and view.preempts
    plan = _one_cell(topology, buddy, view, chain, request, least=least)
    if plan is None:
        plan = _spread(topology, buddy, view, chain, request, least=least)
    return plan


def _one_cell(topology: Topology, buddy: Buddy, view: FreeView, chain: Chain,
              request: Request, *, least: bool = False) -> Plan | None:
    """The whole gang in one cell: levels ascending; at each, the VC's bound cells, then a new
    binding if the VC may bind one there. The first that fits; with `least`, the one of them
    all that evicts least (the first of equals)."""
    cheapest: Cheapest[Plan] | None = Cheapest(view) if least else None
    for cell, bindings in _one_cell_candidates(topology, buddy, view, chain, request):
        pods = fit_in_cell(topology, view, cell, request.pods)
        if pods is None:
            continue
        plan = Plan(chain=chain.index, pods=pods, bindings=bindings)
        if cheapest is None:
            return plan
        if cheapest.offer(pods, plan):
            break
    return None if cheapest is None else cheapest.result()


def _one_cell_candidates(topology: Topology, buddy: Buddy, view: FreeView, chain: Chain,
                         request: Request) -> Iterator[tuple[int, list[int]]]:
    """The cells to try the whole gang in, with the binding each needs: level by level, the
    VC's bound cells (none), then the new bindings it may make there (the cell itself). Lazy:
    each level is ranked on the view as it stands when the search reaches it."""
    need = request.gpus
    unbound = buddy.unbound[request.vc][chain.index]
    bound: dict[int, list[int]] = {}
    for cell in buddy.bound.below(request.vc, chain.index, view.ceiling()):
        level = topology.level[cell]
        if chain.size[level] >= need:
            bound.setdefault(level, []).append(cell)
    levels = sorted({*bound, *(level for level in range(1, chain.top_level + 1)
                               if unbound[level] > 0 and chain.size[level] >= need)})
    for level in levels:
        for cell in _rank_bound(view, bound.get(level, ()), need):
            yield cell, []
        if unbound[level] > 0:
            for cell in _binding_candidates(buddy, view, chain, level, need=need,
                                            planned=Planned(buddy, chain.index),
                                            largest=max(request.pods)):
                yield cell, [cell]


def _rank_bound(view: FreeView, cells: Iterable[int], need: int) -> list[int]:
    """The bound cells with `need` GPUs available: fewest evictions first (under preemption),
    then fewest available (packing), then id."""
    ranked = sorted((view.evictions(cell), available, cell) for cell in cells
                    if (available := view.count(cell)) >= need)
    return [entry[-1] for entry in ranked]


def _binding_candidates(buddy: Buddy, view: FreeView, chain: Chain, level: int, *, need: int,
                        planned: Planned, largest: int = 1) -> Iterator[int]:
    """Cells buddy allocation may bind at `level` with `need` GPUs available (and a node with
    `largest` of them), keeping safety with the bindings already `planned`: healthy cells
    first, then those fewest GPUs of are held (in an unbound cell, by opportunistic gangs), or
    under preemption by fewest evictions then health, stably in buddy order (HiveD sorts bad
    cells last and by fewest opportunistic GPUs, reference/hived.md 1.4).
    Looks at most BUDDY_SCAN_MAX cells (a counter read each) and checks at most
    BUDDY_CANDIDATES_MAX of those with room (a scan each, to rank them, under preemption)."""
    roomy = _roomy_cells(buddy, view, chain, level, need=need, planned=planned,
                         largest=largest)
    size_of = buddy.topology.size_of
    if view.preempts:
        roomy = iter(sorted(roomy, key=lambda cell: (view.evictions(cell), view.has_bad(cell))))
    else:
        roomy = iter(sorted(roomy, key=lambda cell: view.binding_rank(cell, size_of(cell))))
    for cell in roomy:
        if planned.after.feasible_with(cell):
            yield cell


def _roomy_cells(buddy: Buddy, view: FreeView, chain: Chain, level: int, *, need: int,
                 planned: Planned, largest: int = 1) -> Iterator[int]:
    """The first BUDDY_CANDIDATES_MAX bindable cells at `level`, in buddy order among the
    first BUDDY_SCAN_MAX, with `need` GPUs available, a node with `largest` of them (room in
    total is not room for the largest pod: cells that could never hold it had taken every
    place, and a free cell past them was never tried), and apart from the `planned` ones.
    The scan starts past the leading candidates known to overlap a planned cell (they still
    count among the BUDDY_SCAN_MAX): a spread does not walk its own bindings again per pod."""
    topology = buddy.topology
    found = 0
    start = planned.passed.get(level, 0)
    cells = islice(buddy.candidates(chain.index, level, start), BUDDY_SCAN_MAX - start)
    for position, cell in enumerate(cells, start):
        if planned.cells and planned.overlaps(topology, cell):  # none planned: the usual case
            if position == planned.passed.get(level, 0):
                planned.passed[level] = position + 1  # overlaps for good: the next scan skips it
            continue
        if view.unbound_count(cell) < need:
            continue
        if topology.level[cell] > chain.node_level and not any(
                view.unbound_count(node) >= largest
                for node in topology.descendants_at(cell, chain.node_level)):
            continue
        yield cell
        found += 1
        if found == BUDDY_CANDIDATES_MAX:
            return


def _spread(topology: Topology, buddy: Buddy, view: FreeView, chain: Chain,
            request: Request, *, least: bool = False) -> Plan | None:
    """Pod by pod, largest first: into a bound (or newly bound) cell with the fewest GPUs
    available that fit it, else into a new binding at the lowest level that can hold it. The
    cells are ranked once by (level, available GPUs, id) and re-ranked as pods land (a bound
    cell the view offers no GPU of never takes a pod, and is not ranked). With `least`, of the
    first SPREAD_CHOICES_MAX ranked cells that fit the pod and a new binding, the one whose
    GPUs evict least (the first of equals, a new binding last)."""
    checkpoint = view.checkpoint()
    level = topology.level
    ranked = sorted((level[cell], view.count(cell), cell)
                    for cell in buddy.bound.below(request.vc, chain.index, view.ceiling()))
    planned = Planned(buddy, chain.index)
    unbound = list(buddy.unbound[request.vc][chain.index])
    placed: list[list[int]] = [[] for _ in request.pods]
    order = sorted(range(len(request.pods)), key=lambda index: (-request.pods[index], index))
    for position in order:
        need = request.pods[position]
        mark = view.checkpoint()
        cell, leaves = _into_ranked(topology, view, ranked, need,
                                    choices=SPREAD_CHOICES_MAX if least else 1)
        new = leaves is None
        if least and leaves is not None and \
                (evictions := view.plan_evictions((leaves,))) != NO_EVICTIONS:
            view.restore(mark)  # a new binding evicts opportunistic gangs at most: weigh one
            fresh, fresh_leaves = _into_new(buddy, view, chain, need=need, unbound=unbound,
                                            planned=planned)
            if fresh_leaves is not None and view.plan_evictions((fresh_leaves,)) < evictions:
                cell, leaves, new = fresh, fresh_leaves, True
            else:
                view.restore(mark)
                view.take(leaves)
        elif new:
            cell, leaves = _into_new(buddy, view, chain, need=need, unbound=unbound,
                                     planned=planned)
        if leaves is None:
            view.restore(checkpoint)
            return None
        if new:
            planned.add(topology, cell)
            unbound[level[cell]] -= 1
            bisect.insort(ranked, (level[cell], view.count(cell), cell))
        else:
            entry = bisect.bisect_left(ranked, (level[cell], view.count(cell) + need, cell))
            del ranked[entry]
            bisect.insort(ranked, (level[cell], view.count(cell), cell))
        placed[position] = leaves
    return Plan(chain=chain.index, pods=placed, bindings=planned.cells)


def _into_ranked(topology: Topology, view: FreeView, ranked: list[tuple[int, int, int]],
                 need: int, *, choices: int = 1) -> tuple[int, list[int] | None]:
    """The first ranked cell, level by level, with `need` GPUs available that fits the pod;
    with `choices` above 1, of the first `choices` that fit, the one whose GPUs evict least
    (the first of equals). The pod's GPUs are taken in `view`."""
    cheapest: Cheapest[tuple[int, list[int]]] = Cheapest(view)
    tried = 0
    for cell in _ranked_with_room(ranked, need):
        pods = fit_in_cell(topology, view, cell, (need,))
        if pods is None:
            continue
        if choices == 1:
            return cell, pods[0]
        tried += 1
        if cheapest.offer(pods, (cell, pods[0])) or tried == choices:
            break
    return cheapest.result() or (-1, None)


def _ranked_with_room(ranked: list[tuple[int, int, int]], need: int) -> Iterator[int]:
    """The ranked cells with `need` GPUs available, level by level; each level's span found by
    bisection, not by a walk of the list."""
    position = 0
    while position < len(ranked):
        level = ranked[position][0]
        end = bisect.bisect_left(ranked, (level + 1, -1, -1), position)
        for entry in range(bisect.bisect_left(ranked, (level, need, -1), position, end), end):
            yield ranked[entry][2]
        position = end


def _into_new(buddy: Buddy, view: FreeView, chain: Chain, *, need: int, unbound: list[int],
              planned: Planned) -> tuple[int, list[int] | None]:
    """A new binding at the lowest level that can hold the pod, and its GPUs, taken in `view`;
    the caller adds it to `planned` and the `unbound` quota."""
    topology = buddy.topology
    for level in range(1, chain.top_level + 1):
        if unbound[level] <= 0 or chain.size[level] < need:
            continue
        for cell in _binding_candidates(buddy, view, chain, level, need=need,
                                        planned=planned, largest=need):
            pods = fit_in_cell(topology, view, cell, (need,))
            if pods is not None:
                return cell, pods[0]
    return -1, None


def plan_opportunistic(buddy: Buddy, cells: Cells, view: FreeView, chain: Chain,
                       request: Request) -> Plan | None:
    """The smallest cell (node level or above) that fits the whole gang, fewest free GPUs
    first, among the cells with no GPU bound to a tenant, then among the others: HiveD keeps
    opportunistic pods away from guaranteed ones (reference/hived.md 1.5), so a tenant's next
    gang need not evict them. Failing that, the gang spread over the chain's nodes, those with
    no binding first."""
    for bound in (False, True):
        pods = _smallest_fit(buddy, cells, view, chain, request, bound=bound)
        if pods is not None:
            return Plan(chain=chain.index, pods=pods)
    if len(request.pods) == 1:
        return None
    roots = list(cells.indexes[chain.index].at_least(chain.node_level, min(request.pods)))
    apart = [root for root in roots if not buddy.has_binding(root)]
    for nodes in (apart, roots):
        pods = fit_on_roots(buddy.topology, view, sorted(nodes), request.pods)
        if pods is not None:
            return Plan(chain=chain.index, pods=pods)
    return None


def _smallest_fit(buddy: Buddy, cells: Cells, view: FreeView, chain: Chain, request: Request,
                  *, bound: bool) -> list[list[int]] | None:
    """The whole gang in the smallest cell that fits it, levels ascending, fewest free GPUs
    first, among cells that hold a tenant's binding (`bound`) or hold none. Per level it looks
    at FIT_SCAN_MAX cells with room and tries FIT_CANDIDATES_MAX of them."""
    need = request.gpus
    index = cells.indexes[chain.index]
    for level in range(chain.node_level, chain.top_level + 1):
        if chain.size[level] < need:
            continue
        roomy = islice(index.at_least(level, need), FIT_SCAN_MAX)
        matching = (cell for cell in roomy if buddy.has_binding(cell) == bound)
        for cell in islice(matching, FIT_CANDIDATES_MAX):
            pods = fit_in_cell(buddy.topology, view, cell, request.pods)
            if pods is not None:
                return pods
    return None
