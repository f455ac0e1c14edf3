"""The record log's bytes: a header, then one frame per record, and how a log is read back.

    header  = b"CELLARLG" | version u32 | crc32(magic + version) u32                   16 bytes
              | salt (8 bytes) | crc32(the 24 bytes before it) u32    versions 2, 3: 28 bytes
    frame   = marker | checksum u32 | length u32 | payload                         12 + length
    marker   = b"\\xc1" + the salt's first 3 bytes (version 1: b"\\xc1rec")
    checksum = crc32(length + payload), started from crc32(salt) (version 1: from 0)

Integers are big-endian; `payload` is `consensus.codec.encode_record` (never empty, at most
`RECORD_BYTES_MAX`). Every version's header starts with the same 16 bytes, so a version this
build does not read is told from a damaged header by their checksum. New logs are written in
version 3, which frames records as version 2 does and may hold the records a leader reserves
its own indexes with (`ReserveRecord`: a build that reads version 2 only would take one for
damage, so it is told the version instead); a log of version 1 or 2 is read, then rewritten in
version 3 when it is opened (`consensus.runtime.storage`). The marker starts with 0xc1, a byte
msgpack never uses; it lets the reader find the frames that follow a damaged one with
`bytes.find` instead of trying every offset.

Why the salt. A payload holds client-chosen bytes (a command's body, a value in a snapshot).
Version 1 checks a frame by crc32(length + payload) alone, which anyone can compute, so those
bytes can form frames as valid as the log's own, and the reader cannot look for valid frames
inside a bad frame's extent: it had to trust the bad frame's own length, which damage can
change. The salt is 8 random bytes (`os.urandom`), fresh for every file written: when a log is
created, and the new file of every compaction. It never leaves the file, so bytes a client
chose pass a version-2 frame's checksum with a chance of 2**-32, as random damage does. The
marker holds 3 bytes of the salt too, so client bytes hold a version-2 marker only by chance
(2**-24 per position): looking for valid frames after a bad one checks each marker's checksum,
a pass over its length, and with markers a client could place at will a torn tail of crafted
bytes cost time quadratic in its size (seconds for 1 MiB) at every restart.

Reading tells a torn tail from corruption. A crash mid-append leaves a prefix of what was
written: the last frame is cut short (or, after power loss, has a bad checksum), and no valid
frame follows it. That frame was never synced, so it is cut off and reported. Anything else is
refused with its offset, never truncated: a bad header, a length beyond the cap, (in
`consensus.runtime.storage`) a checksummed record that does not decode, and a bad frame that a
write cut short cannot explain:

- version 2: a valid frame starts anywhere after the bad frame's first byte;
- both versions: the bad frame is whole but for its marker or length: with the length that
  ends it at the end of the file, its checksum matches. A tear cannot leave every payload byte
  and the checksum intact; a damaged header field of a synced last record can;
- version 1 (its rules as they were): when the bad frame's marker is there and its length is
  possible, the search for later valid frames starts at its declared end (so a torn frame is
  never judged by client-made frames inside its own payload), else at its next byte; and the
  frame is refused when it would be valid with another length that ends at a valid frame
  inside its extent, a whole record with a damaged length. (Each such end costs a
  `crc32_combine`, never a pass over the payload; more than DAMAGE_ENDS_MAX candidate ends,
  which only crafted payloads produce, is refused rather than guessed.) Version 1 cannot see
  damage to a length that grew past the end of the file together with the payload's first
  byte: the search starts past the file. Rewriting it in version 2 at open ends that.

Zeros after the last valid frame, to the end of the file, are space written ahead of the
records (`consensus.runtime.storage`: an fdatasync that extends the file costs a journal
commit), not a torn tail: `scan` returns them as `zeroed_bytes`. A write cut short inside that
space leaves a bad frame followed by zeros, a torn tail as above; no frame is all zeros (its
marker starts with 0xc1).

One crash can look like damage: after a power loss, a filesystem that wrote an unsynced
append's later pages but not its earlier ones leaves a hole before valid frames. The log is
refused then too: the records after the hole were never synced, but nothing on disk says so,
and guessing wrong would drop synced records.

crc32 (zlib) rather than blake2b (8-byte digest): measured by `cellar bench storage`, crc32
takes 0.27 µs for a 128-byte record and runs at 3.6 GB/s on a 4 MiB snapshot, blake2b 0.78 µs
and 0.55 GB/s. A crc32 catches every burst error up to 32 bits and lets a random frame pass
with a chance of 2**-32; the checksum guards against torn and damaged writes, not against an
adversary, so the wider digest would buy nothing for its cost.
"""

