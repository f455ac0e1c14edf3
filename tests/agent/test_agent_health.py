"""The agent end to end, on the fake GPU backend and an in-process cluster: every fault scenario
ends in the right health state in the store and the right effect on placements."""

from __future__ import annotations

import contextlib
import pathlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import anyio
import pytest

from agent import registered_gpus, store_link
from agent.daemon import Agent
from agent.fake_backend import FakeGpuBackend
from agent.health_policy import HealthPolicy
from agent.inventory import gpu_inventory
from agent.nvml_backend import NvmlBackend
from consensus.envelope import Principal, Role
from statemachine.commands import HealthStatus
from statemachine.errors import Rejection
from statemachine.results import GroupPhase, GroupStatus
from statemachine.store import GpuStore
from tests.agent.agent_support import (
    ADMIN,
    FAST,
    SCHEDULER,
    agent_config,
    configured_cluster,
    eventually,
    gpu_view,
    running_agent,
    store,
)
from tests.agent.fake_pynvml import FakePynvml

pytestmark = pytest.mark.anyio
GPU = 3  # the GPU the scenarios hit
SLEEPER = "import time; time.sleep(3)"  # long enough to be seen running, then gone



Scenario = Callable[[FakeGpuBackend, str], None]
SCENARIOS: list[tuple[str, Scenario, str, bool]] = [
    # name, what happens to GPU 3, its status in the store, whether it still takes placements
    ("xid storm (79, fallen off the bus)",
     lambda gpus, uuid: gpus.xid_storm(uuid, 79, 20), "fail", False),
    ("application xid storm (13, repeated)",
     lambda gpus, uuid: gpus.xid_storm(uuid, 13, 5), "warn", True),
    ("rising uncorrectable ECC", lambda gpus, uuid: gpus.raise_ecc(uuid, uncorrected=2),
     "fail", False),
    ("row remap failure", lambda gpus, uuid: gpus.row_remap_failure(uuid), "fail", False),
    ("row remap pending", lambda gpus, uuid: gpus.row_remap_pending(uuid), "warn", True),
    ("GPU fallen off the bus", lambda gpus, uuid: gpus.lose(uuid), "fail", False),
    ("overheating", lambda gpus, uuid: gpus.overheat(uuid), "warn", True),
    ("NVLink replay errors", lambda gpus, uuid: gpus.nvlink_errors(uuid, 0, replay=3),
     "fail", False),
    ("NVLink CRC errors", lambda gpus, uuid: gpus.nvlink_errors(uuid, 0, crc=2),
     "warn", True),
    ("NVLink down", lambda gpus, uuid: gpus.nvlink_down(uuid, 1), "fail", False),
]


@pytest.mark.parametrize(("name", "scenario", "status", "placeable"), SCENARIOS,
                         ids=[scenario[0] for scenario in SCENARIOS])
async def test_a_fault_reaches_the_store(tmp_path: pathlib.Path, name: str,
                                         scenario: Scenario, status: str,
                                         placeable: bool) -> None:
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    uuid = gpus.uuids()[GPU]
    # CRC errors at nvlink_crc_fail_per_s or faster FAIL: 2 errors between polls that a busy
    # machine ran under 20 ms apart (one late, the next on time) failed the GPU where the
    # scenario means growth alone, a WARN. The rate rule has its own test (test_health.py).
    slow_rate_only = HealthPolicy(nvlink_crc_fail_per_s=1 << 30)
    with anyio.fail_after(30):
        async with configured_cluster() as cluster, store(cluster, ADMIN) as admin, \
                running_agent(cluster, "n0", gpus, tmp_path, health=slow_rate_only):
            await _until_status(admin, uuid, "pass")
            scenario(gpus, uuid)
            view = await _until_status(admin, uuid, status)
            assert view["placeable"] is placeable, (name, view)
            others = [await gpu_view(admin, "n0", other) for other in gpus.uuids()
                      if other != uuid]
            assert {other["status"] for other in others} == {"pass"}, name


