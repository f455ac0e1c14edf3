"""One live run: a local cluster of real replica processes (the key-value machine, synced,
TLS), its clients recording a history while the nemesis works, then a heal, and the verdict.

Phases, on the loop's clock:

1. start: the replicas, the link relays between them, and one client; wait until the cluster
   serves one view under one sequencer;
2. faults (`fault_s`): the clients run while the nemesis plays the seed's schedule;
3. heal (`heal_s`): every fault ends at once; the clients go on. Operations invoked once the
   cluster had `settle_s` to recover must all succeed: a put or read that fails or times out
   then is a liveness failure, as in the simulator.

The history is checked with the key-value model (every key starts absent). The run directory
keeps the replicas' data and logs, `history.jsonl` (read by `cellar check`) and
`report.html`. A run interrupted (Ctrl-C, an error) still leaves the history recorded so far,
its open operations of unknown outcome, for `cellar check`.
"""

from __future__ import annotations

import contextlib
import pathlib
import signal
from collections.abc import Iterator
from dataclasses import dataclass

import anyio
import anyio.to_thread

from cellar.kv.store import KvStore
from cellar.live.nemesis import LiveNemesis
from cellar.live.relays import LinkRelays
from cellar.live.workload import Workload
from cellar.local_cluster import Layout, ProcessCluster, settled
from consensus.prng import Prng
from consensus.runtime.client import CellarClient, ClientConfig, Unavailable
from consensus.runtime.tls import IdentityRole
from jepsen.checker import check
from jepsen.formats import save
from jepsen.history import EventType, History, HistoryRecorder
from jepsen.models import KvModel
from jepsen.report import html_report
from jepsen.sim.nemesis import NemesisEvent, draw_schedule
from jepsen.sim.options import SimOptions
from jepsen.verdict import CheckResult

PRINCIPAL = "live"
STATUS_TIMEOUT_S = 1.0


class NeverServed(Exception):
    """The cluster never started or settled (relays, files, replicas, the first election):
    exit 3. An error once it served is no such thing, and is raised as it is."""


@contextlib.contextmanager
def _starting() -> Iterator[None]:
    """What fails in here kept the cluster from ever serving."""
    try:
        yield
    except (RuntimeError, TimeoutError, OSError) as error:
        raise NeverServed(str(error)) from error


@dataclass(frozen=True, slots=True)
class LiveOptions:
    seed: int = 1
    replicas: int = 3
    fault_s: float = 20.0
    heal_s: float = 6.0
    settle_s: float = 3.0  # after the heal: how long the cluster has to recover
    processes: int = 6
    # Processes that share a client, and so its batches: their puts made together go as one
    # command (cellar/kv/put_batches.py), which the checker sees as separate operations
    processes_per_client: int = 2
    keys: int = 3
    read_fraction: float = 0.5
    partition_every_ms: int = 3000
    crash_every_ms: int = 4000
    pause_every_ms: int = 4000
    clog_every_ms: int = 4000
    fault_duration_ms: int = 2000
    clog_ms: int = 100  # how much longer a slowed link takes
    loop: str = "asyncio"  # the replicas' event loop: asyncio, uvloop or trio
    defects: tuple[str, ...] = ()  # deliberate protocol faults in every replica
    check_timeout_s: float = 60.0
    explicit_schedule: tuple[NemesisEvent, ...] | None = None  # instead of the seed's

    def schedule(self) -> tuple[NemesisEvent, ...]:
        """The faults: the explicit schedule, or the seed's drawn as the simulator draws
        them."""
        if self.explicit_schedule is not None:
            return self.explicit_schedule
        options = SimOptions(
            seed=self.seed, replica_count=self.replicas, safety_ms=int(self.fault_s * 1000),
            partition_every_ms=self.partition_every_ms, crash_every_ms=self.crash_every_ms,
            pause_every_ms=self.pause_every_ms, clog_every_ms=self.clog_every_ms,
            fault_duration_ms=self.fault_duration_ms)
        return draw_schedule(options, Prng(self.seed).fork(4))


@dataclass(frozen=True, slots=True)
class LiveResult:
    options: LiveOptions
    schedule: tuple[NemesisEvent, ...]
    history: History
    check: CheckResult
    operations: int
    ok_operations: int
    unsettled: int  # operations invoked after the heal settled that did not succeed
    views: tuple[int | None, int | None]  # the newest view reported once settled, at the end
    exits: tuple[str, ...]  # replicas that stopped without the nemesis (a crash, an assert)
    settled_ok: int  # operations invoked after the heal settled that succeeded

    @property
    def live(self) -> bool:
        """Every replica kept running, and every operation after the heal succeeded: at least
        one did (a cluster that never recovers may leave every client waiting out its
        deadline across the whole window, so that none is invoked in it to fail)."""
        return not self.unsettled and self.settled_ok > 0 and not self.exits

    @property
    def ok(self) -> bool:
        return self.check.is_linearizable and self.live


