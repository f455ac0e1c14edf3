"""`cellar live`: the link relays cut and slow what they should, and a short run of real
replicas under every kind of fault stays linearizable and recovers after the heal."""

from __future__ import annotations

import dataclasses
import pathlib
import signal
import subprocess
from types import SimpleNamespace

import anyio
import anyio.abc
import pytest

from cellar.cli import main
from cellar.live.command import _report
from cellar.live.nemesis import LiveNemesis
from cellar.live.relays import LinkRelays
from cellar.live.run import LiveOptions, LiveResult, run_live
from cellar.local_cluster import HOST, ProcessCluster
from jepsen.checker import check
from jepsen.history import HistoryRecorder
from jepsen.models import KvModel
from jepsen.sim.nemesis import Fault, NemesisEvent
from jepsen.verdict import Verdict
from tests.cellar.leftovers import kill_leftovers

pytestmark = [pytest.mark.live, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def echo_server(task_group: anyio.abc.TaskGroup) -> int:
    """A server that sends back what it reads; returns its port."""
    async def echo(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            async for chunk in stream:
                await stream.send(chunk)

    listener = await anyio.create_tcp_listener(local_host=HOST, local_port=0)
    task_group.start_soon(listener.serve, echo)
    return int(listener.extra(anyio.abc.SocketAttribute.local_port))


async def round_trip_s(port: int) -> float:
    async with await anyio.connect_tcp(HOST, port) as stream:
        started = anyio.current_time()
        await stream.send(b"ping")
        assert await stream.receive() == b"ping"
        return anyio.current_time() - started


async def test_a_relay_passes_a_link_slows_it_and_cuts_it() -> None:
    relays = LinkRelays(2)
    await relays.bind()
    async with anyio.create_task_group() as group:
        target = await echo_server(group)
        await group.start(relays.serve, [target, target])
        port = relays.routes[(0, 1)]
        assert await round_trip_s(port) < 0.1
        relays.set_links(cut=(), slowed={(0, 1)}, delay_s=0.3)
        assert await round_trip_s(port) >= 0.6  # held once each way
        assert await round_trip_s(relays.routes[(1, 0)]) < 0.1  # the other direction's link
        async with await anyio.connect_tcp(HOST, port) as open_stream:
            relays.set_links(cut={(0, 1)}, slowed=(), delay_s=0.0)
            with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                await open_stream.send(b"lost")
                await open_stream.receive()  # the cut closed the connection under way
        async with await anyio.connect_tcp(HOST, port) as refused:
            with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                await refused.send(b"refused")
                await refused.receive()
        relays.set_links(cut=(), slowed=(), delay_s=0.0)
        assert await round_trip_s(port) < 0.1
        group.cancel_scope.cancel()


async def test_real_replicas_under_every_kind_of_fault_stay_linearizable(
        tmp_path: pathlib.Path) -> None:
    options = LiveOptions(seed=3, fault_s=8.0, heal_s=5.0, processes=4,
                          partition_every_ms=1500, crash_every_ms=2500, pause_every_ms=2500,
                          clog_every_ms=2500, fault_duration_ms=1500)
    kinds = {event.fault for event in options.schedule()}
    assert {Fault.CRASH, Fault.PAUSE, Fault.CLOG} <= kinds
    assert kinds - {Fault.CRASH, Fault.PAUSE, Fault.CLOG}  # and partitions
    try:
        result = await run_live(options, tmp_path)
    finally:
        assert kill_leftovers(tmp_path) == ""  # every replica stopped, none left paused
    assert result.ok, (result.check.verdict, result.unsettled)
    assert result.ok_operations > 100
    assert None not in result.views and result.views[0] <= result.views[1]  # type: ignore[operator]
    faults = [event for event in result.history.events if event.process == "nemesis"]
    # each fault started, or skipped when finding the sequencer outlasted its window
    assert len([event for event in faults if event.f in ("start", "skip")]) == \
        len(result.schedule)
    assert (tmp_path / "history.jsonl").exists()
    assert (tmp_path / "report.html").exists()


async def test_a_run_finds_replicas_that_serve_reads_from_local_state(
        tmp_path: pathlib.Path) -> None:
    """A run with a deliberate defect (reads answered from each replica's own state, without
    the sequencer's read index) is found not linearizable: the run can fail. Replica 2 is cut
    off, so the clients that start there read its stale state while the others write (mostly
    reads: a client moves on from replica 2 once one of its writes times out there). Whether
    a stale read lands in the history depends on timing (on a loaded machine the clients at
    replica 2 may move on first): up to three seeds, and every run caught fails."""
    verdicts = []
    for seed in (3, 4, 5):
        options = LiveOptions(seed=seed, fault_s=4.0, heal_s=4.0, processes=6,
                              read_fraction=0.9,
                              explicit_schedule=(NemesisEvent(0, Fault.ISOLATE, 2, 4000),),
                              defects=("local-reads",))
        directory = tmp_path / f"seed-{seed}"
        try:
            result = await run_live(options, directory)
        finally:
            kill_leftovers(directory)
        verdicts.append(result.check.verdict)
        if result.check.verdict is Verdict.NOT_LINEARIZABLE:
            assert not result.ok
            return
    raise AssertionError(f"the stale reads were never caught: {verdicts}")


def test_the_command_refuses_a_run_directory_in_use(tmp_path: pathlib.Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "left-over").write_text("x")
    assert main(["live", "--dir", str(tmp_path)]) == 3
    assert "is not empty" in capsys.readouterr().err
    assert main(["live", "--dir", str(tmp_path / "new"), "--heal-seconds", "1"]) == 3
    assert main(["live", "--dir", str(tmp_path / "new"), "--schedule", "100:crash:3:500"]) == 3
    assert "target 3 is no replica" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--seconds", "0"], ["--clients", "0"], ["--schedule", "x"],
                                  ["--replicas", "4"]])
