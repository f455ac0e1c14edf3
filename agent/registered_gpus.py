"""The GPUs this node last registered, kept in the agent's state directory across restarts, and
the inventory to register next.

The store wants every GPU index of the node at each registration, and one UUID at one index.
A GPU off the bus is missing from NVML's list, and NVML started again may number the others
anew (the index is not an identity, the UUID is). So the agent registers the union of what
NVML lists now and what it registered before, by UUID, each at the index it was registered
at; a UUID listed for the first time takes its NVML index, replacing a lost GPU registered
there (a board swapped), or the lowest index left. A GPU that stays lost stays registered (the
health tracker reports it failed) until a new board takes its index; an operator who shrinks
the node removes the file.

The file `registered-gpus.json` is replaced atomically after each registration. It is bounded
(`FILE_BYTES_MAX`, `GPUS_PER_NODE_MAX` GPUs) and checked when read: one that is unreadable or
not valid is logged and ignored, and the node registers what NVML lists, as at its first start.
Should the store refuse that as not matching (a GPU off the bus meanwhile: too few), the agent
takes the store's record of its node instead (`adopt`), which the file mirrored.
"""

from __future__ import annotations

import json
import logging
import pathlib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, replace
from typing import Any

from agent.gpu import DeviceInfo
from consensus.runtime.durable_file import replace_file
from statemachine.limits import GPUS_PER_NODE_MAX, UUID_LENGTH_MAX

logger = logging.getLogger("cellar.agent.gpus")
FILE_NAME = "registered-gpus.json"
FILE_BYTES_MAX = 256 << 10  # 64 GPUs take about 25 KiB
FORMAT_VERSION = 1
TEXT_LENGTH_MAX = 256  # a PCI bus id, model name or serial
# DeviceInfo's fields as JSON holds them; compute_capability is a list of two ints.
FIELD_TYPES: dict[str, type] = {
    "uuid": str, "index": int, "minor": int, "pci_bus_id": str, "model": str, "serial": str,
    "memory_bytes": int, "compute_capability": list, "numa_node": int, "mig_enabled": bool,
    "mig_pending": bool}


class CorruptFile(ValueError):
    """The file does not hold a valid inventory."""


class RegisteredGpus:
    def __init__(self, state_dir: pathlib.Path) -> None:
        self.path = state_dir / FILE_NAME
        self._saved = self._load()  # what the file holds; None when it holds no inventory
        self.by_uuid: dict[str, DeviceInfo] = self._saved or {}

    def to_register(self, listed: Iterable[DeviceInfo]) -> tuple[DeviceInfo, ...]:
        """What NVML lists now, joined with what was registered before (module docstring)."""
        return merged(self.by_uuid, listed)

    def lost(self, listed: Iterable[DeviceInfo]) -> tuple[DeviceInfo, ...]:
        """The GPUs registered before that NVML does not list now."""
        present = {device.uuid for device in listed}
        return tuple(device for uuid, device in sorted(self.by_uuid.items())
                     if uuid not in present)

    def adopt(self, registered: Iterable[DeviceInfo]) -> bool:
        """The store refused the inventory as not matching: take its record of this node's
        GPUs (`registered`, the last registration it took, which the file mirrors unless it
        was lost, corrupt or not written) for the one kept here (what this one knows of a GPU
        is kept, at the store's index), to join with what NVML lists at the next try. False
        if the store has none, or the same."""
        by_uuid = {device.uuid: replace(self.by_uuid.get(device.uuid, device), index=device.index)
                   for device in registered}
        if not by_uuid or by_uuid == self.by_uuid:
            return False
        self.by_uuid = by_uuid
        return True

    def remember(self, registered: Iterable[DeviceInfo]) -> None:
        """The store accepted `registered`: kept in memory, and on disk (`save`)."""
        self.by_uuid = {device.uuid: device for device in registered}
        self.save()

    def save(self) -> None:
        """Write the inventory unless the file holds it already. A write that failed (a full
        disk) is logged and tried again at the next call: the daemon calls this with every
        heartbeat, so a restarted agent does not register an inventory older than the store's."""
        if self.by_uuid == self._saved:
            return
        try:
            replace_file(self.path, encode(self.by_uuid.values()))
        except OSError as error:
            logger.warning("cannot write %s (tried again with the next heartbeat): %s",
                           self.path, error)
        else:
            self._saved = self.by_uuid

    def _load(self) -> dict[str, DeviceInfo] | None:
        try:
            with self.path.open("rb") as file:
                data = file.read(FILE_BYTES_MAX + 1)
            return {device.uuid: device for device in decode(data)}
        except FileNotFoundError:
            return None
        except (OSError, CorruptFile) as error:
            logger.error("ignoring %s (%s): registering the GPUs NVML lists", self.path, error)
            return None


