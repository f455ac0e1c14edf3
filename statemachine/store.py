"""The typed store: GPU commands and queries over the replicated store, for schedulers and
node agents that embed Cellar.

Every command goes through the client library (exactly-once sessions, retries across replicas,
`OutcomeUnknown` when the outcome cannot be known) and comes back as the state machine's typed
`Result` or `Rejection`: rejections are values here as they are in the state machine, except
a session's refusal (SESSIONS_FULL, SESSION_TOO_OLD) of a command sent more than once, which is
`OutcomeUnknown`: another copy may still be applied; and SESSION_EXPIRED (a copy ran, its reply
was dropped), which is `OutcomeUnknown` too. Queries are linearizable reads;
`watch_effects` follows a node's numbered effects (pods to start and kill) from an index,
resuming from wherever it stopped after a reconnect; a page of effects whose cursor fields or
indices are not integers is a `DecodeError` (each effect is its reader's to decode:
`effect_codec.decode_effect`). `SyncStore` wraps it all for scripts.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

from consensus.runtime.client import CellarClient
from consensus.validation import expect_bool, expect_int, expect_list, expect_map
from statemachine.codec import encode_command
from statemachine.commands import (
    AckPodStarted,
    ApplyConfig,
    BindPod,
    ClearBad,
    Command,
    Cordon,
    Deregister,
    Drain,
    GpuInventory,
    GpuLink,
    HealthReport,
    Heartbeat,
    MarkBad,
    Member,
    RegisterNode,
    ReleaseGroup,
    ReportHealth,
    ReportPodExit,
    SubmitGroup,
    Uncordon,
)
from statemachine.errors import Code, Rejection
from statemachine.limits import EFFECTS_ANSWER_BYTES_MAX, QUERY_LIMIT_MAX
from statemachine.query_codec import decode_answer, encode_query
from statemachine.record_codec import checked
from statemachine.result_codec import decode_result
from statemachine.results import Result
from statemachine.spec import ClusterSpec, FailurePolicy

Answer = dict[str, Any] | Rejection
T = TypeVar("T")
EFFECTS_PER_WATCH = 256


class EffectsTrimmed(Exception):
    """The outbox no longer holds every effect after the caller's index (it keeps only the
    newest, statemachine/outbox.py): some of the caller's may be gone. Reconcile with the
    store's current state (a node agent registers again), then resume from
    `resume_after`."""

    def __init__(self, after: int, first_index: int, *, why: str = "") -> None:
        super().__init__(why or f"effects after {after} were trimmed: the outbox starts at "
                                f"{first_index}")
        self.after = after
        self.first_index = first_index
        self.resume_after = first_index - 1


class CursorAhead(EffectsTrimmed):
    """The caller's index is past the end of the outbox, as a linearizable read confirmed:
    the store's history is not the one the index came from (the cluster was rebuilt from
    empty, or restored from an older backup), so effects due to the caller may be numbered
    at or below it. Reconcile as for trimmed effects, then resume from `resume_after`, the
    outbox's end."""

    def __init__(self, after: int, first_index: int, next_index: int) -> None:
        super().__init__(after, first_index,
                         why=f"effects after {after} were asked for, but the store's outbox "
                             f"ends at {next_index - 1}: its history is not the cursor's")
        self.resume_after = next_index - 1


# The session's refusals, which it does not remember (statemachine/sessions.py): after a retry
# the client raises OutcomeUnknown for them, as a copy sent earlier may still be applied. And
# SESSION_EXPIRED: a copy ran, and its reply (a result or a rejection) is gone.
_SESSION_REFUSALS = (Code.SESSION_TOO_OLD, Code.SESSIONS_FULL, Code.SESSION_EXPIRED)


def _not_applied(reply: bytes) -> str | None:
    result = decode_result(reply)
    if isinstance(result, Rejection) and result.code in _SESSION_REFUSALS:
        return str(result)
    return None


