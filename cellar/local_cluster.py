"""A cluster of real replica processes on loopback: certificates, configuration files, ports,
and handles to start, stop, `kill -9` and restart each replica.

`cellar dev`, the live tests and the cluster benchmark all build their clusters here, so a
replica started by any of them is the same `cellar replica --config FILE` an operator runs.
"""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio

from cellar.child_processes import (
    bound_to_parent,
    bound_yet,
    child_environment,
    stop_processes,
)
from consensus.runtime.certs import identities, init_directory
from consensus.runtime.client import CellarClient, ClientConfig, Unavailable
from consensus.runtime.connect import connector
from consensus.runtime.tls import Identity, IdentityRole, TlsConfig

HOST = "127.0.0.1"
SETTLE_TIMEOUT_S = 20.0  # a new cluster's first election, at the most
SETTLE_POLL_S = 0.05
TCP_LISTEN = "0A"  # a socket's state in /proc/net/tcp


def free_ports(count: int) -> list[int]:
    """Ports free right now on loopback (the kernel picks them; a race is unlikely there)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class Layout:
    """Where everything of one local cluster lives."""

    directory: pathlib.Path
    replicas: int
    insecure: bool = False
    tick_ms: int = 5
    loop: str = "uvloop"
    machine: str = "gpu"  # or "kv": the plain key-value store
    sync: bool = True  # False only to compare with stores that do not sync
    snapshot_every_slots: int = 20_000
    limits: dict[str, int] = field(default_factory=dict)  # more [limits] entries
    defects: tuple[str, ...] = ()  # deliberate protocol faults, to show the harness finds them
    peer_ports: list[int] = field(default_factory=list)
    # (source, target) -> the port `source` dials to reach `target`, when not target's own
    # peer port: a relay in between (cellar/live/relays.py)
    peer_routes: dict[tuple[int, int], int] = field(default_factory=dict)
    client_ports: list[int] = field(default_factory=list)
    metrics_ports: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Replica processes run from elsewhere: every path handed to them must be absolute.
        self.directory = self.directory.resolve()

    @property
    def certs(self) -> pathlib.Path:
        return self.directory / "certs"

    def config_path(self, replica: int) -> pathlib.Path:
        return self.directory / f"replica-{replica}.toml"

    def data_dir(self, replica: int) -> pathlib.Path:
        return self.directory / f"data-{replica}"

    @property
    def endpoints(self) -> list[str]:
        return [f"{HOST}:{port}" for port in self.client_ports]

    def write(self, *, admins: Sequence[str] = ("admin",), schedulers: Sequence[str] = (),
              nodes: Sequence[str] = ()) -> None:
        """Certificates (unless insecure), ports and one configuration file per replica."""
        self.directory.mkdir(parents=True, exist_ok=True)
        ports = free_ports(3 * self.replicas)
        self.peer_ports = ports[:self.replicas]
        self.client_ports = ports[self.replicas:2 * self.replicas]
        self.metrics_ports = ports[2 * self.replicas:]
        if not self.insecure:
            init_directory(self.certs, identities(replicas=self.replicas, admins=admins,
                                                  schedulers=schedulers, nodes=nodes))
        for replica in range(self.replicas):
            self.config_path(replica).write_text(self._config_text(replica), encoding="utf-8")

    def _config_text(self, replica: int) -> str:
        lines = [f"replica_id = {replica}", f'data_dir = "data-{replica}"',
                 f"tick_ms = {self.tick_ms}", f'loop = "{self.loop}"',
                 f'metrics = "{HOST}:{self.metrics_ports[replica]}"',
                 f"insecure = {'true' if self.insecure else 'false'}",
                 f'machine = "{self.machine}"', f"sync = {'true' if self.sync else 'false'}",
                 "defects = [" + ", ".join(f'"{defect}"' for defect in self.defects) + "]"]
        if not self.insecure:
            stem = f"certs/replica-{replica}"
            lines += ["[tls]", 'ca = "certs/ca.pem"', f'cert = "{stem}.pem"',
                      f'key = "{stem}.key"']
        for peer in range(self.replicas):
            route = self.peer_routes.get((replica, peer), self.peer_ports[peer])
            lines += ["[[peers]]", f"id = {peer}", f'peer = "{HOST}:{route}"',
                      f'client = "{HOST}:{self.client_ports[peer]}"']
        lines += ["[limits]", f"snapshot_every_slots = {self.snapshot_every_slots}"]
        lines += [f"{name} = {value}" for name, value in sorted(self.limits.items())]
        return "\n".join(lines) + "\n"

    def tls_for(self, identity: Identity) -> TlsConfig | None:
        return None if self.insecure else TlsConfig.in_directory(self.certs, identity)

    def client(self, role: IdentityRole, name: str, config: ClientConfig | None = None, *,
               first: int | None = None) -> CellarClient:
        """A client with `role:name`'s certificate (in insecure mode every client is an admin),
        trying replica `first` first (default: one at random)."""
        tls = self.tls_for(Identity(role, name))
        return CellarClient(self.endpoints, connector(tls, insecure=self.insecure),
                            config or ClientConfig(), first=first)


class ReplicaProcess:
    """One `cellar replica` process; its output goes to a log file beside its data."""

    def __init__(self, layout: Layout, replica: int,
                 death_signal: signal.Signals = signal.SIGTERM) -> None:
        self.layout = layout
        self.replica = replica
        self.death_signal = death_signal  # what it gets if this process dies first
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = layout.directory / f"replica-{replica}.log"
        self.started_before = False

    def start(self, *, rejoin: bool = False) -> None:
        """Start the replica: with --init the first time only, as an operator would, so a
        restart whose log is gone is refused rather than begun afresh with no promises; with
        --rejoin when `rejoin` (its data directory was lost: it asks the others first)."""
        command = [sys.executable, "-m", "cellar", "replica", "--config",
                   str(self.layout.config_path(self.replica))]
        if rejoin:
            command.append("--rejoin")
        elif not self.started_before:
            command.append("--init")
        log = self.log_path.open("ab")
        environment = child_environment()
        self.process = subprocess.Popen(bound_to_parent(command, self.death_signal),  # noqa: S603
                                        stdout=log,
                                        stderr=subprocess.STDOUT, env=environment,
                                        cwd=self.layout.directory)
        log.close()
        self.started_before = True

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def bound(self) -> bool:
        """Whether the process has armed its death signal (`child_processes.bound_yet`): only
        then may it be stopped (SIGSTOP) safely."""
        return self.process is None or bound_yet(self.process)

    def kill(self) -> None:
        """`kill -9`: no chance to flush anything."""
        if self.running:
            assert self.process is not None
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL if it does not stop in time; returns the exit status."""
        if self.process is None:
            return None
        if self.running:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode

    def restart(self) -> None:
        self.stop()
        self.start()