async def run_live(options: LiveOptions, directory: pathlib.Path) -> LiveResult:
    relays = LinkRelays(options.replicas)
    recorder = HistoryRecorder()
    cluster: ProcessCluster | None = None
    try:
        with _starting():
            await relays.bind()
            layout = Layout(directory, options.replicas, loop=options.loop, machine="kv",
                            snapshot_every_slots=500, peer_routes=dict(relays.routes),
                            defects=options.defects)
            layout.write(admins=[PRINCIPAL])
            # SIGKILL, not SIGTERM, if this process dies first: a paused replica ignores the
            # rest.
            cluster = ProcessCluster(layout, death_signal=signal.SIGKILL)
            cluster.start()
        async with anyio.create_task_group() as group:
            with _starting():
                await group.start(relays.serve, layout.peer_ports)
                await anyio.to_thread.run_sync(cluster.wait_ports)
            phases = await _run_phases(options, layout, cluster, relays, recorder)
            group.cancel_scope.cancel()
    except BaseException:
        _save_partial(recorder, directory)
        raise
    finally:
        if cluster is not None:
            cluster.stop()
        await relays.aclose()
    history = _save_history(recorder, directory)
    result = check(KvModel(), history, timeout_s=options.check_timeout_s)
    (directory / "report.html").write_text(html_report(history, result), encoding="utf-8")
    outcomes = phases.workload.outcomes
    settled_at = outcomes.started_s + options.fault_s + options.settle_s
    unsettled = sum(outcomes.count(kind, invoked_after_s=settled_at)
                    for kind in (EventType.FAIL, EventType.INFO))
    return LiveResult(options, phases.schedule, history, result, len(outcomes.types),
                      outcomes.count(EventType.OK), unsettled, phases.views, phases.exits,
                      outcomes.count(EventType.OK, invoked_after_s=settled_at))


def _save_partial(recorder: HistoryRecorder, directory: pathlib.Path) -> None:
    """What an interrupted run recorded, to `history.jsonl`; a failure to write it is not
    allowed to hide the interruption."""
    with contextlib.suppress(Exception):
        _save_history(recorder, directory)


def _save_history(recorder: HistoryRecorder, directory: pathlib.Path) -> History:
    """The history recorded so far, written to `history.jsonl`."""
    path = directory / "history.jsonl"
    history = recorder.history(source=str(path))
    save(history, path)
    return history


@dataclass(frozen=True, slots=True)
class _Phases:
    schedule: tuple[NemesisEvent, ...]
    workload: Workload
    views: tuple[int | None, int | None]
    exits: tuple[str, ...]


async def _run_phases(options: LiveOptions, layout: Layout, cluster: ProcessCluster,
                      relays: LinkRelays, recorder: HistoryRecorder) -> _Phases:
    sharing = options.processes_per_client
    config = ClientConfig(attempt_timeout_s=1.0, deadline_s=4.0, sessions=sharing)
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(layout.client(
            IdentityRole.ADMIN, PRINCIPAL, config, first=slot % options.replicas))
            for slot in range(-(-options.processes // sharing))]
        client = clients[0]
        with _starting():
            await settled(client, layout.endpoints)
        first = await _newest_view(client, layout.endpoints)
        stores = [KvStore(each) for each in clients]
        workload = Workload([stores[slot // sharing] for slot in range(options.processes)],
                            recorder, keys=options.keys, read_fraction=options.read_fraction,
                            seed=options.seed)
        nemesis = LiveNemesis(cluster, relays, recorder,
                              lambda: _sequencer(client, layout.endpoints),
                              clog_ms=options.clog_ms)
        schedule = options.schedule()
        started = workload.outcomes.started_s = anyio.current_time()
        async with anyio.create_task_group() as group:
            group.start_soon(workload.run, started + options.fault_s + options.heal_s)
            with anyio.move_on_after(options.fault_s):
                await nemesis.run(schedule, started)
                await anyio.sleep_forever()
            nemesis.heal()
        last = await _newest_view(client, layout.endpoints)
        nemesis.note_exits()
    return _Phases(schedule, workload, (_view(first), _view(last)), tuple(nemesis.exits))


def _view(seen: tuple[int, int] | None) -> int | None:
    return None if seen is None else seen[0]


async def _sequencer(client: CellarClient, endpoints: list[str]) -> int | None:
    """The sequencer of the newest view any replica reports (None: none answered)."""
    newest = await _newest_view(client, endpoints)
    return None if newest is None else newest[1]


async def _newest_view(client: CellarClient, endpoints: list[str]) -> tuple[int, int] | None:
    """The newest view any replica reports, and its sequencer (None: none answered)."""
    newest: tuple[int, int] | None = None
    for endpoint in endpoints:
        with anyio.move_on_after(STATUS_TIMEOUT_S):
            try:
                status = await client.status(endpoint)
            except Unavailable:
                continue
            view, sequencer = status.get("view"), status.get("sequencer")
            if isinstance(view, int) and isinstance(sequencer, int) and \
                    (newest is None or view > newest[0]):
                newest = (view, sequencer)
    return newest
