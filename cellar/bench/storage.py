"""`cellar bench storage`: the replica's record log against SQLite, on the local disk.

The log is timed twice: as a replica writes it, into zeros written ahead of the records
(`consensus.runtime.storage`, "Space written ahead"; written when it opens, untimed), and
extending its file at each append, as it did before. All three get the same records (mostly
C-accepts of one 110-byte command, some O-accepts and commits), encoded by `consensus.codec`,
and the same durability: the log appends and fdatasyncs (`consensus.runtime.storage.
DurableLog`); SQLite (stdlib `sqlite3`, WAL mode, `synchronous=FULL`) inserts the encoded
records into one table in one transaction per batch.

Prints, as medians of several runs (with minimum and maximum): synced batches per second and
records per second at batch sizes 1, 16 and 256; the time to open and read back a log of 100k
records (what a restarting replica waits for), next to the time decoding alone takes; and the
throughput of the two checksums the log could use (zlib.crc32, blake2b with 8-byte digests).
`--dir` picks the disk (the system's temporary directory by default; a tmpfs there measures
memory, not a disk). `--json` prints one JSON object.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import pathlib
import random
import sqlite3
import tempfile
import time
import zlib
from collections.abc import Callable, Sequence

from cellar.bench.stats import Spread
from consensus.codec import decode_record, encode_record
from consensus.messages import Command
from consensus.records import CAcceptRecord, CCommitRecord, OAcceptRecord, Record
from consensus.runtime.arguments import at_least, existing_directory
from consensus.runtime.storage import PREALLOCATE_BYTES, DurableLog

BATCH_SIZES = (1, 16, 256)
COMMAND_BYTES = 110
RECOVERY_BATCH = 256
SQLITE_NAME = "records.sqlite"
CHECKSUM_SIZES = (128, 4096, 4 << 20)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--runs", type=at_least(1), default=5,
                        help="runs per figure (default 5)")
    parser.add_argument("--syncs", type=at_least(1), default=100,
                        help="synced batches per run and batch size (default 100)")
    parser.add_argument("--records", type=at_least(1), default=100_000,
                        help="records in the log whose recovery is timed (default 100000)")
    parser.add_argument("--dir", type=existing_directory, default=None,
                        help="where to write (default: the system's temporary directory)")
    parser.set_defaults(handler=run)


def sample_records(count: int, seed: int = 1) -> list[Record]:
    """A replica's typical records: C-accepts of one command, O-accepts, a few commits."""
    prng = random.Random(seed)
    records: list[Record] = []
    for index in range(count):
        space = index % 3
        kind = prng.randrange(8)
        if kind == 0:
            records.append(OAcceptRecord(1, index, (space,)))
        elif kind == 1:
            records.append(CCommitRecord(space, index, 1, None))
        else:
            payload = prng.randbytes(COMMAND_BYTES)
            records.append(CAcceptRecord(space, index, 1, (Command(space, index, payload),)))
    return records


# --- The two stores ----------------------------------------------------------------------------


class LogStore:
    zeros_ahead_bytes = PREALLOCATE_BYTES  # as a replica's log: written at open, untimed

    def __init__(self, directory: pathlib.Path) -> None:
        self._log = DurableLog.open(directory, create=True,
                                    preallocate_bytes=self.zeros_ahead_bytes)

    def append_synced(self, records: Sequence[Record]) -> None:
        self._log.append(records)
        self._log.sync()

    def close(self) -> None:
        self._log.close()

    @staticmethod
    def recover(directory: pathlib.Path) -> int:
        with DurableLog.open(directory, create=False) as log:
            return len(log.records())


class UnzeroedLogStore(LogStore):
    """The log as it was before it wrote zeros ahead of its records: each sync that makes the
    file longer commits its new size too."""

    zeros_ahead_bytes = 0


class SqliteStore:
    def __init__(self, directory: pathlib.Path) -> None:
        self._connection = connect(directory)
        self._connection.execute("CREATE TABLE IF NOT EXISTS records "
                                 "(position INTEGER PRIMARY KEY, record BLOB NOT NULL)")

    def append_synced(self, records: Sequence[Record]) -> None:
        connection = self._connection
        connection.execute("BEGIN")
        connection.executemany("INSERT INTO records (record) VALUES (?)",
                               [(encode_record(record),) for record in records])
        connection.execute("COMMIT")  # synchronous=FULL: the WAL is fsynced here

    def close(self) -> None:
        self._connection.close()

    @staticmethod
    def recover(directory: pathlib.Path) -> int:
        connection = connect(directory)
        try:
            rows = connection.execute("SELECT record FROM records ORDER BY position")
            return len([decode_record(row[0]) for row in rows])
        finally:
            connection.close()


def connect(directory: pathlib.Path) -> sqlite3.Connection:
    connection = sqlite3.connect(directory / SQLITE_NAME, isolation_level=None)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=FULL")
    return connection


STORES: dict[str, type[LogStore] | type[SqliteStore]] = {
    "log": LogStore, "log_unzeroed": UnzeroedLogStore, "sqlite": SqliteStore}


# --- Measurements ------------------------------------------------------------------------------


def time_appends(store_type: type[LogStore] | type[SqliteStore], root: pathlib.Path,
                 batches: list[list[Record]]) -> float:
    with tempfile.TemporaryDirectory(dir=root) as directory:
        store = store_type(pathlib.Path(directory))
        try:
            started = time.perf_counter()
            for batch in batches:
                store.append_synced(batch)
            return time.perf_counter() - started
        finally:
            store.close()


