"""The pods loop (`agent.pods`) on its own: effects in, exits out, against a store stand-in
that records what the agent reports."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncGenerator, Callable
from typing import Any

import anyio
import pytest

from agent.pods import EFFECTS_CURSOR, EXIT_CODE_KILLED, REASON_KILLED_BEFORE_START, Pods
from agent.store_link import StoreLink
from statemachine.effects import EffectKind
from statemachine.store import CursorAhead
from tests.agent.jobs_support import GpuDouble, runner
from tests.agent.recording_store import RecordingStore

pytestmark = pytest.mark.anyio


def evicting_gang(group: str, pod_uid: str, node: str) -> dict[str, Any]:
    """A gang query's answer: one pod bound on `node`, the gang being evicted."""
    return {"group": group, "evicting": "preempted by boss",
            "pods": [{"pod_uid": pod_uid, "node": node, "phase": "bound"}]}


async def test_a_kill_for_a_pod_never_started_here_reports_it_exited(
        tmp_path: pathlib.Path) -> None:
    """The store may still have the pod bound here (its start was never seen): the gang
    being evicted waits for that pod's exit before it can leave."""
    kill = {"index": 1, "kind": EffectKind.KILL_POD.value, "node": "n0", "group": "victim",
            "pod_uid": "victim-pod", "reason": "preempted by boss"}
    fake = RecordingStore("n0", gangs={"victim": evicting_gang("victim", "victim-pod", "n0")},
                          effects=(kill,))
    async with runner(tmp_path, GpuDouble()) as jobs:
        pods = Pods(StoreLink(fake, "n0", retry_ms_max=200), jobs,  # type: ignore[arg-type]
                    tmp_path)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(pods.follow_effects)
                while not fake.times("exit"):
                    await anyio.sleep(0.01)
                tasks.cancel_scope.cancel()
    (exit_call,) = [args for _, name, args in fake.calls if name == "exit"]
    assert exit_call == ("n0", "victim", "victim-pod", EXIT_CODE_KILLED,
                         REASON_KILLED_BEFORE_START)
    assert not jobs.started_before("victim-pod")



async def test_a_cursor_ahead_of_the_stores_outbox_is_reset_to_its_end(
        tmp_path: pathlib.Path) -> None:
    """The cursor file outlived the store's history (a rebuilt cluster): the pods loop ends
    for a registration that reconciles, with the cursor at the outbox's end, not past it."""

    class RebuiltStore(RecordingStore):
        async def watch_effects(self, node: str, after: int = 0, *, wait_s: float = 5.0,
                                on_cursor: Callable[[int], None] | None = None
                                ) -> AsyncGenerator[dict[str, Any], None]:
            if after > 3:  # the rebuilt store's outbox ends at 3
                raise CursorAhead(after, 1, 4)
            async for effect in super().watch_effects(node, after, wait_s=wait_s):
                yield effect

    (tmp_path / EFFECTS_CURSOR).write_text("10\n")
    async with runner(tmp_path, GpuDouble()) as jobs:
        pods = Pods(StoreLink(RebuiltStore("n0"), "n0", retry_ms_max=200),  # type: ignore[arg-type]
                    jobs, tmp_path)
        told = False
        with anyio.fail_after(10):
            try:
                await pods.follow_effects()
            except* CursorAhead:
                told = True
    assert told and (tmp_path / EFFECTS_CURSOR).read_text() == "3\n"


async def test_the_cursor_moved_past_others_effects_is_saved_for_a_restarted_agent(
        tmp_path: pathlib.Path) -> None:
    """An idle node's watch moves its cursor past other nodes' effects: saved now and then
    (not at every idle page), a restarted agent resumes from there, not from its last effect,
    which the store trimmed long ago (it was told its effects were trimmed, and registered
    again with every running pod, at every restart)."""
    now_s = [0.0]
    moves = ((0.0, 500), (1.0, 600), (2.0, 1_600), (12.5, 1_700))  # (at s, cursor)

    class IdleStore(RecordingStore):
        def __init__(self) -> None:
            super().__init__("n0")
            self.asked_after: list[int] = []
            self.saved: list[str] = []
            self.done = anyio.Event()

        async def watch_effects(self, node: str, after: int = 0, *, wait_s: float = 5.0,
                                on_cursor: Callable[[int], None] | None = None
                                ) -> AsyncGenerator[dict[str, Any], None]:
            self.asked_after.append(after)
            assert on_cursor is not None
            for now_s[0], index in moves:
                on_cursor(index)
                self.saved.append((tmp_path / EFFECTS_CURSOR).read_text().strip())
            self.done.set()
            await anyio.sleep_forever()
            yield {}

    async def follow(store: IdleStore) -> None:
        async with runner(tmp_path, GpuDouble()) as jobs:
            pods = Pods(StoreLink(store, "n0", retry_ms_max=200),  # type: ignore[arg-type]
                        jobs, tmp_path, clock_s=lambda: now_s[0])
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(pods.follow_effects)
                    await store.done.wait()
                    tasks.cancel_scope.cancel()

    first, restarted = IdleStore(), IdleStore()
    await follow(first)
    assert first.saved == ["500", "500", "1600", "1700"]
    await follow(restarted)
    assert restarted.asked_after == [1_700]
