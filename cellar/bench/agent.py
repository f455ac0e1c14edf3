"""`cellar bench agent`: what the node agent costs a node, and how fast a GPU fault reaches the
scheduler.

Both figures come from a live 3-replica cluster on loopback (mutual TLS, synced storage) and the
fake GPU backend (8 A100s per node), since no GPU is needed to measure the agent's own work:

1. CPU and memory: a `cellar agent` process at its default intervals (heartbeat 2 s, health
   poll 5 s, event waits of 1 s) runs for `--seconds` after a warm-up; its CPU time (user +
   system, from /proc) over the wall time, and its resident memory, per GPU. NVML's own calls
   are not in it (the fake answers from memory): on a GPU node add their cost.
2. Fault to refusal: an agent in this process, at its default intervals; a fault is injected
   into its fake backend and the store is read (linearizably, every 10 ms) until the GPU no
   longer takes placements. Three kinds: an XID 79 event and an uncorrectable ECC error (the
   driver's XID 48 comes with it) are pushed and reported at once; NVLink replay errors are
   only polled, so they wait up to one poll period (5 s) before the report.

Medians with min and max over `--runs` measurements; `--json` prints one object.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import tempfile
import time
from collections.abc import Callable
from typing import Any

import anyio

from agent.config import AgentConfig
from agent.daemon import Agent
from agent.fake_backend import FakeGpuBackend
from cellar.bench.stats import Spread, process_cpu_s
from cellar.dev.spec import dev_spec
from cellar.exception_groups import run_unwrapped
from cellar.local_cluster import AgentProcess, Layout, ProcessCluster
from consensus.runtime.arguments import at_least, existing_directory, seconds
from consensus.runtime.client import ClientConfig
from consensus.runtime.config_fields import Address
from consensus.runtime.tls import IdentityRole
from statemachine.errors import Rejection
from statemachine.store import GpuStore

NODES = ("node-00", "node-01", "node-02", "node-03")  # the process; one in-process per fault
GPUS_PER_NODE = 8
WARMUP_S = 3.0
PROBE_S = 0.01
CLIENT = ClientConfig(attempt_timeout_s=1.0, deadline_s=20.0, sessions=8)
Injection = Callable[[FakeGpuBackend, str], None]
FAULTS: dict[str, Injection] = {
    "xid_79_event": lambda gpus, uuid: gpus.inject_xid(uuid, 79),
    "ecc_dbe_with_xid_48": lambda gpus, uuid: gpus.raise_ecc(uuid, uncorrected=1),
    "nvlink_replay_polled": lambda gpus, uuid: gpus.nvlink_errors(uuid, 0, replay=1),
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=seconds(), default=30.0,
                        help="how long the agent's CPU is measured (default 30)")
    parser.add_argument("--runs", type=at_least(1), default=4,
                        help="faults injected per kind (default 4, at most 8)")
    parser.add_argument("--dir", type=existing_directory, default=None,
                        help="where the cluster's files go (default: a temporary directory)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.runs > GPUS_PER_NODE:
        raise SystemExit(f"cellar bench agent: --runs must be at most {GPUS_PER_NODE}, not "
                         f"{args.runs}")
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="cellar-bench-agent-") as root:
        layout = Layout(pathlib.Path(root) / "cluster", 3)
        layout.write(admins=["bench"], nodes=NODES)
        cluster = ProcessCluster(layout)
        cluster.start()
        try:
            cluster.wait_ports()
            figures = run_unwrapped(_measure, args, cluster)
        finally:
            cluster.stop()
    print(json.dumps(figures, indent=2) if args.json else "\n".join(table(figures)))
    return 0


async def _measure(args: argparse.Namespace, cluster: ProcessCluster) -> dict[str, Any]:
    async with cluster.layout.client(IdentityRole.ADMIN, "bench", CLIENT) as admin_client:
        admin = GpuStore(admin_client)
        if isinstance(await admin.apply_config(0, dev_spec(4)), Rejection):
            raise SystemExit("the cluster refused the configuration")
        usage = await _agent_usage(cluster, args.seconds)
        faults = await _fault_latencies(cluster, admin, args.runs)
    return {"gpus_per_node": GPUS_PER_NODE, **usage, **faults}


async def _agent_usage(cluster: ProcessCluster, seconds: float) -> dict[str, Any]:
    agent = AgentProcess(cluster.layout, NODES[0], poll_ms=5000, heartbeat_ms=2000,
                         event_wait_ms=1000)
    agent.start()
    try:
        assert agent.process is not None
        await anyio.sleep(WARMUP_S)
        cpu_before, wall_before = process_cpu_s(agent.process.pid), time.monotonic()
        await anyio.sleep(seconds)
        cpu_s = process_cpu_s(agent.process.pid) - cpu_before
        wall_s = time.monotonic() - wall_before
        rss_mib = _rss_kib(agent.process.pid) / 1024
    finally:
        agent.stop()
    return {"agent_cpu_pct": 100 * cpu_s / wall_s,
            "agent_cpu_pct_per_gpu": 100 * cpu_s / wall_s / GPUS_PER_NODE,
            "agent_rss_mib": rss_mib, "agent_rss_mib_per_gpu": rss_mib / GPUS_PER_NODE,
            "measured_s": wall_s}


async def _fault_latencies(cluster: ProcessCluster, admin: GpuStore,
                           runs: int) -> dict[str, Any]:
    figures = {}
    for node, (kind, inject) in zip(NODES[1:], FAULTS.items(), strict=True):
        samples = await _faults_on(cluster, admin, node, inject, runs)
        figures[f"fault_to_refusal_ms_{kind}"] = Spread.of(samples).as_dict()
    return figures


async def _faults_on(cluster: ProcessCluster, admin: GpuStore, node: str, inject: Injection,
                     runs: int) -> list[float]:
    """Run an agent for `node` in this process and fail `runs` of its GPUs one by one."""
    gpus = FakeGpuBackend.from_profile("a100-8", seed=len(node) + int(node[-1]))
    config = AgentConfig(node=node, store=(Address("unused", 1),), insecure=False, tls=None,
                         state_dir=cluster.layout.directory / f"bench-agent-{node}")
    samples = []
    async with cluster.layout.client(IdentityRole.NODE, node, CLIENT) as client, \
            anyio.create_task_group() as tasks:
        await tasks.start(Agent(config, gpus, GpuStore(client)).run)
        phases = random.Random(node)
        for uuid in list(gpus.uuids())[:runs]:
            await anyio.sleep(0.2 + phases.random() * 5.0)  # anywhere in the poll period
            started = time.monotonic()
            inject(gpus, uuid)
            await _until_refused(admin, node, uuid)
            samples.append((time.monotonic() - started) * 1000)
        tasks.cancel_scope.cancel()
    return samples


async def _until_refused(admin: GpuStore, node: str, uuid: str) -> None:
    with anyio.fail_after(30):
        while True:
            answer: Any = await admin.node(node)
            if not isinstance(answer, Rejection) and any(
                    gpu["uuid"] == uuid and not gpu["placeable"] for gpu in answer["gpus"]):
                return
            await anyio.sleep(PROBE_S)


def _rss_kib(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text(encoding="ascii").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def table(figures: dict[str, Any]) -> list[str]:
    lines = [f"cellar bench agent: one node of {figures['gpus_per_node']} GPUs (fake backend), "
             "3 replicas on loopback with TLS and synced storage",
             f"  agent CPU at default intervals  {figures['agent_cpu_pct']:.2f} % of a core "
             f"({figures['agent_cpu_pct_per_gpu']:.3f} % per GPU) over "
             f"{figures['measured_s']:.0f} s",
             f"  agent resident memory           {figures['agent_rss_mib']:.1f} MiB "
             f"({figures['agent_rss_mib_per_gpu']:.1f} MiB per GPU)"]
    for kind in FAULTS:
        spread = figures[f"fault_to_refusal_ms_{kind}"]
        lines.append(f"  fault to refusal, {kind:<22}{spread['median']:.0f} ms "
                     f"(min {spread['min']:.0f}, max {spread['max']:.0f}, {spread['runs']} runs)")
    return lines
