"""The agent's link to the store (`agent.store_link`) and the health reports the monitor sends
through it, against a recording stand-in for the store."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any

import anyio
import pytest

from agent import monitor as monitor_module
from agent.exporter import AgentView
from agent.fake_backend import FakeGpuBackend
from agent.gpu import DeviceInfo
from agent.health import HealthTracker
from agent.health_policy import HealthPolicy
from agent.monitor import Monitor
from agent.store_link import StoreLink
from consensus.runtime.client import Unavailable
from statemachine import outbox as outbox_module
from statemachine.commands import GpuInventory, HealthReport, HealthStatus
from statemachine.effects import EffectKind
from statemachine.errors import Code, Rejection
from statemachine.machine import Machine
from statemachine.results import Done
from statemachine.store import EffectsTrimmed, GpuStore
from tests.agent.recording_store import RecordingStore
from tests.statemachine.test_store import MachineClient, start_effects

pytestmark = pytest.mark.anyio


def gpu(uuid: str, index: int) -> GpuInventory:
    return GpuInventory(uuid=uuid, index=index, pci_bus_id=f"00000000:0{index}:00.0",
                        model="A100", memory_mib=81_920)


def report(uuid: str, status: HealthStatus) -> HealthReport:
    return HealthReport(uuid=uuid, status=status, reason="")


async def test_health_reports_name_only_the_gpus_this_incarnation_registered() -> None:
    """A GPU NVML lists only after a restart of NVML is unknown to the store, which refuses a
    whole report naming it: it waits for the next registration, and the others still go."""
    store = RecordingStore("n0")
    link = StoreLink(store, "n0", retry_ms_max=200)  # type: ignore[arg-type]
    assert await link.report_health([report("GPU-a", HealthStatus.FAIL)]) is None

    async def read_gpus() -> tuple[list[GpuInventory], list[object]]:
        return [gpu("GPU-a", 0), gpu("GPU-b", 1)], []

    await link.register("boot", read_gpus)  # type: ignore[arg-type]
    reports = [report("GPU-a", HealthStatus.FAIL), report("GPU-new", HealthStatus.UNKNOWN),
               report("GPU-b", HealthStatus.PASS)]
    assert await link.report_health(reports) is not None
    (sent,) = [args for _, name, args in store.calls if name == "health"]
    assert sent == ("n0", 1, [reports[0], reports[2]])
    assert link.reports_unregistered == 2  # the one before registering, and GPU-new


async def test_a_registration_carries_the_health_of_the_gpus_it_registers() -> None:
    """The store applies it before the registration places anything, so a GPU lost while the
    agent was away is never placed; a GPU the registration does not name is left out, or the
    store would refuse the registration."""
    store = RecordingStore("n0")
    link = StoreLink(store, "n0", retry_ms_max=200)  # type: ignore[arg-type]

    async def read_gpus() -> tuple[list[GpuInventory], list[object]]:
        return [gpu("GPU-a", 0), gpu("GPU-b", 1)], []

    reading = [report("GPU-a", HealthStatus.FAIL), report("GPU-new", HealthStatus.UNKNOWN),
               report("GPU-b", HealthStatus.PASS)]
    await link.register("boot", read_gpus, read_health=lambda: reading)  # type: ignore[arg-type]
    (sent,) = [args for _, name, args in store.calls if name == "register"]
    assert sent[2] == [reading[0], reading[2]]


async def test_a_registration_stands_for_a_full_report() -> None:
    """Its reading is not sent again (a pass would count twice toward a failed GPU's
    recovery); a report that went unheard since the reading was taken is, whole, at once."""
    backend = FakeGpuBackend.from_profile("a100-8", seed=1)
    backend.start()
    monitor, store, _ = await _watched(backend, backend.devices())
    await monitor.poll_once()
    assert [report.status for report in monitor.reading()] == [HealthStatus.PASS] * 8
    store.calls.clear()
    await monitor.after_registering()
    assert not [call for call in store.calls if call[1] == "health"]
    monitor.reading()
    monitor.tracker.observe_unavailable("driver reloading", 0)
    store.health_reply = Rejection(code=Code.STALE_INCARNATION, message="registering again")
    await monitor.report()  # the event loop's, under the incarnation ending
    store.health_reply = Done(note="ok")
    store.calls.clear()
    await monitor.after_registering()
    assert [report.status for report in _health_sent(store)] == [HealthStatus.UNKNOWN] * 8


async def _watched(backend: FakeGpuBackend, registered: tuple[DeviceInfo, ...]
                   ) -> tuple[Monitor, RecordingStore, list[int]]:
    """A monitor of `backend`'s GPUs, reporting through a link that registered `registered`
    with a recording store; and the list holding its clock's time (ms)."""
    devices = backend.devices()
    store = RecordingStore("n0")
    link = StoreLink(store, "n0", retry_ms_max=200)  # type: ignore[arg-type]

    async def read_gpus() -> tuple[list[GpuInventory], list[object]]:
        return [gpu(device.uuid, device.index) for device in registered], []

    await link.register("boot", read_gpus)  # type: ignore[arg-type]
    tracker = HealthTracker(HealthPolicy(), devices, now_ms=0)
    now_ms = [0]
    view = AgentView(node="n0")
    view.devices = devices
    monitor = Monitor(backend, tracker, link, view, poll_ms=10,
                      event_wait_ms=10, retry_ms_max=100, clock_ms=lambda: now_ms[0])
    return monitor, store, now_ms


