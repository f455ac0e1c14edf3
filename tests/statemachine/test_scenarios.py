"""HiveD-style scenarios, each a short script over a small cluster with the outcome asserted.

Goal: show the behaviours reference/hived.md singles out (tenant guarantees under opportunistic
load, preemption by priority, lazy preemption, bad hardware and doomed cells, buddy merge, the
safe refusal to split a cell another tenant is owed) on clusters small enough that the expected
placement is forced. Method: drive `apply` through `Driver`, which checks every invariant after
every command, and assert on results, gang status and the outbox.
"""

from __future__ import annotations

from dataclasses import replace

import msgpack

from statemachine.commands import (
    AckPodStarted,
    BindPod,
    Cordon,
    GpuInventory,
    HealthReport,
    HealthStatus,
    Heartbeat,
    MarkBad,
    RegisterNode,
    ReleaseGroup,
    ReportHealth,
    ReportPodExit,
)
from statemachine.effects import EffectKind
from statemachine.errors import Rejection
from statemachine.queries import ClusterQuery, GroupQuery, answer
from statemachine.results import GroupPhase, NodeRegistered, PodBound
from statemachine.sessions import Sessions
from statemachine.snapshot_codec import decode_snapshot, encode_snapshot
from statemachine.spec import FailurePolicy, PolicySpec
from statemachine.views import failure_lines
from tests.statemachine.builders import (
    ADMIN,
    SCHEDULER,
    Driver,
    gang,
    inventory,
    node_principal,
    rack_spec,
    vc,
)

NODES6 = ("n0", "n1", "n2", "n3", "n4", "n5")


def started(driver: Driver, group: str) -> None:
    """Bind every pod of an allocated gang and acknowledge its start, so it is live."""
    status = driver.state.groups[group]
    for pod in status.pods:
        bound = driver.ok(BindPod(group=group, member=pod.member,
                                  pod_uid=f"{group}-{pod.member}-{pod.index}"), SCHEDULER)
        assert isinstance(bound, PodBound)
        driver.ok(AckPodStarted(node=bound.node, incarnation=driver.incarnations[bound.node],
                                group=group, pod_uid=bound.pod_uid, gpu_uuids=bound.gpu_uuids),
                  node_principal(bound.node))


def exit_all(driver: Driver, group: str, *, on_node: str = "") -> None:
    """Report the exit of a gang's pods (only those on `on_node`, if named)."""
    topology = driver.state.configured().topology
    for pod in driver.state.groups[group].pods:
        node = topology.node_ids[pod.node]
        if on_node in ("", node):
            driver.ok(ReportPodExit(node=node, incarnation=driver.incarnations[node],
                                    group=group, pod_uid=pod.pod_uid, exit_code=143),
                      node_principal(node))


def nodes_of(driver: Driver, group: str) -> list[str]:
    topology = driver.state.configured().topology
    return sorted({topology.node_ids[pod.node] for pod in driver.state.groups[group].pods})


def phase(driver: Driver, group: str) -> GroupPhase:
    return driver.state.groups[group].phase


def effects(driver: Driver, kind: EffectKind) -> list[tuple[str, str]]:
    return [(effect.group, effect.node) for effect in driver.state.outbox.effects
            if effect.kind is kind]


