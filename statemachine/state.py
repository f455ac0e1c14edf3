"""The replicated state: one object holding everything `apply` reads and changes.

Primary state, which snapshots store: the configuration (spec and version), logical time and
the latest Tick's stamp that bounds it, the nodes, the gangs (with their placements), the VC
bindings, the outbox, the submission counter, two epochs that tell the scheduler what changed
since a gang's last attempt, and the queue key where the next Tick's scheduling pass starts
(the last one ran out of budget there).
Derived state, rebuilt from the primary on restore and recomputed by the invariant checker:
the per-GPU holder arrays and counters (`cells`), the free lists (`buddy`, from the bindings),
the pending queue and the UUID registry.

Every change goes through the journal, so `apply` can undo a refused command completely.
"""

from __future__ import annotations

from statemachine.buddy import Buddy
from statemachine.cells import Cells
from statemachine.errors import Code, refuse
from statemachine.groups import Group
from statemachine.journal import Journal
from statemachine.limits import OPPORTUNISTIC_PRIORITY
from statemachine.nodes import NodeRecord
from statemachine.outbox import Outbox
from statemachine.pending import PendingQueue, QueueKey
from statemachine.results import GroupPhase
from statemachine.spec import ClusterSpec, PolicySpec
from statemachine.topology import Topology


class Configured:
    """The parts that exist once a configuration is applied; replaced as one by ApplyConfig."""

    __slots__ = ("buddy", "cells", "failure_policy", "spec", "topology", "version")

    def __init__(self, spec: ClusterSpec, version: int, topology: Topology,
                 journal: Journal) -> None:
        self.spec = spec
        self.version = version
        self.topology = topology
        self.failure_policy = {vc.name: vc.on_failure for vc in spec.virtual_clusters}
        self.cells = Cells(topology, journal)
        self.buddy = Buddy(topology, journal, self.cells.bound)


class State:
    __slots__ = ("capacity_epoch", "change_epoch", "config", "groups", "journal", "next_submit",
                 "nodes", "now_ms", "outbox", "queue", "rules_version", "schedule_resume",
                 "tick_ms", "uuid_owner")

    def __init__(self) -> None:
        self.journal = Journal()
        self.config: Configured | None = None
        self.now_ms = 0  # logical time (statemachine/logical_time.py)
        self.tick_ms: int | None = None  # the latest Tick's stamp; None before the first
        self.nodes: dict[str, NodeRecord] = {}
        self.uuid_owner: dict[str, str] = {}  # GPU uuid -> node id, for registered nodes
        self.groups: dict[str, Group] = {}
        self.queue = PendingQueue(self.journal)
        self.outbox = Outbox(self.journal)
        self.next_submit = 1
        self.capacity_epoch = 0  # bumped whenever GPUs may have become available
        self.change_epoch = 0  # bumped on capacity changes and on new holders (new victims)
        self.schedule_resume: QueueKey | None = None  # where the next Tick's pass starts
        self.rules_version = 0  # the rules commands are applied by (statemachine/rules.py)

    # Lookups that refuse with the right code.

    def configured(self) -> Configured:
        if self.config is None:
            raise refuse(Code.NO_CONFIG, "no cluster configuration has been applied yet")
        return self.config

    @property
    def policy(self) -> PolicySpec:
        return self.config.spec.policy if self.config is not None else PolicySpec()

    def node(self, node: str) -> NodeRecord:
        record = self.nodes.get(node)
        if record is None:
            raise refuse(Code.UNKNOWN_NODE, f"node {node!r} is not in the configuration")
        return record

    def group(self, group: str) -> Group:
        found = self.groups.get(group)
        if found is None:
            raise refuse(Code.UNKNOWN_GROUP, f"no gang {group!r}")
        return found

    # Journaled writes.

    def set(self, target: object, name: str, value: object) -> None:
        self.journal.set_attr(target, name, value)

    def bump_capacity(self) -> None:
        self.set(self, "capacity_epoch", self.capacity_epoch + 1)
        self.bump_change()

    def bump_change(self) -> None:
        self.set(self, "change_epoch", self.change_epoch + 1)

    def enqueue(self, group: Group) -> None:
        assert group.phase is GroupPhase.PENDING
        self.queue.add(group.queue_key())

    def dequeue(self, group: Group) -> None:
        self.queue.remove(group.queue_key())


def leaf_usable(config: Configured, nodes: dict[str, NodeRecord], leaf: int) -> bool:
    topology = config.topology
    record = nodes[topology.node_ids[topology.node_of[leaf]]]
    return record.registered and record.placeable(topology.gpu_index(leaf))


def refresh_usable(state: State, record: NodeRecord) -> None:
    """Make `cells.usable` match the node's state for each of its GPUs; a GPU becoming usable
    is new capacity for the queue."""
    config = state.configured()
    topology = config.topology
    leaves = topology.leaves(topology.node_cell[record.index])
    now_usable = [leaf for leaf in leaves if leaf_usable(config, state.nodes, leaf)]
    now_unusable = [leaf for leaf in leaves if not leaf_usable(config, state.nodes, leaf)]
    gained = any(not config.cells.usable[leaf] for leaf in now_usable)
    config.cells.set_usable(now_usable, True)
    config.cells.set_usable(now_unusable, False)
    if gained:
        state.bump_capacity()


def derive(config: Configured, nodes: dict[str, NodeRecord], groups: dict[str, Group],
           bindings: list[tuple[int, str]], journal: Journal) -> tuple[Cells, Buddy]:
    """Fresh cells and free lists computed from the primary state alone: node health, gang
    placements and VC bindings. Restore uses them; the invariant checker compares them with
    the maintained ones."""
    cells = Cells(config.topology, journal)
    buddy = Buddy(config.topology, journal, cells.bound)
    for cell, vc in bindings:
        buddy._bind(cell, vc)
    usable = [leaf for chain in config.topology.chains for leaf in chain.cells_at(1)
              if leaf_usable(config, nodes, leaf)]
    if usable:
        cells._set_usable(usable, True)
    for name in sorted(groups):
        group = groups[name]
        leaves = group.leaves()
        if not leaves:
            continue
        if group.phase is GroupPhase.ALLOCATED:
            cells._hold(leaves, name, group.effective_priority)
        else:
            assert group.phase is GroupPhase.PREEMPTING
            assert group.effective_priority > OPPORTUNISTIC_PRIORITY
            cells._reserve(leaves, name, group.effective_priority)
    return cells, buddy


def bindings_of(buddy: Buddy) -> list[tuple[int, str]]:
    return [(cell, vc) for cell, vc in enumerate(buddy.bound_vc) if vc]


def derive_queue(groups: dict[str, Group]) -> list[tuple[int, int, str]]:
    return sorted(group.queue_key() for group in groups.values()
                  if group.phase is GroupPhase.PENDING)


def derive_uuid_owner(nodes: dict[str, NodeRecord]) -> dict[str, str]:
    """The registered nodes' GPUs (a deregistered node keeps its boards' health, not them)."""
    return {gpu.uuid: node for node, record in sorted(nodes.items()) if record.registered
            for gpu in record.gpus}