async def test_a_failed_gpu_keeps_a_whole_node_gang_off_its_node(
        tmp_path: pathlib.Path) -> None:
    """The effect on placements: an 8-GPU pod fits n0 no longer, and waits, saying why."""
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    with anyio.fail_after(30):
        async with configured_cluster() as cluster, store(cluster, ADMIN) as admin, \
                store(cluster, SCHEDULER) as scheduler, running_agent(cluster, "n0", gpus,
                                                                      tmp_path):
            await _until_status(admin, gpus.uuids()[GPU], "pass")
            before = await scheduler.submit_gang("before", "b", -1, [(1, 8)])
            assert isinstance(before, GroupStatus) and before.phase is GroupPhase.ALLOCATED
            await scheduler.release_gang("before")
            gpus.inject_xid(gpus.uuids()[GPU], 48)
            await _until_status(admin, gpus.uuids()[GPU], "fail")
            after = await scheduler.submit_gang("after", "b", -1, [(1, 8)])
            assert isinstance(after, GroupStatus) and after.phase is GroupPhase.PENDING
            assert after.why_pending, after


async def test_a_missing_driver_makes_every_gpu_unknown_never_healthy(
        tmp_path: pathlib.Path) -> None:
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    with anyio.fail_after(30):
        async with configured_cluster() as cluster, store(cluster, ADMIN) as admin, \
                running_agent(cluster, "n0", gpus, tmp_path):
            await _until_status(admin, gpus.uuids()[0], "pass")
            gpus.driver_missing()
            for uuid in gpus.uuids():
                view = await _until_status(admin, uuid, "unknown")
                assert "NVML" in view["reason"] or "nvml" in view["reason"], view
            gpus.restore_driver()
            for uuid in gpus.uuids():
                await _until_status(admin, uuid, "pass")