def test_guarantee_is_kept_under_opportunistic_load() -> None:
    """Opportunistic gangs fill the whole cluster; each tenant still gets its guaranteed
    cells, by preempting them, and only as many as its gang needs."""
    driver = Driver()
    driver.configure(rack_spec())
    driver.register(*NODES6)
    for index in range(6):
        assert driver.submit(gang(f"opp{index}", "a", -1, (1, 8))).phase is GroupPhase.ALLOCATED
        started(driver, f"opp{index}")
    assert driver.state.configured().cells.free[0] == 0
    status = driver.submit(gang("train", "b", 0, (2, 8)))
    assert status.phase is GroupPhase.PREEMPTING
    assert len(status.victims) == 2
    assert effects(driver, EffectKind.KILL_POD) == [(victim, node) for victim, node in zip(
        status.victims, nodes_of(driver, "train"), strict=True)]
    small = driver.submit(gang("small", "a", 3, (1, 8)))
    assert small.phase is GroupPhase.PREEMPTING and len(small.victims) == 1
    more = driver.submit(gang("opp-late", "b", -1, (1, 1)))
    assert more.phase is GroupPhase.PENDING, "reserved GPUs are not free for anyone else"
    for victim in status.victims:
        exit_all(driver, victim)
    assert phase(driver, "train") is GroupPhase.ALLOCATED
    assert phase(driver, "small") is GroupPhase.PREEMPTING
    exit_all(driver, small.victims[0])
    assert phase(driver, "small") is GroupPhase.ALLOCATED
    assert set(nodes_of(driver, "train")).isdisjoint(nodes_of(driver, "small"))


def test_preemption_takes_only_strictly_lower_priority() -> None:
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-NODE", 1)),)))
    driver.register("n0", "n1")
    driver.submit(gang("low", "a", 5, (1, 8)))
    started(driver, "low")
    same = driver.submit(gang("same", "a", 5, (1, 4)))
    assert same.phase is GroupPhase.PENDING
    assert "no gangs below priority 5" in same.why_pending
    high = driver.submit(gang("high", "a", 6, (1, 4)))
    assert high.phase is GroupPhase.PREEMPTING and high.victims == ("low",)
    assert driver.state.groups["low"].evicting == "preempted by high"
    exit_all(driver, "low")
    assert phase(driver, "high") is GroupPhase.ALLOCATED
    assert "low" not in driver.state.groups
    # The freed half of the node lets the equal-priority gang in on the next pass.
    assert phase(driver, "same") is GroupPhase.ALLOCATED


def test_a_higher_preemptor_takes_over_a_lower_ones_reservation() -> None:
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-NODE", 1)),)))
    driver.register("n0", "n1")
    driver.submit(gang("base", "a", 1, (1, 8)))
    started(driver, "base")
    assert driver.submit(gang("mid", "a", 5, (1, 8))).phase is GroupPhase.PREEMPTING
    top = driver.submit(gang("top", "a", 9, (1, 8)))
    assert top.phase is GroupPhase.PREEMPTING
    mid = driver.state.groups["mid"]
    assert mid.phase is GroupPhase.PENDING and mid.why_pending == "reservation taken by top"
    assert ("mid", "") in effects(driver, EffectKind.GANG_REQUEUED)
    exit_all(driver, "base")
    assert phase(driver, "top") is GroupPhase.ALLOCATED
    assert phase(driver, "mid") is GroupPhase.PENDING


def test_lazy_preemption_downgrades_instead_of_killing() -> None:
    """A lazily preemptible gang of the same tenant is downgraded to opportunistic and keeps
    running; the preemptor binds another cell. Only when that cell is needed is it killed."""
    quota = (vc("a", ("A100-RACK", "A100-NODE", 1)), vc("b", ("A100-RACK", "A100-NODE", 2)))
    driver = Driver()
    driver.configure(rack_spec(racks=2, quota=quota))
    driver.register("n0", "n1", "n2", "n3")
    driver.submit(gang("low", "a", 1, (1, 8), lazy=True))
    started(driver, "low")
    assert nodes_of(driver, "low") == ["n0"]
    high = driver.submit(gang("high", "a", 10, (1, 8)))
    assert high.phase is GroupPhase.ALLOCATED and nodes_of(driver, "high") == ["n1"]
    low = driver.state.groups["low"]
    assert low.phase is GroupPhase.ALLOCATED and not low.evicting
    assert low.effective_priority == -1 and low.downgraded == "lazily preempted by high"
    assert effects(driver, EffectKind.KILL_POD) == []
    assert driver.submit(gang("b1", "b", 0, (1, 8))).phase is GroupPhase.ALLOCATED
    assert driver.submit(gang("b2", "b", 0, (1, 8))).phase is GroupPhase.ALLOCATED
    driver.ok(ReleaseGroup(group="b2", reason="done"), SCHEDULER)
    driver.ok(Cordon(node="n3"), ADMIN)
    again = driver.submit(gang("b3", "b", 0, (1, 8)))
    assert again.phase is GroupPhase.PREEMPTING and again.victims == ("low",)
    assert effects(driver, EffectKind.KILL_POD) == [("low", "n0")]


