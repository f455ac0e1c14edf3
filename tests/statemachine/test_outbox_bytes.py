"""The outbox is bounded by bytes as well as by count (OUTBOX_RETAINED_MAX + TRIM_CHUNK effects).
By count alone it was not enough: every START_POD carries its pod's whole argv (up to
POD_COMMAND_BYTES_MAX) and its GPUs' UUIDs (three times: the list and two environment
variables). A full outbox of such effects, which a scheduler reaches after some 70k bindings
with long command lines, is larger than the snapshot a replica can write
(SNAPSHOT_STATE_BYTES_MAX): from then on the log is never compacted again and grows until the
disk is full, and each replica holds the outbox (gigabytes) in memory."""

from __future__ import annotations

import pytest

from consensus.runtime.driver import SNAPSHOT_STATE_BYTES_MAX
from statemachine import limits, outbox
from statemachine.effect_codec import pack_effect
from statemachine.effects import Effect, EffectKind
from statemachine.journal import Journal
from statemachine.lifecycle import pod_env


def largest_start(index: int, gpus: int = 8) -> Effect:
    """A START_POD as BindPod makes it: a command of POD_COMMAND_BYTES_MAX bytes, an 8-GPU pod
    on a node with ordinary (40-character) GPU UUIDs."""
    uuids = tuple(f"GPU-{n:08x}-0000-0000-0000-000000000000" for n in range(gpus))
    argv = ("x" * (limits.POD_COMMAND_BYTES_MAX - 255 * 1),) + ("y",) * 255
    assert sum(len(arg.encode()) for arg in argv) == limits.POD_COMMAND_BYTES_MAX
    return Effect(index=index, kind=EffectKind.START_POD, node="n" * 64, group="g" * 64,
                  pod_uid="p" * 64, gpu_uuids=uuids, env=pod_env(uuids), command=argv)


def test_a_full_outbox_of_start_effects_fits_a_snapshot() -> None:
    per_effect = len(pack_effect(largest_start(1)))
    most_kept = limits.OUTBOX_RETAINED_MAX + outbox.TRIM_CHUNK
    bytes_kept = min(per_effect * most_kept,
                     getattr(limits, "OUTBOX_RETAINED_BYTES_MAX", 1 << 62) + (1 << 16))
    assert bytes_kept <= SNAPSHOT_STATE_BYTES_MAX, (
        f"{most_kept} effects of {per_effect} bytes: {per_effect * most_kept} bytes, the "
        f"snapshot may hold {SNAPSHOT_STATE_BYTES_MAX} in all")


def test_the_outbox_keeps_its_bytes_bounded_as_well_as_its_count(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Behaviourally, on a small scale: after many large effects the bytes kept stay under
    the outbox's byte bound (it trims by bytes as by count), and a rollback restores them."""
    assert hasattr(outbox, "OUTBOX_RETAINED_BYTES_MAX"), "the outbox has no bound on its bytes"
    bound = 1 << 20
    monkeypatch.setattr(outbox, "OUTBOX_RETAINED_BYTES_MAX", bound)
    monkeypatch.setattr(outbox, "TRIM_CHUNK", 4)
    journal = Journal()
    box = outbox.Outbox(journal)
    start = largest_start(1)
    count = 4 * (bound // len(pack_effect(start)))
    for index in range(count):
        box.emit(EffectKind.START_POD, node=start.node, group=start.group,
                 pod_uid=f"p{index}", gpu_uuids=start.gpu_uuids, env=start.env,
                 command=start.command)
        assert box.packed_bytes == sum(len(data) for data in box.packed) <= bound
        if index % 7 == 0:
            journal.rollback(0)  # a refused command's effect, a trim among them
            assert box.packed_bytes == sum(len(data) for data in box.packed)
        journal.forget()
    assert box.first_index > 1 and box.next_index - box.first_index == len(box.packed)
    assert [effect.index for effect in box.effects] == list(range(box.first_index,
                                                                  box.next_index))
