"""`apply(state, command, context) -> Result`: the typed entry point, atomic and deterministic.

Order of work for every command: authorize the principal, move logical time to the command's
(monotonic, and bounded past the latest Tick unless it is one: `logical_time`), run the
handler. A handler either returns a result or raises `Refusal`; on a refusal the journal rolls
back every change (the clock included), so the state is exactly as before and the rejection is
the reply. Any other exception is a bug: it propagates, and the replica stops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from statemachine.authorization import authorize
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
from statemachine.config_commands import apply_config
from statemachine.context import Context
from statemachine.errors import Refusal
from statemachine.group_commands import bind_pod, release_group, submit_group
from statemachine.logical_time import command_time
from statemachine.node_commands import (
    ack_pod_started,
    clear_bad,
    cordon,
    deregister,
    drain,
    heartbeat,
    mark_bad,
    register_node,
    report_health,
    report_pod_exit,
    uncordon,
)
from statemachine.results import Result
from statemachine.state import State
from statemachine.tick import tick

HANDLERS: dict[type[Any], Callable[[State, Any], Result]] = {
    ApplyConfig: apply_config,
    RegisterNode: register_node,
    Heartbeat: heartbeat,
    ReportHealth: report_health,
    AckPodStarted: ack_pod_started,
    ReportPodExit: report_pod_exit,
    MarkBad: mark_bad,
    ClearBad: clear_bad,
    Cordon: cordon,
    Uncordon: uncordon,
    Drain: drain,
    Deregister: deregister,
    SubmitGroup: submit_group,
    BindPod: bind_pod,
    ReleaseGroup: release_group,
    Tick: tick,
}


def apply(state: State, command: Command, context: Context) -> Result:
    assert state.journal.empty, "a previous command left undo records behind"
    handler = HANDLERS[type(command)]
    try:
        authorize(command, context.principal)
        is_tick = isinstance(command, Tick)  # authorized: the system's
        now_ms = command_time(state, context.now_ms, tick=is_tick)
        if now_ms > state.now_ms:
            state.set(state, "now_ms", now_ms)
        if is_tick:
            state.set(state, "tick_ms", context.now_ms)
        result = handler(state, command)
    except Refusal as refusal:
        state.journal.rollback(0)
        return refusal.rejection
    state.journal.forget()
    return result
