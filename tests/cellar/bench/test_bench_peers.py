"""`cellar bench peers`: the load generator counts what it did against an in-memory cluster,
the ratios are right on made-up figures (a skipped peer gives null), nothing is installed with
`--no-install`, and one tiny live run of the real suite writes every output."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

import anyio
import pytest

from cellar.bench.peers import load, suite
from cellar.bench.peers.cellar_peer import CellarSystem
from cellar.bench.peers.kv import NO_INSTALL_ENV, Durability, PeerUnavailable
from cellar.bench.peers.load import (
    KEYS_PER_CALLER,
    KEYS_PER_PHASE_MAX,
    PhaseResult,
    key_for,
    keys_per_caller,
    put_operation,
    run_phase,
)
from cellar.bench.peers.plots import line_style
from cellar.bench.peers.report import (
    HEADLINE_RATIOS,
    Results,
    SystemOutcome,
    as_json,
    figure_ratios,
    markdown,
    ratio_meaning,
    ratios,
    results_from_json,
    system_rows,
    table_lines,
    wan_lines,
)
from cellar.bench.peers.wan import WanRow
from cellar.bench.peers.workload import (
    DEFAULT_CLIENTS,
    PRELOAD_WRITERS_MAX,
    READ_CALLERS_FLOOR,
    READ_KEYS_PER_CALLER,
    RoundFailed,
    Workload,
    measure,
    preload,
)
from cellar.cli import main
from consensus.runtime.client import ClientConfig
from tests.cellar.leftovers import kill_leftovers


class FakeClient:
    """An in-memory KvClient; `fail_every` makes every nth call raise, `delay_s` slows it."""

    def __init__(self, store: dict[bytes, bytes], *, fail_every: int = 0,
                 delay_s: float = 0.0) -> None:
        self.store = store
        self.calls = 0
        self.fail_every = fail_every
        self.delay_s = delay_s
        self.closed = False
        self.callers = 1  # how many callers the cluster was told would share it
        self.in_flight = self.in_flight_max = 0

    async def _call(self) -> None:
        self.calls += 1
        self.in_flight += 1
        self.in_flight_max = max(self.in_flight_max, self.in_flight)
        try:
            await anyio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        if self.fail_every and self.calls % self.fail_every == 0:
            raise ConnectionError("refused")

    async def put(self, key: bytes, value: bytes) -> None:
        await self._call()
        self.store[key] = value

    async def get(self, key: bytes) -> bytes | None:
        await self._call()
        return self.store.get(key)

    async def aclose(self) -> None:
        self.closed = True


class FakeCluster:
    name = "fake"
    replicas = 1
    durability = Durability(False, "a dict")

    def __init__(self, **client_options: float) -> None:
        self.store: dict[bytes, bytes] = {}
        self.clients: list[FakeClient] = []
        self.options = client_options

    async def connect(self, callers: int = 1) -> FakeClient:
        client = FakeClient(self.store, **self.options)  # type: ignore[arg-type]
        client.callers = callers
        self.clients.append(client)
        return client

    def stop(self) -> None:
        pass


TINY = Workload(clients=(1, 3), seconds=0.05, latency_seconds=0.05, warmup_seconds=0.02,
                connections=2, timeout_s=1.0)


def test_a_phase_counts_every_call_once() -> None:
    clients = [FakeClient({}, fail_every=5), FakeClient({}, fail_every=5)]

    async def phase_of() -> PhaseResult:
        return await run_phase(clients, 6, 0.1, put_operation(b"v" * 16), timeout_s=1.0)

    phase = anyio.run(phase_of)
    assert phase.ops + phase.errors == sum(client.calls for client in clients)
    assert phase.ops > 0 and phase.errors > 0 and phase.timeouts == 0
    assert phase.first_error == "ConnectionError: refused"
    assert phase.callers == 6
    assert phase.ops_per_s == pytest.approx(phase.ops_in_window / phase.elapsed_s)
    assert phase.p50_ms is not None and phase.p99_ms is not None
    assert phase.p99_ms >= phase.p50_ms
    assert set(clients[0].store) <= {key_for(caller, number) for caller in range(0, 6, 2)
                                     for number in range(KEYS_PER_CALLER)}


def test_many_callers_share_a_bounded_set_of_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """However many callers, a phase's puts reach at most KEYS_PER_PHASE_MAX keys: every
    system must hold a run's keys (Cellar's store refuses puts past 512 MiB)."""
    assert keys_per_caller(1) == keys_per_caller(64) == KEYS_PER_CALLER
    assert keys_per_caller(8192) == KEYS_PER_PHASE_MAX // 8192 and keys_per_caller(10**6) == 1
    assert all(callers * keys_per_caller(callers) <= max(KEYS_PER_PHASE_MAX, callers)
               for callers in range(1, 20_000, 7))
    monkeypatch.setattr(load, "KEYS_PER_PHASE_MAX", 512)  # a phase the fake gets round fast
    client = FakeClient({})

    async def phase_of() -> PhaseResult:
        return await run_phase([client], 128, 0.3, put_operation(b"v"), timeout_s=1.0)

    phase = anyio.run(phase_of)
    assert phase.ops > 512 * 4  # every caller went round its keys
    assert set(client.store) == {key_for(caller, number, 4)
                                 for caller in range(128) for number in range(4)}


def test_slow_calls_count_as_timeouts() -> None:
    async def slow_phase() -> PhaseResult:
        return await run_phase([FakeClient({}, delay_s=0.2)], 2, 0.05, put_operation(b"v"),
                               timeout_s=0.02)

    phase = anyio.run(slow_phase)
    assert phase.ops == 0 and phase.errors == 0 and phase.timeouts == 2 and phase.all_failed
    assert phase.elapsed_s < 0.15  # cut off timeout_s after the deadline, not after 0.2 s


def test_calls_that_end_late_count_as_timeouts_not_latencies() -> None:
    async def late_phase() -> PhaseResult:
        return await run_phase([FakeClient({}, delay_s=0.03)], 1, 0.1, put_operation(b"v"),
                               timeout_s=0.01)

    phase = anyio.run(late_phase)
    assert phase.ops == 0 and phase.errors == 0 and phase.timeouts >= 2
    assert phase.first_error is not None and phase.first_error.startswith("TimeoutError")


def test_a_round_on_a_fake_cluster_yields_every_figure() -> None:
    cluster = FakeCluster()
    figures = anyio.run(measure, cluster, TINY, None)
    for prefix in ("put_16b_single", "put_1kb_single", "put_16b_c1", "put_16b_c3",
                   "put_1kb_c1", "put_1kb_c3", "get_single", "get_c3"):
        assert figures[f"{prefix}_ops_per_s"] > 0, prefix
        assert figures[f"{prefix}_p99_ms"] >= figures[f"{prefix}_p50_ms"] >= 0
    assert figures["errors"] == 0 and figures["timeouts"] == 0
    assert len(cluster.clients) == 2 and all(client.closed for client in cluster.clients)
    assert {len(value) for value in cluster.store.values()} <= {16, 1024}  # 1 KB last


def test_each_client_is_told_the_most_callers_that_will_share_it() -> None:
    """Cellar gives a client a session for each of them: a command beyond its sessions would
    wait its turn in the client's pool, a cost of the client and not of the store."""
    cluster = FakeCluster(delay_s=0.002)
    workload = dataclasses.replace(TINY, clients=(1, 5), seconds=0.05)  # 2 connections
    anyio.run(measure, cluster, workload, None)
    assert workload.callers_per_client == 3
    assert [client.callers for client in cluster.clients] == [3, 3]
    assert max(client.in_flight_max for client in cluster.clients) == 3  # no more, but as many
    assert dataclasses.replace(TINY, clients=(1, 8192), connections=4).callers_per_client == 2048


