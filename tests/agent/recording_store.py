"""A stand-in for the store (`GpuStore`) that accepts every call of a node agent and records
when each was made: for tests of the agent's timing and ordering, where a real cluster would
only add noise. It holds only the gangs and effects a test gives it; its watch hands out
those effects, then waits for ever."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

import anyio

from statemachine.errors import Code, Rejection
from statemachine.results import Done, NodeRegistered, PodAssignment


class RecordingStore:
    def __init__(self, node: str, pods: tuple[PodAssignment, ...] = (), *,
                 gangs: dict[str, dict[str, Any]] | None = None,
                 effects: tuple[dict[str, Any], ...] = ()) -> None:
        self.node = node
        self.pods = pods
        self.gangs = gangs or {}  # group: its answer to a gang query
        self.effects = effects
        self.calls: list[tuple[float, str, tuple[Any, ...]]] = []
        self.incarnation = 0
        self.health_reply: Any = Done(note="ok")

    def _log(self, name: str, *args: Any) -> None:
        self.calls.append((time.monotonic(), name, args))

    def times(self, name: str) -> list[float]:
        """When each call named `name` was made (time.monotonic), oldest first."""
        return [at for at, call, _ in self.calls if call == name]

    async def register_node(self, node: str, boot_id: str, gpus: Any, links: Any = (),
                            health: Any = ()) -> Any:
        self._log("register", node, gpus, health)
        self.incarnation += 1
        return NodeRegistered(node=node, incarnation=self.incarnation, pods=self.pods)

    async def heartbeat(self, node: str, incarnation: int) -> Any:
        self._log("heartbeat", node, incarnation)
        return Done(note="lease renewed")

    async def report_health(self, node: str, incarnation: int, reports: Any) -> Any:
        self._log("health", node, incarnation, reports)
        return self.health_reply

    async def ack_pod_started(self, node: str, incarnation: int, group: str, pod_uid: str,
                              gpu_uuids: Any) -> Any:
        self._log("ack", node, group, pod_uid)
        return Done(note="running")

    async def report_pod_exit(self, node: str, incarnation: int, group: str, pod_uid: str,
                              exit_code: int, *, reason: str = "") -> Any:
        self._log("exit", node, group, pod_uid, exit_code, reason)
        return Done(note="exited")

    async def gang(self, group: str, *, node: str | None = None) -> Any:
        return self.gangs.get(group, Rejection(code=Code.UNKNOWN_GROUP, message=group))

    async def effects_resume_after(self, node: str, after: int) -> int:
        return after  # every effect is kept

    async def watch_effects(self, node: str, after: int = 0, *, wait_s: float = 5.0,
                            on_cursor: Callable[[int], None] | None = None
                            ) -> AsyncGenerator[dict[str, Any], None]:
        for effect in self.effects:
            if effect["index"] > after:
                yield effect
        await anyio.sleep_forever()
