"""The agent's page never shows a reading it no longer has: a GPU that fell off the bus, or a
node whose NVML went away, shows no telemetry (not its last temperature and power, frozen), and
an NVLink error total is never a smaller number because one link's counter failed to read (a
counter that goes backwards reads, to Prometheus's rate(), as a reset followed by every error
the GPU ever had: a false alert on every transient read failure)."""

from __future__ import annotations

import dataclasses

import pytest

from agent.exporter import AgentView, render
from agent.fake_backend import FakeGpuBackend
from agent.gpu import Failed, NvmlCode
from agent.health import HealthTracker
from agent.health_policy import HealthPolicy
from agent.monitor import Monitor
from agent.store_link import StoreLink
from tests.agent.recording_store import RecordingStore

CRC_TOTAL = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"


def _series(page: str, name: str, uuid: str) -> list[str]:
    return [line for line in page.splitlines()
            if line.startswith(name + "{") and f'UUID="{uuid}"' in line]


def _monitor(backend: FakeGpuBackend) -> Monitor:
    backend.start()
    devices = backend.devices()
    link = StoreLink(RecordingStore("n0"), "n0", retry_ms_max=200)  # type: ignore[arg-type]
    view = AgentView(node="n0", devices=devices)
    return Monitor(backend, HealthTracker(HealthPolicy(), devices, now_ms=0), link, view,
                   poll_ms=10, event_wait_ms=10, retry_ms_max=100, clock_ms=lambda: 0)


@pytest.mark.anyio
async def test_a_gpu_that_fell_off_the_bus_shows_no_telemetry() -> None:
    backend = FakeGpuBackend.from_profile("a100-8", seed=1)
    monitor = _monitor(backend)
    lost, kept = backend.uuids()[2], backend.uuids()[3]
    await monitor.sample_all()
    assert _series(render(monitor.view), "DCGM_FI_DEV_GPU_TEMP", lost)
    backend.lose(lost)
    await monitor.sample_all()
    page = render(monitor.view)
    assert not _series(page, "DCGM_FI_DEV_GPU_TEMP", lost)
    assert not _series(page, "DCGM_FI_DEV_POWER_USAGE", lost)
    assert _series(page, "DCGM_FI_DEV_GPU_TEMP", kept)


@pytest.mark.anyio
async def test_a_node_whose_nvml_went_away_shows_no_telemetry() -> None:
    backend = FakeGpuBackend.from_profile("a100-8", seed=1)
    monitor = _monitor(backend)
    await monitor.poll_once()
    assert len([line for line in render(monitor.view).splitlines()
                if line.startswith("DCGM_FI_DEV_GPU_TEMP{")]) == 8
    backend.driver_missing()
    await monitor.poll_once()
    page = render(monitor.view)
    assert "gpu_agent_nvml_up 0" in page
    assert not [line for line in page.splitlines() if line.startswith("DCGM_FI_DEV_")]


def test_an_nvlink_total_is_left_out_not_lowered_when_a_link_fails_to_read() -> None:
    backend = FakeGpuBackend.from_profile("a100-8", seed=1)
    backend.start()
    uuid = backend.uuids()[0]
    backend.nvlink_errors(uuid, 0, crc=1000)
    backend.nvlink_errors(uuid, 1, crc=5)
    sample = backend.sample(uuid)
    view = AgentView(node="n0", devices=backend.devices(), samples={uuid: sample})
    before = _series(render(view), CRC_TOTAL, uuid)
    assert len(before) == 1 and before[0].endswith(" 1005")
    failed = Failed(NvmlCode.TIMEOUT, "timeout")
    links = (dataclasses.replace(sample.nvlinks[0], crc_flit_errors=failed),
             *sample.nvlinks[1:])
    view.samples[uuid] = dataclasses.replace(sample, nvlinks=links)
    for line in _series(render(view), CRC_TOTAL, uuid):
        assert float(line.rsplit(" ", 1)[1]) >= 1005, line
