"""A real cluster of two builds that speak one peer protocol: replicas 0 and 1 know rules one
version past this build's (an upgrade in progress), replica 2 is this build. The upgraded pair
commits a Tick naming the later rules; replica 2, started after it, catches up on the log and
stops with exit status 76, saying to upgrade it, through the real node's task groups (not a
stand-in node), with no traceback; the upgraded pair goes on."""

from __future__ import annotations

import os
import pathlib
import time

import anyio
import pytest

from cellar.local_cluster import Layout, ReplicaProcess
from consensus.runtime.client import ClientConfig, ClientError
from consensus.runtime.tls import IdentityRole

pytestmark = [pytest.mark.live]
UPGRADED = "import statemachine.rules as rules\nrules.RULES_VERSION += 1\n"
WAIT_S = 60.0


async def executed_slots(layout: Layout, replica: int) -> int:
    config = ClientConfig(attempt_timeout_s=1.0, deadline_s=2.0)
    async with layout.client(IdentityRole.ADMIN, "admin", config, first=replica) as client:
        try:
            status = await client.status(layout.endpoints[replica])
        except ClientError:
            return 0
    return int(status.get("executed_slots", 0))


def wait_executed(layout: Layout, replica: int, slots: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while anyio.run(executed_slots, layout, replica) < slots:
        assert time.monotonic() < deadline, f"replica {replica} executed fewer than {slots}"
        time.sleep(0.2)


def test_a_replica_of_an_older_build_stops_with_76_when_the_rules_are_raised(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    later_build = tmp_path / "later-build"
    later_build.mkdir()
    (later_build / "sitecustomize.py").write_text(UPGRADED)
    layout = Layout(tmp_path / "cluster", 3, insecure=True, loop="asyncio")
    layout.write()
    replicas = [ReplicaProcess(layout, replica) for replica in range(3)]
    path = os.environ.get("PYTHONPATH", "")
    try:
        monkeypatch.setenv("PYTHONPATH", f"{later_build}{os.pathsep}{path}")
        for replica in replicas[:2]:
            replica.start()
        wait_executed(layout, 0, 1)  # the upgraded sequencer's first Tick
        monkeypatch.setenv("PYTHONPATH", path)
        replicas[2].start()
        older = replicas[2].process
        assert older is not None
        deadline = time.monotonic() + WAIT_S
        while older.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        log = replicas[2].log_path.read_text()
        assert older.returncode == 76, log
        assert "upgrade this replica" in log and "Traceback" not in log, log
        before = anyio.run(executed_slots, layout, 0)
        wait_executed(layout, 0, before + 2)  # the upgraded pair goes on
        assert all(replica.running for replica in replicas[:2])
    finally:
        for replica in replicas:
            replica.stop()
