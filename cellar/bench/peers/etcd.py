"""etcd as a peer of `cellar bench peers`: installing it and running a 3-member loopback
cluster (its client is `etcd_client`).

- `EtcdSystem.prepare` finds the `etcd` binary, or installs Debian's `etcd-server` (as root,
  with service starts kept from leaving a packaged etcd on port 2379), and needs `grpcio`.
- `EtcdCluster` runs three members with etcd's default durability: each fdatasyncs its WAL
  before acknowledging, batching the entries that arrived since the last sync.
- `EtcdClient` (in `etcd_client`) speaks the KV service over `grpc.aio`: round robin over the
  members, as the Go client does (followers forward puts to the leader), or, for
  `EtcdSystem(leader_only=True)` ("etcd-leader"), to the leader alone, found by asking each
  member's Maintenance status.

grpc.aio under uvloop: grpcio 1.85 works on a uvloop loop (puts, gets, channel_ready, close;
`asyncio.Runner(loop_factory=uvloop.new_event_loop)` on 3.11), and was as fast or a little
faster than on the default loop in our runs, so the load generator may keep uvloop. Measured on
2 shared cores, the client process was not the bottleneck: two client processes did no better
than one, and 4 channels per client no better than 1.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from cellar.bench.peers import etcd_wire
from cellar.bench.peers.etcd_client import PUT, RANGE, STATUS, EtcdClient, grpc_module
from cellar.bench.peers.kv import (
    Durability,
    PeerUnavailable,
    refuse_install_if_asked,
)
from cellar.child_processes import bound_to_parent, stop_processes
from cellar.local_cluster import HOST, free_ports

ETCD_PATHS = ("/usr/bin/etcd", "/usr/local/bin/etcd")
PACKAGED_CLIENT_PORT = 2379  # where a packaged etcd service would listen
QUOTA_BACKEND_BYTES = 8 * 1024**3  # etcd's suggested maximum; the benchmark stays far below
MEMBERS = 3
DURABILITY = Durability(
    synced=True,
    description="each member fdatasyncs its WAL before acknowledging (entries that arrive "
                "during a sync are batched into the next one); etcd's default settings; plain HTTP "
                "between members and clients, no TLS")


def find_etcd() -> pathlib.Path | None:
    """The etcd binary on PATH or in the usual places (None when there is none)."""
    found = shutil.which("etcd")
    candidates = ([found] if found else []) + list(ETCD_PATHS)
    return next((pathlib.Path(path) for path in candidates if os.access(path, os.X_OK)), None)


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((HOST, port)) == 0


def _run(command: Sequence[str], timeout_s: float = 600.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(list(command), capture_output=True, text=True, env=env,  # noqa: S603
                          timeout=timeout_s, check=False)


def _stop_packaged_service() -> None:
    """Stop and disable the service the package may have started (systemd or SysV)."""
    if pathlib.Path("/run/systemd/system").is_dir() and shutil.which("systemctl"):
        _run(["systemctl", "disable", "--now", "etcd.service"], timeout_s=60.0)
    elif pathlib.Path("/etc/init.d/etcd").exists() and shutil.which("service"):
        _run(["service", "etcd", "stop"], timeout_s=60.0)


def install_etcd_server() -> None:
    """apt-get install etcd-server (updating the package lists if the first try fails)."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise PeerUnavailable("etcd is not installed, and installing it needs root and apt-get")
    bound_before = _port_open(PACKAGED_CLIENT_PORT)
    install = ["apt-get", "install", "-y", "-q", "etcd-server"]
    result = _run(install)
    if result.returncode != 0:
        _run(["apt-get", "update", "-q"])
        result = _run(install)
    if result.returncode != 0:
        raise PeerUnavailable(f"apt-get install etcd-server failed: {result.stderr[-2000:]}")
    _stop_packaged_service()
    if not bound_before and _port_open(PACKAGED_CLIENT_PORT):
        raise PeerUnavailable(f"the packaged etcd service still listens on port "
                              f"{PACKAGED_CLIENT_PORT} after install; stop it first")


def etcd_version(binary: pathlib.Path) -> str:
    """'3.4.23' from `etcd --version` (its first line, whole, when the format is unexpected)."""
    output = _run([str(binary), "--version"], timeout_s=30.0).stdout.strip()
    first = output.splitlines()[0] if output else "unknown"
    return first.split(":", 1)[1].strip() if first.startswith("etcd Version:") else first


@dataclass
class EtcdSystem:
    """etcd, installed from Debian's package when absent; the version is kept for the report."""

    name: str = "etcd"
    binary: pathlib.Path | None = None
    version: str | None = None
    startup_timeout_s: float = 30.0
    leader_only: bool = False  # clients talk to the leader alone, not to every member

    def prepare(self, work_dir: pathlib.Path) -> None:
        grpc_module()
        binary = find_etcd()
        if binary is None:
            refuse_install_if_asked("etcd (Debian's etcd-server)")
            install_etcd_server()
            binary = find_etcd()
        if binary is None:
            raise PeerUnavailable("etcd-server installed, but no etcd binary was found")
        self.binary, self.version = binary, etcd_version(binary)

    def start(self, directory: pathlib.Path) -> EtcdCluster:
        binary = self.binary or find_etcd()
        if binary is None:
            raise PeerUnavailable("etcd is not installed (run prepare first)")
        durability = DURABILITY if not self.leader_only else Durability(
            True, DURABILITY.description + "; clients talk to the leader alone")
        cluster = EtcdCluster(members=plan_members(directory.resolve()), binary=binary,
                              name=self.name, leader_only=self.leader_only,
                              durability=durability)
        try:  # a member that fails to launch stops those launched before it
            cluster.launch()
            cluster.wait_for_leader(self.startup_timeout_s)
        except BaseException:
            cluster.stop()
            raise
        return cluster


