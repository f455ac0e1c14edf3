"""A small replicated key-value store: the state machine the simulator's clients exercise.

Commands: put(key, value) and cas(key, expected, new); reads go through the linearizable read
path as get(key) queries. Replies say whether the command took effect and the value read. A
malformed command is rejected with a reply, never an exception.

The store also remembers whether each of its last `CAS_OUTCOMES_MAX` cas commands took effect,
in its snapshots too: a replica that learns its own client's cas from a peer's snapshot (it
never applied the command itself) still answers the client, as the runtime's client sessions
do. The workload writes every value once, so a cas's new value names the command.
"""

from __future__ import annotations

import hashlib

from consensus.errors import InvalidMessage
from jepsen.sim.kv_codec import decode_command, decode_snapshot, encode_reply, encode_snapshot

CAS_OUTCOMES_MAX = 1024  # cas outcomes remembered, the oldest forgotten first


class KvStateMachine:
    """Implements consensus.state_machine.StateMachine."""

    __slots__ = ("applied", "cas_outcomes", "data")

    def __init__(self) -> None:
        self.data: dict[str, int] = {}
        self.cas_outcomes: dict[int, bool] = {}  # a cas's new value: whether it took effect
        self.applied = 0

    def apply(self, command: bytes) -> bytes:
        self.applied += 1
        try:
            operation, key, first, second = decode_command(command)
        except InvalidMessage:
            return encode_reply(False, None)
        if operation == "put" and first is not None:
            self.data[key] = first
            return encode_reply(True, first)
        if operation == "cas" and second is not None:
            current = self.data.get(key)
            self._remember(second, current == first)
            if current != first:
                return encode_reply(False, current)
            self.data[key] = second
            return encode_reply(True, second)
        return encode_reply(False, None)

    def _remember(self, new_value: int, took_effect: bool) -> None:
        outcomes = self.cas_outcomes
        outcomes.pop(new_value, None)  # a repeated value counts as the newest
        outcomes[new_value] = took_effect
        if len(outcomes) > CAS_OUTCOMES_MAX:
            del outcomes[next(iter(outcomes))]

    def query(self, query: bytes) -> bytes:
        try:
            operation, key, _, _ = decode_command(query)
        except InvalidMessage:
            return encode_reply(False, None)
        if operation != "get":
            return encode_reply(False, None)
        return encode_reply(True, self.data.get(key))

    def snapshot(self) -> bytes:
        return encode_snapshot(sorted(self.data.items()), list(self.cas_outcomes.items()))

    def restore(self, snapshot: bytes) -> None:
        self.data, self.cas_outcomes = decode_snapshot(snapshot, CAS_OUTCOMES_MAX)

    def digest(self) -> bytes:
        return hashlib.blake2b(self.snapshot(), digest_size=16).digest()
