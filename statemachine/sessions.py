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
command ran), less the client's retry window. That holds only while the lifetime is well over
twice the retry window: a policy's lifetime is at least `SESSION_TTL_MS_MIN` (limits.py), and a
client retries a command for at most `DEADLINE_S_MAX` (consensus/runtime/client.py). And a full
table refuses new sessions ("full") rather than forget one that is still live.

A full table refuses every client's new sessions, so no one principal may hold more than
`SESSIONS_PER_PRINCIPAL_MAX` of them: one node agent opening session after session (each
command with a new session id, valid or not) took the whole table, and then locked every
other client, the administrators included, out of new sessions for as long as it went on.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from consensus.envelope import Principal
from statemachine.limits import SESSIONS_MAX, SESSIONS_PER_PRINCIPAL_MAX


@dataclass(slots=True, kw_only=True)
class Session:
    last_sequence: int
    reply: bytes
    expires_ms: int


def session_key(principal: Principal, session: str) -> str:
    return f"{principal.text}/{session}"


def _owner(key: str) -> str:
    """The principal of a session key (a principal's text holds no "/")."""
    return key.partition("/")[0]


class Sessions:
    __slots__ = ("_held", "table")

    def __init__(self) -> None:
        self.table: dict[str, Session] = {}
        self._held: Counter[str] = Counter()  # sessions per principal, derived from the table

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
        owner = _owner(key)
        if self._full(owner) and (not self.expire(now_ms) or self._full(owner)):
            return "full", b""
        return "new", b""

    def _full(self, owner: str) -> bool:
        return (len(self.table) >= SESSIONS_MAX
                or self._held[owner] >= SESSIONS_PER_PRINCIPAL_MAX)

    def record(self, key: str, sequence: int, reply: bytes, expires_ms: int) -> None:
        """Cache the reply to `sequence` (after "new" from `lookup`)."""
        session = self.table.get(key)
        if session is None:
            assert not self._full(_owner(key)), "lookup said the table had room"
            self.load(key, Session(last_sequence=sequence, reply=reply, expires_ms=expires_ms))
            return
        assert sequence > session.last_sequence
        session.last_sequence = sequence
        session.reply = reply
        session.expires_ms = expires_ms

    def load(self, key: str, session: Session) -> None:
        """Put `session` under `key` (from `record`, or from a snapshot being restored)."""
        if key not in self.table:
            self._held[_owner(key)] += 1
        self.table[key] = session

    def expire(self, now_ms: int) -> int:
        gone = sorted(name for name, session in self.table.items() if session.expires_ms < now_ms)
        for name in gone:
            del self.table[name]
            owner = _owner(name)
            self._held[owner] -= 1
            if not self._held[owner]:
                del self._held[owner]
        return len(gone)
