"""A key-value state machine behind envelopes, with exactly-once sessions, for runtime tests."""

from __future__ import annotations

from consensus.codec import decode_envelope, pack, unpack
from consensus.errors import InvalidMessage
from jepsen.sim.kv import KvStateMachine


class SessionKv:
    """Implements consensus.state_machine.StateMachine."""

    def __init__(self) -> None:
        self.kv = KvStateMachine()
        self.sessions: dict[str, tuple[int, bytes]] = {}
        self.applied_bodies: list[bytes] = []

    def apply(self, command: bytes) -> bytes:
        try:
            envelope = decode_envelope(command)
        except InvalidMessage:
            return b"bad envelope"
        last = self.sessions.get(envelope.session)
        if envelope.sequence and last is not None and envelope.sequence <= last[0]:
            return last[1] if envelope.sequence == last[0] else b"stale"
        self.applied_bodies.append(envelope.body)
        reply = pack([str(envelope.principal), self.kv.apply(envelope.body)])
        if envelope.sequence:
            self.sessions[envelope.session] = (envelope.sequence, reply)
        return reply

    def query(self, query: bytes) -> bytes:
        return self.kv.query(query)

    def snapshot(self) -> bytes:
        return pack([self.kv.snapshot(), sorted([session, sequence, reply] for session,
                                               (sequence, reply) in self.sessions.items())])

    def restore(self, snapshot: bytes) -> None:
        kv, sessions = unpack(snapshot, bytes_max=1 << 30, what="snapshot")
        self.kv.restore(kv)
        self.sessions = {session: (sequence, reply) for session, sequence, reply in sessions}

    def digest(self) -> bytes:
        return self.kv.digest()
