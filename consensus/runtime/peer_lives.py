"""Which life of each peer this replica last heard, so that a peer that forgot is refused.

A replica's promises and acceptances live in its data directory, and a quorum may count on
any of them. One started over on an empty directory (a replaced disk, `--init` again) or on
an older copy (a backup restored) has forgotten some, and with it a second value can be chosen
for one instance (the simulator shows it: a command run twice, a history that is not
linearizable). Such a replica is refused, and it stops, unless it says it rejoins (started
with `--rejoin` on a new directory: `consensus.rejoin` makes it ask every other replica what
its lost life promised before it takes part, and its peers then take its new directory):

- a replica's life is its data directory's random id (`DataIdentity.disk`) and its epoch,
  one more at every start on that directory (`Replica.restore`);
- every dialer's hello carries its own life and the life it last heard of the replica it
  dials (`peers.Hello`);
- the replica dialed refuses a hello whose life is older than the one it last heard from
  that peer (another directory, or the same one at a lower epoch), and writes a newer one
  down durably (`peer_lives.json` in its own data directory) before it takes a frame of it:
  whatever a replica received from a life, it still knows that life after a restart;
- a replica told by a peer that the peer heard it in a newer life, or on another directory,
  stops (exit 78) instead of serving with a memory it no longer has; a rejoining one takes
  the life it is told of as how far its lost life went (its command tags start above).

What this cannot catch: a life that no running peer ever heard (a replica that forgot a life
whose every message went to peers now down or started over themselves), and a copy taken
while the replica ran (its EpochRecord of that start is in the copy, so the restored one
starts one higher, as a restart does, having forgotten only that start's tail). A copy taken
before the replica's last start comes back at the epoch the peers heard, in another process:
each process names itself with a random start id, and its epoch is durable before its first
hello (`node.py`), so a legitimate restart is always at a higher epoch. It turns the common
case, a replica brought back on a fresh disk beside peers that know it, from a silent loss of
agreement into a refusal that says why.
"""

from __future__ import annotations

import json
import pathlib
import re
import secrets
from dataclasses import dataclass

from consensus.runtime.data_identity import DISK_ID_PATTERN
from consensus.runtime.durable_file import replace_file
from consensus.runtime.storage_errors import LogCorrupt, StorageFailed

LIVES_NAME = "peer_lives.json"
LIVES_BYTES_MAX = 64 * 1024  # a line per peer of some 70 bytes; anything longer is not ours
# A replica id as `save` writes it: no sign, no leading zero ("01" would name replica 1 a
# second time), and short enough for `int` (which refuses over 4300 digits)
_REPLICA_KEY = re.compile(r"0|[1-9][0-9]{0,8}")


START_ID_PATTERN = re.compile(r"[0-9a-f]{16}")


def new_start_id() -> str:
    return secrets.token_hex(8)


@dataclass(frozen=True, slots=True)
class Life:
    """One start of a replica on one data directory; `disk` "" where it is not known. `start`
    is a random id of the process (its EpochRecord durable before any hello leaves,
    `node.py`): a second process at the same epoch on the same disk is one whose start was
    forgotten (a copy taken before that start, restored); "" where it is not known."""

    disk: str = ""
    epoch: int = 0
    start: str = ""

    @property
    def known(self) -> bool:
        return bool(self.disk)

    def is_valid(self) -> bool:
        return (self.disk == "" or DISK_ID_PATTERN.fullmatch(self.disk) is not None) and \
            (self.start == "" or START_ID_PATTERN.fullmatch(self.start) is not None) and \
            self.epoch >= 0

    def forgot(self, heard: Life) -> str | None:
        """Why this life cannot be the one `heard` was, or a later one on its directory; None
        if it can (or either is unknown)."""
        if not (self.known and heard.known):
            return None
        if self.disk != heard.disk:
            return (f"its data directory is not the one it had (disk {self.disk}, heard "
                    f"before on disk {heard.disk}): it was started over on an empty or "
                    "another directory")
        if self.epoch < heard.epoch:
            return (f"it is at start {self.epoch} of its data directory, heard before at "
                    f"start {heard.epoch}: the directory was restored from an older copy")
        if self.epoch == heard.epoch and self.start and heard.start and \
                self.start != heard.start:
            return (f"it is at start {self.epoch} of its data directory again, heard before "
                    "in another process at that start: the directory was restored from a "
                    "copy taken before its last start")
        return None


UNKNOWN_LIFE = Life()


class PeerLives:
    """The last life heard of each peer, kept in the file `path` (`peer_lives.json`)."""

    def __init__(self, path: pathlib.Path, heard: dict[int, Life] | None = None) -> None:
        self.path = path
        self._heard = dict(heard or {})

    @classmethod
    def load(cls, directory: pathlib.Path) -> PeerLives:
        """The lives written down in `directory`, none if it has no file yet; raises
        LogCorrupt for a file that is not ours, StorageFailed if it cannot be read."""
        path = directory / LIVES_NAME
        try:
            with path.open("rb") as file:
                data = file.read(LIVES_BYTES_MAX + 1)
        except FileNotFoundError:
            return cls(path)
        except OSError as error:
            raise StorageFailed(path, "reading the peers' lives", error) from error
        heard = _decode(data)
        if heard is None:
            raise LogCorrupt(path, 0, "not a record of the peers' lives (a JSON object from "
                                      "replica ids to a disk id and an epoch)")
        return cls(path, heard)

    def of(self, peer: int) -> Life:
        return self._heard.get(peer, UNKNOWN_LIFE)

    def hear(self, peer: int, life: Life) -> bool:
        """Remember `life` as `peer`'s latest; whether it is news (to be saved)."""
        if not life.known or life == self.of(peer):
            return False
        self._heard[peer] = life
        return True

    def save(self) -> None:
        """Write the lives durably (blocking: call it from a worker thread)."""
        fields = {str(peer): {"disk": life.disk, "epoch": life.epoch,
                              **({"start": life.start} if life.start else {})}
                  for peer, life in sorted(self._heard.items())}
        try:
            replace_file(self.path, (json.dumps(fields, sort_keys=True) + "\n").encode())
        except OSError as error:
            raise StorageFailed(self.path, "writing the peers' lives", error) from error


def _decode(data: bytes) -> dict[int, Life] | None:
    if len(data) > LIVES_BYTES_MAX:
        return None
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(raw, dict):
        return None
    heard: dict[int, Life] = {}
    for key, value in raw.items():
        if not (_REPLICA_KEY.fullmatch(key) and isinstance(value, dict)
                and set(value) - {"start"} == {"disk", "epoch"} and type(value["disk"]) is str
                and type(value["epoch"]) is int and type(value.get("start", "")) is str):
            return None
        life = Life(value["disk"], value["epoch"], value.get("start", ""))
        if not (life.known and life.is_valid()):
            return None
        heard[int(key)] = life
    return heard
