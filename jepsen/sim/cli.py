"""`cellar sim`: run the simulator from the command line.

- `run --seed N`: one seed (swarm faults unless --no-swarm); prints the seed and every option
  first; on a violation, shrinks the fault schedule to the fewest events that still fail and
  prints the command that reproduces it.
- `sweep --replicas N --seeds FIRST-LAST`: many seeds; exit status 1 on any violation.
- `latency --replicas N --protocol sdpaxos|multipaxos|both`: the paper's WAN table.

Exit status (`EXIT_*`, as the README says): 0 no violation and every history proven
linearizable, 1 a violation was found, 2 no violation but some history's check ran out of steps
(unknown, never a pass), 3 bad arguments (argparse's usage errors, `cellar sim` without a
command or with one it does not know included, and a `--schedule` that does not fit the
cluster: a target that is no replica, a fault that lasts no time or starts outside the safety
phase). Bad arguments end in one `error:` line (argparse puts its usage before it), never a
traceback, and never run the simulator.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from consensus.config import Mode
from consensus.prng import Prng
from consensus.runtime.arguments import at_least, usage_errors_exit
from jepsen.sim.latency import SiteLatency, model_ms, paper_ms, run_latency
from jepsen.sim.nemesis import Fault, NemesisEvent, draw_schedule, schedule_problems
from jepsen.sim.options import SimOptions, swarm
from jepsen.sim.runner import SimResult, run
from jepsen.verdict import Verdict

# As `cellar check` and `cellar live` say them: 2 is a verdict left unknown (no violation, but
# a history's check ran out of steps: never counted as a pass), 3 bad arguments.
EXIT_OK, EXIT_VIOLATION, EXIT_UNCHECKED, EXIT_USAGE = 0, 1, 2, 3


def configure(parser: argparse.ArgumentParser) -> None:
    usage_errors_exit(parser, EXIT_USAGE)  # `cellar sim` alone, or `cellar sim rnu`: 3, not 2
    commands = parser.add_subparsers(dest="sim_command", metavar="COMMAND", required=True)
    one = commands.add_parser("run", help="run one seed")
    one.add_argument("--seed", type=at_least(0), required=True)
    _common(one)
    one.add_argument("--no-swarm", action="store_true", help="no faults drawn from the seed")
    one.add_argument("--schedule", type=parse_schedule,
                     help="explicit faults: AT_MS:FAULT:TARGET:DURATION_MS,...")
    usage_errors_exit(one, EXIT_USAGE)
    one.set_defaults(handler=run_one)
    many = commands.add_parser("sweep", help="run a range of seeds with swarm faults")
    many.add_argument("--seeds", required=True, type=seed_range,
                      help="FIRST-LAST, inclusive (or one seed)")
    _common(many)
    usage_errors_exit(many, EXIT_USAGE)
    many.set_defaults(handler=run_sweep)
    table = commands.add_parser("latency", help="the paper's WAN latency table")
    table.add_argument("--replicas", type=int, choices=(3, 5), default=3)
    table.add_argument("--protocol", choices=("sdpaxos", "multipaxos", "both"),
                       default="both")
    table.add_argument("--seconds", type=at_least(1), default=4,
                       help="simulated seconds measured")
    table.add_argument("--json", action="store_true", help="print one JSON object")
    usage_errors_exit(table, EXIT_USAGE)
    table.set_defaults(handler=run_table)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, choices=(3, 5, 7), default=3)
    parser.add_argument("--mode", choices=[mode.value for mode in Mode], default="sdpaxos")
    parser.add_argument("--safety-ms", type=at_least(1), default=2000)
    parser.add_argument("--liveness-ms", type=at_least(0), default=3000)
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _options(args: argparse.Namespace, seed: int, *, faults: bool) -> SimOptions:
    base = SimOptions(seed=seed, replica_count=args.replicas, mode=Mode(args.mode),
                      safety_ms=args.safety_ms, liveness_ms=args.liveness_ms)
    return swarm(seed, base) if faults else base


def parse_schedule(text: str) -> tuple[NemesisEvent, ...]:
    """`--schedule`'s type: comma-separated AT_MS:FAULT:TARGET:DURATION_MS events (whether
    they fit the cluster is `schedule_problems`'s to say)."""
    return tuple(_schedule_event(item) for item in filter(None, text.split(",")))


