"""The certificate a process presents, watched while it runs, and taken anew once renewed.

A replica and a node agent build their TLS contexts at start (`tls.py`, one `TlsContexts`
shared by every listener and dialer of the process): `TlsConfig.check` warns then of a
certificate that ends within CERT_EXPIRY_WARNING_DAYS, but a process that runs for months
crosses that line, and the certificate's end. A `CertWatch` looks every `period_s` (an hour):

- when the CA, certificate or key file changed (their bytes' digest, so a rename over the file,
  a rewrite in place and a half-written file completed later are all noticed), it judges the
  new files as a peer would (`TlsConfig.load_checked`: whole PEM, the key the certificate's,
  issued by a CA of the CA file, valid now, naming this process's identity). A pair it takes
  serves every new connection and handshake from then on (those up keep the one they began
  with until they reconnect), said at INFO; the lines below then judge the new certificate. A
  pair it refuses is said once (a WARNING naming the file and why) for as long as the files
  stay as they are, and judged again at each look (one not yet valid becomes valid); the old
  contexts stay in use. No restart is needed, and none is advised;
- a WARNING once as the presented certificate enters each of CERT_WARNING_DAYS (30, 7 and 1
  days left; a process started at 5 days left warns once, of the 7-day line, not of both);
- an ERROR once when it has ended: no peer accepts it, and every new connection fails.

`seconds_left` (of the certificate presented now) is for a metrics gauge, `status` for a
replica's status (`cellar status`). The clock and the period are injectable for tests.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from typing import Any

import anyio

from consensus.runtime.tls import (
    CERT_EXPIRY_WARNING_DAYS,
    TlsConfig,
    TlsContexts,
    TlsFileRefused,
)

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
    """The certificate `contexts` presents, for the process `what` ("replica 2")."""

    def __init__(self, contexts: TlsContexts, what: str, *,
                 period_s: float = CERT_WATCH_PERIOD_S,
                 clock: Callable[[], datetime.datetime] = utc_now) -> None:
        if period_s <= 0:
            raise ValueError(f"period_s {period_s} is not above 0")
        self.contexts = contexts
        self.what = what
        self.period_s = period_s
        self._clock = clock
        # The files' digest and the reason they were refused, while those on disk are not
        # the ones presented and were refused; said once per digest and reason.
        self._refused: tuple[bytes | None, str] | None = None
        self._stage_said = 0
        self.looks = 0

    @property
    def tls(self) -> TlsConfig:
        return self.contexts.tls

    @property
    def presented_ends(self) -> datetime.datetime:
        """When the certificate new connections are offered ends."""
        return self.contexts.ends

    @property
    def refused(self) -> str | None:
        """Why the files on disk are not presented, while they differ and are refused."""
        return None if self._refused is None else self._refused[1]

    def seconds_left(self) -> float:
        """Until the presented certificate ends; negative once it has."""
        return (self.presented_ends - self._clock()).total_seconds()

    def status(self) -> dict[str, Any]:
        """`cert_expires_at` (ISO UTC), `cert_days_left` (whole days, negative once ended),
        and `cert_files_refused` (why) while the files on disk differ and are refused."""
        left = self.presented_ends - self._clock()
        found: dict[str, Any] = {"cert_expires_at": iso_utc(self.presented_ends),
                                 "cert_days_left": left // _DAY}
        if (refused := self.refused) is not None:
            found["cert_files_refused"] = refused
        return found

    async def run(self) -> None:
        """Look now and every `period_s`, until cancelled."""
        while True:
            self.look()
            await anyio.sleep(self.period_s)

    def look(self) -> None:
        """Take changed files that a peer would accept (or say once why not), then log what
        is new of the certificate presented: a line entered, or the end passed."""
        self.looks += 1
        now = self._clock()
        self._take_changed_files(now)
        stage = stage_of(self.presented_ends - now)
        if stage > self._stage_said:
            self._stage_said = stage
            self._say(stage, self.presented_ends - now)

    def _take_changed_files(self, now: datetime.datetime) -> None:
        try:
            stamp: bytes | None = self.tls.stamp()
        except OSError:
            stamp = None  # load_checked names the file and says why
        if stamp == self.contexts.material.stamp:
            self._refused = None  # back to the files presented
            return
        presented = self.contexts.material
        try:
            material = self.tls.load_checked(now, identity=presented.identity,
                                             presented=presented)
        except TlsFileRefused as refusal:
            if self._refused != (stamp, str(refusal)):
                self._refused = (stamp, str(refusal))
                logger.warning("%s: the TLS files changed and are refused: %s; every new "
                               "connection is still offered the certificate taken before "
                               "(serial %x, ending %s UTC); looked at again in %s", self.what,
                               refusal, presented.serial, f"{presented.not_after:%Y-%m-%d %H:%M}",
                               _period(self.period_s))
            return
        self.contexts.take(material)
        self._refused = None
        self._stage_said = 0  # the lines are the new certificate's
        logger.info("%s: took the renewed TLS files: every new connection is offered %s "
                    "(serial %x, ending %s UTC) in place of serial %x (ending %s UTC); those up "
                    "keep theirs until they reconnect", self.what, self.tls.cert_file,
                    material.serial, f"{material.not_after:%Y-%m-%d %H:%M}", presented.serial,
                    f"{presented.not_after:%Y-%m-%d %H:%M}")

    def _say(self, stage: int, left: datetime.timedelta) -> None:
        ends = f"{self.presented_ends:%Y-%m-%d %H:%M} UTC"
        if (refused := self.refused) is not None:
            advice = (f"the files on disk are refused ({refused}): put a valid pair in their "
                      f"place; it is taken within {_period(self.period_s)}, without a restart")
        else:
            advice = (f"issue a new one (`cellar certs issue`, after moving this pair aside) "
                      f"into {self.tls.cert_file}: it is taken within "
                      f"{_period(self.period_s)}, without a restart")
        if stage == EXPIRED:
            logger.error("%s: the certificate it presents ended at %s: no peer accepts it, "
                         "and every new connection fails; %s", self.what, ends, advice)
        else:
            logger.warning("%s: the certificate it presents ends at %s, in %d day(s) "
                           "(under %d); no peer accepts it after: %s", self.what, ends,
                           left // _DAY, CERT_WARNING_DAYS[stage - 1], advice)


def _period(period_s: float) -> str:
    """`an hour`, `90 s`: how often the watch looks, for a log line."""
    return "an hour" if period_s == CERT_WATCH_PERIOD_S else f"{period_s:g} s"
