"""`cellar bench`: benchmarks that print figures, never assertions.

Every figure is a median over several runs, printed with its minimum and maximum; `--json`
prints one JSON object instead of the table.
"""

from __future__ import annotations

import argparse

from cellar.cli import add_subcommands

BENCHMARKS: dict[str, tuple[str, str]] = {
    "statemachine": (
        "cellar.bench.statemachine",
        "apply rate, allocation latency and snapshot cost on an 8,192-GPU cluster",
    ),
    "checker": ("cellar.bench.checker", "linearizability checks per second on large histories"),
    "storage": ("cellar.bench.storage", "the durable record log against SQLite: syncs, recovery"),
    "agent": ("cellar.bench.agent",
              "the node agent's CPU and memory per GPU, and fault-to-refusal time"),
    "cluster": ("cellar.bench.cluster",
                "a local cluster end to end: commits/s, latency, reads/s, failover time"),
    "peers": ("cellar.bench.peers.suite",
              "Cellar beside etcd and PySyncObj: the same workload, ratios, a report"),
    "floor": ("cellar.bench.floor",
              "a put's messages with no protocol: the floor under the peers' figures"),
}


def configure(parser: argparse.ArgumentParser) -> None:
    add_subcommands(parser, BENCHMARKS, dest="benchmark")
