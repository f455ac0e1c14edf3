"""A key-value `ReplicaNode` on a fresh data directory of a written `Layout`, not started:
for tests of how a node wires its parts, and of what its status and metrics page say."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from cellar.kv.machine import KvMachine
from cellar.local_cluster import Layout
from consensus.runtime.data_identity import DataIdentity
from consensus.runtime.node import ReplicaNode
from consensus.runtime.node_config import load_node_config
from consensus.runtime.storage import DurableLog


@contextlib.contextmanager
def kv_replica_node(layout: Layout, replica_id: int) -> Iterator[ReplicaNode]:
    """Replica `replica_id` of `layout` (written, machine "kv"), its log open while in use."""
    config = load_node_config(layout.config_path(replica_id))
    with DurableLog.open(config.data_dir, create=True, synced=False,
                         identity=DataIdentity(replica_id, layout.replicas, "kv")) as log:
        yield ReplicaNode(config, log, KvMachine())
