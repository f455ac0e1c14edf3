"""A hand-stepped cluster of protocol cores for tests that need a schedule the golden scripts
cannot state compactly: loops that run until a replica sends a given message, links cut in
one direction, crashes between two steps. Everything is explicit: nothing ticks, is processed
or is delivered unless the test says so, and every record counts as synced."""

from __future__ import annotations

from collections.abc import Callable

from consensus.config import Defect, ReplicaConfig
from consensus.messages import Message
from consensus.prng import Prng
from consensus.records import Record
from consensus.replica import Replica
from consensus.trace import describe_batch

Queued = tuple[int, int, Message]  # (source, target, message)
PROCESS_STEPS_MAX = 50


class Stepper:
    def __init__(self, replica_count: int, defects: frozenset[Defect] = frozenset(),
                 notices_quiet_after_ticks: int = 0) -> None:
        # Nothing ticks here unless a test says so, so commit notices held for quiet peers
        # would wait: by default they go at once, as most schedules here were written for
        # (tests/consensus/test_notice_hold.py steps the hold).
        self.configs = {replica: ReplicaConfig(
            replica_id=replica, replica_count=replica_count, defects=defects,
            notices_quiet_after_ticks=notices_quiet_after_ticks)
            for replica in range(replica_count)}
        self.replicas: dict[int, Replica | None] = {
            replica: Replica(config, Prng(replica)) for replica, config in self.configs.items()}
        self.records: dict[int, list[Record]] = {replica: [] for replica in self.configs}
        self.executed: dict[int, list[tuple[int, str]]] = {replica: [] for replica in self.configs}
        self.reads: dict[int, list[tuple[int, list[str]]]] = {r: [] for r in self.configs}
        self.readied: dict[int, list[int]] = {replica: [] for replica in self.configs}
        self.queue: list[Queued] = []
        self.blocked: set[tuple[int, int]] = set()  # links (source, target) that lose

    def node(self, replica: int) -> Replica:
        node = self.replicas[replica]
        assert node is not None, f"replica {replica} is down"
        return node

    def live(self) -> list[int]:
        return [replica for replica, node in self.replicas.items() if node is not None]

    def process(self, replica: int) -> None:
        """Run ready() until idle: persist, execute, answer reads, queue messages."""
        node = self.replicas[replica]
        if node is None:
            return
        for _ in range(PROCESS_STEPS_MAX):
            ready = node.ready()
            if ready.is_empty():
                return
            self.records[replica].extend(ready.records)
            for item in ready.executed:
                self.executed[replica].append((item.slot, describe_batch(item.commands)))
            self.readied[replica].extend(ready.readied)
            for read_id in ready.reads:
                self.reads[replica].append(
                    (read_id, [batch for _, batch in self.executed[replica]]))
            for target, message in ready.messages + ready.messages_after_persist:
                self.queue.append((replica, target, message))
            node.advance()
        raise AssertionError(f"replica {replica} never went idle")

    def process_all(self) -> None:
        for replica in self.live():
            self.process(replica)

    def deliver(self, which: Callable[[int, int, Message], bool] = lambda s, t, m: True
                ) -> None:
        """Deliver the queued messages `which` picks, in order; blocked links lose them."""
        taken = [item for item in self.queue if which(*item)]
        self.queue = [item for item in self.queue if not which(*item)]
        for source, target, message in taken:
            node = self.replicas.get(target)
            if (source, target) not in self.blocked and node is not None:
                node.step(message)

    def drop(self, which: Callable[[int, int, Message], bool]) -> list[Queued]:
        taken = [item for item in self.queue if which(*item)]
        self.queue = [item for item in self.queue if not which(*item)]
        return taken

    def tick(self, replicas: list[int] | None = None) -> None:
        for replica in self.live() if replicas is None else replicas:
            self.node(replica).tick()

    def round(self) -> None:
        """Every replica ticks, processes, and everything queued is delivered."""
        self.tick()
        self.process_all()
        self.deliver()
        self.process_all()

    def crash(self, replica: int) -> None:
        self.replicas[replica] = None
        self.queue = [item for item in self.queue if replica not in item[:2]]

    def restart(self, replica: int) -> None:
        self.replicas[replica] = Replica.restore(self.configs[replica], Prng(100 + replica),
                                                 self.records[replica])
