"""The health rules that need memory across samples: PCIe replay rate, PCIe link training, NVLink.

`LinkWatch` keeps, per GPU, what these rules remember: the PCIe replay counter over the last
window, and which NVLinks have been seen up. Sources, all in reference/nvml.md:

| key | condition | status | § |
| --- | --- | --- | --- |
| pcie/pcie_replay_rate | replays in the window > ceil(lanes x lane rate x window) | WARN | 2.2 |
| pcie/pcie_link_degraded | generation or width below its maximum, under load | WARN | 1.5, 2.4 |
| nvlink/nvlink_down | a link seen up is down (ignored while MIG is on) | FAIL | 1.5, 2.2 |
| nvlink/nvlink_replay, nvlink_recovery | a replay or recovery counter grew | FAIL | 2.2 |
| nvlink/nvlink_crc | CRC flit or data errors grew | WARN | 2.2 |
| nvlink/nvlink_crc | ... at nvlink_crc_fail_per_s or faster on one link | FAIL | 2.2 |

A link seen up that is missing from a later sample counts as down: the backend could not say
it is up.

DCGM's PCIe rule counts replays in the last minute against the lanes times a per-lane rate for
the link's generation (1e-12 BER x line rate x 60 s). Integers only: the rates are in thousandths
of a replay per lane per minute, and the allowance is rounded up as DCGM does. Until a whole
window has been seen, the replays so far are held against the whole window's allowance.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Final

from agent.health_model import Action, Check, Watch, clean
from agent.health_rules import Context, judged
from agent.health_signals import Values, link_signal
from statemachine.commands import HealthStatus

MS_PER_S: Final = 1000
MILLI: Final = 1000
REPLAY_POINTS_MAX: Final = 1024  # bounded memory whatever the poll rate; older points drop


def replay_allowance(policy_rates: tuple[int, ...], generation: int, lanes: int,
                     window_ms: int) -> int:
    """DCGM's allowed PCIe replays in `window_ms` for a link: ceil(lanes x rate x window)."""
    rate_milli_per_min = policy_rates[min(generation, len(policy_rates)) - 1]
    numerator = lanes * rate_milli_per_min * window_ms
    return -(-numerator // (MILLI * 60_000))


class ReplayWindow:
    """The PCIe replay counter over the last window: (read at ms, value) points, oldest first,
    keeping the newest point at or before the window's start as the base."""

    def __init__(self) -> None:
        self._points: deque[tuple[int, int]] = deque(maxlen=REPLAY_POINTS_MAX)

    def push(self, at_ms: int, replays: int) -> int:
        """Adds a reading; returns the replays counted within the window ending at `at_ms`."""
        if self._points and (replays < self._points[-1][1] or at_ms < self._points[-1][0]):
            self._points.clear()  # the counter was reset (or time went back): start over
        self._points.append((at_ms, replays))
        return replays - self._points[0][1]

    def trim(self, start_ms: int) -> None:
        while len(self._points) >= 2 and self._points[1][0] <= start_ms:
            self._points.popleft()


class LinkWatch:
    """One GPU's PCIe and NVLink rules, with what they remember between samples."""

    def __init__(self) -> None:
        self.replays = ReplayWindow()
        self.links_seen_up: set[int] = set()

    def checks(self, context: Context) -> list[Check]:
        found = [*self._replay_checks(context), *_degraded_checks(context)]
        found.extend(self._down_checks(context))
        found.extend(nvlink_error_checks(context))
        return found

    def _replay_checks(self, context: Context) -> Iterator[Check]:
        values, policy = context.values, context.policy
        replays = values.get("pcie_replays")
        generation = values.get("pcie_generation")
        lanes = values.get("pcie_width")
        if replays is None or generation is None or lanes is None:
            return
        window_ms = policy.pcie_replay_window_ms
        self.replays.trim(values.at_ms - window_ms)
        counted = self.replays.push(values.at_ms, replays)
        if generation < 1 or lanes < 1:
            return
        allowed = replay_allowance(policy.pcie_replay_lane_rates_milli_per_min, generation,
                                   lanes, window_ms)
        yield from judged(counted > allowed, Check(
            Watch.PCIE, "pcie_replay_rate", HealthStatus.WARN,
            f"PCIe replays above {allowed} per {window_ms // MS_PER_S} s, the limit for "
            f"Gen{generation} x{lanes}", Action.INVESTIGATE))

    def _down_checks(self, context: Context) -> Iterator[Check]:
        """Alarm only on links seen up before (§1.5); NVML reports MIG GPUs' links as down."""
        if context.device.mig_enabled:
            yield clean(Watch.NVLINK, "nvlink_down")
            return
        links_up = context.values.links_up
        down = sorted(link for link in self.links_seen_up if not links_up.get(link, False))
        self.links_seen_up.update(link for link, up in links_up.items() if up)
        yield from judged(bool(down), Check(
            Watch.NVLINK, "nvlink_down", HealthStatus.FAIL,
            f"NVLink {_listed(down)} down after being up", Action.RESET_GPU))


def _degraded_checks(context: Context) -> Iterator[Check]:
    """A link trained below its maximum is a degraded slot; idle GPUs may down-clock the link,
    so it is judged only under load (§1.5)."""
    values = context.values
    utilization = values.get("utilization_pct")
    names = ("pcie_generation", "pcie_generation_max", "pcie_width", "pcie_width_max")
    link = [values.get(name) for name in names]
    if utilization is None or utilization < context.policy.pcie_degraded_utilization_pct:
        return
    generation, generation_max, width, width_max = link
    if generation is None or generation_max is None or width is None or width_max is None:
        return
    yield from judged(generation < generation_max or width < width_max, Check(
        Watch.PCIE, "pcie_link_degraded", HealthStatus.WARN,
        f"PCIe link Gen{generation} x{width} below its maximum Gen{generation_max} "
        f"x{width_max} under load", Action.INVESTIGATE))


def nvlink_error_checks(context: Context) -> Iterator[Check]:
    values = context.values
    links = sorted(values.links_up)
    for counter, code in (("replay_errors", "nvlink_replay"),
                          ("recovery_errors", "nvlink_recovery")):
        growth = _growth_by_link(values, links, (counter,))
        if growth:
            grown = [link for link, (count, _) in growth if count > 0]
            yield from judged(bool(grown), Check(
                Watch.NVLINK, code, HealthStatus.FAIL,
                f"NVLink {counter.replace('_', ' ')} on link {_listed(grown)}", Action.RESET_GPU))
    yield from _crc_checks(context, _growth_by_link(values, links, ("crc_flit_errors",
                                                                    "crc_data_errors")))


def _growth_by_link(values: Values, links: list[int],
                    counters: tuple[str, ...]) -> list[tuple[int, tuple[int, int]]]:
    """Per link: (growth of the counters summed, the longest ms they grew over)."""
    growth = []
    for link in links:
        parts = [values.increase(link_signal(link, counter)) for counter in counters]
        known = [part for part in parts if part is not None]
        if known:
            growth.append((link, (sum(count for count, _ in known),
                                  max(elapsed for _, elapsed in known))))
    return growth


def _crc_checks(context: Context, growth: list[tuple[int, tuple[int, int]]]) -> Iterator[Check]:
    if not growth:
        return
    rate_max = context.policy.nvlink_crc_fail_per_s
    grown = [link for link, (count, _) in growth if count > 0]
    fast = [link for link, (count, elapsed_ms) in growth
            if count > 0 and count * MS_PER_S >= rate_max * max(elapsed_ms, 1)]
    if fast:
        yield Check(Watch.NVLINK, "nvlink_crc", HealthStatus.FAIL,
                    f"NVLink CRC errors at {rate_max}/s or more on link {_listed(fast)}",
                    Action.RESET_GPU)
    else:
        yield from judged(bool(grown), Check(
            Watch.NVLINK, "nvlink_crc", HealthStatus.WARN,
            f"NVLink CRC errors on link {_listed(grown)}", Action.INVESTIGATE))


def _listed(links: list[int]) -> str:
    return ", ".join(str(link) for link in links)
