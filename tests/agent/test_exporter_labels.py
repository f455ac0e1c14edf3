"""The metrics page as dcgm-exporter writes it: the `device` label is nvidia and the GPU index
(it was the /dev minor number, -1 where NVML gives none), and label values are escaped."""

from __future__ import annotations

import dataclasses
import re

from agent.exporter import AgentView, render
from agent.fake_backend import FakeGpuBackend


def test_device_label_is_nvidia_and_the_gpu_index_as_dcgm_exporter_writes_it() -> None:
    """dcgm-exporter writes device="nvidia<N>" with N the GPU's DCGM id, the same number as
    its `gpu` label (internal/pkg/collector/base_collector.go: fmt.Sprintf("nvidia%d",
    mi.DeviceInfo.GPU); reference/nvml.md 5.1: `device` (`nvidia<index>`)). The exporter
    writes the minor number, which NVML may not give (the backend then records -1, and every
    such GPU is labelled device="nvidia-1")."""
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    gpus.start()
    devices = tuple(dataclasses.replace(device, minor=-1) for device in gpus.devices())
    view = AgentView(node="n0", devices=devices,
                     samples={device.uuid: gpus.sample(device.uuid) for device in devices})
    for line in render(view).splitlines():
        if line.startswith("DCGM_FI_DEV_GPU_TEMP{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            assert labels["device"] == f"nvidia{labels['gpu']}", line


def test_labels_with_quotes_backslashes_and_newlines_stay_one_line() -> None:
    """Sanity (passes): escaping of label values per the text format."""
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    gpus.start()
    devices = tuple(dataclasses.replace(device, model='A "100"\\x\nY')
                    for device in gpus.devices())
    view = AgentView(node='n"0\\\n', devices=devices,
                     samples={device.uuid: gpus.sample(device.uuid) for device in devices})
    page = render(view)
    temps = [line for line in page.splitlines() if line.startswith("DCGM_FI_DEV_GPU_TEMP{")]
    assert len(temps) == len(devices)
    assert 'modelName="A \\"100\\"\\\\x\\nY"' in temps[0]
    assert 'Hostname="n\\"0\\\\\\n"' in temps[0]