def test_reads_are_measured_at_every_count_from_the_floor_up_or_at_the_most() -> None:
    cluster = FakeCluster()
    spread = dataclasses.replace(TINY, clients=(1, 3, 1024, 2048))
    figures = anyio.run(measure, cluster, dataclasses.replace(spread, seconds=0.02), None)
    assert spread.read_clients == (1024, 2048)
    assert [name for name in figures if name.startswith("get_c") and name.endswith("ops_per_s")
            ] == ["get_c1024_ops_per_s", "get_c2048_ops_per_s"]
    assert TINY.read_clients == (3,)  # none reaches the floor: the most callers only
    assert min(DEFAULT_CLIENTS) == 1 and max(DEFAULT_CLIENTS) >= 4 * READ_CALLERS_FLOOR


def test_the_read_keys_of_thousands_of_callers_are_written_by_a_bounded_few_at_once() -> None:
    store: dict[bytes, bytes] = {}
    clients = [FakeClient(store, delay_s=0.001) for _ in range(2)]
    in_flight = {"now": 0, "most": 0}

    async def counted_put(client: FakeClient, key: bytes, value: bytes) -> None:
        in_flight["now"] += 1
        in_flight["most"] = max(in_flight["most"], in_flight["now"])
        try:
            await FakeClient.put(client, key, value)
        finally:
            in_flight["now"] -= 1

    for client in clients:
        client.put = functools.partial(counted_put, client)  # type: ignore[method-assign]
    callers = PRELOAD_WRITERS_MAX + 100
    anyio.run(preload, clients, callers, b"v" * 1024, 5.0)
    assert in_flight["most"] == PRELOAD_WRITERS_MAX
    assert set(store) == {key_for(caller, number, READ_KEYS_PER_CALLER)
                          for caller in range(callers) for number in range(READ_KEYS_PER_CALLER)}


