"""Validation of a cluster configuration, with an error that names the offending path.

`check_spec` either returns the `Topology` built from the spec or raises a `Refusal`:
CONFIG_INVALID with a message "path: reason" (`cell_types[3].child: unknown cell type or GPU
model 'X'`), or ASSIGNMENT_INFEASIBLE naming the chain, the cell type, the cells needed and the
cells available. The feasibility check is HiveD's start-up check (reference/hived.md 1.5): walk
each chain from the top, available(top) = top cells, left = available - demand >= 0,
available(level below) = left * fan-out.
"""

from __future__ import annotations

from consensus.envelope import is_principal_name
from statemachine import limits
from statemachine.errors import Code, refuse
from statemachine.spec import (
    CellTypeSpec,
    ClusterSpec,
    PolicySpec,
    VirtualClusterSpec,
)
from statemachine.topology import Topology


def check_spec(spec: ClusterSpec) -> Topology:
    models = _check_models(spec)
    types = _check_types(spec, models)
    nodes_per_top = _check_chains(spec, types, models)
    _check_physical_cells(spec, nodes_per_top)
    _check_virtual_clusters(spec, types, nodes_per_top)
    _check_policy(spec.policy)
    topology = Topology(spec)
    _check_feasible(topology)
    return topology


def _invalid(path: str, reason: str) -> Exception:
    return refuse(Code.CONFIG_INVALID, f"{path}: {reason}")


def _check_name(value: str, path: str) -> None:
    if not value:
        raise _invalid(path, "must not be empty")
    if len(value) > limits.NAME_LENGTH_MAX:
        raise _invalid(path, f"longer than {limits.NAME_LENGTH_MAX} characters")


def _check_models(spec: ClusterSpec) -> set[str]:
    if not spec.gpu_models:
        raise _invalid("gpu_models", "at least one GPU model is needed")
    names: set[str] = set()
    for index, model in enumerate(spec.gpu_models):
        path = f"gpu_models[{index}]"
        _check_name(model.name, f"{path}.name")
        if model.name in names:
            raise _invalid(f"{path}.name", f"duplicate GPU model {model.name!r}")
        if model.memory_mib <= 0:
            raise _invalid(f"{path}.memory_mib", "must be positive")
        names.add(model.name)
    return names


def _check_types(spec: ClusterSpec, models: set[str]) -> dict[str, CellTypeSpec]:
    types: dict[str, CellTypeSpec] = {}
    for index, cell_type in enumerate(spec.cell_types):
        path = f"cell_types[{index}]"
        _check_name(cell_type.name, f"{path}.name")
        if cell_type.name in types or cell_type.name in models:
            raise _invalid(f"{path}.name", f"duplicate cell type {cell_type.name!r}")
        if not 1 <= cell_type.child_count <= limits.FANOUT_MAX:
            raise _invalid(f"{path}.child_count", f"must lie in [1, {limits.FANOUT_MAX}]")
        types[cell_type.name] = cell_type
    for index, cell_type in enumerate(spec.cell_types):
        if cell_type.child not in types and cell_type.child not in models:
            raise _invalid(f"cell_types[{index}].child",
                           f"unknown cell type or GPU model {cell_type.child!r}")
        _check_path(cell_type, types, index)
    return types


def _check_path(cell_type: CellTypeSpec, types: dict[str, CellTypeSpec], index: int) -> None:
    """From `cell_type` down to its GPU model: no cycle, bounded depth, one node level at most."""
    seen = [cell_type.name]
    node_levels = int(cell_type.node_level)
    current = cell_type
    while current.child in types:
        current = types[current.child]
        if current.name in seen:
            raise _invalid(f"cell_types[{index}].child",
                           f"cycle through {' > '.join([*seen, current.name])}")
        seen.append(current.name)
        node_levels += int(current.node_level)
        if len(seen) >= limits.LEVELS_MAX:
            raise _invalid(f"cell_types[{index}]", f"more than {limits.LEVELS_MAX} levels")
    if node_levels > 1:
        raise _invalid(f"cell_types[{index}]",
                       f"more than one node-level type below {cell_type.name!r}")


def _check_chains(spec: ClusterSpec, types: dict[str, CellTypeSpec],
                  models: set[str]) -> dict[str, tuple[int, int, int]]:
    """Per top type: (nodes per physical cell, GPUs per node, cells per physical cell)."""
    shapes: dict[str, tuple[int, int, int]] = {}
    for index, cell in enumerate(spec.physical_cells):
        path = f"physical_cells[{index}].cell_type"
        if cell.cell_type in shapes:
            continue
        if cell.cell_type in models:
            raise _invalid(path, "a physical cell must be node level or higher, not a GPU")
        if cell.cell_type not in types:
            raise _invalid(path, f"unknown cell type {cell.cell_type!r}")
        nodes, gpus, found = 1, 1, False
        width, cells = 1, 1
        current: CellTypeSpec | None = types[cell.cell_type]
        while current is not None:
            width *= current.child_count
            cells += width
            if found:
                gpus *= current.child_count
            else:
                nodes *= 1 if current.node_level else current.child_count
            if current.node_level:
                found = True
                gpus = current.child_count
            current = types.get(current.child)
        if not found:
            raise _invalid(path, f"no node-level type on chain {cell.cell_type!r}")
        if gpus > limits.GPUS_PER_NODE_MAX:
            raise _invalid(path, f"{gpus} GPUs per node, more than {limits.GPUS_PER_NODE_MAX}")
        shapes[cell.cell_type] = (nodes, gpus, cells)
    return shapes


