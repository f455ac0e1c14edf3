"""The watches a replica holds while they wait: a budget of their own, and each principal's
share of it.

A watch (long polling, `Driver.local_read`) waits up to TIMEOUT_MS_MAX, ten minutes, holding its
query. Its bytes had counted for the whole wait against the budget that commands and reads
share (proposal_budget.py), so one client's watches could hold all of it: a node agent's
connections sending watch after watch had every other client's commands refused OVERLOADED.
Now watches have

- a budget of their own, `bytes_max` (`DriverConfig.watch_bytes_max`, a replica file's
  `limits.watch_bytes_max`): a watch that would pass it is refused OVERLOADED, and nothing but
  watches ever is on its account;
- a share of it per principal (the identity from the client's certificate): at most
  WATCHES_PER_PRINCIPAL_MAX watches waiting, holding at most `bytes_max // PRINCIPAL_SHARE`
  bytes. A principal past either is refused OVERLOADED while the others' watches are still
  taken, as SESSIONS_PER_PRINCIPAL_MAX keeps one client from filling the session table.

A node agent keeps one watch waiting, of its own effects (statemachine/store.py
`watch_effects`, agent/store_link.py), and a scheduler none: the cap leaves room for a few
clients under one identity and for a watch whose connection is being replaced. The state
machine's queries are at most 4 KiB (statemachine/limits.py QUERY_BYTES_MAX, and the query gate
refuses what does not decode), so a principal's watches hold at most 64 KiB of the 64 MiB
budget by default; the bytes share bounds machines with larger queries (the test key-value
machine's).

A refusal is safe to retry: nothing waits, and the client tries again after a pause. A watch
the client gives up on while its connection stays up is called off (a Cancel request,
server.py) and gives its place back at once, not at the end of its wait.
"""

from __future__ import annotations

from collections.abc import Hashable

WATCH_BYTES_MAX = 64 << 20  # the default budget: a quarter of the default proposal budget
WATCHES_PER_PRINCIPAL_MAX = 16
PRINCIPAL_SHARE = 8  # a principal's watches hold at most an eighth of the budget's bytes


class WatchBudget:
    """Bytes and counts of the watches waiting now, in all and per owner; see the module
    docstring."""

    __slots__ = ("_held", "bytes_max", "held_bytes", "owner_bytes_max", "owner_watches_max")

    def __init__(self, bytes_max: int, *, owner_watches_max: int = WATCHES_PER_PRINCIPAL_MAX,
                 owner_bytes_max: int | None = None) -> None:
        if bytes_max <= 0 or owner_watches_max <= 0:
            raise ValueError(f"bytes_max and owner_watches_max must be positive, got "
                             f"{bytes_max} and {owner_watches_max}")
        self.bytes_max = bytes_max
        self.owner_watches_max = owner_watches_max
        self.owner_bytes_max = (max(1, bytes_max // PRINCIPAL_SHARE) if owner_bytes_max is None
                                else owner_bytes_max)
        self.held_bytes = 0
        self._held: dict[Hashable, tuple[int, int]] = {}  # owner -> (watches, bytes)

    def __len__(self) -> int:
        """Owners with a watch waiting."""
        return len(self._held)

    def admit(self, owner: Hashable, size: int) -> tuple[str, str] | None:
        """Take `size` bytes for one of `owner`'s watches: None, or (nothing taken) what was
        full, "principal" (the owner's share) or "bytes" (the budget), and a sentence why."""
        watches, held = self._held.get(owner, (0, 0))
        if watches >= self.owner_watches_max:
            return "principal", (f"{owner} has {watches} watches waiting at this replica, the "
                                 f"most one client identity may")
        if held + size > self.owner_bytes_max:
            return "principal", (f"{owner}'s watches would hold {held + size} bytes at this "
                                 f"replica, more than one client identity may "
                                 f"({self.owner_bytes_max})")
        if self.held_bytes + size > self.bytes_max:
            return "bytes", (f"the replica holds {self.held_bytes} bytes of waiting watches "
                             f"(at most {self.bytes_max})")
        self._held[owner] = (watches + 1, held + size)
        self.held_bytes += size
        return None

    def release(self, owner: Hashable, size: int) -> None:
        """One of `owner`'s admitted watches, of `size` bytes, was answered or ended."""
        watches, held = self._held.pop(owner)
        assert watches >= 1 and held >= size, (owner, watches, held, size)
        if watches > 1:
            self._held[owner] = (watches - 1, held - size)
        self.held_bytes -= size
