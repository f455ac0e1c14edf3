"""`FakeGpuBackend`'s scenarios change readings and events the way real GPUs do (reference/nvml.md
§4.3), its profiles are deterministic, and its snapshots round-trip through JSON."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest

from agent import nvml_abi as abi
from agent.fake_backend import FakeGpuBackend
from agent.gpu import (
    UNSUPPORTED,
    EventKind,
    Fabric,
    Failed,
    GpuEvent,
    GpuGone,
    GpuProcess,
    NvmlCode,
    NvmlUnavailable,
)
from agent.gpu_profiles import PROFILE_NAMES, build_profile
from agent.gpu_snapshot import SnapshotError, decode, link_peers, record_snapshot

EVENT_WAIT_MS = 10_000


@pytest.fixture
def node() -> Iterator[FakeGpuBackend]:
    backend = FakeGpuBackend.from_profile("h100-8")
    backend.start()
    yield backend
    backend.stop()


def started(profile: str) -> FakeGpuBackend:
    backend = FakeGpuBackend.from_profile(profile)
    backend.start()
    return backend


def drain(backend: FakeGpuBackend) -> list[GpuEvent]:
    events = []
    while (event := backend.wait_event(0)) is not None:
        events.append(event)
    return events


# Profiles.

def test_a_profile_is_the_same_for_the_same_seed_only() -> None:
    assert build_profile("a100-8") == build_profile("a100-8")
    assert build_profile("a100-8", seed=1) != build_profile("a100-8")
    uuids = [device.info.uuid for device in build_profile("h100-8").devices]
    assert uuids != [device.info.uuid for device in build_profile("h100-8", seed=1).devices]


def test_profiles_name_models_as_nvml_does() -> None:
    models = {name: {device.info.model for device in build_profile(name).devices}
              for name in PROFILE_NAMES}
    assert models["h100-8"] == {"NVIDIA H100 80GB HBM3"}
    assert models["a100-8"] == {"NVIDIA A100-SXM4-80GB"}
    assert models["consumer-no-ecc"] == {"NVIDIA GeForce RTX 4090"}
    assert models["no-gpu"] == set()


def test_an_unknown_profile_is_refused() -> None:
    with pytest.raises(ValueError, match="known: h100-8"):
        FakeGpuBackend.from_profile("dgx-z")


def test_bridged_links_are_handed_to_the_paired_gpu() -> None:
    snapshot = build_profile("nvbridge-2")
    first, second = (device.info.uuid for device in snapshot.devices)
    peers = link_peers(snapshot)
    assert peers[first] == (second,) * 12
    assert peers[second] == (first,) * 12
    assert set(link_peers(build_profile("h100-8")).popitem()[1]) == {None}


# Events.

def test_an_xid_storm_delivers_every_event_in_order(node: FakeGpuBackend) -> None:
    uuid = node.uuids()[2]
    node.xid_storm(uuid, 13, 5)
    node.inject_xid(uuid, 31)
    assert [event.xid for event in drain(node)] == [13, 13, 13, 13, 13, 31]


def test_events_from_before_start_are_not_replayed() -> None:
    backend = FakeGpuBackend.from_profile("h100-8")
    backend.inject_xid(backend.uuids()[0], 48)
    backend.start()
    assert backend.wait_event(0) is None


def test_events_the_gpu_does_not_support_never_arrive() -> None:
    backend = started("consumer-no-ecc")
    (uuid,) = backend.uuids()
    backend.raise_ecc(uuid, corrected=3, uncorrected=1)
    assert backend.wait_event(0) is None
    assert backend.sample(uuid).ecc_volatile_corrected is UNSUPPORTED
    backend.inject_xid(uuid, 43)
    assert drain(backend) == [GpuEvent(uuid, EventKind.XID, 43, 43)]


def test_events_from_many_threads_all_arrive(node: FakeGpuBackend) -> None:
    uuids = node.uuids()
    injectors = [threading.Thread(target=node.xid_storm, args=(uuid, 94, 50))
                 for uuid in uuids[:4]]
    for injector in injectors:
        injector.start()
    received = [node.wait_event(EVENT_WAIT_MS) for _ in range(200)]
    for injector in injectors:
        injector.join()
    assert all(event is not None and event.xid == 94 for event in received)
    assert node.wait_event(0) is None


def test_stop_wakes_a_waiter_with_nvml_unavailable(node: FakeGpuBackend) -> None:
    failures: list[BaseException] = []

    def wait() -> None:
        try:
            node.wait_event(EVENT_WAIT_MS)
        except NvmlUnavailable as error:
            failures.append(error)

    waiter = threading.Thread(target=wait)
    waiter.start()
    threading.Timer(0.02, node.stop).start()
    waiter.join(EVENT_WAIT_MS / 1000)
    assert len(failures) == 1


# Memory errors.

def test_ecc_errors_raise_both_counters_and_a_reset_clears_the_volatile_ones(
        node: FakeGpuBackend) -> None:
    uuid = node.uuids()[0]
    node.raise_ecc(uuid, corrected=4)
    node.raise_ecc(uuid, corrected=1, uncorrected=2)
    sample = node.sample(uuid)
    assert (sample.ecc_volatile_corrected, sample.ecc_aggregate_corrected) == (5, 5)
    assert (sample.ecc_volatile_uncorrected, sample.ecc_aggregate_uncorrected) == (2, 2)
    assert [(event.kind, event.xid) for event in drain(node)] == [
        (EventKind.SINGLE_BIT_ECC, None), (EventKind.SINGLE_BIT_ECC, None),
        (EventKind.DOUBLE_BIT_ECC, None), (EventKind.XID, 48)]
    node.reset(uuid)
    sample = node.sample(uuid)
    assert (sample.ecc_volatile_corrected, sample.ecc_volatile_uncorrected) == (0, 0)
    assert (sample.ecc_aggregate_corrected, sample.ecc_aggregate_uncorrected) == (5, 2)


def test_aggregate_counters_never_go_down(node: FakeGpuBackend) -> None:
    uuid = node.uuids()[0]
    node.raise_ecc(uuid, uncorrected=3)
    with pytest.raises(ValueError, match="only grows"):
        node.set(uuid, "ecc_aggregate_uncorrected", 1)
    node.set(uuid, "ecc_aggregate_uncorrected", 9)
    assert node.sample(uuid).ecc_aggregate_uncorrected == 9


def test_a_pending_remap_is_applied_by_a_reset(node: FakeGpuBackend) -> None:
    uuid = node.uuids()[1]
    node.row_remap_pending(uuid)
    sample = node.sample(uuid)
    assert (sample.remap_pending, sample.remapped_rows_uncorrectable) == (1, 1)
    assert [event.xid for event in drain(node)] == [63]
    node.reset(uuid)
    sample = node.sample(uuid)
    assert (sample.remap_pending, sample.remapped_rows_uncorrectable) == (0, 1)


def test_a_remap_failure_survives_resets(node: FakeGpuBackend) -> None:
    uuid = node.uuids()[1]
    node.row_remap_failure(uuid)
    node.reset(uuid)
    assert node.sample(uuid).remap_failure == 1
    assert [event.xid for event in drain(node)] == [64]


def test_remapping_scenarios_leave_a_gpu_without_it_unsupported() -> None:
    backend = started("consumer-no-ecc")
    (uuid,) = backend.uuids()
    backend.row_remap_pending(uuid)
    backend.row_remap_failure(uuid)
    sample = backend.sample(uuid)
    assert sample.remap_pending is UNSUPPORTED
    assert sample.remap_failure is UNSUPPORTED
    assert backend.wait_event(0) is None


# The GPU as a whole.

def test_a_lost_gpu_reports_xid_79_then_answers_nothing(node: FakeGpuBackend) -> None:
    lost, healthy = node.uuids()[:2]
    node.lose(lost)
    assert drain(node) == [GpuEvent(lost, EventKind.XID, 79, 79)]
    for call in (node.sample, node.processes, node.reset):
        with pytest.raises(GpuGone) as gone:
            call(lost)
        assert gone.value.code == NvmlCode.GPU_IS_LOST
    assert node.sample(healthy).uuid == healthy
    assert len(node.devices()) == 7
    node.inject_xid(lost, 13)
    assert node.wait_event(0) is None


def test_a_recovered_gpu_answers_again_with_volatile_counters_cleared(
        node: FakeGpuBackend) -> None:
    uuid = node.uuids()[3]
    node.raise_ecc(uuid, uncorrected=1)
    node.add_process(uuid, 100, 1 << 20)
    node.lose(uuid)
    node.recover(uuid)
    drain(node)
    sample = node.sample(uuid)
    assert (sample.ecc_volatile_uncorrected, sample.ecc_aggregate_uncorrected) == (0, 1)
    assert node.processes(uuid) == ()
    assert len(node.devices()) == 8
    node.inject_xid(uuid, 31)
    assert drain(node) == [GpuEvent(uuid, EventKind.XID, 31, 31)]


def test_a_reset_needs_the_gpu_idle(node: FakeGpuBackend) -> None:
    uuid = node.uuids()[0]
    node.add_process(uuid, 321, None)
    with pytest.raises(ValueError, match="in use"):
        node.reset(uuid)
    node.remove_process(uuid, 321)
    node.reset(uuid)
    with pytest.raises(ValueError, match="no process"):
        node.remove_process(uuid, 321)


def test_processes_are_listed_by_pid(node: FakeGpuBackend) -> None:
    uuid = node.uuids()[0]
    node.add_process(uuid, 30, 3)
    node.add_process(uuid, 20, None)
    assert node.processes(uuid) == (GpuProcess(20, None), GpuProcess(30, 3))


# Thermal and time.

def test_an_overheated_gpu_is_at_slowdown_with_the_thermal_bit_and_violation_time(
        node: FakeGpuBackend) -> None:
    uuid = node.uuids()[0]
    node.overheat(uuid)
    sample = node.sample(uuid)
    assert isinstance(sample.temperature_c, int)
    assert isinstance(sample.slowdown_temperature_c, int)
    assert sample.temperature_c >= sample.slowdown_temperature_c
    assert isinstance(sample.clock_event_mask, int)
    assert sample.clock_event_mask & abi.CLOCK_EVENT_HW_THERMAL
    assert isinstance(sample.thermal_violation_ns, int)
    violation_ns = sample.thermal_violation_ns
    assert violation_ns > 0
    node.advance(250)
    assert node.sample(uuid).thermal_violation_ns == violation_ns + 250_000_000
    node.cool(uuid)
    cooled = node.sample(uuid)
    assert cooled.clock_event_mask == abi.CLOCK_EVENT_GPU_IDLE
    assert cooled.temperature_c == build_profile("h100-8").devices[0].sample.temperature_c


def test_overheating_below_slowdown_is_refused(node: FakeGpuBackend) -> None:
    with pytest.raises(ValueError, match="below the slowdown threshold"):
        node.overheat(node.uuids()[0], temperature_c=40)


def test_energy_accumulates_as_time_passes(node: FakeGpuBackend) -> None:
    uuid = node.uuids()[0]
    before = node.sample(uuid)
    node.advance(2000)
    assert isinstance(before.power_mw, int) and isinstance(before.energy_mj, int)
    assert node.sample(uuid).energy_mj == before.energy_mj + before.power_mw * 2


# NVLink and MIG.

def test_nvlink_errors_and_a_link_down_clear_on_reset() -> None:
    backend = started("nvbridge-2")
    uuid = min(backend.uuids())
    backend.nvlink_errors(uuid, 2, replay=3, recovery=1, crc=7)
    backend.nvlink_down(uuid, 5)
    links = backend.sample(uuid).nvlinks
    assert (links[2].replay_errors, links[2].recovery_errors, links[2].crc_flit_errors) == (
        3, 1, 7)
    assert not links[5].up
    assert backend.topology().pairs[0].nvlinks == 11
    backend.reset(uuid)
    links = backend.sample(uuid).nvlinks
    assert links[5].up and links[2].replay_errors == 0
    assert backend.topology().pairs[0].nvlinks == 12
    with pytest.raises(ValueError, match="no NVLink 12"):
        backend.nvlink_down(uuid, 12)


def test_mig_applies_at_reset_and_hides_remapping_and_nvlinks() -> None:
    backend = started("nvbridge-2")
    uuid = min(backend.uuids())
    backend.set_mig_mode(uuid, True)
    info = next(device for device in backend.devices() if device.uuid == uuid)
    assert (info.mig_enabled, info.mig_pending) == (False, True)
    backend.reset(uuid)
    info = next(device for device in backend.devices() if device.uuid == uuid)
    assert (info.mig_enabled, info.mig_pending) == (True, False)
    sample = backend.sample(uuid)
    assert sample.remap_pending is UNSUPPORTED
    assert sample.remapped_rows_correctable is UNSUPPORTED
    assert not any(link.up for link in sample.nvlinks)
    assert backend.topology().pairs[0].nvlinks == 0
    backend.set_mig_mode(uuid, False)
    backend.reset(uuid)
    assert backend.sample(uuid).remap_pending == 0


def test_fabric_state_can_degrade(node: FakeGpuBackend) -> None:
    uuid = node.uuids()[0]
    node.set_fabric(uuid, Fabric.IN_PROGRESS)
    assert node.sample(uuid).fabric is Fabric.IN_PROGRESS


# The driver.

def test_a_missing_driver_fails_start_and_every_call_once_started() -> None:
    backend = started("h100-8")
    uuid = backend.uuids()[0]
    backend.driver_missing()
    for call in (backend.devices, backend.topology, backend.driver,
                 lambda: backend.sample(uuid), lambda: backend.wait_event(0)):
        with pytest.raises(NvmlUnavailable) as unavailable:
            call()
        assert unavailable.value.code == NvmlCode.DRIVER_NOT_LOADED
    backend.stop()
    with pytest.raises(NvmlUnavailable) as unavailable:
        backend.start()
    assert unavailable.value.code == NvmlCode.LIBRARY_NOT_FOUND
    backend.restore_driver()
    backend.start()
    assert len(backend.devices()) == 8


@pytest.mark.parametrize("code", [NvmlCode.DRIVER_NOT_LOADED, NvmlCode.LIBRARY_NOT_FOUND,
                                  NvmlCode.LIB_RM_VERSION_MISMATCH, NvmlCode.NO_PERMISSION])
def test_fail_start_models_the_nodes_nvml_cannot_start_on(code: int) -> None:
    backend = FakeGpuBackend.from_profile("pcie-2")
    backend.fail_start(code)
    with pytest.raises(NvmlUnavailable) as unavailable:
        backend.start()
    assert unavailable.value.code == code


def test_fail_start_refuses_codes_that_do_not_stop_nvml() -> None:
    with pytest.raises(ValueError, match="does not stop NVML"):
        FakeGpuBackend.from_profile("pcie-2").fail_start(NvmlCode.NOT_SUPPORTED)


# Single readings.

def test_a_failing_reading_reads_failed_until_it_is_set(node: FakeGpuBackend) -> None:
    uuid = node.uuids()[0]
    node.fail(uuid, "power_mw", NvmlCode.UNKNOWN)
    assert node.sample(uuid).power_mw == Failed(NvmlCode.UNKNOWN, "Unknown Error")
    node.set(uuid, "power_mw", 123_000)
    assert node.sample(uuid).power_mw == 123_000
    with pytest.raises(ValueError, match="not transient"):
        node.fail(uuid, "power_mw", NvmlCode.GPU_IS_LOST)


def test_an_unsupported_reading_stays_unsupported(node: FakeGpuBackend) -> None:
    uuid = node.uuids()[0]
    node.unsupported(uuid, "ecc_volatile_corrected")
    node.raise_ecc(uuid, corrected=2)
    node.reset(uuid)
    assert node.sample(uuid).ecc_volatile_corrected is UNSUPPORTED
    with pytest.raises(ValueError, match="does not support"):
        node.set(uuid, "ecc_volatile_corrected", 1)
    with pytest.raises(ValueError, match="no reading"):
        node.set(uuid, "colour", 1)


# Snapshots.

def test_a_snapshot_round_trips_through_json(node: FakeGpuBackend) -> None:
    first, second = node.uuids()[:2]
    node.raise_ecc(first, corrected=2)
    node.fail(first, "power_mw", NvmlCode.NOT_READY)
    node.add_process(second, 77, None)
    node.set_mig_mode(second, True)
    node.lose(node.uuids()[7])
    replayed = FakeGpuBackend.from_snapshot(json.loads(json.dumps(node.snapshot())))
    replayed.start()
    assert replayed.devices() == node.devices()
    assert len(replayed.uuids()) == 7
    for uuid in replayed.uuids():
        assert replayed.sample(uuid) == node.sample(uuid)
        assert replayed.processes(uuid) == node.processes(uuid)
    assert replayed.topology() == node.topology()
    assert replayed.snapshot() == node.snapshot()


def test_a_recorded_snapshot_replays_what_the_backend_read() -> None:
    backend = started("nvbridge-2")
    document = record_snapshot(backend)
    assert document["devices"][0]["sample"]["retired_pages_sbe"] == "unsupported"
    replayed = FakeGpuBackend.from_snapshot(document)
    replayed.start()
    assert replayed.devices() == backend.devices()
    assert replayed.topology() == backend.topology()
    assert decode(document).devices[0].supported_events == (
        abi.EVENT_XID | abi.EVENT_SINGLE_BIT_ECC | abi.EVENT_DOUBLE_BIT_ECC)


@pytest.mark.parametrize(("change", "message"), [
    (lambda document: document.update(format="other/9"), "snapshot.format"),
    (lambda document: document["driver"].pop("nvml_version"), "driver.nvml_version: missing"),
    (lambda document: document["devices"][0]["info"].update(index=True),
     "devices[0].info.index: expected an integer"),
    (lambda document: document["devices"][0]["sample"].update(power_mw={"failed": "x"}),
     "sample.power_mw.failed: expected an integer"),
    (lambda document: document["devices"][0]["sample"].update(fabric="SHINY"),
     "unknown state 'SHINY'"),
    (lambda document: document["devices"][0]["info"].update(compute_capability=[9]),
     "compute_capability: expected [major, minor]"),
])
def test_a_malformed_snapshot_is_refused_naming_the_field(change: object, message: str) -> None:
    document = FakeGpuBackend.from_profile("pcie-2").snapshot()
    assert callable(change)
    change(document)
    with pytest.raises(SnapshotError) as refused:
        decode(document)
    assert message in str(refused.value)
