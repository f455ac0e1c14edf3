"""`cellar dev` and the local cluster when things go wrong, and the figures its summary prints:

- replicas gone past the client's deadline: a simulated node's effect watch fails; the node
  resumes it (the run goes on), and a failure that does reach the command is one line on
  stderr after the summary, not an exception group's traceback;
- the summary's "client calls" counts calls, not the events counted beside them (pods killed,
  gangs finished or withdrawn);
- another process listening on a replica's client port is not taken for the replica;
- a `cluster` directory under --data-dir that no run of `cellar dev` wrote is not deleted.
"""

from __future__ import annotations

import argparse
import pathlib
import random
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import anyio
import pytest

from cellar.dev import command
from cellar.dev.command import Run, summary
from cellar.dev.workload import Activity, SimulatedNode
from cellar.local_cluster import HOST, Layout, ProcessCluster
from consensus.envelope import Principal
from consensus.runtime.client import Unavailable
from statemachine.results import NodeRegistered
from statemachine.store import GpuStore


class FlakyWatchStore:
    """A store whose first effect watch fails as a cluster without quorum fails it; the
    next hands out one effect and then waits."""

    def __init__(self) -> None:
        self.watched_after: list[int] = []

    async def register_node(self, *args: object) -> NodeRegistered:
        return NodeRegistered(node="node-00", incarnation=1, pods=())

    async def heartbeat(self, *args: object) -> None:
        return None

    async def report_health(self, *args: object) -> None:
        return None

    async def watch_effects(self, node: str, after: int = 0, *,
                            wait_s: float = 5.0) -> AsyncIterator[dict[str, Any]]:
        self.watched_after.append(after)
        if len(self.watched_after) == 1:
            yield {"index": 7, "kind": "noted"}
            raise Unavailable("no replica answered the read in time")
        await anyio.sleep_forever()
        yield {}  # pragma: no cover - never reached


def test_a_failed_effect_watch_is_resumed_after_the_last_effect() -> None:
    store = FlakyWatchStore()
    activity = Activity()
    node = SimulatedNode("node-00", activity, random.Random(1))

    @asynccontextmanager
    async def store_for(principal: Principal) -> AsyncIterator[GpuStore]:
        yield cast(GpuStore, store)

    async def main() -> None:
        with anyio.move_on_after(5):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(node.run, store_for)
                while len(store.watched_after) < 2:
                    await anyio.sleep(0.05)
                tasks.cancel_scope.cancel()

    anyio.run(main)
    assert store.watched_after == [0, 7]
    assert activity.counts["watch.unknown"] == 1


def test_the_summary_counts_calls_not_events() -> None:
    activity = Activity()

    async def calls() -> None:
        async def answer() -> None:
            return None
        for name in ("submit", "status", "heartbeat"):
            await activity.timed(name, answer())

    anyio.run(calls)
    activity.counts["killed"] += 2
    activity.counts["finished"] += 5
    activity.counts["withdrawn"] += 1
    state = Run(argparse.Namespace(replicas=3, nodes=4, seconds=9.0), cast(Any, None),
                activity=activity)
    [line] = [line for line in summary(state) if "client calls" in line]
    assert line.startswith("  3 client calls"), line


class NoCluster:
    """A cluster whose replicas are all up at once and stop at once."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    def start(self) -> None:
        pass

    def wait_ports(self) -> None:
        pass

    def stop(self) -> None:
        pass


def test_a_cluster_that_stops_answering_is_one_line_after_the_summary(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    async def no_quorum(state: Run) -> None:
        async with anyio.create_task_group():  # as the client's own tasks wrap it
            raise Unavailable("no replica answered the read in time")

    monkeypatch.setattr(command, "ProcessCluster", NoCluster)
    monkeypatch.setattr(command, "_main", no_quorum)
    args = argparse.Namespace(data_dir=tmp_path / "dev", replicas=3, nodes=4, seconds=5.0)
    assert command.run(args) == 1
    captured = capsys.readouterr()
    assert "\nsummary" in captured.out
    assert captured.err == ("cellar dev: the cluster stopped answering: no replica answered "
                            "the read in time\n")


@pytest.mark.timeout(60)
def test_another_process_on_a_client_port_is_not_taken_for_the_replica(
        tmp_path: pathlib.Path) -> None:
    layout = Layout(tmp_path, 3, insecure=True)
    layout.write()
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind((HOST, layout.client_ports[0]))
        squatter.listen()
        cluster = ProcessCluster(layout)
        cluster.start()
        try:
            with pytest.raises(RuntimeError, match="replica 0 did not start"):
                cluster.wait_ports(timeout_s=30)
        finally:
            cluster.stop()


def test_a_cluster_directory_no_run_wrote_is_left_alone(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    notes = tmp_path / "cluster" / "notes.txt"
    notes.parent.mkdir()
    notes.write_text("mine")
    args = argparse.Namespace(data_dir=tmp_path, replicas=3, nodes=4)
    assert command._fresh_layout(args) is None
    assert notes.read_text() == "mine"
    assert "is not a cluster an earlier `cellar dev` wrote" in capsys.readouterr().err
    notes.unlink()  # empty now: a run may use it, and the next run may replace what it wrote
    layout = command._fresh_layout(args)
    assert layout is not None and (layout.directory / "replica-0.toml").is_file()
    assert command._fresh_layout(args) is not None
