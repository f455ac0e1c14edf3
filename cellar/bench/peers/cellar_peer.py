"""Cellar as a system under test: `cellar replica` processes with the key-value machine.

The cluster is the same one `cellar dev` and `cellar bench cluster` start (mutual TLS, uvloop,
its own data directories), with `machine = "kv"`. `synced=True` is Cellar as it ships: every
record fdatasync'd before a replica acknowledges it. `synced=False` skips those syncs, to
compare on equal terms with a store that does not sync its journal. `prefer_sequencer=True`
sends every client's commands to the sequencer's replica (fewest hops on a LAN) instead of
spreading the clients over the replicas. `puts_max=1` sends each put as a command of its own,
as Cellar did before its client coalesced its callers' puts (cellar/kv/put_batches.py).
"""

from __future__ import annotations

import pathlib
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from cellar.bench.peers.kv import Durability
from cellar.kv.codec import PUTS_MAX
from cellar.kv.store import KvStore
from cellar.local_cluster import Layout, ProcessCluster, settled
from consensus.runtime.client import CellarClient, ClientConfig
from consensus.runtime.tls import IdentityRole

BENCH_PRINCIPAL = "bench"
# A client gets a session for each caller that shares it (a command beyond its sessions waits
# its turn in the client's pool, about 6.5 µs of the client's CPU a command: at 8192 callers
# over 4 clients of 1024 sessions every command waited, and puts/s fell a quarter), and at
# least the default's.
SESSIONS_PER_CLIENT_MIN = ClientConfig().sessions


class CellarKvClient:
    """A KvClient over one CellarClient (its own connections and session pool)."""

    def __init__(self, client: CellarClient, puts_max: int = PUTS_MAX) -> None:
        self._client = client
        self._store = KvStore(client, puts_max=puts_max)

    # The store's own coroutines, handed back: no adapter coroutine per call.
    def put(self, key: bytes, value: bytes) -> Coroutine[Any, Any, None]:
        return self._store.put(key, value)

    def get(self, key: bytes) -> Coroutine[Any, Any, bytes | None]:
        return self._store.get(key)

    async def aclose(self) -> None:
        await self._client.__aexit__(None, None, None)


@dataclass
class CellarCluster:
    layout: Layout
    processes: ProcessCluster
    name: str
    replicas: int
    durability: Durability
    prefer_sequencer: bool = False
    puts_max: int = PUTS_MAX
    connections: int = 0

    async def connect(self, callers: int = 1) -> CellarKvClient:
        config = ClientConfig(sessions=max(callers, SESSIONS_PER_CLIENT_MIN),
                              attempt_timeout_s=2.0, deadline_s=20.0,
                              prefer_sequencer=self.prefer_sequencer)
        # Connections go to the replicas in turn, so every replica leads its share (unless
        # they prefer the sequencer: then they start there once it is found).
        client = self.layout.client(IdentityRole.ADMIN, BENCH_PRINCIPAL, config,
                                    first=self.connections % self.replicas)
        self.connections += 1
        await client.__aenter__()
        if self.connections == 1:
            try:
                await settled(client, self.layout.endpoints)
            except BaseException:
                await client.__aexit__(None, None, None)
                raise
        return CellarKvClient(client, self.puts_max)

    def stop(self) -> None:
        self.processes.stop()


@dataclass(frozen=True, slots=True)
class CellarSystem:
    replicas: int = 3
    synced: bool = True
    prefer_sequencer: bool = False  # every client sends to the sequencer's replica
    tls: bool = True  # mutual TLS, as Cellar ships; False: plain TCP, as the peers here run
    puts_max: int = PUTS_MAX  # puts in one command (1: no batches)

    @property
    def name(self) -> str:
        return (f"cellar-{self.replicas}" + ("" if self.tls else "-plain")
                + ("" if self.synced else "-nosync") + ("-seq" if self.prefer_sequencer else "")
                + ("-unbatched" if self.puts_max == 1 else ""))

    def prepare(self, work_dir: pathlib.Path) -> None:
        del work_dir  # nothing to install: Cellar is this package

    def start(self, directory: pathlib.Path) -> CellarCluster:
        layout = Layout(directory, self.replicas, machine="kv", sync=self.synced,
                        insecure=not self.tls)
        layout.write(admins=[BENCH_PRINCIPAL])
        processes = ProcessCluster(layout)
        processes.start()
        try:
            processes.wait_ports()
        except BaseException:
            processes.stop()
            raise
        return CellarCluster(layout, processes, self.name, self.replicas, self.durability,
                             self.prefer_sequencer, self.puts_max)

    @property
    def durability(self) -> Durability:
        routed = "; clients send to the sequencer's replica" if self.prefer_sequencer else ""
        transport = ("; mutual TLS between replicas and clients" if self.tls else
                     "; plain TCP, no TLS (insecure mode), as etcd and PySyncObj run here")
        if self.puts_max == 1:
            transport += "; each put a command of its own (no batches of callers' puts)"
        if self.synced:
            return Durability(True, "every record fdatasync'd by each replica before it "
                                    "acknowledges (group commit batches them)" + routed + transport)
        return Durability(False, "records written to the page cache, not fsynced (sync = false)"
                                 + routed + transport)
