"""Which GPUs a gang gets when several placements would do, checked against HiveD's choices
(reference/hived.md 1.4-1.5, 2.1).

Goal: the scheduler evicts as little as it can (opportunistic gangs before the tenant's own
guaranteed ones, few gangs rather than many), keeps opportunistic gangs off the nodes bound to
tenants, and gives a pod GPUs that share the lowest sub-cell. Method: small clusters driven
through `Driver`, where one choice is right and the others are plainly worse.
"""

from __future__ import annotations

from statemachine.commands import ReleaseGroup
from statemachine.results import GroupPhase
from tests.statemachine.builders import SCHEDULER, Driver, gang, rack_spec, vc
from tests.statemachine.test_scenarios import nodes_of, started


def two_node_tenant(*, lazy: bool) -> Driver:
    """Tenant a owns two nodes: its priority-1 gang `low` runs on n0, an opportunistic gang
    `opp` on n1."""
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-NODE", 2)),)))
    driver.register("n0", "n1")
    driver.submit(gang("low", "a", 1, (1, 8), lazy=lazy))
    started(driver, "low")
    driver.submit(gang("opp", "a", -1, (1, 8)))
    started(driver, "opp")
    assert nodes_of(driver, "low") == ["n0"] and nodes_of(driver, "opp") == ["n1"]
    return driver


def test_preemption_evicts_opportunistic_before_own_tenants_guaranteed_gang() -> None:
    """a's quota holds both guaranteed gangs, so a higher one takes a's second node and
    evicts the opportunistic gang there, as HiveD's first pass (the VC view, blind to
    opportunistic pods) would; lazy preemption changes nothing."""
    for lazy in (False, True):
        driver = two_node_tenant(lazy=lazy)
        high = driver.submit(gang("high", "a", 10, (1, 8)))
        assert high.phase is GroupPhase.PREEMPTING
        assert high.victims == ("opp",), (lazy, high.victims)
        assert driver.state.groups["low"].phase is GroupPhase.ALLOCATED


def crowded_pair(quota: tuple[str, str, int], *, gangs: int) -> Driver:
    """Nodes n0 and n1 of one rack, tenant a's quota `quota`, and `gangs` running 1-GPU
    opportunistic gangs o0, o1, ... of a, packed onto n0 first."""
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("a", quota),)))
    driver.register("n0", "n1")
    for index in range(gangs):
        assert driver.submit(gang(f"o{index}", "a", -1, (1, 1))).phase is GroupPhase.ALLOCATED
        started(driver, f"o{index}")
    return driver


def test_preemption_picks_the_cell_with_fewest_opportunistic_gpus() -> None:
    """Tenant a owns one node, not bound yet; n0 runs seven 1-GPU opportunistic gangs, n1 one.
    HiveD tries binding candidates by fewest opportunistic GPUs (reference/hived.md 1.4), so
    a's whole-node gang evicts the one gang on n1, not the seven on n0."""
    driver = crowded_pair(("A100-RACK", "A100-NODE", 1), gangs=9)
    assert nodes_of(driver, "o7") == ["n0"] and nodes_of(driver, "o8") == ["n1"]
    driver.ok(ReleaseGroup(group="o7", reason="done"), SCHEDULER)
    whole = driver.submit(gang("whole", "a", 0, (1, 8)))
    assert whole.phase is GroupPhase.PREEMPTING
    assert whole.victims == ("o8",), whole.victims


def test_preemption_inside_a_rack_binding_evicts_the_fewest_gangs() -> None:
    """Inside the chosen cell the pods go to the nodes that evict the fewest gangs too, not
    the fullest by free-or-evictable count. Tenant a's quota is a whole rack; n0 runs eight
    1-GPU opportunistic gangs, n1 one (and seven free GPUs): a's 8-GPU gang evicts the one
    on n1, not the eight on n0."""
    driver = crowded_pair(("A100-RACK", "A100-RACK", 1), gangs=16)
    assert nodes_of(driver, "o0") == ["n0"] and nodes_of(driver, "o8") == ["n1"]
    for index in range(9, 16):
        driver.ok(ReleaseGroup(group=f"o{index}", reason="done"), SCHEDULER)
    whole = driver.submit(gang("whole", "a", 0, (1, 8)))
    assert whole.phase is GroupPhase.PREEMPTING
    assert whole.victims == ("o8",), whole.victims


