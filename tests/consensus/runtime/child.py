"""A process for the storage tests to kill: `python -m tests.consensus.runtime.child MODE DIR
SEED`, run from the repository root.

- `append`: open DIR (creating it), print `opened K` (K records recovered), then append the
  workload stream from where the recovered log ends (from the start when `--snapshots` is
  given), in batches of 1 to 32 records, printing `synced N` (N records written in all) after
  each sync, until killed or `--limit` records are written. With `--snapshots` every 25th
  record is a snapshot and the log compacts after `--compact-bytes`.
- `hold`: open DIR, print `locked`, and keep the lock until stdin closes.
- `compact-then-die`: write 60 records with snapshots to DIR, the last not synced, and sync
  them, which compacts; `os.replace` is replaced by a SIGKILL of this process, before the rename
  (`--when before`) or right after it (`--when after`), so the compaction never finishes.
"""

from __future__ import annotations

import argparse
import itertools
import os
import pathlib
import random
import signal
import sys
from collections.abc import Callable

from consensus.runtime.storage import DurableLog
from tests.consensus.runtime.test_storage import due_to_compact_at_sync
from tests.consensus.runtime.workload import stream, take

SNAPSHOT_EVERY = 25
BATCH_MAX = 32


def append(args: argparse.Namespace) -> None:
    snapshot_every = SNAPSHOT_EVERY if args.snapshots else 0
    with DurableLog.open(args.directory, create=True,
                         compact_after_bytes=args.compact_bytes) as log:
        opened = len(log.records())
        written = 0 if args.snapshots else opened
        print(f"opened {opened}", flush=True)
        records = stream(args.seed, snapshot_every=snapshot_every)
        for _ in itertools.islice(records, written):
            pass
        prng = random.Random(args.seed * 1_000_003 + written)
        while written < args.limit:
            batch = list(itertools.islice(records, prng.randint(1, BATCH_MAX)))
            log.append(batch)
            log.sync()
            written += len(batch)
            print(f"synced {written}", flush=True)


def hold(args: argparse.Namespace) -> None:
    with DurableLog.open(args.directory, create=True):
        print("locked", flush=True)
        sys.stdin.read()


def compact_then_die(args: argparse.Namespace) -> None:
    log = due_to_compact_at_sync(args.directory, take(args.seed, 60,
                                                      snapshot_every=SNAPSHOT_EVERY))
    rename = os.replace

    def die_at_rename(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        if args.when == "after":
            rename(source, target)
        os.kill(os.getpid(), signal.SIGKILL)

    replace: Callable[..., None] = die_at_rename
    os.replace = replace
    log.sync()
    raise AssertionError("the compaction should have killed this process")


def main() -> None:
    parser = argparse.ArgumentParser(prog="child")
    parser.add_argument("mode", choices=("append", "hold", "compact-then-die"))
    parser.add_argument("directory", type=pathlib.Path)
    parser.add_argument("seed", type=int)
    parser.add_argument("--snapshots", action="store_true")
    parser.add_argument("--compact-bytes", type=int, default=1 << 20)
    parser.add_argument("--limit", type=int, default=1_000_000)
    parser.add_argument("--when", choices=("before", "after"), default="before")
    args = parser.parse_args()
    {"append": append, "hold": hold, "compact-then-die": compact_then_die}[args.mode](args)


if __name__ == "__main__":
    main()
