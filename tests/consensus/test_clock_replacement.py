"""A sequencer whose clock is off is replaced by followers whose clocks agree
(consensus/election.py, `judge_clocks`). Before, it stayed sequencer and withheld its Ticks
for as long as its clock was off, so no lease or session expired anywhere until an operator
restarted it. One follower alone finding it off replaces nobody; a replica whose clock is off
stands for election after those whose clocks agree, and still stands when no clock agrees."""

from __future__ import annotations

from consensus.config import ReplicaConfig
from tests.consensus.stepper import Stepper

ROUNDS_MAX = 3000


def _judge(cluster: Stepper, offsets_ms: dict[int, int], skew_ms_max: int = 1000) -> None:
    """Each live replica's driver, judging from the replicas' clock offsets as its peers'
    hellos would say them (consensus/runtime/clock_agreement.py)."""
    for replica in cluster.live():
        node = cluster.node(replica)
        near = sum(1 for peer in cluster.configs if peer != replica and
                   abs(offsets_ms[peer] - offsets_ms[replica]) <= skew_ms_max)
        agrees = 1 + near > len(cluster.configs) // 2
        sequencer = node.inspect.sequencer
        off = abs(offsets_ms[sequencer] - offsets_ms[replica]) > skew_ms_max
        node.judge_clocks(agrees, off)


def _counter(cluster: Stepper, name: str) -> int:
    return sum(dict(cluster.node(replica).status().counters).get(name, 0)
               for replica in cluster.live())


def _serving(cluster: Stepper) -> list[int]:
    return [replica for replica in cluster.live()
            if cluster.node(replica).inspect.is_sequencer]


def _rounds(cluster: Stepper, count: int, offsets_ms: dict[int, int]) -> None:
    for _ in range(count):
        _judge(cluster, offsets_ms)
        cluster.round()


def _settled(replica_count: int) -> Stepper:
    cluster = Stepper(replica_count)
    for _ in range(20):
        cluster.round()
    assert cluster.node(0).inspect.is_sequencer
    return cluster


def test_followers_whose_clocks_agree_replace_a_sequencer_whose_clock_is_off() -> None:
    cluster = _settled(3)
    cooldown_ticks = ReplicaConfig(replica_id=0, replica_count=3).straggler_cooldown_ticks
    offsets_ms = {0: 3_600_000, 1: 0, 2: 40}  # the sequencer an hour ahead
    _rounds(cluster, cooldown_ticks - 40, offsets_ms)
    assert _counter(cluster, "election.clock_suspected") == 0  # not within the cooldown
    assert _serving(cluster) == [0]
    for _ in range(ROUNDS_MAX):
        _rounds(cluster, 1, offsets_ms)
        serving = _serving(cluster)
        if serving and cluster.node(serving[0]).inspect.view > 0:
            break
    else:
        raise AssertionError("the sequencer whose clock is off was not replaced")
    assert serving[0] in (1, 2)
    assert _counter(cluster, "election.clock_suspected") >= 2
    view = cluster.node(serving[0]).inspect.view
    _rounds(cluster, 2 * cooldown_ticks, offsets_ms)  # the new one's clock agrees: it stays
    assert _serving(cluster) == serving
    assert all(cluster.node(replica).inspect.view == view for replica in cluster.live())


def test_one_follower_finding_the_sequencer_off_replaces_nobody() -> None:
    """Clocks spread over 1.6 s: replica 1 finds the sequencer 1.6 s off, replica 2 finds
    both within 0.8 s. One suspicion of three is no majority."""
    cluster = _settled(3)
    offsets_ms = {0: 1_600, 1: 0, 2: 800}
    cooldown_ticks = cluster.configs[0].straggler_cooldown_ticks
    _rounds(cluster, cooldown_ticks + ROUNDS_MAX, offsets_ms)
    assert dict(cluster.node(1).status().counters).get("election.clock_suspected", 0) >= 2
    assert _counter(cluster, "election.straggler_replacing") == 0
    assert _serving(cluster) == [0]
    assert all(cluster.node(replica).inspect.view == 0 for replica in cluster.live())


def _elect_after_crash(cluster: Stepper, offsets_ms: dict[int, int]) -> int:
    cluster.crash(0)
    for _ in range(ROUNDS_MAX):
        _rounds(cluster, 1, offsets_ms)
        serving = _serving(cluster)
        if serving:
            return serving[0]
    raise AssertionError("no sequencer was elected")


def test_a_replica_whose_clock_is_off_stands_after_those_whose_clocks_agree() -> None:
    """Replica 1's clock is off. With every clock agreeing, replica 1 wins some of these
    elections (its random timeout ends first); with its clock off, replica 2 wins them all."""
    winners_agreeing: list[int] = []
    winners_one_off: list[int] = []
    delays = 0
    for seed_shift in range(8):
        for offsets_ms, winners in (({0: 0, 1: 0, 2: 30}, winners_agreeing),
                                    ({0: 0, 1: -3_600_000, 2: 30}, winners_one_off)):
            cluster = _settled(3)
            for _ in range(seed_shift * 7):  # different points in the random timeouts
                cluster.round()
            winners.append(_elect_after_crash(cluster, offsets_ms))
            delays += dict(cluster.node(1).status().counters).get(
                "election.candidacy_delayed", 0)
    assert 1 in winners_agreeing
    assert winners_one_off == [2] * 8 and delays >= 1


def test_a_group_in_which_no_clock_agrees_still_elects_a_sequencer() -> None:
    cluster = _settled(3)
    offsets_ms = {0: 0, 1: -3_600_000, 2: 3_600_000}
    assert _elect_after_crash(cluster, offsets_ms) in (1, 2)
    assert _counter(cluster, "election.candidacy_delayed") >= 1
    assert _counter(cluster, "election.clock_suspected") == 0