def appends(args: argparse.Namespace, root: pathlib.Path) -> list[dict[str, object]]:
    """Each run times both stores back to back, so a disk that is busy for a while (other
    programs share it) slows both rather than whichever happened to run then."""
    rows: list[dict[str, object]] = []
    for size in BATCH_SIZES:
        records = sample_records(size * args.syncs)
        batches = [records[start:start + size] for start in range(0, len(records), size)]
        samples: dict[str, list[float]] = {name: [] for name in STORES}
        for _ in range(args.runs):
            for name, store_type in STORES.items():
                samples[name].append(time_appends(store_type, root, batches))
        row: dict[str, object] = {"batch": size, "syncs": args.syncs}
        for name, seconds in samples.items():
            spread = Spread.of(seconds)
            row[name] = {"seconds": spread.as_dict(),
                         "syncs_per_second": round(args.syncs / spread.median),
                         "records_per_second": round(len(records) / spread.median)}
        rows.append(row)
    return rows


def recovery(args: argparse.Namespace, root: pathlib.Path) -> dict[str, object]:
    records = sample_records(args.records, seed=2)
    payloads = [encode_record(record) for record in records]
    decoding = timed(args.runs, functools.partial(_decode_all, payloads))
    found: dict[str, object] = {"records": args.records, "decode_only": decoding}
    for name, store_type in STORES.items():
        with tempfile.TemporaryDirectory(dir=root) as directory:
            path = pathlib.Path(directory)
            store = store_type(path)
            for start in range(0, len(records), RECOVERY_BATCH):
                store.append_synced(records[start:start + RECOVERY_BATCH])
            store.close()
            assert store_type.recover(path) == len(records)
            found[name] = timed(args.runs, functools.partial(store_type.recover, path))
    return found


def _decode_all(payloads: list[bytes]) -> int:
    return len([decode_record(payload) for payload in payloads])


def timed(runs: int, work: Callable[[], object]) -> dict[str, float]:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        samples.append(time.perf_counter() - started)
    return Spread.of(samples).as_dict()


def checksums(runs: int) -> list[dict[str, object]]:
    """Bytes per second of each checksum over a record of each size."""
    rows: list[dict[str, object]] = []
    for size in CHECKSUM_SIZES:
        data = random.Random(size).randbytes(size)
        repeat = max(1, (8 << 20) // size)
        row: dict[str, object] = {"bytes": size}
        for name, function in (("crc32", _crc32), ("blake2b", _blake2b)):
            spread = timed(runs, functools.partial(_repeat, function, data, repeat))
            row[name] = {"microseconds": spread["median"] / repeat * 1e6,
                         "bytes_per_second": round(size * repeat / spread["median"])}
        rows.append(row)
    return rows


def _crc32(data: bytes) -> object:
    return zlib.crc32(data)


def _blake2b(data: bytes) -> object:
    return hashlib.blake2b(data, digest_size=8).digest()


def _repeat(function: Callable[[bytes], object], data: bytes, times: int) -> None:
    for _ in range(times):
        function(data)


# --- Output ------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    root = pathlib.Path(args.dir or tempfile.gettempdir())
    if not root.is_dir():
        print(f"cellar bench storage: {root} is not a directory")
        return 3
    document = {"benchmark": "storage", "dir": str(root), "runs": args.runs,
                "appends": appends(args, root), "recovery": recovery(args, root),
                "checksums": checksums(args.runs)}
    if args.json:
        print(json.dumps(document))
    else:
        print_table(document)
    return 0


def print_table(document: dict[str, object]) -> None:
    print(f"storage in {document['dir']}: median of {document['runs']} runs (min, max); "
          "log = append + fdatasync into zeros written ahead, unzeroed = the same log "
          "extending its file, sqlite = WAL, synchronous=FULL, one transaction a batch")
    print(f"  {'batch':>5}  {'log syncs/s':>12} {'records/s':>10}   "
          f"{'unzeroed syncs/s':>16}   {'sqlite syncs/s':>14} {'records/s':>10}   "
          "log/unzeroed  log/sqlite")
    rows = document["appends"]
    assert isinstance(rows, list)
    for row in rows:
        log, bare, lite = row["log"], row["log_unzeroed"], row["sqlite"]
        print(f"  {row['batch']:>5}  {log['syncs_per_second']:>12,} "
              f"{log['records_per_second']:>10,}   {bare['syncs_per_second']:>16,}   "
              f"{lite['syncs_per_second']:>14,} {lite['records_per_second']:>10,}   "
              f"{log['records_per_second'] / bare['records_per_second']:11.2f}x "
              f"{log['records_per_second'] / lite['records_per_second']:10.2f}x")
    found = document["recovery"]
    assert isinstance(found, dict)
    print(f"  recovery of {found['records']:,} records: "
          + ", ".join(f"{name} {_seconds(found[name])}" for name in
                      ("log", "log_unzeroed", "sqlite", "decode_only")))
    checks = document["checksums"]
    assert isinstance(checks, list)
    for row in checks:
        print(f"  checksum of {row['bytes']:>8,} bytes: " + ", ".join(
            f"{name} {row[name]['microseconds']:.2f} us "
            f"({row[name]['bytes_per_second'] / 1e6:,.0f} MB/s)" for name in
            ("crc32", "blake2b")))


def _seconds(spread: dict[str, float]) -> str:
    return (f"{spread['median'] * 1000:.0f} ms ({spread['min'] * 1000:.0f}, "
            f"{spread['max'] * 1000:.0f})")