def test_preemption_inside_a_node_takes_the_socket_with_free_gpus() -> None:
    """Inside a node too, of two sockets with as many GPUs available, the pods take the one
    with free GPUs. Tenant a owns one node; n0 runs opportunistic gangs o0..o4 on GPUs 0-4
    (GPUs 5-7 free), n1 runs eight. A 6-GPU pod spans the sockets, 4 + 2 GPUs descend to one
    each: either way socket 1 (o4 and three free GPUs) comes first, then a switch of socket 0,
    so three gangs are evicted, not five."""
    for members in (((1, 6),), ((1, 4), (1, 2))):
        driver = Driver()
        driver.configure(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-NODE", 1)),)))
        driver.register("n0", "n1")
        for index in range(16):
            driver.submit(gang(f"o{index}", "a", -1, (1, 1)))
            started(driver, f"o{index}")
        assert nodes_of(driver, "o7") == ["n0"] and nodes_of(driver, "o8") == ["n1"]
        for index in range(5, 8):
            driver.ok(ReleaseGroup(group=f"o{index}", reason="done"), SCHEDULER)
        status = driver.submit(gang("six", "a", 0, *members))
        assert status.phase is GroupPhase.PREEMPTING
        assert status.victims == ("o0", "o1", "o4"), (members, status.victims)

def test_opportunistic_gang_stays_off_a_tenants_bound_node() -> None:
    """HiveD N4 (reference/hived.md 2.1): an opportunistic pod goes to a node away from the
    guaranteed ones. Tenant a owns one node and runs a 1-GPU gang on n0; a 1-GPU opportunistic
    gang goes to the free n1, not beside it, so a's next in-quota 7-GPU gang starts at once
    instead of evicting it and waiting."""
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-NODE", 1)),)))
    driver.register("n0", "n1")
    driver.submit(gang("g1", "a", 0, (1, 1)))
    started(driver, "g1")
    driver.submit(gang("opp", "a", -1, (1, 1)))
    started(driver, "opp")
    assert nodes_of(driver, "opp") == ["n1"], nodes_of(driver, "opp")
    g2 = driver.submit(gang("g2", "a", 0, (1, 7)))
    assert g2.phase is GroupPhase.ALLOCATED, (g2.phase, g2.victims)


def test_two_gpu_pod_takes_a_whole_free_switch_not_two_half_switches() -> None:
    """A pod's GPUs come from the lowest sub-cell that holds them all (HiveD picks the leaf
    set with the lowest common ancestor). With GPUs 1 and 3 of socket 0 free, one per PCIe
    switch, and socket 1 wholly free, a 2-GPU pod gets a free switch pair of socket 1."""
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-NODE", 1)),)))
    driver.register("n0", "n1")
    for index in range(4):
        driver.submit(gang(f"g{index}", "a", 0, (1, 1)))
    topology = driver.state.configured().topology

    def gpus_of(group: str) -> list[int]:
        return sorted(topology.gpu_index(leaf)
                      for leaf in driver.state.groups[group].pods[0].leaves)

    assert [gpus_of(f"g{index}") for index in range(4)] == [[0], [1], [2], [3]]
    driver.ok(ReleaseGroup(group="g1", reason="done"), SCHEDULER)
    driver.ok(ReleaseGroup(group="g3", reason="done"), SCHEDULER)
    driver.submit(gang("pair", "a", 0, (1, 2)))
    assert gpus_of("pair") == [4, 5]
