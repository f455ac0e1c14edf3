"""`cellar sim`: bad arguments are usage errors (exit 3, one error line, no traceback), never
exit 1, which says a violation was found, nor 2, a verdict left unknown; none of them runs the
simulator. A sweep reports any
crash of a run as a violation of its seed."""

from __future__ import annotations

import pytest

from cellar.cli import main
from jepsen.sim import cli, runner
from jepsen.sim.cli import EXIT_UNCHECKED, EXIT_USAGE, seed_range
from jepsen.sim.options import SimOptions

SHORT = ["--safety-ms", "200", "--liveness-ms", "200"]


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The error line of a command argparse refuses (exit 3: 2 says a verdict is unknown)."""
    with pytest.raises(SystemExit) as caught:
        main(["sim", *argv])
    assert caught.value.code == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err.splitlines()[-1]


@pytest.mark.parametrize(("argv", "message"), [
    (["sweep", "--seeds", "abc"], "argument --seeds: not FIRST-LAST or one seed: 'abc'"),
    (["sweep", "--seeds", "5-3"], "argument --seeds: FIRST-LAST needs 0 <= FIRST <= LAST"),
    (["sweep", "--seeds", "-3"], "argument --seeds: not FIRST-LAST or one seed: '-3'"),
    (["run", "--seed", "1", "--schedule", "x"], "argument --schedule: 'x' is not "
     "AT_MS:FAULT:TARGET:DURATION_MS"),
    (["run", "--seed", "1", "--schedule", "100:melt:0:100"], "with FAULT one of"),
])
def test_malformed_arguments(capsys: pytest.CaptureFixture[str], argv: list[str],
                             message: str) -> None:
    assert message in usage_error(capsys, *argv)


@pytest.mark.parametrize(("argv", "message"), [
    ([], "the following arguments are required: COMMAND"),
    (["rnu"], "invalid choice: 'rnu'"),
])
def test_a_missing_or_unknown_command_is_a_usage_error(
        capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    """README: "3 a usage error". `cellar sim` alone, or with a misspelt command, exited 2
    (argparse's), which `cellar sim` says when a history's check ran out of steps."""
    assert message in usage_error(capsys, *argv)


@pytest.mark.parametrize(("schedule", "message"), [
    ("100:crash:7:100", "100:crash:7:100: target 7 is no replica (there are 3: 0 to 2)"),
    ("100:isolate:0:-100", "100:isolate:0:-100: a fault lasts at least 1 ms, not -100"),
    ("50:pause:0:0", "50:pause:0:0: a fault lasts at least 1 ms, not 0"),
    ("100:pause:0:10,900:clog:1:10", "900:clog:1:10: faults start in the safety phase, at 0 "
     "to 200 ms, not at 900"),
])
def test_a_schedule_that_does_not_fit_the_cluster(capsys: pytest.CaptureFixture[str],
                                                  schedule: str, message: str) -> None:
    code = main(["sim", "run", "--seed", "1", "--schedule", schedule, *SHORT])
    captured = capsys.readouterr()
    assert (code, captured.out) == (EXIT_USAGE, "")
    assert captured.err == f"cellar sim run: error: --schedule: {message}\n"


def test_seed_ranges() -> None:
    assert seed_range("4") == range(4, 5)
    assert seed_range("2-4") == range(2, 5)
    assert list(seed_range("0-0")) == [0]


def test_a_fitting_schedule_runs(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["sim", "run", "--seed", "1", "--no-swarm", "--schedule",
                 "50:isolate:0:100,200:pause:2:50", *SHORT])
    assert code == 0
    assert "faults: 50:isolate:0:100,200:pause:2:50" in capsys.readouterr().out


def test_a_sweep_names_seeds_whose_history_went_unchecked(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A seed with no violation whose linearizability search ran out of steps is not a
    verified one: the sweep says so and exits 2, never 0 (a script reading the status had
    taken a history nobody checked for a checked one)."""
    monkeypatch.setattr(runner, "CHECK_STEPS_MAX", 1)
    assert main(["sim", "sweep", "--seeds", "1", *SHORT]) == EXIT_UNCHECKED == 2
    out = capsys.readouterr().out
    assert "seed 1: UNCHECKED (no violation, but the history's check ran out of steps)" in out
    assert "1 seeds, 0 failed, 1 with the history unchecked: 1 (" in out
    assert main(["sim", "sweep", "--seeds", "1", "--json", *SHORT]) == EXIT_UNCHECKED
    assert '"unchecked_seeds": [1]' in capsys.readouterr().out


def test_a_run_whose_history_went_unchecked_is_no_pass(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "CHECK_STEPS_MAX", 1)
    assert main(["sim", "run", "--seed", "1", "--no-swarm", *SHORT]) == EXIT_UNCHECKED
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("UNCHECKED: ") and "history unknown" in last


def test_a_sweep_reports_a_crash_of_the_core_as_a_violation_and_goes_on(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Any exception a run raises is a bug found (an `AssertionError` is only the commonest):
    the seed fails, and the sweep goes on to the next (a KeyError had ended it)."""
    def crashing(options: SimOptions, schedule: object = None) -> runner.SimResult:
        if options.seed == 1:
            raise KeyError(126)
        return runner.run(options)

    monkeypatch.setattr(cli, "run", crashing)
    assert main(["sim", "sweep", "--seeds", "1-2", *SHORT]) == 1
    out = capsys.readouterr().out
    assert "seed 1: VIOLATION\n  KeyError: 126\nseed 2: ok" in out
    assert "2 seeds, 1 failed: 1 (" in out
