"""A `CellarClient` stand-in for the typed store's queries on one `Machine`: it refuses an answer
over a client connection's default frame cap, as a replica's server does (TOO_LARGE), so a test
sees what a real client would of an answer that grew too large."""

from __future__ import annotations

from typing import Any

from consensus.runtime.client import ReplyTooLarge
from consensus.runtime.node_config import LIMIT_DEFAULTS
from statemachine.machine import Machine

ANSWER_BYTES_MAX = LIMIT_DEFAULTS["frame_bytes_max"] - 4096  # room for the response's frame


class OneMachine:
    def __init__(self, machine: Machine) -> None:
        self.machine = machine

    async def read(self, query: bytes, **_: Any) -> bytes:
        result = self.machine.query(query)
        if len(result) > ANSWER_BYTES_MAX:
            raise ReplyTooLarge(f"the query's answer, {len(result)} bytes")
        return result