from __future__ import annotations

import os
import pathlib
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from consensus.codec import RECORD_BYTES_MAX
from consensus.runtime.crc import crc32_combine
from consensus.runtime.storage_errors import LogCorrupt, LogVersionUnsupported

MAGIC = b"CELLARLG"
VERSION = 3  # what new logs are written in
VERSIONS = (1, 2, 3)  # what this build reads
_PREFIX = struct.Struct(">8sII")  # magic, version, crc32 of both: every version's first bytes
PREFIX_SIZE = _PREFIX.size
SALT_SIZE = 8
_SALTED = struct.Struct(f">{SALT_SIZE}sI")  # version 2: salt, crc32 of all before it
HEADER_SIZE = PREFIX_SIZE + _SALTED.size  # version 2's
FRAME_MARKER = b"\xc1rec"
_FRAME = struct.Struct(">4sII")  # marker, checksum, length
FRAME_OVERHEAD = _FRAME.size
_LENGTH = struct.Struct(">I")
DAMAGE_ENDS_MAX = 4096  # candidate ends tried for a bad frame's true length (module docstring)


@dataclass(frozen=True, slots=True)
class FrameKey:
    """What one file's frames are made and checked with: their marker, and the crc32 their
    checksum starts from (module docstring)."""

    marker: bytes
    seed: int


VERSION_1_KEY = FrameKey(FRAME_MARKER, 0)


@dataclass(frozen=True, slots=True)
class Header:
    """What a log's header says: its version, its salt (b"" in version 1) and its size."""

    version: int
    salt: bytes
    size: int

    @property
    def key(self) -> FrameKey:
        """What every frame of this file is checked with."""
        return frame_key(self.salt) if self.version > 1 else VERSION_1_KEY


def new_salt() -> bytes:
    """A fresh salt, for each new file."""
    return os.urandom(SALT_SIZE)


def frame_key(salt: bytes) -> FrameKey:
    """A version-2 file's marker and checksum seed, from its salt."""
    assert len(salt) == SALT_SIZE, salt
    return FrameKey(b"\xc1" + salt[:3], zlib.crc32(salt))


def header(salt: bytes, version: int = VERSION) -> bytes:
    """The 28 bytes a log of `version` (2 or later) with `salt` starts with."""
    assert len(salt) == SALT_SIZE and version > 1, (salt, version)
    prefix = MAGIC + struct.pack(">I", version)
    prefix += struct.pack(">I", zlib.crc32(prefix)) + salt
    return prefix + struct.pack(">I", zlib.crc32(prefix))


def frame(payload: bytes, key: FrameKey) -> bytes:
    """One record's frame in the file whose frames are made with `key`: marker, checksum,
    length, payload."""
    return frames([payload], key)


def frames(payloads: list[bytes], key: FrameKey) -> bytes:
    """The frames of `payloads`, one after another (`frame` for each), as one buffer."""
    return b"".join(frame_parts(payloads, key))


def frame_parts(payloads: Sequence[bytes | list[bytes]], key: FrameKey) -> list[bytes]:
    """The frames of `payloads` as their parts, each frame's head then its payload, in one
    loop: a Ready's records are framed here on every append, and written as they are
    (`write_parts`), with no joined copy. A payload given as parts (a snapshot record's head
    and state, `encode_records_parted`) is framed as their concatenation, never made."""
    marker, seed = key.marker, key.seed
    crc32, pack_length, pack_frame = zlib.crc32, _LENGTH.pack, _FRAME.pack
    parts: list[bytes] = []
    for payload in payloads:
        if isinstance(payload, list):
            parts.extend(_parted_frame(payload, marker, seed))
            continue
        length = len(payload)
        assert 0 < length <= RECORD_BYTES_MAX, f"record of {length} bytes"
        parts.append(pack_frame(marker, crc32(payload, crc32(pack_length(length), seed)),
                                length))
        parts.append(payload)
    return parts