def _effects_answer(result: bytes) -> dict[str, Any]:
    """An effects page whose cursor fields and effects' indices are checked (the effects
    themselves are `effect_codec.decode_effect`'s to check, one by one): DecodeError for a
    page that is not one (a replica of another version, or a bug), which no index could be
    taken from."""
    answer = decode_answer(result)
    if isinstance(answer, Rejection):
        raise RuntimeError(f"effects query refused: {answer}")
    checked(expect_int, answer.get("next_index"), "effects.next_index")
    if "first_index" in answer:
        checked(expect_int, answer["first_index"], "effects.first_index")
    if "more" in answer:
        checked(expect_bool, answer["more"], "effects.more")
    effects = checked(expect_list, answer.get("effects", []), "effects.effects",
                      length_max=EFFECTS_ANSWER_BYTES_MAX)
    for at, effect in enumerate(effects):
        path = f"effects.effects[{at}]"
        checked(expect_int, checked(expect_map, effect, path, length_max=64).get("index"),
                f"{path}.index")
    return answer


def _check_cursor(answer: dict[str, Any], after: int) -> None:
    """Raise unless the effects in `answer` follow on from index `after`."""
    first_index, next_index = int(answer.get("first_index", 1)), int(answer["next_index"])
    if next_index <= after:
        raise CursorAhead(after, first_index, next_index)
    if first_index > after + 1:
        raise EffectsTrimmed(after, first_index)


