"""The simulator's WAN latency table inside `cellar bench peers`: SDPaxos against Multi-Paxos
at every site of the paper's deployments (3 and 5 replicas, sequencer in CA), the same
figures `cellar sim latency` prints, computed by the same functions."""

from __future__ import annotations

from dataclasses import dataclass

from consensus.config import Mode
from jepsen.sim.latency import paper_ms, run_latency

WAN_REPLICAS = (3, 5)


@dataclass(frozen=True, slots=True)
class WanRow:
    """The median proposal-to-ready latency at one site, in simulated milliseconds."""

    replicas: int
    site: str
    sdpaxos_ms: float
    multipaxos_ms: float
    sdpaxos_model_ms: float  # the paper's latency model
    paper_ms: float | None  # the paper's measured figure (Fig. 12), where it gives one


def wan_table(seconds: int) -> list[WanRow]:
    """Every site of both deployments; `seconds` simulated seconds per protocol."""
    rows: list[WanRow] = []
    for replicas in WAN_REPLICAS:
        sdpaxos = run_latency(replicas, Mode.SDPAXOS, seconds=seconds)
        multipaxos = run_latency(replicas, Mode.MULTIPAXOS, seconds=seconds)
        for ours, theirs in zip(sdpaxos, multipaxos, strict=True):
            rows.append(WanRow(replicas, ours.site, ours.median_ms, theirs.median_ms,
                               ours.model_ms, paper_ms(replicas, ours.site)))
    return rows
