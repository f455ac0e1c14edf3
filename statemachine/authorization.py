"""Who may issue which command, decided from the principal the runtime vouches for.

- role node: only the node commands, and only for the node named in its certificate;
- role admin: configuration, health marks, cordon, drain, deregister, and gang commands;
- role scheduler: gang commands (submit, bind, release);
- role system: Tick, which nobody else may send.

A violation is a rejection (UNAUTHORIZED), replicated like any other.

Queries (`query_refusal`): a node agent asks only about its own node, its effects (the start
effects carry other nodes' pod commands and environments) and its own node's share of a gang
(`GroupQuery` naming its node: its pods there, the failures of its GPUs; a gang with none of
its pods is answered unknown). A gang's whole status is not its to see: it names the gang's
other nodes, their pods and, in its failure lines, their GPUs' UUIDs, which an agent could
then claim for its own node once theirs is deregistered. Everything else is for
administrators and schedulers.

A node agent's `GroupQuery` naming no node is first narrowed (`narrowed`) to its own node's
share, exactly what it gets by naming its node, rather than refused: agents of the builds
before the share existed ask that way, and their StoreLink retries a refused query for ever,
so during a rolling upgrade (replicas first, then agents) they could no longer learn whether
a pod's gang still stands. What they do with the answer (their pod on this node, bound or
running) reads the same in the share. One naming another node is still refused.
"""

from __future__ import annotations

from consensus.envelope import Principal, Role
from statemachine.commands import (
    AckPodStarted,
    ApplyConfig,
    BindPod,
    ClearBad,
    Command,
    Cordon,
    Deregister,
    Drain,
    Heartbeat,
    MarkBad,
    RegisterNode,
    ReleaseGroup,
    ReportHealth,
    ReportPodExit,
    SubmitGroup,
    Tick,
    Uncordon,
)
from statemachine.errors import Code, refuse
from statemachine.queries import EffectsQuery, GroupQuery, NodeQuery, Query

NODE_COMMANDS = (RegisterNode, Heartbeat, ReportHealth, AckPodStarted, ReportPodExit)
ADMIN_COMMANDS = (ApplyConfig, MarkBad, ClearBad, Cordon, Uncordon, Drain, Deregister)
GANG_COMMANDS = (SubmitGroup, BindPod, ReleaseGroup)


def authorize(command: Command, principal: Principal) -> None:
    """Refuse (UNAUTHORIZED) unless `principal` may issue `command`."""
    role = principal.role
    name = type(command).__name__
    if isinstance(command, Tick):
        allowed = role is Role.SYSTEM
    elif isinstance(command, NODE_COMMANDS):
        allowed = role is Role.NODE and principal.name == command.node
        if role is Role.NODE and not allowed:
            raise refuse(Code.UNAUTHORIZED,
                         f"{principal} may not send {name} for node {command.node!r}")
    elif isinstance(command, ADMIN_COMMANDS):
        allowed = role is Role.ADMIN
    else:
        assert isinstance(command, GANG_COMMANDS)
        allowed = role in (Role.ADMIN, Role.SCHEDULER)
    if not allowed:
        raise refuse(Code.UNAUTHORIZED, f"{principal} may not send {name}")


def narrowed(query: Query, principal: Principal) -> Query:
    """`query` as `principal` may ask it: a node agent's whole-gang query is its own node's
    share (see the module docstring); any other query is itself."""
    if principal.role is Role.NODE and isinstance(query, GroupQuery) and query.node is None:
        return GroupQuery(group=query.group, node=principal.name)
    return query


def query_refusal(query: Query, principal: Principal) -> str | None:
    """None if `principal` may ask `query`, else why not (see the module docstring). A node
    agent's whole-gang query is refused here: the gate asks this of the `narrowed` query."""
    if principal.role is not Role.NODE:
        return None
    asked = f"{type(query).__name__}"
    if isinstance(query, EffectsQuery | NodeQuery | GroupQuery):
        if query.node == principal.name:
            return None
        whole = isinstance(query, GroupQuery) and query.node is None
        asked += " of the whole gang" if whole else f" for {query.node!r}"
    return f"{principal} may ask only about node {principal.name!r}: not {asked}"