class GpuStore:
    def __init__(self, client: CellarClient) -> None:
        self.client = client

    async def command(self, command: Command) -> Result | Rejection:
        """Apply one command exactly once; its result, or the rejection (nothing changed)."""
        return decode_result(await self.client.propose(encode_command(command),
                                                       not_applied=_not_applied))

    async def query(self, kind: str, **fields: Any) -> Answer:
        """A linearizable query (see statemachine.query_codec for kinds and fields)."""
        return decode_answer(await self.client.read(encode_query(kind, **fields)))

    # --- schedulers ---------------------------------------------------------------------------

    async def submit_gang(self, group: str, vc: str, priority: int,
                          members: Sequence[tuple[int, int]], *, gpu_model: str = "",
                          lazy_preemption: bool = False,
                          on_pod_failure: FailurePolicy = FailurePolicy.RELEASE
                          ) -> Result | Rejection:
        """Submit a gang of members, each `(pods, gpus per pod)`; all or nothing. With
        `on_pod_failure` RELEASE, a pod that fails (exits non-zero, or is lost) while the gang
        runs evicts the gang; with KEEP its other pods go on."""
        return await self.command(SubmitGroup(
            group=group, vc=vc, priority=priority, gpu_model=gpu_model,
            members=tuple(Member(pods=pods, gpus=gpus) for pods, gpus in members),
            lazy_preemption=lazy_preemption, on_pod_failure=on_pod_failure))

    async def bind_pod(self, group: str, member: int, pod_uid: str,
                       command: Sequence[str] = ()) -> Result | Rejection:
        """Bind a pod to the member's next free slot; the node agent runs `command` (argv)."""
        return await self.command(BindPod(group=group, member=member, pod_uid=pod_uid,
                                          command=tuple(command)))

    async def release_gang(self, group: str, reason: str = "done") -> Result | Rejection:
        return await self.command(ReleaseGroup(group=group, reason=reason))

    async def gang(self, group: str, *, node: str | None = None) -> Answer:
        """A gang's phase, placement and, while it waits, why it is pending; its failures,
        the first of them up to about 1 MiB (GROUP_FAILURES_BYTES_MAX) and
        `failures_omitted`, the count of those left out. With `node`, only that node's share
        (its pods, its GPUs' failures; UNKNOWN_GROUP with none of its pods): all a node agent
        may see, of its own node (asking without `node`, it gets that share too)."""
        if node is None:
            return await self.query("group", group=group)
        return await self.query("group", group=group, node=node)

    async def gangs(self, *, vc: str = "", phase: str = "", after: str = "",
                    limit: int = QUERY_LIMIT_MAX) -> Answer:
        """Gangs in id order after `after`, filtered by tenant and phase ("" for any)."""
        return await self.query("groups", vc=vc, phase=phase, after=after, limit=limit)

    async def all_gangs(self, *, vc: str = "", phase: str = "") -> Answer:
        """Every gang, as `gangs` answers, asked page by page (not one snapshot)."""
        return await self._every("groups", "groups", "group", vc=vc, phase=phase)

    async def cluster(self) -> Answer:
        """Free and bound cells per chain and level; per tenant and chain with a quota, its
        cells, the first of those entries up to about 4 MiB (CLUSTER_VCS_BYTES_MAX) and
        `vcs_omitted`, the count of those left out."""
        return await self.query("cluster")

    async def stats(self) -> Answer:
        return await self.query("stats")

    # --- node agents (a node agent's certificate names its node) -------------------------------

    async def register_node(self, node: str, boot_id: str, gpus: Sequence[GpuInventory],
                            links: Sequence[GpuLink] = (),
                            health: Sequence[HealthReport] = ()) -> Result | Rejection:
        """Register with the GPUs' health as the agent reads it now (applied before the
        registration places anything on them)."""
        return await self.command(RegisterNode(node=node, boot_id=boot_id, gpus=tuple(gpus),
                                               links=tuple(links), health=tuple(health)))

    async def heartbeat(self, node: str, incarnation: int) -> Result | Rejection:
        return await self.command(Heartbeat(node=node, incarnation=incarnation))

    async def report_health(self, node: str, incarnation: int,
                            reports: Sequence[HealthReport]) -> Result | Rejection:
        return await self.command(ReportHealth(node=node, incarnation=incarnation,
                                               reports=tuple(reports)))

    async def ack_pod_started(self, node: str, incarnation: int, group: str, pod_uid: str,
                              gpu_uuids: Sequence[str]) -> Result | Rejection:
        return await self.command(AckPodStarted(node=node, incarnation=incarnation, group=group,
                                                pod_uid=pod_uid, gpu_uuids=tuple(gpu_uuids)))

    async def report_pod_exit(self, node: str, incarnation: int, group: str, pod_uid: str,
                              exit_code: int, *, reason: str = "") -> Result | Rejection:
        return await self.command(ReportPodExit(node=node, incarnation=incarnation,
                                                group=group, pod_uid=pod_uid,
                                                exit_code=exit_code, reason=reason))

    async def watch_effects(self, node: str, after: int = 0, *, wait_s: float = 5.0,
                            on_cursor: Callable[[int], None] | None = None
                            ) -> AsyncGenerator[dict[str, Any], None]:
        """Effects for `node` with index > `after`, forever: each as a plain map with its
        `index`, so a caller that stops can resume from the last index it handled. When a
        page shows `node` has none below the outbox's end, the cursor moves there, past
        other nodes' effects, and `on_cursor` is told the new index (once every effect
        handed out was handled): a caller that resumes from it is not told of a trim of
        others' effects. Raises EffectsTrimmed when some of them are no longer kept,
        CursorAhead when `after` is past the end of the store's outbox."""
        slot, more = -1, False
        while True:
            query = encode_query("effects", after=after, node=node, limit=EFFECTS_PER_WATCH)
            if more:  # the rest of a cut page is there already: asked at once, not waited for
                answer = await self._read_effects(query)
            else:
                asked = slot
                result, slot = await self.client.watch(query, slot, wait_s=wait_s)
                answer = _effects_answer(result)
                # A replica behind the cursor is not believed, nor one that executed nothing
                # for the whole wait (cut off from its peers, its state frozen: it would
                # answer every watch, after its wait, with nothing new, and the client would
                # stay with it): a linearizable read says, and moves the client on from it.
                if slot <= asked or int(answer["next_index"]) <= after:
                    answer = await self._read_effects(query)
            _check_cursor(answer, after)
            effects = answer.get("effects", [])
            for effect in effects:
                after = max(after, int(effect["index"]))
                yield effect
            more = bool(answer.get("more", len(effects) >= EFFECTS_PER_WATCH))
            if not more and int(answer["next_index"]) - 1 > after:
                # The page held every effect of this node below next_index: however many
                # other nodes' effects go by (and are trimmed), this node missed none.
                after = int(answer["next_index"]) - 1
                if on_cursor is not None:
                    on_cursor(after)

    async def effects_resume_after(self, node: str, after: int) -> int:
        """Where a watch of `node`'s effects from `after` would resume, by a linearizable
        read: `after` itself, or the `resume_after` of the EffectsTrimmed (CursorAhead) the
        watch would raise. A node agent moves its cursor there before registering: the
        registration that follows covers every effect before it."""
        answer = await self._read_effects(encode_query("effects", after=after, node=node,
                                                       limit=1))
        try:
            _check_cursor(answer, after)
        except EffectsTrimmed as gap:
            return gap.resume_after
        return after

    async def _read_effects(self, query: bytes) -> dict[str, Any]:
        return _effects_answer(await self.client.read(query))

    async def node(self, node: str) -> Answer:
        return await self.query("node", node=node)

    async def nodes(self, *, after: str = "", limit: int = QUERY_LIMIT_MAX) -> Answer:
        return await self.query("nodes", after=after, limit=limit)

    async def all_nodes(self) -> Answer:
        """Every node, as `nodes` answers, asked page by page (not one snapshot)."""
        return await self._every("nodes", "nodes", "node")

    async def _every(self, kind: str, key: str, name: str, **fields: Any) -> Answer:
        """The `kind` query's list under `key`, page after page until one that says there is
        no `more` (or, for an answer that does not say, a short one); each page starts after
        the last item's `name`."""
        listed: list[dict[str, Any]] = []
        after = ""
        while True:
            answer = await self.query(kind, after=after, limit=QUERY_LIMIT_MAX, **fields)
            if isinstance(answer, Rejection):
                return answer
            page = answer[key]
            listed.extend(page)
            if not page or not answer.get("more", len(page) >= QUERY_LIMIT_MAX):
                answer.pop("more", None)
                return {**answer, key: listed}
            after = page[-1][name]

    # --- admins -------------------------------------------------------------------------------

    async def apply_config(self, expected_version: int, spec: ClusterSpec
                           ) -> Result | Rejection:
        """Replace the configuration; ConfigApplied names the gangs it downgraded and the
        preempting ones it requeued, the first of each by id up to about 2 MiB
        (CONFIG_NAMES_BYTES_MAX), with `downgraded_omitted` / `requeued_omitted` counting the
        rest."""
        return await self.command(ApplyConfig(expected_version=expected_version, spec=spec))

    async def mark_bad(self, node: str, gpu: str = "", reason: str = "admin"
                       ) -> Result | Rejection:
        return await self.command(MarkBad(node=node, gpu=gpu, reason=reason))

    async def clear_bad(self, node: str, gpu: str = "") -> Result | Rejection:
        return await self.command(ClearBad(node=node, gpu=gpu))

    async def cordon(self, node: str) -> Result | Rejection:
        return await self.command(Cordon(node=node))

    async def uncordon(self, node: str) -> Result | Rejection:
        return await self.command(Uncordon(node=node))

    async def drain(self, node: str) -> Result | Rejection:
        return await self.command(Drain(node=node))

    async def deregister(self, node: str, *, force: bool = False) -> Result | Rejection:
        return await self.command(Deregister(node=node, force=force))


class SyncStore:
    """The typed store for synchronous scripts: each call runs on a private event loop thread.

        with SyncStore(lambda: CellarClient(endpoints, connect)) as store:
            store.call(store.store.submit_gang, "job-1", "team-a", 10, [(1, 8)])
    """

    def __init__(self, make_client: Callable[[], CellarClient]) -> None:
        self._make_client = make_client
        self._portal_cm = start_blocking_portal()
        self._portal: BlockingPortal | None = None
        self.store: GpuStore

    def __enter__(self) -> SyncStore:
        self._portal = self._portal_cm.__enter__()
        client = self._make_client()
        self._client_cm = self._portal.wrap_async_context_manager(client)
        self.store = GpuStore(self._client_cm.__enter__())
        return self

    def __exit__(self, *exc: object) -> None:
        self._client_cm.__exit__(None, None, None)
        self._portal_cm.__exit__(None, None, None)

    def call(self, function: Callable[..., Awaitable[T]], *args: Any) -> T:
        assert self._portal is not None, "use SyncStore in a `with` block"
        return self._portal.call(function, *args)


__all__ = ["CursorAhead", "EffectsTrimmed", "GpuStore", "SyncStore"]
