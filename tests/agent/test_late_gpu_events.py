"""A GPU that did not answer at start and answers later is registered for events: it had not
been, so its XIDs (79, 48, ...) were never seen while it reported PASS.

agent/daemon.py `_read_gpus` says a GPU that "did not answer at first (NotReady, a reset under
way) counts once it does"; NvmlBackend registers events only in start() (`_register_events` over
the GPUs found then). reference/nvml.md §1.2: register each GPU's supported health events.
"""

from __future__ import annotations

from agent import nvml_abi as abi
from agent.gpu import EventKind, NvmlCode
from agent.nvml_backend import NvmlBackend
from tests.agent.fake_pynvml import FakePynvml


def test_a_gpu_that_answers_after_start_gets_its_events_registered() -> None:
    nvml = FakePynvml.from_profile("a100-8", seed=1)
    late = nvml.uuids()[3]
    nvml.fail_call("nvmlDeviceGetUUID", NvmlCode.NOT_READY, late)  # a reset under way
    backend = NvmlBackend(nvml)
    backend.start()
    assert late not in {device.uuid for device in backend.devices()}

    nvml._call_failures.pop(("nvmlDeviceGetUUID", late))  # the reset is over
    assert late in {device.uuid for device in backend.devices()}  # the agent now uses it

    nvml.inject_xid(late, abi.XID_DOUBLE_BIT_ECC)
    event = backend.wait_event(300)
    backend.stop()
    assert event is not None, "XID 48 on a GPU the agent lists was never delivered"
    assert (event.uuid, event.kind, event.xid) == (late, EventKind.XID, 48)
