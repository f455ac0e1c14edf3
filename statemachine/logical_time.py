"""Logical time: the time a command runs at, from its stamp, the state's clock and its last Tick.

Every replica stamps the commands it serves with its own wall clock; the sequencer's driver
stamps the Ticks. Logical time (`State.now_ms`) never goes back: a command stamped behind it
runs at it. Only a Tick moves it forward freely. Any other command moves it at most
`STAMP_LEAD_MS_MAX` past the stamp of the latest Tick applied (`State.tick_ms`), so one replica
whose clock is far ahead cannot carry leases, preemption deadlines and sessions with it: the
leases it renews run from that bound, and the next Ticks, by the sequencer's clock, judge
them. The bound is the latest Tick's stamp, not the logical time it ran at: that one already
holds the lead, and a skewed replica serving a command after every Tick would push it on by
the lead each time, running logical time faster than any clock. Before the first Tick (a fresh
cluster, or a state restored from a snapshot older than the field) nothing is known of the
sequencer's clock, and stamps move logical time as they always did. Should Ticks stop while
other commands go on, logical time waits `STAMP_LEAD_MS_MAX` past the last one; the next Tick
may then judge nodes that heartbeated meanwhile Suspect, never Down at once (tick.py), and
their next heartbeats bring them back.

The stamp itself is not changed: sessions still judge a command's staleness by it.
"""

from __future__ import annotations

from statemachine.limits import STAMP_LEAD_MS_MAX
from statemachine.state import State


def command_time(state: State, stamp_ms: int, *, tick: bool) -> int:
    """The logical time a command stamped `stamp_ms` runs at (`tick`: the system's Tick)."""
    if not tick and state.tick_ms is not None:
        stamp_ms = min(stamp_ms, state.tick_ms + STAMP_LEAD_MS_MAX)
    return max(state.now_ms, stamp_ms)
