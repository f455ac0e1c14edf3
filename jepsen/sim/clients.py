"""Simulated clients: a key-value workload of reads, writes and compare-and-set, and the history
of what they invoked and what they saw.

Each client talks to one replica and has one operation outstanding. Writes and cas go through
consensus (`propose`); reads through the linearizable read path (`read`). An operation that
times out, or whose replica crashes under it, completes as `info` (its outcome is unknown) for
writes and cas, and as `fail` for reads (a read changes nothing); after an `info` the client
continues as a new process, as Jepsen's clients do. The history (`jepsen.history`) records
operations as the key-value model names them (get, put, cas); a cas whose compare failed
completes `ok` with output false. Its event order is the simulator's real-time order.
"""

from __future__ import annotations

from dataclasses import dataclass

from consensus.prng import Prng
from jepsen.history import Handle
from jepsen.sim.kv_codec import Value, encode_cas, encode_put
from jepsen.sim.options import SimOptions


@dataclass(slots=True)
class Operation:
    op_id: int
    client: int
    process: int
    f: str  # get | put | cas
    key: str
    value: object  # put: the value; cas: [expected, new]
    replica: int
    deadline_us: int
    payload: bytes = b""
    handle: Handle | None = None
    read_id: int = 0  # a get's id at its replica, in that replica's life


class Workload:
    """Chooses each client's next operation, deterministically from the seed."""

    __slots__ = ("_next_value", "_options", "_prng", "_written")

    def __init__(self, options: SimOptions, prng: Prng) -> None:
        self._options = options
        self._prng = prng
        self._next_value = 1
        self._written: dict[str, list[int]] = {}

    def next_operation(self, op_id: int, client: int, process: int, replica: int,
                       deadline_us: int) -> Operation:
        prng, options = self._prng, self._options
        key = f"k{prng.below(options.keys)}"
        draw = prng.below(1_000_000)
        if draw < options.read_ppm:
            return Operation(op_id, client, process, "get", key, None, replica, deadline_us)
        value = self._next_value
        self._next_value += 1
        if draw < options.read_ppm + options.cas_ppm:
            seen = self._written.get(key, [])
            expected: Value = prng.choice(seen) if seen and prng.chance_ppm(800_000) else None
            return Operation(op_id, client, process, "cas", key, [expected, value], replica,
                             deadline_us, encode_cas(key, expected, value))
        self._written.setdefault(key, []).append(value)
        return Operation(op_id, client, process, "put", key, value, replica, deadline_us,
                         encode_put(key, value))

    def observed(self, key: str, value: int) -> None:
        """A value that exists now (makes cas likelier to succeed)."""
        values = self._written.setdefault(key, [])
        if value not in values:
            values.append(value)