def merged(registered: Mapping[str, DeviceInfo], listed: Iterable[DeviceInfo]
           ) -> tuple[DeviceInfo, ...]:
    """Each listed GPU at its registered index (or a free one, if new); each registered GPU
    not listed at its own, unless a new one took it. Sorted by index."""
    listed_by_uuid = {device.uuid: device for device in listed}
    kept = {uuid: replace(device, index=registered[uuid].index)
            for uuid, device in listed_by_uuid.items() if uuid in registered}
    taken = {device.index for device in kept.values()}
    lost = {device.index: device for uuid, device in registered.items()
            if uuid not in listed_by_uuid and device.index not in taken}
    new = sorted((device for uuid, device in listed_by_uuid.items() if uuid not in registered),
                 key=lambda device: (device.index, device.uuid))
    for device in new:
        index = _free_index(device.index, taken, lost)
        lost.pop(index, None)
        taken.add(index)
        kept[device.uuid] = replace(device, index=index)
    return tuple(sorted([*kept.values(), *lost.values()], key=lambda device: device.index))


def _free_index(wanted: int, taken: set[int], lost: Mapping[int, DeviceInfo]) -> int:
    """`wanted` if no listed GPU holds it, else the lowest index a lost GPU holds, else the
    lowest index nobody holds."""
    if wanted not in taken:
        return wanted
    if lost:
        return min(lost)
    return next(index for index in range(len(taken) + len(lost) + 1)
                if index not in taken and index not in lost)


def encode(devices: Iterable[DeviceInfo]) -> bytes:
    gpus = [asdict(device) for device in sorted(devices, key=lambda device: device.index)]
    text = json.dumps({"version": FORMAT_VERSION, "gpus": gpus}, indent=1, sort_keys=True)
    return text.encode("utf-8") + b"\n"


def decode(data: bytes) -> tuple[DeviceInfo, ...]:
    """The inventory `encode` wrote; CorruptFile if it is anything else."""
    if len(data) > FILE_BYTES_MAX:
        raise CorruptFile(f"longer than {FILE_BYTES_MAX} bytes")
    try:
        document = json.loads(data)
    except ValueError as error:
        raise CorruptFile(f"not JSON: {error}") from error
    if not isinstance(document, dict) or document.get("version") != FORMAT_VERSION:
        raise CorruptFile(f"not an inventory of format version {FORMAT_VERSION}")
    gpus = document.get("gpus")
    if not isinstance(gpus, list) or len(gpus) > GPUS_PER_NODE_MAX:
        raise CorruptFile(f"'gpus' is not a list of at most {GPUS_PER_NODE_MAX}")
    devices = tuple(_device(number, gpu) for number, gpu in enumerate(gpus))
    if len({device.uuid for device in devices}) < len(devices):
        raise CorruptFile("a UUID is listed twice")
    if len({device.index for device in devices}) < len(devices):
        raise CorruptFile("an index is listed twice")
    return devices


def _device(number: int, gpu: Any) -> DeviceInfo:
    if not isinstance(gpu, dict) or set(gpu) != set(FIELD_TYPES):
        raise CorruptFile(f"GPU {number} does not have the fields {sorted(FIELD_TYPES)}")
    for name, kind in FIELD_TYPES.items():
        value = gpu[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise CorruptFile(f"GPU {number}: {name} is not {kind.__name__}")
        if isinstance(value, str) and len(value) > TEXT_LENGTH_MAX:
            raise CorruptFile(f"GPU {number}: {name} is longer than {TEXT_LENGTH_MAX}")
    capability = gpu["compute_capability"]
    if len(capability) != 2 or not all(type(part) is int for part in capability):
        raise CorruptFile(f"GPU {number}: compute_capability is not two ints")
    if not 0 < len(gpu["uuid"]) <= UUID_LENGTH_MAX:
        raise CorruptFile(f"GPU {number}: uuid is empty or longer than {UUID_LENGTH_MAX}")
    if not 0 <= gpu["index"] < GPUS_PER_NODE_MAX:
        raise CorruptFile(f"GPU {number}: index is not in 0..{GPUS_PER_NODE_MAX - 1}")
    return DeviceInfo(**{**gpu, "compute_capability": tuple(capability)})
