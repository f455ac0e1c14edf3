"""Sequential specifications the checker holds a history against.

A model gives an initial state and, for each operation, a step: a pure function from a state to
the next state, or `ILLEGAL` when the operation could not have returned what it returned in that
state. States are immutable and hashable (the checker memoises on them). `compile` turns one
operation into its step once, before the search, so the search's inner loop is a single call.

Operations are read the Jepsen way: `input` is the invocation's value, `output` the value an `ok`
completion returned. An `info` operation's output is unknown and never compared. `fail`
operations never reach a model: they did not take effect.

Values compare by type as well as by value, as in JSON and EDN: `true` is not `1`, `2.0` is not
`2`. Python's `==` (and so a set) says they are equal, so a model never keeps a boolean or a
float bare in its state: `exact` wraps each in an `Exact` that equals only its own type, and
every comparison, and the search's memo of states, is type-strict for free.

A model may declare a partition (per key, for key-value): a split of the operations into parts
whose histories are linearizable together exactly when each one is (P-compositionality). The
checker never partitions a model that does not declare one.

- `register`: read and write on one value.
- `cas-register`: read, write and compare-and-set `[expected new]` on one value; an `ok` cas
  whose output is `false` is a compare that failed (it changed nothing).
- `kv`: get, put, append and cas per key, partitioned by key.
- `StateMachineModel`: any deterministic state machine behind consensus's `StateMachine`
  protocol, with snapshots as states; `gpu` is the GPU-allocation state machine through it.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import TypeAlias

from consensus.state_machine import StateMachine
from jepsen.errors import ModelError, ModelUnavailable
from jepsen.history import EventType, Exact, Operation, Value, exact, same_value
from statemachine.machine import Machine


class Illegal(enum.Enum):
    ILLEGAL = "illegal"


ILLEGAL = Illegal.ILLEGAL

State: TypeAlias = Hashable
Stepper: TypeAlias = Callable[[State], State | Illegal]


def _same(state: State) -> State:
    return state


def show(value: object) -> str:
    """A value the way the Jepsen tools print it: nil, numbers, "strings", [vectors]."""
    if isinstance(value, Exact):
        value = value.value
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, tuple):
        return "[" + " ".join(show(item) for item in value) + "]"
    return str(value)


@dataclass(frozen=True, slots=True)
class Part:
    """One independent part of a partitioned history, with the model that checks it."""

    label: str
    model: Model
    operations: tuple[Operation, ...]


class Model(abc.ABC):
    """A sequential specification. Subclasses implement `initial_state` and `compile`."""

    name: str = "model"

    @abc.abstractmethod
    def initial_state(self) -> State: ...

    @abc.abstractmethod
    def compile(self, operation: Operation) -> Stepper:
        """The step of one operation. Raises `ModelError` for an operation the model cannot
        interpret (an unknown function, a value of the wrong shape)."""

    def step(self, state: State, operation: Operation) -> State | Illegal:
        """One step, for callers outside the search (tests, reports)."""
        return self.compile(operation)(state)

    def is_read_only(self, operation: Operation) -> bool:
        """True when the operation changes no state, whatever the state: an `info` read-only
        operation tells nothing and the checker drops it; the failure search may drop others."""
        return False

    def partition(self, operations: Sequence[Operation]) -> list[Part] | None:
        """Independent parts, in a deterministic order; None when the model declares none."""
        return None

    def describe_state(self, state: State) -> str:
        return show(state)

    def describe_initial(self) -> str:
        return self.describe_state(self.initial_state())

    def describe_operation(self, operation: Operation) -> str:
        return describe_operation(operation)


def describe_operation(operation: Operation) -> str:
    """`write 3`, `read -> 3`, `read -> nil`, `cas [1 2] -> false`, `get "k" -> "x"`; `-> ?`
    when the outcome is unknown."""
    words = [operation.f]
    if operation.key is not None:
        words.append(show(operation.key))
    if operation.input is not None:
        words.append(show(operation.input))
    if operation.status is EventType.OK and (operation.input is None or (
            operation.output is not None and not same_value(operation.output, operation.input))):
        words.append("-> " + show(operation.output))
    elif operation.status is EventType.INFO:
        words.append("-> ?")
    elif operation.status is EventType.FAIL:
        words.append("(failed)")
    return " ".join(words)


def _filled_input(operation: Operation) -> Value:
    """The operation's arguments: Knossos fills an invocation's value from its `ok`
    completion (a write or cas invoked with nil), and so does every model here."""
    if operation.input is None and operation.is_ok and operation.f not in ("read", "get"):
        return operation.output
    return operation.input


def as_unknown_outcome(operation: Operation) -> Operation:
    """The same operation with its outcome unknown: it may or may not take effect. Its
    arguments stay what they were, also when they came from the completion."""
    return replace(operation, status=EventType.INFO, input=_filled_input(operation),
                   output=None)


def _cas_arguments(operation: Operation, arguments: Value) -> tuple[Value, Value]:
    if not isinstance(arguments, tuple) or len(arguments) != 2:
        raise ModelError(f"operation {operation.id}: cas takes [expected new], got "
                         f"{show(arguments)}", operation=operation.id)
    return arguments[0], arguments[1]


def _value_stepper(operation: Operation, functions: frozenset[str], model: str) -> Stepper:
    """The step of a read, write, append or cas on one value (a register, or one key)."""
    f = operation.f
    if f not in functions:
        raise ModelError(f"operation {operation.id}: the {model} model has no function {f!r} "
                         f"(it knows {', '.join(sorted(functions))})", operation=operation.id)
    known = operation.status is EventType.OK
    argument = _filled_input(operation)
    if f in ("read", "get"):
        if not known:
            return _same
        seen = exact(operation.output)
        return lambda state: state if state == seen else ILLEGAL
    if f in ("write", "put"):
        written = exact(argument)
        return lambda state: written
    if f == "append":
        suffix = argument
        if not isinstance(suffix, str):
            raise ModelError(f"operation {operation.id}: append takes a string, got "
                             f"{show(suffix)}", operation=operation.id)
        return lambda state: suffix if state is None else (
            state + suffix if isinstance(state, str) else ILLEGAL)
    expected, new = (exact(value) for value in _cas_arguments(operation, argument))
    if known and operation.output is False:
        return lambda state: state if state != expected else ILLEGAL
    return lambda state: new if state == expected else ILLEGAL


def _value_read_only(operation: Operation) -> bool:
    if operation.f in ("read", "get"):
        return True
    return operation.f == "cas" and operation.is_ok and operation.output is False


class RegisterModel(Model):
    """One value, read and written; with `cas=True`, also compare-and-set."""

    def __init__(self, initial: Value = None, *, cas: bool = False) -> None:
        self.initial = initial
        self.name = "cas-register" if cas else "register"
        self.functions = frozenset({"read", "write", "cas"} if cas else {"read", "write"})

    def initial_state(self) -> State:
        return exact(self.initial)

    def compile(self, operation: Operation) -> Stepper:
        if operation.key is not None:
            raise ModelError(f"operation {operation.id}: the {self.name} model holds one value, "
                             f"but this operation names key {show(operation.key)} (use kv)",
                             operation=operation.id)
        return _value_stepper(operation, self.functions, self.name)

    def is_read_only(self, operation: Operation) -> bool:
        return _value_read_only(operation)


KV_FUNCTIONS = frozenset({"get", "put", "append", "cas"})


def _key_order(key: Value) -> tuple[str, str]:
    return (type(key).__name__, show(key))


class KeyModel(Model):
    """One key of a key-value store: what each part of a partitioned `kv` history checks."""

    def __init__(self, key: Value, initial: Value) -> None:
        self.key = key
        self.initial = initial
        self.name = f"kv[{show(key)}]"

    def initial_state(self) -> State:
        return exact(self.initial)

    def compile(self, operation: Operation) -> Stepper:
        return _value_stepper(operation, KV_FUNCTIONS, "kv")

    def is_read_only(self, operation: Operation) -> bool:
        return _value_read_only(operation)


class KvModel(Model):
    """A map from keys to values: get, put, append (string concatenation) and cas per key.

    Every key starts at `initial` (None: absent; the Porcupine key-value logs start each key at
    the empty string). Partitioned by key unless `partitioned=False`, in which case the state is
    the whole map and the search is far slower: a tuple of values, one slot per key in the
    order compiling met them (a key past the end of the tuple still holds `initial`).
    """

    name = "kv"

    def __init__(self, initial: Value = None, *, partitioned: bool = True) -> None:
        self.initial = initial
        self.partitioned = partitioned
        self._slots: dict[State, int] = {}  # by `exact(key)`: key 1 is not key true
        self._keys: dict[State, Value] = {}  # each slot's key as the history has it

    def initial_state(self) -> State:
        return ()

    def compile(self, operation: Operation) -> Stepper:
        inner = _value_stepper(operation, KV_FUNCTIONS, self.name)
        key = exact(operation.key)
        slot = self._slots.setdefault(key, len(self._slots))
        self._keys.setdefault(key, operation.key)
        initial = exact(self.initial)

        def step(state: State) -> State | Illegal:
            assert isinstance(state, tuple)
            current = state[slot] if slot < len(state) else initial
            new = inner(current)
            if new is ILLEGAL:
                return ILLEGAL
            if new == current:
                return state
            if slot < len(state):
                return (*state[:slot], new, *state[slot + 1:])
            return (*state, *(initial,) * (slot - len(state)), new)

        return step

    def is_read_only(self, operation: Operation) -> bool:
        return _value_read_only(operation)

    def partition(self, operations: Sequence[Operation]) -> list[Part] | None:
        if not self.partitioned:
            return None
        by_key: dict[State, list[Operation]] = {}  # by `exact(key)`: key 1 is not key true
        for operation in operations:
            by_key.setdefault(exact(operation.key), []).append(operation)
        parts = [tuple(part) for part in by_key.values()]
        return [Part(f"key {show(part[0].key)}", KeyModel(part[0].key, self.initial), part)
                for part in sorted(parts, key=lambda part: _key_order(part[0].key))]

    def describe_state(self, state: State) -> str:
        assert isinstance(state, tuple)
        keys = sorted(self._slots, key=lambda key: _key_order(self._keys[key]))
        values = {self._keys[key]: state[self._slots[key]] for key in keys
                  if self._slots[key] < len(state)}
        return "{" + ", ".join(f"{show(key)} {show(value)}" for key, value in values.items()
                               if value != exact(self.initial)) + "}"

    def describe_initial(self) -> str:
        return f"{show(self.initial)} for every key"


@dataclass(frozen=True, slots=True, eq=False)
class Snapshot:
    """A state machine's state as the checker holds it: canonical bytes, keyed by digest."""

    digest: bytes
    data: bytes

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Snapshot) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)


