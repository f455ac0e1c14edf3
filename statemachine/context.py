"""The context of one command: who sent it (from the envelope) and when (stamped, unclamped)."""

from __future__ import annotations

from dataclasses import dataclass

from consensus.envelope import Principal


@dataclass(frozen=True, slots=True, kw_only=True)
class Context:
    principal: Principal
    now_ms: int  # the proposer's clock; `apply` makes it logical time (`logical_time`)