def test_throughput_ratios_take_each_system_s_own_peak_wherever_it_lies() -> None:
    """A peer whose puts and gets peak at the most callers and Cellar whose peak at fewer:
    each is judged at its peak, not at one shared count."""
    cellar = {"put_16b_c1_ops_per_s": 500.0, "put_16b_c3_ops_per_s": 400.0,
              "get_c1_ops_per_s": 900.0, "get_c3_ops_per_s": 600.0}
    peer = {"put_16b_c1_ops_per_s": 100.0, "put_16b_c3_ops_per_s": 250.0,
            "get_c1_ops_per_s": 200.0, "get_c3_ops_per_s": 300.0}
    results = dataclasses.replace(synthetic_results(), systems=(
        _outcome("cellar-3", [cellar]), _outcome("etcd", [peer])))
    found = ratios(results)
    assert found["ratio_throughput_etcd"] == pytest.approx(500 / 250)
    assert found["ratio_read_throughput_etcd"] == pytest.approx(900 / 300)
    rows = system_rows(results.systems[1], results.clients)
    assert [row[:2] for row in rows if row[0].startswith("get, ")] == [
        ("get, one caller", "-"), ("get, 1 callers", "200"), ("get, 3 callers", "300")]


def test_a_round_in_which_everything_fails_is_abandoned_clearly() -> None:
    cluster = FakeCluster(fail_every=1)
    with pytest.raises(RoundFailed, match="every call of the warm-up phase failed"):
        anyio.run(measure, cluster, TINY, None)
    assert all(client.closed for client in cluster.clients)


class FakeSystem:
    """Starts FakeClusters that leave a data file in their directory; `broken` ones refuse
    every call. Records which earlier rounds' directories still exist at each start."""

    def __init__(self, name: str, seen: list[tuple[str, list[str]]], *, broken: bool = False
                 ) -> None:
        self.name, self.seen, self.broken = name, seen, broken

    def prepare(self, work_dir: pathlib.Path) -> None:
        pass

    def start(self, directory: pathlib.Path) -> FakeCluster:
        rounds = directory.parent.parent
        self.seen.append((directory.name, sorted(str(path.relative_to(rounds))
                                                 for path in rounds.glob("*/*/data"))))
        (directory / "data").write_bytes(b"x" * 1024)
        return FakeCluster(fail_every=1) if self.broken else FakeCluster()


def test_a_measured_round_s_data_goes_at_once_and_a_failed_one_s_at_the_end(
        tmp_path: pathlib.Path) -> None:
    seen: list[tuple[str, list[str]]] = []
    prepared = [suite.Prepared(name, FakeSystem(name, seen, broken=name == "broken"), None,
                               None) for name in ("good", "broken")]
    args = argparse.Namespace(rounds=2, no_failover=True)
    collected = suite._all_rounds(args, TINY, prepared, tmp_path)
    assert len(collected["good"].rounds) == 2 and len(collected["broken"].failures) == 2
    assert seen == [("good", []), ("broken", []), ("broken", ["round-0/broken/data"]),
                    ("good", ["round-0/broken/data", "round-1/broken/data"])]
    assert list(tmp_path.iterdir()) == []


