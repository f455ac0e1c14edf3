"""The typed store against real replicas of the state machine (an in-process cluster on trio
and asyncio): admins configure, node agents register and report, schedulers place gangs and
bind pods, agents watch their effects; identities come from the connection. How the watch
pages through the outbox is tested against a stand-in client answering on one Machine."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

import anyio
import pytest

from consensus.envelope import Principal, Role
from consensus.runtime.client import CellarClient, OutcomeUnknown
from statemachine import outbox as outbox_module
from statemachine.codec import decode_command, encode_command
from statemachine.commands import Command, HealthReport, HealthStatus, SubmitGroup, Tick
from statemachine.effects import EffectKind
from statemachine.errors import Code, Rejection
from statemachine.machine import Machine
from statemachine.result_codec import encode_result
from statemachine.results import Done, GroupStatus, NodeRegistered, PodBound
from statemachine.spec import FailurePolicy
from statemachine.store import EFFECTS_PER_WATCH, CursorAhead, EffectsTrimmed, GpuStore
from tests.consensus.runtime.fake_replicas import RETRYING_CONFIG, silent_then_answering
from tests.consensus.runtime.local import local_cluster
from tests.statemachine.builders import inventory, rack_spec, vc

pytestmark = pytest.mark.anyio
ADMIN = Principal(Role.ADMIN, "root")
SCHEDULER = Principal(Role.SCHEDULER, "sched")


def node(name: str) -> Principal:
    return Principal(Role.NODE, name)


async def test_a_gang_is_placed_bound_and_its_start_effect_watched() -> None:
    spec = rack_spec(1, quota=[vc("team", ("A100-RACK", "A100-NODE", 2))])
    with anyio.fail_after(40):
        async with local_cluster(Machine, system_command=lambda now: encode_command(Tick())
                                 ) as (cluster, _):
            async with cluster.client(ADMIN) as admin_client:
                assert not isinstance(await GpuStore(admin_client).apply_config(0, spec),
                                      Rejection)
            async with cluster.client(node("n0")) as agent_client:
                agent = GpuStore(agent_client)
                registered = await agent.register_node("n0", "boot-1", inventory("n0"))
                assert isinstance(registered, NodeRegistered)
                async with cluster.client(SCHEDULER) as scheduler_client:
                    scheduler = GpuStore(scheduler_client)
                    status = await scheduler.submit_gang("job-1", "team", 10, [(1, 4)])
                    assert isinstance(status, GroupStatus) and status.phase == "allocated"
                    bound = await scheduler.bind_pod("job-1", 0, "pod-a")
                    assert isinstance(bound, PodBound) and len(bound.gpu_uuids) == 4
                    answer = await scheduler.gang("job-1")
                    assert not isinstance(answer, Rejection) and answer["phase"] == "allocated"
                async for effect in agent.watch_effects("n0", 0, wait_s=2):
                    if effect["kind"] == "start_pod":
                        assert effect["pod_uid"] == "pod-a"
                        break


async def test_a_node_agent_cannot_act_for_another_node() -> None:
    spec = rack_spec(1, quota=[vc("team", ("A100-RACK", "A100-NODE", 1))])
    with anyio.fail_after(40):
        async with local_cluster(Machine) as (cluster, _):
            async with cluster.client(ADMIN) as admin_client:
                await GpuStore(admin_client).apply_config(0, spec)
            async with cluster.client(node("n0")) as agent_client:
                agent = GpuStore(agent_client)
                refused = await agent.register_node("n1", "boot-1", inventory("n1"))
                assert isinstance(refused, Rejection) and refused.code is Code.UNAUTHORIZED
                report = await agent.report_health("n1", 1, [HealthReport(
                    uuid="GPU-n1-0", status=HealthStatus.FAIL, reason="xid 79")])
                assert isinstance(report, Rejection) and report.code is Code.UNAUTHORIZED
            async with cluster.client(SCHEDULER) as scheduler_client:
                refused = await GpuStore(scheduler_client).cordon("n0")
                assert isinstance(refused, Rejection) and refused.code is Code.UNAUTHORIZED


async def test_a_command_its_session_refused_after_a_retry_is_an_unknown_outcome() -> None:
    """Sent to "a", unanswered, then to "b", whose full session table refused it: the copy at
    "a" may still be applied once an idle session expires. Sent once, the refusal is a value."""
    full = Rejection(code=Code.SESSIONS_FULL, message="the session table is full")

    connect = silent_then_answering(encode_result(full))
    with anyio.fail_after(10):
        async with CellarClient(["a", "b"], connect, RETRYING_CONFIG, first=0) as client:
            with pytest.raises(OutcomeUnknown, match="sessions_full"):
                await GpuStore(client).release_gang("job-1")
        async with CellarClient(["a", "b"], connect, RETRYING_CONFIG, first=1) as client:
            assert await GpuStore(client).release_gang("job-1") == full


class MachineClient:
    """A CellarClient stand-in answering on one Machine: the executed slot is the number of
    changes the test made (one from `script` before each watch's answer), and a watch asked
    after that slot is one the replica would hold until `wait_s` or a new slot."""

    def __init__(self, machine: Machine, script: Sequence[Callable[[], None]] = ()) -> None:
        self.machine = machine
        self.script = list(script)
        self.slot = 1
        self.slots_asked: list[int] = []
        self.waited = 0
        self.reads = 0

    async def watch(self, query: bytes, after_slot: int, *, wait_s: float = 10.0
                    ) -> tuple[bytes, int]:
        self.slots_asked.append(after_slot)
        if self.script:
            self.script.pop(0)()
            self.slot += 1
        if self.slot <= after_slot:
            self.waited += 1
        return self.machine.query(query), self.slot

    async def read(self, query: bytes, **_: Any) -> bytes:
        self.reads += 1
        return self.machine.query(query)


async def take(effects: AsyncGenerator[dict[str, Any], None], count: int
               ) -> list[dict[str, Any]]:
    taken = []
    async for effect in effects:
        taken.append(effect)
        if len(taken) == count:
            break
    await effects.aclose()
    return taken


def start_effects(machine: Machine, node_name: str, count: int) -> Callable[[], None]:
    """A change that emits `count` start effects for `node_name`."""
    box = machine.state.outbox

    def emit() -> None:
        for _ in range(count):
            box.emit(EffectKind.START_POD, node=node_name, group="g",
                     pod_uid=f"p{box.next_index}")
    return emit


async def test_an_idle_node_that_missed_nothing_is_not_told_its_effects_were_trimmed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """n0's agent saw its only effect (1) and keeps watching while other nodes' effects fill
    the outbox and the oldest are trimmed: none of n0's is lost, so it is never told they
    were (each idle agent would register again at every trim), and its next effect comes."""
    monkeypatch.setattr(outbox_module, "OUTBOX_RETAINED_MAX", 8)
    monkeypatch.setattr(outbox_module, "TRIM_CHUNK", 4)
    machine = Machine()
    box = machine.state.outbox
    start_effects(machine, "n0", 1)()

    def kill() -> None:
        box.emit(EffectKind.KILL_POD, node="n0", group="g", pod_uid="p1")

    client = MachineClient(machine, [lambda: None, *[start_effects(machine, "n1", 3)] * 8,
                                     kill])
    with anyio.fail_after(5):
        try:
            effects = await take(GpuStore(client).watch_effects(  # type: ignore[arg-type]
                "n0", 1, wait_s=0.01), 1)
        except EffectsTrimmed as error:
            pytest.fail(f"spurious: {error}")
    assert box.first_index > 2, "the outbox was trimmed past n0's cursor"
    assert [(effect["kind"], effect["index"]) for effect in effects] == \
        [("kill_pod", box.next_index - 1)]


async def test_a_full_page_of_effects_is_followed_at_once_not_after_a_wait() -> None:
    """A backlog of three pages: the pages after the first are read at once, not watched for
    with the slot already seen (which a replica holds until an unrelated command runs, a Tick
    a second later, or until wait_s ends: 10k effects took 40 s)."""
    machine = Machine()
    start_effects(machine, "n0", EFFECTS_PER_WATCH * 3)()
    client = MachineClient(machine)
    with anyio.fail_after(5):
        effects = await take(GpuStore(client).watch_effects(  # type: ignore[arg-type]
            "n0", 0, wait_s=0.01), EFFECTS_PER_WATCH * 3)
    assert [effect["index"] for effect in effects] == list(range(1, EFFECTS_PER_WATCH * 3 + 1))
    assert client.waited == 0, f"slots asked: {client.slots_asked}"
    assert client.reads == 2


async def test_a_cursor_ahead_of_the_outbox_is_not_silently_waited_past() -> None:
    """The agent's cursor says 10 but the store's outbox ends at 3 (the cluster was rebuilt,
    or restored from an older backup): waiting for index 11 would skip every effect numbered
    up to 10 in the new history. A read confirms it, and the caller is told where to resume."""
    machine = Machine()
    start_effects(machine, "n0", 3)()
    client = MachineClient(machine)
    with anyio.fail_after(5), pytest.raises(CursorAhead) as ahead:
        await take(GpuStore(client).watch_effects(  # type: ignore[arg-type]
            "n0", 10, wait_s=0.01), 1)
    assert ahead.value.resume_after == 3 and client.reads == 1
    assert isinstance(ahead.value, EffectsTrimmed), "agents reconcile on it as on a trim"


async def test_the_resume_point_before_a_registration_skips_only_what_a_watch_would(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a watch from a cursor resumes, read without watching: the cursor itself while
    the outbox holds every effect after it, the trim's or the outbox's end otherwise."""
    monkeypatch.setattr(outbox_module, "OUTBOX_RETAINED_MAX", 8)
    monkeypatch.setattr(outbox_module, "TRIM_CHUNK", 4)
    machine = Machine()
    start_effects(machine, "n1", 13)()  # over 8 + 4: the oldest are trimmed
    box = machine.state.outbox
    store = GpuStore(MachineClient(machine))  # type: ignore[arg-type]
    assert box.first_index > 1, "the outbox was not trimmed"
    assert await store.effects_resume_after("n0", 0) == box.first_index - 1
    assert await store.effects_resume_after("n0", box.first_index) == box.first_index
    assert await store.effects_resume_after("n0", 99) == box.next_index - 1


async def test_a_lagging_replica_behind_the_cursor_is_checked_with_a_read_not_believed(
        ) -> None:
    """A replica's watch answers from a state older than the cursor (it lags): the
    linearizable read says the outbox is past the cursor, and the watch goes on from it."""
    machine = Machine()
    start_effects(machine, "n0", 12)()

    class Lagging(MachineClient):
        async def watch(self, query: bytes, after_slot: int, *, wait_s: float = 10.0
                        ) -> tuple[bytes, int]:
            self.slots_asked.append(after_slot)
            return Machine().query(query), self.slot  # an empty outbox: far behind

    client = Lagging(machine)
    with anyio.fail_after(5):
        effects = await take(GpuStore(client).watch_effects(  # type: ignore[arg-type]
            "n0", 10, wait_s=0.01), 2)
    assert [effect["index"] for effect in effects] == [11, 12]


class ProposalClient:
    """A CellarClient stand-in that keeps the commands proposed and answers each Done."""

    def __init__(self) -> None:
        self.commands: list[Command] = []

    async def propose(self, body: bytes, **_: Any) -> bytes:
        self.commands.append(decode_command(body))
        return encode_result(Done(note="noted"))


async def test_a_gangs_pod_failure_policy_is_sent_release_unless_told() -> None:
    client = ProposalClient()
    store = GpuStore(client)  # type: ignore[arg-type]
    await store.submit_gang("plain", "team", 1, [(2, 1)])
    await store.submit_gang("kept", "team", 1, [(2, 1)], on_pod_failure=FailurePolicy.KEEP)
    policies = [(command.group, command.on_pod_failure) for command in client.commands
                if isinstance(command, SubmitGroup)]
    assert policies == [("plain", FailurePolicy.RELEASE), ("kept", FailurePolicy.KEEP)]
