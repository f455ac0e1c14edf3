"""ApplyConfig: every validation rule refuses with the offending path, the version is checked,
feasibility follows HiveD's start-up walk, and a reconfiguration keeps live gangs (downgrading
those that no longer fit their tenant) or is refused when it would strand them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from statemachine.commands import ApplyConfig
from statemachine.effects import EffectKind
from statemachine.errors import Code
from statemachine.results import ConfigApplied, GroupPhase, Result
from statemachine.spec import (
    CellTypeSpec,
    ClusterSpec,
    GpuModelSpec,
    PhysicalCellSpec,
    PolicySpec,
    QuotaSpec,
    VirtualClusterSpec,
)
from statemachine.topology import Topology
from tests.statemachine.builders import A100_TYPES, ADMIN, SCHEDULER, Driver, gang, rack_spec, vc
from tests.statemachine.test_scenarios import effects, started

BASE = rack_spec()


def refused(spec: ClusterSpec, code: Code = Code.CONFIG_INVALID) -> str:
    driver = Driver()
    return driver.rejected(ApplyConfig(expected_version=0, spec=spec), ADMIN, code).message


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (replace(BASE, gpu_models=()), "gpu_models: at least one GPU model is needed"),
        (replace(BASE, gpu_models=(GpuModelSpec(name="A100", memory_mib=0),)),
         "gpu_models[0].memory_mib: must be positive"),
        (replace(BASE, cell_types=(*A100_TYPES, CellTypeSpec(name="A100-SW", child="A100",
                                                             child_count=2))),
         "cell_types[4].name: duplicate cell type 'A100-SW'"),
        (replace(BASE, cell_types=(CellTypeSpec(name="A100-SW", child="H100", child_count=2),
                                   *A100_TYPES[1:])),
         "cell_types[0].child: unknown cell type or GPU model 'H100'"),
        (replace(BASE, cell_types=(CellTypeSpec(name="A100-SW", child="A100", child_count=0),
                                   *A100_TYPES[1:])),
         "cell_types[0].child_count: must lie in [1, 4096]"),
        (replace(BASE, cell_types=(CellTypeSpec(name="X", child="Y", child_count=2),
                                   CellTypeSpec(name="Y", child="X", child_count=2),
                                   *A100_TYPES)),
         "cell_types[0].child: cycle through X > Y > X"),
        (replace(BASE, cell_types=(CellTypeSpec(name="A100-SW", child="A100", child_count=2,
                                                node_level=True), *A100_TYPES[1:])),
         "cell_types[2]: more than one node-level type below 'A100-NODE'"),
        (replace(BASE, physical_cells=()), "physical_cells: at least one physical cell"),
        (replace(BASE, physical_cells=(PhysicalCellSpec(cell_type="A100-SW", nodes=("x",)),)),
         "physical_cells[0].cell_type: no node-level type on chain 'A100-SW'"),
        (replace(BASE, physical_cells=(PhysicalCellSpec(cell_type="A100", nodes=("x",)),)),
         "physical_cells[0].cell_type: a physical cell must be node level or higher"),
        (replace(BASE, physical_cells=(PhysicalCellSpec(cell_type="RACK", nodes=("x",)),)),
         "physical_cells[0].cell_type: unknown cell type 'RACK'"),
        (replace(BASE, physical_cells=(PhysicalCellSpec(cell_type="A100-RACK",
                                                        nodes=("x",)),)),
         "physical_cells[0].nodes: a A100-RACK holds 2 nodes, 1 listed"),
        (replace(BASE, physical_cells=(PhysicalCellSpec(cell_type="A100-RACK",
                                                        nodes=("x", "x")),)),
         "physical_cells[0].nodes[1]: node 'x' already listed at physical_cells[0].nodes[0]"),
        (replace(BASE, physical_cells=(PhysicalCellSpec(cell_type="A100-RACK",
                                                        nodes=("x", "rack1/n1")),)),
         "physical_cells[0].nodes[1]: node 'rack1/n1': letters, digits, '.', '_' and '-'"),
        (replace(BASE, physical_cells=(PhysicalCellSpec(cell_type="A100-RACK",
                                                        nodes=("-x", "y")),)),
         "physical_cells[0].nodes[0]: node '-x': letters, digits"),
        (replace(BASE, virtual_clusters=(vc("a"), vc("a"))),
         "virtual_clusters[1].name: duplicate virtual cluster 'a'"),
        (replace(BASE, virtual_clusters=(vc("a", ("T4-NODE", "T4-NODE", 1)),)),
         "virtual_clusters[0].quota[0].chain: no physical cell has type 'T4-NODE'"),
        (replace(BASE, virtual_clusters=(vc("a", ("A100-RACK", "T4", 1)),)),
         "virtual_clusters[0].quota[0].cell_type: 'T4' is not a cell type of chain "
         "'A100-RACK'"),
        (replace(BASE, virtual_clusters=(vc("a", ("A100-RACK", "A100-NODE", 0)),)),
         "virtual_clusters[0].quota[0].count: must be positive"),
        (replace(BASE, policy=PolicySpec(lease_ms=0)), "policy.lease_ms: must lie in"),
        (replace(BASE, policy=PolicySpec(session_ttl_ms=599_999)),
         "policy.session_ttl_ms: must be at least 600000"),
        (replace(BASE, cell_types=(
            CellTypeSpec(name="L0", child="A100", child_count=64, node_level=True),
            *(CellTypeSpec(name=f"L{level}", child=f"L{level - 1}", child_count=1)
              for level in range(1, 14)),
            CellTypeSpec(name="TOP", child="L13", child_count=4096)),
            physical_cells=tuple(PhysicalCellSpec(cell_type="TOP", nodes=tuple(
                f"x{cell}-{node}" for node in range(4096))) for cell in range(4)),
            virtual_clusters=()),
         "physical_cells[3]: more than 1048576 cells in all"),
    ],
)
def test_invalid_configurations_name_the_path(spec: ClusterSpec, message: str) -> None:
    assert refused(spec).startswith(message)


def test_an_infeasible_assignment_names_chain_type_and_counts() -> None:
    spec = rack_spec(racks=2, quota=(vc("a", ("A100-RACK", "A100-RACK", 1)),
                                     vc("b", ("A100-RACK", "A100-NODE", 3))))
    assert refused(spec, Code.ASSIGNMENT_INFEASIBLE) == (
        "chain A100-RACK: 3 A100-NODE cells guaranteed, 2 available")


def test_a_stale_expected_version_is_refused_and_changes_nothing() -> None:
    driver = Driver()
    driver.configure(BASE)
    before = driver.state.config
    message = driver.rejected(ApplyConfig(expected_version=0, spec=BASE), ADMIN,
                              Code.VERSION_MISMATCH).message
    assert message == "expected version 0, current is 1"
    assert driver.state.config is before


def test_only_an_admin_may_configure() -> None:
    Driver().rejected(ApplyConfig(expected_version=0, spec=BASE), SCHEDULER, Code.UNAUTHORIZED)


def test_chains_levels_and_addresses_follow_the_spec() -> None:
    t4 = (CellTypeSpec(name="T4-NODE", child="T4", child_count=4, node_level=True),)
    spec = replace(BASE, gpu_models=(*BASE.gpu_models, GpuModelSpec(name="T4", memory_mib=1)),
                   cell_types=(*A100_TYPES, *t4),
                   physical_cells=(*BASE.physical_cells,
                                   PhysicalCellSpec(cell_type="T4-NODE", nodes=("t0",))))
    topology = Topology(spec)
    rack, t4_chain = topology.chains
    assert (rack.top_level, rack.node_level, rack.size[rack.top_level]) == (5, 4, 16)
    assert (t4_chain.top_level, t4_chain.node_level, t4_chain.gpu_model) == (2, 2, "T4")
    assert topology.node_gpu_count(topology.node_index["t0"]) == 4
    leaf = topology.leaf_of(topology.node_index["n3"], 5)
    assert topology.address[leaf] == "n3/1/0/1"
    assert topology.address[topology.parent[topology.node_cell[3]]] == "A100-RACK.1"
    assert list(topology.leaves(topology.node_cell[3])) == list(range(leaf - 5, leaf + 3))


def _two_node_gangs_of_tenant_a() -> Driver:
    """Two racks; tenant a holds two node cells, each under a guaranteed 8-GPU gang (a1, a2);
    tenant b one node cell."""
    driver = Driver()
    two = (vc("a", ("A100-RACK", "A100-NODE", 2)), vc("b", ("A100-RACK", "A100-NODE", 1)))
    driver.configure(rack_spec(racks=2, quota=two))
    driver.register("n0", "n1", "n2", "n3")
    for name in ("a1", "a2"):
        driver.submit(gang(name, "a", 0, (1, 8)))
    return driver


def _shrink_tenant_a(driver: Driver) -> Result:
    """Tenant a down to one node cell: one of its gangs no longer fits."""
    one = (vc("a", ("A100-RACK", "A100-NODE", 1)), vc("b", ("A100-RACK", "A100-NODE", 1)))
    return driver.ok(ApplyConfig(expected_version=1, spec=rack_spec(racks=2, quota=one)),
                     ADMIN)


def test_reconfiguration_keeps_gangs_and_downgrades_what_no_longer_fits() -> None:
    driver = _two_node_gangs_of_tenant_a()
    driver.submit(gang("opp", "b", -1, (1, 4)))
    placed = {name: group.leaves() for name, group in driver.state.groups.items()}
    result = _shrink_tenant_a(driver)
    assert result == ConfigApplied(version=2, downgraded=("a2",), requeued=())
    groups = driver.state.groups
    assert {name: group.leaves() for name, group in groups.items()} == placed
    assert groups["a1"].effective_priority == 0 and groups["a2"].effective_priority == -1
    assert all(group.phase is GroupPhase.ALLOCATED for group in groups.values())


def test_reconfiguration_that_removes_a_busy_node_is_refused() -> None:
    driver = Driver()
    driver.configure(rack_spec(racks=2))
    driver.register("n0", "n1", "n2", "n3")
    driver.submit(gang("job", "b", 0, (2, 8)))
    assert driver.state.groups["job"].pods[0].node == 0
    smaller = replace(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-NODE", 1)),)),
                      physical_cells=(PhysicalCellSpec(cell_type="A100-RACK",
                                                       nodes=("n2", "n3")),))
    message = driver.rejected(ApplyConfig(expected_version=1, spec=smaller), ADMIN,
                              Code.CONFIG_CONFLICT).message
    assert message == "node n0 holds gang job; drain it before removing it"
    assert driver.state.configured().version == 1


def test_quota_types_are_resolved_per_chain() -> None:
    spec = replace(BASE, virtual_clusters=(VirtualClusterSpec(name="a", quota=(
        QuotaSpec(chain="A100-RACK", cell_type="A100-SOCK", count=3),)),))
    topology = Topology(spec)
    assert topology.quota["a"][0] == (0, 0, 0, 3, 0, 0)


RENAME = {"A100-SW": "sw", "A100-SOCK": "sock", "A100-NODE": "node", "A100-RACK": "rack"}


def _renamed(spec: ClusterSpec) -> ClusterSpec:
    """`spec` with its cell types renamed (RENAME), and nothing else changed."""
    def name(value: str) -> str:
        return RENAME.get(value, value)
    return replace(
        spec,
        cell_types=tuple(replace(cell_type, name=name(cell_type.name),
                                 child=name(cell_type.child)) for cell_type in spec.cell_types),
        physical_cells=tuple(replace(cell, cell_type=name(cell.cell_type))
                             for cell in spec.physical_cells),
        virtual_clusters=tuple(replace(tenant, quota=tuple(
            QuotaSpec(chain=name(entry.chain), cell_type=name(entry.cell_type),
                      count=entry.count) for entry in tenant.quota))
            for tenant in spec.virtual_clusters))


@pytest.mark.parametrize("again", [lambda spec: spec, _renamed], ids=["same", "renamed"])
def test_a_reconfiguration_rebinds_a_gang_at_the_level_it_was_bound_at(
        again: Callable[[ClusterSpec], ClusterSpec]) -> None:
    """An 8-GPU gang of a tenant with one socket and one node cell is bound to the node cell.
    Applying the same configuration again must keep it guaranteed: rebinding GPU by GPU from
    the lowest level would take the socket cell for its first GPUs and find no cell left for
    the others. So must one that only renames the cell types (the same nodes, shape and quota
    under the new names): the level a gang was bound at had been found by the old type's name
    alone, and with the name gone the lowest level was tried first (the gang was downgraded)."""
    spec = rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-SOCK", 1),
                                           ("A100-RACK", "A100-NODE", 1)),))
    driver = Driver()
    driver.configure(spec)
    driver.register("n0", "n1")
    driver.submit(gang("job", "a", 0, (1, 8)))
    driver.submit(gang("small", "a", 0, (1, 2)))
    placed = {name: group.leaves() for name, group in driver.state.groups.items()}
    result = driver.ok(ApplyConfig(expected_version=1, spec=again(spec)), ADMIN)
    assert result == ConfigApplied(version=2, downgraded=(), requeued=())
    groups = driver.state.groups
    assert {name: group.leaves() for name, group in groups.items()} == placed
    assert [groups[name].effective_priority for name in ("job", "small")] == [0, 0]


def test_a_reconfiguration_announces_the_gangs_it_downgrades_and_requeues() -> None:
    """Schedulers follow gang events in the outbox: a gang a reconfiguration downgrades or
    sends back to the queue is announced, as a lazy preemption or a lost reservation is."""
    driver = _two_node_gangs_of_tenant_a()
    driver.submit(gang("opp", "b", -1, (2, 8)))
    started(driver, "opp")
    assert driver.submit(gang("g", "b", 10, (1, 8))).phase is GroupPhase.PREEMPTING
    result = _shrink_tenant_a(driver)
    assert result == ConfigApplied(version=2, downgraded=("a2",), requeued=("g",))
    assert effects(driver, EffectKind.GANG_DOWNGRADED) == [("a2", "")]
    assert effects(driver, EffectKind.GANG_REQUEUED) == [("g", "")]
    assert driver.state.groups["g"].deadline_ms == 0
