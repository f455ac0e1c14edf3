"""Exactly-once client sessions (reference/hived.md 3.7), keyed by principal and session id.

Per session: the highest sequence applied, the reply bytes to it, a checksum of its command (its
body's length and crc32: it catches a client reusing a sequence by mistake, and a client that
forges a collision only confuses itself), and an expiry in logical time. A command whose
sequence equals the last one gets the cached reply and changes nothing (a retry), if it is the
same command: another body under that sequence is refused (SEQUENCE_REUSED; told the cached OK,
its client would take a command that never ran for applied); an older sequence is refused
(STALE_SEQUENCE: its reply is gone); a newer one is applied and its reply cached. Sessions are
keyed by the principal as well, so no client can read or replay another's replies. A session
idle for `ttl_ms` is forgotten on the next Tick (or, with no Ticks, when the table is full).
Sequence 0 means no session (the runtime's own Ticks).

A forgotten session must not let a late copy of one of its commands run again. A command opening
a session this table does not hold is therefore refused when it was stamped more than
`STAMP_WINDOW_MS` (half of `SESSION_TTL_MS_MIN`, limits.py: 300 s) before the machine's clock
("too_old"). Why that is enough: a session's expiry is fixed when its last command is recorded
at time L (`L + ttl`, under the policy of that moment, at least `SESSION_TTL_MS_MIN`), so a
forgotten session means a clock past L + 600 s. Every copy of any of its commands is stamped no
later than its client's first try plus `SENT_MS_SLACK_MS` (60 s, consensus/runtime/server.py),
however late it reaches a replica, and that first try came before L: at most L + 60 s plus the
skew between the client's and the replicas' clocks, so more than 300 s before the clock while
the skew is under 4 minutes. (A copy had been stamped when a replica read it: one delivered
minutes late passed for fresh.) The window is the floor's, not half the current policy's
lifetime: sessions recorded under a shorter lifetime keep their expiry when a new configuration
raises it, and half of a raised lifetime (1,800 s of 3,600 s) would let a copy of a command of
a session forgotten after 600 s open it again and run twice. Lowering the lifetime only keeps
some sessions longer.
A command that took more than 300 s from its stamp to its turn is refused too; its client gave
up on it after at most 45 s. The machine's clock is logical time (statemachine/logical_time.py:
the latest stamp it has seen, but no more than `STAMP_LEAD_MS_MAX` past the latest Tick's for
a command other than a Tick), so a sequencer whose clock jumps more than 300 s ahead (an NTP
step) makes new sessions that the others stamp look too old until their clocks catch up (any
replica, before the first Tick). And a full table refuses new sessions ("full") rather than
forget one that is still live.

A full table refuses every client's new sessions, so no one principal may hold more than
`SESSIONS_PER_PRINCIPAL_MAX` of them: one node agent opening session after session (each
command with a new session id, valid or not) took the whole table, and then locked every
other client, the administrators included, out of new sessions for as long as it went on.

The cached replies are bounded by their bytes too (`SESSION_REPLIES_BYTES_MAX`): one can be
large, and a table full of them would not fit a snapshot (the log would never be compacted
again). Past the bound, replies are dropped, those of the sessions that expire first first
(ties by key: an order the snapshot holds, so every replica drops the same), down to seven
eighths of it, so the sort is rare. The session itself stays, its sequence, checksum and
expiry with it, so nothing above changes: a retry of its last sequence is told "expired"
(SESSION_EXPIRED: it ran, its reply is gone, so its outcome is unknown), never run again.
"""

from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import dataclass

from consensus.envelope import Principal
from statemachine.limits import (
    SESSION_REPLIES_BYTES_MAX,
    SESSION_TTL_MS_MIN,
    SESSIONS_MAX,
    SESSIONS_PER_PRINCIPAL_MAX,
)

STAMP_WINDOW_MS = SESSION_TTL_MS_MIN // 2  # the oldest stamp that may open a session (docstring)


NO_CHECKSUM = -1  # a session restored from a snapshot of an earlier build: unknown
DROPPED = b""  # a reply dropped for the bound on bytes (no reply encodes to nothing)


@dataclass(slots=True, kw_only=True)
class Session:
    last_sequence: int
    reply: bytes
    expires_ms: int
    checksum: int = NO_CHECKSUM  # of the last command's body (`command_checksum`)


