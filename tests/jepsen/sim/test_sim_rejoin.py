"""Whole clusters in which replicas lose their disks and rejoin (`consensus.rejoin`): every
safety check holds, the history stays linearizable and each rejoined replica ends knowing all
its old life voted on; a replica that starts over without asking (`Defect.FORGETFUL_REJOIN`)
is caught. Swarm seeds draw wipes too (one in `WIPES_ONE_IN`)."""

from __future__ import annotations

import dataclasses

import pytest

from consensus.config import Defect, Mode
from jepsen.sim.cli import parse_schedule
from jepsen.sim.nemesis import Fault, NemesisEvent
from jepsen.sim.options import SimOptions, swarm
from jepsen.sim.runner import SimResult, run

SHORT = {"safety_ms": 1500, "liveness_ms": 2500}


def assert_passed(result: SimResult) -> None:
    assert result.ok, "\n".join(str(violation) for violation in result.violations)


# The sequencer (replica 0 in view 0) and a follower lose their disks, one after the other,
# with other faults around them.
CASES = [
    (3, Mode.SDPAXOS, "100:wipe:0:300,800:wipe:1:100,1200:crash:2:100"),
    (3, Mode.SDPAXOS, "200:wipe:2:50,300:partition-halves:0:200,900:wipe:2:200"),
    (5, Mode.SDPAXOS, "100:wipe:0:300,600:crash:1:300,1000:wipe:3:100,1300:pause:2:100"),
    (3, Mode.MULTIPAXOS, "100:wipe:0:300,900:wipe:1:100"),
]


@pytest.mark.parametrize(("replicas", "mode", "schedule"), CASES)
@pytest.mark.parametrize("seed", [1, 4])
def test_replicas_that_lose_their_disks_rejoin_safely(replicas: int, mode: Mode,
                                                      schedule: str, seed: int) -> None:
    options = SimOptions(seed=seed, replica_count=replicas, mode=mode,
                         **SHORT)  # type: ignore[arg-type]
    result = run(options, parse_schedule(schedule))
    assert_passed(result)
    assert result.wipes == 2 and result.wipes_refused == 0


@pytest.mark.parametrize(("replicas", "mode", "schedule"), CASES)
def test_a_replica_that_starts_over_without_asking_is_caught(replicas: int, mode: Mode,
                                                             schedule: str) -> None:
    options = SimOptions(seed=4, replica_count=replicas, mode=mode,
                         defects=frozenset({Defect.FORGETFUL_REJOIN}),
                         **SHORT)  # type: ignore[arg-type]
    try:
        result = run(options, parse_schedule(schedule))
    except AssertionError as error:  # a core's own check saw a second value chosen
        assert "C-agreement" in str(error) or "O-agreement" in str(error)
        return
    assert not result.ok


def test_a_wipe_while_another_replica_still_rejoins_is_a_plain_crash() -> None:
    """Two disks lost at once in a 3-replica group lose what a quorum chose: the second
    wipe, while the first replica still waits for reports (it needs every other replica up,
    and the second is down), leaves the disk as it was."""
    options = SimOptions(seed=2, **SHORT)  # type: ignore[arg-type]
    schedule = (NemesisEvent(100, Fault.WIPE, 1, 300), NemesisEvent(150, Fault.WIPE, 2, 600))
    result = run(options, schedule)
    assert_passed(result)
    assert (result.wipes, result.wipes_refused) == (1, 1)


def test_two_of_five_replicas_lose_their_disks_at_once_and_both_rejoin() -> None:
    options = SimOptions(seed=3, replica_count=5, **SHORT)  # type: ignore[arg-type]
    result = run(options, parse_schedule("100:wipe:1:300,150:wipe:3:400,900:crash:0:200"))
    assert_passed(result)
    assert (result.wipes, result.wipes_refused) == (2, 0)


def test_a_swarm_seed_with_wipes_passes() -> None:
    seed = next(seed for seed in range(100) if swarm(seed).wipe_every_ms)
    options = dataclasses.replace(swarm(seed, SimOptions(seed=seed)), safety_ms=1500,
                                  liveness_ms=2500)
    result = run(options)
    assert_passed(result)
    assert result.wipes >= 1
