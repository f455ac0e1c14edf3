"""A job's exit reported while the agent registers again is made again under the new
incarnation.

The agent registers again (a trimmed outbox, the store ending its incarnation) while another
task reports a job's exit. The store applies the registration (incarnation N+1) before its
reply reaches the agent, and longer when that reply is lost in a failover and the call is made
again: meanwhile the exit goes out under incarnation N and is refused STALE_INCARNATION. It had
been dropped ("the store no longer knows"), the runner marking it reported; the registration's
reconcile then found the pod expected but not running and reported it lost (exit code -1), so
the job's real exit code (0 here) never reached the store.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from agent.store_link import StoreLink
from statemachine.commands import GpuInventory
from statemachine.errors import Code, Rejection
from statemachine.results import Done, NodeRegistered

pytestmark = pytest.mark.anyio


class FencedStore:
    """The store's fencing, and a registration whose reply comes late."""

    def __init__(self) -> None:
        self.incarnation = 0
        self.exits: list[tuple[int, str, int]] = []
        self.reply_late = anyio.Event()
        self.late = False

    async def register_node(self, node: str, boot_id: str, gpus: Any, links: Any = (),
                            health: Any = ()) -> Any:
        self.incarnation += 1
        if self.late:
            await self.reply_late.wait()
        return NodeRegistered(node=node, incarnation=self.incarnation, pods=())

    async def report_pod_exit(self, node: str, incarnation: int, group: str, pod_uid: str,
                              exit_code: int, *, reason: str = "") -> Any:
        if incarnation != self.incarnation:
            return Rejection(code=Code.STALE_INCARNATION,
                             message=f"incarnation {incarnation}, current {self.incarnation}")
        self.exits.append((incarnation, pod_uid, exit_code))
        return Done(note="exited")


async def test_an_exit_reported_while_registering_again_reaches_the_store() -> None:
    store = FencedStore()
    link = StoreLink(store, "n0", retry_ms_max=100)  # type: ignore[arg-type]

    async def read_gpus() -> tuple[list[GpuInventory], list[Any]]:
        return [], []

    await link.register("boot-1", read_gpus)
    assert link.incarnation == 1
    store.late = True
    results: list[Any] = []
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(link.register, "boot-2", read_gpus)
        await anyio.sleep(0.01)  # the store has applied incarnation 2; its reply is on its way

        async def exit_now() -> None:
            results.append(await link.report_exit("G", "pod-0", 0, ""))

        tasks.start_soon(exit_now)
        await anyio.sleep(0.01)
        store.reply_late.set()
    assert link.incarnation == 2
    assert store.exits == [(2, "pod-0", 0)], (
        f"the exit was answered {results}, never applied: the job's exit code is lost")