async def _until_status(admin: Any, uuid: str, status: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        view = await gpu_view(admin, "n0", uuid)
        return view if view["status"] == status else None
    return await eventually(probe, what=f"GPU {uuid} {status}")


async def test_registration_carries_the_measured_inventory_and_topology(
        tmp_path: pathlib.Path) -> None:
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    gpus.start()
    devices, topology = gpus.devices(), gpus.topology()
    with anyio.fail_after(30):
        async with configured_cluster() as cluster, store(cluster, ADMIN) as admin, \
                running_agent(cluster, "n0", gpus, tmp_path):
            view: Any = await admin.node("n0")
    assert [(gpu["uuid"], gpu["model"], gpu["numa_node"]) for gpu in view["gpus"]] == [
        (device.uuid, "A100", device.numa_node)
        for device in sorted(devices, key=lambda device: device.index)]
    assert len(view["links"]) == len(topology.pairs) == 28  # every pair of 8 GPUs
    assert sum(link["nvlinks"] for link in view["links"]) == sum(
        pair.nvlinks for pair in topology.pairs)


async def test_a_gpu_that_answers_again_after_the_start_lets_the_node_register(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU that does not answer NVML while the agent starts (NotReady, a reset under way)
    gets the registration refused: 7 GPUs where the configuration says 8. The GPUs are listed
    again for each try, so once it answers the node registers, and the GPU is watched and
    given to jobs like the others."""
    monkeypatch.setattr(store_link, "REGISTER_REFUSED_RETRY_MS", 100)
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    flaky = gpus.uuids()[GPU]
    gpus.lose(flaky)
    with anyio.fail_after(30):
        async with configured_cluster() as cluster, store(cluster, ADMIN) as admin, \
                store(cluster, SCHEDULER) as scheduler, \
                store(cluster, Principal(Role.NODE, "n0")) as node_store, \
                anyio.create_task_group() as tasks:
            tasks.start_soon(Agent(agent_config("n0", tmp_path), gpus, node_store).run)
            await anyio.sleep(0.5)  # refused at least once
            gpus.recover(flaky)
            await eventually(_node_up(admin, "n0"), timeout_s=8, what="n0 registered")
            await _until_status(admin, flaky, "pass")
            status = await scheduler.submit_gang("all", "a", 5, [(1, 8)])
            assert isinstance(status, GroupStatus), status
            # Refused with 127 unless the job runner takes GPU 3 as this node's.
            await scheduler.bind_pod("all", 0, "all-pod", [sys.executable, "-c", SLEEPER])
            await eventually(_pod_phase(admin, "all", "running"), what="the 8-GPU pod runs")
            tasks.cancel_scope.cancel()


async def test_a_gpu_lost_after_registering_does_not_keep_the_node_from_registering_again(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GPU 3 falls off the bus after the node registered; then the store ends the agent's
    incarnation. NVML now lists 7 GPUs, which the store refuses (it wants indices 0..7): the
    lost GPU is registered as last seen, reported failed, and the node stays up with the
    other 7."""
    monkeypatch.setattr(store_link, "REGISTER_REFUSED_RETRY_MS", 100)
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    with anyio.fail_after(40):
        async with configured_cluster() as cluster, store(cluster, ADMIN) as admin, \
                store(cluster, Principal(Role.NODE, "n0")) as other, \
                running_agent(cluster, "n0", gpus, tmp_path) as agent:
            full = gpu_inventory(gpus.devices(), ())
            lost = gpus.uuids()[GPU]
            gpus.lose(lost)
            await _until_status(admin, lost, "fail")
            await other.register_node("n0", "another-boot", full)  # ends the incarnation
            await eventually(lambda: _registered(agent, 2), timeout_s=8,
                             what="the agent registered again")
            await eventually(_node_up(admin, "n0"), timeout_s=8, what="n0 up again")
            await _until_status(admin, lost, "fail")


async def test_an_agent_restarted_while_a_gpu_is_off_the_bus_registers_again(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent restarts (an upgrade, a crash) while GPU 3 is off the bus: NVML lists 7 of
    the node's 8 GPUs, which the store refused for ever, the node and its 7 good GPUs never
    coming back. The GPUs registered before are kept in the state directory: the lost one is
    registered still, and held failed."""
    monkeypatch.setattr(store_link, "REGISTER_REFUSED_RETRY_MS", 100)
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    lost = gpus.uuids()[GPU]
    with anyio.fail_after(60):
        async with configured_cluster() as cluster, store(cluster, ADMIN) as admin:
            async with running_agent(cluster, "n0", gpus, tmp_path):
                gpus.lose(lost)
                await _until_status(admin, lost, "fail")
            async with restarted_agent(cluster, admin, gpus, tmp_path) as agent:
                await _until_status(admin, lost, "fail")

                async def held_failed() -> bool | None:
                    view = agent.view.health.get(lost)
                    return True if view and view.status is HealthStatus.FAIL else None

                await eventually(held_failed, what="the restarted agent holds GPU 3 failed")


@pytest.mark.parametrize("record", [b"", b"{torn"], ids=["wiped", "corrupt"])
async def test_a_gpu_off_the_bus_is_registered_still_when_the_local_record_is_lost(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        record: bytes) -> None:
    """GPU 3 falls off the bus while the agent is away, and the agent's record of the GPUs it
    registered is gone with it (a re-imaged disk, a wiped state directory) or corrupt: NVML
    lists 7 of the node's 8 GPUs, which the store refuses. The agent takes the missing GPU
    from the store's record of its node, registers it still, failed, and writes the record
    again; the log says so."""
    monkeypatch.setattr(store_link, "REGISTER_REFUSED_RETRY_MS", 100)
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    lost = gpus.uuids()[GPU]
    with anyio.fail_after(60):
        async with configured_cluster() as cluster, store(cluster, ADMIN) as admin:
            async with running_agent(cluster, "n0", gpus, tmp_path):
                await _until_status(admin, lost, "pass")
            gpus.lose(lost)
            (tmp_path / registered_gpus.FILE_NAME).unlink()
            if record:
                (tmp_path / registered_gpus.FILE_NAME).write_bytes(record)
            async with restarted_agent(cluster, admin, gpus, tmp_path) as agent:
                view = await _until_status(admin, lost, "fail")
                assert view["placeable"] is False, view
                assert agent.view.health[lost].status is HealthStatus.FAIL
                kept = registered_gpus.RegisteredGpus(tmp_path).by_uuid
                assert sorted(kept) == sorted(gpus.uuids()) and kept[lost].index == GPU
                assert f"GPU {GPU} ({lost})" in caplog.text, caplog.text


@contextlib.asynccontextmanager
async def restarted_agent(cluster: Any, admin: Any, gpus: FakeGpuBackend, state_dir: pathlib.Path
                          ) -> AsyncIterator[Agent]:
    """Node n0's agent started again on `state_dir`, once it registered and n0 is up; stopped
    at the exit."""
    async with store(cluster, Principal(Role.NODE, "n0")) as node_store, \
            anyio.create_task_group() as tasks:
        agent = Agent(agent_config("n0", state_dir), gpus, node_store)
        tasks.start_soon(agent.run)
        await eventually(lambda: _registered(agent, 1), timeout_s=8,
                         what="the restarted agent registered")
        await eventually(_node_up(admin, "n0"), timeout_s=8, what="n0 up again")
        yield agent
        tasks.cancel_scope.cancel()


async def _registered(agent: Agent, times: int) -> bool | None:
    return True if agent.registrations >= times else None


def _node_up(admin: Any, node: str) -> Callable[[], Awaitable[bool | None]]:
    async def probe() -> bool | None:
        view: Any = await admin.node(node)
        assert not isinstance(view, Rejection), view
        return True if view["liveness"] == "up" else None
    return probe


def _pod_phase(admin: Any, group: str, phase: str) -> Callable[[], Awaitable[bool | None]]:
    async def probe() -> bool | None:
        answer: Any = await admin.gang(group)
        assert not isinstance(answer, Rejection), answer
        return True if answer["pods"][0]["phase"] == phase else None
    return probe


async def test_an_nvml_error_in_the_middle_of_a_poll_is_reported_and_survived(
        tmp_path: pathlib.Path) -> None:
    """A signal NVML cannot read keeps its last good value for a while, then the GPU is
    UNKNOWN with the reason; the agent keeps heartbeating, and a good read clears it."""
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    uuid = gpus.uuids()[GPU]
    with anyio.fail_after(30):
        async with configured_cluster() as cluster, store(cluster, ADMIN) as admin, \
                running_agent(cluster, "n0", gpus, tmp_path) as agent:
            await _until_status(admin, uuid, "pass")
            gpus.fail(uuid, "temperature_c", 999)  # NVML_ERROR_UNKNOWN, transient
            view = await _until_status(admin, uuid, "unknown")
            assert "temperature_c" in view["reason"], view
            beats = agent.view.counters["heartbeats"]
            with anyio.fail_after(5):  # it goes on heartbeating while the GPU is unknown
                while agent.view.counters["heartbeats"] <= beats:
                    await anyio.sleep(0.01)
            gpus.set(uuid, "temperature_c", 45)
            await _until_status(admin, uuid, "pass")



class _SlowToRegister:
    """The node's store, answering the registration only once the agent's first health report
    was left out for want of one (a store slow to commit, or failing over): from then on, the
    agent's next poll is `poll_ms` away."""

    def __init__(self, store: GpuStore) -> None:
        self.store = store
        self.agent: Agent | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def register_node(self, *args: Any) -> Any:
        while self.agent is None or self.agent.link.reports_unregistered == 0:
            await anyio.sleep(0.01)
        return await self.store.register_node(*args)


async def test_a_gpu_lost_while_the_agent_was_away_is_failed_by_its_registration(
        tmp_path: pathlib.Path) -> None:
    """GPU 3 falls off the bus while the agent is away (a node reboot where it does not come
    back): the store still has it passing. The restarted agent registers it, as last seen,
    and the registration's scheduling pass would place a waiting whole-node gang on GPU 3:
    a health report, even one sent right after, came too late and only failed the gang. The
    registration carries GPU 3's failure, so the gang waits and is never told of one; nor
    does the store wait for the next poll (`poll_ms` later, here far longer than the test
    waits) to hold GPU 3 failed. Through NvmlBackend over the fake NVML."""
    nvml = FakePynvml.from_profile("a100-8", seed=1)
    lost = nvml.uuids()[GPU]
    config = agent_config("n0", tmp_path, intervals=replace(FAST, poll_ms=60_000))
    with anyio.fail_after(40):
        async with configured_cluster() as cluster, store(cluster, ADMIN) as admin, \
                store(cluster, SCHEDULER) as scheduler:
            async with running_agent(cluster, "n0", NvmlBackend(nvml),  # type: ignore[arg-type]
                                     tmp_path):
                await _until_status(admin, lost, "pass")
            nvml.lose(lost)
            assert not isinstance(await admin.deregister("n0"), Rejection)
            waiting = await scheduler.submit_gang("whole", "a", 5, [(1, 8)])
            assert isinstance(waiting, GroupStatus) and waiting.phase is GroupPhase.PENDING
            async with store(cluster, Principal(Role.NODE, "n0")) as node_store, \
                    anyio.create_task_group() as tasks:
                slow = _SlowToRegister(node_store)
                slow.agent = Agent(config, NvmlBackend(nvml), slow)  # type: ignore[arg-type]
                await tasks.start(slow.agent.run)
                with anyio.fail_after(5):
                    view = await _until_status(admin, lost, "fail")
                assert view["placeable"] is False, view
                gang: Any = await admin.gang("whole")
                assert (gang["phase"], gang["failures"]) == ("pending", []), gang
                tasks.cancel_scope.cancel()