def command_checksum(body: bytes) -> int:
    return len(body) << 32 | zlib.crc32(body)


def session_key(principal: Principal, session: str) -> str:
    return f"{principal.text}/{session}"


def _owner(key: str) -> str:
    """The principal of a session key (a principal's text holds no "/")."""
    return key.partition("/")[0]


class Sessions:
    __slots__ = ("_held", "reply_bytes", "table")

    def __init__(self) -> None:
        self.table: dict[str, Session] = {}
        self._held: Counter[str] = Counter()  # sessions per principal, derived from the table
        self.reply_bytes = 0  # of the replies cached in the table, derived from it

    def lookup(self, key: str, sequence: int, stamp_ms: int, now_ms: int, checksum: int
               ) -> tuple[str, bytes]:
        """("new", b"") to apply; ("retry", reply) to answer from cache; ("stale", b""),
        ("reused", b""), ("expired", b""), ("too_old", b"") or ("full", b"") to refuse
        (module docstring)."""
        session = self.table.get(key)
        if session is not None:
            if sequence > session.last_sequence:
                return "new", b""
            if sequence == session.last_sequence:
                if session.checksum not in (checksum, NO_CHECKSUM):
                    return "reused", b""
                if session.reply == DROPPED:
                    return "expired", b""
                return "retry", session.reply
            return "stale", b""
        if stamp_ms < now_ms - STAMP_WINDOW_MS:
            return "too_old", b""
        owner = _owner(key)
        if self._full(owner) and (not self.expire(now_ms) or self._full(owner)):
            return "full", b""
        return "new", b""

    def _full(self, owner: str) -> bool:
        return (len(self.table) >= SESSIONS_MAX
                or self._held[owner] >= SESSIONS_PER_PRINCIPAL_MAX)

    def record(self, key: str, sequence: int, reply: bytes, expires_ms: int, checksum: int
               ) -> None:
        """Cache the reply to `sequence` (after "new" from `lookup`)."""
        session = self.table.get(key)
        if session is not None:
            self.advance(session, sequence, reply, expires_ms, checksum)
            return
        assert not self._full(_owner(key)), "lookup said the table had room"
        self.load(key, Session(last_sequence=sequence, reply=reply, expires_ms=expires_ms,
                               checksum=checksum))
        if self.reply_bytes > SESSION_REPLIES_BYTES_MAX:
            self._drop_replies(SESSION_REPLIES_BYTES_MAX - SESSION_REPLIES_BYTES_MAX // 8)

    def advance(self, session: Session, sequence: int, reply: bytes, expires_ms: int,
                checksum: int) -> None:
        """`record`, for a `session` the table holds, found by the caller: a sequence past its
        last is "new" whatever else holds (`lookup`), so a state machine that finds the
        session itself (most commands come in a session already open) needs neither call."""
        assert sequence > session.last_sequence
        self.reply_bytes += len(reply) - len(session.reply)
        session.last_sequence = sequence
        session.reply = reply
        session.expires_ms = expires_ms
        session.checksum = checksum
        if self.reply_bytes > SESSION_REPLIES_BYTES_MAX:
            self._drop_replies(SESSION_REPLIES_BYTES_MAX - SESSION_REPLIES_BYTES_MAX // 8)

    def load(self, key: str, session: Session) -> None:
        """Put `session` under `key` (from `record`, or from a snapshot being restored)."""
        old = self.table.get(key)
        if old is None:
            self._held[_owner(key)] += 1
        else:
            self.reply_bytes -= len(old.reply)
        self.table[key] = session
        self.reply_bytes += len(session.reply)

    def _drop_replies(self, target_bytes: int) -> None:
        """Drop cached replies, the sessions that expire first first (ties by key), until
        those left hold at most `target_bytes` (module docstring)."""
        holding = sorted((session.expires_ms, key) for key, session in self.table.items()
                         if session.reply != DROPPED)
        for _, key in holding:
            if self.reply_bytes <= target_bytes:
                return
            session = self.table[key]
            self.reply_bytes -= len(session.reply)
            session.reply = DROPPED

    def expire(self, now_ms: int) -> int:
        gone = sorted(name for name, session in self.table.items() if session.expires_ms < now_ms)
        for name in gone:
            self.reply_bytes -= len(self.table.pop(name).reply)
            owner = _owner(name)
            self._held[owner] -= 1
            if not self._held[owner]:
                del self._held[owner]
        return len(gone)
