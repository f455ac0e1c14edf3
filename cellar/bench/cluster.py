"""`cellar bench cluster`: the replicated store end to end, on loopback, as clients see it.

Each run starts a fresh cluster of `--replicas` `cellar replica` processes (mutual TLS, every
record synced to disk before it is acknowledged, uvloop), configures it with the dev cluster's
racks of 8-GPU nodes, and drives it through the client library from this process, every worker
under its own node-agent identity as a real agent would be:

1. low load: one worker, one heartbeat at a time: p50 and p99 latency;
2. high load: `--clients` workers heartbeating back to back: commits per second, p50, p99;
3. reads: the same workers reading their node's record linearizably: reads per second;
4. failover: the workers keep heartbeating, the sequencer is killed with SIGKILL, and the time
   to the first commit of a heartbeat sent after the kill is measured.

Every figure is the median of `--runs` runs (with minimum and maximum). The client side shares
one Python process, so at high load it can be the bottleneck: the figures are what one
client process gets. `--json` prints one object with `commits_per_s`, `p50_ms`, `p99_ms`
(high load), `low_p50_ms`, `low_p99_ms`, `reads_per_s`, `failover_ms` and the spreads.

It always runs with TLS: its workers need node identities, and without TLS every client is the
one configured identity (an administrator), from which the state machine refuses node commands.
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

import anyio

from cellar.bench.stats import Spread, percentile
from cellar.dev.spec import dev_spec, inventory, node_names
from cellar.exception_groups import run_unwrapped
from cellar.gc_tuning import quiet_garbage_collector
from cellar.local_cluster import Layout, ProcessCluster
from cellar.malloc_tuning import keep_freed_memory
from consensus.runtime.arguments import at_least, existing_directory, seconds
from consensus.runtime.client import CellarClient, ClientConfig, ClientError
from consensus.runtime.tls import IdentityRole
from statemachine.errors import Rejection
from statemachine.results import NodeRegistered
from statemachine.store import GpuStore

ADMIN = "bench"
CLIENT = ClientConfig(attempt_timeout_s=1.0, deadline_s=10.0, sessions=4)
FAILOVER_WAIT_S = 15.0
KILL_AFTER_S = 0.5  # failover callers run this long before the kill
WARMUP_S = 0.5


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=3, choices=(3, 5, 7))
    parser.add_argument("--runs", type=at_least(1), default=3,
                        help="fresh clusters (default 3)")
    parser.add_argument("--clients", type=at_least(1), default=64,
                        help="concurrent workers at high load (default 64)")
    parser.add_argument("--seconds", type=seconds(), default=5.0,
                        help="length of the high-load and read phases (default 5)")
    parser.add_argument("--low-seconds", type=seconds(), default=3.0,
                        help="length of the low-load phase (default 3)")
    parser.add_argument("--no-failover", action="store_true", help="skip the kill phase")
    parser.add_argument("--dir", type=existing_directory, default=None,
                        help="where the clusters' files go (default: a temporary directory)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


@dataclass(frozen=True, slots=True)
class Worker:
    store: GpuStore
    node: str
    incarnation: int


@dataclass
class Phase:
    """What the workers of one phase completed, and how long each call took."""

    seconds: float
    latencies_s: list[float] = field(default_factory=list)
    failures: int = 0

    @property
    def per_s(self) -> float:
        return len(self.latencies_s) / self.seconds

    def quantile_ms(self, fraction: float) -> float:
        return percentile(sorted(self.latencies_s), fraction) * 1000 if self.latencies_s \
            else float("nan")


Operation = Callable[[Worker], Awaitable[object]]


def run(args: argparse.Namespace) -> int:
    samples: dict[str, list[float]] = {}
    keep_freed_memory()  # this process is the load generator
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="cellar-bench-") as root:
        for number in range(args.runs):
            with quiet_garbage_collector():  # this process is the load generator
                figures = one_run(args, pathlib.Path(root) / f"run-{number}")
            for name, value in figures.items():
                samples.setdefault(name, []).append(value)
    spreads = {name: Spread.of(values) for name, values in samples.items()}
    if args.json:
        print(json.dumps(as_json(args, spreads), indent=2))
    else:
        for line in table(args, spreads):
            print(line)
    return 0


def one_run(args: argparse.Namespace, directory: pathlib.Path) -> dict[str, float]:
    layout = Layout(directory, args.replicas)
    layout.write(admins=[ADMIN], nodes=node_names(_node_count(args.clients)))
    cluster = ProcessCluster(layout)
    cluster.start()
    try:
        cluster.wait_ports()
        return run_unwrapped(_measure, args, cluster)
    finally:
        cluster.stop()


def _node_count(clients: int) -> int:
    return max(4, -(-clients // 4) * 4)  # whole racks of 4


async def _measure(args: argparse.Namespace, cluster: ProcessCluster) -> dict[str, float]:
    layout = cluster.layout
    async with AsyncExitStack() as stack:
        admin = await stack.enter_async_context(
            layout.client(IdentityRole.ADMIN, ADMIN, CLIENT))
        await _configure(admin, _node_count(args.clients))
        workers = [await _worker(stack, layout, name)
                   for name in node_names(_node_count(args.clients))[:args.clients]]
        await _load(workers, WARMUP_S, _heartbeat)
        low = await _load(workers[:1], args.low_seconds, _heartbeat)
        high = await _load(workers, args.seconds, _heartbeat)
        reads = await _load(workers, args.seconds, _read)
        figures = {"commits_per_s": high.per_s, "p50_ms": high.quantile_ms(0.5),
                   "p99_ms": high.quantile_ms(0.99), "low_p50_ms": low.quantile_ms(0.5),
                   "low_p99_ms": low.quantile_ms(0.99), "reads_per_s": reads.per_s,
                   "read_p50_ms": reads.quantile_ms(0.5)}
        if not args.no_failover:
            figures["failover_ms"] = await _failover(cluster, admin, workers)
        return figures


async def _configure(admin: CellarClient, nodes: int) -> None:
    applied = await GpuStore(admin).apply_config(0, dev_spec(nodes))
    if isinstance(applied, Rejection):
        raise SystemExit(f"the cluster refused the configuration: {applied}")


async def _worker(stack: AsyncExitStack, layout: Layout, node: str) -> Worker:
    client = await stack.enter_async_context(layout.client(IdentityRole.NODE, node, CLIENT))
    store = GpuStore(client)
    registered = await store.register_node(node, f"bench-{node}", inventory(node))
    if not isinstance(registered, NodeRegistered):
        raise SystemExit(f"registering {node} failed: {registered}")
    return Worker(store, node, registered.incarnation)


async def _heartbeat(worker: Worker) -> object:
    return await worker.store.heartbeat(worker.node, worker.incarnation)


async def _read(worker: Worker) -> object:
    return await worker.store.node(worker.node)


async def _load(workers: list[Worker], seconds: float, operation: Operation) -> Phase:
    phase = Phase(seconds)
    deadline = time.monotonic() + seconds

    async def loop(worker: Worker) -> None:
        while (started := time.monotonic()) < deadline:
            try:
                result = await operation(worker)
            except ClientError:
                phase.failures += 1
                continue
            if isinstance(result, Rejection):
                raise SystemExit(f"{worker.node}: the store refused a benchmark call: {result}")
            phase.latencies_s.append(time.monotonic() - started)

    async with anyio.create_task_group() as tasks:
        for worker in workers:
            tasks.start_soon(loop, worker)
    return phase


async def _failover(cluster: ProcessCluster, admin: CellarClient,
                    workers: list[Worker]) -> float:
    calls = [functools.partial(_heartbeat, worker) for worker in workers]
    try:
        return await failover_ms(cluster, admin, calls)
    except FailoverError as error:
        raise SystemExit(str(error)) from None


class FailoverError(Exception):
    """The sequencer could not be found, or no call committed in time after killing it."""


async def failover_ms(cluster: ProcessCluster, admin: CellarClient,
                      calls: Sequence[Callable[[], Awaitable[object]]], *,
                      on_kill: Callable[[int, float], None] | None = None) -> float:
    """Milliseconds from SIGKILL of the sequencer to the first commit of a call sent after it.

    Each of `calls` is one caller, repeated back to back until a call that started after the
    kill commits; `ClientError`s (the cluster electing a new sequencer) are retried. `on_kill`
    hears which replica was killed and when (`time.monotonic()`), at once. Shared by
    `cellar bench cluster`, `cellar bench peers` and `cellar dev --kill-sequencer`."""
    sequencer = await sequencer_replica(cluster, admin)
    killed_at: list[float] = []
    first_commit: list[float] = []

    async def loop(call: Callable[[], Awaitable[object]]) -> None:
        while not first_commit:
            started = time.monotonic()
            try:
                await call()
            except ClientError:
                continue
            if killed_at and started >= killed_at[0]:
                first_commit.append(time.monotonic())

    with anyio.move_on_after(FAILOVER_WAIT_S + 1.0):
        async with anyio.create_task_group() as tasks:
            for call in calls:
                tasks.start_soon(loop, call)
            await anyio.sleep(KILL_AFTER_S)
            cluster.processes[sequencer].kill()
            killed_at.append(time.monotonic())
            if on_kill is not None:
                on_kill(sequencer, killed_at[0])
    if not first_commit:
        raise FailoverError(f"no commit within {FAILOVER_WAIT_S:.0f} s of killing the "
                            "sequencer")
    return (first_commit[0] - killed_at[0]) * 1000


async def sequencer_replica(cluster: ProcessCluster, admin: CellarClient) -> int:
    """The id of the replica that says it is the sequencer (asked through `status`)."""
    for endpoint in cluster.layout.endpoints:
        status = await admin.status(endpoint)
        if status.get("is_sequencer"):
            return int(str(status["replica_id"]))
    raise FailoverError("no replica says it is the sequencer")


def as_json(args: argparse.Namespace, spreads: dict[str, Spread]) -> dict[str, object]:
    result: dict[str, object] = {"replicas": args.replicas, "clients": args.clients,
                                 "runs": args.runs, "tls": True}
    result.update({name: spread.median for name, spread in spreads.items()})
    result["spread"] = {name: spread.as_dict() for name, spread in spreads.items()}
    return result


def table(args: argparse.Namespace, spreads: dict[str, Spread]) -> list[str]:
    rows = [(f"commits/s, {args.clients} clients", spreads["commits_per_s"].describe("/s", 0)),
            ("latency p50, high load", spreads["p50_ms"].describe("ms", 1)),
            ("latency p99, high load", spreads["p99_ms"].describe("ms", 1)),
            ("latency p50, one client", spreads["low_p50_ms"].describe("ms", 1)),
            ("latency p99, one client", spreads["low_p99_ms"].describe("ms", 1)),
            (f"linearizable reads/s, {args.clients} clients",
             spreads["reads_per_s"].describe("/s", 0))]
    if "failover_ms" in spreads:
        rows.append(("sequencer kill to new commit", spreads["failover_ms"].describe("ms", 0)))
    width = max(len(label) for label, _ in rows) + 2
    return [f"cellar bench cluster: {args.replicas} replicas on loopback, mutual TLS, synced "
            f"storage; medians of {args.runs} runs", *(f"  {label:<{width}}{text}"
                                                      for label, text in rows)]
