"""Where a client that prefers the sequencer sends its commands: finding that replica.

SDPaxos lets every replica lead its own clients' commands, which is what a client spread over a
WAN wants (its nearest replica). On a LAN, where every replica is as near as the others, a
command sent to the sequencer's replica is ready in one round trip with one sync on each side,
as in Raft; sent elsewhere it also needs the C-request's hop to the sequencer and the O-accept's
hop back, and a second sync at its leader. `ClientConfig.prefer_sequencer` asks for the former.

The route asks replicas for their status in the background, so no command waits for it: each
status names the replica itself and, while it serves a view, the view's sequencer. Until the
route knows, and after the replica it chose fails, the client goes on with its usual rotation.
It looks again at most once per `LOOK_EVERY_S`, and once per `RECHECK_S` even while it knows,
since a view change moves the sequencer; while it rechecks, commands still go to the replica
it found (a former sequencer serves them too, one hop slower), and a look that finds no
sequencer forgets it.

A replica cut off from its peers still says it serves the view it was in, and names that
view's sequencer (often itself: the sequencer that lost its peers), which commits nothing. So
a look takes the sequencer of the latest view a replica serves, asking until a majority of the
replicas name the same view and sequencer (no later view can be served then) or all were
asked. It took the first sequencer named: with the cut-off one asked first, every command
went there and waited out its try, and the next look found it again.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

LOOK_EVERY_S = 1.0  # the least time between two looks
RECHECK_S = 2.0  # how long a found sequencer is trusted before looking again

AskStatus = Callable[[str], Awaitable[dict[str, Any] | None]]  # None: no answer


class SequencerRoute:
    """The endpoint of the sequencer's replica, once found; `look` finds it."""

    def __init__(self, endpoints: Sequence[str]) -> None:
        self._endpoints = list(endpoints)
        self._replica_ids: dict[str, int] = {}  # what each endpoint said it is
        self.endpoint: str | None = None  # the sequencer's, while trusted
        self._trusted_until = -math.inf
        self._look_not_before = -math.inf
        self.looking = False

    def claim_look(self, now: float) -> bool:
        """Whether the caller should start `look` now: not already looking, and the last look
        is old enough (or the sequencer it found is no longer trusted). A yes counts as the
        look's start, so the callers that ask before the look's task runs get a no."""
        if self.looking or now < self._look_not_before:
            return False
        if self.endpoint is not None and now < self._trusted_until:
            return False
        self._started(now)
        return True

    def _started(self, now: float) -> None:
        self.looking = True
        self._look_not_before = now + LOOK_EVERY_S

    def forget(self) -> None:
        """The chosen replica failed a request: go back to the usual rotation."""
        self.endpoint = None

    async def look(self, ask: AskStatus, now: Callable[[], float]) -> None:
        """Ask replicas, in order, until a majority name one view's sequencer whose endpoint
        is known, or all were asked; take the sequencer of the latest view named, if its
        endpoint is known (module docstring). Finding none, forget the one found before (the
        next look is `LOOK_EVERY_S` later)."""
        if not self.looking:  # not claimed first
            self._started(now())
        try:
            naming: dict[tuple[int, int], int] = {}  # (view, sequencer): replicas naming it
            for endpoint in self._endpoints:
                claim = self._sequencer_named(endpoint, await ask(endpoint))
                if claim is not None:
                    naming[claim] = naming.get(claim, 0) + 1
                    if (2 * naming[claim] > len(self._endpoints)
                            and self._endpoint_of(claim[1]) is not None):
                        break
            found = self._endpoint_of(max(naming)[1]) if naming else None
            self.endpoint = found
            if found is not None:
                self._trusted_until = now() + RECHECK_S
        finally:
            self.looking = False

    def _sequencer_named(self, endpoint: str, status: dict[str, Any] | None
                         ) -> tuple[int, int] | None:
        """The view `endpoint` serves and its sequencer (view -1 when the status does not
        say), or None."""
        if status is None:
            return None
        replica_id, sequencer = status.get("replica_id"), status.get("sequencer")
        if type(replica_id) is int:
            self._replica_ids[endpoint] = replica_id
        if status.get("status") != "normal":  # electing: the sequencer it names may not last
            return None
        view = status.get("view")
        if type(sequencer) is not int or sequencer < 0:
            return None
        return (view if type(view) is int else -1), sequencer

    def _endpoint_of(self, replica_id: int | None) -> str | None:
        if replica_id is None:
            return None
        return next((endpoint for endpoint, known in self._replica_ids.items()
                     if known == replica_id), None)
