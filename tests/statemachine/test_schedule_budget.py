"""A scheduling pass is bounded in the cells it looks at, not only in the gangs it tries.

Goal: a guaranteed gang's placement searches look at every cell its tenant has bound on the
chain, so a pass trying SCHEDULE_ATTEMPTS_MAX gangs of a tenant with thousands of bound cells
would run for seconds inside one command's apply, on every replica. Method: a tenant whose
quota is many one-GPU cells, all bound and full, and pending gangs that can neither fit nor
preempt; a Tick after a change must try them all with preemption. Cell looks are counted
through the placement views (every count a search reads), not timed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import pytest

from consensus.envelope import Principal
from statemachine.apply import apply
from statemachine.commands import (
    ApplyConfig,
    Command,
    Member,
    RegisterNode,
    ReleaseGroup,
    SubmitGroup,
    Tick,
)
from statemachine.context import Context
from statemachine.fit import FreeView, PreemptView
from statemachine.invariants import check_invariants
from statemachine.limits import BUDDY_CANDIDATES_MAX, SCHEDULE_ATTEMPTS_MAX, SCHEDULE_LOOKS_MAX
from statemachine.results import GroupPhase, GroupStatus, Result
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
from statemachine.topology import Topology
from tests.statemachine.builders import ADMIN, SCHEDULER, SYSTEM, inventory, node_principal

T = TypeVar("T")

RUNNING = 1024  # one-GPU gangs filling the tenant's one-GPU cells
PENDING = 128  # one-GPU gangs that can preempt none of them
NODES = RUNNING // 8
SPREAD_PODS = 256  # one-GPU pods of one gang, a cell bound for each
SPREAD_LINEAR_PODS = 1024  # the same, counting the work per pod
FLAG_READS_PER_POD = 8  # buddy free-list flags a spread reads per pod (a walk of ancestors)
LOOKS_PER_POD = 3 * BUDDY_CANDIDATES_MAX  # cells looked at per pod: each candidate for room
# and for its rank, and a few to fit the pod
ATTEMPT_LOOKS_MAX = 64  # cells a stuck gang's attempt looks at, whatever its tenant has bound

ONE_GPU_TYPES = (
    CellTypeSpec(name="S", child="G", child_count=1),
    CellTypeSpec(name="N", child="S", child_count=8, node_level=True),
    CellTypeSpec(name="R", child="N", child_count=8),
)


class Clock:
    def __init__(self) -> None:
        self.state = State()
        self.now_ms = 1_000

    def run(self, command: Command, principal: Principal) -> Result:
        self.now_ms += 1
        return apply(self.state, command, Context(principal=principal, now_ms=self.now_ms))


def full_tenant() -> Clock:
    """Tenant a's RUNNING one-GPU cells all bound and held at priority 1000, PENDING gangs of
    priority 500 queued behind them (already tried once, at submission)."""
    clock = Clock()
    racks = NODES // 8
    spec = ClusterSpec(
        gpu_models=(GpuModelSpec(name="G", memory_mib=81920),), cell_types=ONE_GPU_TYPES,
        physical_cells=tuple(PhysicalCellSpec(cell_type="R", nodes=tuple(
            f"n{8 * rack + index}" for index in range(8))) for rack in range(racks)),
        virtual_clusters=(VirtualClusterSpec(name="a", quota=(
            QuotaSpec(chain="R", cell_type="S", count=RUNNING),)),),
        policy=PolicySpec(schedule_attempts_max=SCHEDULE_ATTEMPTS_MAX))
    clock.run(ApplyConfig(expected_version=0, spec=spec), ADMIN)
    for node in range(NODES):
        clock.run(RegisterNode(node=f"n{node}", boot_id="b",
                               gpus=inventory(f"n{node}", model="G")), node_principal(f"n{node}"))
    for index in range(RUNNING + PENDING):
        priority = 1000 if index < RUNNING else 500
        status = clock.run(SubmitGroup(group=f"g{index:05}", vc="a", priority=priority,
                                       members=(Member(pods=1, gpus=1),), gpu_model="",
                                       lazy_preemption=False), SCHEDULER)
        assert isinstance(status, GroupStatus)
        assert (status.phase is GroupPhase.ALLOCATED) == (index < RUNNING), status
    return clock


@contextmanager
def counted_looks() -> Iterator[list[int]]:
    """Counts every cell count the placement views are asked for."""
    looks = [0]
    originals: dict[type[FreeView], Callable[..., int]] = {
        view: view.count for view in (FreeView, PreemptView)}

    def counting(original: Callable[..., int]) -> Callable[..., int]:
        def count(self: FreeView, cell: int) -> int:
            looks[0] += 1
            return original(self, cell)
        return count

    with pytest.MonkeyPatch.context() as patch:
        for view, original in originals.items():
            patch.setattr(view, "count", counting(original))
        yield looks


def test_a_tick_pass_looks_at_a_bounded_number_of_cells() -> None:
    """A release changes the epochs, so the next Tick tries every pending gang with
    preemption; each attempt looks at all RUNNING bound cells, several times. The pass stops
    at its budget: the cells looked at stay within a small multiple of SCHEDULE_LOOKS_MAX,
    not PENDING times RUNNING; the gang it stopped at says why, and later Ticks go on down
    the queue until every pending gang has been tried."""
    clock = full_tenant()
    clock.run(ReleaseGroup(group="g00000", reason="done"), SCHEDULER)
    with counted_looks() as looks:
        clock.run(Tick(), SYSTEM)
    assert looks[0] <= 2 * SCHEDULE_LOOKS_MAX, looks[0]
    check_invariants(clock.state)
    state = clock.state
    waiting = [name for name in sorted(state.groups)
               if state.groups[name].phase is GroupPhase.PENDING]
    untried = [name for name in waiting if state.groups[name].preempt_epoch != state.change_epoch]
    assert untried, "the pass was expected to stop before the end of the queue"
    assert "tried first at the next Tick" in state.groups[untried[0]].why_pending
    for _ in range(PENDING):
        if not untried:
            break
        clock.run(Tick(), SYSTEM)
        untried = [name for name in waiting
                   if state.groups[name].preempt_epoch != state.change_epoch]
    assert not untried
    assert all("no gangs below priority 500" in state.groups[name].why_pending
               for name in waiting)


def spread_cluster(pods: int) -> Clock:
    """Tenant a's quota is `pods` one-GPU cells, none bound yet, on just enough racks."""
    clock = Clock()
    spec = ClusterSpec(
        gpu_models=(GpuModelSpec(name="G", memory_mib=81920),), cell_types=ONE_GPU_TYPES,
        physical_cells=tuple(PhysicalCellSpec(cell_type="R", nodes=tuple(
            f"n{8 * rack + index}" for index in range(8))) for rack in range(pods // 64)),
        virtual_clusters=(VirtualClusterSpec(name="a", quota=(
            QuotaSpec(chain="R", cell_type="S", count=pods),)),))
    clock.run(ApplyConfig(expected_version=0, spec=spec), ADMIN)
    for node in range(pods // 8):
        clock.run(RegisterNode(node=f"n{node}", boot_id="b",
                               gpus=inventory(f"n{node}", model="G")), node_principal(f"n{node}"))
    return clock


def submit_wide(clock: Clock, pods: int) -> None:
    status = clock.run(SubmitGroup(group="wide", vc="a", priority=1, members=(
        Member(pods=pods, gpus=1),), gpu_model="", lazy_preemption=False), SCHEDULER)
    assert isinstance(status, GroupStatus) and status.phase is GroupPhase.ALLOCATED, status


def test_spreading_a_gang_over_new_bindings_is_not_quadratic_in_its_pods() -> None:
    """A gang of SPREAD_PODS one-GPU pods in a tenant of one-GPU cells binds a cell per pod;
    each candidate binding is checked for overlap with the cells planned so far by a few
    lookups, not by comparing it with each of them (16.7 million comparisons, 5 s, for one
    submission of 1,024 pods)."""
    clock = spread_cluster(SPREAD_PODS)
    walks = [0]
    leaves = Topology.leaves

    def counted(self: Topology, cell: int) -> range:
        walks[0] += 1
        return leaves(self, cell)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Topology, "leaves", counted)
        submit_wide(clock, SPREAD_PODS)
    assert walks[0] <= 4 * SPREAD_PODS, walks[0]
    check_invariants(clock.state)


class CountedReads(list[T]):
    """A list that counts the reads of its items."""

    def __init__(self, items: list[T]) -> None:
        super().__init__(items)
        self.reads = 0

    def __getitem__(self, index: int) -> T:  # type: ignore[override]
        self.reads += 1
        return super().__getitem__(index)


def test_spreading_a_gang_over_new_bindings_is_linear_in_its_pods() -> None:
    """The same spread, of SPREAD_LINEAR_PODS pods, does work linear in them: the safety check
    of each candidate binding had replayed every binding planned before it (reading the
    free-list flag of each), and each scan for candidates had walked past every cell planned
    so far (looking at each); 577 ms in one apply for 1,024 pods. Both stay within a constant
    per pod: a safety check walks the candidate's ancestors, a scan starts past the planned
    cells."""
    clock = spread_cluster(SPREAD_LINEAR_PODS)
    buddy = clock.state.configured().buddy
    flags = buddy.in_free = CountedReads(buddy.in_free)
    with counted_looks() as looks:
        submit_wide(clock, SPREAD_LINEAR_PODS)
    reads = flags.reads
    assert reads <= FLAG_READS_PER_POD * SPREAD_LINEAR_PODS, reads
    assert looks[0] <= LOOKS_PER_POD * SPREAD_LINEAR_PODS, looks[0]
    check_invariants(clock.state)


def test_an_attempt_looks_only_at_bound_cells_it_could_use() -> None:
    """A tenant's SPREAD_LINEAR_PODS one-GPU cells are all bound and held by one gang: a
    gang of the same priority can neither fit nor preempt. Its attempt at submission (with
    preemption, then explained) had looked at every bound cell in each search, and summed
    their free GPUs twice, some 40 ms an attempt at 15,360 bound cells; it looks only at the
    bound cells holding a GPU it could take (none here), found through an index."""
    clock = spread_cluster(SPREAD_LINEAR_PODS)
    submit_wide(clock, SPREAD_LINEAR_PODS)
    cells = clock.state.configured().cells
    free = cells.free = CountedReads(cells.free)
    with counted_looks() as looks:
        status = clock.run(SubmitGroup(group="stuck", vc="a", priority=1, members=(
            Member(pods=1, gpus=1),), gpu_model="", lazy_preemption=False), SCHEDULER)
    assert isinstance(status, GroupStatus) and status.phase is GroupPhase.PENDING, status
    reads = free.reads
    assert looks[0] + reads <= ATTEMPT_LOOKS_MAX, (looks[0], reads)
    assert "has 0 free GPUs in 1024 bound cells" in status.why_pending, status.why_pending
    check_invariants(clock.state)