def _parted_frame(payload: Sequence[bytes], marker: bytes, seed: int) -> list[bytes]:
    length = sum(map(len, payload))
    assert 0 < length <= RECORD_BYTES_MAX, f"record of {length} bytes"
    checksum = zlib.crc32(_LENGTH.pack(length), seed)
    for part in payload:
        checksum = zlib.crc32(part, checksum)
    return [_FRAME.pack(marker, checksum, length), *payload]


def read_header(data: bytes, path: pathlib.Path) -> Header:
    """The header of a log, refusing one that is damaged or of a version this build does not
    read."""
    if len(data) < PREFIX_SIZE:
        raise LogCorrupt(path, 0, f"the file is {len(data)} bytes, shorter than any header "
                                  f"({PREFIX_SIZE} bytes or more)")
    magic, version, checksum = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise LogCorrupt(path, 0, f"it does not start with {MAGIC!r} (found {magic!r}): not a "
                                  "Cellar record log, or its header is damaged")
    if zlib.crc32(data[:PREFIX_SIZE - 4]) != checksum:
        raise LogCorrupt(path, 0, "the header's checksum does not match")
    if version not in VERSIONS:
        raise LogVersionUnsupported(path, version, VERSIONS)
    if version == 1:
        return Header(1, b"", PREFIX_SIZE)
    if len(data) < HEADER_SIZE:
        raise LogCorrupt(path, 0, f"the file is {len(data)} bytes, shorter than its "
                                  f"{HEADER_SIZE}-byte header")
    salt, checksum = _SALTED.unpack_from(data, PREFIX_SIZE)
    if zlib.crc32(data[:HEADER_SIZE - 4]) != checksum:
        raise LogCorrupt(path, 0, "the header's checksum (over its salt) does not match")
    return Header(version, salt, HEADER_SIZE)


@dataclass(frozen=True, slots=True)
class Scan:
    """The valid frames of a log, and the torn tail after them (empty when the log is clean)."""

    header: Header
    payloads: list[tuple[int, bytes]]  # (offset of the frame, payload)
    end: int  # where the valid frames end: the file's size, or the torn tail's offset
    torn: str  # why the bytes from `end` on are unusable; "" when there are none (or zeros)
    zeroed_bytes: int = 0  # zeros from `end` to the end of the file: space written ahead


def scan(data: bytes, path: pathlib.Path) -> Scan:
    """Read every frame after the header; a torn tail is returned, corruption raised."""
    found = read_header(data, path)
    key = found.key
    marker_wanted, seed = key.marker, key.seed
    payloads: list[tuple[int, bytes]] = []
    view, size, offset = memoryview(data), len(data), found.size
    while offset < size:
        # The common case inline: this runs once per record at every restart.
        if size - offset >= FRAME_OVERHEAD:
            marker, checksum, length = _FRAME.unpack_from(data, offset)
            end = offset + FRAME_OVERHEAD + length
            if marker == marker_wanted and 0 < length <= RECORD_BYTES_MAX and end <= size \
                    and zlib.crc32(view[offset + 8:end], seed) == checksum:
                payloads.append((offset, data[offset + FRAME_OVERHEAD:end]))
                offset = end
                continue
        if data.count(0, offset) == size - offset:  # space written ahead of the records
            return Scan(found, payloads, offset, "", size - offset)
        problem = frame_problem(data, offset, path, key)
        assert problem, f"{path}: the frame at {offset} is valid after all"
        check_torn(data, offset, problem, path, found)
        return Scan(found, payloads, offset, problem)
    return Scan(found, payloads, offset, "")


