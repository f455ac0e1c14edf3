"""What a new user meets first: the key-value store's client API refuses what every
replica would refuse before sending it, `cellar dev` says in one line that its cluster did not
start, and the live view's commits per second are per second of the refresh they cover."""

from __future__ import annotations

import argparse
import pathlib
from typing import Any, cast

import anyio
import pytest

from cellar.cli import main
from cellar.dev import command as dev_command
from cellar.dev import view
from cellar.dev.command import Run
from cellar.kv.codec import KEY_BYTES_MAX, VALUE_BYTES_MAX
from cellar.kv.machine import KvMachine
from cellar.kv.store import KvStore
from cellar.local_cluster import ProcessCluster
from consensus.codec import encode_envelope
from consensus.envelope import Envelope, Principal, Role
from consensus.runtime.client import Unavailable


class MachineClient:
    """A client that applies each command to one KvMachine, recording what it sent."""

    def __init__(self) -> None:
        self.machine = KvMachine()
        self.sent: list[bytes] = []

    async def propose(self, body: bytes, **_: object) -> bytes:
        self.sent.append(body)
        return self.machine.apply(encode_envelope(Envelope(
            principal=Principal(Role.ADMIN, "a"), session="s", sequence=len(self.sent),
            now_ms=1000, body=body)))

    async def read(self, query: bytes, **_: object) -> bytes:
        self.sent.append(query)
        return self.machine.query(query)


@pytest.mark.parametrize(("key", "value", "error", "says"), [
    (b"k" * (KEY_BYTES_MAX + 1), b"v", ValueError, f"at most {KEY_BYTES_MAX}"),
    (b"k", b"v" * (VALUE_BYTES_MAX + 1), ValueError, f"at most {VALUE_BYTES_MAX}"),
    ("k", b"v", TypeError, "must be bytes, not str"),
    (b"k", "v", TypeError, "must be bytes, not str"),
])
def test_a_put_every_replica_would_refuse_is_refused_before_it_is_sent(
        key: Any, value: Any, error: type[Exception], says: str) -> None:
    """It had gone through consensus (a log slot) to come back as KvRefused BAD_REQUEST,
    which names neither the field nor the bound."""
    client = MachineClient()
    store = KvStore(cast(Any, client))
    with pytest.raises(error, match=says):
        anyio.run(store.put, key, value)
    assert client.sent == []
    if value == b"v":  # the key is what is wrong: a get of it too
        with pytest.raises(error, match=says):
            anyio.run(store.get, key)
    assert client.sent == []
    anyio.run(store.put, b"k" * KEY_BYTES_MAX, b"v" * VALUE_BYTES_MAX)  # the bounds themselves
    assert anyio.run(store.get, b"k" * KEY_BYTES_MAX) == b"v" * VALUE_BYTES_MAX


def test_a_replica_that_does_not_start_is_said_in_one_line_not_a_traceback(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    stopped: list[bool] = []

    def did_not_start(self: ProcessCluster, timeout_s: float = 20.0) -> None:
        raise RuntimeError("replica 1 did not start; see replica-1.log: address in use")

    monkeypatch.setattr(ProcessCluster, "start", lambda self: None)
    monkeypatch.setattr(ProcessCluster, "wait_ports", did_not_start)
    monkeypatch.setattr(ProcessCluster, "stop", lambda self, grace_s=10.0: stopped.append(True))
    assert main(["dev", "--data-dir", str(tmp_path), "--nodes", "4"]) == 2
    assert capsys.readouterr().err == ("cellar dev: the cluster could not start: replica 1 did "
                                       "not start; see replica-1.log: address in use\n")
    assert stopped == [True]


class SlowStatusClient:
    """Replicas whose status takes 0.2 s to answer, each having applied 1,000 more commands
    at every refresh."""

    def __init__(self) -> None:
        self.asked = 0

    async def status(self, endpoint: str) -> dict[str, Any]:
        await anyio.sleep(0.2)
        self.asked += 1
        refresh = (self.asked - 1) // 3 + 1
        return {"view": 0, "metrics": {"driver.commands_applied": 1000 * refresh}}

    async def read(self, query: bytes, **_: object) -> bytes:
        raise Unavailable("no gangs here")


def test_the_live_view_shows_commits_per_second_not_per_refresh(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A refresh is 1 s of sleep plus the status queries (longer still while a replica is
    down or an election runs): 1,000 commits over a 1.6 s refresh are 625 a second."""
    frames: list[Any] = []
    monkeypatch.setattr(view.Screen, "show", lambda self, frame: frames.append(frame))
    cluster = argparse.Namespace(layout=argparse.Namespace(endpoints=["r0", "r1", "r2"]))
    state = Run(argparse.Namespace(seconds=3.5), cast(Any, cluster))
    anyio.run(dev_command._watch, state, cast(Any, SlowStatusClient()))
    assert len(frames) >= 2
    assert 500 < frames[1].commits_per_s < 750, [frame.commits_per_s for frame in frames]
