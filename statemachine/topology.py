"""The static cell tree derived from a validated configuration: ids, levels, chains, nodes.

Cells are numbered breadth-first, chain by chain in configuration order, top level first. That
numbering makes every level of a chain a contiguous id range, the children of a cell a contiguous
range, and the leaves (GPUs) under any cell a contiguous range too; id order is address order, so
"sorted by id" is the canonical order everywhere (free lists, candidates, snapshots).

Levels count from the leaf: a GPU is level 1. The topology never changes after it is built; the
dynamic state (who holds what, what is free) lives in `cells` and `buddy`, indexed by these ids.
"""

from __future__ import annotations

from dataclasses import dataclass

from statemachine.spec import ClusterSpec


@dataclass(frozen=True, slots=True)
class Chain:
    """All physical cells whose top type is `name`; one buddy system with its own free lists.

    Tuples indexed by level (index 0 unused): `type_names[l]`, `fanout[l]` (children of a
    level-l cell; 0 for leaves), `size[l]` (GPUs under a level-l cell), `level_start[l]` and
    `level_count[l]` (the id range of the level)."""

    index: int
    name: str
    gpu_model: str
    top_level: int
    node_level: int
    type_names: tuple[str, ...]
    fanout: tuple[int, ...]
    size: tuple[int, ...]
    level_start: tuple[int, ...]
    level_count: tuple[int, ...]

    def level_of_type(self, type_name: str) -> int:
        """The level of `type_name` on this chain, or 0 when the chain has no such type."""
        for level in range(1, self.top_level + 1):
            if self.type_names[level] == type_name:
                return level
        return 0

    def cells_at(self, level: int) -> range:
        start = self.level_start[level]
        return range(start, start + self.level_count[level])


class Topology:
    """Parallel arrays indexed by cell id, plus the chain and node tables."""

    __slots__ = (
        "address",
        "chain_by_name",
        "chain_of",
        "chains",
        "first_child",
        "first_leaf",
        "level",
        "node_cell",
        "node_chain",
        "node_ids",
        "node_index",
        "node_of",
        "parent",
        "quota",
        "vc_names",
    )

    def __init__(self, spec: ClusterSpec) -> None:
        self.chains: tuple[Chain, ...] = _chains(spec)
        self.chain_by_name = {chain.name: chain for chain in self.chains}
        self.level: list[int] = []
        self.chain_of: list[int] = []
        self.parent: list[int] = []
        self.first_child: list[int] = []
        self.first_leaf: list[int] = []
        self.node_of: list[int] = []
        self.address: list[str] = []
        self.node_ids: list[str] = []
        self.node_cell: list[int] = []
        self.node_chain: list[int] = []
        for chain in self.chains:
            _number_chain(self, chain, spec)
        self.node_index = {node: index for index, node in enumerate(self.node_ids)}
        self.vc_names: tuple[str, ...] = tuple(sorted(vc.name for vc in spec.virtual_clusters))
        self.quota: dict[str, tuple[tuple[int, ...], ...]] = _quota(spec, self.chains)

    @property
    def cell_count(self) -> int:
        return len(self.level)

    def chain_for(self, cell: int) -> Chain:
        return self.chains[self.chain_of[cell]]

    def size_of(self, cell: int) -> int:
        return self.chains[self.chain_of[cell]].size[self.level[cell]]

    def children(self, cell: int) -> range:
        chain = self.chains[self.chain_of[cell]]
        first = self.first_child[cell]
        return range(first, first + chain.fanout[self.level[cell]])

    def leaves(self, cell: int) -> range:
        first = self.first_leaf[cell]
        return range(first, first + self.size_of(cell))

    def ancestors(self, cell: int) -> list[int]:
        """The strict ancestors of `cell`, nearest first."""
        found = []
        parent = self.parent[cell]
        while parent >= 0:
            found.append(parent)
            parent = self.parent[parent]
        return found

    def descendants_at(self, cell: int, level: int) -> range:
        """The cells at `level` (at or below the cell's own) inside `cell`, as an id range."""
        chain = self.chains[self.chain_of[cell]]
        own = self.level[cell]
        assert 1 <= level <= own
        ratio = chain.size[own] // chain.size[level]
        offset = cell - chain.level_start[own]
        start = chain.level_start[level] + offset * ratio
        return range(start, start + ratio)

    def gpu_index(self, leaf: int) -> int:
        """The GPU's index within its node (the NVML index the agent registers)."""
        assert self.level[leaf] == 1
        return leaf - self.first_leaf[self.node_cell[self.node_of[leaf]]]

    def leaf_of(self, node: int, gpu_index: int) -> int:
        return self.first_leaf[self.node_cell[node]] + gpu_index

    def node_gpu_count(self, node: int) -> int:
        return self.size_of(self.node_cell[node])


