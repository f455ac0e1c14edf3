"""`cellar bench peers`: Cellar beside the stores people would pick instead, in one run.

Systems (`--systems`, default all): cellar-3 and cellar-5 as they ship (every record synced,
mutual TLS), cellar-3-nosync (to compare with PySyncObj, which does not sync its journal),
the `-plain` ones over plain TCP (etcd and PySyncObj run here without TLS), cellar-3-unbatched
(each put a command of its own: what the client's batches gain), etcd and PySyncObj. Each is
prepared once under `--work-dir` (installed there if needed); one that cannot be is reported as
skipped, with the reason, and the run goes on. With `--no-install`
nothing is installed: the suite sets `CELLAR_BENCH_NO_INSTALL=1`, and a peer module's
`prepare(work_dir)` must then raise `PeerUnavailable` rather than install anything.

In each of `--rounds` rounds every system, in turn, gets a fresh cluster (data in a temporary
directory under the work dir, so syncs hit that disk) and runs the same workload
(`cellar.bench.peers.workload`), from this process, over `--connections` shared clients.
cellar-3's round ends with a failover: its sequencer is killed and the time to a new commit
measured. The simulator's WAN table (SDPaxos against Multi-Paxos) comes last.

Output: a table on stdout (or `--json`: one object), and under `--out` `results.json`,
`report.md`, `throughput.png` and `latency.png`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import importlib.metadata
import json
import os
import pathlib
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field

from cellar.bench.peers.kv import NO_INSTALL_ENV, Durability, KvSystem, PeerUnavailable
from cellar.bench.peers.load import KEYS_PER_CALLER, KEYS_PER_PHASE_MAX
from cellar.bench.peers.machine import machine_info
from cellar.bench.peers.plots import write_plots
from cellar.bench.peers.report import (
    Results,
    SystemOutcome,
    as_json,
    markdown,
    results_from_json,
    table_lines,
    wan_lines,
)
from cellar.bench.peers.wan import wan_table
from cellar.bench.peers.workload import (
    DEFAULT_CLIENTS,
    READ_CALLERS_FLOOR,
    READ_KEYS_PER_CALLER,
    SIZES_BYTES,
    RoundFailed,
    Workload,
    measure,
)
from cellar.daemon_process import loop_options
from cellar.exception_groups import run_unwrapped
from cellar.gc_tuning import quiet_garbage_collector
from cellar.malloc_tuning import keep_freed_memory
from consensus.runtime.arguments import at_least, seconds

DEFAULT_WORK_DIR = pathlib.Path("~/.cache/cellar/bench-peers")
FAILOVER_SYSTEM = "cellar-3"


@dataclass(frozen=True, slots=True)
class SystemEntry:
    """Where a system's class lives, imported only when the system is chosen, and the keyword
    arguments its constructor takes."""

    module: str
    attribute: str
    options: tuple[tuple[str, object], ...] = ()


_CELLAR = "cellar.bench.peers.cellar_peer"
_PYSYNCOBJ = "cellar.bench.peers.pysyncobj_peer"
SYSTEMS: dict[str, SystemEntry] = {
    "cellar-3": SystemEntry(_CELLAR, "CellarSystem", (("replicas", 3), ("synced", True))),
    "cellar-5": SystemEntry(_CELLAR, "CellarSystem", (("replicas", 5), ("synced", True))),
    "cellar-3-nosync": SystemEntry(_CELLAR, "CellarSystem",
                                   (("replicas", 3), ("synced", False))),
    # The same, with every client sending to the sequencer's replica (fewest hops on a LAN);
    # each ratio takes Cellar's better configuration too.
    "cellar-3-seq": SystemEntry(_CELLAR, "CellarSystem", (
        ("replicas", 3), ("synced", True), ("prefer_sequencer", True))),
    "cellar-3-nosync-seq": SystemEntry(_CELLAR, "CellarSystem", (
        ("replicas", 3), ("synced", False), ("prefer_sequencer", True))),
    # The same over plain TCP: etcd and PySyncObj run here without TLS, Cellar ships with it,
    # so these are the comparisons on equal terms (the `_plain` ratios).
    "cellar-3-plain-seq": SystemEntry(_CELLAR, "CellarSystem", (
        ("replicas", 3), ("synced", True), ("prefer_sequencer", True), ("tls", False))),
    "cellar-3-plain-nosync-seq": SystemEntry(_CELLAR, "CellarSystem", (
        ("replicas", 3), ("synced", False), ("prefer_sequencer", True), ("tls", False))),
    # cellar-3 with each put a command of its own, as before its client batched its callers'
    # puts: what the batches gain, side by side
    "cellar-3-unbatched": SystemEntry(_CELLAR, "CellarSystem", (
        ("replicas", 3), ("synced", True), ("puts_max", 1))),
    "etcd": SystemEntry("cellar.bench.peers.etcd", "EtcdSystem"),
    # etcd's clients talking to its leader alone: the counterpart of cellar-3-seq.
    "etcd-leader": SystemEntry("cellar.bench.peers.etcd", "EtcdSystem", (
        ("name", "etcd-leader"), ("leader_only", True))),
    # PySyncObj as it ships (appends batched every 0.1 s: its best throughput) and with
    # batching off (its best latency); each ratio takes the peer's better figure.
    "pysyncobj": SystemEntry(_PYSYNCOBJ, "PySyncObjSystem"),
    "pysyncobj-nobatch": SystemEntry(_PYSYNCOBJ, "PySyncObjSystem", (
        ("conf", {"appendEntriesUseBatch": False}), ("name", "pysyncobj-nobatch"))),
}


def _counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(
            f"a comma-separated list of positive integers, not {text!r}")
    return tuple(dict.fromkeys(counts))  # each point once


def _names(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [name for name in names if name not in SYSTEMS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"choose among {', '.join(SYSTEMS)}; unknown: "
                                         f"{', '.join(unknown) or '(none given)'}")
    return names


def configure(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--systems", type=_names, default=tuple(SYSTEMS),
        help=f"comma-separated subset of {','.join(SYSTEMS)} (default all)")
    add("--rounds", type=at_least(1), default=3, help="fresh clusters per system (default 3)")
    add("--clients", type=_counts, default=DEFAULT_CLIENTS,
        help="concurrent callers at each throughput point (default "
             f"{','.join(map(str, DEFAULT_CLIENTS))}); reads at each from {READ_CALLERS_FLOOR} up")
    add("--connections", type=at_least(1), default=4, help="clients the callers share (default 4)")
    add("--seconds", type=seconds(), default=3.0, help="each throughput point (default 3)")
    add("--latency-seconds", type=seconds(), default=3.0, help="each one-caller phase (default 3)")
    add("--warmup-seconds", type=seconds(zero_ok=True), default=1.0, help="the warm-up (default 1)")
    add("--timeout-seconds", type=seconds(), default=5.0,
        help="one call's limit; slower calls count as timeouts (default 5)")
    add("--work-dir", type=pathlib.Path, default=DEFAULT_WORK_DIR,
        help="installs and the clusters' data (default ~/.cache/cellar/bench-peers)")
    add("--out", type=pathlib.Path, default=None,
        help="where the results go (default bench-results/peers-<timestamp>)")
    add("--no-install", action="store_true",
        help=f"install nothing: a peer that needs an install is skipped ({NO_INSTALL_ENV}=1)")
    add("--no-failover", action="store_true", help="skip killing cellar-3's sequencer")
    add("--no-sim", action="store_true", help="skip the simulator's WAN table")
    add("--sim-seconds", type=at_least(1), default=4,
        help="simulated seconds per WAN run (default 4)")
    add("--json", action="store_true", help="print one JSON object instead of the table")
    add("--redraw", type=pathlib.Path, default=None, metavar="RESULTS_JSON",
        help="measure nothing: redraw the table, report and plots of an earlier results.json "
             "(into --out, default beside it)")
    parser.set_defaults(handler=run)


def workload_of(args: argparse.Namespace) -> Workload:
    return Workload(tuple(args.clients), args.seconds, args.latency_seconds,
                    args.warmup_seconds, args.connections, args.timeout_seconds)


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this run, every setting spelled out."""
    words = ["cellar", "bench", "peers", "--systems", ",".join(args.systems),
             "--rounds", str(args.rounds), "--clients", ",".join(map(str, args.clients)),
             "--connections", str(args.connections), "--seconds", str(args.seconds),
             "--latency-seconds", str(args.latency_seconds),
             "--warmup-seconds", str(args.warmup_seconds),
             "--timeout-seconds", str(args.timeout_seconds), "--work-dir", str(args.work_dir),
             "--sim-seconds", str(args.sim_seconds)]
    flags = ("no_install", "no_failover", "no_sim", "json")
    words += [f"--{flag.replace('_', '-')}" for flag in flags if getattr(args, flag)]
    return shlex.join(words)


