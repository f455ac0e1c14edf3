"""Replay determinism and snapshots: the same log gives the same digest at every index on a
fresh machine, on a machine restored from a mid-way snapshot, and in processes with different
PYTHONHASHSEED values; a restored state equals the original, derived parts included."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from statemachine import Machine, check_invariants
from statemachine.sessions import Sessions
from statemachine.snapshot_codec import decode_snapshot, encode_snapshot
from tests.statemachine.workload import workload_log

ROOT = pathlib.Path(__file__).resolve().parents[2]
SEED, STEPS = 11, 400


def digests(machine: Machine, log: list[bytes]) -> list[bytes]:
    found = []
    for entry in log:
        machine.apply(entry)
        found.append(machine.digest())
    return found


def test_replays_agree_at_every_index_including_from_a_snapshot() -> None:
    log = workload_log(SEED, STEPS)
    straight = digests(Machine(), log)
    again = digests(Machine(), log)
    assert again == straight
    half = len(log) // 2
    first = Machine()
    digests(first, log[:half])
    restored = Machine()
    restored.restore(first.snapshot())
    check_invariants(restored.state)
    assert restored.digest() == straight[half - 1]
    assert digests(restored, log[half:]) == straight[half:]


def test_the_workload_reaches_every_phase_and_keeps_every_invariant() -> None:
    machine = Machine()
    replies = []
    for entry in workload_log(SEED, STEPS):
        replies.append(machine.apply(entry))
        check_invariants(machine.state)
    kinds = {effect.kind.value for effect in machine.state.outbox.effects}
    assert {"gang_allocated", "start_pod", "kill_pod", "gang_released",
            "gang_preempting"} <= kinds
    assert any(b"rejection" in reply or b"code" in reply for reply in replies)


def test_restore_rebuilds_the_same_derived_state() -> None:
    machine = Machine()
    for entry in workload_log(SEED + 1, STEPS):
        machine.apply(entry)
    state, sessions, index = decode_snapshot(machine.snapshot())
    assert index == machine.applied_index
    assert encode_snapshot(state, sessions, index) == machine.snapshot()
    original, copy = machine.state.configured(), state.configured()
    for field in ("holder", "holder_priority", "reserver", "reserver_priority", "usable",
                  "free", "bad"):
        assert getattr(copy.cells, field) == getattr(original.cells, field), field
    for field in ("free_lists", "split", "bound_vc", "bound_root", "unbound", "demand"):
        assert getattr(copy.buddy, field) == getattr(original.buddy, field), field
    assert state.queue.keys == machine.state.queue.keys
    assert [index.contents() for index in copy.cells.indexes] == [
        index.contents() for index in original.cells.indexes]
    assert isinstance(sessions, Sessions) and sessions.table == machine.sessions.table


SCRIPT = """
from statemachine import Machine
from tests.statemachine.workload import workload_log
machine = Machine()
for entry in workload_log({seed}, {steps}):
    machine.apply(entry)
restored = Machine()
restored.restore(machine.snapshot())
print(machine.digest().hex(), restored.digest().hex())
"""


def test_the_digest_is_the_same_under_any_hash_seed() -> None:
    machine = Machine()
    for entry in workload_log(SEED, 150):
        machine.apply(entry)
    expected = machine.digest().hex()
    for hash_seed in ("0", "1", "4242"):
        output = subprocess.run(
            [sys.executable, "-c", SCRIPT.format(seed=SEED, steps=150)], cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)},
            capture_output=True, text=True, check=True).stdout.split()
        assert output == [expected, expected], hash_seed
