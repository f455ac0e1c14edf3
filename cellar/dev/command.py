"""`cellar dev`: the README's main job. A 3-replica cluster on loopback with durable storage
and mutual TLS, a fleet of simulated nodes acting as node agents, and a scheduler placing
gangs; a live view while it runs; a summary at the end.

It runs for `--seconds` (60 by default) and then stops everything and exits 0; Ctrl-C stops it
early, as cleanly. `--kill-sequencer` kills the sequencer with SIGKILL a third of the way in,
restarts it a few seconds later and reports how long commits paused: from the kill to the first
commit of a heartbeat sent after it, timed as `cellar bench cluster` times failover (its
`failover_ms`, with callers heartbeating back to back), not on the live view's 1 s tick.

There is no plain-TCP mode: without TLS every client is the one configured identity (an
administrator), and the state machine rightly refuses node commands from it, so the simulated
nodes could never register.
"""

from __future__ import annotations

import argparse
import pathlib
import random
import shutil
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio

from cellar.bench.cluster import KILL_AFTER_S, FailoverError, failover_ms
from cellar.dev.spec import dev_spec, node_names
from cellar.dev.view import Frame, Screen, latency_window, tenants_of
from cellar.dev.workload import SCHEDULER, Activity, Scheduler, SimulatedNode
from cellar.exception_groups import run_unwrapped
from cellar.local_cluster import Layout, ProcessCluster
from consensus.envelope import Principal, Role
from consensus.runtime.arguments import at_least, seconds
from consensus.runtime.client import CellarClient, ClientConfig, ClientError
from consensus.runtime.tls import IdentityRole
from statemachine.errors import Rejection
from statemachine.store import GpuStore

ADMIN = "dev"
RESTART_AFTER_S = 4.0
CLIENT = ClientConfig(attempt_timeout_s=1.0, deadline_s=20.0, sessions=16)
EXIT_USAGE = 2  # as argparse's: the run could not start as asked
EXIT_FAILED = 1  # the cluster stopped answering during the run
FAILOVER_CALLERS = 8  # heartbeats back to back while the sequencer is killed
DEFAULT_DATA_DIR = pathlib.Path(".cellar-dev")
MARKER = ".cellar-dev-cluster"  # in the cluster directory: a run may replace it


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=seconds(), default=60.0,
                        help="how long to run (default 60)")
    parser.add_argument("--nodes", type=_multiple_of_four, default=16,
                        help="simulated 8-GPU nodes (a multiple of 4)")
    parser.add_argument("--replicas", type=int, default=3, choices=(3, 5),
                        help="replica processes (default 3)")
    parser.add_argument("--gangs", type=at_least(0), default=24,
                        help="gangs the scheduler keeps busy")
    parser.add_argument("--kill-sequencer", action="store_true",
                        help="kill -9 the sequencer a third of the way in, to show failover")
    parser.add_argument("--data-dir", type=pathlib.Path, default=DEFAULT_DATA_DIR,
                        help="where the cluster's files go (replaced on each run)")
    parser.add_argument("--seed", type=at_least(0), default=7, help="workload seed")
    parser.set_defaults(handler=run)


def _multiple_of_four(text: str) -> int:
    """A node count: the demo's racks hold 4 nodes each."""
    count = at_least(4)(text)
    if count % 4:
        raise argparse.ArgumentTypeError(f"must be a multiple of 4, not {count}")
    return count


@dataclass
class Run:
    args: argparse.Namespace
    cluster: ProcessCluster
    activity: Activity = field(default_factory=Activity)
    started: float = field(default_factory=time.monotonic)
    kills: list[tuple[int, float]] = field(default_factory=list)  # (replica, when)
    pauses_s: list[float] = field(default_factory=list)
    failover_error: str = ""  # why the pause could not be timed
    restarted_at: float | None = None  # when the killed replica was started again
    views: set[int] = field(default_factory=set)

    def killed(self, replica: int, when: float) -> None:
        self.kills.append((replica, when))


def run(args: argparse.Namespace) -> int:
    layout = _fresh_layout(args)
    if layout is None:
        return EXIT_USAGE
    directory = layout.directory
    cluster = ProcessCluster(layout)
    print(f"starting {args.replicas} replicas on 127.0.0.1 (data and logs in {directory})")
    cluster.start()
    state = Run(args, cluster)
    failure = ""
    try:
        try:
            cluster.wait_ports()
        except RuntimeError as error:  # a replica exited, or never listened (a port taken)
            print(f"cellar dev: the cluster could not start: {error}", file=sys.stderr)
            return EXIT_USAGE
        run_unwrapped(_main, state)
    except KeyboardInterrupt:
        print("\ninterrupted")
    except ClientError as error:  # no quorum past the client's deadline: replicas gone
        failure = f"cellar dev: the cluster stopped answering: {error}"
    finally:
        cluster.stop()
    for line in summary(state):
        print(line)
    if failure:
        print(failure, file=sys.stderr)
        return EXIT_FAILED
    return 0


