"""The per-host budget of failed handshakes (`consensus/runtime/handshake_guard.py`)."""

from __future__ import annotations

import logging

import pytest

from consensus.runtime.handshake_guard import HandshakeGuard

ATTACKER = "203.0.113.9"
OTHER = "198.51.100.4"


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def guard_for(clock: Clock, **options: object) -> HandshakeGuard:
    return HandshakeGuard(failures_max=4, window_s=8.0, clock=clock,
                          **options)  # type: ignore[arg-type]


def test_a_host_is_barred_once_it_spends_its_budget_and_only_that_host() -> None:
    guard = guard_for(Clock())
    for _ in range(3):
        guard.failed(ATTACKER)
        assert not guard.barred(ATTACKER)
    guard.failed(ATTACKER)
    assert guard.barred(ATTACKER)
    assert not guard.barred(OTHER)


def test_the_budget_refills_at_its_rate() -> None:
    clock = Clock()
    guard = guard_for(clock)
    for _ in range(4):
        guard.failed(ATTACKER)
    clock.now_s += 1.9  # 4 per 8 s: one failure back every 2 s
    assert guard.barred(ATTACKER)
    clock.now_s += 0.1
    assert not guard.barred(ATTACKER)
    guard.failed(ATTACKER)  # the one it got back
    assert guard.barred(ATTACKER)
    clock.now_s += 1000  # refills to the budget, never past it
    for _ in range(3):
        guard.failed(ATTACKER)
    assert not guard.barred(ATTACKER)
    guard.failed(ATTACKER)
    assert guard.barred(ATTACKER)


def test_the_table_forgets_the_host_seen_longest_ago() -> None:
    guard = guard_for(Clock(), hosts_max=2)
    for _ in range(4):
        guard.failed(ATTACKER)
    guard.failed(OTHER)
    assert guard.barred(ATTACKER) and guard.hosts == 2
    guard.failed("192.0.2.1")  # a third host: the attacker, seen longest ago, is forgotten
    assert guard.hosts == 2
    assert not guard.barred(ATTACKER)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.4.5", "::1", "::ffff:127.0.0.1", None,
                                  "/run/cellar.sock"])
def test_loopback_and_unknown_addresses_are_never_charged(host: str | None) -> None:
    guard = guard_for(Clock())
    for _ in range(10):
        guard.failed(host)
    assert not guard.barred(host)
    assert guard.hosts == 0


def test_an_ipv4_mapped_remote_address_is_charged() -> None:
    guard = guard_for(Clock())
    for _ in range(4):
        guard.failed("::ffff:203.0.113.9")
    assert guard.barred("::ffff:203.0.113.9")


def test_loopback_is_charged_when_asked() -> None:
    guard = guard_for(Clock(), loopback_exempt=False)
    for _ in range(4):
        guard.failed("127.0.0.1")
    assert guard.barred("127.0.0.1")


def test_barring_a_host_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    guard = guard_for(Clock())
    with caplog.at_level(logging.WARNING, logger="cellar.transport"):
        for _ in range(3):
            guard.failed(ATTACKER)
        assert caplog.text == ""
        guard.failed(ATTACKER)
    assert f"{ATTACKER} failed 4 handshakes within 8 s" in caplog.text


@pytest.mark.parametrize("options", [{"failures_max": 0}, {"window_s": 0.0},
                                     {"hosts_max": 0}, {"window_s": float("nan")}])
def test_bounds_must_be_positive(options: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        HandshakeGuard(**options)  # type: ignore[arg-type]


def test_failures_at_once_bar_a_host_no_longer_than_its_budget_takes_to_refill_one() -> None:
    """Handshakes started together all pass the check before any fails: their failures spend
    the budget to nothing, not below it (it would bar the host for far longer than the
    window)."""
    clock = Clock()
    guard = guard_for(clock)
    for _ in range(100):
        guard.failed(ATTACKER)
    assert guard.barred(ATTACKER)
    clock.now_s += 2.0  # one failure's worth, 8 s / 4
    assert not guard.barred(ATTACKER)