def _check_physical_cells(spec: ClusterSpec, shapes: dict[str, tuple[int, int, int]]) -> None:
    if not spec.physical_cells:
        raise _invalid("physical_cells", "at least one physical cell is needed")
    if len(spec.physical_cells) > limits.PHYSICAL_CELLS_MAX:
        raise _invalid("physical_cells", f"more than {limits.PHYSICAL_CELLS_MAX} cells")
    seen: dict[str, str] = {}
    cells_total = 0
    for index, cell in enumerate(spec.physical_cells):
        path = f"physical_cells[{index}]"
        nodes, _, cells = shapes[cell.cell_type]
        if len(cell.nodes) != nodes:
            raise _invalid(f"{path}.nodes",
                           f"a {cell.cell_type} holds {nodes} nodes, {len(cell.nodes)} listed")
        for position, node in enumerate(cell.nodes):
            _check_name(node, f"{path}.nodes[{position}]")
            if not is_principal_name(node):  # its agent's certificate names it
                raise _invalid(f"{path}.nodes[{position}]",
                               f"node {node!r}: letters, digits, '.', '_' and '-' only, "
                               f"starting with a letter or digit (a certificate names it)")
            if node in seen:
                raise _invalid(f"{path}.nodes[{position}]",
                               f"node {node!r} already listed at {seen[node]}")
            seen[node] = f"{path}.nodes[{position}]"
        cells_total += cells
        if cells_total > limits.CELLS_MAX:
            raise _invalid(path, f"more than {limits.CELLS_MAX} cells in all")
    if len(seen) > limits.NODES_MAX:
        raise _invalid("physical_cells", f"more than {limits.NODES_MAX} nodes")


def _check_virtual_clusters(spec: ClusterSpec, types: dict[str, CellTypeSpec],
                            shapes: dict[str, tuple[int, int, int]]) -> None:
    names: set[str] = set()
    for index, vc in enumerate(spec.virtual_clusters):
        path = f"virtual_clusters[{index}]"
        _check_name(vc.name, f"{path}.name")
        if vc.name in names:
            raise _invalid(f"{path}.name", f"duplicate virtual cluster {vc.name!r}")
        names.add(vc.name)
        _check_quota(vc, path, types, shapes)


def _check_quota(vc: VirtualClusterSpec, path: str, types: dict[str, CellTypeSpec],
                 shapes: dict[str, tuple[int, int, int]]) -> None:
    seen: set[tuple[str, str]] = set()
    for position, entry in enumerate(vc.quota):
        where = f"{path}.quota[{position}]"
        if entry.chain not in shapes:
            raise _invalid(f"{where}.chain", f"no physical cell has type {entry.chain!r}")
        chain_types = []
        current: CellTypeSpec | None = types[entry.chain]
        while current is not None:
            chain_types.append(current.name)
            current = types.get(current.child)
        if entry.cell_type not in chain_types:
            raise _invalid(f"{where}.cell_type",
                           f"{entry.cell_type!r} is not a cell type of chain {entry.chain!r} "
                           f"(one of {', '.join(chain_types)})")
        if entry.count < 1:
            raise _invalid(f"{where}.count", "must be positive")
        if (entry.chain, entry.cell_type) in seen:
            raise _invalid(where, f"{entry.chain}/{entry.cell_type} listed twice")
        seen.add((entry.chain, entry.cell_type))


def _check_policy(policy: PolicySpec) -> None:
    for name in ("lease_ms", "down_after_ms", "preemption_grace_ms", "session_ttl_ms",
                 "recover_reports", "schedule_attempts_max"):
        value = getattr(policy, name)
        if not 1 <= value <= limits.DURATION_MS_MAX:
            raise _invalid(f"policy.{name}", f"must lie in [1, {limits.DURATION_MS_MAX}]")
    if policy.session_ttl_ms < limits.SESSION_TTL_MS_MIN:
        raise _invalid("policy.session_ttl_ms",
                       f"must be at least {limits.SESSION_TTL_MS_MIN} (limits.py says why)")
    if policy.schedule_attempts_max > limits.SCHEDULE_ATTEMPTS_MAX:
        raise _invalid("policy.schedule_attempts_max",
                       f"more than {limits.SCHEDULE_ATTEMPTS_MAX}")


def _check_feasible(topology: Topology) -> None:
    for chain in topology.chains:
        available = chain.level_count[chain.top_level]
        for level in range(chain.top_level, 0, -1):
            demand = sum(topology.quota[vc][chain.index][level] for vc in topology.vc_names)
            if demand > available:
                raise refuse(Code.ASSIGNMENT_INFEASIBLE,
                             f"chain {chain.name}: {demand} {chain.type_names[level]} cells "
                             f"guaranteed, {available} available")
            if level > 1:
                available = (available - demand) * chain.fanout[level]
