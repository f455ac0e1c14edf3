"""The ledger of pod uids this node ever started: the guard that makes a start happen at most
once, across agent restarts.

A uid is appended and fsynced before its command is launched, so a crash between the two
leaves it remembered (and reported lost), never launched twice. The file `started.log` holds
one JSON string per line, oldest first. Only the most recent `remembered_max` uids are kept:
when the file holds twice that many lines it is rewritten with the newest half. A torn last
line (a crash mid-append, before the launch) is dropped on load.
"""

from __future__ import annotations

import json
import pathlib

from agent.job_errors import JobStateCorrupt
from consensus.runtime.durable_file import append_durably, replace_file

LEDGER_NAME = "started.log"


class StartedLedger:
    def __init__(self, directory: pathlib.Path, remembered_max: int) -> None:
        assert remembered_max >= 1
        self.path = directory / LEDGER_NAME
        self.remembered_max = remembered_max
        self._uids: dict[str, None] = {}  # insertion-ordered: oldest first
        self._lines_in_file = 0
        self._load()

    def __contains__(self, pod_uid: str) -> bool:
        return pod_uid in self._uids

    def __len__(self) -> int:
        return len(self._uids)

    def newest(self) -> str | None:
        """The uid remembered last: the only one a crash can have left launched and unrecorded
        (starts are made one at a time, each recorded before the next)."""
        return next(reversed(self._uids), None)

    def remember(self, pod_uid: str) -> None:
        """Durably record `pod_uid` as started; raises OSError when the disk refuses."""
        assert pod_uid not in self._uids
        append_durably(self.path, _line(pod_uid))
        self._uids[pod_uid] = None
        self._lines_in_file += 1
        if len(self._uids) > self.remembered_max:
            del self._uids[next(iter(self._uids))]
        if self._lines_in_file >= 2 * self.remembered_max:
            self._rewrite()

    def _load(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        lines = data.split(b"\n")
        torn = lines.pop() != b""  # the text after the last newline: empty unless torn
        for number, line in enumerate(lines, start=1):
            self._uids[_parse(self.path, number, line)] = None
        self._lines_in_file = len(lines)
        while len(self._uids) > self.remembered_max:
            del self._uids[next(iter(self._uids))]
        if torn:
            self._rewrite()

    def _rewrite(self) -> None:
        replace_file(self.path, b"".join(_line(uid) for uid in self._uids))
        self._lines_in_file = len(self._uids)


def _line(pod_uid: str) -> bytes:
    return json.dumps(pod_uid).encode("utf-8") + b"\n"


def _parse(path: pathlib.Path, number: int, line: bytes) -> str:
    try:
        uid = json.loads(line)
    except ValueError as error:
        raise JobStateCorrupt(path, f"line {number} is not JSON ({error})") from error
    if not isinstance(uid, str) or not uid:
        raise JobStateCorrupt(path, f"line {number} is not a pod uid")
    return uid
