"""Which cell a tenant's gang binds (HiveD's buddy allocation, reference/hived.md 1.4): every
cell able to hold the gang is a candidate, not only the first 32 with room in total (for a
cell larger than a node, room in total is not room for the largest pod: cells that could never
hold it took every place, and a free rack past them was never tried, leaving a guaranteed gang
pending or evicting an opportunistic one); and among candidates, healthy cells come first,
then those fewest GPUs of opportunistic gangs hold."""

from __future__ import annotations

from statemachine.commands import MarkBad, ReleaseGroup
from statemachine.results import GroupPhase
from tests.statemachine.builders import ADMIN, SCHEDULER, Driver, gang, rack_spec, vc
from tests.statemachine.test_scenarios import started

RACKS = 34  # more than BUDDY_CANDIDATES_MAX (32) racks, each a candidate for binding
RACK_TENANT = (vc("a", ("A100-RACK", "A100-RACK", 1)),)


def _cluster() -> Driver:
    driver = Driver()
    driver.configure(rack_spec(racks=RACKS, quota=RACK_TENANT))
    driver.register(*(f"n{index}" for index in range(2 * RACKS)))
    return driver


def test_a_healthy_free_rack_past_the_candidate_cap_is_still_bound() -> None:
    """One bad GPU on each node of the first 33 racks: each of those racks still has 14
    usable GPUs (room for 8), but no node has 8, so none fits a 1x8 gang. Rack 33 is whole
    and healthy, the tenant owns one rack of quota and nothing runs: HiveD binds rack 33.
    Here the search stops after the first 32 roomy candidates and the gang stays pending."""
    driver = _cluster()
    for index in range(2 * RACKS - 2):
        driver.ok(MarkBad(node=f"n{index}", gpu=f"GPU-n{index}-0", reason="xid 79"), ADMIN)
    status = driver.submit(gang("G", "a", 5, (1, 8)))
    driver.tick()
    assert driver.state.groups["G"].phase is GroupPhase.ALLOCATED, status.why_pending


def test_no_opportunistic_gang_is_evicted_while_a_whole_free_rack_exists() -> None:
    """Opportunistic 1x4 gangs leave 4 free GPUs on every node of the first 33 racks; rack 33
    is entirely free. A guaranteed 1x8 gang fits rack 33 without evicting anybody, but the
    capped candidate list never reaches it and an opportunistic gang is preempted."""
    driver = _cluster()
    for index in range(4 * RACKS):
        assert driver.submit(gang(f"o{index}", "a", -1, (1, 4))).phase is GroupPhase.ALLOCATED
    topology = driver.state.configured().topology
    last = {f"n{2 * RACKS - 2}", f"n{2 * RACKS - 1}"}
    seen: set[str] = set()
    for index in range(4 * RACKS):
        name = f"o{index}"
        node = topology.node_ids[driver.state.groups[name].pods[0].node]
        if node in last or node not in seen:
            seen.add(node)
            driver.ok(ReleaseGroup(group=name, reason="done"), SCHEDULER)
        else:
            started(driver, name)
    status = driver.submit(gang("G", "a", 5, (1, 8)))
    assert status.victims == (), f"evicted {status.victims} with rack {RACKS - 1} free"
    assert status.phase is GroupPhase.ALLOCATED


def test_binding_prefers_a_healthy_cell_over_one_with_a_failed_gpu() -> None:
    """Tenant a owns one rack of quota and is alone on two racks; one GPU of n0 (rack 0) has
    failed. HiveD's buddy allocation skips bad cells while a healthy one is free (reference/
    hived.md 1.9), so a's first 1x8 gang binds rack 1 and a second 1x8 gang fits beside it, as
    in a's one-rack private cluster. Here the first gang binds rack 0 (the first candidate with
    room), and the second can never run while the healthy rack stays idle."""
    driver = Driver()
    driver.configure(rack_spec(racks=2, quota=RACK_TENANT))
    driver.register("n0", "n1", "n2", "n3")
    driver.ok(MarkBad(node="n0", gpu="GPU-n0-0", reason="xid 79"), ADMIN)
    assert driver.submit(gang("g1", "a", 5, (1, 8))).phase is GroupPhase.ALLOCATED
    second = driver.submit(gang("g2", "a", 5, (1, 8)))
    driver.tick()
    assert driver.state.groups["g2"].phase is GroupPhase.ALLOCATED, second.why_pending


def test_binding_prefers_a_cell_without_opportunistic_gangs() -> None:
    """An opportunistic 1x4 gang runs on n0 (rack 0); rack 1 is empty. HiveD sorts buddy
    candidates by fewest opportunistic GPUs (reference/hived.md 1.4), so tenant a's first 1x8
    gang binds rack 1 and its second fits beside it with nobody evicted. Here the first binds
    rack 0 (buddy order) and the second then preempts the opportunistic gang."""
    driver = Driver()
    driver.configure(rack_spec(racks=2, quota=RACK_TENANT))
    driver.register("n0", "n1", "n2", "n3")
    driver.submit(gang("o", "a", -1, (1, 4)))
    started(driver, "o")
    assert driver.submit(gang("g1", "a", 5, (1, 8))).phase is GroupPhase.ALLOCATED
    second = driver.submit(gang("g2", "a", 5, (1, 8)))
    assert second.victims == () and second.phase is GroupPhase.ALLOCATED, second.victims
