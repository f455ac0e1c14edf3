"""`cellar bench floor`: how fast this machine carries a put's messages in Python, with no
protocol: the floor under `cellar bench peers`' figures.

A client (this process, uvloop) sends 16-byte puts from `--callers` callers to a leader process,
which sends each batch to two follower processes and answers at the first acknowledgement
(`floor_node`): the four messages of a put on the sequencer's replica of a 3-replica cluster,
in batches, over mutual TLS from the cluster's own kind of CA (`--plain` for TCP), each command
decoded and stored in a dict by every process, as an apply does. Nothing else: no consensus,
no log, no disk, no sessions, no deadlines, no retries.

What it answers: whether a figure of `cellar bench peers` is bound by this machine and Python
(the floor is near it) or by the work Cellar does per message and per command (the floor is far
above it). Prints, as medians of `--runs` runs (minimum, maximum): puts per second and the p50
latency at one caller and at `--callers`, and the client process's CPU per put. `--json` prints
one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import pathlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from cellar.bench.floor_codec import decode, encode, encode_put
from cellar.bench.floor_node import HOST, FramedProtocol, tls_context
from cellar.bench.stats import Spread, percentile, process_cpu_s
from cellar.child_processes import bound_to_parent, stop_processes
from consensus.runtime.arguments import at_least, seconds
from consensus.runtime.certs import identities, init_directory
from consensus.runtime.tls import Identity, IdentityRole, TlsConfig

VALUE_BYTES = 16
KEYS_PER_CALLER = 1000
STOP_GRACE_S = 2.0
WARMUP_S = 0.5
# The figures of a Phase, in the report
FIGURES = ("puts_per_s", "p50_ms", "client_cpu_us_per_put", "servers_cpu_us_per_put")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--callers", type=at_least(1), default=1024,
                        help="concurrent callers of the loaded phase (default 1024)")
    parser.add_argument("--seconds", type=seconds(most=600), default=3.0,
                        help="length of each measured phase (default 3)")
    parser.add_argument("--runs", type=at_least(1), default=3, help="runs (default 3)")
    parser.add_argument("--plain", action="store_true", help="plain TCP instead of TLS")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


@dataclass(frozen=True, slots=True)
class Phase:
    """One measured phase: what `callers` callers completed."""

    callers: int
    puts_per_s: float
    p50_ms: float
    client_cpu_us_per_put: float
    servers_cpu_us_per_put: float  # the leader's and the two followers', together


def run(args: argparse.Namespace) -> int:
    phases: dict[int, list[Phase]] = {}
    for _ in range(args.runs):
        for phase in measure_once(sorted({1, args.callers}), args.seconds, tls=not args.plain):
            phases.setdefault(phase.callers, []).append(phase)
    spreads = {callers: {name: Spread.of([getattr(phase, name) for phase in runs])
                         for name in FIGURES} for callers, runs in phases.items()}
    if args.json:
        print(json.dumps({"tls": not args.plain, "callers": {
            str(callers): {name: spread.as_dict() for name, spread in figures.items()}
            for callers, figures in spreads.items()}}))
        return 0
    transport = "plain TCP" if args.plain else "TLS"
    print(f"floor: client -> leader -> 2 followers -> answer, {transport}, no protocol and no "
          f"disk (medians of {args.runs} runs)")
    for callers, figures in spreads.items():
        print(f"  {callers:>5} caller(s): {figures['puts_per_s'].describe('puts/s', 0)}; "
              f"p50 {figures['p50_ms'].describe('ms', 3)}; "
              f"CPU: client {figures['client_cpu_us_per_put'].describe('µs/put', 1)}, "
              f"servers {figures['servers_cpu_us_per_put'].describe('µs/put', 1)}")
    return 0


def measure_once(caller_counts: Sequence[int], seconds_each: float, *, tls: bool,
                 ) -> list[Phase]:
    """Start a leader and two followers, measure each caller count in turn, stop them."""
    with tempfile.TemporaryDirectory(prefix="cellar-floor-") as directory, \
            _servers(pathlib.Path(directory), tls=tls) as (port, client_files, pids):
        import uvloop  # noqa: PLC0415 - as the suite: every client runs on uvloop

        return uvloop.run(_phases(port, client_files, pids, caller_counts, seconds_each))


@contextlib.contextmanager
def _servers(directory: pathlib.Path, *, tls: bool,
             ) -> Iterator[tuple[int, tuple[str, str, str] | None, list[int]]]:
    processes: list[subprocess.Popen[bytes]] = []
    files: list[tuple[str, str, str] | None] = (
        list(_tls_files(directory)) if tls else [None] * 4)
    try:
        follower_ports = [_start(processes, ["follower"], files[index + 1])
                          for index in range(2)]
        leader_port = _start(processes, ["leader", "--followers",
                                         *map(str, follower_ports)], files[0])
        yield leader_port, files[3], [process.pid for process in processes]
    finally:
        stop_processes(processes, STOP_GRACE_S)


def _tls_files(directory: pathlib.Path) -> list[tuple[str, str, str]]:
    """(ca, cert, key) of the leader, the two followers and the client, in that order."""
    client = Identity(IdentityRole.SCHEDULER, "floor")
    wanted = [*identities(replicas=3), client]
    init_directory(directory, wanted)
    configs = [TlsConfig.in_directory(directory, identity) for identity in wanted]
    return [(str(config.ca_file), str(config.cert_file), str(config.key_file))
            for config in configs]


def _start(processes: list[subprocess.Popen[bytes]], arguments: list[str],
           files: tuple[str, str, str] | None) -> int:
    """Start one server and return the port it bound (its first line)."""
    tls = ["--ca", files[0], "--cert", files[1], "--key", files[2]] if files else []
    process = subprocess.Popen(  # noqa: S603 - our own module, our own arguments
        bound_to_parent([sys.executable, "-m", "cellar.bench.floor_node", *arguments, *tls]),
        stdout=subprocess.PIPE)
    processes.append(process)
    assert process.stdout is not None
    line = process.stdout.readline()  # the child prints its port at once, or ends
    if not line.strip().isdigit():
        raise RuntimeError(f"floor server {arguments[0]} did not start (exit "
                           f"{process.poll()}, said {line!r})")
    return int(line)


async def _phases(port: int, files: tuple[str, str, str] | None, server_pids: list[int],
                  caller_counts: Sequence[int], seconds_each: float) -> list[Phase]:
    link = await _Client.connect(port, files)
    try:
        return [await link.phase(callers, seconds_each, server_pids)
                for callers in caller_counts]
    finally:
        link.close()


class _Client:
    """The callers' one connection: requests batched per loop turn, answers by request id."""

    def __init__(self, link: FramedProtocol) -> None:
        self.link = link
        self.waiting: dict[int, asyncio.Future[None]] = {}
        self.outgoing: list[tuple[int, bytes]] = []
        self.next_id = 0

    @classmethod
    async def connect(cls, port: int, files: tuple[str, str, str] | None) -> _Client:
        loop = asyncio.get_running_loop()
        context = tls_context(files, server=False) if files else None
        client: _Client | None = None

        def on_answers(_link: FramedProtocol, frame: bytes) -> None:
            assert client is not None
            for request_id in decode(frame):
                client.waiting.pop(request_id).set_result(None)

        _, link = await loop.create_connection(lambda: FramedProtocol(on_answers), HOST, port,
                                               ssl=context)
        client = cls(link)
        return client

    async def put(self, key: bytes, value: bytes) -> None:
        request_id = self.next_id
        self.next_id += 1
        answered = asyncio.get_running_loop().create_future()
        self.waiting[request_id] = answered
        if not self.outgoing:
            asyncio.get_running_loop().call_soon(self._flush)
        self.outgoing.append((request_id, encode_put(key, value)))
        await answered

    def _flush(self) -> None:
        self.link.send(encode(self.outgoing))
        self.outgoing = []

    async def phase(self, callers: int, seconds_each: float, server_pids: list[int]) -> Phase:
        latencies_s: list[float] = []
        stop_at = [float("inf")]
        measuring = [False]

        async def caller(index: int) -> None:
            value = b"v" * VALUE_BYTES
            keys = [b"k%06d-%04d" % (index, number) for number in range(KEYS_PER_CALLER)]
            turn = 0
            while time.perf_counter() < stop_at[0]:
                started = time.perf_counter()
                await self.put(keys[turn % KEYS_PER_CALLER], value)
                turn += 1
                if measuring[0]:
                    latencies_s.append(time.perf_counter() - started)

        tasks = [asyncio.create_task(caller(index)) for index in range(callers)]
        await asyncio.sleep(WARMUP_S)
        measuring[0] = True
        servers_cpu_s = sum(map(process_cpu_s, server_pids))
        cpu_s, wall_s = time.process_time(), time.perf_counter()
        stop_at[0] = wall_s + seconds_each
        await asyncio.gather(*tasks)
        cpu_s, wall_s = time.process_time() - cpu_s, time.perf_counter() - wall_s
        servers_cpu_s = sum(map(process_cpu_s, server_pids)) - servers_cpu_s
        latencies_s.sort()
        done = max(1, len(latencies_s))
        return Phase(callers=callers, puts_per_s=len(latencies_s) / wall_s,
                     p50_ms=percentile(latencies_s, 0.5) * 1000 if latencies_s else 0.0,
                     client_cpu_us_per_put=cpu_s / done * 1e6,
                     servers_cpu_us_per_put=servers_cpu_s / done * 1e6)

    def close(self) -> None:
        assert self.link.transport is not None
        self.link.transport.close()
