"""What the store hands the agent is checked before the agent acts on it (`agent.store_link`,
`statemachine.effect_codec.decode_effect`): an effect that does not decode, names another node,
or would start a pod on GPUs this node did not register is skipped and counted, one of an
unknown kind (a newer build's) skipped with a warning, and none of them ends the agent or starts
a job; the well-formed effect after them is still acted on."""

from __future__ import annotations

import logging
import pathlib
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any

import anyio
import pytest

from agent.pods import Pods
from agent.store_link import Standing, StoreLink
from consensus.codec import pack
from statemachine import effect_codec
from statemachine import store as store_module
from statemachine.effects import Effect, EffectKind
from statemachine.record_codec import DecodeError
from statemachine.result_codec import effect_to_plain
from statemachine.results import NodeRegistered
from tests.agent.jobs_support import GPU_A, GPU_B, GpuDouble, runner
from tests.agent.recording_store import RecordingStore

pytestmark = pytest.mark.anyio

FOREIGN_GPU = "GPU-00000000-0000-0000-0000-00000000dead"


def _start(index: int, *, node: str = "n0", group: Any = "g", pod_uid: str = "p",
           **fields: Any) -> dict[str, Any]:
    effect = {"index": index, "kind": EffectKind.START_POD.value, "node": node,
              "group": group, "pod_uid": pod_uid, "gpu_uuids": [GPU_A], "env": [],
              "reason": "", "command": ["true"]}
    effect.update(fields)
    return effect


HOSTILE = {
    "another node's": _start(1, node="n1"),
    "a foreign GPU": _start(1, gpu_uuids=[FOREIGN_GPU]),
    "a GPU named twice": _start(1, gpu_uuids=[GPU_A, GPU_A]),
    "gpu_uuids a string": _start(1, gpu_uuids=GPU_A),
    "gpu_uuids of integers": _start(1, gpu_uuids=[1, 2]),
    "command a string": _start(1, command="sh -c 'rm -rf /'"),
    "command of integers": _start(1, command=[1]),
    "env not pairs": _start(1, env=[["A"]]),
    "env a map": _start(1, env={"A": "B"}),
    "group missing": {key: value for key, value in _start(1).items() if key != "group"},
    "group an integer": _start(1, group=7),
    "an oversized pod uid": _start(1, pod_uid="p" * 100_000),
    "too many GPUs": _start(1, gpu_uuids=[f"GPU-{at}" for at in range(10_000)]),
    "an unknown field": _start(1, gpu_mask=3),
    "an unknown kind": _start(1, kind="start_pod_v2"),
    "no pod uid": _start(1, pod_uid=""),
    "a kill of another node's pod": {"index": 1, "kind": EffectKind.KILL_POD.value,
                                     "node": "n1", "group": "g", "pod_uid": "p"},
}


class WatchOnce(RecordingStore):
    """Every gang has the pod bound here (the effects are handed out once, then it waits)."""

    async def gang(self, group: str, *, node: str | None = None) -> Any:
        return {"group": group, "evicting": "",
                "pods": [{"pod_uid": "p", "node": "n0", "phase": "bound"}]}


@pytest.mark.parametrize("what", sorted(HOSTILE))
async def test_a_hostile_effect_is_skipped_and_the_next_one_acted_on(
        tmp_path: pathlib.Path, what: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="cellar.agent.store")
    good = _start(2, group="ok", pod_uid="p", gpu_uuids=[GPU_B])
    store = WatchOnce("n0", effects=(HOSTILE[what], good))
    link = StoreLink(store, "n0", retry_ms_max=200)  # type: ignore[arg-type]
    link.registered_gpus = frozenset({GPU_A, GPU_B})
    async with runner(tmp_path, GpuDouble()) as jobs:
        pods = Pods(link, jobs, tmp_path)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(pods.follow_effects)
                while not store.times("ack"):
                    await anyio.sleep(0.01)
                tasks.cancel_scope.cancel()
    acks = [args for _, name, args in store.calls if name == "ack"]
    assert acks == [("n0", "ok", "p")], "only the well-formed effect started a job"
    assert not [call for call in store.calls if call[1] == "exit" and call[2][1] == "g"]
    assert link.effects_refused == 1
    assert any("effect" in record.getMessage() for record in caplog.records)


async def test_the_link_yields_typed_effects_and_skips_an_unknown_kind_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="cellar.agent.store")
    store = WatchOnce("n0", effects=(_start(1, kind="resize_pod"), _start(2)))
    link = StoreLink(store, "n0", retry_ms_max=200)  # type: ignore[arg-type]
    link.registered_gpus = frozenset({GPU_A})
    cursor: list[int] = []
    with anyio.fail_after(5):
        async with aclosing(link.effects(0, wait_s=0.1, on_cursor=cursor.append)) as watched:
            effect = await watched.__anext__()
    assert effect == Effect(index=2, kind=EffectKind.START_POD, node="n0", group="g",
                            pod_uid="p", gpu_uuids=(GPU_A,), command=("true",))
    assert cursor == [1], "the skipped effect moved the cursor past it"
    assert [record.levelno for record in caplog.records] == [logging.WARNING]
    assert "resize_pod" in caplog.records[0].getMessage()