def test_bad_arguments_exit_3_not_2_which_says_the_verdict_is_unknown(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["live", *argv])
    assert caught.value.code == 3
    assert "cellar live: error: argument" in capsys.readouterr().err


def test_a_cluster_that_never_starts_is_a_usage_error_and_leaves_nothing(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    def never_serves(self: ProcessCluster, timeout_s: float = 20.0) -> None:
        raise RuntimeError("replica 1 did not start")

    monkeypatch.setattr(ProcessCluster, "wait_ports", never_serves)
    assert main(["live", "--dir", str(tmp_path / "run")]) == 3
    assert "could not start: replica 1 did not start" in capsys.readouterr().err
    assert kill_leftovers(tmp_path) == ""


class FakeReplica:
    """A replica process as the nemesis sees it: running, or exited with a status."""

    def __init__(self) -> None:
        self.process: subprocess.CompletedProcess[bytes] | None = None
        self.running = True
        self.starts = 0
        self.rejoins = 0  # starts with --rejoin

    def exit(self, status: int) -> None:
        self.process = subprocess.CompletedProcess([], status)
        self.running = False

    def kill(self) -> None:
        self.exit(-9)

    def start(self, *, rejoin: bool = False) -> None:
        self.running, self.starts = True, self.starts + 1
        self.rejoins += rejoin

    def bound(self) -> bool:  # its death signal armed: it may be paused at once
        return True


def test_a_replica_that_stops_by_itself_is_a_failure_and_a_crash_is_not() -> None:
    """The nemesis's own `kill -9` is expected; a replica that exits on its own (an invariant's
    assert) must not be hidden by the restart at the heal."""
    replicas = [FakeReplica() for _ in range(3)]
    recorder = HistoryRecorder()
    nemesis = LiveNemesis(SimpleNamespace(processes=replicas), LinkRelays(3),  # type: ignore[arg-type]
                          recorder, find_sequencer=lambda: anyio.sleep(0), clog_ms=0)

    async def crash_and_fail() -> None:
        # Replica 1's crash comes while replica 0's holds it down: 0 is not reported then.
        crashes = (NemesisEvent(0, Fault.CRASH, 0, 200), NemesisEvent(50, Fault.CRASH, 1, 50))
        await nemesis.run(crashes, anyio.current_time())
        replicas[2].exit(134)

    anyio.run(crash_and_fail)
    assert [replica.starts for replica in replicas] == [1, 1, 0]  # each crash ended
    nemesis.heal()
    assert nemesis.exits == ["replica 2 exited by itself (status 134)"]
    assert [replica.running for replica in replicas] == [True, True, True]  # all back
    assert [event.value for event in recorder.history().events if event.f == "exit"] == [
        "replica 2 exited by itself (status 134)"]
    nemesis.note_exits()
    assert len(nemesis.exits) == 1


class SignalledReplica(FakeReplica):
    """A fake replica whose process records the signals the nemesis sends it."""

    def __init__(self) -> None:
        super().__init__()
        self.signals: list[signal.Signals] = []
        self.process = SimpleNamespace(send_signal=self.signals.append)  # type: ignore[assignment]

    def start(self, *, rejoin: bool = False) -> None:
        super().start(rejoin=rejoin)
        self.process = SimpleNamespace(send_signal=self.signals.append)  # type: ignore[assignment]


def test_a_crash_that_ends_inside_a_pause_restarts_the_replica_paused() -> None:
    replica = SignalledReplica()
    nemesis = LiveNemesis(SimpleNamespace(processes=[replica]), LinkRelays(1),  # type: ignore[arg-type]
                          HistoryRecorder(), find_sequencer=lambda: anyio.sleep(0), clog_ms=0)
    schedule = (NemesisEvent(0, Fault.PAUSE, 0, 300), NemesisEvent(50, Fault.CRASH, 0, 50))
    anyio.run(lambda: nemesis.run(schedule, anyio.current_time()))
    assert replica.starts == 1
    assert replica.signals == [signal.SIGSTOP, signal.SIGSTOP, signal.SIGCONT]  # paused again


def test_a_wipe_deletes_the_data_directory_and_the_replica_rejoins(
        tmp_path: pathlib.Path) -> None:
    """One replica at a time: once one lost its disk in a run, a wipe of another is a plain
    crash (recorded so); the same replica may lose its disk again."""
    replicas = [FakeReplica() for _ in range(3)]
    for replica in range(3):
        (tmp_path / f"data-{replica}").mkdir()
    recorder = HistoryRecorder()
    layout = SimpleNamespace(data_dir=lambda replica: tmp_path / f"data-{replica}")
    nemesis = LiveNemesis(SimpleNamespace(processes=replicas, layout=layout),  # type: ignore[arg-type]
                          LinkRelays(3), recorder, find_sequencer=lambda: anyio.sleep(0),
                          clog_ms=0)
    schedule = (NemesisEvent(0, Fault.WIPE, 1, 50), NemesisEvent(100, Fault.WIPE, 2, 50),
                NemesisEvent(200, Fault.WIPE, 1, 50))
    anyio.run(lambda: nemesis.run(schedule, anyio.current_time()))
    assert [replica.rejoins for replica in replicas] == [0, 2, 0]
    assert [replica.starts for replica in replicas] == [0, 2, 1]
    assert [(tmp_path / f"data-{replica}").exists() for replica in range(3)] == \
        [True, False, True]
    assert [event.value for event in recorder.history().events if event.f == "plain"] == [
        "wipe 2 left a plain crash: replica 1 lost its disk in this run"]


def test_a_held_cut_cuts_the_live_links_as_the_plain_cut_does() -> None:
    """The relays close a cut link's connections and the sender keeps what it sends meanwhile:
    the simulator's held cuts are what a live cut always was."""
    cuts: list[set[tuple[int, int]]] = []
    relays = SimpleNamespace(set_links=lambda cut, slowed, delay_s: cuts.append(set(cut)))
    nemesis = LiveNemesis(SimpleNamespace(processes=[FakeReplica() for _ in range(3)]),  # type: ignore[arg-type]
                          relays, HistoryRecorder(),  # type: ignore[arg-type]
                          find_sequencer=lambda: anyio.sleep(0), clog_ms=0)
    # Windows long enough that a loaded machine's stall does not make one start after its end
    # (a fault whose window passed before it started is skipped, as it should be).
    schedule = (NemesisEvent(0, Fault.MUTE_HELD, 1, 300), NemesisEvent(400, Fault.MUTE, 1, 300))
    anyio.run(lambda: nemesis.run(schedule, anyio.current_time()))
    assert cuts == [{(1, 0), (1, 2)}, set(), {(1, 0), (1, 2)}, set()]


def test_a_run_with_failed_operations_after_the_heal_fails_even_if_the_checker_gave_up(
        tmp_path: pathlib.Path) -> None:
    history = HistoryRecorder().history()
    unknown = dataclasses.replace(check(KvModel(), history), verdict=Verdict.UNKNOWN)
    result = LiveResult(LiveOptions(), (), history, unknown, 10, 8, unsettled=2,
                        views=(1, 1), exits=(), settled_ok=5)
    assert _report(result, tmp_path) == 1
    assert _report(dataclasses.replace(result, unsettled=0), tmp_path) == 2
    assert _report(dataclasses.replace(result, unsettled=0, exits=("replica 1 exited",)),
                   tmp_path) == 1
    assert _report(dataclasses.replace(result, unsettled=0, settled_ok=0), tmp_path) == 1
