"""Every message SDPaxos replicas exchange, as typed frozen dataclasses.

Naming follows the paper: C-instances (a command leader replicates its clients' commands in its
own space), O-instances (the sequencer assigns global slots by proposing replica ids), and the
view change. Every message carries its sender and the sender's view; receivers gate on the view.

A C-instance's value is a `Batch`, a tuple of `Command`s; the empty batch is the no-op that
command-leader recovery writes where nothing was accepted. An O-instance's value is a replica id
or `NO_CL` (a hole the view change filled: no command leader, skipped by execution).

`check_message` validates what the codec cannot know: replica ids against the group size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any, ClassVar, NamedTuple

NO_CL = -1
NO_INDEX = -1


class Command(NamedTuple):
    """One client command. A NamedTuple rather than a dataclass: batches hold thousands, and
    building a frozen dataclass costs four times as much on the decode path."""

    origin: int  # the replica whose client proposed it, which hands back the result
    tag: int  # unique per origin: (epoch << 32) | counter
    payload: bytes


Batch = tuple[Command, ...]
NOOP: Batch = ()


@dataclass(frozen=True, slots=True)
class CEntry:
    """A C-instance as an acceptor reports it in a promise."""

    index: int
    ballot: int
    batch: Batch
    committed: bool


@dataclass(frozen=True, slots=True)
class OEntry:
    """An O-instance as a voter reports it: its value and the view it was accepted in."""

    index: int
    value: int
    view: int
    committed: bool


@dataclass(frozen=True, slots=True)
class FetchedC:
    """A committed C-instance sent to a replica that is catching up."""

    space: int
    index: int
    ballot: int
    batch: Batch


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """Consensus state at a snapshot: what was executed and how the O-log counted up to it."""

    slot: int  # first slot not covered by the snapshot
    exec_counts: tuple[int, ...]  # per space: C-instances executed
    o_counts: tuple[int, ...]  # per replica id: O-instances for it among slots [0, slot)
    dedup_low: tuple[int, ...]  # per origin: every tag below this was executed (Multi-Paxos)
    dedup_tags: tuple[tuple[int, ...], ...]  # per origin: executed tags at or above dedup_low


@dataclass(frozen=True, slots=True)
class Message:
    TAG: ClassVar[int] = 0
    sender: int
    view: int


# --- C-instances: Paxos per command leader's space ------------------------------------------


@dataclass(frozen=True, slots=True)
class CAccept(Message):
    TAG: ClassVar[int] = 10
    space: int
    index: int
    ballot: int
    batch: Batch


@dataclass(frozen=True, slots=True)
class CAck(Message):
    TAG: ClassVar[int] = 11
    space: int
    index: int
    ballot: int


@dataclass(frozen=True, slots=True)
class CNack(Message):
    """A C-accept or C-prepare refused: the acceptor promised `promised` for the space."""

    TAG: ClassVar[int] = 12
    space: int
    index: int
    promised: int


@dataclass(frozen=True, slots=True)
class CCommit(Message):
    """C(space, index) is chosen at `ballot`; `batch` is None when the receiver has it."""

    TAG: ClassVar[int] = 13
    space: int
    index: int
    ballot: int
    batch: Batch | None


@dataclass(frozen=True, slots=True)
class CRequest(Message):
    """To the sequencer: C(space, 0..index) exist; give each an O-instance (Fig. 5 l.13).
    `ballot`: the leader's, when it asked; the sequencer refuses a request below the ballot
    it promised for the space (one from before the leader's restart and retake)."""

    TAG: ClassVar[int] = 14
    space: int
    index: int
    ballot: int


@dataclass(frozen=True, slots=True)
class CPrepare(Message):
    """Phase 1 over a command leader's space from `from_index` on (recovery)."""

    TAG: ClassVar[int] = 15
    space: int
    from_index: int
    ballot: int


@dataclass(frozen=True, slots=True)
class CPromise(Message):
    TAG: ClassVar[int] = 16
    space: int
    from_index: int
    ballot: int
    log_base: int  # indexes below were executed and truncated here: not reported
    entries: tuple[CEntry, ...]
    max_index: int  # highest index of the space accepted here, or NO_INDEX
    # The serving sequencer's count of O-instances naming `space` in its view (every one it
    # allocated, committed or not), fixed by this promise; NO_INDEX from any other replica.
    ordered: int


# --- O-instances: the sequencer's assignment log ---------------------------------------------


@dataclass(frozen=True, slots=True)
class OAccept(Message):
    """The sequencer proposes O[start + k] = values[k]: a contiguous run (batched, and carrying
    every earlier entry the receiver has not been sent: the paper's piggybacking).

    It leaves before the sequencer's own acceptance is on disk, so that the sequencer's sync
    and the acceptors' run side by side; `durable_end` says how far the sequencer's acceptance
    in this view was durable when it was sent (its vote for every slot below), and an O-ack
    from the sequencer raises it once the run is persisted."""

    TAG: ClassVar[int] = 20
    start: int
    values: tuple[int, ...]
    durable_end: int


@dataclass(frozen=True, slots=True)
class OAck(Message):
    """The sender accepted O[start:end] in `view` (sent to the sequencer and the learners).
    From the sequencer itself it follows its O-accepts once they are persisted, and vouches for
    every slot below `end` (it persists its runs in order)."""

    TAG: ClassVar[int] = 21
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class OCommit(Message):
    """O[slots[k]] = values[k] is chosen. A fact, accepted whatever the view."""

    TAG: ClassVar[int] = 22
    slots: tuple[int, ...]
    values: tuple[int, ...]


# --- View change ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PreVoteRequest(Message):
    """Would the receiver vote for `view`? Asked before a candidacy, changing nothing, so a
    replica that was merely cut off or paused cannot disrupt a healthy sequencer.
    `current_view`: the view the asker is in; a receiver serving that view or a newer one
    relays its log to it (`NewViewRelay`)."""

    TAG: ClassVar[int] = 37
    current_view: int


@dataclass(frozen=True, slots=True)
class PreVote(Message):
    TAG: ClassVar[int] = 38
    granted: bool


@dataclass(frozen=True, slots=True)
class VoteRequest(Message):
    """A candidate asks for votes for `view` and, in the same round, O-prepares every
    O-instance from `from_index` on."""

    TAG: ClassVar[int] = 30
    from_index: int


@dataclass(frozen=True, slots=True)
class Vote(Message):
    TAG: ClassVar[int] = 31
    from_index: int
    log_base: int  # slots below were executed and truncated here: not reported
    entries: tuple[OEntry, ...]
    c_max_index: tuple[int, ...]  # per replica: highest C-index of its space accepted here
    installed_view: int  # the newest view whose rebuilt log the voter installed (OrderLog)
    installed_end: int  # and that log's end


@dataclass(frozen=True, slots=True)
class NewView(Message):
    """The new sequencer's rebuilt log from `start`, to be accepted in the new view, and how
    many slots each replica has in [0, end): a leader with more slots than C-instances must
    fill the surplus with no-ops before it proposes anything new."""

    TAG: ClassVar[int] = 32
    start: int
    values: tuple[int, ...]
    o_counts: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class NewViewRelay(Message):
    """The NewView of the sender's view, passed on by a replica that installed it to one that
    asked for pre-votes from an older or the same view: that one may have missed the log and
    may not hear its sequencer (a lost link). `commit_prefix`: how far the sender knows the
    view committed, which the asker settles up to before it proposes (as after a heartbeat)."""

    TAG: ClassVar[int] = 39
    start: int
    values: tuple[int, ...]
    o_counts: tuple[int, ...]
    commit_prefix: int


@dataclass(frozen=True, slots=True)
class ViewLogRequest(Message):
    """A replica serving `view` was asked for the view's log (a pre-vote it refused) and holds
    no copy, having restarted since it installed it: the sequencer sends its NewView again."""

    TAG: ClassVar[int] = 47


@dataclass(frozen=True, slots=True)
class NewViewAck(Message):
    TAG: ClassVar[int] = 33
    end: int


@dataclass(frozen=True, slots=True)
class Heartbeat(Message):
    """The sequencer is alive; `commit_prefix` lets laggards notice; answering with a
    LeaseGrant for `lease_round` grants it a read lease."""

    TAG: ClassVar[int] = 34
    commit_prefix: int
    lease_round: int


@dataclass(frozen=True, slots=True)
class LeaseGrant(Message):
    TAG: ClassVar[int] = 35
    lease_round: int


@dataclass(frozen=True, slots=True)
class Suspect(Message):
    """The sender finds the sequencer of `view` too slow (straggler detection)."""

    TAG: ClassVar[int] = 36


# --- Reads, forwarding, catch-up ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadIndexRequest(Message):
    """`read_id` names the read within the asker's life (`epoch`, one more at every restart):
    the driver numbers reads from 1 again after each start."""

    TAG: ClassVar[int] = 40
    read_id: int
    epoch: int


@dataclass(frozen=True, slots=True)
class ReadIndexReply(Message):
    """The read may run once slots [0, executed_upto) are executed here: every slot the
    sequencer had allocated when the request arrived (the paper's iG). NO_INDEX: refused (not
    the sequencer, or no lease)."""

    TAG: ClassVar[int] = 41
    read_id: int
    epoch: int  # the request's: a reply to a read of the asker's previous life is ignored
    executed_upto: int


@dataclass(frozen=True, slots=True)
class Forward(Message):
    """Multi-Paxos baseline: a replica hands its clients' commands to the sequencer."""

    TAG: ClassVar[int] = 42
    commands: Batch


@dataclass(frozen=True, slots=True)
class ReadyNotice(Message):
    """Multi-Paxos baseline: the sequencer tells the origin its commands are ready."""

    TAG: ClassVar[int] = 43
    tags: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class FetchRequest(Message):
    """A stalled replica asks for committed state from slot `exec_slot` on. While it receives
    this peer's snapshot taken at `snapshot_slot`, it holds its first `snapshot_offset` bytes
    and asks for what follows (both 0 otherwise)."""

    TAG: ClassVar[int] = 44
    exec_slot: int
    exec_counts: tuple[int, ...]
    snapshot_slot: int = 0
    snapshot_offset: int = 0


@dataclass(frozen=True, slots=True)
class FetchReply(Message):
    TAG: ClassVar[int] = 45
    o_start: int
    o_values: tuple[int, ...]  # committed O-instances from o_start
    c_entries: tuple[FetchedC, ...]  # committed C-instances the receiver lacks


@dataclass(frozen=True, slots=True)
class SnapshotChunk(Message):
    """Part of a snapshot for a replica behind the truncation point."""

    TAG: ClassVar[int] = 46
    meta: SnapshotMeta
    offset: int
    total_bytes: int
    state_digest: bytes  # blake2b-128 of the whole state, checked before installing
    data: bytes


# --- Rejoining after a lost disk (`consensus.rejoin`) ----------------------------------------


@dataclass(frozen=True, slots=True)
class RejoinQuery(Message):
    """A replica started over on an empty disk asks every other replica what it holds; the
    receiver first forgets every promise and vote it holds from the sender's past life.
    `nonce`: drawn afresh by each asking; the report names it, so an answer to an earlier
    asking (a slow one, queued for a life since lost) is never taken for a fresh one."""

    TAG: ClassVar[int] = 48
    nonce: int = 0


@dataclass(frozen=True, slots=True)
class RejoinReport(Message):
    """What the sender holds, for a replica that lost its disk: per space, the highest ballot
    it promised and the highest index it holds; one past the highest O-slot it holds; and the
    highest epoch it knows of the asker's command tags. `view` is the sender's view;
    `nonce` the query's it answers. `cleared`: False from a replica that lost its disk itself
    and does not yet know all its own lost life voted on: what it holds says too little."""

    TAG: ClassVar[int] = 49
    c_promised: tuple[int, ...]
    c_max_index: tuple[int, ...]
    o_end: int
    tag_epoch: int
    nonce: int
    cleared: bool = True


MESSAGE_TYPES: tuple[type[Message], ...] = (
    CAccept, CAck, CNack, CCommit, CRequest, CPrepare, CPromise,
    OAccept, OAck, OCommit,
    PreVoteRequest, PreVote, VoteRequest, Vote, NewView, NewViewRelay, ViewLogRequest,
    NewViewAck, Heartbeat, LeaseGrant, Suspect,
    ReadIndexRequest, ReadIndexReply, Forward, ReadyNotice, FetchRequest, FetchReply,
    SnapshotChunk, RejoinQuery, RejoinReport,
)

def check_message(message: Message, replica_count: int) -> str | None:
    """The reason `message` cannot be from a group of `replica_count`, or None if it can."""
    passes = _passes_by_class.get(type(message))
    if passes is None:
        passes = _passes_by_class[type(message)] = _compile_pass(type(message))
    if passes(message, replica_count):
        return None
    return check_message_fully(message, replica_count)


def check_message_fully(message: Message, replica_count: int) -> str | None:
    """`check_message` through the per-field checks, which name the fault."""
    reason = _check_fields(message, replica_count)
    if reason is None and (paired := _PAIRED.get(type(message))) is not None and \
            len(getattr(message, paired[0])) != len(getattr(message, paired[1])):
        reason = f"{paired[1]}: not one per {paired[2]}"
    return None if reason is None else f"{type(message).__name__}.{reason}"


# Fields of a class that go together item by item (the handlers zip them), and what one item
# of the first is called.
_PAIRED: dict[type, tuple[str, str, str]] = {OCommit: ("slots", "values", "slot")}


# Every message from a peer is checked, and most fields need no check: each class's checked
# fields and their checks are found once (on first use) and kept here.
_Check = Callable[[str, Any, int], str | None]
_checks_by_class: dict[type, tuple[tuple[str, _Check], ...]] = {}


def _check_fields(item: Any, replica_count: int) -> str | None:
    checks = _checks_by_class.get(type(item))
    if checks is None:
        checks = _checks_by_class[type(item)] = tuple(
            (field.name, _CHECKS[field.name]) for field in fields(item)
            if field.name in _CHECKS)
    for name, check in checks:
        reason = check(name, getattr(item, name), replica_count)
        if reason is not None:
            return reason
    return None


# Every message from a peer is checked, and nearly every one passes: each class gets, on first
# use, a function made from its checked fields that answers whether the message passes every
# check, the common checks inline, in one call (as `consensus.codec_compiled` makes decoders).
# It may only say False where a check fails or could not be run inline (a value of an
# unexpected type): `check_message_fully` then finds the reason, or None after all.
_Pass = Callable[[Any, int], bool]
_passes_by_class: dict[type, _Pass] = {}


def _compile_pass(cls: type) -> _Pass:
    namespace: dict[str, Any] = {"_origin": attrgetter("origin"), "_NO_CL": NO_CL,
                                 "_TAG_EPOCH_MAX": TAG_EPOCH_MAX}
    loads, conditions = [], []
    for position, field in enumerate(fields(cls)):
        check = _CHECKS.get(field.name)
        if check is None:
            continue
        assert field.name.isidentifier(), field.name
        loads.append(f"        v{position} = message.{field.name}\n")
        conditions.append(_inline_pass(check, f"v{position}", field.name, namespace))
    if (paired := _PAIRED.get(cls)) is not None:
        conditions.append(f"len(message.{paired[0]}) == len(message.{paired[1]})")
    source = ("def passes(message, n):\n    try:\n" + "".join(loads) +
              f"        return {' and '.join(conditions) or 'True'}\n"
              "    except TypeError:\n        return False\n")
    exec(source, namespace)  # noqa: S102 - made from field names, as dataclasses makes __init__
    passes: _Pass = namespace["passes"]
    passes.__qualname__ = f"passes({cls.__name__})"
    return passes


def _inline_pass(check: _Check, value: str, name: str, namespace: dict[str, Any]) -> str:
    """An expression true only where `check` finds nothing wrong with `value`."""
    if check is _replica:
        return f"(type({value}) is int and 0 <= {value} < n)"
    if check is _replica_or_none:
        return f"(type({value}) is int and _NO_CL <= {value} < n)"
    if check is _replica_ids:
        return (f"(type({value}) is tuple and (not {value} or "
                f"(_NO_CL <= min({value}) and max({value}) < n)))")
    if check is _one_per_replica:
        return f"(type({value}) is tuple and len({value}) == n)"
    if check is _tag_epoch:
        return f"(type({value}) is int and {value} <= _TAG_EPOCH_MAX)"
    if check is _command_origins:
        return (f"({value} is None or (type({value}) is tuple and (not {value} or "
                f"(0 <= min(map(_origin, {value})) and max(map(_origin, {value})) < n))))")
    namespace[f"_check_{name}"] = check  # nested items: through their own checks
    return f"_check_{name}({name!r}, {value}, n) is None"


def _replica(name: str, value: Any, replica_count: int) -> str | None:
    if isinstance(value, int) and not 0 <= value < replica_count:
        return f"{name}: replica {value} is not in [0, {replica_count})"
    return None


def _replica_or_none(name: str, value: Any, replica_count: int) -> str | None:
    if isinstance(value, int) and not NO_CL <= value < replica_count:
        return f"{name}: {value} is not a replica id"
    return None


def _replica_ids(name: str, value: Any, replica_count: int) -> str | None:
    if isinstance(value, tuple):
        bad = [item for item in value if not NO_CL <= item < replica_count]
        return f"{name}: {bad[0]} is not a replica id" if bad else None
    return None


def _one_per_replica(name: str, value: Any, replica_count: int) -> str | None:
    if isinstance(value, tuple) and len(value) != replica_count:
        return f"{name}: {len(value)} entries for {replica_count} replicas"
    return None


# An epoch a tag can still carry with room for many lives after it: a tag is a uint64 of
# (epoch << 32) | counter (`consensus.leader`).
TAG_EPOCH_MAX = (1 << 31) - 1


def _tag_epoch(name: str, value: Any, replica_count: int) -> str | None:
    if isinstance(value, int) and value > TAG_EPOCH_MAX:
        return f"{name}: {value} is past the highest epoch a command tag can carry"
    return None


def _command_origins(name: str, value: Any, replica_count: int) -> str | None:
    if isinstance(value, tuple) and value:
        origins = [command.origin for command in value]
        if not 0 <= min(origins) <= max(origins) < replica_count:
            return f"{name}: a command's origin is not a replica id"
    return None


def _nested(name: str, value: Any, replica_count: int) -> str | None:
    if value is None:
        return None
    for item in value if isinstance(value, tuple) else (value,):
        reason = _check_fields(item, replica_count)
        if reason is not None:
            return f"{name}.{reason}"
    return None


_CHECKS: dict[str, _Check] = {
    "sender": _replica, "space": _replica, "origin": _replica,
    "value": _replica_or_none, "values": _replica_ids, "o_values": _replica_ids,
    "c_max_index": _one_per_replica, "c_promised": _one_per_replica,
    "exec_counts": _one_per_replica, "o_counts": _one_per_replica,
    "dedup_low": _one_per_replica, "dedup_tags": _one_per_replica,
    "batch": _command_origins, "commands": _command_origins,
    "entries": _nested, "c_entries": _nested, "meta": _nested, "tag_epoch": _tag_epoch,
}
