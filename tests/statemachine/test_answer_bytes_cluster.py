"""A `cluster` answer (GpuStore.cluster, `cellar ops cluster`) lists, per tenant and chain with
a quota, the tenant's name, the chain's and one entry per level with a quota. The configuration
that makes it is bounded (COMMAND_BYTES_MAX, 1 MiB) but the answer repeats the tenant's name
once per chain: 256 tenants (VIRTUAL_CLUSTERS_MAX) x 64 quota entries (QUOTA_ENTRIES_MAX), each
on its own chain with short chain and cell type names, is a configuration of some 0.64 MB and
an answer of 16,384 x (515 bytes of name + some 75 of keys and counts) = some 9.7 MB, over a
client's default frame cap (8 MiB): the replica answers TOO_LARGE and nobody can see the
cluster's cells."""

from __future__ import annotations

import anyio
import pytest

from statemachine import limits
from statemachine.apply import apply
from statemachine.codec import encode_command
from statemachine.commands import ApplyConfig
from statemachine.context import Context
from statemachine.errors import Rejection
from statemachine.machine import Machine
from statemachine.queries import ClusterQuery, answer
from statemachine.query_codec import encode_answer
from statemachine.results import ConfigApplied
from statemachine.spec import (
    CellTypeSpec,
    ClusterSpec,
    GpuModelSpec,
    PhysicalCellSpec,
    PolicySpec,
    QuotaSpec,
    VirtualClusterSpec,
)
from statemachine.store import GpuStore
from tests.statemachine.builders import ADMIN
from tests.statemachine.one_machine import ANSWER_BYTES_MAX, OneMachine

CHAINS = limits.QUOTA_ENTRIES_MAX  # one quota entry of each tenant on each chain
TENANTS = limits.VIRTUAL_CLUSTERS_MAX
NODES_PER_CHAIN = 4
GPUS_PER_NODE = limits.VIRTUAL_CLUSTERS_MAX // NODES_PER_CHAIN  # a 1-GPU cell per tenant


def tenant(number: int) -> str:
    """The longest name, in 4-byte characters (MATHEMATICAL ALPHANUMERIC SYMBOLS), distinct."""
    return "\U0001d4d0" * (limits.NAME_LENGTH_MAX - 1) + chr(0x1D400 + number)


def wide_spec() -> ClusterSpec:
    chains = [f"c{index:02d}" for index in range(CHAINS)]
    return ClusterSpec(
        gpu_models=(GpuModelSpec(name="G", memory_mib=81920),),
        cell_types=(CellTypeSpec(name="P", child="G", child_count=1),
                    CellTypeSpec(name="N", child="P", child_count=GPUS_PER_NODE,
                                 node_level=True),
                    *(CellTypeSpec(name=chain, child="N", child_count=NODES_PER_CHAIN)
                      for chain in chains)),
        physical_cells=tuple(PhysicalCellSpec(cell_type=chain, nodes=tuple(
            f"{chain}n{index}" for index in range(NODES_PER_CHAIN))) for chain in chains),
        virtual_clusters=tuple(VirtualClusterSpec(name=tenant(number), quota=tuple(
            QuotaSpec(chain=chain, cell_type="P", count=1) for chain in chains))
            for number in range(TENANTS)),
        policy=PolicySpec())


@pytest.fixture(scope="module")
def machine() -> Machine:
    machine = Machine()
    command = ApplyConfig(expected_version=0, spec=wide_spec())
    assert len(encode_command(command)) <= limits.COMMAND_BYTES_MAX, "a configuration one can send"
    result = apply(machine.state, command, Context(principal=ADMIN, now_ms=1_000))
    assert isinstance(result, ConfigApplied), result
    return machine


def test_the_cluster_answer_fits_a_client_frame(machine: Machine) -> None:
    cluster = answer(machine.state, ClusterQuery())
    assert not isinstance(cluster, Rejection)
    size = len(encode_answer(cluster))
    assert size < ANSWER_BYTES_MAX, f"{len(cluster['vcs'])} tenant entries: {size} bytes"
    assert len(cluster["chains"]) == CHAINS, "every chain is listed, whatever is cut"
    entries = len(cluster["vcs"])
    assert cluster.get("vcs_omitted") == TENANTS * CHAINS - entries > 0
    tenants = [entry["vc"] for entry in cluster["vcs"]]
    assert tenants == sorted(tenants), "the first entries, by tenant"
    assert tenants[0] == tenant(0) and len(set(tenants)) == entries // CHAINS + 1


@pytest.mark.anyio
async def test_the_store_client_gets_the_cluster(machine: Machine) -> None:
    with anyio.fail_after(30):
        cluster = await GpuStore(OneMachine(machine)).cluster()  # type: ignore[arg-type]
    assert not isinstance(cluster, Rejection)
    assert cluster["version"] == 1 and len(cluster["chains"]) == CHAINS