def check_torn(data: bytes, offset: int, problem: str, path: pathlib.Path,
               found: Header) -> None:
    """Raise LogCorrupt unless the bad frame at `offset` can be a write cut short (the module
    docstring's rules for `found.version`)."""
    key = found.key
    declared_end = _declared_end(data, offset) if found.version == 1 else None
    later = next_valid_frame(data, offset + 1 if declared_end is None else declared_end, path,
                             key)
    if later is not None:
        raise LogCorrupt(path, offset, f"{problem}, yet a valid record follows at offset "
                                       f"{later}, so this is damage inside the log, not a "
                                       "write cut short by a crash")
    if len(data) - offset < FRAME_OVERHEAD:
        return
    # Every end a whole frame can have: at a valid frame inside the declared extent (version 1
    # only: version 2 has none after `offset`), or at the end of the file.
    true_end = whole_frame_end(data, offset, len(data), path, key)
    if true_end is not None:
        raise LogCorrupt(path, offset, f"{problem}, yet with a length of "
                                       f"{true_end - offset - FRAME_OVERHEAD} bytes it is a whole "
                                       f"record ending at offset {true_end}: its marker or "
                                       "length is damaged, this is not a write cut short by a "
                                       "crash")


def _declared_end(data: bytes, offset: int) -> int | None:
    """Where the frame at `offset` says it ends, when its marker and a possible length are
    there (the end may lie beyond the data); None otherwise."""
    if len(data) - offset < FRAME_OVERHEAD:
        return None
    marker, _, length = _FRAME.unpack_from(data, offset)
    if marker != FRAME_MARKER or not 0 < length <= RECORD_BYTES_MAX:
        return None
    end: int = offset + FRAME_OVERHEAD + length
    return end


def whole_frame_end(data: bytes, offset: int, end: int, path: pathlib.Path,
                    key: FrameKey) -> int | None:
    """An end in (payload start, `end`], where a valid frame starts or the data ends, at which
    the frame at `offset` is valid with the length that ends it there (whatever its marker and
    length say); None if there is none. Raises LogCorrupt past DAMAGE_ENDS_MAX candidates."""
    _, checksum, _ = _FRAME.unpack_from(data, offset)
    start = offset + FRAME_OVERHEAD
    view = memoryview(data)
    payload_crc, covered = 0, start  # crc32 of data[start:covered]
    candidate = next_valid_frame(data, start + 1, path, key)
    for _ in range(DAMAGE_ENDS_MAX):
        if candidate is None or candidate >= end:
            candidate = end if end == len(data) else None
        if candidate is None or candidate <= start:
            return None
        payload_crc = zlib.crc32(view[covered:candidate], payload_crc)
        covered = candidate
        length = candidate - start
        if length <= RECORD_BYTES_MAX and crc32_combine(
                zlib.crc32(_LENGTH.pack(length), key.seed), payload_crc, length) == checksum:
            return candidate
        if candidate == end:
            return None
        candidate = next_valid_frame(data, candidate + 1, path, key)
    raise LogCorrupt(path, offset, f"a bad frame holding more than {DAMAGE_ENDS_MAX} valid-looking "
                                   "frames: whether it is a write cut short or a damaged length "
                                   "cannot be told")


def frame_problem(data: bytes, offset: int, path: pathlib.Path, key: FrameKey) -> str:
    """Why the frame at `offset` is not valid, or "" when it is; an impossible length (beyond
    the record cap) is corruption wherever it is found, so it raises at once."""
    available = len(data) - offset
    if available < FRAME_OVERHEAD:
        return f"a frame header cut short ({available} of {FRAME_OVERHEAD} bytes)"
    marker, checksum, length = _FRAME.unpack_from(data, offset)
    if marker != key.marker:
        return f"no frame marker (found {marker!r})"
    if length > RECORD_BYTES_MAX:
        raise LogCorrupt(path, offset, f"a record length of {length} bytes, beyond the cap "
                                       f"of {RECORD_BYTES_MAX}")
    if length == 0:
        return "an empty frame"
    if available - FRAME_OVERHEAD < length:
        return (f"a record of {length} bytes cut short after "
                f"{available - FRAME_OVERHEAD} bytes")
    if zlib.crc32(memoryview(data)[offset + 8:offset + FRAME_OVERHEAD + length], key.seed) \
            != checksum:
        return "the record's checksum does not match"
    return ""


def next_valid_frame(data: bytes, start: int, path: pathlib.Path,
                     key: FrameKey) -> int | None:
    """The offset of the first valid frame at or after `start`, if there is one."""
    position = data.find(key.marker, start)
    while position != -1:
        try:
            if not frame_problem(data, position, path, key):
                return position
        except LogCorrupt:
            pass  # an impossible length: not a frame
        position = data.find(key.marker, position + 1)
    return None