def _health_sent(store: RecordingStore) -> list[HealthReport]:
    (sent,) = [args for _, name, args in store.calls if name == "health"]
    return list(sent[2])


async def test_a_refused_health_report_is_sent_whole_at_the_next_poll(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU's recovery reported while the store refuses (the node registering again) was
    taken from the tracker; with every GPU healthy the next full report came only 12 polls
    later, the store holding the GPU failed meanwhile."""
    monkeypatch.setattr(monitor_module, "FULL_REPORT_EVERY_POLLS", 1000)  # the first poll's
    backend = FakeGpuBackend.from_profile("a100-8", seed=1)
    backend.start()
    devices = backend.devices()
    monitor, store, now_ms = await _watched(backend, devices)
    tracker = monitor.tracker
    await monitor.poll_once()
    tracker.observe_unavailable("driver reloading", 0)  # every GPU unknown, and reported so
    await monitor.report()
    store.health_reply = Rejection(code=Code.STALE_INCARNATION, message="registering again")
    for _ in range(100):  # the GPUs answer again; their recovery is refused
        now_ms[0] += 10_000
        await monitor.poll_once()
        if all(verdict.status is HealthStatus.PASS for verdict in tracker.verdicts()):
            break
    store.calls.clear()
    store.health_reply = Done(note="ok")
    await monitor.poll_once()  # nothing changed since: the refused verdicts go again, whole
    assert [report.status for report in _health_sent(store)] == [HealthStatus.PASS] * 8


@pytest.mark.parametrize("slow_registered", [True, False], ids=["accepted", "not-sent"])
async def test_a_refused_report_is_sent_whole_though_an_event_report_went_through_since(
        monkeypatch: pytest.MonkeyPatch, slow_registered: bool) -> None:
    """The event loop reports too: its report of one GPU's change, accepted (or not sent, no
    GPU of it registered), took for repaired the poll's refused report of the others'
    recovery, and the store held them unknown until the next periodic full report."""
    monkeypatch.setattr(monitor_module, "FULL_REPORT_EVERY_POLLS", 1000)  # the first poll's
    backend = FakeGpuBackend.from_profile("a100-8", seed=1)
    backend.start()
    devices = backend.devices()
    slow = devices[-1].uuid  # recovers after the others, alone
    registered = devices if slow_registered else devices[:-1]
    monitor, store, now_ms = await _watched(backend, registered)
    tracker = monitor.tracker

    def status(uuid: str) -> HealthStatus:
        return next(verdict.status for verdict in tracker.verdicts() if verdict.uuid == uuid)

    backend.fail(slow, "temperature_c", 999)  # unknown after 3 polls, until it is read
    for _ in range(3):
        await monitor.poll_once()
    tracker.observe_unavailable("driver reloading", 0)  # every GPU unknown, and reported so
    await monitor.report()
    store.health_reply = Rejection(code=Code.STALE_INCARNATION, message="registering again")
    for _ in range(100):  # the others answer again; the polls' reports of it are refused
        now_ms[0] += 10_000
        await monitor.poll_once()
        if status(devices[0].uuid) is HealthStatus.PASS:
            break
    assert status(slow) is not HealthStatus.PASS
    store.health_reply = Done(note="ok")
    backend.set(slow, "temperature_c", 45)
    for _ in range(100):
        now_ms[0] += 10_000
        await monitor.sample_all()
        if status(slow) is HealthStatus.PASS:
            break
    await monitor.report()  # the event loop's: the slow GPU's recovery, alone
    store.calls.clear()
    await monitor.poll_once()  # the refused recoveries go again, whole
    sent = _health_sent(store)
    assert [(report.uuid, report.status) for report in sent] == [
        (device.uuid, HealthStatus.PASS) for device in sorted(registered,
                                                              key=lambda d: d.uuid)]


async def test_the_effects_watch_outlives_a_store_outage_and_resumes_where_it_was() -> None:
    """No replica answers for a while (a cluster restart): the watch raises Unavailable,
    which ended the agent; the link asks again, backing off, from the last effect it gave."""
    effects = tuple({"index": index, "kind": "start_pod", "node": "n0", "group": "g",
                     "pod_uid": f"p{index}"} for index in (1, 2, 3))

    class FlakyStore(RecordingStore):
        def __init__(self) -> None:
            super().__init__("n0", effects=effects)
            self.asked_after: list[int] = []

        async def watch_effects(self, node: str, after: int = 0, *, wait_s: float = 5.0,
                                on_cursor: Callable[[int], None] | None = None
                                ) -> AsyncGenerator[dict[str, Any], None]:
            self.asked_after.append(after)
            if len(self.asked_after) in (2, 3):  # down after the first effect, twice
                raise Unavailable("no replica answered the watch in time")
            for effect in self.effects:
                if effect["index"] > after:
                    yield effect
                    if len(self.asked_after) == 1:
                        raise Unavailable("the replica went away")

    store = FlakyStore()
    link = StoreLink(store, "n0", retry_ms_max=200)  # type: ignore[arg-type]
    seen = []
    with anyio.fail_after(5):
        async with aclosing(link.effects(0, wait_s=0.1)) as watched:
            async for effect in watched:
                seen.append(effect.index)
                if len(seen) == 3:
                    break
    assert seen == [1, 2, 3]
    assert store.asked_after == [0, 1, 1, 1] and link.calls_retried == 3


async def test_an_idle_agent_is_not_told_of_a_trim_after_a_store_outage(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Others' effects trimmed n0's last one away while the watch moved n0's cursor past
    them; after an outage the watch is asked again from that cursor, not from n0's last
    effect, which the store no longer keeps (every idle agent registered again)."""
    monkeypatch.setattr(outbox_module, "OUTBOX_RETAINED_MAX", 8)
    monkeypatch.setattr(outbox_module, "TRIM_CHUNK", 4)
    machine = Machine()
    box = machine.state.outbox
    start_effects(machine, "n0", 1)()  # n0's one effect, index 1

    class OutageClient(MachineClient):
        """Once the script ran out, one outage (no replica answers the watch in time), in
        which n0's kill is emitted."""

        outage_done = False

        async def watch(self, query: bytes, after_slot: int, *, wait_s: float = 10.0
                        ) -> tuple[bytes, int]:
            if not self.script and not self.outage_done:
                self.outage_done = True
                box.emit(EffectKind.KILL_POD, node="n0", group="g", pod_uid="p1")
                raise Unavailable("no replica answered the watch in time")
            return await super().watch(query, after_slot, wait_s=wait_s)

    client = OutageClient(machine, [lambda: None, *[start_effects(machine, "n1", 3)] * 8])
    link = StoreLink(GpuStore(client), "n0", retry_ms_max=20)  # type: ignore[arg-type]
    seen = []
    with anyio.fail_after(5):
        try:
            async with aclosing(link.effects(0, wait_s=0.01)) as watched:
                async for effect in watched:
                    seen.append((effect.kind.value, effect.index))
                    if len(seen) == 2:
                        break
        except EffectsTrimmed as error:
            pytest.fail(f"an idle node that missed nothing was told: {error}")
    assert box.first_index > 2, "the outbox was trimmed past n0's effect"
    assert seen == [("start_pod", 1), ("kill_pod", box.next_index - 1)]
