"""An append to a file that already exists fsyncs its directory too: a process killed between
creating the file and the directory's fsync left a name only in the page cache, and every
later append (the agent's ledger of started jobs) was reported durable while a power failure
could take the file with all of them."""

from __future__ import annotations

import pathlib

import pytest

from consensus.runtime import durable_file


def test_an_append_to_an_existing_file_syncs_its_directory(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ledger"
    path.write_bytes(b"first\n")  # created, its directory never synced: the process was killed
    synced: list[pathlib.Path] = []
    monkeypatch.setattr(durable_file, "fsync_directory", synced.append)
    durable_file.append_durably(path, b"second\n")
    assert path.read_bytes() == b"first\nsecond\n"
    assert synced == [tmp_path]
