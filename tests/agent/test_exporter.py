"""The agent's /metrics page: dcgm-exporter's names, units and labels for telemetry, nothing
for a signal the GPU lacks, and the agent's own health and XID series; served over HTTP by a
running agent."""

from __future__ import annotations

import pathlib
import re

import anyio
import pytest

from agent.exporter import AgentView, GpuHealthView, render
from agent.fake_backend import FakeGpuBackend
from cellar.local_cluster import free_ports
from consensus.runtime.config_fields import Address
from statemachine.commands import HealthStatus
from tests.agent.agent_support import configured_cluster, eventually, running_agent


def view_of(gpus: FakeGpuBackend) -> AgentView:
    gpus.start()
    devices = gpus.devices()
    return AgentView(node="n0", devices=devices,
                     samples={device.uuid: gpus.sample(device.uuid) for device in devices},
                     nvml_up=True)


def series(page: str, name: str) -> list[str]:
    return [line for line in page.splitlines() if line.startswith((name + "{", name + " "))]


def test_telemetry_uses_dcgm_names_units_and_labels() -> None:
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    view = view_of(gpus)
    first = view.devices[0]
    gpus.set(first.uuid, "power_mw", 250_500)
    view.samples[first.uuid] = gpus.sample(first.uuid)
    page = render(view)
    temperature = series(page, "DCGM_FI_DEV_GPU_TEMP")
    assert len(temperature) == 8
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter" in page
    power = next(line for line in series(page, "DCGM_FI_DEV_POWER_USAGE")
                 if f'UUID="{first.uuid}"' in line)
    assert power.endswith(" 250.5")  # watts, from NVML's milliwatts
    labels = dict(re.findall(r'(\w+)="([^"]*)"', power))
    assert labels == {"gpu": str(first.index), "UUID": first.uuid,
                      "pci_bus_id": first.pci_bus_id, "device": f"nvidia{first.minor}",
                      "modelName": first.model, "Hostname": "n0"}
    used = series(page, "DCGM_FI_DEV_FB_USED")[0].rsplit(" ", 1)[1]
    assert float(used) == int(float(used))  # MiB, not bytes


def test_a_signal_the_gpu_lacks_is_left_out_not_zero() -> None:
    page = render(view_of(FakeGpuBackend.from_profile("consumer-no-ecc", seed=1)))
    assert series(page, "DCGM_FI_DEV_GPU_TEMP")
    assert not series(page, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")
    assert not series(page, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS")


def test_the_agents_own_series() -> None:
    view = view_of(FakeGpuBackend.from_profile("pcie-2", seed=1))
    uuid = view.devices[0].uuid
    view.health = {uuid: GpuHealthView(uuid, HealthStatus.FAIL,
                                       (("xid", HealthStatus.FAIL),
                                        ("thermal", HealthStatus.WARN)))}
    view.xid_counts = {(uuid, 79): (2, 1_700_000_000.5)}
    view.last_xid = {uuid: 79}
    view.allocated = {uuid}
    page = render(view)
    assert f'gpu_agent_health_status{{UUID="{uuid}",health_watch="overall"}} 20' in page
    assert f'gpu_agent_health_status{{UUID="{uuid}",health_watch="thermal"}} 10' in page
    assert f'gpu_agent_xid_errors_total{{UUID="{uuid}",xid="79"}} 2' in page
    assert f'gpu_agent_xid_last_timestamp_seconds{{UUID="{uuid}",xid="79"}} 1700000000.5' \
        in page
    assert series(page, "DCGM_FI_DEV_XID_ERRORS")[0].endswith(" 79")
    assert f'gpu_agent_gpu_allocated{{UUID="{uuid}"}} 1' in page
    assert "gpu_agent_nvml_up 1" in page


@pytest.mark.anyio
async def test_a_running_agent_serves_its_page(tmp_path: pathlib.Path) -> None:
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    port = free_ports(1)[0]
    with anyio.fail_after(30):
        async with configured_cluster() as cluster, running_agent(
                cluster, "n0", gpus, tmp_path, metrics=Address("127.0.0.1", port)) as agent:
            assert agent.metrics_port == port
            gpus.inject_xid(gpus.uuids()[2], 79)

            async def page() -> str | None:
                text = await _get(port)
                return text if 'xid="79"' in text and "gpu_agent_heartbeats" in text else None

            text = await eventually(page, what="the XID on the page")
    assert len(series(text, "DCGM_FI_DEV_GPU_TEMP")) == 8


async def _get(port: int) -> str:
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while True:
            try:
                data += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                break
    return data.decode("utf-8").split("\r\n\r\n", 1)[1]
