"""A damaged identity file that nests deeper than Python's recursion limit is refused as
corrupt, naming the file (exit 65), like any other file that is not an identity: it raised a
bare RecursionError, a traceback instead of the message and exit code an operator acts on
(`peer_lives.json` already refused it so)."""

from __future__ import annotations

import pathlib

import pytest

from consensus.runtime.data_identity import IDENTITY_BYTES_MAX, IDENTITY_NAME, DataIdentity
from consensus.runtime.storage import DurableLog
from consensus.runtime.storage_errors import EXIT_LOG_CORRUPT, LogCorrupt


def test_an_identity_nested_past_the_recursion_limit_is_refused_as_corrupt(
        tmp_path: pathlib.Path) -> None:
    identity = DataIdentity(0, 3, "kv")
    DurableLog.open(tmp_path, create=True, identity=identity).close()
    (tmp_path / IDENTITY_NAME).write_bytes(b"[" * IDENTITY_BYTES_MAX)
    with pytest.raises(LogCorrupt) as refused:
        DurableLog.open(tmp_path, create=False, identity=identity)
    assert refused.value.exit_code == EXIT_LOG_CORRUPT
    assert refused.value.path == tmp_path / IDENTITY_NAME
    DurableLog.open(tmp_path, create=False).close()  # the lock was given back
