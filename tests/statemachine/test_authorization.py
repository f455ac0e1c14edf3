"""Who may send what: node agents only their own node's commands, admins the configuration and
node administration, schedulers the gang commands, and only the runtime (role system) Ticks.
Every violation is a replicated rejection, UNAUTHORIZED, with the state unchanged."""

from __future__ import annotations

import pytest

from consensus.codec import pack
from consensus.envelope import Principal, Role
from consensus.errors import InvalidMessage, QueryRefused
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
    Tick,
    Uncordon,
)
from statemachine.errors import Code, Rejection
from statemachine.machine import Machine
from statemachine.query_codec import encode_query
from tests.statemachine.builders import Driver, gang, inventory, rack_spec

NODE_N0 = Principal(Role.NODE, "n0")
NODE_N1 = Principal(Role.NODE, "n1")
ADMIN = Principal(Role.ADMIN, "ops")
SCHEDULER = Principal(Role.SCHEDULER, "sched")
SYSTEM = Principal(Role.SYSTEM, "cellar")

COMMANDS: list[tuple[Command, set[Principal]]] = [
    (ApplyConfig(expected_version=1, spec=rack_spec()), {ADMIN}),
    (RegisterNode(node="n0", boot_id="b", gpus=inventory("n0")), {NODE_N0}),
    (Heartbeat(node="n0", incarnation=1), {NODE_N0}),
    (ReportHealth(node="n0", incarnation=1, reports=()), {NODE_N0}),
    (AckPodStarted(node="n0", incarnation=1, group="g", pod_uid="p", gpu_uuids=()), {NODE_N0}),
    (ReportPodExit(node="n0", incarnation=1, group="g", pod_uid="p", exit_code=0), {NODE_N0}),
    (MarkBad(node="n0", gpu="", reason="r"), {ADMIN}),
    (ClearBad(node="n0", gpu=""), {ADMIN}),
    (Cordon(node="n0"), {ADMIN}),
    (Uncordon(node="n0"), {ADMIN}),
    (Drain(node="n0"), {ADMIN}),
    (Deregister(node="n0", force=True), {ADMIN}),
    (gang("g2", "a", 0, (1, 1)), {ADMIN, SCHEDULER}),
    (BindPod(group="g", member=0, pod_uid="p"), {ADMIN, SCHEDULER}),
    (ReleaseGroup(group="g", reason=""), {ADMIN, SCHEDULER}),
    (Tick(), {SYSTEM}),
]
PRINCIPALS = [NODE_N0, NODE_N1, ADMIN, SCHEDULER, SYSTEM]


@pytest.mark.parametrize(("command", "allowed"), COMMANDS,
                         ids=[type(command).__name__ for command, _ in COMMANDS])
def test_each_command_is_open_to_its_roles_only(command: Command,
                                                allowed: set[Principal]) -> None:
    for principal in PRINCIPALS:
        driver = Driver()
        driver.configure(rack_spec())
        driver.register("n0", "n1")
        driver.submit(gang("g", "a", 0, (1, 1)))
        result = driver.run(command, principal)
        unauthorized = isinstance(result, Rejection) and result.code is Code.UNAUTHORIZED
        assert unauthorized == (principal not in allowed), (principal, result)


def test_the_message_names_the_principal_and_the_node() -> None:
    driver = Driver()
    driver.configure(rack_spec())
    result = driver.rejected(Heartbeat(node="n0", incarnation=1), NODE_N1, Code.UNAUTHORIZED)
    assert result.message == "node:n1 may not send Heartbeat for node 'n0'"
    result = driver.rejected(Tick(), ADMIN, Code.UNAUTHORIZED)
    assert result.message == "admin:ops may not send Tick"


@pytest.mark.parametrize(("kind", "fields", "refused"), [
    ("effects", {"after": 0, "node": "n0", "limit": 10}, False),
    ("node", {"node": "n0"}, False),
    ("group", {"group": "any", "node": "n0"}, False),  # its own node's share
    # the whole gang names other nodes' pods and GPUs: narrowed to its node's share, not
    # refused (tests/statemachine/test_node_agent_scope.py)
    ("group", {"group": "any"}, False),
    ("group", {"group": "any", "node": "n1"}, True),
    ("effects", {"after": 0, "node": "n1", "limit": 10}, True),
    ("effects", {"after": 0, "node": None, "limit": 10}, True),  # every node's
    ("effects", {"after": 0, "node": "", "limit": 10}, True),
    ("node", {"node": "n1"}, True),
    ("nodes", {"after": "", "limit": 10}, True),
    ("groups", {"vc": "", "phase": "", "after": "", "limit": 10}, True),
    ("cluster", {}, True),
    ("stats", {}, True),
])
def test_a_node_agent_asks_only_about_its_own_node(kind: str, fields: dict[str, object],
                                                   refused: bool) -> None:
    """Other nodes' start effects carry their pods' commands and environments."""
    machine = Machine()
    query = encode_query(kind, **fields)
    try:
        machine.admit_query(NODE_N0, query)
    except QueryRefused as error:
        why: str | None = error.reason
    else:
        why = None
    assert (why is not None) is refused, why
    if refused:
        assert why is not None and "node:n0" in why and "'n0'" in why
    for role in (Role.ADMIN, Role.SCHEDULER):  # asked as it is, never narrowed
        assert machine.admit_query(Principal(role, "ops"), query) == query


@pytest.mark.parametrize("principal", [NODE_N0, Principal(Role.ADMIN, "ops")])
@pytest.mark.parametrize(("query", "reason"), [
    (b"\xc1 not a query", "query: "),
    (b"\xc0" * 4096, "query: "),
    (encode_query("node", node="n0", extra=1), "node: unknown field 'extra'"),
    (pack({"v": 99, "type": "node", "node": "n0"}), "query.v: 99"),
], ids=["not_msgpack", "junk", "unknown_field", "other_version"])
def test_a_query_that_does_not_decode_is_refused_by_the_gate(principal: Principal,
                                                              query: bytes,
                                                              reason: str) -> None:
    """It had been let through for `query` to answer MALFORMED: a watch of such a query (a
    megabyte of junk) waited with its bytes held at the replica for up to ten minutes. The
    server answers it BAD_REQUEST with the reason."""
    with pytest.raises(InvalidMessage) as refused:
        Machine().admit_query(principal, query)
    assert refused.value.reason.startswith("not a query: ") and reason in refused.value.reason
