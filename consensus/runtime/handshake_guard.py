"""Failed handshakes, counted per remote host: a host that keeps failing is barred for a while.

The listeners bound how many connections may be in their handshake at once (`accept.Slots`),
but not how often: a host that opens connection after connection with no valid certificate
(or with one whose identity the listener refuses) makes the replica pay a full TLS handshake,
public-key operations included, for each. That is the cheapest way to burn a replica's CPU
without credentials.

Each host has a budget of `failures_max` failed handshakes, refilled at `failures_max` per
`window_s`: a host that spends it has its next connections closed before any handshake, until
the budget refills by one. A host that authenticates is not charged, so clients with valid
certificates never notice the guard. Hosts behind one address (a NAT) share its budget; a
client there that fails through bad configuration can bar the others for up to `window_s`.

Loopback addresses are exempt unless `loopback_exempt=False`: a host on the replica's own
machine is already inside, and a local cluster (the demo, the harness's clusters whose nemesis
kills processes mid-handshake) has every replica and client at 127.0.0.1, where one bad actor
would bar all of them.

The table of hosts is bounded (`hosts_max`): past it the host seen longest ago is forgotten,
which gives it a full budget again. An attacker with more addresses than that is not stopped
here; the handshake slots still bound what it holds at once.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger("cellar.transport")

HANDSHAKE_FAILURES_MAX = 16  # a host's budget of failed handshakes
HANDSHAKE_FAILURE_WINDOW_S = 10.0  # the budget refills fully in this time
HANDSHAKE_HOSTS_MAX = 4096  # hosts remembered at once


@dataclass(slots=True)
class _Budget:
    failures_left: float
    at_s: float  # when failures_left was last brought up to date


class HandshakeGuard:
    """Per-host budgets of failed handshakes; see the module docstring."""

    __slots__ = ("_budgets", "_clock", "_refill_per_s", "failures_max", "hosts_max",
                 "loopback_exempt", "window_s")

    def __init__(self, *, failures_max: int = HANDSHAKE_FAILURES_MAX,
                 window_s: float = HANDSHAKE_FAILURE_WINDOW_S,
                 hosts_max: int = HANDSHAKE_HOSTS_MAX, loopback_exempt: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if failures_max <= 0 or hosts_max <= 0 or not window_s > 0:
            raise ValueError("failures_max, window_s and hosts_max must be positive, got "
                             f"{failures_max}, {window_s} and {hosts_max}")
        self.failures_max = failures_max
        self.window_s = window_s
        self.hosts_max = hosts_max
        self.loopback_exempt = loopback_exempt
        self._refill_per_s = failures_max / window_s
        self._clock = clock
        self._budgets: OrderedDict[str, _Budget] = OrderedDict()

    def barred(self, host: str | None) -> bool:
        """True when `host` spent its budget: close its connection before any handshake.
        An unknown address (None) and an exempt one are never barred."""
        if host is None or self._exempt(host):
            return False
        budget = self._budgets.get(host)
        return budget is not None and self._refilled(budget) < 1.0

    def failed(self, host: str | None) -> None:
        """Charge `host` one failed handshake (logged when that spends its budget)."""
        if host is None or self._exempt(host):
            return
        budget = self._budgets.pop(host, None)
        if budget is None:
            budget = _Budget(float(self.failures_max), self._clock())
        budget.failures_left = max(0.0, self._refilled(budget) - 1.0)  # handshakes at once
        self._budgets[host] = budget  # now the most recently seen
        if len(self._budgets) > self.hosts_max:
            self._budgets.popitem(last=False)
        if budget.failures_left < 1.0:
            logger.warning("%s failed %d handshakes within %.0f s: its connections are closed "
                           "unheard until its budget refills", host, self.failures_max,
                           self.window_s)

    @property
    def hosts(self) -> int:
        """Hosts remembered now."""
        return len(self._budgets)

    def _exempt(self, host: str) -> bool:
        if not self.loopback_exempt:
            return False
        try:
            address = ipaddress.ip_address(host.partition("%")[0])
        except ValueError:  # not an IP address (a Unix socket's path): not charged either
            return True
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped  # ::ffff:127.0.0.1 on a dual-stack listener
        return address.is_loopback

    def _refilled(self, budget: _Budget) -> float:
        now_s = self._clock()
        elapsed_s = max(0.0, now_s - budget.at_s)
        budget.failures_left = min(float(self.failures_max),
                                   budget.failures_left + elapsed_s * self._refill_per_s)
        budget.at_s = now_s
        return budget.failures_left
