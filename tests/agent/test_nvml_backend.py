"""The NVML adapter's details, against `FakePynvml`: bus-id and string decoding, new-to-old
fallbacks, field values checked entry by entry, the error policy of reference/nvml.md §4.1 for
every class of code, event registration and decoding, process lists and topology counting."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Iterator

import pynvml
import pytest

from agent import nvml_abi as abi
from agent import record_snapshot
from agent.gpu import (
    UNSUPPORTED,
    WHOLE_DEVICE,
    EventKind,
    EventWaitFailed,
    Fabric,
    Failed,
    GpuEvent,
    GpuGone,
    GpuProcess,
    NvmlCode,
    NvmlUnavailable,
    ReadFailed,
)
from agent.nvml_backend import (
    EVENT_SET_REBUILD_FAILURES,
    NvmlBackend,
    decode_text,
    normalise_bus_id,
)
from agent.nvml_sample import _field_value
from tests.agent.fake_pynvml import FakePynvml

WAIT_MS = 50
EVENT_WAIT_MS = 10_000
WAITS_FAILED_MAX = 12  # failed waits in a row a test sits through before giving up


class Rig:
    """A FakePynvml and the NvmlBackend over it; `start()` when the knobs are set."""

    def __init__(self, profile: str, sysfs_root: pathlib.Path) -> None:
        self.nvml = FakePynvml.from_profile(profile)
        self.backend = NvmlBackend(self.nvml, sysfs_root=sysfs_root)
        self.uuids = self.nvml.uuids()

    def start(self) -> Rig:
        self.backend.start()
        return self

    def count(self, function: str) -> int:
        return self.nvml.calls.count(function)


@pytest.fixture
def rigs(tmp_path: pathlib.Path) -> Iterator[list[Rig]]:
    made: list[Rig] = []
    yield made
    for rig in made:
        rig.backend.stop()


@pytest.fixture
def rig(rigs: list[Rig], tmp_path: pathlib.Path) -> Rig:
    made = Rig("h100-8", tmp_path)
    rigs.append(made)
    return made


def make_rig(rigs: list[Rig], tmp_path: pathlib.Path, profile: str) -> Rig:
    made = Rig(profile, tmp_path)
    rigs.append(made)
    return made


# Decoding.

@pytest.mark.parametrize(("raw", "expected"), [
    (b"00000000:3B:00.0", "0000:3b:00.0"),
    ("0000:3B:00.0", "0000:3b:00.0"),
    (b"00000001:0A:1F.7\x00\x00", "0001:0a:1f.7"),
    ("00010000:db:00.0", "10000:db:00.0"),
    ("3b:00.0", "0000:3b:00.0"),
])
def test_bus_ids_are_normalised_to_the_sysfs_form(raw: str | bytes, expected: str) -> None:
    assert normalise_bus_id(raw) == expected


@pytest.mark.parametrize("raw", ["", "GPU-1234", "0000:3b:00", b"zz:yy:xx.w"])
def test_a_bus_id_that_is_not_one_is_refused(raw: str | bytes) -> None:
    with pytest.raises(ValueError, match="not a PCI bus id"):
        normalise_bus_id(raw)


def test_text_from_the_binding_is_decoded_from_bytes_or_str() -> None:
    assert decode_text(b"NVIDIA H100 80GB HBM3\x00\x00") == "NVIDIA H100 80GB HBM3"
    assert decode_text("550.90.07") == "550.90.07"
    assert decode_text(b"\xff") == "\ufffd"


def test_bindings_that_return_bytes_give_the_same_devices(rig: Rig, rigs: list[Rig],
                                                          tmp_path: pathlib.Path) -> None:
    as_bytes = make_rig(rigs, tmp_path, "h100-8")
    as_bytes.nvml.strings_as_bytes = True
    assert as_bytes.start().backend.devices() == rig.start().backend.devices()
    assert as_bytes.backend.driver() == rig.backend.driver()
    assert as_bytes.backend.devices()[0].pci_bus_id == "0000:18:00.0"


# New calls first, old ones where the driver or the binding lacks the new one.

def test_temperature_falls_back_to_the_deprecated_call_once(rig: Rig) -> None:
    rig.nvml.remove_function("nvmlDeviceGetTemperatureV")
    rig.start()
    expected = rig.nvml.devices[0].record.sample.temperature_c
    assert rig.backend.sample(rig.uuids[0]).temperature_c == expected
    assert rig.backend.sample(rig.uuids[1]).temperature_c != UNSUPPORTED
    assert rig.count("nvmlDeviceGetTemperatureV") == 1, "a missing function is remembered"
    assert rig.count("nvmlDeviceGetTemperature") == 2


def test_a_binding_without_the_new_call_uses_the_old_one(rig: Rig) -> None:
    rig.nvml.drop_from_binding("nvmlDeviceGetCurrentClocksEventReasons")
    rig.start()
    assert rig.backend.sample(rig.uuids[0]).clock_event_mask == abi.CLOCK_EVENT_GPU_IDLE
    assert rig.count("nvmlDeviceGetCurrentClocksThrottleReasons") == 1


def test_without_field_values_violations_come_from_the_old_call(rig: Rig) -> None:
    rig.nvml.remove_function("nvmlDeviceGetFieldValues")
    rig.nvml.set_reading(rig.uuids[0], "thermal_violation_ns", 5_000)
    sample = rig.start().backend.sample(rig.uuids[0])
    assert (sample.thermal_violation_ns, sample.power_violation_ns) == (5_000, 0)
    assert sample.recovery_action is UNSUPPORTED
    assert rig.count("nvmlDeviceGetViolationStatus") == 2


def test_fabric_state_falls_back_to_the_unversioned_call(rig: Rig) -> None:
    rig.nvml.remove_function("nvmlDeviceGetGpuFabricInfoV")
    assert rig.start().backend.sample(rig.uuids[0]).fabric is Fabric.COMPLETED
    assert rig.count("nvmlDeviceGetGpuFabricInfo") == 1


def test_a_restart_probes_missing_functions_again(rig: Rig) -> None:
    rig.nvml.remove_function("nvmlDeviceGetTemperatureV")
    rig.start().backend.sample(rig.uuids[0])
    rig.backend.stop()
    rig.backend.start()
    rig.backend.sample(rig.uuids[0])
    assert rig.count("nvmlDeviceGetTemperatureV") == 2


# Field values: each entry has its own return code.

def test_field_values_are_checked_entry_by_entry(rig: Rig) -> None:
    uuid = rig.uuids[0]
    rig.nvml.set_reading(uuid, "power_violation_ns", 7_000)
    rig.nvml.fail_field(uuid, abi.FIELD_THERMAL_VIOLATION_NS, NvmlCode.NOT_SUPPORTED)
    rig.nvml.fail_field(uuid, abi.FIELD_RECOVERY_ACTION, NvmlCode.UNKNOWN)
    sample = rig.start().backend.sample(uuid)
    assert sample.power_violation_ns == 7_000
    assert sample.thermal_violation_ns is UNSUPPORTED
    assert sample.recovery_action == Failed(NvmlCode.UNKNOWN, "Unknown Error")


def test_a_field_entry_saying_the_gpu_is_lost_raises_gpu_gone(rig: Rig) -> None:
    rig.nvml.fail_field(rig.uuids[0], abi.FIELD_RECOVERY_ACTION, NvmlCode.GPU_IS_LOST)
    with pytest.raises(GpuGone):
        rig.start().backend.sample(rig.uuids[0])


def test_field_entries_missing_or_for_other_fields_read_failed(rig: Rig) -> None:
    """NVML answers the fields in the order asked: an entry in a field's place that is for
    another field, or none at all, is a failed read of that field, not a crash."""
    uuid = rig.uuids[0]
    rig.nvml.set_reading(uuid, "power_violation_ns", 7_000)
    rig.nvml.answer_fields(uuid, [abi.FIELD_POWER_VIOLATION_NS, 9999])
    sample = rig.start().backend.sample(uuid)
    assert sample.power_violation_ns == 7_000
    assert sample.thermal_violation_ns == Failed(
        NvmlCode.UNKNOWN, f"field {abi.FIELD_THERMAL_VIOLATION_NS}: field 9999 answered")
    assert sample.recovery_action == Failed(
        NvmlCode.UNKNOWN, "not in nvmlDeviceGetFieldValues' answer")


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_a_double_field_entry_that_is_no_number_reads_failed(value: float) -> None:
    field_id = abi.FIELD_THERMAL_VIOLATION_NS
    entry = pynvml.c_nvmlFieldValue_t(fieldId=field_id, scopeId=0, timestamp=0, latencyUsec=0,
                                      valueType=0, nvmlReturn=abi.SUCCESS)  # 0: a double
    entry.value.dVal = value
    reading = _field_value("GPU-x", field_id, entry)
    assert isinstance(reading, Failed) and "malformed entry" in reading.message


# The error policy, one code at a time, on one reading of one GPU.

CAPABILITY_ABSENT = [NvmlCode.NOT_SUPPORTED, NvmlCode.FUNCTION_NOT_FOUND, 22]
TRANSIENT = [NvmlCode.INVALID_ARGUMENT, NvmlCode.TIMEOUT, NvmlCode.NOT_READY, NvmlCode.NO_DATA,
             7, 19, NvmlCode.CORRUPTED_INFOROM, NvmlCode.UNKNOWN]
DEVICE_FAULTS = [NvmlCode.GPU_IS_LOST, NvmlCode.RESET_REQUIRED, NvmlCode.GPU_NOT_FOUND]
NODE_FAULTS = [NvmlCode.LIBRARY_NOT_FOUND, NvmlCode.DRIVER_NOT_LOADED,
               NvmlCode.LIB_RM_VERSION_MISMATCH, NvmlCode.UNINITIALIZED,
               NvmlCode.OPERATING_SYSTEM, NvmlCode.NO_PERMISSION]


@pytest.mark.parametrize("code", CAPABILITY_ABSENT)
def test_an_absent_capability_reads_unsupported(rig: Rig, code: int) -> None:
    rig.nvml.fail_call("nvmlDeviceGetPowerUsage", code, rig.uuids[0])
    assert rig.start().backend.sample(rig.uuids[0]).power_mw is UNSUPPORTED


@pytest.mark.parametrize("code", TRANSIENT)
def test_a_transient_error_reads_failed_with_its_code(rig: Rig, code: int) -> None:
    rig.nvml.fail_call("nvmlDeviceGetPowerUsage", code, rig.uuids[0])
    reading = rig.start().backend.sample(rig.uuids[0]).power_mw
    assert isinstance(reading, Failed)
    assert reading.code == code


@pytest.mark.parametrize("code", DEVICE_FAULTS)
def test_a_device_fault_raises_gpu_gone_for_that_gpu_only(rig: Rig, code: int) -> None:
    rig.nvml.fail_call("nvmlDeviceGetPowerUsage", code, rig.uuids[0])
    rig.start()
    with pytest.raises(GpuGone) as gone:
        rig.backend.sample(rig.uuids[0])
    assert (gone.value.uuid, gone.value.code) == (rig.uuids[0], code)
    assert isinstance(rig.backend.sample(rig.uuids[1]).power_mw, int)


@pytest.mark.parametrize("code", NODE_FAULTS)
def test_a_node_fault_raises_nvml_unavailable(rig: Rig, code: int) -> None:
    rig.nvml.fail_call("nvmlDeviceGetPowerUsage", code, rig.uuids[0])
    with pytest.raises(NvmlUnavailable) as unavailable:
        rig.start().backend.sample(rig.uuids[0])
    assert unavailable.value.code == code


@pytest.mark.parametrize("code", NODE_FAULTS)
def test_a_failed_init_raises_nvml_unavailable_with_its_code(rig: Rig, code: int) -> None:
    rig.nvml.fail_init(code)
    with pytest.raises(NvmlUnavailable) as unavailable:
        rig.backend.start()
    assert unavailable.value.code == code
    rig.backend.stop()
    assert rig.count("nvmlShutdown") == 0


def test_an_invalid_link_index_means_the_link_does_not_exist(rig: Rig) -> None:
    rig.nvml.fail_call("nvmlDeviceGetNvLinkErrorCounter", NvmlCode.INVALID_ARGUMENT)
    links = rig.start().backend.sample(rig.uuids[0]).nvlinks
    assert len(links) == 18
    assert all(link.up and link.replay_errors is UNSUPPORTED for link in links)


def test_links_are_probed_once_per_start(rig: Rig) -> None:
    rig.start().backend.sample(rig.uuids[0])
    probes = rig.count("nvmlDeviceGetNvLinkState")
    assert probes == abi.NVLINK_LINKS_MAX + 18
    rig.backend.sample(rig.uuids[0])
    assert rig.count("nvmlDeviceGetNvLinkState") == probes + 18


# Lifecycle.

def test_start_and_stop_pair_init_and_shutdown(rig: Rig) -> None:
    rig.start()
    rig.backend.start()
    assert rig.nvml.initialised == 1
    rig.backend.stop()
    rig.backend.stop()
    assert rig.nvml.initialised == 0
    assert all(event_set.freed for event_set in rig.nvml.event_sets)


def test_start_that_fails_after_init_shuts_nvml_down_again(rig: Rig) -> None:
    rig.nvml.fail_call("nvmlDeviceGetCount", NvmlCode.DRIVER_NOT_LOADED)
    with pytest.raises(NvmlUnavailable):
        rig.backend.start()
    assert rig.nvml.initialised == 0


def test_driver_versions_missing_from_the_driver_read_empty(rig: Rig) -> None:
    rig.nvml.remove_function("nvmlSystemGetNVMLVersion")
    rig.nvml.fail_call("nvmlSystemGetCudaDriverVersion", NvmlCode.NOT_SUPPORTED)
    driver = rig.start().backend.driver()
    assert (driver.driver_version, driver.nvml_version, driver.cuda_driver_version) == (
        "550.90.07", "", 0)


# Identity.

def test_a_gpu_that_cannot_be_identified_is_left_out(rig: Rig) -> None:
    rig.nvml.fail_call("nvmlDeviceGetName", NvmlCode.UNKNOWN, rig.uuids[2])
    rig.nvml.fail_call("nvmlDeviceGetUUID", NvmlCode.GPU_IS_LOST, rig.uuids[5])
    listed = [device.uuid for device in rig.start().backend.devices()]
    assert listed == [uuid for uuid in rig.uuids if uuid not in (rig.uuids[2], rig.uuids[5])]


def test_a_gpu_whose_bus_id_is_not_one_is_left_out(rig: Rig) -> None:
    garbled = rig.uuids[2]
    rig.nvml.set_bus_id(garbled, b"GPU@nowhere")
    listed = [device.uuid for device in rig.start().backend.devices()]
    assert listed == [uuid for uuid in rig.uuids if uuid != garbled]
    topology = rig.backend.topology()
    assert len(topology.pairs) == 21  # the pairs of the 7 others
    assert any(garbled in note and "not a PCI bus id" in note for note in topology.notes)


def test_optional_identity_reads_fall_back_to_unknown(rig: Rig) -> None:
    for function in ("nvmlDeviceGetSerial", "nvmlDeviceGetMinorNumber",
                     "nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetMigMode",
                     "nvmlDeviceGetNumaNodeId"):
        rig.nvml.fail_call(function, NvmlCode.NOT_SUPPORTED)
    device = rig.start().backend.devices()[0]
    assert (device.serial, device.minor, device.compute_capability) == ("", -1, (0, 0))
    assert (device.mig_enabled, device.mig_pending, device.numa_node) == (False, False, -1)


def test_a_pending_mig_mode_is_reported(rig: Rig) -> None:
    rig.nvml.set_info(rig.uuids[0], mig_enabled=False, mig_pending=True)
    device = rig.start().backend.devices()[0]
    assert (device.mig_enabled, device.mig_pending) == (False, True)


def test_the_numa_node_comes_from_sysfs_when_nvml_has_none(rigs: list[Rig],
                                                           tmp_path: pathlib.Path) -> None:
    consumer = make_rig(rigs, tmp_path, "consumer-no-ecc")
    node_file = tmp_path / "bus" / "pci" / "devices" / "0000:01:00.0" / "numa_node"
    node_file.parent.mkdir(parents=True)
    node_file.write_text("1\n", encoding="ascii")
    assert consumer.start().backend.devices()[0].numa_node == 1
    node_file.write_text("-1\n", encoding="ascii")
    assert consumer.backend.devices()[0].numa_node == -1


def test_a_completed_fabric_registration_that_failed_reads_not_started(rig: Rig) -> None:
    rig.nvml.fabric_status = NvmlCode.UNKNOWN
    assert rig.start().backend.sample(rig.uuids[0]).fabric is Fabric.NOT_STARTED
    rig.nvml.fabric_status = 0
    rig.nvml.set_fabric(rig.uuids[0], Fabric.IN_PROGRESS)
    assert rig.backend.sample(rig.uuids[0]).fabric is Fabric.IN_PROGRESS


# Events.

def test_events_are_registered_only_for_supported_health_bits(rigs: list[Rig],
                                                              tmp_path: pathlib.Path) -> None:
    datacenter = make_rig(rigs, tmp_path, "h100-8")
    datacenter.nvml.set_supported_events(datacenter.uuids[1], abi.EVENT_XID | abi.EVENT_PSTATE)
    datacenter.nvml.set_supported_events(datacenter.uuids[2], abi.EVENT_PSTATE)
    datacenter.start()
    registered = datacenter.nvml.registrations
    assert registered[datacenter.uuids[0]] == (
        abi.EVENT_SINGLE_BIT_ECC | abi.EVENT_DOUBLE_BIT_ECC | abi.EVENT_XID
        | abi.EVENT_GPU_UNAVAILABLE | abi.EVENT_RECOVERY_ACTION)
    assert registered[datacenter.uuids[1]] == abi.EVENT_XID
    assert datacenter.uuids[2] not in registered
    consumer = make_rig(rigs, tmp_path, "consumer-no-ecc").start()
    assert consumer.nvml.registrations == {consumer.uuids[0]: abi.EVENT_XID}


def test_gpus_whose_event_calls_fail_are_skipped(rig: Rig) -> None:
    rig.nvml.fail_call("nvmlDeviceGetSupportedEventTypes", NvmlCode.NOT_SUPPORTED, rig.uuids[0])
    rig.nvml.fail_call("nvmlDeviceRegisterEvents", NvmlCode.UNKNOWN, rig.uuids[1])
    rig.nvml.fail_call("nvmlDeviceRegisterEvents", NvmlCode.GPU_IS_LOST, rig.uuids[2])
    rig.start()
    assert set(rig.nvml.registrations) == set(rig.uuids[3:])


def test_events_that_need_privileges_leave_the_gpus_unwatched(rig: Rig) -> None:
    rig.nvml.fail_call("nvmlDeviceRegisterEvents", NvmlCode.NO_PERMISSION)
    assert len(rig.start().backend.devices()) == 8
    assert rig.nvml.registrations == {}


def test_nvml_going_away_while_registering_fails_the_start(rig: Rig) -> None:
    rig.nvml.fail_call("nvmlDeviceGetSupportedEventTypes", NvmlCode.DRIVER_NOT_LOADED)
    with pytest.raises(NvmlUnavailable):
        rig.backend.start()
    assert rig.nvml.initialised == 0


def test_without_event_support_wait_event_still_blocks(rig: Rig) -> None:
    rig.nvml.fail_call("nvmlEventSetCreate", NvmlCode.NOT_SUPPORTED)
    rig.start()
    begun = time.monotonic()
    assert rig.backend.wait_event(WAIT_MS) is None
    assert time.monotonic() - begun >= WAIT_MS / 1000 * 0.9


@pytest.mark.parametrize(("event_type", "data", "kind", "xid"), [
    (abi.EVENT_XID, 79, EventKind.XID, 79),
    (abi.EVENT_SINGLE_BIT_ECC, 3, EventKind.SINGLE_BIT_ECC, None),
    (abi.EVENT_DOUBLE_BIT_ECC, 1, EventKind.DOUBLE_BIT_ECC, None),
    (abi.EVENT_GPU_UNAVAILABLE, 0, EventKind.GPU_UNAVAILABLE, None),
    (abi.EVENT_RECOVERY_ACTION, 2, EventKind.RECOVERY_ACTION, None),
    (abi.EVENT_FATAL_POISON, 5, EventKind.OTHER, None),
])
def test_events_are_decoded(rig: Rig, event_type: int, data: int, kind: EventKind,
                            xid: int | None) -> None:
    uuid = rig.uuids[4]
    rig.nvml.set_supported_events(uuid, abi.HEALTH_EVENTS)
    rig.start()
    rig.nvml.inject_event(uuid, event_type, data)
    assert rig.backend.wait_event(EVENT_WAIT_MS) == GpuEvent(uuid, kind, xid, data)


def test_mig_instance_ids_pass_through(rig: Rig) -> None:
    rig.start()
    rig.nvml.inject_event(rig.uuids[0], abi.EVENT_XID, 31, gpu_instance=1, compute_instance=0)
    event = rig.backend.wait_event(EVENT_WAIT_MS)
    assert event == GpuEvent(rig.uuids[0], EventKind.XID, 31, 31, 1, 0)
    assert WHOLE_DEVICE not in (event.gpu_instance, event.compute_instance)


def test_unregistered_bits_never_arrive(rig: Rig) -> None:
    rig.start()
    rig.nvml.inject_event(rig.uuids[0], abi.EVENT_PSTATE, 2)
    assert rig.backend.wait_event(WAIT_MS) is None


def test_early_timeouts_do_not_end_the_wait(rig: Rig) -> None:
    rig.start()
    rig.nvml.spurious_timeouts(3)
    begun = time.monotonic()
    assert rig.backend.wait_event(WAIT_MS) is None
    assert time.monotonic() - begun >= WAIT_MS / 1000 * 0.9
    assert rig.count("nvmlEventSetWait") >= 4


@pytest.mark.parametrize("code", [NvmlCode.UNKNOWN, NvmlCode.GPU_IS_LOST, NvmlCode.NOT_SUPPORTED])
def test_a_failed_wait_raises_event_wait_failed(rig: Rig, code: int) -> None:
    rig.start()
    rig.nvml.fail_next_wait(code)
    with pytest.raises(EventWaitFailed) as failed:
        rig.backend.wait_event(WAIT_MS)
    assert failed.value.code == code


def test_a_wait_that_finds_nvml_gone_raises_nvml_unavailable(rig: Rig) -> None:
    rig.start()
    rig.nvml.fail_next_wait(NvmlCode.DRIVER_NOT_LOADED)
    with pytest.raises(NvmlUnavailable):
        rig.backend.wait_event(WAIT_MS)


@pytest.mark.parametrize("code", [NvmlCode.UNKNOWN, NvmlCode.UNINITIALIZED])
def test_an_event_set_whose_waits_keep_failing_is_made_again(rig: Rig, code: int) -> None:
    """§1.2: a wait failing with anything but Timeout, every time, had the agent wait on the
    same event set for ever, and an XID posted later was never seen. The set is made again
    (the old one freed, every GPU registered anew) after a few failures in a row."""
    rig.start()
    rig.nvml.break_event_sets(code)
    failed = 0
    event = None
    while event is None and failed < WAITS_FAILED_MAX:
        try:
            event = rig.backend.wait_event(WAIT_MS)
        except (EventWaitFailed, NvmlUnavailable):
            failed += 1
            rig.nvml.inject_xid(rig.uuids[3], abi.XID_DOUBLE_BIT_ECC)
    assert event == GpuEvent(rig.uuids[3], EventKind.XID, 48, 48)
    assert failed == EVENT_SET_REBUILD_FAILURES
    first, second = rig.nvml.event_sets
    assert first.freed and not second.freed
    assert second.registered == first.registered != {}


def test_event_set_rebuilds_back_off_while_waits_keep_failing(rig: Rig) -> None:
    rig.start()
    rig.nvml.fail_call("nvmlEventSetWait", NvmlCode.UNKNOWN)  # on every set, every time
    for _ in range(EVENT_SET_REBUILD_FAILURES * 7):  # 3, then 6 and 12 more
        with pytest.raises(EventWaitFailed):
            rig.backend.wait_event(WAIT_MS)
    assert rig.count("nvmlEventSetCreate") == 1 + 3
    assert rig.backend.event_set_rebuilds == 3
    assert sum(not event_set.freed for event_set in rig.nvml.event_sets) == 1


def test_an_event_from_a_lost_gpu_still_names_it(rig: Rig) -> None:
    rig.start()
    rig.nvml.lose(rig.uuids[6])
    event = rig.backend.wait_event(EVENT_WAIT_MS)
    assert event == GpuEvent(rig.uuids[6], EventKind.XID, 79, 79)


def test_an_event_from_an_unknown_device_raises_event_wait_failed(rig: Rig) -> None:
    rig.start()
    rig.nvml.inject_foreign_event(abi.EVENT_XID, 79)
    with pytest.raises(EventWaitFailed):
        rig.backend.wait_event(EVENT_WAIT_MS)


def test_a_negative_timeout_is_refused(rig: Rig) -> None:
    with pytest.raises(ValueError, match="timeout_ms"):
        rig.start().backend.wait_event(-1)


# Processes.

def test_compute_and_graphics_processes_merge_by_pid(rig: Rig) -> None:
    uuid = rig.uuids[0]
    rig.nvml.set_processes(uuid, compute=[(10, 100), (5, None)], graphics=[(10, 50), (7, 70)])
    assert rig.start().backend.processes(uuid) == (
        GpuProcess(5, None), GpuProcess(7, 70), GpuProcess(10, 100))


def test_graphics_processes_may_be_unsupported(rig: Rig) -> None:
    uuid = rig.uuids[0]
    rig.nvml.set_processes(uuid, compute=[(10, 100)])
    rig.nvml.fail_call("nvmlDeviceGetGraphicsRunningProcesses", NvmlCode.NOT_SUPPORTED)
    assert rig.start().backend.processes(uuid) == (GpuProcess(10, 100),)


def test_a_driver_without_v3_process_lists_is_read_through_v2(rig: Rig) -> None:
    uuid = rig.uuids[0]
    rig.nvml.set_processes(uuid, compute=[(10, 100)])
    rig.nvml.remove_function("nvmlDeviceGetComputeRunningProcesses")
    rig.nvml.remove_function("nvmlDeviceGetGraphicsRunningProcesses")
    assert rig.start().backend.processes(uuid) == (GpuProcess(10, 100),)
    assert rig.count("nvmlDeviceGetComputeRunningProcesses_v2") == 1


@pytest.mark.parametrize("code", [NvmlCode.NOT_SUPPORTED, NvmlCode.UNKNOWN])
def test_an_unreadable_compute_list_is_never_read_as_empty(rig: Rig, code: int) -> None:
    rig.nvml.fail_call("nvmlDeviceGetComputeRunningProcesses", code)
    with pytest.raises(ReadFailed) as failed:
        rig.start().backend.processes(rig.uuids[0])
    assert failed.value.code == code


# Topology.

def test_bridged_nvlinks_are_counted_per_pair_over_up_links(rigs: list[Rig],
                                                            tmp_path: pathlib.Path) -> None:
    bridged = make_rig(rigs, tmp_path, "nvbridge-2").start()
    (pair,) = bridged.backend.topology().pairs
    assert (pair.nvlinks, pair.level) == (12, abi.TOPOLOGY_SINGLE)
    low = min(bridged.uuids)  # pairs count links from their first GPU's side
    bridged.nvml.set_link_up(low, 3, False)
    bridged.nvml.set_link_up(low, 4, False)
    (pair,) = bridged.backend.topology().pairs
    assert pair.nvlinks == 10
    assert not bridged.backend.topology().nvswitch


def test_nvswitch_peers_set_the_flag_and_count_no_pair_links(rig: Rig) -> None:
    topology = rig.start().backend.topology()
    assert topology.nvswitch
    assert len(topology.pairs) == 28
    assert all(pair.nvlinks == 0 for pair in topology.pairs)


def test_pcie_gpus_have_no_nvlinks(rigs: list[Rig], tmp_path: pathlib.Path) -> None:
    pcie = make_rig(rigs, tmp_path, "pcie-2").start()
    (pair,) = pcie.backend.topology().pairs
    assert (pair.nvlinks, pair.level) == (0, abi.TOPOLOGY_SYSTEM)
    assert pcie.backend.sample(pcie.uuids[0]).nvlinks == ()


def test_an_unreadable_topology_level_is_taken_as_the_farthest(rigs: list[Rig],
                                                               tmp_path: pathlib.Path) -> None:
    bridged = make_rig(rigs, tmp_path, "nvbridge-2")
    bridged.nvml.fail_call("nvmlDeviceGetTopologyCommonAncestor", NvmlCode.NOT_SUPPORTED)
    topology = bridged.start().backend.topology()
    assert topology.pairs[0].level == abi.TOPOLOGY_SYSTEM
    assert "topology level unknown" in topology.notes[0]


# The snapshot command, on this machine's real NVML.

def test_the_record_command_reports_an_unavailable_nvml(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "snapshot.json"
    status = record_snapshot.main([str(target)])
    if status == 0:
        pytest.skip("this machine has a working NVML")
    assert status == record_snapshot.EXIT_NVML_UNAVAILABLE
    assert not target.exists()
    assert record_snapshot.main([]) == record_snapshot.EXIT_USAGE
