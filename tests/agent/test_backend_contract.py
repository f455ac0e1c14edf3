"""One contract for every `GpuBackend`: `FakeGpuBackend`, `NvmlBackend` over `FakePynvml` built
to the same profile, and `NvmlBackend` over the machine's real NVML (marker `gpu`: it skips,
saying why, where NVML cannot start, as on CI).

Both fakes are built from the same profile snapshot, so beyond the contract they must answer
alike, field for field: that is checked for every profile."""

from __future__ import annotations

import dataclasses
import pathlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from agent.fake_backend import FakeGpuBackend
from agent.gpu import (
    UNSUPPORTED,
    EventKind,
    Fabric,
    Failed,
    GpuBackend,
    GpuGone,
    GpuProcess,
    NvmlCode,
    NvmlUnavailable,
    Unsupported,
)
from agent.gpu_profiles import PROFILE_NAMES, build_profile
from agent.gpu_snapshot import LINK_READING_FIELDS, READING_FIELDS
from agent.nvml_backend import NvmlBackend
from agent.nvml_policy import ErrorClass, classify
from tests.agent.fake_pynvml import FakePynvml

UUID_FORMAT = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
BUS_ID_FORMAT = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
DEFAULT_PROFILE = "h100-8"
IDLE_TIMEOUT_MS = 50
EVENT_TIMEOUT_MS = 10_000


@dataclass
class Subject:
    """A backend and the scenario controls its kind offers (None for the real NVML)."""

    backend: GpuBackend
    inject_xid: Callable[[str, int], None] | None = None
    lose: Callable[[str], None] | None = None
    add_process: Callable[[str, int, int | None], None] | None = None
    remove_driver: Callable[[], None] | None = None

    def controls(self) -> Subject:
        if self.inject_xid is None:
            pytest.skip("no scenario controls on real GPUs")
        return self


def fake_subject(profile: str, _: pathlib.Path) -> Subject:
    fake = FakeGpuBackend.from_profile(profile)
    return Subject(fake, fake.inject_xid, fake.lose, fake.add_process, fake.driver_missing)


def adapter_subject(profile: str, sysfs_root: pathlib.Path) -> Subject:
    nvml = FakePynvml.from_profile(profile)
    processes: dict[str, list[tuple[int, int | None]]] = {}

    def add_process(uuid: str, pid: int, used_bytes: int | None) -> None:
        processes.setdefault(uuid, []).append((pid, used_bytes))
        nvml.set_processes(uuid, compute=processes[uuid])

    return Subject(NvmlBackend(nvml, sysfs_root=sysfs_root), nvml.inject_xid, nvml.lose,
                   add_process, nvml.library_missing)


def real_subject(profile: str, _: pathlib.Path) -> Subject:
    if profile != DEFAULT_PROFILE:
        pytest.skip("the real backend has one profile: this machine's")
    return Subject(NvmlBackend())


KINDS = {"fake": fake_subject, "nvml-over-fake-pynvml": adapter_subject,
         "nvml-real": real_subject}


class Maker:
    def __init__(self, kind: str, sysfs_root: pathlib.Path) -> None:
        self._build = KINDS[kind]
        self._sysfs_root = sysfs_root
        self._started: list[GpuBackend] = []

    def unstarted(self, profile: str = DEFAULT_PROFILE) -> Subject:
        return self._build(profile, self._sysfs_root)

    def started(self, profile: str = DEFAULT_PROFILE) -> Subject:
        subject = self.unstarted(profile)
        try:
            subject.backend.start()
        except NvmlUnavailable as error:
            pytest.skip(f"NVML cannot start here: {error}")
        self._started.append(subject.backend)
        return subject

    def stop_all(self) -> None:
        for backend in self._started:
            backend.stop()


@pytest.fixture(params=["fake", "nvml-over-fake-pynvml",
                        pytest.param("nvml-real", marks=pytest.mark.gpu)])
