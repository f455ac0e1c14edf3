"""Property: a guaranteed gang that fits its tenant's cells as a private cluster, counting as
free every GPU that is free or held/reserved only below its priority, is never left pending
at submission (HiveD's VC safety plus priority preemption), and one that fits the free GPUs of
its tenant's bound cells evicts nobody. Brute-force reference: bins per VC cell (bound cells
from the live bindings, unbound quota cells whole), plain packing."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statemachine.commands import ReleaseGroup
from statemachine.limits import FREE_PRIORITY
from statemachine.results import GroupPhase, GroupStatus
from tests.statemachine.builders import SCHEDULER, Driver, gang, rack_spec, vc
from tests.statemachine.reference import packs

QUOTA = (vc("a", ("A100-RACK", "A100-NODE", 2)), vc("b", ("A100-RACK", "A100-SOCK", 2)),
         vc("c", ("A100-RACK", "A100-RACK", 1)))

ops = st.lists(st.one_of(
    st.tuples(st.just("submit"), st.sampled_from("abc"), st.sampled_from((-1, 0, 5, 9)),
              st.integers(1, 3), st.sampled_from((1, 2, 4, 8)), st.booleans()),
    st.tuples(st.just("release"), st.integers(0, 40))), min_size=1, max_size=40)


def private_bins(driver: Driver, vc_name: str, priority: int, *, unbound: bool = True
                 ) -> list[int]:
    state = driver.state
    config = state.configured()
    topology, buddy = config.topology, config.buddy
    chain = topology.chains[0]
    blocking: dict[int, int] = {}
    for group in state.groups.values():
        if group.phase is GroupPhase.PENDING:
            continue
        for leaf in group.leaves():
            blocking[leaf] = max(blocking.get(leaf, FREE_PRIORITY), group.effective_priority)
    bins = []
    for cell in buddy.bound_cells[vc_name][0]:
        level = topology.level[cell]
        roots = (topology.descendants_at(cell, chain.node_level)
                 if level > chain.node_level else [cell])
        for root in roots:
            bins.append(sum(1 for leaf in topology.leaves(root)
                            if config.cells.usable[leaf]
                            and blocking.get(leaf, FREE_PRIORITY) < priority))
    node = chain.size[chain.node_level]
    if not unbound:
        return bins
    for level, count in enumerate(buddy.unbound[vc_name][0]):
        if count:
            size = chain.size[level]
            bins += [min(size, node)] * (count * max(1, size // node))
    return bins


@settings(max_examples=200, suppress_health_check=list(HealthCheck))
@given(ops)
def test_a_gang_that_fits_its_private_cluster_is_never_pending(script: list[Any]) -> None:
    driver = Driver()
    driver.configure(rack_spec(racks=3, quota=QUOTA))
    driver.register(*(f"n{index}" for index in range(6)))
    for number, op in enumerate(script):
        if op[0] == "release":
            live = sorted(driver.state.groups)
            if live:
                driver.ok(ReleaseGroup(group=live[op[1] % len(live)], reason="x"), SCHEDULER)
            continue
        _, vc_name, priority, pods, gpus, lazy = op
        expect = priority >= 0 and packs([gpus] * pods, private_bins(driver, vc_name, priority))
        no_victims = priority >= 0 and packs([gpus] * pods,
                                             private_bins(driver, vc_name, -1, unbound=False))
        before = driver.state.outbox.next_index
        result = driver.run(gang(f"g{number}", vc_name, priority, (pods, gpus), lazy=lazy),
                            SCHEDULER)
        if not isinstance(result, GroupStatus):
            continue
        if expect:
            assert result.phase is not GroupPhase.PENDING, (result, script)
        evicted = [effect.group for effect in driver.state.outbox.effects
                   if effect.index >= before and effect.kind.value == "gang_released"]
        if no_victims:
            assert not evicted, (result, evicted, script)
