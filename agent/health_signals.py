"""Each GPU's signals as the health rules read them: fresh values, last good values, failed reads.

reference/nvml.md §4.1 and §6: an unsupported signal is unknown, never healthy; a transient
failure keeps the last good value with its age, and escalates if it persists. `SignalMemory`
resolves one sample's Readings into `Values`:

- a value read this time is fresh. Rules judge fresh values only, so a stale value can neither
  open an incident nor count as a clean check: an incident stays as it was while its signal
  cannot be read;
- each signal's last good value, and when it was read, is the base of its counter deltas, so a
  failed read between two good ones loses no increment;
- a signal that failed `failed_reads_to_unknown` polls in a row, or failed with no good value
  read yet (there is none to keep: a GPU whose every read fails is not healthy), opens an
  UNKNOWN incident on its watch ("<signal>_unreadable"), which closes at the next read that
  does not fail;
- an essential signal (the policy lists them) that is unsupported opens an UNKNOWN incident
  ("<signal>_unsupported"): that watch is blind on this GPU;
- any read of the sample, tracked or not, that failed with a corrupted InfoROM (NVML 14) opens
  a WARN incident ("device/inforom_corrupted", INVESTIGATE) at once: reference/nvml.md §4.1
  has the GPU warn on it, never fail and never wait it out as a blind spot.

Only the signals some rule reads are tracked (`SIGNAL_WATCHES`, and the NVLink counters of links
0..NVLINK_LINKS_MAX-1); the others (clocks, memory use, power limit) do not bear on health.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Final

from agent.gpu import DeviceSample, Failed, NvmlCode, Reading, Unsupported
from agent.health_model import Action, Check, Watch, capped, clean
from statemachine.commands import HealthStatus

SIGNAL_WATCHES: Final[Mapping[str, Watch]] = {
    "temperature_c": Watch.THERMAL,
    "slowdown_temperature_c": Watch.THERMAL,
    "shutdown_temperature_c": Watch.THERMAL,
    "thermal_violation_ns": Watch.THERMAL,
    "clock_event_mask": Watch.THERMAL,
    "power_mw": Watch.POWER,
    "energy_mj": Watch.POWER,
    "power_violation_ns": Watch.POWER,
    "ecc_enabled": Watch.MEMORY,
    "ecc_volatile_corrected": Watch.MEMORY,
    "ecc_volatile_uncorrected": Watch.MEMORY,
    "retired_pages_sbe": Watch.MEMORY,
    "retired_pages_dbe": Watch.MEMORY,
    "retired_pages_pending": Watch.MEMORY,
    "remapped_rows_uncorrectable": Watch.MEMORY,
    "remap_pending": Watch.MEMORY,
    "remap_failure": Watch.MEMORY,
    "recovery_action": Watch.DRIVER,
    "utilization_pct": Watch.DEVICE,
    "pcie_replays": Watch.PCIE,
    "pcie_generation": Watch.PCIE,
    "pcie_generation_max": Watch.PCIE,
    "pcie_width": Watch.PCIE,
    "pcie_width_max": Watch.PCIE,
}
NVLINK_COUNTERS: Final = ("replay_errors", "recovery_errors", "crc_flit_errors",
                          "crc_data_errors")
NVLINK_LINKS_MAX: Final = 64  # NVML has 36 (NVML_NVLINK_MAX_LINKS); other numbers are ignored
NOT_READINGS: Final = frozenset({"uuid", "fabric", "nvlinks"})  # DeviceSample fields
INFOROM_CORRUPTED: Final = "inforom_corrupted"  # its code on the DEVICE watch


def link_signal(link: int, counter: str) -> str:
    return f"nvlink{link}.{counter}"


def watch_of(name: str) -> Watch:
    return SIGNAL_WATCHES.get(name, Watch.NVLINK)


def readings_of(sample: DeviceSample) -> dict[str, Reading]:
    """The tracked readings of a sample, by signal name."""
    readings: dict[str, Reading] = {name: getattr(sample, name) for name in SIGNAL_WATCHES}
    for link in sample.nvlinks:
        if 0 <= link.link < NVLINK_LINKS_MAX:
            for counter in NVLINK_COUNTERS:
                readings[link_signal(link.link, counter)] = getattr(link, counter)
    return readings


def all_readings(sample: DeviceSample) -> Iterator[tuple[str, Reading]]:
    """Every reading of a sample, tracked or not, by signal name in field order."""
    for field in fields(sample):
        if field.name not in NOT_READINGS:
            yield field.name, getattr(sample, field.name)
    for link in sample.nvlinks:
        for counter in NVLINK_COUNTERS:
            yield link_signal(link.link, counter), getattr(link, counter)


def inforom_check(sample: DeviceSample) -> Check:
    """WARN while any read of the sample failed with a corrupted InfoROM; clean otherwise."""
    failed = [name for name, reading in all_readings(sample)
              if isinstance(reading, Failed) and reading.code == NvmlCode.CORRUPTED_INFOROM]
    if not failed:
        return clean(Watch.DEVICE, INFOROM_CORRUPTED)
    message = (f"the InfoROM is corrupted (NVML {NvmlCode.CORRUPTED_INFOROM:d}): "
               f"{', '.join(failed)} cannot be read")
    return Check(Watch.DEVICE, INFOROM_CORRUPTED, HealthStatus.WARN, capped(message),
                 Action.INVESTIGATE)


def links_up_of(sample: DeviceSample) -> dict[int, bool]:
    return {link.link: link.up for link in sample.nvlinks if 0 <= link.link < NVLINK_LINKS_MAX}


@dataclass(frozen=True, slots=True)
class Values:
    """One sample's readings resolved: what is fresh, what is unsupported, and each signal's
    last good value before this sample (the base of deltas)."""

    at_ms: int
    fresh: Mapping[str, int]
    unsupported: frozenset[str]
    before: Mapping[str, tuple[int, int]]  # name -> (value, read at ms)
    links_up: Mapping[int, bool]

    def get(self, name: str) -> int | None:
        return self.fresh.get(name)

    def increase(self, name: str) -> tuple[int, int] | None:
        """(growth since the last good value, ms since that value was read), or None when
        either end is missing. A counter that went down (a reset) grew by 0."""
        now = self.fresh.get(name)
        base = self.before.get(name)
        if now is None or base is None:
            return None
        return max(0, now - base[0]), self.at_ms - base[1]

    def dropped(self, name: str) -> bool:
        """The counter went down since its last good value: the GPU or driver was reset."""
        now = self.fresh.get(name)
        base = self.before.get(name)
        return now is not None and base is not None and now < base[0]


class SignalMemory:
    """One GPU's last good value and run of failed reads for each tracked signal."""

    def __init__(self) -> None:
        self._last_good: dict[str, tuple[int, int]] = {}
        self._failures: dict[str, tuple[int, Failed]] = {}  # consecutive count, latest

    def last_good(self, name: str) -> tuple[int, int] | None:
        """(value, read at ms) of the signal's last good reading."""
        return self._last_good.get(name)

    def observe(self, sample: DeviceSample, now_ms: int, *, failed_reads_to_unknown: int,
                essential: tuple[str, ...]) -> tuple[Values, list[Check]]:
        readings = readings_of(sample)
        before = dict(self._last_good)
        fresh: dict[str, int] = {}
        unsupported: set[str] = set()
        checks: list[Check] = []
        for name in sorted(readings):
            reading = readings[name]
            if isinstance(reading, Failed):
                checks.extend(self._failed(name, reading, failed_reads_to_unknown))
                continue
            self._failures.pop(name, None)
            checks.append(clean(watch_of(name), f"{name}_unreadable"))
            if isinstance(reading, Unsupported):
                unsupported.add(name)
            else:
                fresh[name] = reading
                self._last_good[name] = (reading, now_ms)
        checks.extend(_essential_checks(essential, fresh, unsupported))
        checks.append(inforom_check(sample))
        values = Values(at_ms=now_ms, fresh=fresh, unsupported=frozenset(unsupported),
                        before=before, links_up=links_up_of(sample))
        return values, checks

    def _failed(self, name: str, failure: Failed, threshold: int) -> Iterator[Check]:
        count = self._failures.get(name, (0, failure))[0] + 1
        self._failures[name] = (count, failure)
        last = self._last_good.get(name)
        if count < threshold and last is not None:
            return
        known = f"last good value {last[0]} read at {last[1]} ms" if last else "no good value yet"
        runs = f" {threshold}+ polls in a row" if last else ""
        message = f"{name} unreadable{runs} (NVML {failure.code}: {failure.message}); {known}"
        yield Check(watch_of(name), f"{name}_unreadable", HealthStatus.UNKNOWN, capped(message))


def _essential_checks(essential: tuple[str, ...], fresh: Mapping[str, int],
                      unsupported: set[str]) -> Iterator[Check]:
    for name in essential:
        watch = watch_of(name)
        if name in unsupported:
            yield Check(watch, f"{name}_unsupported", HealthStatus.UNKNOWN,
                        f"{name} is not supported by this GPU or driver: the {watch} watch "
                        "cannot see faults")
        elif name in fresh:
            yield clean(watch, f"{name}_unsupported")