def test_lazy_preemption_is_rolled_back_when_it_does_not_help() -> None:
    """With no other cell to bind, downgrading would not place the preemptor: the victim is
    preempted normally and keeps its priority until it leaves."""
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-NODE", 2)),)))
    driver.register("n0", "n1")
    driver.submit(gang("low0", "a", 1, (1, 8), lazy=True))
    driver.submit(gang("low1", "a", 1, (1, 8), lazy=True))
    started(driver, "low0")
    started(driver, "low1")
    high = driver.submit(gang("high", "a", 10, (1, 8)))
    assert high.phase is GroupPhase.PREEMPTING and high.victims == ("low0",)
    assert driver.state.groups["low0"].effective_priority == 1
    assert not driver.state.groups["low0"].downgraded
    assert effects(driver, EffectKind.GANG_DOWNGRADED) == []


def test_bad_gpus_never_receive_placements() -> None:
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-NODE", 2)),)))
    driver.register("n0", "n1")
    driver.ok(MarkBad(node="n0", gpu="GPU-n0-3", reason="xid 79"), ADMIN)
    driver.ok(ReportHealth(node="n1", incarnation=1, reports=(
        HealthReport(uuid="GPU-n1-0", status=HealthStatus.FAIL, reason="xid 48"),)),
        node_principal("n1"))
    for index in range(7):
        assert driver.submit(gang(f"g{index}", "a", 0, (1, 2))).phase in (
            GroupPhase.ALLOCATED, GroupPhase.PENDING)
    topology = driver.state.configured().topology
    used = {(topology.node_ids[pod.node], topology.gpu_index(leaf))
            for group in driver.state.groups.values() for pod in group.pods
            for leaf in pod.leaves}
    assert ("n0", 3) not in used and ("n1", 0) not in used
    assert len(used) == 12, "three 2-GPU slots per 8-GPU node lose a buddy to the bad GPU"
    pending = [name for name, group in driver.state.groups.items()
               if group.phase is GroupPhase.PENDING]
    assert pending == ["g6"]


def test_a_failed_gpu_is_surfaced_and_the_tenant_policy_applies() -> None:
    quota = (vc("keep", ("A100-RACK", "A100-NODE", 1)),
             vc("drop", ("A100-RACK", "A100-NODE", 1), on_failure=FailurePolicy.RELEASE))
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=quota))
    driver.register("n0", "n1")
    driver.submit(gang("kept", "keep", 0, (1, 8)))
    driver.submit(gang("dropped", "drop", 0, (1, 8)))
    started(driver, "kept")
    started(driver, "dropped")
    for node in ("n0", "n1"):
        driver.ok(ReportHealth(node=node, incarnation=1, reports=(
            HealthReport(uuid=f"GPU-{node}-5", status=HealthStatus.FAIL, reason="xid 79"),)),
            node_principal(node))
    kept = driver.state.groups["kept"]
    assert kept.phase is GroupPhase.ALLOCATED
    assert failure_lines(kept) == (f"GPU-{nodes_of(driver, 'kept')[0]}-5: failed: xid 79",)
    assert "dropped" not in driver.state.groups
    failures = effects(driver, EffectKind.GANG_FAILURE)
    assert sorted(group for group, _ in failures) == ["dropped", "kept"]
    assert [group for group, _ in effects(driver, EffectKind.KILL_POD)] == ["dropped"]


