"""Synthetic histories: concurrent clients on a simulated store, correct or deliberately broken.

For tests and benchmarks of the checker, not of Cellar: one seed gives one history. Clients
invoke operations; at a later step the store applies each one (its linearization point); later
still the client sees the reply. Between the steps the other clients interleave, so operations
overlap as they do against a real cluster. With `info_ppm`, a client gives up on an operation
(before or after the store applied it) and continues under a new process id, as Jepsen's do.

The store can be broken on purpose, which a checker must notice:
- `stale_read_ppm`: a read returns an older value of the key than the current one;
- `lost_write_ppm`: a write (put, append or successful cas) is acknowledged but never applied.

Workloads: `kv` (get, put, append, cas on many keys) and `cas-register` (read, write, cas on
one value, like Jepsen's etcd test). Values written are unique, as Jepsen's generators make them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from consensus.prng import Prng
from jepsen.history import Handle, History, HistoryRecorder, Value

WORKLOADS = ("kv", "cas-register")


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    kind: str = "kv"
    processes: int = 10
    operations: int = 1_000
    keys: int = 8
    info_ppm: int = 0
    stale_read_ppm: int = 0
    lost_write_ppm: int = 0

    def __post_init__(self) -> None:
        assert self.kind in WORKLOADS, self.kind
        assert self.processes >= 1
        assert self.keys >= 1


@dataclass(slots=True)
class _Pending:
    handle: Handle
    f: str
    key: Value
    argument: Value
    applied: bool = False
    reply: Value = None


@dataclass(slots=True)
class _Store:
    workload: Workload
    prng: Prng
    values: dict[Value, Value] = field(default_factory=dict)
    versions: dict[Value, list[Value]] = field(default_factory=dict)

    def _set(self, key: Value, value: Value) -> None:
        if self.prng.chance_ppm(self.workload.lost_write_ppm):
            return  # acknowledged, never applied
        self.values[key] = value
        self.versions.setdefault(key, [None]).append(value)

    def apply(self, f: str, key: Value, argument: Value) -> Value:
        """Apply one operation; the reply the client will see."""
        current = self.values.get(key)
        if f in ("get", "read"):
            history = self.versions.get(key, [None])
            if len(history) > 1 and self.prng.chance_ppm(self.workload.stale_read_ppm):
                return history[self.prng.below(len(history) - 1)]
            return current
        if f in ("put", "write"):
            self._set(key, argument)
            return argument
        if f == "append":
            assert isinstance(argument, str)
            self._set(key, argument if current is None else f"{current}{argument}")
            return argument
        assert f == "cas" and isinstance(argument, tuple)
        if current != argument[0]:
            return False
        self._set(key, argument[1])
        return True


def _choose(workload: Workload, prng: Prng, store: _Store, serial: int
            ) -> tuple[str, Value, Value]:
    """The next operation a client invokes: (function, key, argument)."""
    key: Value = f"k{prng.below(workload.keys)}" if workload.kind == "kv" else None
    roll = prng.below(100)
    if workload.kind == "kv":
        if roll < 40:
            return "get", key, None
        if roll < 60:
            return "put", key, f"p{serial}"
        if roll < 90:
            return "append", key, f" a{serial}"
        return "cas", key, (store.values.get(key), f"c{serial}")
    if roll < 50:
        return "read", key, None
    if roll < 75:
        return "write", key, serial
    return "cas", key, (store.values.get(key) if prng.below(2) else prng.below(serial + 1),
                        serial)


def _complete(recorder: HistoryRecorder, pending: _Pending) -> None:
    if pending.f in ("get", "read"):
        recorder.ok(pending.handle, pending.reply)
    elif pending.f == "cas":
        recorder.ok(pending.handle, None if pending.reply else False)
    else:
        recorder.ok(pending.handle, pending.argument)


def generate(workload: Workload, seed: int) -> History:
    """One history of `workload.operations` operations, deterministic in `seed`."""
    prng = Prng(seed)
    store = _Store(workload, prng)
    recorder = HistoryRecorder()
    processes = list(range(workload.processes))
    next_process = workload.processes
    pending: dict[int, _Pending] = {}
    invoked = 0
    while invoked < workload.operations or pending:
        slot = prng.below(len(processes))
        process = processes[slot]
        current = pending.get(process)
        if current is None:
            if invoked < workload.operations:
                f, key, argument = _choose(workload, prng, store, invoked)
                handle = recorder.invoke(process, f, argument, key=key)
                pending[process] = _Pending(handle, f, key, argument)
                invoked += 1
            continue
        if prng.chance_ppm(workload.info_ppm):  # the client gives up, not knowing
            if prng.below(2) and not current.applied:
                store.apply(current.f, current.key, current.argument)
            recorder.info(current.handle)
            del pending[process]
            processes[slot] = next_process
            next_process += 1
        elif not current.applied:
            current.reply = store.apply(current.f, current.key, current.argument)
            current.applied = True
        else:
            _complete(recorder, current)
            del pending[process]
    return recorder.history()
