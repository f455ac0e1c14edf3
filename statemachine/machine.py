"""`Machine`: the state machine as consensus sees it, bytes in and bytes out.

It implements `consensus.state_machine.StateMachine`. For each log entry, `apply` decodes the
envelope (the runtime vouches for the principal and stamped the time), answers a session retry
from the cache, decodes the body, hands the typed command to `statemachine.apply` (which
authorizes, moves logical time and applies atomically), expires sessions after a Tick, caches
the reply and returns it. Nothing a client sends can make it raise: every bad input is a rejection
reply. `admit_query` is the server's gate for queries: it refuses a query that does not
decode, and one its principal may not ask, and hands back the query the server is to run,
narrowed where the principal may see only part of what it asked (a node agent's whole-gang
query: its node's share, `authorization.narrowed`). `query` answers read-only queries; `snapshot`,
`restore` and `digest` cover the whole replicated state, sessions and applied index included.
"""

from __future__ import annotations

from consensus.codec import decode_envelope
from consensus.envelope import Envelope, Principal, Role
from consensus.errors import InvalidMessage, QueryRefused
from statemachine.apply import apply
from statemachine.authorization import narrowed, query_refusal
from statemachine.codec import decode_command
from statemachine.commands import Tick
from statemachine.context import Context
from statemachine.errors import Code, Rejection
from statemachine.logical_time import command_time
from statemachine.queries import answer
from statemachine.query_codec import decode_query, encode_answer, encode_typed_query
from statemachine.record_codec import DecodeError
from statemachine.result_codec import encode_result
from statemachine.results import Result
from statemachine.rules import EXACT_SCHEMA_VERSION, PLAIN_MSGPACK_REFUSALS, check_known
from statemachine.sessions import Sessions, command_checksum, session_key
from statemachine.snapshot_codec import decode_snapshot, digest_of, encode_snapshot
from statemachine.state import State


class Machine:
    __slots__ = ("applied_index", "sessions", "state")

    def __init__(self) -> None:
        self.state = State()
        self.sessions = Sessions()
        self.applied_index = 0

    def apply(self, command: bytes) -> bytes:
        self.applied_index += 1
        try:
            envelope = decode_envelope(command)
        except InvalidMessage as error:
            return encode_result(Rejection(code=Code.MALFORMED, message=error.reason))
        key = session_key(envelope.principal, envelope.session)
        ttl_ms = self.state.policy.session_ttl_ms  # fixed at recording: sessions.py says why
        # The time `apply` runs a command with a session at (the system's Ticks carry none).
        now_ms = command_time(self.state, envelope.now_ms, tick=False)
        if envelope.sequence > 0 and key not in self.sessions.table:
            # Opening a session may expire others by this clock: the machine keeps it, even
            # if the command is refused, or a late copy of a forgotten session's command
            # would be judged by a clock behind the one that forgot it, and open it again.
            self.state.now_ms = now_ms
        if envelope.sequence > 0:
            checksum = command_checksum(envelope.body)
            verdict, cached = self.sessions.lookup(key, envelope.sequence, envelope.now_ms,
                                                   now_ms, checksum)
            if verdict == "retry":
                return cached
            if verdict != "new":
                return encode_result(_session_refusal(verdict, envelope.sequence))
        reply = encode_result(self._run(envelope))
        if envelope.sequence > 0:
            self.sessions.record(key, envelope.sequence, reply, now_ms + ttl_ms, checksum)
        return reply

    def _run(self, envelope: Envelope) -> Result:
        try:
            command = decode_command(
                envelope.body, exact_version=self.state.rules_version >= EXACT_SCHEMA_VERSION)
        except DecodeError as error:
            if self.state.rules_version < PLAIN_MSGPACK_REFUSALS:
                return error.rejection_before  # the reply an older build cached for it
            return error.rejection
        result = apply(self.state, command,
                       Context(principal=envelope.principal, now_ms=envelope.now_ms))
        if isinstance(command, Tick) and envelope.principal.role is Role.SYSTEM:
            self.sessions.expire(self.state.now_ms)
        return result

    def admit_query(self, principal: Principal, query: bytes) -> bytes:
        """Implements consensus.state_machine.QueryGate: `query` as `principal` may ask it
        (the same bytes unless narrowed); QueryRefused, with why, for one it may not ask;
        InvalidMessage, with the decoder's reason, for a query that does not decode (a watch
        of one would hold its bytes at the replica for its whole wait only to be answered
        MALFORMED)."""
        try:
            decoded = decode_query(query)
        except DecodeError as error:
            raise InvalidMessage(f"not a query: {error.rejection.message}") from error
        admitted = narrowed(decoded, principal)
        refused = query_refusal(admitted, principal)
        if refused is not None:
            raise QueryRefused(refused)
        return query if admitted is decoded else encode_typed_query(admitted)

    def query(self, query: bytes) -> bytes:
        try:
            decoded = decode_query(query)
        except DecodeError as error:
            return encode_answer(error.rejection)
        return encode_answer(answer(self.state, decoded))

    def snapshot(self) -> bytes:
        return encode_snapshot(self.state, self.sessions, self.applied_index)

    def restore(self, snapshot: bytes) -> None:
        state, sessions, applied_index = decode_snapshot(snapshot)
        check_known(state.rules_version)  # a later build's state: stop, as its Tick would
        self.state, self.sessions, self.applied_index = state, sessions, applied_index

    def digest(self) -> bytes:
        return digest_of(self.snapshot())


def _session_refusal(verdict: str, sequence: int) -> Rejection:
    if verdict == "stale":
        return Rejection(code=Code.STALE_SEQUENCE,
                         message=f"sequence {sequence} is older than the last one applied")
    if verdict == "reused":
        return Rejection(code=Code.SEQUENCE_REUSED, message=(
            f"sequence {sequence} was applied to another command: not applied"))
    if verdict == "expired":
        return Rejection(code=Code.SESSION_EXPIRED, message=(
            f"sequence {sequence} was already run, but its reply is no longer kept (the "
            "session table's replies were over their bound in bytes): not run again, its "
            "outcome unknown"))
    if verdict == "too_old":
        return Rejection(code=Code.SESSION_TOO_OLD, message=(
            "the command was stamped too long ago to open a session (it may repeat one "
            "whose session was forgotten): not applied; use a new session"))
    return Rejection(code=Code.SESSIONS_FULL, message=(
        "the session table, or this principal's share of it, is full: not applied; retry "
        "once idle sessions expire"))

