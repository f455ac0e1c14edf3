"""XIDs the agent had never seen: those of a GPU that did not answer at start and answers later
(it was never registered for events, and reported PASS), and those posted after event waits
kept failing (the agent waited on the same broken event set for ever).

agent/daemon.py `_read_gpus` says a GPU that "did not answer at first (NotReady, a reset under
way) counts once it does"; NvmlBackend registers events only in start() (`_register_events` over
the GPUs found then). reference/nvml.md §1.2: register each GPU's supported health events.
"""

from __future__ import annotations

from typing import Final

import anyio
import pytest

from agent import nvml_abi as abi
from agent.gpu import EventKind, NvmlCode
from agent.health_model import Watch
from agent.nvml_backend import NvmlBackend
from tests.agent.fake_pynvml import FakePynvml
from tests.agent.test_corrupted_inforom import monitor_of

XID_SEEN_WITHIN_S: Final = 5.0


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


@pytest.mark.anyio
async def test_an_xid_after_event_waits_kept_failing_reaches_the_tracker() -> None:
    """reference/nvml.md §1.2: a wait error other than Timeout every time (a set NVML no longer
    serves) left the event loop waiting on that set for ever, the GPUs UNKNOWN on the events
    watch and every later XID lost. The backend makes the set again after a few failures."""
    nvml = FakePynvml.from_profile("a100-8", seed=1)
    uuid = nvml.uuids()[3]
    monitor = monitor_of(nvml)
    backend, view = monitor.backend, monitor.view
    assert isinstance(backend, NvmlBackend)
    nvml.break_event_sets(NvmlCode.UNKNOWN)
    seen = False
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(monitor.events_forever)
        with anyio.move_on_after(XID_SEEN_WITHIN_S):
            while not seen:
                nvml.inject_xid(uuid, abi.XID_DOUBLE_BIT_ECC)  # NVML replays none: post again
                await anyio.sleep(0.02)
                seen = monitor.tracker.is_open(uuid, (Watch.XID, "xid_48"))
        tasks.cancel_scope.cancel()
    backend.stop()
    assert view.counters.get("event_wait_failures", 0) >= 1
    assert seen, "XID 48 posted after the event waits kept failing was never seen"
    assert backend.event_set_rebuilds >= 1