def _hex_bytes(operation: Operation, value: Value, what: str) -> bytes:
    if not isinstance(value, str):
        raise ModelError(f"operation {operation.id}: {what} is a hex string, got {show(value)}",
                         operation=operation.id)
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise ModelError(f"operation {operation.id}: {what} is not hex: {show(value)}",
                         operation=operation.id) from None


class StateMachineModel(Model):
    """A deterministic state machine as a model: the state is a snapshot, a step restores a
    fresh machine from it, applies the command and compares the reply.

    Functions: `apply` (input: the command, output: the reply) and `query` (read-only), both as
    hex strings of the bytes the machine takes and returns. Declares no partition: the machine's
    commands may touch any part of its state.
    """

    def __init__(self, factory: Callable[[], StateMachine], *, name: str = "state-machine"
                 ) -> None:
        self.factory = factory
        self.name = name

    def _capture(self, machine: StateMachine) -> Snapshot:
        return Snapshot(machine.digest(), machine.snapshot())

    def initial_state(self) -> State:
        return self._capture(self.factory())

    def compile(self, operation: Operation) -> Stepper:
        if operation.f not in ("apply", "query"):
            raise ModelError(f"operation {operation.id}: the {self.name} model has no function "
                             f"{operation.f!r} (it knows apply, query)", operation=operation.id)
        request = _hex_bytes(operation, operation.input, f"the {operation.f} input")
        expected = (_hex_bytes(operation, operation.output, "the reply")
                    if operation.is_ok else None)
        if operation.f == "query" and expected is None:
            return _same
        factory, capture, is_apply = self.factory, self._capture, operation.f == "apply"

        def step(state: State) -> State | Illegal:
            assert isinstance(state, Snapshot)
            machine = factory()
            machine.restore(state.data)
            reply = machine.apply(request) if is_apply else machine.query(request)
            if expected is not None and reply != expected:
                return ILLEGAL
            return capture(machine) if is_apply else state

        return step

    def is_read_only(self, operation: Operation) -> bool:
        return operation.f == "query"

    def describe_state(self, state: State) -> str:
        assert isinstance(state, Snapshot)
        return f"snapshot {state.digest.hex()[:12]} ({len(state.data)} bytes)"


def gpu_model() -> Model:
    """The GPU-allocation state machine itself as a model: operations apply encoded envelopes
    (or run encoded queries) and must see the replies the real machine gives."""
    return StateMachineModel(Machine, name="gpu")


MODEL_NAMES: tuple[str, ...] = ("register", "cas-register", "kv", "gpu")


def model_named(name: str, initial: Value = None) -> Model:
    """The model a command line names, starting from `initial` (register and kv models)."""
    if name == "register":
        return RegisterModel(initial)
    if name == "cas-register":
        return RegisterModel(initial, cas=True)
    if name == "kv":
        return KvModel(initial)
    if name == "gpu":
        return gpu_model()
    raise ModelUnavailable(f"no model named {name!r} (models: {', '.join(MODEL_NAMES)})")
