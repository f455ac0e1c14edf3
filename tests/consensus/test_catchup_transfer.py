"""A snapshot's transfer in windows of chunks survives a lost chunk in its last window and a
late copy of its first chunk without starting over."""

from __future__ import annotations

from consensus.messages import FetchRequest, SnapshotChunk
from consensus.prng import Prng
from consensus.records import SnapshotRecord
from consensus.replica import Replica
from tests.consensus.test_replica import (
    SNAPSHOT_META,
    WINDOWED_STATE,
    _transfer_windowed_snapshot,
    _windowed,
)


def test_a_chunk_lost_in_the_last_window_does_not_restart_the_transfer() -> None:
    """WINDOWED_STATE is 40 bytes in windows of 8 (chunks of 4). The server forgets the
    transfer as soon as it *sends* the last window; if the last chunk of that window is lost,
    the laggard asks again from byte 36 and the server, no longer serving it, answers with the
    latest snapshot from byte 0: the laggard starts over. A large snapshot under loss (or one
    that the server compacts past meanwhile) is then re-sent whole for every loss in its last
    window."""
    starts: list[int] = []
    dropped: list[int] = []

    def delivered(server: Replica, sent: list[SnapshotChunk]) -> list[SnapshotChunk]:
        if sent:
            starts.append(sent[0].offset)
        kept = []
        for message in sent:
            if message.offset == 36 and not dropped:
                dropped.append(message.offset)  # lost once
                continue
            kept.append(message)
        return kept

    _transfer_windowed_snapshot(delivered=delivered)
    assert dropped == [36]
    assert 0 not in starts[1:], starts  # resumed from byte 36, never back to the start


def test_a_late_duplicate_of_the_first_chunk_does_not_throw_away_what_was_received() -> None:
    """A copy of the transfer's first chunk (offset 0) that arrives late (a duplicated frame, or
    the answer to an earlier fetch of the same sender) matches the transfer under way but not
    its offset, and restarts it: every byte received so far is dropped and asked for again."""
    fetched: list[int] = []
    first: list[SnapshotChunk] = []

    def fetch_passes(target: int, offset: int) -> bool:
        fetched.append(offset)
        return target == 0

    def delivered(server: Replica, sent: list[SnapshotChunk]) -> list[SnapshotChunk]:
        if sent and sent[0].offset == 0 and not first:
            first.append(sent[0])
        if sent and sent[0].offset == 24 and len(first) == 1:
            first.append(sent[0])
            return [first[0], *sent]  # the late copy of byte 0 arrives first (once)
        return sent

    _transfer_windowed_snapshot(fetch_passes=fetch_passes, delivered=delivered)
    assert fetched == sorted(fetched), fetched  # never asked again for bytes it had


def test_a_sender_that_forgot_the_transfer_resumes_it_from_where_it_stopped() -> None:
    """The sender restarts (or the transfer idled) mid-way and no longer knows it; its latest
    snapshot is still the one the laggard asks for, from byte 16: it is sent from there, not
    from the first byte (the laggard, holding 16 bytes of the same transfer, had ignored a new
    start at byte 0 until it gave the transfer up)."""
    starts: list[int] = []

    def delivered(server: Replica, sent: list[SnapshotChunk]) -> list[SnapshotChunk]:
        if sent:
            starts.append(sent[0].offset)
            if sent[0].offset == 8:
                server._catchup._serving.clear()  # what a restart forgets
        return sent

    _transfer_windowed_snapshot(delivered=delivered)
    assert starts[:3] == [0, 8, 16], starts
    assert 0 not in starts[1:], starts


def test_copies_of_a_fetch_arriving_together_get_one_window() -> None:
    """A laggard asks every repair period; on a link that was down its fetches queue and then
    arrive together. Each had been answered with a whole window (8 MiB each in a replica's
    defaults: a dozen of them overflow the peer link's 64 MiB queue). One window goes per
    repair period; a fetch a repair period later (a chunk was lost) is answered again."""
    server = Replica.restore(_windowed(0), Prng(0), [SnapshotRecord(SNAPSHOT_META,
                                                                    WINDOWED_STATE)])
    server.ready()
    server.advance()

    def chunks_sent(*fetches: FetchRequest) -> list[int]:
        for fetch in fetches:
            server.step(fetch)
        ready = server.ready()
        server.advance()
        return [message.offset for _, message in ready.messages
                if isinstance(message, SnapshotChunk)]

    fresh = FetchRequest(2, 0, 0, (0, 0, 0))
    assert chunks_sent(*[fresh] * 5) == [0, 4]
    resumed = FetchRequest(2, 0, 0, (0, 0, 0), SNAPSHOT_META.slot, 8)
    assert chunks_sent(*[resumed] * 5) == [8, 12]
    for _ in range(server.config.repair_ticks):
        server.tick()
    assert chunks_sent(resumed) == [8, 12]
    counters = dict(server.status().counters)
    assert counters["catchup.snapshot_fetch_repeated"] == 8