def _outcome(name: str, rounds: list[dict[str, float]], synced: bool = True) -> SystemOutcome:
    return SystemOutcome(name, 3, Durability(synced, "test"), "1.0", tuple(rounds))


def _figures(c1: float, c3: float, p50_ms: float, read: float) -> dict[str, float]:
    return {"put_16b_c1_ops_per_s": c1, "put_16b_c3_ops_per_s": c3,
            "put_16b_single_p50_ms": p50_ms, "put_1kb_c1_ops_per_s": c1 / 2,
            "put_1kb_single_p50_ms": p50_ms * 2, "get_c3_ops_per_s": read,
            "get_single_p50_ms": p50_ms / 2}


def synthetic_results() -> Results:
    cellar = [_figures(100, 300, 2.0, 900), _figures(120, 280, 3.0, 1000),
              _figures(90, 310, 2.5, 950)]  # medians: peak 300, p50 2.5, reads 950
    etcd = [_figures(50, 150, 5.0, 380), _figures(60, 140, 5.0, 400),
            _figures(40, 160, 5.0, 390)]  # medians: peak 150, p50 5.0, reads 390
    systems = (_outcome("cellar-3", cellar), _outcome("etcd", etcd),
               _outcome("cellar-3-nosync", cellar, synced=False),
               SystemOutcome("pysyncobj", None, None, None, skipped="not installed"))
    wan = (WanRow(3, "CA", 20.0, 20.0, 20.0, 21.0), WanRow(3, "OH", 52.0, 72.0, 52.0, None))
    return Results("cellar bench peers --rounds 3", "2025-01-01T00:00:00+00:00",
                   {"cpu_model": "test", "cores": 2}, {"rounds": 3, "connections": 4},
                   (1, 3), systems, wan)


@pytest.mark.parametrize(("arguments", "message"), [
    (["--rounds", "0"], "argument --rounds: must be at least 1, not 0"),
    (["--connections", "-2"], "argument --connections: must be at least 1, not -2"),
    (["--sim-seconds", "x"], "argument --sim-seconds: not a whole number: 'x'"),
    (["--seconds", "0"], "argument --seconds: must be above 0 and finite, not 0"),
    (["--seconds", "inf"], "argument --seconds: must be above 0 and finite, not inf"),
    (["--latency-seconds", "nan"], "argument --latency-seconds: must be above 0 and finite"),
    (["--timeout-seconds", "-1"], "argument --timeout-seconds: must be above 0 and finite"),
    (["--warmup-seconds", "-0.5"], "argument --warmup-seconds: must be 0 or more and finite"),
])
def test_a_bad_setting_is_named_with_its_value(
        arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["bench", "peers", "--no-install", *arguments])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("clients", ["0", "1,x", ",", "4,-1"])
def test_bad_caller_counts_are_refused_by_the_parser(
        clients: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["bench", "peers", "--clients", clients])
    assert stopped.value.code == 2
    assert f"positive integers, not {clients!r}" in capsys.readouterr().err


def test_ratios_say_how_much_better_cellar_is_and_null_against_a_skipped_peer() -> None:
    found = ratios(synthetic_results())
    assert found["ratio_throughput_etcd"] == pytest.approx(300 / 150)
    assert found["ratio_latency_etcd"] == pytest.approx(5.0 / 2.5)
    assert found["ratio_throughput_1kb_etcd"] == pytest.approx(50 / 25)
    assert found["ratio_latency_1kb_etcd"] == pytest.approx(10.0 / 5.0)
    assert found["ratio_read_throughput_etcd"] == pytest.approx(950 / 390)
    assert found["ratio_read_latency_etcd"] == pytest.approx(2.5 / 1.25)
    pysyncobj = [name for name in found if "pysyncobj" in name]
    assert len(pysyncobj) == 18 and all(found[name] is None for name in pysyncobj)
    assert all(found[name] is None for name in found if name.endswith("_etcd_plain"))