def installs_allowed(args: argparse.Namespace) -> bool:
    """Neither `--no-install` nor `CELLAR_BENCH_NO_INSTALL=1` in the environment."""
    return not args.no_install and os.environ.get(NO_INSTALL_ENV) != "1"


@contextlib.contextmanager
def install_policy(allow_install: bool) -> Iterator[None]:
    """`CELLAR_BENCH_NO_INSTALL=1` for the run's duration when installs are not allowed."""
    before = os.environ.get(NO_INSTALL_ENV)
    if not allow_install:
        os.environ[NO_INSTALL_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(NO_INSTALL_ENV, None)
        else:
            os.environ[NO_INSTALL_ENV] = before


def load_system(name: str) -> KvSystem:
    """The system's object; `PeerUnavailable` when its module is missing or broken."""
    entry = SYSTEMS[name]
    try:
        module = importlib.import_module(entry.module)
        factory = getattr(module, entry.attribute)
    except (ImportError, AttributeError) as error:
        raise PeerUnavailable(f"{entry.module}.{entry.attribute} cannot be loaded: "
                              f"{type(error).__name__}: {error}") from error
    system: KvSystem = factory(**dict(entry.options))
    return system


def round_figures(system: KvSystem, directory: pathlib.Path, workload: Workload,
                  *, failover: bool) -> tuple[dict[str, float], Durability, int]:
    """One round of one system on a fresh cluster: its figures, durability and size."""
    cluster = system.start(directory)
    try:
        extra = None
        if failover and system.name == FAILOVER_SYSTEM:
            from cellar.bench.peers.failover import cellar_failover  # noqa: PLC0415
            extra = cellar_failover
        # Every system's clients run on the same loop: uvloop (grpc.aio works on it too).
        backend, options = loop_options("uvloop")
        figures = run_unwrapped(measure, cluster, workload, extra, backend=backend,
                                backend_options=options)
        return figures, cluster.durability, cluster.replicas
    finally:
        cluster.stop()


def default_out(now: datetime.datetime) -> pathlib.Path:
    return pathlib.Path("bench-results") / f"peers-{now.strftime('%Y%m%d-%H%M%S')}"


@dataclass(frozen=True, slots=True)
class Prepared:
    """A chosen system after `prepare`: ready (`system`) or skipped (`reason`)."""

    name: str
    system: KvSystem | None
    reason: str | None
    version: str | None


def version_of(system: KvSystem) -> str | None:
    """The system's `version` if it exposes one (etcd's helper does); Cellar's own package
    version for Cellar; otherwise None."""
    try:
        value = getattr(system, "version", None)
        if callable(value):
            value = value()
        if value is None and type(system).__name__ == "CellarSystem":
            value = importlib.metadata.version("cellar")
    except Exception:  # a version is a nicety: never fail the run for it
        return None
    return None if value is None else str(value)


def prepare(name: str, work_dir: pathlib.Path) -> Prepared:
    try:
        system = load_system(name)
        system.prepare(work_dir)
    except PeerUnavailable as error:
        return Prepared(name, None, str(error) or type(error).__name__, None)
    except Exception as error:  # a broken install is a skipped peer, not a failed run
        return Prepared(name, None, f"prepare failed: {type(error).__name__}: {error}", None)
    return Prepared(name, system, None, version_of(system))


@dataclass
class _Collected:
    """What one system gathered over the rounds (filled in as they run)."""

    rounds: list[dict[str, float]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    durability: Durability | None = None
    replicas: int | None = None


def run(args: argparse.Namespace) -> int:
    if args.redraw is not None:
        return redraw(args.redraw, args.out or args.redraw.parent, as_json=args.json)
    workload = workload_of(args)
    started = datetime.datetime.now().astimezone()
    work_dir = args.work_dir.expanduser()
    out = args.out if args.out is not None else default_out(started)
    try:  # before the rounds, not after them: an --out that cannot be written lost the run
        work_dir.mkdir(parents=True, exist_ok=True)
        _check_writable(out)
    except OSError as error:
        raise SystemExit(f"cellar bench peers: {error}") from None
    args.no_install = not installs_allowed(args)  # the settings record what the run did
    with install_policy(not args.no_install):
        prepared = [prepare(name, work_dir) for name in args.systems]
        for item in prepared:
            if item.reason is not None:
                _progress(f"{item.name}: skipped: {item.reason}")
        keep_freed_memory()
        with quiet_garbage_collector():  # this process is every system's load generator
            collected = _all_rounds(args, workload, prepared, work_dir)
    wan = None
    if not args.no_sim:
        _progress("simulated WAN latency table")
        try:  # after every round: a failing simulation must not throw the rounds away
            wan = tuple(wan_table(args.sim_seconds))
        except Exception as error:
            _progress(f"simulated WAN table failed, left out: {type(error).__name__}: {error}")
    results = Results(command_line(args), started.isoformat(timespec="seconds"),
                      machine_info(work_dir), _settings(args), tuple(args.clients),
                      tuple(_outcome(item, collected[item.name]) for item in prepared), wan)
    return publish(results, out, as_json=args.json)


def _check_writable(out: pathlib.Path) -> None:
    """OSError unless `out` is a directory, or can be made as one, that this user may write."""
    found = out
    while not found.exists() and found != found.parent:
        found = found.parent
    if not found.is_dir():
        raise NotADirectoryError(f"--out {out}: {found} is not a directory")
    if not os.access(found, os.W_OK | os.X_OK):
        raise PermissionError(f"--out {out}: {found} is not writable")


def redraw(path: pathlib.Path, out: pathlib.Path, *, as_json: bool) -> int:
    try:
        results = results_from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"cellar bench peers: cannot redraw {path}: {error}") from error
    return publish(results, out, as_json=as_json)


def publish(results: Results, out: pathlib.Path, *, as_json: bool) -> int:
    """Write the outputs under `out`, then print the JSON document or the table."""
    document = write_outputs(results, out)
    if as_json:
        print_json(document)
    else:
        wan = wan_lines(results.wan) if results.wan else []
        print("\n".join([*table_lines(results), "", *wan, f"results in {out}"]))
    return 0


def _all_rounds(args: argparse.Namespace, workload: Workload, prepared: list[Prepared],
                work_dir: pathlib.Path) -> dict[str, _Collected]:
    collected = {item.name: _Collected() for item in prepared}
    ready = [item for item in prepared if item.system is not None]
    with tempfile.TemporaryDirectory(dir=work_dir, prefix="clusters-") as root:
        for number in range(args.rounds):
            shift = number % len(ready) if ready else 0
            for item in ready[shift:] + ready[:shift]:  # each system leads a round in turn
                assert item.system is not None
                _progress(f"round {number + 1}/{args.rounds}: {item.name}")
                directory = pathlib.Path(root) / f"round-{number}" / item.name
                directory.mkdir(parents=True)
                if _one_round(item.system, directory, workload, collected[item.name],
                              failover=not args.no_failover):
                    # A measured cluster's data goes at once: a full run's clusters took
                    # about a gigabyte together. A failed round's logs stay to the end.
                    shutil.rmtree(directory, ignore_errors=True)
    return collected


def _one_round(system: KvSystem, directory: pathlib.Path, workload: Workload,
               into: _Collected, *, failover: bool) -> bool:
    """Measure one round of `system` into `into`; whether it was measured."""
    try:
        figures, durability, replicas = round_figures(system, directory, workload,
                                                      failover=failover)
    except (RoundFailed, PeerUnavailable) as error:
        message = str(error)
    except Exception as error:  # one system's broken round must not end the others'
        message = f"{type(error).__name__}: {error}"
    else:
        into.rounds.append(figures)
        into.durability, into.replicas = durability, replicas
        return True
    into.failures.append(message)
    _progress(f"{system.name}: round abandoned: {message} (its logs stay in {directory} "
              "until the run ends)")
    return False


def _outcome(item: Prepared, collected: _Collected) -> SystemOutcome:
    durability = collected.durability
    if durability is None and item.system is not None:
        found = getattr(item.system, "durability", None)
        durability = found if isinstance(found, Durability) else None
    reason = item.reason
    if reason is None and not collected.rounds:
        reason = "every round failed: " + "; ".join(collected.failures)
    return SystemOutcome(item.name, collected.replicas, durability, item.version,
                         tuple(collected.rounds), tuple(collected.failures), reason)


def _settings(args: argparse.Namespace) -> dict[str, object]:
    return {"systems": list(args.systems), "rounds": args.rounds, "clients": list(args.clients),
            "connections": args.connections, "seconds": args.seconds,
            "latency_seconds": args.latency_seconds, "warmup_seconds": args.warmup_seconds,
            "timeout_seconds": args.timeout_seconds, "value_sizes_bytes": list(SIZES_BYTES),
            "keys_per_caller": KEYS_PER_CALLER, "keys_per_phase_max": KEYS_PER_PHASE_MAX,
            "read_keys_per_caller": READ_KEYS_PER_CALLER, "failover": not args.no_failover,
            "sim": not args.no_sim, "sim_seconds": args.sim_seconds,
            "work_dir": str(args.work_dir.expanduser()), "no_install": args.no_install}


def write_outputs(results: Results, out: pathlib.Path) -> dict[str, object]:
    """results.json, the images and report.md under `out`; returns the JSON document."""
    out.mkdir(parents=True, exist_ok=True)
    document = as_json(results)
    (out / "results.json").write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    images, message = write_plots(results, out)
    if message is not None:
        _progress(message)
    (out / "report.md").write_text(markdown(results, images), encoding="utf-8")
    return document


def _progress(message: str) -> None:
    print(f"bench peers: {message}", file=sys.stderr, flush=True)


def print_json(document: dict[str, object]) -> None:
    json.dump(document, sys.stdout, indent=2)
    sys.stdout.write("\n")
