"""Properties of torn tails and damage.

- Cut anywhere inside the last append (never synced), the log opens with every synced record
  and a prefix of that append: a torn tail is never mistaken for damage.
- Any byte flipped (or burst zeroed) inside a synced frame that has a synced frame after it is
  refused: damage is never mistaken for a torn tail, so no synced record is dropped silently.
"""

from __future__ import annotations

import pathlib
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consensus.records import Record
from consensus.runtime.storage import LOG_NAME, DurableLog
from consensus.runtime.storage_errors import LogCorrupt
from tests.consensus.runtime.test_storage import frame_offsets, reopen
from tests.consensus.runtime.workload import take


def build(directory: pathlib.Path, synced: int, tail: int, seed: int
          ) -> tuple[list[Record], list[Record], int]:
    records = take(seed, synced + tail, snapshot_every=7)
    with DurableLog.open(directory, create=True) as log:
        log.records()
        log.append(records[:synced])
        log.sync()
        size = (directory / LOG_NAME).stat().st_size
        log.append(records[synced:])
        log.sync()
    return records[:synced], records[synced:], size


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 1000), synced=st.integers(1, 12), tail=st.integers(1, 5),
       cut=st.floats(0, 1, exclude_max=True))
def test_a_cut_inside_the_last_append_is_a_torn_tail(seed: int, synced: int, tail: int,
                                                    cut: float) -> None:
    directory = pathlib.Path(tempfile.mkdtemp())
    try:
        before, after, size = build(directory, synced, tail, seed)
        path = directory / LOG_NAME
        data = path.read_bytes()
        keep = size + int(cut * (len(data) - size))
        path.write_bytes(data[:keep])
        opened = reopen(directory)
        assert opened[:len(before)] == before
        assert opened[len(before):] == after[:len(opened) - len(before)]
    finally:
        shutil.rmtree(directory)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 1000), synced=st.integers(2, 12), where=st.floats(0, 1,
       exclude_max=True), burst=st.integers(1, 4), zero=st.booleans())
def test_damage_before_the_last_synced_frame_is_refused(seed: int, synced: int, where: float,
                                                        burst: int, zero: bool) -> None:
    directory = pathlib.Path(tempfile.mkdtemp())
    try:
        build(directory, synced, 1, seed)
        offsets = frame_offsets(directory)
        path = directory / LOG_NAME
        data = bytearray(path.read_bytes())
        last = offsets[-1]  # damage stays before the last frame
        at = offsets[0] + int(where * (last - offsets[0]))
        end = min(at + burst, last)
        for position in range(at, end):
            data[position] = 0 if zero else data[position] ^ 0xA5
        if bytes(data) == path.read_bytes():
            return
        path.write_bytes(bytes(data))
        with pytest.raises(LogCorrupt):
            reopen(directory)
    finally:
        shutil.rmtree(directory)
