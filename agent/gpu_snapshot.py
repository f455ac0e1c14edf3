"""Snapshots of a node's GPUs: everything `devices()`, `sample()`, `processes()` and
`topology()` read, UNSUPPORTED and failed readings included, as typed values and as JSON-able
dicts.

A real GPU machine records one (`python -m agent.record_snapshot OUT.json`, through NVML);
`FakeGpuBackend.from_snapshot` replays it, and the built-in profiles are snapshots too. In JSON a
reading is an integer, the string "unsupported", or {"failed": code, "message": text}.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from agent import nvml_abi as abi
from agent.gpu import (
    UNSUPPORTED,
    DeviceInfo,
    DeviceSample,
    DriverInfo,
    Fabric,
    Failed,
    GpuBackend,
    GpuPair,
    GpuProcess,
    NvLinkSample,
    Reading,
    Topology,
    Unsupported,
)

FORMAT: Final = "cellar-gpu-snapshot/1"
# The DeviceSample fields that are Readings, in declaration order.
READING_FIELDS: Final = tuple(
    field.name for field in dataclasses.fields(DeviceSample)
    if field.name not in {"uuid", "fabric", "nvlinks"}
)
LINK_READING_FIELDS: Final = (
    "replay_errors", "recovery_errors", "crc_flit_errors", "crc_data_errors",
)
UNSUPPORTED_JSON: Final = "unsupported"

Json: TypeAlias = dict[str, Any]


class SnapshotError(ValueError):
    """A snapshot document does not have the shape this module writes; names the field."""


@dataclass(frozen=True, slots=True)
class DeviceSnapshot:
    info: DeviceInfo
    sample: DeviceSample
    processes: tuple[GpuProcess, ...] = ()
    supported_events: int = abi.EVENT_XID  # nvmlDeviceGetSupportedEventTypes


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    driver: DriverInfo
    devices: tuple[DeviceSnapshot, ...]
    topology: Topology


def default_supported_events(sample: DeviceSample) -> int:
    """The event mask a recorded GPU is replayed with: XIDs, and ECC events where ECC is on."""
    ecc = abi.EVENT_SINGLE_BIT_ECC | abi.EVENT_DOUBLE_BIT_ECC
    return abi.EVENT_XID | (ecc if sample.ecc_enabled == 1 else 0)


def record(backend: GpuBackend) -> NodeSnapshot:
    """Read everything a started backend offers, once."""
    devices = []
    for info in backend.devices():
        sample = backend.sample(info.uuid)
        devices.append(DeviceSnapshot(info, sample, backend.processes(info.uuid),
                                      default_supported_events(sample)))
    return NodeSnapshot(backend.driver(), tuple(devices), backend.topology())


def record_snapshot(backend: GpuBackend) -> Json:
    """`record` as a JSON-able dict."""
    return encode(record(backend))


def link_peers(snapshot: NodeSnapshot) -> dict[str, tuple[str | None, ...]]:
    """For each GPU, the UUID at the far end of each of its NVLinks, in link order; None where
    the far end is an NVSwitch or unknown. A snapshot keeps only per-pair link counts, so the
    links that were up are handed to peers in UUID order, the same way on every replay."""
    peers: dict[str, tuple[str | None, ...]] = {}
    for device in snapshot.devices:
        uuid = device.info.uuid
        wanted = sorted((pair.uuid_b if pair.uuid_a == uuid else pair.uuid_a, pair.nvlinks)
                        for pair in snapshot.topology.pairs
                        if uuid in (pair.uuid_a, pair.uuid_b) and pair.nvlinks > 0)
        queue = [peer for peer, count in wanted for _ in range(count)]
        assigned: list[str | None] = []
        for link in device.sample.nvlinks:
            take = link.up and bool(queue) and not snapshot.topology.nvswitch
            assigned.append(queue.pop(0) if take else None)
        peers[uuid] = tuple(assigned)
    return peers


# Encoding.

def encode_reading(reading: Reading) -> object:
    if isinstance(reading, Unsupported):
        return UNSUPPORTED_JSON
    if isinstance(reading, Failed):
        return {"failed": reading.code, "message": reading.message}
    return reading


def encode(snapshot: NodeSnapshot) -> Json:
    return {
        "format": FORMAT,
        "driver": dataclasses.asdict(snapshot.driver),
        "devices": [_encode_device(device) for device in snapshot.devices],
        "topology": {
            "nvswitch": snapshot.topology.nvswitch,
            "pairs": [dataclasses.asdict(pair) for pair in snapshot.topology.pairs],
            "notes": list(snapshot.topology.notes),
        },
    }


def _encode_device(device: DeviceSnapshot) -> Json:
    sample = device.sample
    return {
        "info": {**dataclasses.asdict(device.info),
                 "compute_capability": list(device.info.compute_capability)},
        "sample": {
            **{name: encode_reading(getattr(sample, name)) for name in READING_FIELDS},
            "fabric": sample.fabric.name,
            "nvlinks": [{"link": link.link, "up": link.up,
                         **{name: encode_reading(getattr(link, name))
                            for name in LINK_READING_FIELDS}}
                        for link in sample.nvlinks],
        },
        "processes": [{"pid": process.pid, "used_bytes": process.used_bytes}
                      for process in device.processes],
        "supported_events": device.supported_events,
    }


# Decoding: every value is checked, and a bad one names its place in the document.

class _Fields:
    def __init__(self, data: object, where: str) -> None:
        if not isinstance(data, Mapping):
            raise SnapshotError(f"{where}: expected an object")
        self._data: Mapping[str, object] = data
        self.where = where

    def value(self, key: str) -> object:
        if key not in self._data:
            raise SnapshotError(f"{self.where}.{key}: missing")
        return self._data[key]

    def integer(self, key: str, default: int | None = None) -> int:
        if default is not None and key not in self._data:
            return default
        value = self.value(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise SnapshotError(f"{self.where}.{key}: expected an integer")
        return value

    def optional_integer(self, key: str) -> int | None:
        return None if self._data.get(key) is None else self.integer(key)

    def text(self, key: str) -> str:
        value = self.value(key)
        if not isinstance(value, str):
            raise SnapshotError(f"{self.where}.{key}: expected a string")
        return value

    def flag(self, key: str) -> bool:
        value = self.value(key)
        if not isinstance(value, bool):
            raise SnapshotError(f"{self.where}.{key}: expected true or false")
        return value

    def items(self, key: str) -> list[object]:
        value = self.value(key)
        if not isinstance(value, list):
            raise SnapshotError(f"{self.where}.{key}: expected a list")
        return value

    def objects(self, key: str) -> list[_Fields]:
        return [_Fields(item, f"{self.where}.{key}[{index}]")
                for index, item in enumerate(self.items(key))]

    def sub(self, key: str) -> _Fields:
        return _Fields(self.value(key), f"{self.where}.{key}")

    def reading(self, key: str) -> Reading:
        value = self.value(key)
        if value == UNSUPPORTED_JSON:
            return UNSUPPORTED
        if isinstance(value, Mapping):
            failure = _Fields(value, f"{self.where}.{key}")
            return Failed(failure.integer("failed"), failure.text("message"))
        return self.integer(key)


def decode(data: object) -> NodeSnapshot:
    """The snapshot a JSON document holds; raises SnapshotError naming the first bad field."""
    document = _Fields(data, "snapshot")
    if document.value("format") != FORMAT:
        raise SnapshotError(f"snapshot.format: expected {FORMAT!r}")
    driver = document.sub("driver")
    return NodeSnapshot(
        driver=DriverInfo(driver.text("driver_version"), driver.text("nvml_version"),
                          driver.integer("cuda_driver_version")),
        devices=tuple(_decode_device(device) for device in document.objects("devices")),
        topology=_decode_topology(document.sub("topology")),
    )


def _decode_device(device: _Fields) -> DeviceSnapshot:
    sample = _decode_sample(device.sub("sample"), device.sub("info").text("uuid"))
    processes = tuple(GpuProcess(process.integer("pid"), process.optional_integer("used_bytes"))
                      for process in device.objects("processes"))
    events = device.integer("supported_events", default_supported_events(sample))
    return DeviceSnapshot(_decode_info(device.sub("info")), sample, processes, events)


def _decode_info(info: _Fields) -> DeviceInfo:
    match info.items("compute_capability"):
        case [int(major), int(minor)]:
            capability = (major, minor)
        case _:
            raise SnapshotError(f"{info.where}.compute_capability: expected [major, minor]")
    return DeviceInfo(
        uuid=info.text("uuid"), index=info.integer("index"), minor=info.integer("minor"),
        pci_bus_id=info.text("pci_bus_id"), model=info.text("model"),
        serial=info.text("serial"), memory_bytes=info.integer("memory_bytes"),
        compute_capability=capability,
        numa_node=info.integer("numa_node"), mig_enabled=info.flag("mig_enabled"),
        mig_pending=info.flag("mig_pending"),
    )


def _decode_sample(sample: _Fields, uuid: str) -> DeviceSample:
    readings = {name: sample.reading(name) for name in READING_FIELDS}
    fabric_name = sample.text("fabric")
    if fabric_name not in Fabric.__members__:
        raise SnapshotError(f"{sample.where}.fabric: unknown state {fabric_name!r}")
    links = tuple(
        NvLinkSample(link.integer("link"), link.flag("up"),
                     *(link.reading(name) for name in LINK_READING_FIELDS))
        for link in sample.objects("nvlinks"))
    return DeviceSample(uuid=uuid, fabric=Fabric[fabric_name], nvlinks=links, **readings)


def _decode_topology(topology: _Fields) -> Topology:
    pairs = tuple(GpuPair(pair.text("uuid_a"), pair.text("uuid_b"), pair.integer("level"),
                          pair.integer("nvlinks"))
                  for pair in topology.objects("pairs"))
    notes = tuple(str(note) for note in topology.items("notes"))
    return Topology(pairs, topology.flag("nvswitch"), notes)
