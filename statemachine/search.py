"""Placement search: a plan (which GPUs for each pod, which cells to bind, whom to evict) for one
gang on one chain, computed on a read-only state.

Guaranteed gangs (priority 0..1000) run inside their tenant's cells: cells already bound to the
VC, or new ones bound by buddy allocation from the VC's unbound quota, each binding checked for
safety first. The search tries to pack the whole gang into one cell, smallest level first (bound
cells before new bindings, fewest free GPUs first); only a gang too big for any one cell is
spread pod by pod over several. Opportunistic gangs (-1) take free GPUs anywhere on the chain,
in the smallest cell that fits, found through the best-fit index.

All loops are bounded: at most `BUDDY_CANDIDATES_MAX` binding candidates and
`FIT_CANDIDATES_MAX` cells per level are tried.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice

from statemachine.buddy import Buddy
from statemachine.cells import Cells
from statemachine.fit import FreeView, fit_in_cell, fit_on_roots
from statemachine.limits import BUDDY_CANDIDATES_MAX, FIT_CANDIDATES_MAX
from statemachine.topology import Chain, Topology


@dataclass(slots=True)
class Plan:
    chain: int
    pods: list[list[int]]  # GPUs (leaf ids) per pod, in the gang's pod order
    bindings: list[int] = field(default_factory=list)  # cells to bind to the gang's VC
    victims: list[str] = field(default_factory=list)  # holders to evict, sorted
    cancelled: list[str] = field(default_factory=list)  # preemptors whose GPUs it takes, sorted


@dataclass(frozen=True, slots=True)
class Request:
    vc: str
    pods: tuple[int, ...]  # GPUs per pod, in pod order

    @property
    def gpus(self) -> int:
        return sum(self.pods)


def plan_guaranteed(topology: Topology, buddy: Buddy, view: FreeView, chain: Chain,
                    request: Request) -> Plan | None:
    plan = _one_cell(topology, buddy, view, chain, request)
    if plan is None:
        plan = _spread(topology, buddy, view, chain, request)
    return plan


def _containers(buddy: Buddy, chain: Chain, vc: str) -> list[tuple[int, int]]:
    """(level, cell) for the VC's bound cells, and (level, -1) for each level where it may
    bind one more: ascending level, bound cells before a new binding at the same level."""
    found = [(buddy.topology.level[cell], cell) for cell in buddy.bound_cells[vc][chain.index]]
    unbound = buddy.unbound[vc][chain.index]
    found += [(level, -1) for level in range(1, chain.top_level + 1) if unbound[level] > 0]
    found.sort(key=lambda entry: (entry[0], entry[1] < 0, entry[1]))
    return found


def _one_cell(topology: Topology, buddy: Buddy, view: FreeView, chain: Chain,
              request: Request) -> Plan | None:
    need = request.gpus
    containers = _containers(buddy, chain, request.vc)
    levels = sorted({level for level, _ in containers if chain.size[level] >= need})
    for level in levels:
        bound = sorted((view.count(cell), cell) for cell_level, cell in containers
                       if cell_level == level and cell >= 0)
        for available, cell in bound:
            if available >= need:
                pods = fit_in_cell(topology, view, cell, request.pods)
                if pods is not None:
                    return Plan(chain=chain.index, pods=pods)
        if buddy.unbound[request.vc][chain.index][level] > 0:
            for cell in _binding_candidates(buddy, view, chain, level, need=need, planned=[]):
                pods = fit_in_cell(topology, view, cell, request.pods)
                if pods is not None:
                    return Plan(chain=chain.index, pods=pods, bindings=[cell])
    return None


def _binding_candidates(buddy: Buddy, view: FreeView, chain: Chain, level: int, *, need: int,
                        planned: list[int]) -> Iterator[int]:
    """Cells buddy allocation may bind at `level` with `need` GPUs available, keeping safety
    with the bindings already `planned`; at most BUDDY_CANDIDATES_MAX are looked at."""
    topology = buddy.topology
    for cell in islice(buddy.candidates(chain.index, level), BUDDY_CANDIDATES_MAX):
        if view.count(cell) < need:
            continue
        if any(_nested(topology, cell, other) for other in planned):
            continue
        if buddy.feasible_after(chain.index, [*planned, cell]):
            yield cell


def _nested(topology: Topology, first: int, second: int) -> bool:
    """Whether one of the two cells contains the other (or they are the same)."""
    if topology.level[first] < topology.level[second]:
        first, second = second, first
    leaves = topology.leaves(first)
    return topology.first_leaf[second] in leaves


def _spread(topology: Topology, buddy: Buddy, view: FreeView, chain: Chain,
            request: Request) -> Plan | None:
    """Pod by pod, largest first: into a bound (or newly bound) cell with the fewest GPUs
    available that fit it, else into a new binding at the lowest level that can hold it."""
    checkpoint = view.checkpoint()
    vc = request.vc
    bound = list(buddy.bound_cells[vc][chain.index])
    planned: list[int] = []
    unbound = list(buddy.unbound[vc][chain.index])
    placed: list[list[int]] = [[] for _ in request.pods]
    order = sorted(range(len(request.pods)), key=lambda index: (-request.pods[index], index))
    for position in order:
        need = request.pods[position]
        leaves = _into_bound(topology, view, [*bound, *planned], need)
        if leaves is None:
            leaves = _into_new(buddy, view, chain, need=need, unbound=unbound, planned=planned)
        if leaves is None:
            view.restore(checkpoint)
            return None
        placed[position] = leaves
    return Plan(chain=chain.index, pods=placed, bindings=planned)


def _into_bound(topology: Topology, view: FreeView, cells: list[int],
                need: int) -> list[int] | None:
    ranked = sorted((topology.level[cell], view.count(cell), cell) for cell in cells)
    for _, available, cell in ranked:
        if available >= need:
            pods = fit_in_cell(topology, view, cell, (need,))
            if pods is not None:
                return pods[0]
    return None


def _into_new(buddy: Buddy, view: FreeView, chain: Chain, *, need: int, unbound: list[int],
              planned: list[int]) -> list[int] | None:
    topology = buddy.topology
    for level in range(1, chain.top_level + 1):
        if unbound[level] <= 0 or chain.size[level] < need:
            continue
        for cell in _binding_candidates(buddy, view, chain, level, need=need,
                                        planned=planned):
            pods = fit_in_cell(topology, view, cell, (need,))
            if pods is not None:
                planned.append(cell)
                unbound[level] -= 1
                return pods[0]
    return None


def plan_opportunistic(topology: Topology, cells: Cells, view: FreeView, chain: Chain,
                       request: Request) -> Plan | None:
    """The smallest cell (node level or above) that fits the whole gang, fewest free GPUs
    first; failing that, the gang spread over the chain's nodes."""
    need = request.gpus
    index = cells.indexes[chain.index]
    for level in range(chain.node_level, chain.top_level + 1):
        if chain.size[level] < need:
            continue
        for cell in islice(index.at_least(level, need), FIT_CANDIDATES_MAX):
            pods = fit_in_cell(topology, view, cell, request.pods)
            if pods is not None:
                return Plan(chain=chain.index, pods=pods)
    if len(request.pods) == 1:
        return None
    roots = list(index.at_least(chain.node_level, min(request.pods)))
    pods = fit_on_roots(topology, view, sorted(roots), request.pods)
    return None if pods is None else Plan(chain=chain.index, pods=pods)
