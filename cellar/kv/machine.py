"""The key-value state machine: puts and linearizable gets of byte strings, exactly once.

A command is one put, or several (PUTS: a client's batch of its callers' puts), applied in
order, each refused alone when the store is full; a batch is one command of its session, so a
retry of it changes nothing and gets the same reply.

Each command arrives in an envelope with the client's session and sequence; a retried sequence
gets its cached reply and changes nothing (the GPU store's `Sessions` table does that work here
too). Gets are queries, answered by the runtime at the read index. Deterministic: the state is
a dict (insertion-ordered), the snapshot sorts it, and no clock is read.
"""

from __future__ import annotations

import hashlib

from cellar.kv.codec import (
    DATA_BYTES_MAX,
    ITEM_OVERHEAD_BYTES,
    KEYS_MAX,
    OK_REPLY,
    PUTS_PREFIX,
    Code,
    Operation,
    decode_puts_fields,
    decode_request,
    decode_snapshot,
    encode_puts_reply,
    encode_reply,
    encode_snapshot,
)
from consensus.codec import decode_envelope_fields
from consensus.errors import InvalidMessage
from statemachine.sessions import Session, Sessions, command_checksum, session_key

SESSION_TTL_MS = 10 * 60 * 1000
_STORE_FULL_REPLY = encode_reply(Code.STORE_FULL)
_REFUSALS = {"stale": Code.STALE_SEQUENCE, "too_old": Code.SESSION_TOO_OLD,
             "full": Code.SESSIONS_FULL, "reused": Code.SEQUENCE_REUSED,
             "expired": Code.SESSION_EXPIRED}


class KvMachine:
    """Implements consensus.state_machine.StateMachine."""

    __slots__ = ("data", "data_bytes", "now_ms", "sessions")

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.data_bytes = 0  # of the items in `data`, framing counted: at most DATA_BYTES_MAX
        self.sessions = Sessions()
        self.now_ms = 0  # the latest proposer's stamp applied: the sessions' clock

    def apply(self, command: bytes) -> bytes:
        # Every replica applies every command: its envelope's fields are read as a tuple, no
        # Envelope built (consensus/codec.py), and a command without a session (sequence 0)
        # skips the table.
        try:
            principal, session, sequence, stamp_ms, body = decode_envelope_fields(command)
            batched = body.startswith(PUTS_PREFIX)
            if batched:
                keys, values = decode_puts_fields(body)
            else:
                operation, key, value = decode_request(body)
                if operation is not Operation.PUT:
                    return encode_reply(Code.BAD_REQUEST)
                keys, values = [key], [value]
        except InvalidMessage:
            return encode_reply(Code.BAD_REQUEST)
        if not sequence:
            self.now_ms = max(self.now_ms, stamp_ms)
            return self._puts(keys, values, batched)
        sessions = self.sessions
        name = session_key(principal, session)
        now_ms = self.now_ms if self.now_ms > stamp_ms else stamp_ms  # max, with no call
        checksum = command_checksum(body)
        held = sessions.table.get(name)
        if held is None or sequence <= held.last_sequence:
            # Not the session's next command (most are, and skip Sessions.lookup: its verdict
            # on a sequence past a held session's last is "new" whatever else holds).
            if held is None:
                # Opening a session may expire others by this clock: the machine keeps it,
                # even if the command is refused, or a late copy of a forgotten session's
                # command would be judged by a clock behind the one that forgot it, and open
                # it again.
                self.now_ms = now_ms
            verdict, cached = sessions.lookup(name, sequence, stamp_ms, now_ms, checksum)
            if verdict == "retry":
                return cached
            if verdict != "new":
                return encode_reply(_REFUSALS[verdict])
        self.now_ms = now_ms
        reply = self._puts(keys, values, batched)
        # a refusal too: a retry of it gets the same answer
        if held is None:
            sessions.record(name, sequence, reply, now_ms + SESSION_TTL_MS, checksum)
        else:  # the session's next command: `record`, its session already found
            sessions.advance(held, sequence, reply, now_ms + SESSION_TTL_MS, checksum)
        return reply

    def _puts(self, keys: list[bytes], values: list[bytes], batched: bool) -> bytes:
        """Apply the puts in order; the reply: a PUTS's code for each put, or a single put's."""
        if not batched:
            return self._put(keys[0], values[0])
        batch = dict(zip(keys, values, strict=True))
        if len(batch) == len(keys) and self._stored_all(batch):
            return OK_REPLY
        stored = self._stored
        return encode_puts_reply([Code.OK if stored(key, value) else Code.STORE_FULL
                                  for key, value in zip(keys, values, strict=True)])

    def _stored_all(self, batch: dict[bytes, bytes]) -> bool:
        """Store every put of `batch` (its keys distinct) at once where the store holds them
        all whatever their order; else change nothing and say so (the puts then go one by
        one, each refused alone). The bound counts each value whole, as if no key held one:
        no put of the batch can then pass it, before or after the others."""
        data = self.data
        olds = list(map(data.get, batch))
        new_keys = olds.count(None)
        added = sum(map(len, batch.values()))
        if new_keys:
            added += sum(len(key) for key, old in zip(batch, olds, strict=True) if old is None) \
                + new_keys * ITEM_OVERHEAD_BYTES
        if len(data) + new_keys > KEYS_MAX or self.data_bytes + added > DATA_BYTES_MAX:
            return False
        data.update(batch)
        self.data_bytes += added - sum(map(len, filter(None, olds)))
        return True

    def _put(self, key: bytes, value: bytes) -> bytes:
        return OK_REPLY if self._stored(key, value) else _STORE_FULL_REPLY

    def _stored(self, key: bytes, value: bytes) -> bool:
        """Whether `value` is now under `key`: False when the store is full for it."""
        old = self.data.get(key)
        if old is not None:
            grown = len(value) - len(old)
        elif len(self.data) >= KEYS_MAX:
            return False
        else:
            grown = len(key) + len(value) + ITEM_OVERHEAD_BYTES
        if self.data_bytes + grown > DATA_BYTES_MAX:
            return False
        self.data[key] = value
        self.data_bytes += grown
        return True

    def query(self, query: bytes) -> bytes:
        try:
            operation, key, _ = decode_request(query)
        except InvalidMessage:
            return encode_reply(Code.BAD_REQUEST)
        if operation is not Operation.GET:
            return encode_reply(Code.BAD_REQUEST)
        return encode_reply(Code.OK, self.data.get(key))

    def snapshot(self) -> bytes:
        sessions = [(name, session.last_sequence, session.reply, session.expires_ms,
                     session.checksum) for name, session in self.sessions.table.items()]
        return encode_snapshot(self.data, sessions, self.now_ms)

    def restore(self, snapshot: bytes) -> None:
        data, sessions, self.now_ms = decode_snapshot(snapshot)
        self.data = data
        self.data_bytes = sum(len(key) + len(value) + ITEM_OVERHEAD_BYTES
                              for key, value in data.items())
        self.sessions = Sessions()
        for name, sequence, reply, expires_ms, checksum in sessions:
            # load, not record: a snapshot taken before the per-principal cap may exceed it
            self.sessions.load(name, Session(last_sequence=sequence, reply=reply,
                                             expires_ms=expires_ms, checksum=checksum))

    def digest(self) -> bytes:
        return hashlib.blake2b(self.snapshot(), digest_size=16).digest()