def test_a_flapping_gpu_leaves_one_failure_on_its_gang() -> None:
    """A GPU fails, recovers and fails again, each time with a new reason (agents report
    counters): its gang keeps the latest failure of each GPU, not one entry per failure."""
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-NODE", 1)),),
                               policy=PolicySpec(recover_reports=1)))
    driver.register("n0", "n1")
    driver.submit(gang("job", "a", 0, (1, 8)))
    node = nodes_of(driver, "job")[0]
    for count in range(1, 6):
        for status in (HealthStatus.FAIL, HealthStatus.PASS):
            driver.ok(ReportHealth(node=node, incarnation=1, reports=(
                HealthReport(uuid=f"GPU-{node}-5", status=status,
                             reason=f"{count} uncorrectable ECC errors"),)),
                node_principal(node))
    assert failure_lines(driver.state.groups["job"]) == (
        f"GPU-{node}-5: failed: 5 uncorrectable ECC errors",)


def boards(node: str, serial: str) -> tuple[GpuInventory, ...]:
    """A node's 8 GPUs under UUIDs of their own (a board swapped gets a new one)."""
    return tuple(replace(gpu, uuid=f"{gpu.uuid}-{serial}") for gpu in inventory(node))


def test_a_gangs_failures_name_only_the_gpus_under_it() -> None:
    """A node that comes back again and again with new GPU UUIDs under a running gang, and
    reports one failed each time, left one more entry on the gang each time: its failures,
    copied into every status reply, cached reply and snapshot, grew without bound."""
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-NODE", 1)),)))
    driver.register("n0", "n1")
    driver.submit(gang("job", "a", 0, (1, 8)))
    started(driver, "job")
    node = nodes_of(driver, "job")[0]
    for cycle in range(5):
        registered = driver.ok(RegisterNode(node=node, boot_id=f"boot-{cycle}",
                                            gpus=boards(node, str(cycle))), node_principal(node))
        assert isinstance(registered, NodeRegistered)
        driver.ok(ReportHealth(node=node, incarnation=registered.incarnation, reports=(
            HealthReport(uuid=f"GPU-{node}-5-{cycle}", status=HealthStatus.FAIL,
                         reason="fell off the bus"),)), node_principal(node))
    job = driver.state.groups["job"]
    assert job.phase is GroupPhase.ALLOCATED
    assert failure_lines(job) == (f"GPU-{node}-5-4: failed: fell off the bus",)
    status = answer(driver.state, GroupQuery(group="job"))
    assert not isinstance(status, Rejection) and tuple(status["failures"]) == failure_lines(job)


def test_failures_are_kept_per_gpu_whatever_its_uuid_holds() -> None:
    """The failures were keyed by the text before the first ": " of each entry, so a GPU whose
    UUID holds ": " replaced the failure of another GPU under the same gang."""
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-NODE", 1)),)))
    gpus = tuple(replace(gpu, uuid="MIG-7: 1" if gpu.index == 5 else "MIG-7")
                 if gpu.index in (4, 5) else gpu for gpu in inventory("n0"))
    driver.ok(RegisterNode(node="n0", boot_id="boot-1", gpus=gpus), node_principal("n0"))
    driver.incarnations["n0"] = 1
    driver.submit(gang("job", "a", 0, (1, 8)))
    assert nodes_of(driver, "job") == ["n0"]
    for uuid in ("MIG-7", "MIG-7: 1"):
        driver.ok(ReportHealth(node="n0", incarnation=1, reports=(
            HealthReport(uuid=uuid, status=HealthStatus.FAIL, reason="xid 48"),)),
            node_principal("n0"))
    assert failure_lines(driver.state.groups["job"]) == (
        "MIG-7: 1: failed: xid 48", "MIG-7: failed: xid 48")


