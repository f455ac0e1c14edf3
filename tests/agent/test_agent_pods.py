"""The agent's bindings end to end with real child processes: a bound pod's command starts with
its GPUs, its exit reaches the store, a release or a preemption stops it, and a restarted agent
adopts what still runs and reports what was lost, never starting a binding twice."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from agent import procfs
from agent.fake_backend import FakeGpuBackend
from agent.started_ledger import StartedLedger
from statemachine import outbox
from statemachine.errors import Rejection
from statemachine.results import GroupPhase, GroupStatus
from statemachine.spec import FailurePolicy
from statemachine.store import GpuStore
from tests.agent.agent_support import (
    ADMIN,
    SCHEDULER,
    configured_cluster,
    eventually,
    running_agent,
    store,
)

pytestmark = pytest.mark.anyio



@pytest.fixture
def jobs_dir(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """Where jobs leave their marks; every job still running at the end is killed."""
    directory = tmp_path / "jobs"
    directory.mkdir()
    yield directory
    for mark in directory.glob("*.pid"):
        pid = int(mark.read_text(encoding="ascii").split()[0])
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def job(marks: pathlib.Path, name: str, *, seconds: float, exit_code: int = 0) -> list[str]:
    """A job that records its pid and GPUs, runs for a while, then exits with `exit_code`;
    each start appends a line, so a second start would show."""
    script = (f"import os, sys, time; f = open({str(marks / name)!r} + '.pid', 'a'); "
              "f.write(f\"{os.getpid()} {os.environ['CUDA_VISIBLE_DEVICES']}\\n\"); "
              f"f.close(); time.sleep({seconds}); sys.exit({exit_code})")
    return [sys.executable, "-c", script]


def starts(marks: pathlib.Path, name: str) -> list[list[str]]:
    path = marks / f"{name}.pid"
    if not path.exists():
        return []
    return [line.split(" ") for line in path.read_text(encoding="ascii").splitlines()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def bind(scheduler: GpuStore, group: str, command: list[str], *, tenant: str = "a",
               priority: int = 5, gpus: int = 1, pods: int = 1) -> None:
    """Submit a gang of `pods` pods and bind the first (a second, unbound pod keeps the gang
    in the store after the first exits, so its exit can be read: the gang keeps its pods when
    one fails)."""
    status = await scheduler.submit_gang(group, tenant, priority, [(pods, gpus)],
                                         on_pod_failure=FailurePolicy.KEEP)
    assert isinstance(status, GroupStatus) and status.phase is GroupPhase.ALLOCATED, status
    bound = await scheduler.bind_pod(group, 0, f"{group}-pod", command)
    assert not isinstance(bound, Rejection), bound


async def pod_of(admin: GpuStore, group: str) -> dict[str, Any] | None:
    answer: Any = await admin.gang(group)
    return None if isinstance(answer, Rejection) else answer["pods"][0]


async def until_phase(admin: GpuStore, group: str, phase: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        pod = await pod_of(admin, group)
        return pod if pod is not None and pod["phase"] == phase else None
    return await eventually(probe, what=f"{group} {phase}")


async def until_gone(admin: GpuStore, group: str) -> None:
    async def probe() -> bool | None:
        return True if await pod_of(admin, group) is None else None
    await eventually(probe, what=f"{group} finished")


async def until_started(marks: pathlib.Path, name: str) -> list[str]:
    async def probe() -> list[str] | None:
        found = starts(marks, name)
        return found[0] if found else None
    return await eventually(probe, what=f"{name} started")


async def test_a_bound_pod_runs_with_its_gpus_and_its_exit_is_reported(
        tmp_path: pathlib.Path, jobs_dir: pathlib.Path) -> None:
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    with anyio.fail_after(30):
        async with configured_cluster() as cluster, store(cluster, SCHEDULER) as scheduler, \
                running_agent(cluster, "n0", gpus, tmp_path / "agent"):
            short = job(jobs_dir, "short", seconds=0.5, exit_code=3)
            await bind(scheduler, "short", short, gpus=2)
            pid, visible = await until_started(jobs_dir, "short")
            granted = visible.split(",")
            assert len(granted) == 2 and set(granted) <= set(gpus.uuids())
            running = await until_phase(scheduler, "short", "running")
            assert running["pod_uid"] == "short-pod"
            await until_gone(scheduler, "short")  # every pod exited: the gang completed
            assert not alive(int(pid))
            assert len(starts(jobs_dir, "short")) == 1


async def test_a_command_that_cannot_start_is_reported_with_its_reason(
        tmp_path: pathlib.Path) -> None:
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    with anyio.fail_after(30):
        async with configured_cluster() as cluster, store(cluster, SCHEDULER) as scheduler, \
                store(cluster, ADMIN) as admin, running_agent(cluster, "n0", gpus,
                                                              tmp_path / "agent"):
            status = await scheduler.submit_gang("bad", "a", 5, [(2, 1)],  # one pod stays
                                                 on_pod_failure=FailurePolicy.KEEP)
            assert isinstance(status, GroupStatus)
            await scheduler.bind_pod("bad", 0, "bad-pod", ["/nonexistent/trainer"])
            pod = await until_phase(admin, "bad", "exited")
            assert pod["exit_code"] == 127 and "could not start" in pod["exit_reason"], pod


async def test_a_pod_uid_started_before_on_the_node_is_reported_not_started(
        tmp_path: pathlib.Path, jobs_dir: pathlib.Path) -> None:
    """A pod uid is started at most once per node: a later gang that reuses one gets its pod
    reported exited with the reason, never left bound (its GPUs held) for ever."""
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    with anyio.fail_after(40):
        async with configured_cluster() as cluster, store(cluster, SCHEDULER) as scheduler, \
                store(cluster, ADMIN) as admin, \
                running_agent(cluster, "n0", gpus, tmp_path / "agent"):
            for attempt in ("first", "second"):
                status = await scheduler.submit_gang(attempt, "a", 5, [(2, 1)],
                                                     on_pod_failure=FailurePolicy.KEEP)
                assert isinstance(status, GroupStatus), status
                bound = await scheduler.bind_pod(attempt, 0, "trainer-0",
                                                 job(jobs_dir, attempt, seconds=0.2))
                assert not isinstance(bound, Rejection), bound
                pod = await until_phase(admin, attempt, "exited")
                await scheduler.release_gang(attempt)
            assert pod["exit_code"] == 127 and "already started" in pod["exit_reason"], pod
            assert starts(jobs_dir, "second") == []


async def test_a_failed_pod_stops_the_rest_of_its_gang(tmp_path: pathlib.Path,
                                                      jobs_dir: pathlib.Path) -> None:
    """Under the default pod failure policy, one pod's failure evicts its gang: the store
    asks for its other pod's kill, the agent stops that job, and the gang is released."""
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    with anyio.fail_after(30):
        async with configured_cluster() as cluster, store(cluster, SCHEDULER) as scheduler, \
                running_agent(cluster, "n0", gpus, tmp_path / "agent"):
            status = await scheduler.submit_gang("mpi", "a", 5, [(1, 1), (1, 1)])
            assert isinstance(status, GroupStatus), status
            for member, name, exit_code in ((0, "rank0", 0), (1, "rank1", 1)):
                seconds = 60 if name == "rank0" else 0.5
                command = job(jobs_dir, name, seconds=seconds, exit_code=exit_code)
                bound = await scheduler.bind_pod("mpi", member, name, command)
                assert not isinstance(bound, Rejection), bound
            survivor = int((await until_started(jobs_dir, "rank0"))[0])
            await until_gone(scheduler, "mpi")
            await eventually(_dead(survivor), what="the failed pod's peer stopped")