def _fresh_layout(args: argparse.Namespace) -> Layout | None:
    """The cluster's files, written afresh under `--data-dir`; None (after saying why in one
    line) when they cannot be written there: a regular file in the way, no permission, or a
    `cluster` directory there that no earlier run wrote (it is the user's: never deleted)."""
    directory = args.data_dir / "cluster"
    if _foreign(directory, args.data_dir):
        print(f"cellar dev: --data-dir {args.data_dir}: {directory} exists and is not a "
              "cluster an earlier `cellar dev` wrote; move it aside or choose another "
              "--data-dir", file=sys.stderr)
        return None
    shutil.rmtree(directory, ignore_errors=True)
    layout = Layout(directory, args.replicas)
    try:
        layout.write(admins=[ADMIN], schedulers=[SCHEDULER.name], nodes=node_names(args.nodes))
        (layout.directory / MARKER).write_text("written by `cellar dev`; replaced on each run\n",
                                               encoding="utf-8")
    except OSError as error:
        print(f"cellar dev: --data-dir {args.data_dir}: cannot write "
              f"{error.filename or layout.directory}: {error.strerror or error}", file=sys.stderr)
        return None
    return layout


def _foreign(directory: pathlib.Path, data_dir: pathlib.Path) -> bool:
    """Whether `directory` holds files that are no dev cluster's: not under the default
    --data-dir (this command's own), and without the marker each run leaves there."""
    try:
        if not directory.is_dir() or not any(directory.iterdir()):
            return False
    except OSError:  # unreadable: writing there fails, and says why
        return False
    return data_dir.resolve() != DEFAULT_DATA_DIR.resolve() and \
        not (directory / MARKER).is_file()


@asynccontextmanager
async def _store(layout: Layout, principal: Principal) -> AsyncIterator[GpuStore]:
    async with layout.client(IdentityRole(principal.role.value), principal.name,
                             CLIENT) as client:
        yield GpuStore(client)


async def _main(state: Run) -> None:
    layout, args = state.cluster.layout, state.args
    async with layout.client(IdentityRole.ADMIN, ADMIN, CLIENT) as admin_client:
        applied = await GpuStore(admin_client).apply_config(0, dev_spec(args.nodes))
        if isinstance(applied, Rejection):
            raise SystemExit(f"the cluster refused the configuration: {applied}")
        rng = random.Random(args.seed)

        def store_for(principal: Principal):  # type: ignore[no-untyped-def]
            return _store(layout, principal)

        async with anyio.create_task_group() as tasks:
            nodes = [SimulatedNode(name, state.activity, rng) for name in node_names(args.nodes)]
            for node in nodes:
                tasks.start_soon(node.run, store_for)
            tasks.start_soon(Scheduler(state.activity, rng, in_flight=args.gangs).run,
                             store_for)
            if args.kill_sequencer:
                tasks.start_soon(_kill_sequencer, state, admin_client, nodes[0])
            await _watch(state, admin_client)
            tasks.cancel_scope.cancel()


async def _watch(state: Run, client: CellarClient) -> None:
    screen, args = Screen(), state.args
    applied_before, latency_before, count_before = 0.0, list(state.activity.latency.counts), 0
    asked_before = time.monotonic()
    while (elapsed := time.monotonic() - state.started) < args.seconds:
        await anyio.sleep(1.0)
        replicas = await _statuses(state, client)
        asked = time.monotonic()  # a refresh is 1 s and the queries: per second of it
        applied = max((float(replica.get("metrics", {}).get("driver.commands_applied", 0))
                       for replica in replicas), default=0.0)
        commits = max(0.0, applied - applied_before) / max(asked - asked_before, 1e-3)
        applied_before, asked_before = applied, asked
        p50, p99 = latency_window(state.activity, latency_before, count_before)
        latency_before = list(state.activity.latency.counts)
        count_before = state.activity.latency.count
        note = _kill_note(state)
        gangs = await _allocated(client)
        screen.show(Frame(elapsed, replicas, commits, p50, p99, tenants_of(gangs),
                          state.activity.counts, note))


async def _statuses(state: Run, client: CellarClient) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for endpoint in state.cluster.layout.endpoints:
        try:
            with anyio.fail_after(1.0):
                status = await client.status(endpoint)
            state.views.add(int(status["view"]))
        except (ClientError, TimeoutError, OSError):
            status = {"running": False}
        found.append(status)
    return found