def test_the_json_has_the_headline_ratios_on_top_and_no_nan() -> None:
    document = json.loads(json.dumps(as_json(synthetic_results()), allow_nan=False))
    for name in HEADLINE_RATIOS:
        assert name in document and document[name] == document["ratios"][name]
    assert document["ratio_throughput_pysyncobj"] is None
    assert document["skipped"] == {"pysyncobj": "not installed"}
    assert document["systems"]["etcd"]["spread"]["put_16b_c3_ops_per_s"] == {
        "min": 140, "median": 150, "max": 160, "runs": 3}
    assert document["sim_wan"][1]["multipaxos_ms"] == 72.0


def test_every_figure_both_sides_measured_gets_an_oriented_ratio() -> None:
    by_figure = figure_ratios(synthetic_results())
    assert by_figure["etcd"]["put_16b_c3_ops_per_s"] == pytest.approx(300 / 150)
    assert by_figure["etcd"]["put_16b_single_p50_ms"] == pytest.approx(5.0 / 2.5)
    assert by_figure["etcd"]["get_c3_ops_per_s"] == pytest.approx(950 / 390)
    assert by_figure["pysyncobj"] == {}  # skipped: nothing to compare with
    assert "| put_16b_c3_ops_per_s | 2.00 |" in markdown(synthetic_results(), [])


def test_a_saved_results_json_redraws_to_the_same_document() -> None:
    document = json.loads(json.dumps(as_json(synthetic_results())))
    assert as_json(results_from_json(document)) == document


def test_a_peer_run_two_ways_is_compared_at_its_better_figure() -> None:
    """PySyncObj as shipped (throughput) and with batching off (latency): each ratio takes
    whichever configuration did better on that figure."""
    results = synthetic_results()
    batched = _outcome("pysyncobj", [_figures(10, 200, 100.0, 150)], synced=False)
    unbatched = _outcome("pysyncobj-nobatch", [_figures(80, 120, 1.0, 100)], synced=False)
    found = ratios(dataclasses.replace(results, systems=(*results.systems[:3], batched,
                                                           unbatched)))
    assert found["ratio_throughput_pysyncobj"] == pytest.approx(300 / 200)  # the batched one
    assert found["ratio_latency_pysyncobj"] == pytest.approx(1.0 / 2.5)  # the unbatched one


def test_cellar_run_two_ways_is_compared_at_its_better_figure_too() -> None:
    """Clients spread over the replicas (throughput) and sent to the sequencer's replica
    (latency): Cellar's side of each ratio, and of each figure's ratio, is its better one."""
    results = synthetic_results()
    routed = _outcome("cellar-3-seq", [_figures(100, 200, 1.25, 900)])
    with_routed = dataclasses.replace(results, systems=(*results.systems, routed))
    found = ratios(with_routed)
    assert found["ratio_throughput_etcd"] == pytest.approx(300 / 150)  # spread
    assert found["ratio_latency_etcd"] == pytest.approx(5.0 / 1.25)  # routed
    by_figure = figure_ratios(with_routed)["etcd"]
    assert by_figure["put_16b_single_p50_ms"] == pytest.approx(5.0 / 1.25)
    assert by_figure["put_16b_c3_ops_per_s"] == pytest.approx(300 / 150)
    assert "cellar-3 or cellar-3-seq" in "\n".join(table_lines(with_routed))