async def test_release_and_preemption_stop_the_job(tmp_path: pathlib.Path,
                                                   jobs_dir: pathlib.Path) -> None:
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    with anyio.fail_after(40):
        async with configured_cluster() as cluster, store(cluster, SCHEDULER) as scheduler, \
                running_agent(cluster, "n0", gpus, tmp_path / "agent"):
            await bind(scheduler, "released", job(jobs_dir, "released", seconds=60),
                       tenant="b", priority=-1, gpus=2)
            released_pid = int((await until_started(jobs_dir, "released"))[0])
            await until_phase(scheduler, "released", "running")
            await scheduler.release_gang("released")
            await eventually(_dead(released_pid), what="the released job stopped")
            await bind(scheduler, "victim", job(jobs_dir, "victim", seconds=60),
                       tenant="b", priority=-1, gpus=8)
            victim_pid = int((await until_started(jobs_dir, "victim"))[0])
            await until_phase(scheduler, "victim", "running")
            boss = await scheduler.submit_gang("boss", "a", 10, [(1, 8)])
            assert isinstance(boss, GroupStatus) and boss.phase is GroupPhase.PREEMPTING
            await eventually(_dead(victim_pid), what="the victim stopped")
            await eventually(_allocated(scheduler, "boss"), what="the preemptor placed")


