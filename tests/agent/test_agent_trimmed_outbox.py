"""A node agent joining a cluster whose effects outbox was trimmed, against an in-process
cluster of real replicas: the registration reconciles with the store's bindings, which covers
every effect before it, so the watch that follows must not send the agent to register again."""

from __future__ import annotations

import pathlib

import anyio
import pytest

from agent.fake_backend import FakeGpuBackend
from statemachine import outbox as outbox_module
from statemachine.errors import Rejection
from tests.agent.agent_support import (
    ADMIN,
    SCHEDULER,
    configured_cluster,
    eventually,
    running_agent,
    store,
)

pytestmark = pytest.mark.anyio

RETAINED = 8  # the outbox keeps this many effects (and a trim chunk more before trimming)
GANGS = 16  # each submitted and released: one effect each at least, enough for a trim


async def test_a_new_agent_on_a_trimmed_outbox_registers_once(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new agent (no state directory, cursor 0) registers; its watch from 0 found the
    outbox starting past 1 and raised EffectsTrimmed, so it registered again at once: a
    second RegisterNode with a fresh boot id, a new incarnation, and its running pods bound
    again, for effects that were all before its first registration."""
    monkeypatch.setattr(outbox_module, "OUTBOX_RETAINED_MAX", RETAINED)
    monkeypatch.setattr(outbox_module, "TRIM_CHUNK", RETAINED // 2)
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    with anyio.fail_after(60):
        async with configured_cluster() as cluster, store(cluster, SCHEDULER) as scheduler, \
                store(cluster, ADMIN) as admin:
            for number in range(GANGS):
                await scheduler.submit_gang(f"g{number}", "b", -1, [(1, 8)])
                await scheduler.release_gang(f"g{number}")
            outbox = await admin.query("effects", after=0, node=None, limit=1)
            assert not isinstance(outbox, Rejection), outbox
            assert outbox["first_index"] > 1, "the outbox was not trimmed"
            async with running_agent(cluster, "n0", gpus, tmp_path / "agent") as agent:

                async def settled() -> bool | None:  # the watch had time to find the trim
                    return True if agent.view.counters.get("heartbeats", 0) >= 10 else None

                await eventually(settled, what="ten heartbeats")
                node = await admin.node("n0")
            assert not isinstance(node, Rejection), node
    assert agent.registrations == 1
    assert node["incarnation"] == 1, node
