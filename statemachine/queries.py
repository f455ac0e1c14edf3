"""Read-only queries: what clients, agents and operators ask without going through the log.

- `GroupQuery`: one gang's status with its "why pending", plus doomed cells of its tenant;
  its failure lines up to a bound on bytes, and `failures_omitted`, how many more there are.
  With `node`, that node's share of it, what its agent may see (`authorization`): only its
  pods and the failures of its GPUs, no victims and no doomed cells; a gang with no pod placed
  on the node is answered as unknown (UNKNOWN_GROUP), as one that is gone. A node agent's
  query without `node` is run as one naming its own node (`authorization.narrowed`);
- `GroupsQuery`: gangs by id, optionally one tenant or one phase, paged;
- `NodesQuery` / `NodeQuery`: nodes paged, or one node with every GPU's inventory, health and
  holder;
- `ClusterQuery`: per chain and level the free cells and healthy obtainable ones; per tenant
  and chain the quota, bound, unbound and doomed cells and the GPUs in use, those entries up
  to a bound on bytes, and `vcs_omitted`, how many more there are;
- `EffectsQuery`: outbox effects after an index, optionally for one node, with a limit (and
  a bound on bytes, so the answer fits a frame); `more` says the page was cut short;
- `StatsQuery`: counts for dashboards and the demo.

Answers are plain values (maps, lists, strings, integers) built in sorted order, so they can be
packed canonically. Queries never change state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from consensus.codec import pack
from statemachine.effect_codec import EFFECT_BYTES_MAX
from statemachine.errors import Code, Rejection
from statemachine.groups import Group
from statemachine.limits import (
    CLUSTER_VCS_BYTES_MAX,
    EFFECTS_ANSWER_BYTES_MAX,
    GROUP_FAILURES_BYTES_MAX,
    GROUPS_ANSWER_BYTES_MAX,
)
from statemachine.nodes import NodeRecord
from statemachine.result_codec import effect_to_plain, status_to_plain
from statemachine.results import GroupPhase
from statemachine.state import State
from statemachine.views import doomed, group_status, healthy_obtainable, within_bytes

assert EFFECT_BYTES_MAX < EFFECTS_ANSWER_BYTES_MAX, "an answer of one effect always fits"


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupQuery:
    group: str
    node: str | None = None  # None: the whole gang; a node id: that node's share of it


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupsQuery:
    vc: str  # "" for every tenant
    phase: str  # "" for every phase
    after: str  # page after this group id ("" from the start)
    limit: int


@dataclass(frozen=True, slots=True, kw_only=True)
class NodesQuery:
    after: str
    limit: int


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeQuery:
    node: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterQuery:
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class EffectsQuery:
    after: int
    node: str | None  # None for every effect; "" for gang events only
    limit: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StatsQuery:
    pass


Query = GroupQuery | GroupsQuery | NodesQuery | NodeQuery | ClusterQuery | EffectsQuery | StatsQuery


def answer(state: State, query: Query) -> dict[str, Any] | Rejection:
    if isinstance(query, GroupQuery):
        group = state.groups.get(query.group)
        if query.node is not None:
            return _node_share(state, group, query.group, query.node)
        if group is None:
            return Rejection(code=Code.UNKNOWN_GROUP, message=f"no gang {query.group!r}")
        plain = status_to_plain(group_status(state, group))
        plain["downgraded"] = group.downgraded
        plain["doomed"] = _doomed_of(state, group.vc)
        return {"type": "group", **plain}
    if isinstance(query, GroupsQuery):
        groups, more = _groups(state, query)
        return {"type": "groups", "groups": groups, "more": more}
    if isinstance(query, NodesQuery):
        names = [name for name in sorted(state.nodes) if name > query.after][:query.limit]
        return {"type": "nodes", "nodes": [_node_summary(state, state.nodes[name])
                                           for name in names]}
    if isinstance(query, NodeQuery):
        record = state.nodes.get(query.node)
        if record is None:
            return Rejection(code=Code.UNKNOWN_NODE, message=f"no node {query.node!r}")
        return {"type": "node", **_node_summary(state, record), "gpus": _gpus(state, record),
                "links": [{"a": link.a, "b": link.b, "level": link.level,
                           "nvlinks": link.nvlinks} for link in record.links]}
    if isinstance(query, ClusterQuery):
        return {"type": "cluster", **_cluster(state)}
    if isinstance(query, EffectsQuery):
        return {"type": "effects", **_effects(state, query)}
    assert isinstance(query, StatsQuery)
    return {"type": "stats", **stats(state)}


def _node_share(state: State, group: Group | None, group_id: str,
                node: str) -> dict[str, Any] | Rejection:
    """A gang as the agent of `node` sees it: its pods on the node and its failures on the
    node's GPUs; the other nodes' pods (their nodes, pod uids, exits), their GPUs' UUIDs in
    the failure lines, the victims and the tenant's doomed cells are not the agent's to see.
    A gang with no pod placed on the node is answered as one that does not exist."""
    record = state.nodes.get(node)
    if record is None:
        return Rejection(code=Code.UNKNOWN_NODE, message=f"no node {node!r}")
    if group is None or group.phase is GroupPhase.PENDING or not any(
            pod.node == record.index for pod in group.pods):
        return Rejection(code=Code.UNKNOWN_GROUP,
                         message=f"no gang {group_id!r} on node {node!r}")
    plain = status_to_plain(group_status(state, group))
    uuids = {gpu.uuid for gpu in record.gpus} if record.registered else set()
    failures = tuple(sorted(f"{uuid}: {why}" for uuid, why in group.failures if uuid in uuids))
    lines, omitted = within_bytes(failures, GROUP_FAILURES_BYTES_MAX)
    plain.update(pods=[pod for pod in plain["pods"] if pod["node"] == node],
                 victims=[], failures=list(lines), failures_omitted=omitted,
                 downgraded=group.downgraded, doomed={})
    return {"type": "group", **plain}


def _effects(state: State, query: EffectsQuery) -> dict[str, Any]:
    """A page of effects; `more` when effects after it were left for the next page, so an
    answer without it holds every effect of the node below `next_index`."""
    outbox = state.outbox
    effects = outbox.since(query.after, query.node, query.limit, EFFECTS_ANSWER_BYTES_MAX)
    return {"first_index": outbox.first_index, "next_index": outbox.next_index,
            "more": bool(effects) and outbox.newest_index(query.node) > effects[-1].index,
            "effects": [effect_to_plain(effect) for effect in effects]}


def stats(state: State) -> dict[str, Any]:
    phases = {phase.value: 0 for phase in GroupPhase}
    evicting = downgraded = 0
    for group in state.groups.values():
        phases[group.phase.value] += 1
        evicting += bool(group.evicting)
        downgraded += bool(group.downgraded)
    config = state.config
    gpus = free = held = 0
    if config is not None:
        for chain in config.topology.chains:
            tops = chain.cells_at(chain.top_level)
            gpus += chain.size[chain.top_level] * len(tops)
            free += sum(config.cells.free[cell] for cell in tops)
        held = sum(1 for name in config.cells.holder if name)
    return {"now_ms": state.now_ms, "version": config.version if config else 0,
            "nodes": len(state.nodes), "gpus": gpus, "free_gpus": free, "held_gpus": held,
            "groups": phases, "evicting": evicting, "downgraded": downgraded,
            "queue": len(state.queue), "outbox_next": state.outbox.next_index}


def _groups(state: State, query: GroupsQuery) -> tuple[list[dict[str, Any]], bool]:
    """A page of gangs, at most `limit` of them and, past the first, about
    GROUPS_ANSWER_BYTES_MAX bytes; and whether the page may have been cut short (`more`)."""
    found: list[dict[str, Any]] = []
    size_bytes = 0
    for name in sorted(state.groups):
        if name <= query.after:
            continue
        group = state.groups[name]
        if (query.vc and group.vc != query.vc) or (query.phase and
                                                   group.phase.value != query.phase):
            continue
        if len(found) >= query.limit:
            return found, True
        size_bytes += 160 + sum(len(text.encode()) for text in (
            name, group.vc, group.why_pending, group.evicting))  # bytes: names need not be ASCII
        if found and size_bytes > GROUPS_ANSWER_BYTES_MAX:
            return found, True
        found.append({"group": name, "vc": group.vc, "phase": group.phase.value,
                      "priority": group.priority,
                      "effective_priority": group.effective_priority, "gpus": group.gpus,
                      "evicting": group.evicting, "why_pending": group.why_pending})
    return found, False


def _node_summary(state: State, record: NodeRecord) -> dict[str, Any]:
    free = 0
    if state.config is not None:
        free = state.config.cells.free[state.config.topology.node_cell[record.index]]
    return {"node": record.node, "liveness": record.liveness.value,
            "incarnation": record.incarnation, "lease_expires_ms": record.lease_expires_ms,
            "cordoned": record.cordoned, "draining": record.draining,
            "admin_bad": record.admin_bad,
            "gpus_registered": len(record.gpus) if record.registered else 0, "free_gpus": free}


def _gpus(state: State, record: NodeRecord) -> list[dict[str, Any]]:
    if state.config is None:
        return []
    topology, cells = state.config.topology, state.config.cells
    found = []
    for gpu, health in zip(record.gpus, record.health, strict=True):
        leaf = topology.leaf_of(record.index, gpu.index)
        found.append({"index": gpu.index, "uuid": gpu.uuid, "pci_bus_id": gpu.pci_bus_id,
                      "model": gpu.model, "memory_mib": gpu.memory_mib,
                      "numa_node": gpu.numa_node, "mig_enabled": gpu.mig_enabled,
                      "status": health.status.value, "reason": health.reason,
                      "since_ms": health.since_ms, "failed": health.failed,
                      "admin_bad": health.admin_bad, "placeable": cells.usable[leaf],
                      "holder": cells.holder[leaf], "reserver": cells.reserver[leaf],
                      "address": topology.address[leaf]})
    return found


def _doomed_of(state: State, vc: str) -> dict[str, dict[str, int]]:
    config = state.config
    if config is None or vc not in config.buddy.unbound:
        return {}
    found = {}
    for chain in config.topology.chains:
        per_level = doomed(config, vc, chain.index)
        named = {chain.type_names[level]: count for level, count in enumerate(per_level)
                 if count}
        if named:
            found[chain.name] = named
    return found


def _cluster(state: State) -> dict[str, Any]:
    """Every chain's levels; per tenant (by name) and chain (in order) with a quota, an entry,
    the first of them up to CLUSTER_VCS_BYTES_MAX packed (always one), and `vcs_omitted`, how
    many entries after those were left out (a tenant's name is repeated in each of its
    entries, so they could outgrow a client's frame)."""
    config = state.config
    if config is None:
        return {"version": 0, "chains": [], "vcs": [], "vcs_omitted": 0}
    topology, buddy, cells = config.topology, config.buddy, config.cells
    chains = []
    for chain in topology.chains:
        healthy = healthy_obtainable(config, chain.index)
        tops = chain.cells_at(chain.top_level)
        chains.append({
            "chain": chain.name, "gpu_model": chain.gpu_model,
            "gpus": chain.size[chain.top_level] * len(tops),
            "free_gpus": sum(cells.free[cell] for cell in tops),
            "bad_gpus": sum(cells.bad[cell] for cell in tops),
            "levels": [{"level": level, "cell_type": chain.type_names[level],
                        "free_cells": len(buddy.free_lists[chain.index][level]),
                        "healthy_obtainable": healthy[level],
                        "unbound_guaranteed": buddy.demand[chain.index][level]}
                       for level in range(chain.top_level, 0, -1)]})
    vcs: list[dict[str, Any]] = []
    size_bytes = omitted = 0
    for vc in topology.vc_names:
        for chain in topology.chains:
            quota = topology.quota[vc][chain.index]
            if not any(quota):
                continue
            if omitted:
                omitted += 1
                continue
            bound = buddy.bound_cells[vc][chain.index]
            dooms = doomed(config, vc, chain.index)
            entry: dict[str, Any] = {"vc": vc, "chain": chain.name, "levels": [
                {"cell_type": chain.type_names[level], "quota": quota[level],
                 "bound": sum(1 for cell in bound if topology.level[cell] == level),
                 "unbound": buddy.unbound[vc][chain.index][level], "doomed": dooms[level]}
                for level in range(chain.top_level, 0, -1) if quota[level]],
                "used_gpus": sum(topology.size_of(cell) - cells.free[cell] - cells.bad[cell]
                                 for cell in bound)}
            size_bytes += len(pack(entry))
            if vcs and size_bytes > CLUSTER_VCS_BYTES_MAX:
                omitted = 1
                continue
            vcs.append(entry)
    return {"version": config.version, "chains": chains, "vcs": vcs, "vcs_omitted": omitted}
