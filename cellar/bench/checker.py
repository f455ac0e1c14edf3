"""`cellar bench checker`: how fast the linearizability checker decides large histories.

Times `jepsen.checker.check` (the verdict only; explaining a failure is not timed) on histories
of a simulated store, from one seed each: thousands of operations, dozens of clients, many keys,
with timed-out operations, partitioned by key or one register like Jepsen's etcd tests (and
one key-value history checked without its partition, to show what partitioning saves). With
`--files`, times history files instead (any format `cellar check` reads, e.g. Porcupine's test
data) against `--model`. Prints, per history, the median time of several runs (with minimum and
maximum) and operations per second; `--json` prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from dataclasses import dataclass

from cellar.bench.stats import Spread
from consensus.runtime.arguments import at_least
from jepsen.checker import check
from jepsen.errors import JepsenError
from jepsen.formats import UNSET, load
from jepsen.history import History
from jepsen.models import KvModel, Model, RegisterModel, model_named
from jepsen.synthetic import Workload, generate

SEED = 2_024
UNPARTITIONED = "kv-unpartitioned-1k-10p-5k"
WORKLOADS: dict[str, Workload] = {
    "kv-5k-50p-100k": Workload(kind="kv", processes=50, operations=5_000, keys=100,
                               info_ppm=10_000),
    "kv-20k-64p-500k": Workload(kind="kv", processes=64, operations=20_000, keys=500,
                                info_ppm=10_000),
    "kv-5k-30p-10k": Workload(kind="kv", processes=30, operations=5_000, keys=10,
                              info_ppm=5_000),
    "cas-register-1k-10p": Workload(kind="cas-register", processes=10, operations=1_000,
                                    info_ppm=5_000),
    "cas-register-200-5p": Workload(kind="cas-register", processes=5, operations=200,
                                    info_ppm=20_000),
    UNPARTITIONED: Workload(kind="kv", processes=10, operations=1_000, keys=5, info_ppm=5_000),
}


def model_for(name: str, workload: Workload) -> Model:
    if workload.kind == "cas-register":
        return RegisterModel(None, cas=True)
    return KvModel(partitioned=name != UNPARTITIONED)


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    model: Model
    history: History


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--runs", type=at_least(1), default=5,
                        help="runs per history (default 5)")
    parser.add_argument("--files", nargs="+", metavar="FILE",
                        help="time these history files instead of the simulated ones")
    parser.add_argument("--model", default="cas-register",
                        help="the model for --files (default cas-register)")
    parser.set_defaults(handler=run)


def cases(args: argparse.Namespace) -> list[Case]:
    if not args.files:
        return [Case(name, model_for(name, workload), generate(workload, SEED))
                for name, workload in WORKLOADS.items()]
    found = []
    for file in args.files:
        loaded = load(file)
        initial = None if loaded.initial is UNSET else loaded.initial
        found.append(Case(pathlib.Path(file).name, model_named(args.model, initial),  # type: ignore[arg-type]
                          loaded.history))
    return found


def measure(case: Case, runs: int) -> dict[str, object]:
    samples, result = [], None
    for _ in range(runs):
        started = time.perf_counter()
        result = check(case.model, case.history, explain=False)
        samples.append(time.perf_counter() - started)
    assert result is not None
    spread = Spread.of(samples)
    operations = len(case.history.operations)
    return {"name": case.name, "operations": operations,
            "processes": len({op.process for op in case.history.operations}),
            "partitions": len(result.partitions), "verdict": result.verdict.value,
            "steps": result.steps, "seconds": spread.as_dict(),
            "operations_per_second": round(operations / spread.median) if spread.median else 0}


EXIT_UNREADABLE = 3  # as `cellar check`: nothing was checked


def run(args: argparse.Namespace) -> int:
    try:
        rows = [measure(case, args.runs) for case in cases(args)]
    except (JepsenError, OSError) as error:  # a --files history unreadable, a model unknown
        print(f"cellar bench checker: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    total = sum(row["seconds"]["median"] for row in rows)  # type: ignore[index]
    if args.json:
        print(json.dumps({"benchmark": "checker", "runs": args.runs, "histories": rows,
                          "total_median_s": round(total, 6)}))
        return 0
    print(f"checker: median of {args.runs} runs per history (min, max); verdict only")
    for row in rows:
        seconds = row["seconds"]
        assert isinstance(seconds, dict)
        print(f"  {row['name']:<28} {row['operations']:>6} ops {row['processes']:>4} procs "
              f"{row['partitions']:>4} parts  {row['verdict']:<16} "
              f"{seconds['median'] * 1000:9.1f} ms ({seconds['min'] * 1000:.1f}, "
              f"{seconds['max'] * 1000:.1f})  {row['operations_per_second']:>9,} ops/s")
    print(f"  total of medians: {total * 1000:.1f} ms")
    return 0
