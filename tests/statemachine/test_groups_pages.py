"""A `groups` page (GpuStore.gangs, all_gangs) is bounded by bytes as well as by count (4096). It
had been by count alone, and each gang's `why_pending` names every chain it could use: with 32
chains (rack types) a page of 4096 pending gangs is some 9.8 MB, over a client connection's
default frame cap (8 MiB, consensus/runtime/node_config.py), so the replica answers TOO_LARGE
and `all_gangs`, which always asks for QUERY_LIMIT_MAX, can never list the gangs. The effects
query cuts its pages by bytes and says `more`; the gangs listing must too, and `all_gangs` must
follow `more` rather than take a short page for the last one."""

from __future__ import annotations

import anyio
import pytest

from statemachine.apply import apply
from statemachine.commands import ApplyConfig
from statemachine.context import Context
from statemachine.errors import Rejection
from statemachine.limits import QUERY_LIMIT_MAX
from statemachine.machine import Machine
from statemachine.queries import GroupsQuery, answer
from statemachine.query_codec import encode_answer
from statemachine.spec import (
    CellTypeSpec,
    ClusterSpec,
    GpuModelSpec,
    PhysicalCellSpec,
    PolicySpec,
    QuotaSpec,
    VirtualClusterSpec,
)
from statemachine.state import State
from statemachine.store import GpuStore
from tests.statemachine.builders import ADMIN, SCHEDULER, gang
from tests.statemachine.one_machine import ANSWER_BYTES_MAX, OneMachine

CHAINS = 32
WIDE_PREFIX = "\U0001d53e" * 60  # MATHEMATICAL DOUBLE-STRUCK CAPITAL G, 4 bytes in UTF-8
GANGS = QUERY_LIMIT_MAX + 100


def many_chains_spec(prefix: str = "GPU-MODEL") -> ClusterSpec:
    types, cells = [], []
    for k in range(CHAINS):
        model = f"{prefix}-{k:02d}"
        types.append(CellTypeSpec(name=f"{model}-NODE", child=model, child_count=8,
                                  node_level=True))
        types.append(CellTypeSpec(name=f"{model}-RACK-OF-EIGHT-NODES", child=f"{model}-NODE",
                                  child_count=8))
        cells.append(PhysicalCellSpec(cell_type=f"{model}-RACK-OF-EIGHT-NODES",
                                      nodes=tuple(f"rack{k}-node{i}" for i in range(8))))
    return ClusterSpec(
        gpu_models=tuple(GpuModelSpec(name=f"{prefix}-{k:02d}", memory_mib=81920)
                         for k in range(CHAINS)),
        cell_types=tuple(types), physical_cells=tuple(cells),
        virtual_clusters=(VirtualClusterSpec(name="research", quota=(QuotaSpec(
            chain=f"{prefix}-00-RACK-OF-EIGHT-NODES", cell_type=f"{prefix}-00-NODE",
            count=1),)),),
        policy=PolicySpec())


def pending_gangs(state: State, prefix: str = "GPU-MODEL") -> None:
    now = 1_000
    apply(state, ApplyConfig(expected_version=0, spec=many_chains_spec(prefix)),
          Context(principal=ADMIN, now_ms=now))
    for index in range(GANGS):  # opportunistic, any model: no node is registered, all wait
        now += 1
        apply(state, gang(f"training-job-{index:06d}", "research", -1, (1, 8)),
              Context(principal=SCHEDULER, now_ms=now))


@pytest.fixture(scope="module")
def machine() -> Machine:
    machine = Machine()
    pending_gangs(machine.state)
    return machine


@pytest.fixture(scope="module")
def machine_of_wide_names() -> Machine:
    """Chains named in 4-byte characters: a page's bytes are up to 4 times its characters."""
    machine = Machine()
    pending_gangs(machine.state, WIDE_PREFIX)
    return machine


def test_a_full_page_of_gangs_fits_a_client_frame(machine: Machine) -> None:
    assert_page_fits(machine)


def test_a_full_page_of_gangs_named_in_wide_characters_fits_a_client_frame(
        machine_of_wide_names: Machine) -> None:
    """The page's size is reckoned in bytes, not characters (it had counted characters)."""
    assert_page_fits(machine_of_wide_names)


def assert_page_fits(machine: Machine) -> None:
    page = answer(machine.state, GroupsQuery(vc="", phase="", after="",
                                             limit=QUERY_LIMIT_MAX))
    assert not isinstance(page, Rejection) and page["groups"]
    size = len(encode_answer(page))
    assert size < ANSWER_BYTES_MAX, (
        f"{len(page['groups'])} gangs: {size} bytes")


@pytest.mark.anyio
async def test_all_gangs_lists_every_gang(machine: Machine) -> None:
    with anyio.fail_after(30):
        listed = await GpuStore(OneMachine(machine)).all_gangs()  # type: ignore[arg-type]
    assert not isinstance(listed, Rejection)
    assert len(listed["groups"]) == GANGS
