"""Renaming the cell types of a chain (nothing else changes: the same nodes, the same shape, the
same quota under the new names) keeps a guaranteed gang that still fits. `_bound_levels` finds
the level a gang was bound at by the old type's name; with the name gone it had fallen back to
"lowest level first", which the docstring of `_rebind` itself says takes a small cell around a
gang's first GPUs and leaves none for the rest (the gang was downgraded)."""

from __future__ import annotations

from dataclasses import replace

from statemachine.commands import ApplyConfig
from statemachine.results import ConfigApplied
from statemachine.spec import ClusterSpec, QuotaSpec
from tests.statemachine.builders import ADMIN, Driver, gang, rack_spec, vc

RENAME = {"A100-SW": "sw", "A100-SOCK": "sock", "A100-NODE": "node", "A100-RACK": "rack"}


def _renamed(spec: ClusterSpec) -> ClusterSpec:
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


def test_renaming_the_cell_types_keeps_every_gang_guaranteed() -> None:
    spec = rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-SOCK", 1),
                                           ("A100-RACK", "A100-NODE", 1)),))
    driver = Driver()
    driver.configure(spec)
    driver.register("n0", "n1")
    driver.submit(gang("job", "a", 0, (1, 8)))
    driver.submit(gang("small", "a", 0, (1, 2)))
    placed = {name: group.leaves() for name, group in driver.state.groups.items()}
    result = driver.ok(ApplyConfig(expected_version=1, spec=_renamed(spec)), ADMIN)
    groups = driver.state.groups
    assert {name: group.leaves() for name, group in groups.items()} == placed
    assert result == ConfigApplied(version=2, downgraded=(), requeued=())
    assert [groups[name].effective_priority for name in ("job", "small")] == [0, 0]