async def test_a_restarted_agent_adopts_running_jobs_and_reports_lost_ones(
        tmp_path: pathlib.Path, jobs_dir: pathlib.Path) -> None:
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    state = tmp_path / "agent"
    with anyio.fail_after(40):
        async with configured_cluster() as cluster, store(cluster, SCHEDULER) as scheduler:
            async with running_agent(cluster, "n0", gpus, state):
                await bind(scheduler, "kept", job(jobs_dir, "kept", seconds=60), pods=2)
                await bind(scheduler, "lost", job(jobs_dir, "lost", seconds=60), pods=2)
                kept_pid = int((await until_started(jobs_dir, "kept"))[0])
                lost_pid = int((await until_started(jobs_dir, "lost"))[0])
                await until_phase(scheduler, "lost", "running")
            lost_ticks = procfs.start_ticks(lost_pid)
            os.killpg(lost_pid, signal.SIGKILL)  # dies while no agent watches
            # Dead (a zombie at most) before the agent looks: a job the kill has not ended yet
            # is adopted, and its end then reported as an adopted job's exit, not as lost.
            await eventually(_ended(lost_pid, lost_ticks), what="the lost job died")
            async with running_agent(cluster, "n0", gpus, state):
                lost = await until_phase(scheduler, "lost", "exited")
                assert "lost" in lost["exit_reason"], lost
                await until_phase(scheduler, "kept", "running")  # adopted, acknowledged again
                assert alive(kept_pid) and len(starts(jobs_dir, "kept")) == 1
                os.killpg(kept_pid, signal.SIGTERM)
                kept = await until_phase(scheduler, "kept", "exited")
                assert kept["exit_code"] == -1 and "agent restarted" in kept["exit_reason"]


def _ended(pid: int, ticks: int | None) -> Any:
    async def probe() -> bool | None:
        return True if ticks is None or not procfs.is_alive(pid, ticks) else None
    return probe


def _dead(pid: int) -> Any:
    async def probe() -> bool | None:
        return True if not alive(pid) else None
    return probe


def _allocated(scheduler: GpuStore, group: str) -> Any:
    async def probe() -> bool | None:
        answer: Any = await scheduler.gang(group)
        return True if not isinstance(answer, Rejection) and \
            answer["phase"] == "allocated" else None
    return probe


async def test_an_agent_whose_kill_was_trimmed_while_it_lagged_reconciles_and_stops_the_job(
        tmp_path: pathlib.Path, jobs_dir: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The outbox keeps only the newest effects. An agent whose watch lagged (cut off from
    the store, its incarnation kept) while a kill for its node was trimmed must not resume
    past it silently: it registers again, and the reconcile stops the job."""
    monkeypatch.setattr(outbox, "OUTBOX_RETAINED_MAX", 8)
    monkeypatch.setattr(outbox, "TRIM_CHUNK", 4)
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    with anyio.fail_after(40):
        async with configured_cluster() as cluster, store(cluster, SCHEDULER) as scheduler, \
                running_agent(cluster, "n0", gpus, tmp_path / "agent") as agent:
            await bind(scheduler, "doomed", job(jobs_dir, "doomed", seconds=60), tenant="b",
                       priority=-1, gpus=2)
            pid = int((await until_started(jobs_dir, "doomed"))[0])
            await until_phase(scheduler, "doomed", "running")
            registrations = agent.registrations
            back = anyio.Event()
            client = agent.link.store.client
            watch = client.watch

            async def lagging(*args: Any, **kwargs: Any) -> Any:
                await back.wait()
                return await watch(*args, **kwargs)

            client.watch = lagging  # type: ignore[method-assign]
            await anyio.sleep(0.5)  # the watch in flight returns (a Tick is news): now lagging
            await scheduler.release_gang("doomed")
            for round_ in range(12):  # effects enough to trim the kill away
                name = f"churn-{round_}"
                assert isinstance(await scheduler.submit_gang(name, "b", -1, [(1, 1)]),
                                  GroupStatus)
                await scheduler.release_gang(name)
            back.set()
            await eventually(_dead(pid), what="the job whose kill was trimmed stopped")
            assert agent.registrations > registrations


async def test_a_pod_evicted_while_the_agent_was_away_is_never_started(
        tmp_path: pathlib.Path, jobs_dir: pathlib.Path) -> None:
    """Bound while its agent restarted, then preempted at once: the registration lists the
    pod as bound but evicting, and the START_POD replayed is answered the same way. The
    agent reports it killed before its start, so the preemptor gets the GPUs."""
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    state = tmp_path / "agent"
    with anyio.fail_after(40):
        async with configured_cluster() as cluster, store(cluster, SCHEDULER) as scheduler:
            async with running_agent(cluster, "n0", gpus, state):
                pass  # registered, its lease runs for a while; the agent is then away
            await bind(scheduler, "victim", job(jobs_dir, "victim", seconds=60), tenant="b",
                       priority=-1, gpus=8)
            boss = await scheduler.submit_gang("boss", "a", 10, [(1, 8)])
            assert isinstance(boss, GroupStatus) and boss.phase is GroupPhase.PREEMPTING
            async with running_agent(cluster, "n0", gpus, state):
                await eventually(_allocated(scheduler, "boss"), what="the preemptor placed")
            # Remembered before any launch: a start killed before its mark was written shows.
            assert "victim-pod" not in StartedLedger(state, remembered_max=100)
            assert starts(jobs_dir, "victim") == []