def test_the_plain_ratios_compare_cellar_over_plain_tcp_and_the_headline_ones_keep_tls(
) -> None:
    """The peers run here without TLS: the `_plain` ratios put Cellar over plain TCP beside
    them, and only those; the headline ratios keep Cellar as it ships, with TLS, however much
    better its plain configuration did."""
    results = synthetic_results()
    plain = _outcome("cellar-3-plain-seq", [_figures(100, 600, 1.0, 2000)])
    plain_unsynced = _outcome("cellar-3-plain-nosync-seq", [_figures(100, 900, 0.5, 3000)],
                              synced=False)
    pysyncobj = _outcome("pysyncobj-nobatch", [_figures(80, 120, 1.0, 100)], synced=False)
    found = ratios(dataclasses.replace(
        results, systems=(*results.systems[:3], plain, plain_unsynced, pysyncobj)))
    assert found["ratio_throughput_etcd"] == pytest.approx(300 / 150)  # cellar-3, with TLS
    assert found["ratio_latency_etcd"] == pytest.approx(5.0 / 2.5)
    assert found["ratio_throughput_etcd_plain"] == pytest.approx(600 / 150)
    assert found["ratio_latency_etcd_plain"] == pytest.approx(5.0 / 1.0)
    assert found["ratio_latency_pysyncobj"] == pytest.approx(1.0 / 2.5)  # cellar-3-nosync
    assert found["ratio_latency_pysyncobj_plain"] == pytest.approx(1.0 / 0.5)
    assert found["ratio_throughput_pysyncobj_plain"] == pytest.approx(900 / 120)
    assert "cellar-3-plain-seq" in ratio_meaning("ratio_latency_etcd_plain")


def _cellar_system(name: str) -> CellarSystem:
    """The suite's Cellar configuration `name`, made as `suite.load_system` makes it."""
    options: dict[str, Any] = dict(suite.SYSTEMS[name].options)
    return CellarSystem(**options)


def test_every_cellar_configuration_is_named_as_the_suite_lists_it() -> None:
    """A system's name is its key in the suite (the report and the ratios find it by that):
    each Cellar configuration says how it syncs, routes and whether it runs TLS."""
    for name, entry in suite.SYSTEMS.items():
        if entry.attribute != "CellarSystem":
            continue
        system = _cellar_system(name)
        assert system.name == name
        transport = system.durability.description
        if "-plain" in name:
            assert "plain TCP, no TLS" in transport and not system.tls
        else:
            assert "mutual TLS" in transport and system.tls
        assert ("a command of its own" in transport) == (system.puts_max == 1) == \
            name.endswith("-unbatched")


def test_the_table_and_the_page_show_every_system_and_ratio() -> None:
    results = synthetic_results()
    text = "\n".join(table_lines(results) + wan_lines(results.wan or ()))
    page = markdown(results, ["throughput.png"])
    for shown in (text, page):
        assert "put 16 B, 3 callers" in shown and "not installed" in shown
        assert "ratio_throughput_etcd" in shown and "2.00" in shown
    assert "![throughput.png](throughput.png)" in page and "Multi-Paxos" in page


class NeedsInstall:
    name = "needs-install"

    def prepare(self, work_dir: pathlib.Path) -> None:
        if os.environ.get(NO_INSTALL_ENV) == "1":
            raise PeerUnavailable("not installed; run without --no-install to install")
        raise AssertionError("the test would have installed something")


