"""A life may go on into new epochs (all 2**32 tags of one used: `Leader._new_epoch`): the new
epoch's record must be on disk before any of its tags leaves, in a C-accept or a forward, even
when the epoch begins between a Ready and its `advance` (which had marked it durable at once);
and a read asked in the epoch before is still answered by its reply (it had been dropped as a
read of an earlier life, and asked again a resend period later)."""

from __future__ import annotations

from consensus.config import Mode, ReplicaConfig
from consensus.leader import TAG_COUNTER_BITS
from consensus.messages import CAccept, Forward
from consensus.prng import Prng
from consensus.records import EpochRecord
from consensus.replica import Replica
from tests.consensus.stepper import Stepper
from tests.consensus.test_multipaxos_forwarding import _multipaxos


def test_new_epoch_begun_between_ready_and_advance_still_gates_c_accepts() -> None:
    """A driver (the simulator does) may hand the core a proposal while the last Ready's
    sync runs, between `ready()` and `advance()`. The proposal that exhausts the tag counter
    starts a new epoch (EpochRecord, epoch_durable = False); `advance()` of the *earlier*
    Ready then sets epoch_durable = True though the EpochRecord is only in the next Ready,
    so that Ready's C-accepts leave before the record is synced. A crash then restarts in
    the same epoch and hands out the tags already sent for other commands."""
    config = ReplicaConfig(replica_id=1, replica_count=3)
    replica = Replica(config, Prng(1))
    replica._leader._counter = (1 << TAG_COUNTER_BITS) - 1
    replica.propose(b"last")
    first_ready = replica.ready()  # handed to the driver, syncing
    assert first_ready.records
    first = replica.propose(b"next epoch")  # arrives during the sync
    assert first == 1 << TAG_COUNTER_BITS
    replica.advance()  # the first Ready is durable: not the EpochRecord
    ready = replica.ready()
    assert EpochRecord(1) in ready.records
    early = [m for _, m in ready.messages if isinstance(m, CAccept)]
    assert not early, "C-accepts carrying the new epoch's tags leave before its record syncs"


def test_multipaxos_forward_of_a_new_epochs_tags_waits_for_its_record() -> None:
    """Multi-Paxos baseline: a follower's commands leave as Forwards, not C-accepts, so the
    `_send_accept` gate on `epoch_durable` does not cover them. The first command of a new
    epoch is forwarded (and may be proposed and run by the sequencer) before its EpochRecord
    is synced: a crash then restarts in the same epoch and reuses the tag for another
    command, which every executor drops as a repeat."""
    cluster = _multipaxos(3)
    follower = cluster.node(1)
    assert not follower.inspect.is_sequencer
    follower._leader._counter = 1 << TAG_COUNTER_BITS  # exhausted: the next starts epoch 1
    tag = follower.propose(b"first of epoch 1")
    assert tag >> TAG_COUNTER_BITS == follower._ctx.epoch
    ready = follower.ready()
    assert EpochRecord(follower._ctx.epoch) in ready.records
    assert cluster.configs[1].mode is Mode.MULTIPAXOS
    early = [m for _, m in ready.messages if isinstance(m, Forward)]
    assert not early, "a Forward with the new epoch's tag leaves before its record syncs"


def test_a_read_in_flight_across_a_new_epoch_is_answered_without_a_resend() -> None:
    """A read asked in epoch E whose reply comes back after the tag counter started epoch
    E + 1 (mid-life: `_new_epoch`) is ignored as "a read of an earlier life" (`Reads.on_reply`
    compares the reply's epoch with ctx.epoch), though it is this life's read: it waits a
    whole resend period and is asked again. (Before the mid-life epoch, ctx.epoch changed only
    at a restart, where the pending reads are gone anyway.)"""
    cluster = Stepper(3)
    for _ in range(20):
        cluster.round()
    reader = cluster.node(1)
    assert not reader.inspect.is_sequencer
    reader.read(7)
    cluster.process(1)  # the ReadIndexRequest (epoch E) is queued
    reader._leader._counter = 1 << TAG_COUNTER_BITS
    reader.propose(b"first of the next epoch")  # ctx.epoch moves to E + 1
    for _ in range(3):  # no ticks: only the request, its reply, and the write's messages
        cluster.process_all()
        cluster.deliver()
    cluster.process_all()
    assert 7 in [read_id for read_id, _ in cluster.reads[1]], \
        "the reply to this life's read was dropped as one of an earlier life"
