"""The end of the certificate a process presents, watched while it runs.

A replica and a node agent build their TLS contexts once, at start (`tls.py`): `TlsConfig.check`
warns then of a certificate that ends within CERT_EXPIRY_WARNING_DAYS, but a process that runs
for months crosses that line, and the certificate's end, in silence; its peers log only INFO
lines as they refuse it. A `CertWatch` looks every `period_s` (an hour) and logs

- a WARNING once as the certificate enters each of CERT_WARNING_DAYS (30, 7 and 1 days left;
  a process started at 5 days left warns once, of the 7-day line, not of both);
- an ERROR once when it has ended: no peer accepts it, and every new connection fails.

What it judges is the certificate the process loaded at start, which its contexts present
until a restart (nothing reloads them). The file is read again at each look: a renewed file
(one that ends later) changes the advice from "issue a new one" to "restart to present the
renewed one", and says the current line once more with it; so does any other change to the
file (replaced, removed, unreadable: a restart would not start). Judging the file alone would
fall silent the moment a renewed pair lands on disk while the process still presents the old
certificate, and fails when it ends.

`seconds_left` is for a metrics gauge, `status` for a replica's status (`cellar status`). The
clock and the period are injectable for tests.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from typing import Any

import anyio

from consensus.runtime.tls import CERT_EXPIRY_WARNING_DAYS, TlsConfig

logger = logging.getLogger("cellar.transport")

CERT_WATCH_PERIOD_S = 3600.0
CERT_WARNING_DAYS = (CERT_EXPIRY_WARNING_DAYS, 7, 1)  # decreasing
EXPIRED = len(CERT_WARNING_DAYS) + 1  # the stage past every warning line
_DAY = datetime.timedelta(days=1)


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def stage_of(left: datetime.timedelta) -> int:
    """0 with more than the first line left, n once under the n-th line of
    CERT_WARNING_DAYS, EXPIRED once nothing is left."""
    if left <= datetime.timedelta(0):
        return EXPIRED
    return sum(1 for days in CERT_WARNING_DAYS if left < datetime.timedelta(days=days))


def iso_utc(instant: datetime.datetime) -> str:
    """`2027-01-05T14:00:00Z`: what a status carries."""
    return instant.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class CertWatch:
    """The end of the certificate `tls` names, for the process `what` ("replica 2")."""

    def __init__(self, tls: TlsConfig, what: str, *, period_s: float = CERT_WATCH_PERIOD_S,
                 clock: Callable[[], datetime.datetime] = utc_now) -> None:
        """Reads the certificate now, as the contexts did at start (`TlsConfig.check` refused
        a file that cannot be read before this runs): OSError or ValueError otherwise."""
        if period_s <= 0:
            raise ValueError(f"period_s {period_s} is not above 0")
        self.tls = tls
        self.what = what
        self.period_s = period_s
        self._clock = clock
        self.presented_ends = tls.expires_at()
        self._on_disk: datetime.datetime | str = self.presented_ends  # or why it is unreadable
        self._stage_said = 0
        self.looks = 0

    @property
    def renewed_ends(self) -> datetime.datetime | None:
        """When the certificate on disk ends, if it ends later than the one presented."""
        on_disk = self._on_disk
        if isinstance(on_disk, datetime.datetime) and on_disk > self.presented_ends:
            return on_disk
        return None

    def seconds_left(self) -> float:
        """Until the presented certificate ends; negative once it has."""
        return (self.presented_ends - self._clock()).total_seconds()

    def status(self) -> dict[str, Any]:
        """`cert_expires_at` (ISO UTC), `cert_days_left` (whole days, negative once ended),
        and `cert_renewed_expires_at` while a renewed file waits for a restart."""
        left = self.presented_ends - self._clock()
        found: dict[str, Any] = {"cert_expires_at": iso_utc(self.presented_ends),
                                 "cert_days_left": left // _DAY}
        if (renewed := self.renewed_ends) is not None:
            found["cert_renewed_expires_at"] = iso_utc(renewed)
        return found

    async def run(self) -> None:
        """Look now and every `period_s`, until cancelled."""
        while True:
            self.look()
            await anyio.sleep(self.period_s)

    def look(self) -> None:
        """Read the file again and log what is new: a line entered, the end passed, or a
        change to the file (which says the current line again, with the advice that fits)."""
        self.looks += 1
        now = self._clock()
        on_disk = self._read_file()
        if on_disk != self._on_disk:
            self._on_disk = on_disk
            self._stage_said = 0
            if self.renewed_ends is not None:
                logger.info("%s: %s now ends at %s UTC; restart to present it", self.what,
                            self.tls.cert_file, f"{on_disk:%Y-%m-%d %H:%M}")
            elif isinstance(on_disk, str):
                logger.warning("%s: %s %s: this process goes on presenting the certificate "
                               "it loaded at start, but would not start again with it",
                               self.what, self.tls.cert_file, on_disk)
        stage = stage_of(self.presented_ends - now)
        if stage > self._stage_said:
            self._stage_said = stage
            self._say(stage, self.presented_ends - now)

    def _read_file(self) -> datetime.datetime | str:
        try:
            return self.tls.expires_at()
        except (OSError, ValueError) as error:
            return f"cannot be read ({error})"

    def _say(self, stage: int, left: datetime.timedelta) -> None:
        ends = f"{self.presented_ends:%Y-%m-%d %H:%M} UTC"
        renewed = self.renewed_ends
        if renewed is not None:
            advice = (f"a renewed certificate, ending {renewed:%Y-%m-%d %H:%M} UTC, is in "
                      f"{self.tls.cert_file}: restart to present it (nothing reloads it)")
        else:
            advice = (f"issue a new one (`cellar certs issue`, after moving this pair aside) "
                      f"into {self.tls.cert_file} and restart with it")
        if stage == EXPIRED:
            logger.error("%s: the certificate it presents ended at %s: no peer accepts it, "
                         "and every new connection fails; %s", self.what, ends, advice)
        else:
            logger.warning("%s: the certificate it presents ends at %s, in %d day(s) "
                           "(under %d); no peer accepts it after: %s", self.what, ends,
                           left // _DAY, CERT_WARNING_DAYS[stage - 1], advice)
