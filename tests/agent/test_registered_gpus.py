"""The GPUs a node registered, kept across agent restarts (`agent.registered_gpus`): the union
with what NVML lists now, keyed by UUID, and a file that is ignored when it is not valid."""

from __future__ import annotations

import errno
import json
import logging
import pathlib
from dataclasses import replace

import pytest

from agent.gpu import DeviceInfo
from agent.inventory import gpu_inventory, registered_devices
from agent.registered_gpus import FILE_BYTES_MAX, FILE_NAME, RegisteredGpus, encode
from consensus.runtime.durable_file import replace_file


def device(uuid: str, index: int) -> DeviceInfo:
    return DeviceInfo(uuid=uuid, index=index, minor=index, pci_bus_id=f"0000:0{index}:00.0",
                      model="NVIDIA A100-SXM4-80GB", serial="", memory_bytes=80 << 30,
                      compute_capability=(8, 0), numa_node=0, mig_enabled=False,
                      mig_pending=False)


def registered(tmp_path: pathlib.Path, *devices: DeviceInfo) -> RegisteredGpus:
    gpus = RegisteredGpus(tmp_path)
    gpus.remember(devices)
    return gpus


def placed(devices: tuple[DeviceInfo, ...]) -> list[tuple[str, int]]:
    return [(gpu.uuid, gpu.index) for gpu in devices]


def test_gpus_nvml_numbers_anew_keep_the_indices_they_were_registered_at(
        tmp_path: pathlib.Path) -> None:
    """GPU-a is off the bus and NVML, started again, numbers the other three 0..2: keyed by
    index, two indices carried GPU-d's UUID and one of them GPU-c's old index."""
    gpus = registered(tmp_path, *(device(uuid, index) for index, uuid in enumerate("abcd")))
    listed = (device("b", 0), device("c", 1), device("d", 2))
    assert placed(gpus.to_register(listed)) == [("a", 0), ("b", 1), ("c", 2), ("d", 3)]
    assert placed(gpus.lost(listed)) == [("a", 0)]


def test_a_new_gpu_takes_the_index_of_a_lost_one(tmp_path: pathlib.Path) -> None:
    """A board swapped: the new UUID replaces the lost one, at its NVML index if that is free,
    else at a lost GPU's index."""
    gpus = registered(tmp_path, device("a", 0), device("b", 1), device("c", 2))
    assert placed(gpus.to_register((device("a", 0), device("new", 1), device("c", 2)))) == [
        ("a", 0), ("new", 1), ("c", 2)]
    assert placed(gpus.to_register((device("c", 0), device("new", 1), device("b", 2)))) == [
        ("new", 0), ("b", 1), ("c", 2)]
    assert placed(gpus.to_register((device("a", 0), device("b", 1), device("c", 2),
                                    device("d", 1)))) == [("a", 0), ("b", 1), ("c", 2),
                                                          ("d", 3)]


def test_the_stores_record_stands_in_for_a_lost_file(tmp_path: pathlib.Path) -> None:
    """No file, and NVML numbers the GPUs anew with b off the bus: the store's record of the
    node puts each GPU back at its registered index, b included, once."""
    stored = (device("a", 0), device("b", 1), device("c", 2))
    listed = (device("a", 0), replace(device("c", 2), index=1))
    gpus = RegisteredGpus(tmp_path)
    assert placed(gpus.to_register(listed)) == [("a", 0), ("c", 1)]
    assert gpus.adopt(stored)
    assert placed(gpus.to_register(listed)) == [("a", 0), ("b", 1), ("c", 2)]
    assert placed(gpus.lost(listed)) == [("b", 1)]
    assert not gpus.adopt(stored)
    assert not gpus.adopt(())


def test_the_stores_record_is_registered_back_as_it_was(tmp_path: pathlib.Path) -> None:
    """A GPU known only from the store's record is registered with the store's model name, as
    the cluster configuration maps NVML's."""
    models = (("NVIDIA A100-SXM4-80GB", "A100-80G"),)
    stored = gpu_inventory((device("a", 0), device("b", 1)), models)
    assert gpu_inventory(registered_devices(stored, (device("a", 0),), models),
                         models) == stored


def test_the_registered_gpus_are_read_back_by_a_restarted_agent(
        tmp_path: pathlib.Path) -> None:
    devices = (device("a", 0), device("b", 1))
    registered(tmp_path, *devices)
    assert RegisteredGpus(tmp_path).by_uuid == {gpu.uuid: gpu for gpu in devices}


def _with(field: str, value: object) -> bytes:
    document = json.loads(encode([device("a", 0), device("b", 1)]))
    document["gpus"][1][field] = value
    return json.dumps(document).encode()


CORRUPT = {
    "torn": encode([device("a", 0)])[:-20],
    "not an inventory": b'{"version": 1}',
    "another version": encode([device("a", 0)]).replace(b'"version": 1', b'"version": 2'),
    "index twice": _with("index", 0),
    "uuid twice": _with("uuid", "a"),
    "index out of range": _with("index", 64),
    "a bool for an int": _with("minor", True),
    "an unknown field": json.dumps({"version": 1, "gpus": [{"uuid": "a"}]}).encode(),
    "a bad compute capability": _with("compute_capability", [8]),
    "too long": b" " * (FILE_BYTES_MAX + 1),
}


@pytest.mark.parametrize("content", CORRUPT.values(), ids=CORRUPT.keys())
def test_a_corrupt_file_is_logged_and_ignored(tmp_path: pathlib.Path, content: bytes,
                                             caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / FILE_NAME).write_bytes(content)
    with caplog.at_level(logging.ERROR):
        gpus = RegisteredGpus(tmp_path)
    assert gpus.by_uuid == {}
    assert FILE_NAME in caplog.text
    assert placed(gpus.to_register((device("b", 0),))) == [("b", 0)]


def test_a_write_that_failed_is_tried_again(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk was full when a swapped board was registered: the next heartbeat writes the
    file, so a restarted agent does not register the old board."""
    gpus = registered(tmp_path, device("a", 0), device("b", 1))

    def disk_full(path: pathlib.Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    swapped = (device("a", 0), device("new", 1))
    monkeypatch.setattr("agent.registered_gpus.replace_file", disk_full)
    gpus.remember(swapped)
    monkeypatch.setattr("agent.registered_gpus.replace_file", replace_file)
    gpus.save()  # the next heartbeat
    assert RegisteredGpus(tmp_path).by_uuid == {gpu.uuid: gpu for gpu in swapped}


def test_a_corrupt_file_is_replaced_at_the_next_registration(tmp_path: pathlib.Path) -> None:
    (tmp_path / FILE_NAME).write_bytes(CORRUPT["torn"])
    registered(tmp_path)
    assert RegisteredGpus(tmp_path).by_uuid == {}
    assert json.loads((tmp_path / FILE_NAME).read_bytes())["gpus"] == []
