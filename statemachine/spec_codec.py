"""The cluster configuration as plain msgpack values, both ways.

Field names match `statemachine.spec`. Decoding checks shapes and sizes and names the path of
anything wrong (`spec.virtual_clusters[2].quota[0].count`); the meaning (types that exist,
fan-outs, feasibility) is `config_check`'s job. The policy may omit any knob to take its default.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from statemachine import limits
from statemachine.record_codec import Record
from statemachine.spec import (
    CellTypeSpec,
    ClusterSpec,
    FailurePolicy,
    GpuModelSpec,
    PhysicalCellSpec,
    PolicySpec,
    QuotaSpec,
    VirtualClusterSpec,
)

SPEC_FIELDS = ("gpu_models", "cell_types", "physical_cells", "virtual_clusters", "policy")
POLICY_FIELDS = tuple(field.name for field in fields(PolicySpec))


def encode_spec(spec: ClusterSpec) -> dict[str, Any]:
    return {
        "gpu_models": [{"name": model.name, "memory_mib": model.memory_mib}
                       for model in spec.gpu_models],
        "cell_types": [{"name": cell_type.name, "child": cell_type.child,
                        "child_count": cell_type.child_count, "node_level": cell_type.node_level}
                       for cell_type in spec.cell_types],
        "physical_cells": [{"cell_type": cell.cell_type, "nodes": list(cell.nodes)}
                           for cell in spec.physical_cells],
        "virtual_clusters": [
            {"name": vc.name, "on_failure": vc.on_failure.value,
             "quota": [{"chain": entry.chain, "cell_type": entry.cell_type,
                        "count": entry.count} for entry in vc.quota]}
            for vc in spec.virtual_clusters],
        "policy": {name: getattr(spec.policy, name) for name in POLICY_FIELDS},
    }


def decode_spec(record: Record) -> ClusterSpec:
    models = record.records("gpu_models", ("name", "memory_mib"),
                            length_max=limits.GPU_MODELS_MAX)
    types = record.records("cell_types", ("name", "child", "child_count", "node_level"),
                           length_max=limits.CELL_TYPES_MAX)
    cells = record.records("physical_cells", ("cell_type", "nodes"),
                           length_max=limits.PHYSICAL_CELLS_MAX)
    vcs = record.records("virtual_clusters", ("name", "on_failure", "quota"),
                         length_max=limits.VIRTUAL_CLUSTERS_MAX)
    return ClusterSpec(
        gpu_models=tuple(GpuModelSpec(name=model.text("name"),
                                      memory_mib=model.integer("memory_mib"))
                         for model in models),
        cell_types=tuple(CellTypeSpec(name=cell_type.text("name"),
                                      child=cell_type.text("child"),
                                      child_count=cell_type.integer("child_count"),
                                      node_level=cell_type.flag("node_level"))
                         for cell_type in types),
        physical_cells=tuple(_physical_cell(cell) for cell in cells),
        virtual_clusters=tuple(_virtual_cluster(vc) for vc in vcs),
        policy=_policy(record.record("policy", POLICY_FIELDS)),
    )


def _physical_cell(record: Record) -> PhysicalCellSpec:
    nodes = record.items("nodes", length_max=limits.NODES_PER_CELL_MAX)
    names = []
    for index, node in enumerate(nodes):
        item = Record({"node": node}, f"{record.path}.nodes[{index}]", ("node",))
        names.append(item.text("node"))
    return PhysicalCellSpec(cell_type=record.text("cell_type"), nodes=tuple(names))


def _virtual_cluster(record: Record) -> VirtualClusterSpec:
    quota = record.records("quota", ("chain", "cell_type", "count"),
                           length_max=limits.QUOTA_ENTRIES_MAX)
    return VirtualClusterSpec(
        name=record.text("name"),
        on_failure=FailurePolicy(record.choice("on_failure", tuple(FailurePolicy))),
        quota=tuple(QuotaSpec(chain=entry.text("chain"), cell_type=entry.text("cell_type"),
                              count=entry.integer("count", high=limits.CELLS_MAX))
                    for entry in quota))


def _policy(record: Record) -> PolicySpec:
    values = {name: record.integer(name, high=limits.DURATION_MS_MAX)
              for name in POLICY_FIELDS if record.has(name)}
    return PolicySpec(**values)