@dataclass(frozen=True, slots=True)
class Member:
    """One etcd member's name, ports and files."""

    name: str
    client_port: int
    peer_port: int
    data_dir: pathlib.Path
    log_path: pathlib.Path

    @property
    def endpoint(self) -> str:
        return f"{HOST}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{HOST}:{self.peer_port}"


def plan_members(directory: pathlib.Path, count: int = MEMBERS) -> list[Member]:
    ports = free_ports(2 * count)
    return [Member(name=f"etcd-{index}", client_port=ports[index], peer_port=ports[count + index],
                   data_dir=directory / f"etcd-{index}.data",
                   log_path=directory / f"etcd-{index}.log") for index in range(count)]


def member_command(binary: pathlib.Path, member: Member, members: Sequence[Member],
                   token: str) -> list[str]:
    """The command line of one member of a new static cluster (durability left at defaults)."""
    client_url = f"http://{member.endpoint}"
    initial = ",".join(f"{other.name}={other.peer_url}" for other in members)
    return [str(binary), "--name", member.name, "--data-dir", str(member.data_dir),
            "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
            "--listen-peer-urls", member.peer_url,
            "--initial-advertise-peer-urls", member.peer_url,
            "--initial-cluster", initial, "--initial-cluster-state", "new",
            "--initial-cluster-token", token,
            "--quota-backend-bytes", str(QUOTA_BACKEND_BYTES),
            "--logger", "zap", "--log-level", "warn", "--log-outputs", "stderr"]


@dataclass
class EtcdCluster:
    """Three etcd processes on loopback; `stop` terminates them, files stay."""

    members: list[Member]
    binary: pathlib.Path
    name: str = "etcd"
    replicas: int = MEMBERS
    durability: Durability = DURABILITY
    grace_s: float = 2.0  # a stopping leader tries to hand over leadership for ~7 s; no need
    call_timeout_s: float = 10.0
    leader_only: bool = False
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _logs: list[IO[bytes]] = field(default_factory=list)

    def launch(self) -> None:
        token = f"cellar-bench-{uuid.uuid4().hex[:12]}"
        for member in self.members:
            member.data_dir.parent.mkdir(parents=True, exist_ok=True)
            log = member.log_path.open("ab")
            self._logs.append(log)
            self.processes.append(subprocess.Popen(  # noqa: S603
                bound_to_parent(member_command(self.binary, member, self.members, token)),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True))

    def log_tails(self, size_bytes: int = 1500) -> str:
        tails = []
        for member in self.members:
            text = member.log_path.read_bytes()[-size_bytes:] if member.log_path.exists() else b""
            tails.append(f"--- {member.log_path}\n{text.decode(errors='replace')}")
        return "\n".join(tails)

    def wait_for_leader(self, timeout_s: float) -> None:
        """Return once a put commits and every member serves a linearizable read."""
        grpc = grpc_module()
        deadline = time.monotonic() + timeout_s
        for index, member in enumerate(self.members):
            request = (etcd_wire.put_request(b"cellar-bench/ready", b"1") if index == 0
                       else etcd_wire.range_request(b"cellar-bench/ready"))
            with grpc.insecure_channel(member.endpoint) as channel:
                call = channel.unary_unary(PUT if index == 0 else RANGE)
                self._retry_until(deadline, lambda call=call, request=request:
                                  call(request, timeout=1.0))

    def _retry_until(self, deadline: float, attempt: Any) -> None:
        grpc = grpc_module()
        while True:
            pairs = zip(self.members, self.processes, strict=True)
            exited = [member.name for member, process in pairs if process.poll() is not None]
            if exited:
                raise RuntimeError(f"etcd members exited: {exited}\n{self.log_tails()}")
            try:
                attempt()
                return
            except grpc.RpcError as error:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"etcd cluster has no leader after the startup timeout "
                                       f"({error})\n{self.log_tails()}") from error
                time.sleep(0.1)

    async def connect(self, callers: int = 1) -> EtcdClient:
        del callers  # any number of calls share one client's channels
        endpoints = [member.endpoint for member in self.members]
        if self.leader_only:
            endpoints = [self.leader_endpoint()]
        client = EtcdClient(endpoints, self.call_timeout_s)
        await client.ready(self.call_timeout_s)
        return client

    def leader_endpoint(self) -> str:
        """The endpoint of the member that says it is the leader (each names the leader and
        itself in its Maintenance status)."""
        grpc = grpc_module()
        for member in self.members:
            with grpc.insecure_channel(member.endpoint) as channel:
                status = channel.unary_unary(STATUS)(b"", timeout=self.call_timeout_s)
            member_id, leader_id = etcd_wire.member_and_leader(status)
            if member_id != 0 and member_id == leader_id:
                return member.endpoint
        raise RuntimeError("no etcd member says it is the leader")

    def stop(self) -> None:
        stop_processes(self.processes, self.grace_s)
        for log in self._logs:
            log.close()
        self._logs.clear()