def make(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[Maker]:
    maker = Maker(request.param, tmp_path)
    yield maker
    maker.stop_all()


def timed_wait(backend: GpuBackend, timeout_ms: int) -> tuple[object, float]:
    begun = time.monotonic()
    event = backend.wait_event(timeout_ms)
    return event, time.monotonic() - begun


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_devices_are_named_by_unique_uuids_and_normalised_bus_ids(make: Maker,
                                                                   profile: str) -> None:
    devices = make.started(profile).backend.devices()
    assert all(UUID_FORMAT.match(device.uuid) for device in devices)
    assert all(BUS_ID_FORMAT.match(device.pci_bus_id) for device in devices)
    assert len({device.uuid for device in devices}) == len(devices)
    assert len({device.index for device in devices}) == len(devices)
    assert all(device.memory_bytes > 0 and device.model for device in devices)


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_samples_hold_readings_of_the_right_types(make: Maker, profile: str) -> None:
    backend = make.started(profile).backend
    for device in backend.devices():
        sample = backend.sample(device.uuid)
        assert sample.uuid == device.uuid
        assert isinstance(sample.fabric, Fabric)
        readings = [getattr(sample, name) for name in READING_FIELDS] + [
            getattr(link, name) for link in sample.nvlinks for name in LINK_READING_FIELDS]
        for reading in readings:
            assert isinstance(reading, Unsupported | Failed) or (
                type(reading) is int and reading >= 0), reading
        assert [link.link for link in sample.nvlinks] == sorted({
            link.link for link in sample.nvlinks})


def test_signals_a_gpu_lacks_read_unsupported_not_zero(make: Maker) -> None:
    backend = make.started("consumer-no-ecc").backend
    (device,) = backend.devices()
    sample = backend.sample(device.uuid)
    for name in ("ecc_enabled", "ecc_volatile_uncorrected", "ecc_aggregate_uncorrected",
                 "remap_failure", "retired_pages_pending", "recovery_action"):
        assert getattr(sample, name) is UNSUPPORTED, name
    assert sample.nvlinks == ()
    assert sample.fabric is Fabric.NOT_SUPPORTED
    assert device.serial == ""
    assert device.numa_node == -1


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_topology_names_every_pair_of_gpus_once(make: Maker, profile: str) -> None:
    backend = make.started(profile).backend
    uuids = {device.uuid for device in backend.devices()}
    pairs = backend.topology().pairs
    assert {(pair.uuid_a, pair.uuid_b) for pair in pairs} == {
        (a, b) for a in uuids for b in uuids if a < b}
    assert all(pair.level >= 0 and pair.nvlinks >= 0 for pair in pairs)


def test_nvswitch_and_bridged_nvlinks_show_in_the_topology(make: Maker) -> None:
    make.started().controls()
    switched = make.started("h100-8").backend.topology()
    assert switched.nvswitch
    assert all(pair.nvlinks == 0 for pair in switched.pairs)
    (bridged,) = make.started("nvbridge-2").backend.topology().pairs
    assert bridged.nvlinks == 12


def test_processes_are_listed_by_pid(make: Maker) -> None:
    subject = make.started().controls()
    assert subject.add_process is not None
    first, second = (device.uuid for device in subject.backend.devices()[:2])
    subject.add_process(first, 4242, 1 << 30)
    subject.add_process(first, 17, None)
    assert subject.backend.processes(first) == (GpuProcess(17, None), GpuProcess(4242, 1 << 30))
    assert subject.backend.processes(second) == ()


def test_wait_event_blocks_for_the_whole_timeout_when_nothing_happens(make: Maker) -> None:
    event, elapsed_s = timed_wait(make.started().backend, IDLE_TIMEOUT_MS)
    assert event is None
    assert elapsed_s >= IDLE_TIMEOUT_MS / 1000 * 0.9


def test_wait_event_blocks_on_a_node_without_gpus(make: Maker) -> None:
    backend = make.started("no-gpu").controls().backend
    assert backend.devices() == ()
    event, elapsed_s = timed_wait(backend, IDLE_TIMEOUT_MS)
    assert event is None
    assert elapsed_s >= IDLE_TIMEOUT_MS / 1000 * 0.9


def test_an_injected_xid_arrives_as_an_event(make: Maker) -> None:
    subject = make.started().controls()
    assert subject.inject_xid is not None
    uuid = subject.backend.devices()[3].uuid
    subject.inject_xid(uuid, 48)
    event = subject.backend.wait_event(EVENT_TIMEOUT_MS)
    assert event is not None
    assert (event.uuid, event.kind, event.xid) == (uuid, EventKind.XID, 48)
    assert subject.backend.wait_event(0) is None


def test_wait_event_wakes_when_another_thread_injects_an_event(make: Maker) -> None:
    subject = make.started().controls()
    inject_xid = subject.inject_xid
    assert inject_xid is not None
    uuid = subject.backend.devices()[0].uuid
    injector = threading.Timer(0.02, lambda: inject_xid(uuid, 31))
    injector.start()
    event, elapsed_s = timed_wait(subject.backend, EVENT_TIMEOUT_MS)
    injector.join()
    assert event is not None
    assert elapsed_s < EVENT_TIMEOUT_MS / 1000 / 2, "woke only at the timeout"


def test_a_lost_gpu_raises_gpu_gone_while_the_others_answer(make: Maker) -> None:
    subject = make.started().controls()
    assert subject.lose is not None
    lost, healthy = (device.uuid for device in subject.backend.devices()[:2])
    subject.lose(lost)
    with pytest.raises(GpuGone) as gone:
        subject.backend.sample(lost)
    assert gone.value.uuid == lost
    with pytest.raises(GpuGone):
        subject.backend.processes(lost)
    assert subject.backend.sample(healthy).uuid == healthy
    assert lost not in {device.uuid for device in subject.backend.devices()}
    assert all(lost not in (pair.uuid_a, pair.uuid_b)
               for pair in subject.backend.topology().pairs)
    event = subject.backend.wait_event(EVENT_TIMEOUT_MS)
    assert event is not None
    assert (event.uuid, event.xid) == (lost, 79)


def test_an_unknown_uuid_raises_gpu_gone(make: Maker) -> None:
    with pytest.raises(GpuGone):
        make.started().backend.sample("GPU-00000000-0000-0000-0000-000000000000")


def test_every_call_before_start_and_after_stop_raises_nvml_unavailable(make: Maker) -> None:
    subject = make.unstarted()
    with pytest.raises(NvmlUnavailable):
        subject.backend.devices()
    uuid = make.started().backend.devices()[0].uuid
    stopped = make.started()
    stopped.backend.stop()
    calls: list[Callable[[], object]] = [
        stopped.backend.driver, stopped.backend.devices, stopped.backend.topology,
        lambda: stopped.backend.sample(uuid), lambda: stopped.backend.processes(uuid),
        lambda: stopped.backend.wait_event(IDLE_TIMEOUT_MS)]
    for call in calls:
        with pytest.raises(NvmlUnavailable):
            call()


def test_start_without_a_driver_raises_nvml_unavailable(make: Maker) -> None:
    make.started().controls()
    subject = make.unstarted()
    assert subject.remove_driver is not None
    subject.remove_driver()
    with pytest.raises(NvmlUnavailable) as unavailable:
        subject.backend.start()
    assert unavailable.value.code == NvmlCode.LIBRARY_NOT_FOUND


def test_the_driver_reports_its_versions(make: Maker) -> None:
    driver = make.started().backend.driver()
    assert driver.driver_version
    assert driver.cuda_driver_version > 0


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_both_fakes_answer_alike_for_the_same_profile(profile: str, tmp_path: pathlib.Path
                                                      ) -> None:
    snapshot = build_profile(profile, seed=7)
    if snapshot.devices:
        first = dataclasses.replace(snapshot.devices[0], processes=(GpuProcess(9, 1 << 20),))
        snapshot = dataclasses.replace(snapshot, devices=(first, *snapshot.devices[1:]))
    adapter = NvmlBackend(FakePynvml(snapshot), sysfs_root=tmp_path)
    fake = FakeGpuBackend(snapshot)
    adapter.start()
    fake.start()
    assert adapter.driver() == fake.driver()
    assert adapter.devices() == fake.devices()
    for device in fake.devices():
        assert adapter.sample(device.uuid) == fake.sample(device.uuid)
        assert adapter.processes(device.uuid) == fake.processes(device.uuid)
    assert adapter.topology() == fake.topology()
    adapter.stop()


def test_real_nvml_without_a_driver_is_unavailable_not_zero_gpus() -> None:
    backend = NvmlBackend()
    try:
        backend.start()
    except NvmlUnavailable as error:
        assert classify(error.code) is ErrorClass.NODE_FAULT
        return
    backend.stop()
    pytest.skip("this machine has a working NVML")
