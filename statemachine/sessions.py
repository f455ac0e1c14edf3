"""Exactly-once client sessions (reference/hived.md 3.7), keyed by principal and session id.

Per session: the highest sequence applied, the reply bytes to it, and an expiry in logical
time. A command whose sequence equals the last one gets the cached reply and changes nothing
(a retry); an older sequence is refused (STALE_SEQUENCE: its reply is gone); a newer one is
applied and its reply cached. Sessions are keyed by the principal as well, so no client can
read or replay another's replies. A session idle for `ttl_ms` is forgotten on the next Tick
(or, with no Ticks, when the table is full). Sequence 0 means no session (the runtime's own
Ticks).

A forgotten session must not let a late copy of one of its commands run again. A command
opening a session this table does not hold is therefore refused when it was stamped more
than `ttl_ms / 2` before the machine's clock ("too_old"): a copy of a command whose session
was forgotten was stamped at least `ttl_ms` before (its session idled that long since the
command ran), less the client's retry window. And a full table refuses new sessions ("full")
rather than forget one that is still live.
"""

from __future__ import annotations

from dataclasses import dataclass

from consensus.envelope import Principal
from statemachine.limits import SESSIONS_MAX


@dataclass(slots=True, kw_only=True)
class Session:
    last_sequence: int
    reply: bytes
    expires_ms: int


def session_key(principal: Principal, session: str) -> str:
    return f"{principal.text}/{session}"


class Sessions:
    __slots__ = ("table",)

    def __init__(self) -> None:
        self.table: dict[str, Session] = {}

    def lookup(self, key: str, sequence: int, stamp_ms: int, now_ms: int, ttl_ms: int
               ) -> tuple[str, bytes]:
        """("new", b"") to apply; ("retry", reply) to answer from cache; ("stale", b""),
        ("too_old", b"") or ("full", b"") to refuse (module docstring)."""
        session = self.table.get(key)
        if session is not None:
            if sequence > session.last_sequence:
                return "new", b""
            if sequence == session.last_sequence:
                return "retry", session.reply
            return "stale", b""
        if stamp_ms < now_ms - ttl_ms // 2:
            return "too_old", b""
        if len(self.table) >= SESSIONS_MAX and not self.expire(now_ms):
            return "full", b""
        return "new", b""

    def record(self, key: str, sequence: int, reply: bytes, expires_ms: int) -> None:
        """Cache the reply to `sequence` (after "new" from `lookup`)."""
        session = self.table.get(key)
        if session is None:
            assert len(self.table) < SESSIONS_MAX, "lookup said the table had room"
            self.table[key] = Session(last_sequence=sequence, reply=reply, expires_ms=expires_ms)
            return
        assert sequence > session.last_sequence
        session.last_sequence = sequence
        session.reply = reply
        session.expires_ms = expires_ms

    def expire(self, now_ms: int) -> int:
        gone = sorted(name for name, session in self.table.items() if session.expires_ms < now_ms)
        for name in gone:
            del self.table[name]
        return len(gone)
