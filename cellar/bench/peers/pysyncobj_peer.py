"""PySyncObj as a peer of the benchmark: its own virtual environment, a 3-node cluster of
`pysyncobj_node.py` processes on loopback (its client is `pysyncobj_client`).

PySyncObj is not a dependency of Cellar: `prepare` creates a virtual environment under the
benchmark's work directory and pip-installs the pinned version there, and each node runs on
that environment's python.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import pathlib
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cellar.bench.peers import pysyncobj_node as wire
from cellar.bench.peers.kv import (
    Durability,
    PeerUnavailable,
    refuse_install_if_asked,
)
from cellar.bench.peers.pysyncobj_client import CALL_TIMEOUT_S, PySyncObjClient
from cellar.child_processes import bound_to_parent, stop_processes
from cellar.local_cluster import HOST, free_ports

PYSYNCOBJ_VERSION = "0.3.17"
# Where the benchmark keeps the peers' installations (one per machine), unless told otherwise.
DEFAULT_WORK_DIR = pathlib.Path(
    os.environ.get("CELLAR_BENCH_PEERS_DIR", pathlib.Path.home() / ".cache/cellar/bench-peers"))
VENV_NAME = "pysyncobj-venv"
NODE_SCRIPT = pathlib.Path(wire.__file__).resolve()
REPLICAS = 3
DURABILITY = Durability(
    synced=False,
    description="journal (a memory-mapped file) written by the leader and each follower before "
                "it acknowledges, but never fsynced: PySyncObj has no option to sync it; plain "
                "TCP, nothing encrypted (no password set)")
READY_TIMEOUT_S = 30.0
STOP_GRACE_S = 3.0


def venv_python(work_dir: pathlib.Path) -> pathlib.Path:
    return work_dir / VENV_NAME / "bin" / "python"


def venv_works(python: pathlib.Path) -> bool:
    """Whether `python` exists and imports the pinned pysyncobj."""
    if not python.exists():
        return False
    check = ("import importlib.metadata as m, pysyncobj; "
             f"assert m.version('pysyncobj') == {PYSYNCOBJ_VERSION!r}")
    result = subprocess.run([str(python), "-c", check], capture_output=True,  # noqa: S603
                            timeout=60, check=False)
    return result.returncode == 0


def _run_or_raise(command: Sequence[str], what: str) -> None:
    try:
        result = subprocess.run(list(command), capture_output=True,  # noqa: S603
                                text=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise PeerUnavailable(f"pysyncobj: {what} failed: {error}") from error
    if result.returncode != 0:
        tail = (result.stdout + result.stderr)[-2000:]
        raise PeerUnavailable(f"pysyncobj: {what} failed (exit {result.returncode}):\n{tail}")


def create_venv(work_dir: pathlib.Path) -> pathlib.Path:
    """The python of a virtual environment with the pinned pysyncobj (reused when it works)."""
    python = venv_python(work_dir)
    if venv_works(python):
        return python
    refuse_install_if_asked(f"pysyncobj {PYSYNCOBJ_VERSION} (in {work_dir / VENV_NAME})")
    work_dir.mkdir(parents=True, exist_ok=True)
    _run_or_raise([sys.executable, "-m", "venv", "--clear", str(work_dir / VENV_NAME)],
                  "creating its virtual environment")
    requirement = f"pysyncobj=={PYSYNCOBJ_VERSION}"
    _run_or_raise([str(python), "-m", "pip", "install", "--disable-pip-version-check",
                   requirement], f"pip install {requirement}")
    if not venv_works(python):
        raise PeerUnavailable(f"pysyncobj: {python} cannot import {requirement}")
    return python


# --- the cluster --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeAddresses:
    raft: str  # host:port, how the nodes name each other (and the leader)
    client: tuple[str, int]


@dataclass
class PySyncObjCluster:
    """A running 3-node PySyncObj cluster (a KvCluster)."""

    nodes: tuple[NodeAddresses, ...]
    processes: list[subprocess.Popen[bytes]]
    logs: list[pathlib.Path]
    name: str = "pysyncobj"
    replicas: int = REPLICAS
    durability: Durability = DURABILITY
    call_timeout_s: float = CALL_TIMEOUT_S

    def client_addresses(self) -> dict[str, tuple[str, int]]:
        return {node.raft: node.client for node in self.nodes}

    async def connect(self, callers: int = 1) -> PySyncObjClient:
        del callers  # any number of calls share one connection, pipelined by request id
        return PySyncObjClient(self.client_addresses(), timeout_s=self.call_timeout_s)

    def stop(self) -> None:
        """SIGTERM every node, then SIGKILL those still running after `STOP_GRACE_S`."""
        stop_processes(self.processes, STOP_GRACE_S)

    def log_tails(self, chars: int = 1500) -> str:
        parts = []
        for log in self.logs:
            text = log.read_text(errors="replace") if log.exists() else "(no log)"
            parts.append(f"--- {log} ---\n{text[-chars:]}")
        return "\n".join(parts)


def node_command(python: pathlib.Path, node: NodeAddresses, partners: Sequence[str],
                 directory: pathlib.Path, conf: Mapping[str, object]) -> list[str]:
    command = [str(python), str(NODE_SCRIPT), "--self", node.raft,
               "--partners", ",".join(partners), "--client-port", str(node.client[1]),
               "--journal", str(directory / "journal.bin"), "--dump", str(directory / "dump.bin")]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value!r}"]
    return command


def launch(python: pathlib.Path, directory: pathlib.Path,
           conf: Mapping[str, object]) -> PySyncObjCluster:
    ports = free_ports(2 * REPLICAS)
    nodes = tuple(NodeAddresses(f"{HOST}:{ports[i]}", (HOST, ports[REPLICAS + i]))
                  for i in range(REPLICAS))
    processes: list[subprocess.Popen[bytes]] = []
    logs: list[pathlib.Path] = []
    for index, node in enumerate(nodes):
        node_dir = directory / f"node-{index}"
        node_dir.mkdir(parents=True, exist_ok=True)
        partners = [other.raft for other in nodes if other is not node]
        logs.append(node_dir / "node.log")
        with logs[-1].open("wb") as log:
            processes.append(subprocess.Popen(  # noqa: S603
                bound_to_parent(node_command(python, node, partners, node_dir, conf)),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT))
    return PySyncObjCluster(nodes, processes, logs)


async def _first_put(cluster: PySyncObjCluster, timeout_s: float) -> None:
    client = await cluster.connect()
    client.timeout_s = timeout_s
    try:
        await client.put(b"cellar-bench-ready", b"1")
    finally:
        await client.aclose()


def wait_ready(cluster: PySyncObjCluster, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Return once a leader exists and a put commits; else stop the cluster and raise."""
    failure = ""
    try:  # on a thread of its own: the caller may be inside a running event loop
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, _first_put(cluster, timeout_s)).result()
    except (TimeoutError, OSError, ValueError) as error:
        failure = f"no put committed within {timeout_s:.0f} s ({error!r})"
    exited = [p.args for p in cluster.processes if p.poll() is not None]
    if exited and not failure:
        failure = f"node processes exited: {exited}"
    if failure:
        cluster.stop()
        raise PeerUnavailable(f"pysyncobj cluster did not start: {failure}\n"
                              f"{cluster.log_tails()}")


class PySyncObjSystem:
    """The KvSystem for PySyncObj; `conf` overrides SyncObjConf defaults on every node."""

    def __init__(self, conf: Mapping[str, object] | None = None,
                 ready_timeout_s: float = READY_TIMEOUT_S, name: str = "pysyncobj") -> None:
        self.name = name
        self.version = PYSYNCOBJ_VERSION
        self.conf = dict(conf or {})
        self.ready_timeout_s = ready_timeout_s
        self.python: pathlib.Path | None = None

    def prepare(self, work_dir: pathlib.Path = DEFAULT_WORK_DIR) -> None:
        self.python = create_venv(work_dir)

    def start(self, directory: pathlib.Path) -> PySyncObjCluster:
        if self.python is None:
            raise PeerUnavailable("pysyncobj: prepare() was not called")
        cluster = launch(self.python, directory, self.conf)
        cluster.name = self.name
        try:
            wait_ready(cluster, self.ready_timeout_s)
        except BaseException:  # any failure (or Ctrl-C / SIGTERM) while waiting: as etcd's
            cluster.stop()
            raise
        return cluster
