"""The effects cursor is written (and fsynced, twice: the file and its directory) after each
effect handled. It was written on the event loop: a page of KILL_POD effects (a drain, a
replay after a restart) is handled with no checkpoint between effects, so on a busy disk (a
job writing checkpoints: an fsync there can take seconds) the agent's heartbeats waited for
every one of those writes in a row, and the lease could lapse. The job runner's own disk
writes go to worker threads for that reason (`agent.jobs`); the cursor's now do too."""

from __future__ import annotations

import pathlib
import threading

import anyio
import pytest

from agent import pods as pods_module
from agent.pods import EFFECTS_CURSOR, Pods
from agent.store_link import StoreLink
from consensus.runtime.durable_file import replace_file
from statemachine.effects import EffectKind
from tests.agent.jobs_support import WAIT_S, GpuDouble, runner
from tests.agent.recording_store import RecordingStore

pytestmark = pytest.mark.anyio
STALL_S = 5.0  # how long a stalled write waits for the event loop to run something else


async def test_the_event_loop_runs_while_the_cursor_is_written(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    effects = tuple({"index": index, "kind": EffectKind.KILL_POD.value, "node": "n0",
                     "group": "g", "pod_uid": f"p{index}", "reason": "drain"}
                    for index in (1, 2))
    fake = RecordingStore("n0", effects=effects)
    writing, loop_ran = threading.Event(), threading.Event()
    stalled: list[pathlib.Path] = []

    def slow_replace_file(path: pathlib.Path, data: bytes) -> None:  # a busy disk
        writing.set()
        if not loop_ran.wait(STALL_S):
            stalled.append(path)
        replace_file(path, data)

    async def heartbeat() -> None:  # any task of the agent's: it must get a turn
        while not writing.is_set():
            await anyio.sleep(0.01)
        loop_ran.set()

    monkeypatch.setattr(pods_module, "replace_file", slow_replace_file)
    cursor = tmp_path / EFFECTS_CURSOR
    async with runner(tmp_path, GpuDouble()) as jobs:
        pods = Pods(StoreLink(fake, "n0", retry_ms_max=200), jobs,  # type: ignore[arg-type]
                    tmp_path)
        with anyio.fail_after(WAIT_S + 2 * STALL_S):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(heartbeat)
                tasks.start_soon(pods.follow_effects)
                while not (cursor.exists() and cursor.read_text().strip() == "2"):
                    await anyio.sleep(0.01)
                tasks.cancel_scope.cancel()
    assert not stalled, f"the event loop stood still while {stalled[0]} was written"
