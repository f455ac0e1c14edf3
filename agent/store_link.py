"""The agent's side of the conversation with the store, under its node identity.

Every call here is idempotent in the state machine (a heartbeat, a health report, a pod's
start acknowledged or its exit reported twice changes nothing the second time), so a call
whose outcome is unknown after a store failover is simply made again, with back-off, until
the store answers. A refusal is an answer: it is returned for the caller to act on (a stale
incarnation means register again; an unknown pod means the store forgot it). The watch of
this node's effects is asked again the same way, from its cursor (the last effect handed out,
or past others' effects where the watch moved it): no store outage ends the agent.

What the store hands out is checked before the agent acts on it, as a replica of another
version or a bug may send anything: each effect is decoded into a typed `Effect`
(`effect_codec.decode_effect`: types, sizes), and one that does not decode, names another
node, or would start a pod on GPUs this node did not register is refused (logged, counted in
`effects_refused`, skipped); one of a kind this build does not know (a newer replica's) is
skipped with a warning. A page of effects that is not one (no index to resume from) is asked
again, backing off, as an unanswered watch is. A registration reply for another node is a
refusal; a gang or node answer that is not well formed reads as no pod and no GPUs.
"""

from __future__ import annotations

import enum
import functools
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import Any, TypeVar

import anyio

from consensus.runtime.client import ClientError
from consensus.validation import expect_list
from statemachine import limits
from statemachine.codec import decode_inventory
from statemachine.commands import GpuInventory, GpuLink, HealthReport
from statemachine.effect_codec import UnknownEffectKind, decode_effect
from statemachine.effects import Effect, EffectKind
from statemachine.errors import Code, Rejection
from statemachine.record_codec import DecodeError, checked
from statemachine.results import NodeRegistered, PodPhase, Result
from statemachine.store import GpuStore

logger = logging.getLogger("cellar.agent.store")
T = TypeVar("T")
RETRY_MS_MIN = 50
NodeGpus = tuple[Sequence[GpuInventory], Sequence[GpuLink]]  # what registration sends
REGISTER_REFUSED_RETRY_MS = 10_000  # the cluster configuration may not know this node yet


class Standing(enum.Enum):
    """What the store has of a pod bound to this node."""

    BOUND = "bound"  # bound or running here: it is this node's to run
    EVICTING = "evicting"  # still here, but its gang is being made to leave: never start it
    GONE = "gone"  # exited, released, or not on this node


