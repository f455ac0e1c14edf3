"""The bound-cell index answers what a scan of every bound cell would.

Goal: a guaranteed gang's search looks only at the bound cells `BoundIndex.below` names, so it
must name exactly the VC's bound cells on the chain with a usable GPU whose holder and reserver
priorities are both below the ceiling. Method: random bindings, unbindings and changes of GPU
usability and priorities in any order, each answer compared with a scan of the bound cells the
test keeps itself.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from statemachine.bound_index import FREE_CEILING, UNUSABLE, BoundIndex
from statemachine.limits import FREE_PRIORITY, OPPORTUNISTIC_PRIORITY, PRIORITY_MAX
from statemachine.topology import Topology
from tests.statemachine.builders import rack_spec

TOPOLOGY = Topology(rack_spec(racks=2))
PRIORITIES = (FREE_PRIORITY, OPPORTUNISTIC_PRIORITY, 0, 5, PRIORITY_MAX)
CEILINGS = (FREE_CEILING, OPPORTUNISTIC_PRIORITY + 1, 5, 6, PRIORITY_MAX, UNUSABLE)
BIND, UNBIND, CHANGE = range(3)


class Gpus:
    """The per-GPU arrays the index reads, as `cells` keeps them."""

    def __init__(self) -> None:
        count = TOPOLOGY.cell_count
        self.usable = [False] * count
        self.held = [FREE_PRIORITY] * count
        self.reserved = [FREE_PRIORITY] * count

    def offers(self, leaf: int, ceiling: int) -> bool:
        return self.usable[leaf] and self.held[leaf] < ceiling and self.reserved[leaf] < ceiling


def scanned(gpus: Gpus, bound: dict[int, str], vc: str, chain: int, ceiling: int) -> list[int]:
    return sorted(cell for cell, owner in bound.items()
                  if owner == vc and TOPOLOGY.chain_of[cell] == chain
                  and any(gpus.offers(leaf, ceiling) for leaf in TOPOLOGY.leaves(cell)))


def overlaps(cell: int, bound: dict[int, str]) -> bool:
    leaves = TOPOLOGY.leaves(cell)
    return any(leaves.start < other.stop and other.start < leaves.stop
               for other in map(TOPOLOGY.leaves, bound))


STEP = st.tuples(st.sampled_from((BIND, UNBIND, CHANGE)), st.integers(0, TOPOLOGY.cell_count - 1),
                 st.sampled_from(TOPOLOGY.vc_names), st.booleans(), st.sampled_from(PRIORITIES),
                 st.sampled_from(PRIORITIES))


@given(st.lists(STEP, max_size=60))
def test_below_names_the_bound_cells_a_scan_finds(
        steps: list[tuple[int, int, str, bool, int, int]]) -> None:
    gpus = Gpus()
    index = BoundIndex(TOPOLOGY, gpus.usable, gpus.held, gpus.reserved)
    bound: dict[int, str] = {}
    for action, cell, vc, usable, held, reserved in steps:
        if action == BIND and not overlaps(cell, bound):
            index.bind(cell, vc)
            bound[cell] = vc
        elif action == UNBIND and cell in bound:
            index.unbind(cell)
            del bound[cell]
        elif action == CHANGE:
            leaves = TOPOLOGY.leaves(cell)
            for leaf in leaves:
                gpus.usable[leaf], gpus.held[leaf], gpus.reserved[leaf] = usable, held, reserved
            index.refresh(leaves)
        for owner in TOPOLOGY.vc_names:
            for chain in TOPOLOGY.chains:
                for ceiling in CEILINGS:
                    assert index.below(owner, chain.index, ceiling) == scanned(
                        gpus, bound, owner, chain.index, ceiling)
