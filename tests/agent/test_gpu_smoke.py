"""On a machine with an NVIDIA GPU: the real inventory and health read through NVML, and a short
job bound to one GPU that CUDA itself sees as the only device. Without a GPU or driver (CI,
most machines) every test here is skipped with NVML's own reason."""

from __future__ import annotations

import pathlib
import sys
import time
from collections.abc import Iterator

import anyio
import pytest

from agent.binding import Binding
from agent.gpu import DeviceSample, GpuBackend, NvmlUnavailable, Unsupported, value_of
from agent.health import HealthTracker
from agent.health_policy import HealthPolicy
from agent.job_outcomes import Exited, Started
from agent.jobs import JobRunner
from agent.nvml_backend import NvmlBackend
from statemachine.commands import HealthStatus

pytestmark = pytest.mark.gpu

# A CUDA driver-API probe: how many devices CUDA sees and the first one's UUID.
CUDA_PROBE = r"""
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
count = ctypes.c_int()
assert cuda.cuDeviceGetCount(ctypes.byref(count)) == 0
device = ctypes.c_int()
assert cuda.cuDeviceGet(ctypes.byref(device), 0) == 0
raw = (ctypes.c_ubyte * 16)()
assert cuda.cuDeviceGetUuid(raw, device) == 0
hexed = bytes(raw).hex()
uuid = f"GPU-{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:]}"
print(count.value, uuid)
"""


@pytest.fixture
def nvml() -> Iterator[GpuBackend]:
    backend = NvmlBackend()
    try:
        backend.start()
    except NvmlUnavailable as error:
        pytest.skip(f"no usable GPU here: {error}")
    try:
        if not backend.devices():
            pytest.skip("NVML runs but sees no GPU")
        yield backend
    finally:
        backend.stop()


def test_the_real_inventory_and_health_read_cleanly(nvml: GpuBackend) -> None:
    devices = nvml.devices()
    assert len({device.uuid for device in devices}) == len(devices)
    tracker = HealthTracker(HealthPolicy(), devices, now_ms=0)
    for device in devices:
        assert device.uuid.startswith(("GPU-", "MIG-")) and device.memory_bytes > 0
        sample = nvml.sample(device.uuid)
        assert isinstance(sample, DeviceSample)
        temperature = value_of(sample.temperature_c)
        assert isinstance(sample.temperature_c, Unsupported) or (
            temperature is not None and 0 < temperature < 120), sample.temperature_c
        tracker.observe_sample(sample, now_ms=1)
    verdicts = tracker.verdicts()
    assert {verdict.uuid for verdict in verdicts} == {device.uuid for device in devices}
    print({verdict.uuid: (verdict.status.value, verdict.reason) for verdict in verdicts})
    assert all(verdict.status is not HealthStatus.FAIL for verdict in verdicts), verdicts
    started = time.monotonic()
    event = nvml.wait_event(100)  # an event, or nothing after blocking the whole timeout
    assert event is not None or time.monotonic() - started >= 0.09


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_bound_job_sees_exactly_its_gpu(nvml: GpuBackend, tmp_path: pathlib.Path,
                                                anyio_backend: str) -> None:
    uuid = nvml.devices()[-1].uuid
    out = tmp_path / "probe.out"
    script = f"import sys; sys.stdout = open({str(out)!r}, 'w')\n" + CUDA_PROBE
    binding = Binding(group="smoke", pod_uid="smoke-0", gpu_uuids=(uuid,),
                      command=(sys.executable, "-c", script))
    with anyio.fail_after(60):
        async with JobRunner(tmp_path / "state", local_gpu_uuids=[uuid], gpus=nvml) as runner:
            assert isinstance(await runner.start(binding), Started)
            exited = await runner.exits.receive()
    assert isinstance(exited, Exited) and exited.exit_code == 0, exited
    count, seen = out.read_text(encoding="ascii").split()
    assert (int(count), seen) == (1, uuid)