class AgentProcess:
    """One `cellar agent` for `node` against this cluster, on a fake GPU backend by default;
    its configuration, state directory and log live under the cluster's directory."""

    def __init__(self, layout: Layout, node: str, *, backend: str = "fake:a100-8",
                 poll_ms: int = 200, heartbeat_ms: int = 500, event_wait_ms: int = 200,
                 grace_ms: int = 1000) -> None:
        self.layout = layout
        self.node = node
        self.directory = layout.directory / f"agent-{node}"
        self.config_path = self.directory / "agent.toml"
        self.log_path = self.directory / "agent.log"
        self.settings: dict[str, str | int] = {
            "backend": backend, "poll_ms": poll_ms, "heartbeat_ms": heartbeat_ms,
            "event_wait_ms": event_wait_ms, "grace_ms": grace_ms}
        self.process: subprocess.Popen[bytes] | None = None

    def write(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        settings = self.settings
        lines = [f'node = "{self.node}"',
                 "store = [" + ", ".join(f'"{endpoint}"' for endpoint in self.layout.endpoints)
                 + "]", 'state_dir = "state"', f'backend = "{settings["backend"]}"',
                 'loop = "asyncio"', f"insecure = {'true' if self.layout.insecure else 'false'}"]
        if not self.layout.insecure:
            stem = self.layout.certs / f"node-{self.node}"
            lines += ["[tls]", f'ca = "{self.layout.certs / "ca.pem"}"', f'cert = "{stem}.pem"',
                      f'key = "{stem}.key"']
        lines += ["[intervals]", f"poll_ms = {settings['poll_ms']}",
                  f"heartbeat_ms = {settings['heartbeat_ms']}",
                  f"event_wait_ms = {settings['event_wait_ms']}",
                  "[jobs]", f"grace_ms = {settings['grace_ms']}", "gpu_release_timeout_ms = 2000"]
        self.config_path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def start(self) -> None:
        self.write()
        command = [sys.executable, "-m", "cellar", "agent", "--config", str(self.config_path)]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(  # noqa: S603
                bound_to_parent(command), stdout=log, stderr=subprocess.STDOUT,
                cwd=self.directory, env=child_environment())

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM (the agent leaves its jobs running), then SIGKILL if it hangs."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


class ProcessCluster:
    def __init__(self, layout: Layout, death_signal: signal.Signals = signal.SIGTERM) -> None:
        self.layout = layout
        self.processes = [ReplicaProcess(layout, replica, death_signal)
                          for replica in range(layout.replicas)]

    def start(self) -> None:
        for process in self.processes:
            process.start()

    def stop(self, grace_s: float = 10.0) -> None:
        """Every replica at once: SIGTERM, then SIGKILL for those not gone within `grace_s`."""
        stop_processes([process.process for process in self.processes
                        if process.process is not None], grace_s)

    def wait_ports(self, timeout_s: float = 20.0) -> None:
        """Until every replica listens on its client port: the replica itself, where Linux's
        /proc tells whose the listener is. Another process that took the port between
        `free_ports` and the replica's start accepts connections too, while the replica exits
        (EXIT_UNAVAILABLE): a connection alone would take that listener for the replica's."""
        deadline = time.monotonic() + timeout_s
        for replica, port in enumerate(self.layout.client_ports):
            process = self.processes[replica]
            while not _listening(process, port):
                if time.monotonic() > deadline or not process.running:
                    log = process.log_path
                    raise RuntimeError(f"replica {replica} did not start; see {log}: "
                                       f"{log.read_text()[-2000:]}") from None
                time.sleep(0.05)


def _listening(process: ReplicaProcess, port: int) -> bool:
    """Whether `process` listens on loopback `port`: one of its descriptors is a socket that
    /proc/net/tcp lists as listening there. Where there is no /proc, whether anything accepts
    connections on the port."""
    try:
        table = pathlib.Path("/proc/net/tcp").read_text(encoding="ascii")
    except OSError:
        try:
            socket.create_connection((HOST, port), timeout=0.5).close()
        except OSError:
            return False
        return True
    listeners = _listening_sockets(table, port)
    return bool(listeners) and process.process is not None and \
        not listeners.isdisjoint(_sockets_of(process.process.pid))


def _listening_sockets(table: str, port: int) -> set[str]:
    """The sockets (as /proc/<pid>/fd links name them) that `table`, /proc/net/tcp's text,
    lists as listening on `port`."""
    listeners = set()
    for line in table.splitlines()[1:]:
        fields = line.split()
        local, state, inode = fields[1], fields[3], fields[9]
        if state == TCP_LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
            listeners.add(f"socket:[{inode}]")
    return listeners


def _sockets_of(pid: int) -> set[str]:
    """What process `pid`'s open descriptors point at; empty once it has exited."""
    try:
        descriptors = list(pathlib.Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return set()
    targets = set()
    for descriptor in descriptors:
        try:
            targets.add(os.readlink(descriptor))
        except OSError:  # closed meanwhile
            continue
    return targets


async def settled(client: CellarClient, endpoints: list[str]) -> None:
    """Until every replica serves one view under one sequencer. A new cluster's view-0
    sequencer waits for an election, as a restarted one does (an empty data directory may be a
    replaced disk's), so a new cluster changes view within a second or so of its start; a
    measurement begun before would measure that election."""
    with anyio.fail_after(SETTLE_TIMEOUT_S):
        while True:
            try:
                statuses = [await client.status(endpoint) for endpoint in endpoints]
            except Unavailable:
                statuses = []
            seen = {(status.get("status"), status.get("view"), status.get("sequencer"))
                    for status in statuses}
            if len(statuses) == len(endpoints) and len(seen) == 1 and \
                    statuses[0].get("status") == "normal":
                return
            await anyio.sleep(SETTLE_POLL_S)
