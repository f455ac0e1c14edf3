"""A small replicated key-value store: the state machine the simulator's clients exercise.

Commands: put(key, value) and cas(key, expected, new); reads go through the linearizable read
path as get(key) queries. Replies say whether the command took effect and the value read. A
malformed command is rejected with a reply, never an exception.
"""

from __future__ import annotations

import hashlib

from consensus.errors import InvalidMessage
from jepsen.sim.kv_codec import decode_command, decode_snapshot, encode_reply, encode_snapshot


class KvStateMachine:
    """Implements consensus.state_machine.StateMachine."""

    __slots__ = ("applied", "data")

    def __init__(self) -> None:
        self.data: dict[str, int] = {}
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
            if current != first:
                return encode_reply(False, current)
            self.data[key] = second
            return encode_reply(True, second)
        return encode_reply(False, None)

    def query(self, query: bytes) -> bytes:
        try:
            operation, key, _, _ = decode_command(query)
        except InvalidMessage:
            return encode_reply(False, None)
        if operation != "get":
            return encode_reply(False, None)
        return encode_reply(True, self.data.get(key))

    def snapshot(self) -> bytes:
        return encode_snapshot(sorted(self.data.items()))

    def restore(self, snapshot: bytes) -> None:
        self.data = decode_snapshot(snapshot)

    def digest(self) -> bytes:
        return hashlib.blake2b(self.snapshot(), digest_size=16).digest()