def test_recovery_needs_consecutive_passes() -> None:
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(), policy=PolicySpec(recover_reports=2)))
    driver.register("n0", "n1")
    cells = driver.state.configured().cells

    def report(status: HealthStatus) -> None:
        driver.ok(ReportHealth(node="n0", incarnation=1, reports=(
            HealthReport(uuid="GPU-n0-0", status=status, reason=status.value),)),
            node_principal("n0"))

    leaf = driver.state.configured().topology.leaf_of(0, 0)
    report(HealthStatus.FAIL)
    assert not cells.usable[leaf]
    report(HealthStatus.PASS)
    report(HealthStatus.UNKNOWN)
    report(HealthStatus.PASS)
    assert not cells.usable[leaf], "an unknown verdict breaks the run of passes"
    report(HealthStatus.PASS)
    assert cells.usable[leaf]


def test_doomed_cells_are_reported_per_tenant() -> None:
    """Two racks; a owes one rack, b one node. With a node of each rack cordoned no healthy
    rack is left, so a's rack is doomed to bad hardware; b still has healthy nodes."""
    quota = (vc("a", ("A100-RACK", "A100-RACK", 1)), vc("b", ("A100-RACK", "A100-NODE", 1)))
    driver = Driver()
    driver.configure(rack_spec(racks=2, quota=quota))
    driver.register("n0", "n1", "n2", "n3")
    driver.ok(Cordon(node="n0"), ADMIN)
    driver.ok(Cordon(node="n3"), ADMIN)
    cluster = answer(driver.state, ClusterQuery())
    assert isinstance(cluster, dict)
    doomed = {(entry["vc"], level["cell_type"]): level["doomed"] for entry in cluster["vcs"]
              for level in entry["levels"]}
    assert doomed == {("a", "A100-RACK"): 1, ("b", "A100-NODE"): 0}
    status = driver.submit(gang("big", "a", 0, (2, 8)))
    assert status.phase is GroupPhase.PENDING
    view = answer(driver.state, GroupQuery(group="big"))
    assert isinstance(view, dict) and view["doomed"] == {"A100-RACK": {"A100-RACK": 1}}


def test_buddy_cells_merge_back_after_release() -> None:
    driver = Driver()
    driver.configure(rack_spec(racks=2, quota=(vc("a", ("A100-RACK", "A100-SW", 2)),)))
    driver.register("n0", "n1", "n2", "n3")
    buddy = driver.state.configured().buddy
    tops = [list(cells) for cells in buddy.free_lists[0]]
    driver.submit(gang("one", "a", 0, (1, 1)))
    driver.submit(gang("two", "a", 0, (1, 2)))
    # Both switches of socket n0/0 are bound; its buddy socket, node and rack stay free.
    assert [len(cells) for cells in buddy.free_lists[0][1:]] == [0, 0, 1, 1, 1]
    assert nodes_of(driver, "one") == nodes_of(driver, "two") == ["n0"]
    driver.ok(ReleaseGroup(group="one", reason=""), SCHEDULER)
    driver.ok(ReleaseGroup(group="two", reason=""), SCHEDULER)
    assert [list(cells) for cells in buddy.free_lists[0]] == tops
    assert not any(buddy.split)


def test_a_split_that_would_break_another_tenants_guarantee_is_refused() -> None:
    """HiveD's safe relaxed buddy allocation (R3): with its natural cell bad, a may not split
    the only rack b is owed, and waits instead."""
    quota = (vc("a", ("A100-RACK", "A100-NODE", 2)), vc("b", ("A100-RACK", "A100-RACK", 1)))
    driver = Driver()
    driver.configure(rack_spec(racks=2, quota=quota))
    driver.register("n0", "n1", "n2", "n3")
    assert driver.submit(gang("first", "a", 0, (1, 8))).phase is GroupPhase.ALLOCATED
    driver.ok(Cordon(node="n1"), ADMIN)
    status = driver.submit(gang("second", "a", 0, (1, 8)))
    assert status.phase is GroupPhase.PENDING
    assert driver.submit(gang("rack", "b", 0, (2, 8))).phase is GroupPhase.ALLOCATED
    assert nodes_of(driver, "rack") == ["n2", "n3"]


