"""What the peer benchmark needs of each system under test: a cluster it can start and stop,
and clients that put and read keys.

Every system (Cellar at 3 and 5 replicas, etcd, PySyncObj) is driven through these two small
protocols by the same load generator (`cellar.bench.peers.load`), on the same asyncio loop in
the same process, so the figures differ only by what sits behind `put` and `get`.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass
from typing import Protocol

NO_INSTALL_ENV = "CELLAR_BENCH_NO_INSTALL"


def refuse_install_if_asked(what: str) -> None:
    """Raise `PeerUnavailable` when installs are off (`CELLAR_BENCH_NO_INSTALL=1`, which
    `cellar bench peers --no-install` and the tests set): `prepare` calls it before installing."""
    if os.environ.get(NO_INSTALL_ENV) == "1":
        raise PeerUnavailable(f"{what} is not installed, and installs are off (--no-install "
                              f"or {NO_INSTALL_ENV}=1)")


class PeerUnavailable(Exception):
    """The system cannot run on this machine (not installable, not startable): the reason says
    why, and the suite reports the peer as skipped rather than failing."""


@dataclass(frozen=True, slots=True)
class Durability:
    """How a system persists a write before acknowledging it, stated plainly for the report."""

    synced: bool  # True: the log is fsynced (or fdatasynced) before the write is acknowledged
    description: str  # e.g. "WAL fdatasync'd by each member before it acknowledges"


class KvClient(Protocol):
    """One client connection (or session pool) to a running cluster."""

    async def put(self, key: bytes, value: bytes) -> None:
        """Write `value` under `key`; return once the write is committed by the cluster."""
        ...

    async def get(self, key: bytes) -> bytes | None:
        """A linearizable read of `key` (None when absent)."""
        ...

    async def aclose(self) -> None: ...


class KvCluster(Protocol):
    """A running cluster of one system on loopback, with its files under one directory."""

    name: str  # "etcd", "pysyncobj", "cellar-3", ...
    replicas: int
    durability: Durability

    async def connect(self, callers: int = 1) -> KvClient:
        """A new client, which `callers` callers will share at once; it may take a moment for
        the cluster to elect a leader."""
        ...

    def stop(self) -> None:
        """Stop every process of the cluster (idempotent); files stay for inspection."""
        ...


class KvSystem(Protocol):
    """A system that can be set up (installed if needed) and started fresh."""

    name: str

    def prepare(self, work_dir: pathlib.Path) -> None:
        """Install what the system needs (a package, a virtual environment), once per machine;
        raise `PeerUnavailable` with the reason when that cannot be done."""
        ...

    def start(self, directory: pathlib.Path) -> KvCluster:
        """Start a fresh cluster with its data under `directory` (an empty folder)."""
        ...
