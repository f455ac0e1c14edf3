"""Whose data directory this is: the replica id and group size, kept in a file beside the log.

The log's records do not say whose they are. A data directory mounted or copied under the
wrong replica (replica 2's disk under replica 1's configuration) would open as that replica's
own: it would answer for promises and acceptances another replica made, and two values could
be chosen for one instance. So the directory names its owner in `identity.json`, written
durably the first time a build that knows the file opens the log (a new replica's, or one
written by an earlier build, which is taken to be the configured replica's), and checked at
every later open: another owner refuses the start with nothing changed (exit 78, a
configuration mistake). The lock is held meanwhile (`DurableLog.open` claims it).

It names the state machine too: a replica restarted under another `machine` replayed its log
into a machine that cannot read it (the first snapshot restored or command applied failed with
an unhandled error, or worse, was answered as a bad command on every replica alike). A file
written before the machine was named is claimed for the configured one, as a log from before
the file is claimed for the configured replica.
"""

from __future__ import annotations

import json
import pathlib
import re
import secrets
from dataclasses import dataclass, replace

from consensus.runtime.durable_file import replace_file
from consensus.runtime.storage_errors import (
    DataDirectoryMismatch,
    LogCorrupt,
    StorageFailed,
)

IDENTITY_NAME = "identity.json"
IDENTITY_BYTES_MAX = 4096  # the file is some 60 bytes; anything longer is not ours
MACHINE_NAME_LENGTH_MAX = 64
DISK_ID_BYTES = 16  # written as 32 hex digits
DISK_ID_PATTERN = re.compile(r"[0-9a-f]{32}")


def new_disk_id() -> str:
    return secrets.token_hex(DISK_ID_BYTES)


@dataclass(frozen=True, slots=True)
class DataIdentity:
    """The replica a data directory belongs to."""

    replica_id: int
    replica_count: int
    machine: str = ""  # the state machine's name; "" in a file written before it was named
    disk: str = ""  # this directory's random id; "" in a file written before it had one

    def __str__(self) -> str:
        machine = f" ({self.machine} machine)" if self.machine else ""
        return f"replica {self.replica_id} of {self.replica_count}{machine}"

    def encode(self) -> bytes:
        fields: dict[str, object] = {"replica_id": self.replica_id,
                                     "replica_count": self.replica_count}
        if self.machine:
            fields["machine"] = self.machine
        if self.disk:
            fields["disk"] = self.disk
        return (json.dumps(fields) + "\n").encode()

    def owns(self, found: DataIdentity) -> bool:
        """Whether a directory naming `found` is this replica's (a file that does not name
        its machine yet is taken to be the configured one's)."""
        return (found.replica_id, found.replica_count) == (self.replica_id,
                                                           self.replica_count) \
            and found.machine in ("", self.machine)


def claim(directory: pathlib.Path, identity: DataIdentity) -> DataIdentity:
    """Check that `directory` is `identity`'s, writing the file where it has none yet, and
    return what it names now (with its disk id); raises DataDirectoryMismatch for another
    owner, LogCorrupt for a file that is not an identity. `identity.disk` is not compared."""
    path = directory / IDENTITY_NAME
    found = _read(path)
    if found is not None and not identity.owns(found):
        raise DataDirectoryMismatch(path, found=str(found), configured=str(identity))
    claimed = replace(identity, disk=found.disk if found is not None and found.disk
                      else new_disk_id())
    if found != claimed:  # none yet, or one that does not name the machine or the disk
        try:
            replace_file(path, claimed.encode())
        except OSError as error:
            raise StorageFailed(path, "writing the data directory's identity", error) from error
    return claimed


def _read(path: pathlib.Path) -> DataIdentity | None:
    try:
        with path.open("rb") as file:
            data = file.read(IDENTITY_BYTES_MAX + 1)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise StorageFailed(path, "reading the data directory's identity", error) from error
    identity = _decode(data)
    if identity is None:
        raise LogCorrupt(path, 0, "not a data directory identity (a JSON object with the "
                                  "integers replica_id and replica_count)")
    return identity


def _decode(data: bytes) -> DataIdentity | None:
    if len(data) > IDENTITY_BYTES_MAX:
        return None
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):  # "[[[[..." nests past the limit
        return None
    if not isinstance(raw, dict) or \
            sorted(set(raw) - {"machine", "disk"}) != ["replica_count", "replica_id"]:
        return None
    replica_id, replica_count = raw["replica_id"], raw["replica_count"]
    machine, disk = raw.get("machine", ""), raw.get("disk", "")
    if "disk" in raw and not (type(disk) is str and DISK_ID_PATTERN.fullmatch(disk)):
        return None
    if type(replica_id) is not int or type(replica_count) is not int:
        return None
    if not 0 <= replica_id < replica_count or type(machine) is not str or \
            ("machine" in raw and not 0 < len(machine) <= MACHINE_NAME_LENGTH_MAX):
        return None
    return DataIdentity(replica_id, replica_count, machine, disk)
