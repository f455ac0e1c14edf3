"""One GPU's open incidents, and the rules that open and close them (reference/nvml.md §2.4).

An incident opens when a check finds something, and closes only when its evidence is gone AND a
run of clean checks followed: `clean_checks_to_recover` for FAIL and WARN, one for UNKNOWN
(an UNKNOWN claimed no fault; it closes when the signal is seen again). One poll that raised no
exception never closes anything. What "evidence gone" means depends on how the incident was
opened (`Clearing`):

- EVIDENCE (polled rules): a check on the same key says PASS. Each such check is one clean
  check; a check that finds it again restarts the run. A sample in which the rule could not
  judge neither counts nor restarts.
- RESET (fatal XIDs, DBE events, GPU unavailable): a reset was seen (volatile counters dropped,
  or the GPU answered again after it was lost). The sample showing the reset is the first clean
  check, each later sample another.
- QUIET (warning XIDs, repeated job faults): no recurrence for the incident's quiet window, or a
  reset; then clean checks as for RESET.

While an incident is open its status never drops: a check that finds it at a lower level
refreshes the evidence but keeps the worse status, its message and its way of clearing.
`clear` (an operator) closes everything at once; polled evidence that is still there opens
again at the next sample.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from agent.health_model import SEVERITY, Check, Incident, Key, Watch, capped, clean
from agent.health_policy import HealthPolicy


class Clearing(enum.Enum):
    EVIDENCE = "evidence"
    RESET = "reset"
    QUIET = "quiet"


@dataclass(slots=True)
class Condition:
    """An open incident and its progress towards closing.

    Invariant: clean_checks == 0 while evidence is True."""

    check: Check  # the worst finding since it opened
    clearing: Clearing
    since_ms: int
    last_seen_ms: int
    quiet_ms: int = 0
    evidence: bool = True
    clean_checks: int = 0

    def incident(self) -> Incident:
        return Incident(watch=self.check.watch, status=self.check.status, code=self.check.code,
                        message=capped(self.check.message), since_ms=self.since_ms,
                        action=self.check.action)


class Conditions:
    """The open incidents of one GPU, by key."""

    def __init__(self, policy: HealthPolicy) -> None:
        self._policy = policy
        self._open: dict[Key, Condition] = {}

    def __contains__(self, key: Key) -> bool:
        return key in self._open

    def count(self, watch: Watch, prefix: str) -> int:
        """Open incidents on `watch` whose code starts with `prefix`."""
        return sum(1 for key in self._open if key[0] == watch and key[1].startswith(prefix))

    def found(self, check: Check, now_ms: int, clearing: Clearing = Clearing.EVIDENCE,
              quiet_ms: int = 0) -> None:
        """Evidence for `check`'s key: open the incident, or refresh it."""
        assert check.found
        condition = self._open.get(check.key)
        if condition is None:
            self._open[check.key] = Condition(check=check, clearing=clearing, since_ms=now_ms,
                                              last_seen_ms=now_ms, quiet_ms=quiet_ms)
            return
        if SEVERITY[check.status] >= SEVERITY[condition.check.status]:
            condition.check = check  # the worse finding also decides how it clears
            condition.clearing = clearing
        condition.evidence = True
        condition.clean_checks = 0
        condition.last_seen_ms = now_ms
        condition.quiet_ms = max(condition.quiet_ms, quiet_ms)

    def look(self, check: Check, now_ms: int) -> None:
        """A polled check: evidence, or one clean check for an EVIDENCE incident."""
        if check.found:
            self.found(check, now_ms)
            return
        condition = self._open.get(check.key)
        if condition is not None and condition.clearing is Clearing.EVIDENCE:
            condition.evidence = False
            condition.clean_checks += 1

    def settle(self, key: Key) -> None:
        """A clean check outside a sample (events flowing again): closes what it can."""
        self.look(clean(*key), 0)
        self._close_recovered()

    def end_of_sample(self, now_ms: int, *, reset: bool) -> None:
        """One sample answered: RESET and QUIET incidents move towards closing; every incident
        with its run of clean checks closes."""
        for condition in self._open.values():
            if condition.clearing is Clearing.EVIDENCE:
                continue
            quiet = (condition.clearing is Clearing.QUIET
                     and now_ms - condition.last_seen_ms >= condition.quiet_ms)
            if condition.evidence and (reset or quiet):
                condition.evidence = False
                condition.clean_checks = 1
            elif not condition.evidence:
                condition.clean_checks += 1
        self._close_recovered()

    def _close_recovered(self) -> None:
        for key in sorted(self._open):
            condition = self._open[key]
            needed = self._policy.clean_checks_needed(condition.check.status)
            if not condition.evidence and condition.clean_checks >= needed:
                del self._open[key]

    def clear(self) -> None:
        self._open.clear()

    def incidents(self) -> tuple[Incident, ...]:
        return tuple(sorted((condition.incident() for condition in self._open.values()),
                            key=Incident.order))