def _schedule_event(item: str) -> NemesisEvent:
    try:
        at, fault, target, duration = item.split(":")
        return NemesisEvent(int(at), Fault(fault), int(target), int(duration))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{item!r} is not AT_MS:FAULT:TARGET:DURATION_MS with FAULT one of "
            f"{', '.join(fault.value for fault in Fault)}") from None


def seed_range(text: str) -> range:
    """`--seeds`'s type: FIRST-LAST (inclusive, FIRST <= LAST) or one seed."""
    first, dash, last = text.partition("-")
    try:
        low = int(first)
        high = int(last) if dash else low
    except ValueError:
        raise argparse.ArgumentTypeError(f"not FIRST-LAST or one seed: {text!r}") from None
    if low < 0 or high < low:
        raise argparse.ArgumentTypeError(f"FIRST-LAST needs 0 <= FIRST <= LAST, not {text!r}")
    return range(low, high + 1)


def _usage_error(command: str, message: str) -> int:
    print(f"cellar sim {command}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def format_schedule(schedule: tuple[NemesisEvent, ...]) -> str:
    return ",".join(f"{event.at_ms}:{event.fault.value}:{event.target}:{event.duration_ms}"
                    for event in schedule)


def run_one(args: argparse.Namespace) -> int:
    options = _options(args, args.seed, faults=not args.no_swarm)
    schedule = args.schedule if args.schedule is not None else \
        draw_schedule(options, Prng(options.seed).fork(4))
    problems = schedule_problems(schedule, options.replica_count, options.safety_ms)
    if problems:
        return _usage_error("run", "--schedule: " + "; ".join(problems))
    if not args.json:
        print(f"seed {args.seed}: {options.describe()}")
        print(f"faults: {format_schedule(schedule) or 'none'}", flush=True)
    started = time.perf_counter()
    result = run(options, schedule)
    elapsed = time.perf_counter() - started
    minimal = _shrink(options, schedule) if not result.ok else schedule
    if args.json:
        print(json.dumps({**_summary(result), "elapsed_s": round(elapsed, 3),
                          "minimal_schedule": format_schedule(minimal)}))
    else:
        _print_result(result, elapsed, args, minimal)
    return _exit(failed=not result.ok,
                 unchecked=result.linearizability is Verdict.UNKNOWN)


def _exit(*, failed: bool, unchecked: bool) -> int:
    return EXIT_VIOLATION if failed else EXIT_UNCHECKED if unchecked else EXIT_OK


def _outcome(result: SimResult) -> str:
    if not result.ok:
        return "VIOLATION"
    return "UNCHECKED" if result.linearizability is Verdict.UNKNOWN else "ok"


def _summary(result: SimResult) -> dict[str, object]:
    return {"seed": result.options.seed, "ok": result.ok, "operations": result.operations,
            "executed_slots": result.executed_slots, "views": result.views,
            "linearizability": result.linearizability.value,
            "trace_digest": result.trace_digest,
            "peer_snapshots": len(result.peer_snapshot_bytes),
            "chunked_snapshots": result.chunked_snapshots,
            "violations": [str(violation) for violation in result.violations]}


def _print_result(result: SimResult, elapsed: float, args: argparse.Namespace,
                  minimal: tuple[NemesisEvent, ...]) -> None:
    print(f"{_outcome(result)}: {result.operations} operations, "
          f"{result.executed_slots} slots, view {result.views}, history "
          f"{result.linearizability.value}, trace {result.trace_digest} ({elapsed:.1f} s)")
    if result.peer_snapshot_bytes:
        print(f"snapshots installed from peers: {len(result.peer_snapshot_bytes)}, "
              f"{result.chunked_snapshots} of them in more than one chunk")
    if result.wipes or result.wipes_refused:
        print(f"disks lost: {result.wipes} (each rejoined), {result.wipes_refused} more left "
              "plain crashes while another replica rejoined")
    for violation in result.violations:
        print(f"  {violation}")
    if not result.ok:
        print(f"smallest failing schedule: {format_schedule(minimal) or 'none'}")
        print(f"reproduce: cellar sim run --seed {result.options.seed} --replicas "
              f"{args.replicas} --mode {args.mode} --safety-ms {args.safety_ms} "
              f"--liveness-ms {args.liveness_ms} --schedule '{format_schedule(minimal)}'")


def _shrink(options: SimOptions, schedule: tuple[NemesisEvent, ...]) -> tuple[NemesisEvent, ...]:
    """Drop fault events one at a time while the run still fails (greedy delta debugging)."""
    current = schedule
    changed = True
    while changed:
        changed = False
        for position in range(len(current)):
            candidate = current[:position] + current[position + 1:]
            if not _passes(options, candidate):
                current, changed = candidate, True
                break
    return current


def _passes(options: SimOptions, schedule: tuple[NemesisEvent, ...]) -> bool:
    try:
        return run(options, schedule).ok
    except Exception:  # an invariant's assert, or any crash of the core: both are bugs
        return False


def run_sweep(args: argparse.Namespace) -> int:
    seeds: range = args.seeds
    failed: list[int] = []
    unsettled: list[int] = []  # no violation, but the history's check ran out of steps
    chunked: list[int] = []  # installed a snapshot sent in more than one chunk
    violations = 0
    started = time.perf_counter()
    for seed in seeds:
        options = _options(args, seed, faults=True)
        verdict = Verdict.UNKNOWN
        try:
            result = run(options)
            found = [str(violation) for violation in result.violations]
            verdict = result.linearizability
            if result.chunked_snapshots:
                chunked.append(seed)
        except AssertionError as error:
            found = [f"assertion: {error}"]
        except Exception as error:  # a crash of the core is a bug found, as an assert is
            found = [f"{type(error).__name__}: {error}"]
        violations += len(found)
        if found:
            failed.append(seed)
        elif verdict is Verdict.UNKNOWN:
            unsettled.append(seed)
        if not args.json:
            outcome = "VIOLATION" if found else (
                "UNCHECKED (no violation, but the history's check ran out of steps)"
                if verdict is Verdict.UNKNOWN else "ok")
            print(f"seed {seed}: {outcome}", *found, sep="\n  " if found else " ", flush=True)
    elapsed = time.perf_counter() - started
    if args.json:
        print(json.dumps({"replicas": args.replicas, "mode": args.mode, "seeds": len(seeds),
                          "violations": violations, "failed_seeds": failed,
                          "unchecked_seeds": unsettled, "chunked_snapshot_seeds": chunked,
                          "elapsed_s": round(elapsed, 1)}))
    else:
        print(f"{len(chunked)} seeds installed a snapshot sent in chunks"
              f"{': ' if chunked else ''}{' '.join(map(str, chunked))}")
        print(f"{len(seeds)} seeds, {len(failed)} failed{': ' if failed else ''}"
              f"{' '.join(map(str, failed))}"
              f"{f', {len(unsettled)} with the history unchecked: ' if unsettled else ''}"
              f"{' '.join(map(str, unsettled))} ({elapsed:.0f} s)")
    return _exit(failed=bool(failed), unchecked=bool(unsettled))


def run_table(args: argparse.Namespace) -> int:
    protocols = [Mode.SDPAXOS, Mode.MULTIPAXOS] if args.protocol == "both" else \
        [Mode(args.protocol)]
    results = {protocol: run_latency(args.replicas, protocol, seconds=args.seconds)
               for protocol in protocols}
    if args.json:
        first = results[protocols[0]]
        print(json.dumps({
            "replicas": args.replicas, "protocol": protocols[0].value, "sequencer": "CA",
            "sites": {item.site: item.median_ms for item in first},
            "model_ms": {item.site: item.model_ms for item in first},
            "protocols": {protocol.value: {item.site: item.median_ms for item in items}
                          for protocol, items in results.items()},
        }))
        return 0
    _print_table(args.replicas, results)
    return 0


def _print_table(replicas: int, results: dict[Mode, list[SiteLatency]]) -> None:
    protocols = list(results)
    header = ["site", *(f"{protocol.value} ms" for protocol in protocols),
              "SDPaxos model", "paper (Fig. 12)"]
    print(f"median ready latency, {replicas} replicas, sequencer in CA (Table 1 RTTs)")
    print("  ".join(f"{column:>15}" for column in header))
    sites = [item.site for item in results[protocols[0]]]
    for index, site in enumerate(sites):
        paper = paper_ms(replicas, site)
        row = [site, *(f"{results[protocol][index].median_ms:.1f}" for protocol in protocols),
               f"{model_ms(tuple(sites), site, Mode.SDPAXOS):.0f}",
               "-" if paper is None else f"{paper:.0f}"]
        print("  ".join(f"{cell:>15}" for cell in row))
    sys.stdout.flush()