async def _allocated(client: CellarClient) -> list[dict[str, object]]:
    try:
        with anyio.fail_after(1.0):
            answer = await GpuStore(client).gangs(phase="allocated")
    except (ClientError, TimeoutError):
        return []
    return [] if isinstance(answer, Rejection) else list(answer.get("groups", []))


async def _kill_sequencer(state: Run, admin: CellarClient, node: SimulatedNode) -> None:
    """A third of the way in, kill the sequencer and time the pause in commits (heartbeats of
    `node`, under its own identity as its agent sends them, go back to back around the kill);
    restart the killed replica `RESTART_AFTER_S` after the kill, or once the pause is timed."""
    kill_at = state.started + state.args.seconds / 3
    await anyio.sleep(max(0.0, kill_at - KILL_AFTER_S - time.monotonic()))
    async with _store(state.cluster.layout, Principal(Role.NODE, node.name)) as store:

        async def heartbeat() -> object:
            return await store.heartbeat(node.name, node.incarnation)

        while not state.kills:
            try:
                await time_failover(state, admin, [heartbeat] * FAILOVER_CALLERS)
            except (FailoverError, ClientError):  # the sequencer is not known yet
                await anyio.sleep(1.0)
    replica, killed_at = state.kills[0]
    await anyio.sleep(max(0.0, killed_at + RESTART_AFTER_S - time.monotonic()))
    state.cluster.processes[replica].start()
    state.restarted_at = time.monotonic()


async def time_failover(state: Run, admin: CellarClient,
                        calls: Sequence[Callable[[], Awaitable[object]]]) -> None:
    """Kill the sequencer (recorded in `state.kills`) and record the milliseconds to the first
    commit of one of `calls` sent after the kill (`state.pauses_s`), by `bench cluster`'s own
    `failover_ms`. A failure before the kill is raised (nothing was killed: try again); one
    after it is recorded in `state.failover_error`."""
    try:
        milliseconds = await failover_ms(state.cluster, admin, calls, on_kill=state.killed)
    except FailoverError as error:
        if not state.kills:
            raise
        state.failover_error = str(error)
        return
    state.pauses_s.append(milliseconds / 1000)


def _kill_note(state: Run) -> str:
    """What the live view says of the sequencer's kill and the restart."""
    if not state.kills:
        return ""
    replica, killed_at = state.kills[0]
    if state.restarted_at is not None:
        return f"restarted replica {replica} {state.restarted_at - killed_at:.0f} s after the kill"
    down_s = time.monotonic() - killed_at
    if down_s < 1.0:
        return f"killed the sequencer (replica {replica}) with SIGKILL"
    return f"replica {replica} was killed {down_s:.0f} s ago"


def summary(state: Run) -> list[str]:
    counts, latency = state.activity.counts, state.activity.latency
    seconds = max(1e-9, time.monotonic() - state.started)
    # Every call that returned observed its latency; the counts also hold events (pods killed,
    # gangs finished or withdrawn), which are no calls.
    calls = latency.count
    lines = ["", "summary",
             f"  ran {seconds:.0f} s with {state.args.replicas} replicas, "
             f"{state.args.nodes} nodes of 8 GPUs",
             f"  {calls} client calls ({calls / seconds:.0f}/s), latency p50 "
             f"{latency.quantile(0.5) * 1000:.1f} ms, p99 {latency.quantile(0.99) * 1000:.1f} ms"
             " (bucket bounds)",
             f"  gangs: {counts['submit']} submitted, {counts['bind']} pods bound, "
             f"{counts['exit']} pod exits, {counts['killed']} pods killed by preemption, "
             f"{counts['finished']} gangs finished, {counts['withdrawn']} withdrawn",
             f"  views seen: {sorted(state.views) or 'none'}"]
    unknown = sum(count for name, count in counts.items() if name.endswith(".unknown"))
    if unknown:
        lines.append(f"  {unknown} calls ended with an unknown outcome (timed out)")
    if state.activity.rejections:
        top = ", ".join(f"{code} {count}" for code, count in
                        state.activity.rejections.most_common(4))
        lines.append(f"  rejections (business refusals, replicated): {top}")
    if state.kills:
        pause = (f"commits resumed {state.pauses_s[0] * 1000:.0f} ms after the kill"
                 if state.pauses_s else state.failover_error
                 or "commits had not resumed when the run ended")
        lines.append(f"  sequencer (replica {state.kills[0][0]}) killed with SIGKILL: {pause}")
    return lines