def test_no_install_makes_an_install_a_skip_and_restores_the_environment(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.delenv(NO_INSTALL_ENV, raising=False)
    monkeypatch.setitem(suite.SYSTEMS, "needs-install",
                        suite.SystemEntry(__name__, "NeedsInstall"))
    monkeypatch.setitem(suite.SYSTEMS, "missing",
                        suite.SystemEntry("cellar.bench.peers.no_such_peer", "NoSystem"))
    with suite.install_policy(False):
        prepared = [suite.prepare(name, tmp_path) for name in ("needs-install", "missing")]
    assert prepared[0].reason == "not installed; run without --no-install to install"
    assert prepared[1].reason is not None and "No module named" in prepared[1].reason
    assert NO_INSTALL_ENV not in os.environ


@pytest.mark.parametrize(("flag", "environment", "allowed"), [
    (False, None, True), (True, None, False), (False, "1", False), (False, "0", True)])
def test_installs_are_off_by_the_flag_or_the_environment(
        monkeypatch: pytest.MonkeyPatch, flag: bool, environment: str | None,
        allowed: bool) -> None:
    """The settings a run records say whether it could install: the environment variable
    turned installs off without the flag, and the run recorded no_install false."""
    if environment is None:
        monkeypatch.delenv(NO_INSTALL_ENV, raising=False)
    else:
        monkeypatch.setenv(NO_INSTALL_ENV, environment)
    assert suite.installs_allowed(argparse.Namespace(no_install=flag)) is allowed


@pytest.mark.live
@pytest.mark.timeout(60)
def test_a_plain_cellar_configuration_runs_its_cluster_over_plain_tcp(
        tmp_path: pathlib.Path) -> None:
    """cellar-3-plain-nosync-seq: replicas configured insecure (no certificates made), a client
    over plain TCP with a session for each caller it is told of, and the key-value store
    answering through it."""
    system = _cellar_system("cellar-3-plain-nosync-seq")
    cluster = system.start(tmp_path)
    try:
        assert cluster.layout.insecure and not (tmp_path / "certs").exists()
        configurations = sorted(tmp_path.glob("replica-*.toml"))
        assert len(configurations) == 3
        assert all("insecure = true" in path.read_text() for path in configurations)

        async def put_and_get() -> bytes | None:
            default = await cluster.connect()
            await default.aclose()
            client = await cluster.connect(100)
            try:
                # a session for each caller it was told of, and never fewer than the default
                assert client._client.config.sessions == 100
                assert default._client.config.sessions == ClientConfig().sessions == 64
                await client.put(b"plain", b"tcp")
                return await client.get(b"plain")
            finally:
                await client.aclose()

        assert anyio.run(put_and_get) == b"tcp"
    finally:
        cluster.stop()


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_tiny_live_run_writes_every_output(tmp_path: pathlib.Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["bench", "peers", "--systems", "cellar-3,etcd,pysyncobj", "--rounds", "1",
                 "--clients", "1,4", "--seconds", "0.3", "--latency-seconds", "0.3",
                 "--warmup-seconds", "0.2", "--connections", "2", "--no-install", "--no-sim",
                 "--work-dir", str(tmp_path / "work"), "--out", str(out), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    for name in HEADLINE_RATIOS:
        assert name in document
    cellar = document["systems"]["cellar-3"]
    assert cellar["status"] == "measured" and cellar["durability"]["synced"] is True
    assert cellar["median"]["put_16b_c4_ops_per_s"] > 0
    assert math.isfinite(cellar["median"]["put_16b_single_p50_ms"])
    assert document["failover_ms"]["median"] > 0
    for peer in ("etcd", "pysyncobj"):
        status = document["systems"][peer]["status"]
        assert status == "measured" or peer in document["skipped"]
        if status == "skipped":
            assert document[f"ratio_throughput_{peer}"] is None
    assert document["machine"]["cores"] >= 1 and document["sim_wan"] is None
    for name in ("results.json", "report.md", "throughput.png", "latency.png"):
        assert (out / name).stat().st_size > 0, name
    assert not list((tmp_path / "work").glob("clusters-*"))


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigterm_mid_run_stops_the_clusters_and_removes_their_data(
        tmp_path: pathlib.Path) -> None:
    """A run stopped by SIGTERM (a CI job's timeout, `kill`) takes its replicas and their data
    with it instead of leaving them running."""
    work = tmp_path / "work"
    process = subprocess.Popen(
        [sys.executable, "-m", "cellar", "bench", "peers", "--systems", "cellar-3",
         "--rounds", "1", "--clients", "1", "--seconds", "30", "--latency-seconds", "30",
         "--no-install", "--no-sim", "--no-failover", "--work-dir", str(work),
         "--out", str(tmp_path / "out")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    deadline = time.monotonic() + 60
    while not list(work.glob("clusters-*/*/*/replica-*.log")):  # its replicas are starting
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.2)
    time.sleep(3)  # its replicas running, the phases under way
    process.send_signal(signal.SIGTERM)
    try:
        output, _ = process.communicate(timeout=60)
    finally:  # a failure here must not leave replicas running
        replicas = kill_leftovers(work)
    assert process.returncode == 128 + signal.SIGTERM, output
    assert not list(work.glob("clusters-*")), output
    assert replicas == "", "replica processes outlived the run"


def test_every_system_of_a_full_run_has_its_own_colour_and_the_peers_are_dashed() -> None:
    names = list(suite.SYSTEMS)  # every system a full run measures, in its order
    styles = [line_style(index, name) for index, name in enumerate(names)]
    assert len({color for color, _ in styles}) == len(names)
    for name, (_, line) in zip(names, styles, strict=True):
        assert line == ("o-" if name.startswith("cellar") else "s--")