class StoreLink:
    def __init__(self, store: GpuStore, node: str, *, retry_ms_max: int) -> None:
        self.store = store
        self.node = node
        self.retry_ms_max = retry_ms_max
        self.incarnation = 0
        self.calls_retried = 0
        self.registered_gpus: frozenset[str] = frozenset()  # uuids of the last registration
        self.reports_unregistered = 0  # health reports left out for GPUs not registered
        self.effects_refused = 0  # effects skipped: malformed, another node's, unknown kind
        self.answers_refused = 0  # replies and answers not well formed, or another node's
        self._registering: anyio.Event | None = None  # set when a registration under way ends

    async def _until_answered(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """Make `call` until the store answers (a result or a refusal), backing off."""
        delay_ms = RETRY_MS_MIN
        while True:
            try:
                return await call()
            except ClientError as error:
                delay_ms = await self._back_off(what, error, delay_ms)

    async def _back_off(self, what: str, error: ClientError | DecodeError,
                        delay_ms: int) -> int:
        """Count and log a call the store did not answer, wait `delay_ms`; the next delay."""
        self.calls_retried += 1
        logger.warning("%s: no answer from the store (%s); again in %d ms", what, error,
                       delay_ms)
        await anyio.sleep(delay_ms / 1000)
        return min(delay_ms * 2, self.retry_ms_max)

    async def effects(self, after: int, *, wait_s: float,
                      on_cursor: Callable[[int], None] | None = None
                      ) -> AsyncGenerator[Effect, None]:
        """This node's effects after index `after`, forever (`GpuStore.watch_effects`, which
        tells `on_cursor` when the cursor moves past others' effects); when the store does
        not answer (no replica up for a while, every one overloaded) the watch is made
        again, backing off, from the cursor: the last effect handed out or, if later, where
        the watch moved it (an idle node's last effect may be trimmed since)."""
        delay_ms = RETRY_MS_MIN

        def moved(index: int) -> None:
            nonlocal after
            after = max(after, index)
            if on_cursor is not None:
                on_cursor(after)

        while True:
            try:
                async with aclosing(self.store.watch_effects(
                        self.node, after, wait_s=wait_s, on_cursor=moved)) as effects:
                    async for raw in effects:
                        after, delay_ms = max(after, int(raw["index"])), RETRY_MS_MIN
                        effect = self._checked_effect(raw)
                        if effect is not None:
                            yield effect
                        elif on_cursor is not None:
                            on_cursor(after)  # skipped: handled, as far as the cursor goes
            except (ClientError, DecodeError) as error:
                delay_ms = await self._back_off("watching effects", error, delay_ms)

    def _checked_effect(self, raw: dict[str, Any]) -> Effect | None:
        """The effect `raw` decodes to, if this node may act on it; None, logged and counted,
        when not (`store.watch_effects` checked that its index is an integer)."""
        try:
            effect = decode_effect(raw)
        except UnknownEffectKind as unknown:
            self.effects_refused += 1
            logger.warning("effect %d is of a kind this agent does not know (%r, from a newer "
                           "build?): skipped", unknown.index, unknown.kind)
            return None
        except DecodeError as error:
            self.effects_refused += 1
            logger.error("an effect from the store is not well formed (%s): skipped", error)
            return None
        why = self._effect_refusal(effect)
        if why is not None:
            self.effects_refused += 1
            logger.error("effect %d (%s of %s/%s) refused: %s", effect.index, effect.kind,
                         effect.group, effect.pod_uid, why)
            return None
        return effect

    def _effect_refusal(self, effect: Effect) -> str | None:
        """Why this node must not act on `effect`, or None."""
        if effect.node != self.node:
            return f"it is for node {effect.node!r}, not {self.node!r}"
        if effect.kind in (EffectKind.START_POD, EffectKind.KILL_POD) and not effect.pod_uid:
            return "it names no pod"
        if effect.kind is EffectKind.START_POD:
            foreign = sorted(set(effect.gpu_uuids) - self.registered_gpus)
            if foreign:
                return f"GPU {', '.join(foreign)} is not one this node registered"
            if len(set(effect.gpu_uuids)) != len(effect.gpu_uuids):
                return "a GPU is named twice"
        return None

    async def effects_resume_after(self, after: int) -> int:
        """Where a watch of this node's effects from `after` would resume: `after`, or past
        the effects the store no longer keeps (`GpuStore.effects_resume_after`)."""
        return await self._until_answered("effects cursor", lambda: (
            self.store.effects_resume_after(self.node, after)))

    async def register(self, boot_id: str, read_gpus: Callable[[], Awaitable[NodeGpus]],
                       amend: Callable[[], Awaitable[bool]] | None = None,
                       read_health: Callable[[], Sequence[HealthReport]] | None = None
                       ) -> NodeRegistered:
        """Register with a fresh incarnation and the GPUs `read_gpus` finds, read again for
        each try, with their health as `read_health` reads it then (the store applies it before
        placing anything on them); a refusal (this node is not in the cluster's
        configuration, or its GPUs do not match it, as when one did not answer NVML) is logged
        and tried again later. The GPUs refused as not matching are first offered to `amend`:
        if it changed what `read_gpus` will find, the registration is tried again at once."""
        self._registering = registering = anyio.Event()
        try:
            return await self._register(boot_id, read_gpus, amend, read_health)
        finally:
            self._registering = None
            registering.set()

    async def _register(self, boot_id: str, read_gpus: Callable[[], Awaitable[NodeGpus]],
                        amend: Callable[[], Awaitable[bool]] | None,
                        read_health: Callable[[], Sequence[HealthReport]] | None
                        ) -> NodeRegistered:
        while True:
            gpus, links = await read_gpus()
            uuids = {gpu.uuid for gpu in gpus}
            health = [report for report in (read_health() if read_health else ())
                      if report.uuid in uuids]
            result = await self._until_answered("register", functools.partial(
                self.store.register_node, self.node, boot_id, gpus, links, health))
            if isinstance(result, NodeRegistered) and result.node != self.node:
                self.answers_refused += 1
                logger.error("the store's registration reply is for node %r, not %r: its pods "
                             "are not this node's to start; registering again later",
                             result.node, self.node)
            elif isinstance(result, NodeRegistered):
                self.incarnation = result.incarnation
                self.registered_gpus = frozenset(gpu.uuid for gpu in gpus)
                return result
            else:
                logger.error("the store refused to register %s: %s", self.node, result)
            if (isinstance(result, Rejection) and result.code is Code.INVENTORY_MISMATCH
                    and amend is not None and await amend()):
                continue
            await anyio.sleep(REGISTER_REFUSED_RETRY_MS / 1000)

    async def registered_inventory(self) -> tuple[GpuInventory, ...]:
        """The GPUs of this node's last registration the store took (kept through a
        deregistration); none if it knows of none."""
        answer: Any = await self._until_answered("node query", lambda: (
            self.store.node(self.node)))
        if isinstance(answer, Rejection):
            return ()
        try:
            gpus = checked(expect_list, answer.get("gpus", []), "node.gpus",
                           length_max=limits.GPUS_PER_NODE_MAX)
            return tuple(decode_inventory(gpu, f"node.gpus[{at}]")
                         for at, gpu in enumerate(gpus))
        except DecodeError as error:
            self.answers_refused += 1
            logger.error("the store's answer on node %s is not well formed (%s): taken as no "
                         "GPUs", self.node, error)
            return ()

    async def heartbeat(self) -> Result | Rejection:
        return await self._until_answered("heartbeat", lambda: self.store.heartbeat(
            self.node, self.incarnation))

    async def report_health(self, reports: Sequence[HealthReport]) -> Result | Rejection | None:
        """Report the GPUs this incarnation registered; None when none is left to report. A
        GPU NVML lists only since (after a restart of NVML) is the next registration's: the
        store refuses a whole report that names a GPU it does not know, so one such GPU would
        keep every other GPU's failures from it."""
        known = [report for report in reports if report.uuid in self.registered_gpus]
        self.reports_unregistered += len(reports) - len(known)
        if not known:
            return None
        return await self._until_answered("report health", lambda: self.store.report_health(
            self.node, self.incarnation, known))

    async def ack_started(self, group: str, pod_uid: str,
                          gpu_uuids: Sequence[str]) -> Result | Rejection:
        return await self._until_answered("ack start", lambda: self.store.ack_pod_started(
            self.node, self.incarnation, group, pod_uid, gpu_uuids))

    async def report_exit(self, group: str, pod_uid: str, exit_code: int,
                          reason: str) -> Result | Rejection:
        """Report a job's exit. One refused as stale while this link registers again (the
        store applied the registration and its reply is on its way, or made again after a
        failover), or made under an incarnation since replaced, is made again under the new
        one: dropped, the job's exit code was lost (the registration's reconcile calls the
        job lost)."""
        while True:
            used = self.incarnation

            def call() -> Awaitable[Result | Rejection]:
                nonlocal used
                used = self.incarnation
                return self.store.report_pod_exit(self.node, used, group, pod_uid, exit_code,
                                                  reason=reason)

            result = await self._until_answered("report exit", call)
            registering = self._registering
            if not is_stale(result):
                return result
            if registering is not None:
                await registering.wait()
            elif used == self.incarnation:
                return result

    async def standing(self, group: str, pod_uid: str) -> Standing:
        """What the store has of `pod_uid` on this node now: an effect is a hint, the gang's
        current state decides (this node's share of it, all an agent may ask)."""
        answer: Any = await self._until_answered(
            "gang query", lambda: self.store.gang(group, node=self.node))
        if isinstance(answer, Rejection):
            return Standing.GONE
        pods, evicting = answer.get("pods", []), answer.get("evicting", "")
        if type(pods) is not list or type(evicting) is not str or not all(
                type(pod) is dict for pod in pods):
            self.answers_refused += 1
            logger.error("the store's answer on gang %s is not well formed: taken as no pod "
                         "here", group)
            return Standing.GONE
        if not any(pod.get("pod_uid") == pod_uid and pod.get("node") == self.node
                   and pod.get("phase") in (PodPhase.BOUND.value, PodPhase.RUNNING.value)
                   for pod in pods):
            return Standing.GONE
        return Standing.EVICTING if evicting else Standing.BOUND


def is_stale(result: object) -> bool:
    """The store has since registered this node again: this incarnation is over."""
    return isinstance(result, Rejection) and result.code in (Code.STALE_INCARNATION,
                                                             Code.NOT_REGISTERED)
