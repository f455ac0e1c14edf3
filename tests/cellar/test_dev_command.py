"""`cellar dev`, the README's main job, as a user runs it: real replica processes, a bounded
run that exits 0 with a summary, failover on request (timed from the kill to the first commit
sent after it), Ctrl-C or SIGTERM as clean as the timeout, and a data directory it cannot use
refused in one line."""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any, cast

import anyio
import pytest

from cellar.bench import cluster as bench_cluster
from cellar.cli import main
from cellar.dev.command import Run, summary, time_failover
from consensus.runtime.client import CellarClient, Unavailable
from tests.cellar.leftovers import kill_leftovers

SMALL = ["--nodes", "4", "--gangs", "4"]


def dev(workdir: pathlib.Path, *args: str) -> subprocess.Popen[str]:
    """`cellar dev` started in `workdir` with a relative data directory, as `make demo` does,
    and with Ctrl-C's default meaning, as in a terminal: a shell without job control starts
    its background commands with SIGINT ignored, and a test run started that way would pass
    that on."""
    return subprocess.Popen([sys.executable, "-m", "cellar", "dev", "--data-dir", "dev-data",
                             *SMALL, *args], cwd=workdir, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1",
                                 "PYTHONFAULTHANDLER": "1"},
                            preexec_fn=_default_sigint)  # noqa: PLW1509 - pytest runs no other thread


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.timeout(90)
def test_a_bounded_run_with_a_sequencer_kill_exits_cleanly(tmp_path: pathlib.Path) -> None:
    """12 s: on a busy machine the cluster's start can take 5 s of them, the kill comes once
    the workload runs and the restart 4 s after it, and both must show before the end."""
    output, _ = dev(tmp_path, "--seconds", "12", "--kill-sequencer").communicate(timeout=80)
    assert "Traceback" not in output, output
    summary = output[output.index("\nsummary"):]
    assert "client calls" in summary and "gangs:" in summary
    assert "killed with SIGKILL: commits resumed" in summary, output
    assert "restarted replica" in output


@pytest.mark.timeout(90)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_stops_everything_and_still_summarises(
        tmp_path: pathlib.Path, signum: signal.Signals) -> None:
    """SIGTERM (a service manager, `kill`) stops as cleanly as Ctrl-C: its default would kill
    `cellar dev` alone and leave its replicas running."""
    process = dev(tmp_path, "--seconds", "60")
    assert process.stdout is not None
    deadline = time.monotonic() + 40
    while "commits/s" not in process.stdout.readline():
        assert time.monotonic() < deadline and process.poll() is None
    process.send_signal(signum)
    try:
        rest, _ = process.communicate(timeout=40)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)  # the fault handler prints every thread's stack
        stuck, _ = process.communicate(timeout=20)
        kill_leftovers(tmp_path)
        pytest.fail(f"cellar dev still running 40 s after {signum.name}:\n{stuck[-20000:]}")
    replicas = kill_leftovers(tmp_path)
    assert process.returncode == 0, rest
    assert "interrupted" in rest and "\nsummary" in rest and "Traceback" not in rest
    assert replicas == "", "replica processes outlived cellar dev"


@pytest.mark.parametrize("under", ["", "sub"], ids=["the-file", "below-the-file"])
def test_a_data_dir_that_is_a_regular_file_is_refused_in_one_line(
        tmp_path: pathlib.Path, under: str, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    data_dir = afile / under if under else afile
    assert main(["dev", "--data-dir", str(data_dir), *SMALL]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing started
    assert captured.err == (f"cellar dev: --data-dir {data_dir}: cannot write "
                            f"{data_dir / 'cluster'}: Not a directory\n")
    assert afile.read_text() == "not a directory"


class FakeProcess:
    def __init__(self) -> None:
        self.killed_at: float | None = None

    def kill(self) -> None:
        self.killed_at = time.monotonic()


class FakeCluster:
    """Three replicas, replica 1 the sequencer; what `failover_ms` asks of a cluster."""

    def __init__(self) -> None:
        self.processes = [FakeProcess() for _ in range(3)]
        self.layout = argparse.Namespace(endpoints=["r0", "r1", "r2"])

    async def status(self, endpoint: str) -> dict[str, Any]:  # the admin client's
        return {"replica_id": endpoint[1], "is_sequencer": endpoint == "r1"}


def fake_run(fake: FakeCluster) -> Run:
    args = argparse.Namespace(replicas=3, nodes=4, seconds=9.0)
    return Run(args, cast(Any, fake))


def test_the_pause_runs_from_the_kill_to_the_first_commit_sent_after_it() -> None:
    """Timed by `bench cluster`'s failover_ms, not on the live view's 1 s tick, which could
    never report less than about 1000 ms."""
    fake = FakeCluster()
    state = fake_run(fake)
    committed_at: list[float] = []

    async def heartbeat() -> object:
        await anyio.sleep(0.005)
        killed_at = fake.processes[1].killed_at
        if killed_at is not None and time.monotonic() - killed_at < 0.2:
            raise Unavailable("electing a new sequencer")
        if killed_at is not None and not committed_at:
            committed_at.append(time.monotonic())
        return None

    anyio.run(time_failover, state, cast(CellarClient, fake), [heartbeat] * 4)
    [(replica, when)] = state.kills
    killed_at = fake.processes[1].killed_at
    assert replica == 1 and killed_at is not None and killed_at <= when
    assert [process.killed_at is None for process in fake.processes] == [True, False, True]
    assert state.pauses_s == [pytest.approx(committed_at[0] - when, abs=0.005)]
    assert state.pauses_s[0] >= 0.2  # nothing committed sooner
    assert summary(state)[-1] == ("  sequencer (replica 1) killed with SIGKILL: commits resumed "
                                  f"{state.pauses_s[0] * 1000:.0f} ms after the kill")


def test_no_commit_after_the_kill_is_reported_and_no_sequencer_means_no_kill(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_cluster, "FAILOVER_WAIT_S", 0.2)
    fake = FakeCluster()
    state = fake_run(fake)

    async def unavailable() -> object:
        await anyio.sleep(0.005)
        raise Unavailable("no sequencer")

    anyio.run(time_failover, state, cast(CellarClient, fake), [unavailable])
    assert state.pauses_s == [] and [replica for replica, _ in state.kills] == [1]
    assert summary(state)[-1] == ("  sequencer (replica 1) killed with SIGKILL: no commit "
                                  "within 0 s of killing the sequencer")
    fake.layout.endpoints = ["r0"]  # no replica says it is the sequencer
    state = fake_run(fake)
    with pytest.raises(bench_cluster.FailoverError, match="no replica says"):
        anyio.run(time_failover, state, cast(CellarClient, fake), [unavailable])
    assert state.kills == []