def test_decode_effect_reads_back_what_the_store_answers() -> None:
    effect = Effect(index=9, kind=EffectKind.START_POD, node="n0", group="g", pod_uid="p",
                    gpu_uuids=(GPU_A, GPU_B), env=(("CUDA_VISIBLE_DEVICES", GPU_A),),
                    reason="why", command=("python", "-c", "pass"))
    assert effect_codec.decode_effect(effect_to_plain(effect)) == effect
    with pytest.raises(effect_codec.UnknownEffectKind):
        effect_codec.decode_effect({**effect_to_plain(effect), "kind": "from_the_future"})
    with pytest.raises(DecodeError, match="index"):
        effect_codec.decode_effect({**effect_to_plain(effect), "index": "9"})


@pytest.mark.parametrize("page", [
    {"ok": True, "type": "effects", "first_index": 1, "effects": []},  # no next_index
    {"ok": True, "type": "effects", "next_index": "5", "effects": []},
    {"ok": True, "type": "effects", "next_index": 5, "effects": {"index": 1}},
    {"ok": True, "type": "effects", "next_index": 5, "effects": [["start_pod"]]},
    {"ok": True, "type": "effects", "next_index": 5, "effects": [{"index": "1"}]},
    {"ok": True, "type": "effects", "next_index": 5, "more": "yes", "effects": []},
])
def test_a_malformed_effects_page_is_a_decode_error(page: dict[str, Any]) -> None:
    """Not a KeyError or TypeError out of the watch, which ended the agent: the link asks
    again, backing off, as for an unanswered watch."""
    with pytest.raises(DecodeError):
        store_module._effects_answer(pack(page))


async def test_a_malformed_effects_page_is_asked_again_not_fatal() -> None:
    class SkewedStore(WatchOnce):
        asked = 0

        async def watch_effects(self, node: str, after: int = 0, *, wait_s: float = 5.0,
                                on_cursor: Callable[[int], None] | None = None
                                ) -> AsyncGenerator[dict[str, Any], None]:
            self.asked += 1
            if self.asked == 1:
                store_module._effects_answer(pack({"ok": True, "next_index": None}))
            async for effect in super().watch_effects(node, after, wait_s=wait_s):
                yield effect

    store = SkewedStore("n0", effects=(_start(1),))
    link = StoreLink(store, "n0", retry_ms_max=200)  # type: ignore[arg-type]
    link.registered_gpus = frozenset({GPU_A})
    with anyio.fail_after(5):
        async with aclosing(link.effects(0, wait_s=0.1)) as watched:
            effect = await watched.__anext__()
    assert effect.index == 1 and store.asked == 2 and link.calls_retried == 1


async def test_a_registration_reply_for_another_node_is_not_taken() -> None:
    class Misdirected(RecordingStore):
        async def register_node(self, node: str, boot_id: str, gpus: Any, links: Any = (),
                                health: Any = ()) -> Any:
            self._log("register", node)
            if len(self.times("register")) == 1:
                return NodeRegistered(node="n1", incarnation=99, pods=())
            return NodeRegistered(node=node, incarnation=3, pods=())

    async def no_gpus() -> Any:
        return (), ()

    store = Misdirected("n0")
    link = StoreLink(store, "n0", retry_ms_max=200)  # type: ignore[arg-type]
    with anyio.fail_after(5), anyio.CancelScope() as scope:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("agent.store_link.REGISTER_REFUSED_RETRY_MS", 1)
            registered = await link.register("boot", no_gpus)
        scope.cancel()
    assert registered.node == "n0" and link.incarnation == 3 and link.answers_refused == 1


@pytest.mark.parametrize("answer", [
    {"pods": "p"}, {"pods": [["p", "n0", "bound"]]}, {"pods": None},
])
async def test_a_malformed_gang_answer_reads_as_no_pod_here(answer: dict[str, Any]) -> None:
    class Odd(RecordingStore):
        async def gang(self, group: str, *, node: str | None = None) -> Any:
            return answer

    link = StoreLink(Odd("n0"), "n0", retry_ms_max=200)  # type: ignore[arg-type]
    assert await link.standing("g", "p") is Standing.GONE
    assert link.answers_refused == 1


@pytest.mark.parametrize("gpus", [[{"uuid": GPU_A}], ["GPU-x"], "GPU-x",
                                  [{"uuid": 5, "index": 0, "pci_bus_id": "0000:01:00.0",
                                    "model": "A100", "memory_mib": 1, "numa_node": 0,
                                    "mig_enabled": False}]])
async def test_a_malformed_node_answer_reads_as_no_gpus(gpus: Any) -> None:
    class Odd:
        async def node(self, node: str) -> Any:
            return {"node": node, "gpus": gpus}

    link = StoreLink(Odd(), "n0", retry_ms_max=200)  # type: ignore[arg-type]
    assert await link.registered_inventory() == ()
    assert link.answers_refused == 1
