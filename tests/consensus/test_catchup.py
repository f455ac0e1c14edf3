"""Serving a fetch: the catch-up reply's encoded frame stays within FETCH_REPLY_BYTES_MAX (the
peer mesh's default frame cap, which drops anything larger on every retry), and every reply
carries at least one instance when one is due, so rounds of fetches deliver everything.

Method: a replica's context holding committed O- and C-instances of many shapes (Hypothesis),
asked again and again from where the last reply left off, as a lagging replica would."""

from __future__ import annotations

from typing import cast

from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.catchup import (
    FETCH_REPLY_BYTES_MAX,
    O_VALUE_BYTES,
    REPLY_OVERHEAD_BYTES,
    CatchUp,
    fetched_bytes_max,
)
from consensus.codec import ENVELOPE_BYTES_MAX, encode_messages
from consensus.config import ReplicaConfig
from consensus.context import Context
from consensus.executor import Executor
from consensus.learner import Learner
from consensus.messages import NO_CL, Command, FetchedC, FetchReply, FetchRequest
from consensus.prng import Prng

LEADER = 1  # the command leader whose instances are fetched
TAG_MAX = (1 << 64) - 1  # the widest tag: the overhead bound must hold for it

# An instance: (commands, bytes per command's payload)
SHAPES = st.lists(st.tuples(st.integers(1, 300), st.integers(0, 600_000)).filter(
    lambda shape: shape[0] * shape[1] <= 1 << 21), min_size=1, max_size=40)


def serving(shapes: list[tuple[int, int]], *, gaps: bool = False) -> CatchUp:
    """Replica 0, whose O-log orders one instance of LEADER's per slot (with empty slots
    between them when `gaps`), each committed with a batch of the given shape."""
    ctx = Context(ReplicaConfig(replica_id=0, replica_count=3), Prng(0))
    slot = 0
    for index, (commands, payload_bytes) in enumerate(shapes):
        batch = tuple(Command(LEADER, TAG_MAX - k, b"p" * payload_bytes)
                      for k in range(commands))
        assert ctx.clog[LEADER].commit(index, 1, batch)
        if gaps:
            ctx.olog.commit(slot, NO_CL)
            slot += 1
        ctx.olog.commit(slot, LEADER)
        slot += 1
    # Only the context is used to serve a fetch.
    return CatchUp(ctx, cast(Executor, None), cast(Learner, None))


def fetch(catchup: CatchUp, exec_slot: int, counts: tuple[int, ...]) -> tuple[FetchReply, int]:
    """The reply to a fetch from (exec_slot, counts), and its encoded frame's size."""
    catchup.on_request(FetchRequest(2, 0, exec_slot, counts))
    sent = catchup._ctx.outbox.drain().messages
    assert len(sent) == 1
    to, reply = sent[0]
    assert to == 2 and isinstance(reply, FetchReply)
    return reply, len(encode_messages([reply]))


def fetch_all(shapes: list[tuple[int, int]], *, gaps: bool = False) -> list[FetchedC]:
    """Fetch until everything came, checking each reply's frame; returns the instances, in
    order. The receiver executes slots while it holds their instance, and asks again from the
    first it cannot execute."""
    catchup = serving(shapes, gaps=gaps)
    ordered: dict[int, int] = {}  # slot -> value, as the replies said
    held: dict[int, FetchedC] = {}  # LEADER's instances received, by index
    exec_slot, executed = 0, 0
    while exec_slot < catchup._ctx.olog.commit_prefix:
        reply, frame_bytes = fetch(catchup, exec_slot, (0, executed, 0))
        assert frame_bytes <= FETCH_REPLY_BYTES_MAX
        assert reply.c_entries, "a reply must make progress"
        ordered.update((reply.o_start + offset, value)
                       for offset, value in enumerate(reply.o_values))
        held.update((entry.index, entry) for entry in reply.c_entries)
        while exec_slot in ordered and (ordered[exec_slot] == NO_CL or executed in held):
            executed += ordered[exec_slot] == LEADER
            exec_slot += 1
    return [held[index] for index in range(executed)]


@settings(max_examples=60)
@given(SHAPES, st.booleans())
def test_every_reply_fits_the_frame_cap_and_progresses(shapes: list[tuple[int, int]],
                                                       gaps: bool) -> None:
    got = fetch_all(shapes, gaps=gaps)
    assert [len(entry.batch) for entry in got] == [commands for commands, _ in shapes]


def test_the_shapes_that_overflowed_the_old_rule_fit() -> None:
    """Payload-only counting let these reach 9.04 MB and 8.39 MB frames: over the 8 MiB cap,
    dropped by the mesh on every retry."""
    for shapes in ([(200, 4096)] * 12, [(1, 1 << 19)] * 17, [(1024, 110)] * 70):
        catchup = serving(shapes)
        reply, frame_bytes = fetch(catchup, 0, (0, 0, 0))
        assert frame_bytes <= FETCH_REPLY_BYTES_MAX
        assert frame_bytes > FETCH_REPLY_BYTES_MAX * 3 // 4  # and the budget is used
        assert 0 < len(reply.c_entries) < len(shapes)


@settings(max_examples=100)
@given(st.lists(st.integers(0, 5000), min_size=1, max_size=50), st.integers(0, TAG_MAX))
def test_the_overhead_bound_is_an_upper_bound(payloads: list[int], tag: int) -> None:
    batch = tuple(Command(LEADER, tag, b"q" * size) for size in payloads)
    reply = FetchReply(2, (1 << 63) - 1, (1 << 63) - 1, (LEADER,),
                       (FetchedC(LEADER, (1 << 63) - 1, (1 << 63) - 1, batch),))
    assert len(encode_messages([reply])) <= \
        REPLY_OVERHEAD_BYTES + O_VALUE_BYTES + fetched_bytes_max(batch)


def test_the_largest_instance_fits_a_reply_alone() -> None:
    """An instance holds at most batch_bytes_max bytes of commands (batch_commands_max of
    them), or one command of at most ENVELOPE_BYTES_MAX: either fits a reply many times."""
    config = ReplicaConfig(replica_id=0, replica_count=3)
    per_command = config.batch_bytes_max // config.batch_commands_max
    full_batch = tuple(Command(LEADER, TAG_MAX, b"c" * per_command)
                       for _ in range(config.batch_commands_max))
    lone = (Command(LEADER, TAG_MAX, b"c" * ENVELOPE_BYTES_MAX),)
    for batch in (full_batch, lone):
        assert REPLY_OVERHEAD_BYTES + O_VALUE_BYTES + fetched_bytes_max(batch) < \
            FETCH_REPLY_BYTES_MAX // 4
