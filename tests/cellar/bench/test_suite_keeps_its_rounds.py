"""A run keeps what it measured: a failing WAN simulation after the rounds, a PySyncObj cluster
that fails to start (stopped, not left running), and a system or caller count named twice
(measured once)."""

from __future__ import annotations

import contextlib
import json
import pathlib
import subprocess
import sys

import pytest

from cellar.bench.peers import pysyncobj_peer, suite
from cellar.cli import main
from tests.cellar.bench.test_bench_peers import FakeCluster


class QuickSystem:
    name = "cellar-3"

    def prepare(self, work_dir: pathlib.Path) -> None:
        pass

    def start(self, directory: pathlib.Path) -> FakeCluster:
        return FakeCluster()


def test_a_failing_wan_simulation_does_not_lose_the_measured_rounds(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    """The WAN table comes after every round (25 minutes of them in a full run); if it fails,
    the rounds' results must still be written, not thrown away with a traceback."""
    monkeypatch.setattr(suite, "prepare",
                        lambda name, work_dir: suite.Prepared(name, QuickSystem(), None, "1"))

    def broken_sim(seconds: int) -> list[object]:
        raise RuntimeError("simulator bug")

    monkeypatch.setattr(suite, "wan_table", broken_sim)
    out = tmp_path / "out"
    with contextlib.suppress(RuntimeError):  # what the run did before the fix
        main(["bench", "peers", "--systems", "cellar-3", "--rounds", "1", "--clients", "1,2",
              "--seconds", "0.05", "--latency-seconds", "0.05", "--warmup-seconds", "0.02",
              "--connections", "1", "--no-install", "--no-failover", "--sim-seconds", "1",
              "--work-dir", str(tmp_path / "work"), "--out", str(out)])
    assert (out / "results.json").exists(), "the measured rounds were lost"
    document = json.loads((out / "results.json").read_text())
    assert document["systems"]["cellar-3"]["status"] == "measured"


def test_a_pysyncobj_start_interrupted_while_waiting_stops_its_nodes(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    """etcd's and Cellar's `start` stop what they launched on any exception (BaseException)
    while waiting for the cluster; PySyncObj's stopped its nodes only on TimeoutError, OSError
    and ValueError: a Ctrl-C / SIGTERM (KeyboardInterrupt) or any other error left them
    running, since `round_figures` only stops a cluster `start` returned."""
    processes: list[subprocess.Popen[bytes]] = []

    def fake_launch(python: pathlib.Path, directory: pathlib.Path,
                    conf: object) -> pysyncobj_peer.PySyncObjCluster:
        for _ in range(3):
            processes.append(subprocess.Popen([sys.executable, "-c",
                                               "import time; time.sleep(60)"]))
        nodes = tuple(pysyncobj_peer.NodeAddresses(f"127.0.0.1:{n}", ("127.0.0.1", n))
                      for n in (1, 2, 3))
        return pysyncobj_peer.PySyncObjCluster(nodes, processes, [])

    async def interrupted(cluster: object, timeout_s: float) -> None:
        raise RuntimeError("something unexpected while waiting for a leader")

    monkeypatch.setattr(pysyncobj_peer, "launch", fake_launch)
    monkeypatch.setattr(pysyncobj_peer, "_first_put", interrupted)
    system = pysyncobj_peer.PySyncObjSystem()
    system.python = pathlib.Path(sys.executable)
    try:
        with pytest.raises(RuntimeError, match="unexpected"):
            system.start(tmp_path)
        running = [process.pid for process in processes if process.poll() is None]
        assert running == [], "the nodes outlived a failed start"
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def test_a_system_or_caller_count_named_twice_is_measured_once() -> None:
    """`--systems cellar-3,cellar-3` ran every round twice into one `_Collected` (2 x rounds
    "rounds", the system listed twice in the table, once in the JSON); `--clients 16,16`
    ran the point twice, the second overwriting the first's figures, its row shown twice."""
    assert suite._names("cellar-3,etcd,cellar-3") == ("cellar-3", "etcd")
    assert suite._counts("1,16,16") == (1, 16)
