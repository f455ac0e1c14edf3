"""`cellar live`: a real local cluster under the nemesis, its clients' history checked.

Starts 3 (or 5) `cellar replica` processes on loopback with the key-value machine (synced,
TLS), their peer links through relays the nemesis can cut and slow, and clients that put and
read a few keys. The seed draws the faults as the simulator does (partitions of every shape,
one-way cuts, slowed links, `kill -9` with restarts, SIGSTOP pauses), or `--schedule` names
them (any of the simulator's faults, `deaf-to-sequencer` too); then every fault heals and the
clients go on. Prints the schedule, how many of its faults were injected and how many were
skipped (and why: a fault that needs the sequencer is skipped when finding it took the fault's
whole window), the operations' outcomes and the verdict, and leaves `history.jsonl` (for
`cellar check`), `report.html` and the replicas' logs and data in the run directory.

Exit status: 0 linearizable, every replica kept running (but for the nemesis's crashes) and
every operation after the heal succeeded; 1 not linearizable, a replica stopped by itself, or
operations failed after the cluster had time to recover; 2 the checker ran out of time
(verdict unknown, nothing else wrong); 3 bad arguments, or the cluster never started or
settled. A run in which no fault was injected says so in a `warning:` line (it tested the
cluster without faults), its exit status as above.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
from typing import TYPE_CHECKING

from consensus.config import Defect
from consensus.runtime.arguments import at_least, seconds, usage_errors_exit
from jepsen.sim.cli import parse_schedule
from jepsen.sim.nemesis import schedule_problems
from jepsen.verdict import Verdict

if TYPE_CHECKING:
    from cellar.live.run import LiveResult

LOOPS = ("asyncio", "uvloop", "trio")
EXIT_USAGE = 3  # bad arguments, or a cluster that never started or settled
EXIT_NO_VERDICT = 2  # the checker ran out of time or memory, or the run failed after serving
DEFECTS = tuple(defect.value for defect in Defect)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=at_least(0), default=1,
                        help="draws the faults and the workload")
    parser.add_argument("--replicas", type=int, choices=(3, 5), default=3)
    parser.add_argument("--seconds", type=seconds(), default=20.0,
                        help="how long faults are injected (default 20)")
    parser.add_argument("--heal-seconds", type=seconds(), default=6.0,
                        help="how long the clients go on after the heal (default 6)")
    parser.add_argument("--clients", type=at_least(1), default=6,
                        help="client processes, one operation at a time each")
    parser.add_argument("--processes-per-client", type=at_least(1), default=2,
                        help="client processes that share a client: their puts made together "
                             "go as one command (default 2)")
    parser.add_argument("--loop", choices=LOOPS, default="asyncio",
                        help="the replicas' event loop")
    parser.add_argument("--schedule", type=parse_schedule, default=None,
                        help="explicit faults instead of the seed's: "
                             "AT_MS:FAULT:TARGET:DURATION_MS,... (as `cellar sim run`)")
    parser.add_argument("--defect", action="append", default=[], choices=DEFECTS,
                        help="run every replica with this deliberate protocol fault, to see "
                             "the run catch it (repeatable)")
    parser.add_argument("--dir", type=pathlib.Path, default=None,
                        help="the run directory (default: a new one under the system's "
                             "temporary directory, kept)")
    usage_errors_exit(parser, EXIT_USAGE)  # 3, not 2: that says the verdict is unknown
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from cellar.exception_groups import run_unwrapped  # noqa: PLC0415 - no event loop for
    from cellar.live.run import (  # noqa: PLC0415 - `cellar --help`
        LiveOptions,
        NeverServed,
        run_live,
    )

    options = LiveOptions(seed=args.seed, replicas=args.replicas, fault_s=args.seconds,
                          heal_s=args.heal_seconds, processes=args.clients,
                          processes_per_client=args.processes_per_client, loop=args.loop,
                          defects=tuple(args.defect), explicit_schedule=args.schedule)
    problems = schedule_problems(options.schedule(), options.replicas,
                                 int(options.fault_s * 1000))
    if options.settle_s >= options.heal_s:
        problems.append(f"--heal-seconds must exceed the {options.settle_s:g} s the cluster "
                        "has to recover")
    if problems:
        print("cellar live: " + "; ".join(problems), file=sys.stderr)
        return EXIT_USAGE
    directory = args.dir or pathlib.Path(tempfile.mkdtemp(prefix="cellar-live-"))
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if any(directory.iterdir()):
            raise OSError(f"{directory} is not empty")
    except OSError as error:
        print(f"cellar live: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(f"cellar live: seed {options.seed}, {options.replicas} replicas, faults for "
          f"{options.fault_s:g} s, then healed for {options.heal_s:g} s; run directory "
          f"{directory}")
    for event in options.schedule():
        print(f"  at {event.at_ms:>6} ms: {event.fault.value} {event.target} for "
              f"{event.duration_ms} ms")
    try:
        result = run_unwrapped(run_live, options, directory)
    except NeverServed as error:  # the cluster never served
        print(f"cellar live: the run could not start: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (RuntimeError, TimeoutError, OSError) as error:  # it served: no verdict
        print(f"cellar live: the run failed after the cluster served, with no verdict: "
              f"{error}; what it recorded is in {directory / 'history.jsonl'}", file=sys.stderr)
        return EXIT_NO_VERDICT
    return _report(result, directory)


def _fault_lines(result: LiveResult) -> list[str]:
    """How many of the scheduled faults were injected and how many skipped, with why; a
    warning when none was injected: the verdict then says nothing about faults."""
    from cellar.live.nemesis import (  # noqa: PLC0415 - as `run`
        FAULT_SKIPPED,
        FAULT_STARTED,
        FAULT_UNPAUSED,
    )

    nemesis = [event for event in result.history.events if not event.is_client]
    injected = sum(event.f == FAULT_STARTED for event in nemesis)
    skipped = [str(event.value) for event in nemesis if event.f == FAULT_SKIPPED]
    scheduled = len(result.schedule)
    unreached = scheduled - injected - len(skipped)  # the run ended before their time
    lines = [f"faults: {injected} of {scheduled} injected, {len(skipped)} skipped"
             + (f", {unreached} not reached" if unreached > 0 else "")]
    lines += [f"  skipped: {why}" for why in skipped]
    lines += [f"  not held: {event.value}" for event in nemesis if event.f == FAULT_UNPAUSED]
    if not injected:
        lines.append("warning: no fault was injected: this run tested the cluster without "
                     "faults" + (f" ({scheduled} scheduled)" if scheduled else ""))
    return lines


def _report(result: LiveResult, directory: pathlib.Path) -> int:
    for line in _fault_lines(result):
        print(line)
    print(f"operations: {result.operations} ({result.ok_operations} ok); "
          f"after the heal settled: {result.settled_ok} succeeded, {result.unsettled} did not")
    if not result.settled_ok:
        print("failure: no operation invoked after the heal settled succeeded")
    first, last = ("?" if view is None else view for view in result.views)
    print(f"views: {first} when the faults began, {last} at the end")
    print(f"verdict: {result.check.verdict.value} ({result.check.checked} operations "
          f"checked in {result.check.elapsed_s:.1f} s)"
          + (f": {result.check.reason}" if result.check.reason else ""))
    for stopped in result.exits:
        print(f"failure: {stopped}; see its log in {directory}")
    print(f"history: {directory / 'history.jsonl'}; report: {directory / 'report.html'}")
    if not result.live:
        return 1
    if result.check.verdict is Verdict.UNKNOWN:  # neither proven nor refuted in time
        return EXIT_NO_VERDICT
    return 0 if result.ok else 1
