"""PySyncObj as a peer of the benchmark: its own virtual environment, a 3-node cluster of
`pysyncobj_node.py` processes on loopback, and an asyncio client for them.

PySyncObj is not a dependency of Cellar: `prepare` creates a virtual environment under the
benchmark's work directory and pip-installs the pinned version there, and each node runs on
that environment's python. The client speaks the small framed protocol of `pysyncobj_node`
(whose codec it imports; that module imports pysyncobj only when run as the node), over one
connection to the leader that many concurrent callers share, pipelined by request id.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import os
import pathlib
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from cellar.bench.peers import pysyncobj_node as wire
from cellar.bench.peers.kv import (
    Durability,
    PeerUnavailable,
    refuse_install_if_asked,
    stop_processes,
)
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
                "it acknowledges, but never fsynced: PySyncObj has no option to sync it")
READY_TIMEOUT_S = 30.0
STOP_GRACE_S = 3.0
CALL_TIMEOUT_S = 10.0
RETRY_PAUSE_S = 0.02
READ_CHUNK_BYTES = 1 << 16


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


# --- the client -------------------------------------------------------------------------------


class NotLeader(Exception):
    """The node is not the leader; `leader` is its raft address when it knows one."""

    def __init__(self, leader: str) -> None:
        super().__init__(f"not the leader (leader: {leader or 'unknown'})")
        self.leader = leader


class _Connection:
    """One TCP connection to a node: requests out (writes coalesced per loop turn), replies
    matched to their callers by request id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.pending: dict[int, asyncio.Future[wire.Reply]] = {}
        self.outgoing: list[bytes] = []
        self.ids = itertools.count(1)
        self.closed = False
        self.reader_task = asyncio.get_running_loop().create_task(self._read_replies(reader))

    @classmethod
    async def open(cls, address: tuple[str, int], timeout_s: float) -> _Connection:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(*address)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer)

    def request(self, op: int, key: bytes,
                value: bytes = b"") -> tuple[int, asyncio.Future[wire.Reply]]:
        """Send (at the end of this loop turn) and return the request id and reply future."""
        if self.closed:
            raise ConnectionError("connection closed")
        request_id = next(self.ids)
        future: asyncio.Future[wire.Reply] = asyncio.get_running_loop().create_future()
        self.pending[request_id] = future
        if not self.outgoing:
            asyncio.get_running_loop().call_soon(self._flush)
        self.outgoing.append(wire.encode_request(wire.Request(op, request_id, key, value)))
        return request_id, future

    def forget(self, request_id: int) -> None:
        """Stop waiting for `request_id` (answered, timed out or cancelled)."""
        self.pending.pop(request_id, None)

    def _flush(self) -> None:
        data, self.outgoing = b"".join(self.outgoing), []
        if not self.closed:
            self.writer.write(data)

    async def _read_replies(self, reader: asyncio.StreamReader) -> None:
        buffer = bytearray()
        error: Exception = ConnectionError("connection closed by the node")
        try:
            while chunk := await reader.read(READ_CHUNK_BYTES):
                buffer += chunk
                for payload in wire.split_frames(buffer):
                    reply = wire.decode_reply(payload)
                    future = self.pending.pop(reply.request_id, None)
                    if future is not None and not future.done():
                        future.set_result(reply)
        except (OSError, wire.FrameError) as failure:
            error = ConnectionError(f"connection failed: {failure}")
        finally:
            self._fail_all(error)

    def _fail_all(self, error: Exception) -> None:
        self.closed = True
        self.writer.close()
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)

    async def aclose(self) -> None:
        self._fail_all(ConnectionError("connection closed by the client"))
        self.reader_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await self.reader_task


@dataclass
class PySyncObjClient:
    """A KvClient: one connection to the leader, shared by every concurrent caller. A call
    that meets a non-leader, a failed command or a lost connection finds the leader again and
    retries (puts overwrite, so a retried put is harmless) until its `timeout_s` runs out."""

    nodes: Mapping[str, tuple[str, int]]  # raft address -> client address, per node
    timeout_s: float = CALL_TIMEOUT_S
    connection: _Connection | None = None
    leader_hint: str = ""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def put(self, key: bytes, value: bytes) -> None:
        await self._call(wire.OP_PUT, key, value)

    async def get(self, key: bytes) -> bytes | None:
        reply = await self._call(wire.OP_GET, key, b"")
        return None if reply.status == wire.STATUS_ABSENT else reply.body

    async def aclose(self) -> None:
        if self.connection is not None:
            await self.connection.aclose()
            self.connection = None

    async def _call(self, op: int, key: bytes, value: bytes) -> wire.Reply:
        async with asyncio.timeout(self.timeout_s):
            while True:
                connection = await self._leader_connection()
                request_id, future = connection.request(op, key, value)
                try:
                    reply = await future
                except ConnectionError:
                    await self._drop(connection)
                    continue
                finally:
                    connection.forget(request_id)
                if reply.status in (wire.STATUS_OK, wire.STATUS_ABSENT):
                    return reply
                if reply.status == wire.STATUS_BAD_REQUEST:
                    raise ValueError(f"pysyncobj node rejected the request: {reply.body!r}")
                if reply.status == wire.STATUS_NOT_LEADER:
                    self.leader_hint = reply.body.decode(errors="replace")
                    await self._drop(connection)
                else:
                    await asyncio.sleep(RETRY_PAUSE_S)

    async def _drop(self, connection: _Connection) -> None:
        async with self.lock:
            if self.connection is connection:
                self.connection = None
                await connection.aclose()

    async def _leader_connection(self) -> _Connection:
        current = self.connection
        if current is not None and not current.closed:
            return current
        async with self.lock:
            while self.connection is None or self.connection.closed:
                self.connection = await self._find_leader()
            return self.connection

    async def _find_leader(self) -> _Connection | None:
        """A connection to the node that says it leads, or None after a short pause."""
        hint = self.nodes.get(self.leader_hint)
        for address in [hint] if hint else list(self.nodes.values()):
            connection, leader = await _ask_status(address)
            if connection is not None:
                return connection
            self.leader_hint = leader
            if leader in self.nodes:
                return None
        self.leader_hint = ""
        await asyncio.sleep(RETRY_PAUSE_S)
        return None


async def _ask_status(address: tuple[str, int]) -> tuple[_Connection | None, str]:
    """(an open connection, "") when the node at `address` leads, else (None, the leader it
    names, "" when none or when it cannot be reached)."""
    try:
        connection = await _Connection.open(address, timeout_s=1.0)
    except (OSError, TimeoutError):
        return None, ""
    try:
        async with asyncio.timeout(1.0):
            status = await connection.request(wire.OP_STATUS, b"")[1]
    except (OSError, TimeoutError):
        await connection.aclose()
        return None, ""
    if status.body[:1] == b"L":
        return connection, ""
    await connection.aclose()
    return None, status.body[1:].decode(errors="replace")


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

    async def connect(self) -> PySyncObjClient:
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
                node_command(python, node, partners, node_dir, conf),
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
        wait_ready(cluster, self.ready_timeout_s)
        return cluster