def _chains(spec: ClusterSpec) -> tuple[Chain, ...]:
    types = {cell_type.name: cell_type for cell_type in spec.cell_types}
    tops: list[str] = []
    counts: dict[str, int] = {}
    for cell in spec.physical_cells:
        if cell.cell_type not in counts:
            tops.append(cell.cell_type)
            counts[cell.cell_type] = 0
        counts[cell.cell_type] += 1
    chains = []
    next_id = 0
    for index, top in enumerate(tops):
        path = [top]
        while path[-1] in types:
            path.append(types[path[-1]].child)
        names = ("", *reversed(path))
        top_level = len(path)
        fanout = [0, 0] + [types[names[level]].child_count for level in range(2, top_level + 1)]
        size = [0, 1]
        for level in range(2, top_level + 1):
            size.append(size[-1] * fanout[level])
        level_count = [0] * (top_level + 1)
        level_count[top_level] = counts[top]
        for level in range(top_level - 1, 0, -1):
            level_count[level] = level_count[level + 1] * fanout[level + 1]
        level_start = [0] * (top_level + 1)
        for level in range(top_level, 0, -1):
            level_start[level] = next_id
            next_id += level_count[level]
        node_level = next(level for level in range(2, top_level + 1)
                          if types[names[level]].node_level)
        chains.append(Chain(index=index, name=top, gpu_model=names[1], top_level=top_level,
                            node_level=node_level, type_names=names, fanout=tuple(fanout),
                            size=tuple(size), level_start=tuple(level_start),
                            level_count=tuple(level_count)))
    return tuple(chains)


def _number_chain(topology: Topology, chain: Chain, spec: ClusterSpec) -> None:
    """Fill the per-cell arrays for one chain, top level first (ids are allocated in order)."""
    assert len(topology.level) == chain.level_start[chain.top_level]
    tops = [cell for cell in spec.physical_cells if cell.cell_type == chain.name]
    node_names = [node for cell in tops for node in cell.nodes]
    for level in range(chain.top_level, 0, -1):
        first_below = chain.level_start[level - 1] if level > 1 else -1
        for offset in range(chain.level_count[level]):
            cell = chain.level_start[level] + offset
            assert cell == len(topology.level)
            parent = -1
            if level < chain.top_level:
                parent = chain.level_start[level + 1] + offset // chain.fanout[level + 1]
            topology.level.append(level)
            topology.chain_of.append(chain.index)
            topology.parent.append(parent)
            topology.first_child.append(first_below + offset * chain.fanout[level]
                                        if level > 1 else -1)
            topology.first_leaf.append(chain.level_start[1] + offset * chain.size[level])
            node = _node_of(topology, chain, level, offset=offset, parent=parent,
                            chain_nodes=len(node_names))
            topology.node_of.append(node)
            topology.address.append(_address(topology, chain, level, offset=offset,
                                             parent=parent, node_names=node_names))
            if level == chain.node_level:
                topology.node_ids.append(node_names[offset])
                topology.node_cell.append(cell)
                topology.node_chain.append(chain.index)


def _node_of(topology: Topology, chain: Chain, level: int, *, offset: int, parent: int,
             chain_nodes: int) -> int:
    if level > chain.node_level:
        return -1
    if level == chain.node_level:
        assert offset < chain_nodes
        return len(topology.node_ids)
    return topology.node_of[parent]


def _address(topology: Topology, chain: Chain, level: int, *, offset: int, parent: int,
             node_names: list[str]) -> str:
    if level == chain.node_level:
        return node_names[offset]
    if level == chain.top_level:
        return f"{chain.name}.{offset}"
    index = offset % chain.fanout[level + 1]
    return f"{topology.address[parent]}/{index}"


def _quota(spec: ClusterSpec, chains: tuple[Chain, ...]) -> dict[str, tuple[tuple[int, ...],
                                                                          ...]]:
    """Guaranteed cells per VC, per chain, per level: `quota[vc][chain][level]`."""
    by_name = {chain.name: chain for chain in chains}
    quota: dict[str, tuple[tuple[int, ...], ...]] = {}
    for vc in sorted(spec.virtual_clusters, key=lambda vc: vc.name):
        table = [[0] * (chain.top_level + 1) for chain in chains]
        for entry in vc.quota:
            chain = by_name[entry.chain]
            table[chain.index][chain.level_of_type(entry.cell_type)] += entry.count
        quota[vc.name] = tuple(tuple(row) for row in table)
    return quota