def test_a_silent_node_goes_suspect_then_down_and_its_gangs_are_told() -> None:
    policy = PolicySpec(lease_ms=1_000, down_after_ms=2_000)
    quota = (vc("a", ("A100-RACK", "A100-NODE", 1), on_failure=FailurePolicy.RELEASE),)
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=quota, policy=policy))
    driver.register("n0", "n1")
    driver.submit(gang("job", "a", 0, (1, 8)))
    started(driver, "job")
    node = nodes_of(driver, "job")[0]
    other = "n1" if node == "n0" else "n0"
    driver.tick(step_ms=900)
    driver.ok(Heartbeat(node=other, incarnation=1), node_principal(other))
    driver.tick(step_ms=200)
    assert driver.state.nodes[node].liveness.value == "suspect"
    assert driver.state.nodes[other].liveness.value == "up"
    assert "job" in driver.state.groups, "a suspect node keeps its gangs"
    driver.tick(step_ms=2_001)  # down_after_ms after the Tick that saw the lease run out
    assert driver.state.nodes[node].liveness.value == "down"
    assert "job" not in driver.state.groups
    assert ("job", "") in effects(driver, EffectKind.GANG_FAILURE)
    driver.ok(Heartbeat(node=node, incarnation=1), node_principal(node))
    assert driver.state.nodes[node].liveness.value == "up"


def test_a_format_2_snapshot_reads_its_failure_lines_as_pairs() -> None:
    """A snapshot written before format 3 (failures as "GPU: why" lines) still loads, so a
    replica whose log holds one starts after the upgrade."""
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-NODE", 1)),)))
    driver.register("n0")
    # None (KEEP, exits unannounced): as a gang of a snapshot from before format 6 is read
    driver.submit(gang("job", "a", 0, (1, 8), on_pod_failure=None))
    driver.ok(ReportHealth(node="n0", incarnation=1, reports=(
        HealthReport(uuid="GPU-n0-3", status=HealthStatus.FAIL, reason="xid 79"),)),
        node_principal("n0"))
    failures = driver.state.groups["job"].failures
    assert failures
    raw = msgpack.unpackb(encode_snapshot(driver.state, Sessions(), 7), strict_map_key=False)
    raw[1] = 2
    del raw[13:]  # where the next Tick's pass starts, the last Tick's stamp: none before 5
    groups = raw[10]
    for fields in groups:
        fields[16] = [f"{gpu}: {why}" for gpu, why in fields[16]]
        del fields[21:]  # its pod failure policy: none before format 6, read as None
    state, _, applied = decode_snapshot(msgpack.packb(raw))
    assert applied == 7
    assert state.groups["job"].failures == failures
    assert encode_snapshot(state, Sessions(), 7) == encode_snapshot(driver.state, Sessions(), 7)


def test_an_opportunistic_gangs_why_pending_follows_the_ticks() -> None:
    """An opportunistic gang never preempts, so only its submission explained it: its "why
    pending" stayed as of then however the cluster changed. Every pass that tries it now
    explains it (from counters only)."""
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-NODE", 1)),)))
    driver.register("n0", "n1")
    driver.submit(gang("held", "a", 0, (1, 8)))
    started(driver, "held")
    for name in ("filler-1", "filler-2"):
        driver.submit(gang(name, "a", -1, (1, 2)))
        started(driver, name)
    wide = driver.submit(gang("wide", "a", -1, (1, 8)))
    assert wide.phase is GroupPhase.PENDING
    assert "4 free GPUs, at most 4 on one node" in wide.why_pending
    exit_all(driver, "filler-1")  # 6 free on one node: still not 8
    pending = driver.state.groups["wide"]
    assert pending.phase is GroupPhase.PENDING
    assert "6 free GPUs, at most 6 on one node" in pending.why_pending, pending.why_pending
