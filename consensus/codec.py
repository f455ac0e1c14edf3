"""The wire and disk encodings of the consensus package, and the only msgpack user in it.

Every encoding is a msgpack array whose first element is a small integer tag, packed with
`use_bin_type=True` and unpacked with `raw=False`, `strict_map_key=True` and size limits, then
validated field by field (`consensus.validation`) before a typed object is built. A decoder
either returns a fully checked object or raises `InvalidMessage` with the reason.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from consensus.codec_compiled import (
    FieldPlan,
    TaggedDecoder,
    TaggedEncoder,
    compile_decoder,
    compile_encoder,
)
from consensus.envelope import (
    BODY_BYTES_MAX,
    PRINCIPAL_NAME_LENGTH_MAX,
    SESSION_LENGTH_MAX,
    Envelope,
    Principal,
    Role,
)
from consensus.errors import InvalidMessage
from consensus.messages import MESSAGE_TYPES, Batch, Command, Message
from consensus.records import RECORD_TYPES, Record, SnapshotRecord
from consensus.slot_builder import slot_builder
from consensus.validation import (
    INT64_MAX,
    UINT64_MAX,
    expect_bool,
    expect_bytes,
    expect_choice,
    expect_fields,
    expect_int,
    expect_list,
    expect_str,
)

ENVELOPE_TAG = 1
ENVELOPE_BYTES_MAX = BODY_BYTES_MAX + 4096
_ROLES = tuple(role.value for role in Role)
_ROLE_OF = {role.value: role for role in Role}  # one dict lookup per envelope, not an enum call


# Idle packers: msgpack.packb builds (and frees) a Packer with its buffer on every call, half
# the cost of a small pack. A caller takes one for itself (list.pop and append are atomic, so
# the storage's worker thread and the loop never share one); there are never more than the
# threads that ever packed at once.
_idle_packers: list[msgpack.Packer] = []


def pack(value: Any) -> bytes:
    try:
        packer = _idle_packers.pop()
    except IndexError:
        packer = msgpack.Packer(use_bin_type=True)
    try:
        packed: bytes = packer.pack(value)  # on an error it resets, so the next is clean
    finally:
        _idle_packers.append(packer)
    return packed


def unpack(data: bytes, *, bytes_max: int, what: str) -> Any:
    """Unpack one msgpack value, refusing oversized input and trailing garbage."""
    if len(data) > bytes_max:
        raise InvalidMessage(f"{what}: {len(data)} bytes, more than {bytes_max}")
    try:
        # msgpack's defaults (msgpack >= 1.1) are the options wanted: str as str, lists, map keys
        # str or bytes only, and no length inside over len(data), already at most bytes_max.
        # Passing them by name cost a third of a small unpack, and every frame, answer and
        # command is unpacked. Ext types are refused.
        return msgpack.unpackb(data, max_ext_len=0)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as error:
        raise InvalidMessage(f"{what}: not valid msgpack ({error})") from error


def encode_envelope(envelope: Envelope) -> bytes:
    return encode_envelope_of(envelope.principal, envelope.session, envelope.sequence,
                              envelope.now_ms, envelope.body)


def encode_envelope_of(principal: Principal, session: str, sequence: int, now_ms: int,
                       body: bytes) -> bytes:
    """encode_envelope(Envelope(...)) without building the Envelope (2 us a command)."""
    return pack([ENVELOPE_TAG, _ROLE_VALUES[principal.role], principal.name, session, sequence,
                 now_ms, body])


_ROLE_VALUES = {role: role.value for role in Role}  # a dict's lookup: the enum's costs 2 calls


def decode_envelope(data: bytes) -> Envelope:
    return _new_envelope(*decode_envelope_fields(data))


# principal, session, sequence, now_ms, body
EnvelopeFields = tuple[Principal, str, int, int, bytes]


def decode_envelope_fields(data: bytes) -> EnvelopeFields:
    """decode_envelope's fields, checked alike, without building the Envelope: for a state
    machine that only reads them (the key-value apply, on every replica for every command)."""
    raw = unpack(data, bytes_max=ENVELOPE_BYTES_MAX, what="envelope")
    if type(raw) is not list or len(raw) != 7:
        expect_fields(expect_list(raw, "envelope", length_max=7), "envelope", 7)  # raises
    tag, role, name, session, sequence, now_ms, body = raw
    if type(tag) is not int or tag != ENVELOPE_TAG:
        raise InvalidMessage(f"envelope.tag: expected {ENVELOPE_TAG}, got {tag!r}")
    principal = _principal(role, name)
    # Every replica decodes every command: the valid case is checked inline, and the expect_*
    # functions name what is wrong otherwise.
    if type(session) is not str or len(session) > SESSION_LENGTH_MAX:
        expect_str(session, "envelope.session", length_max=SESSION_LENGTH_MAX, allow_empty=True)
    if type(sequence) is not int or not 0 <= sequence <= INT64_MAX:
        expect_int(sequence, "envelope.sequence")
    if type(now_ms) is not int or not 0 <= now_ms <= INT64_MAX:
        expect_int(now_ms, "envelope.now_ms")
    if type(body) is not bytes or len(body) > BODY_BYTES_MAX:
        expect_bytes(body, "envelope.body", length_max=BODY_BYTES_MAX)
    return principal, session, sequence, now_ms, body


# Every replica decodes every command's envelope, from a handful of principals: each is built
# and checked once, then found by (role, name) (a frozen dataclass costs a microsecond to
# build). The cache forgets everything when full, so it stays bounded whoever connects.
PRINCIPALS_CACHED_MAX = 4096
_principals: dict[tuple[str, str], Principal] = {}


def _principal(role: object, name: object) -> Principal:
    if type(role) is str and type(name) is str:
        found = _principals.get((role, name))
        if found is not None:
            return found
    known = _ROLE_OF.get(role) if type(role) is str else None
    if known is None:
        expect_choice(role, "envelope.role", _ROLES)  # raises, naming what was wrong
    assert known is not None and type(role) is str
    principal = Principal(
        known, expect_str(name, "envelope.principal", length_max=PRINCIPAL_NAME_LENGTH_MAX))
    if len(_principals) >= PRINCIPALS_CACHED_MAX:
        _principals.clear()
    _principals[(role, principal.name)] = principal
    return principal


# Built once per command on every replica: through its slots, a third of the constructor's time.
_new_envelope: Callable[[Principal, str, int, int, bytes], Envelope] = slot_builder(Envelope)


# --- Messages and records ----------------------------------------------------------------------
# Each message or record is encoded as [TAG, field, field, ...] in declaration order; nested
# dataclasses (Command, CEntry, ...) as arrays of their fields. The per-class encoders and
# decoders are built once from the type hints, so adding a message needs no codec code.

MESSAGE_BYTES_MAX = 32 << 20
RECORD_BYTES_MAX = 1 << 30
ITEMS_MAX = 1 << 20
BATCH_COMMANDS_MAX = 1 << 16
# Integer fields that may hold NO_INDEX or NO_CL (-1); every other integer is non-negative.
_MAY_BE_NEGATIVE = frozenset({"max_index", "c_max_index", "values", "o_values", "value",
                              "executed_upto", "ordered"})

_Encoder = Callable[[Any], Any]
_Decoder = Callable[[Any, str], Any]


def _codec_for(hint: Any, name: str) -> tuple[_Encoder, _Decoder]:
    low = -1 if name in _MAY_BE_NEGATIVE else 0
    if hint == Batch:
        return _encode_batch, _decode_batch
    if hint is int:
        return _identity, _int_decoder(low)
    if hint is bool:
        return _identity, expect_bool
    if hint is bytes:
        return _identity, _decode_bytes
    origin = typing.get_origin(hint)
    arguments = typing.get_args(hint)
    if origin in (types.UnionType, typing.Union) and type(None) in arguments:
        inner = next(argument for argument in arguments if argument is not type(None))
        encode_inner, decode_inner = _codec_for(inner, name)
        return (_identity if encode_inner is _identity  # None or the value, as it is
                else lambda value: None if value is None else encode_inner(value),
                lambda raw, where: None if raw is None else decode_inner(raw, where))
    if origin is tuple and len(arguments) == 2 and arguments[1] is Ellipsis:
        encode_item, decode_item = _codec_for(arguments[0], name)
        return (list if encode_item is _identity  # the same items, as an array
                else lambda value: [encode_item(item) for item in value],
                lambda raw, where: tuple([
                    decode_item(item, where)
                    for item in expect_list(raw, where, length_max=ITEMS_MAX)]))
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _dataclass_codec(hint)
    raise TypeError(f"no codec for {hint!r} ({name})")


def _encode_batch(batch: Batch) -> list[Any]:
    """A batch as one flat array [origin, tag, payload, origin, tag, payload, ...]."""
    flat: list[Any] = []
    for command in batch:
        flat += (command.origin, command.tag, command.payload)
    return flat


def _decode_batch(raw: Any, where: str) -> Batch:
    flat = expect_list(raw, where, length_max=3 * BATCH_COMMANDS_MAX)
    if len(flat) % 3:
        raise InvalidMessage(f"{where}: {len(flat)} items is not a whole number of commands")
    origins, tags, payloads = flat[0::3], flat[1::3], flat[2::3]
    # The types of all items at once, and the commands built by tuple.__new__ (what
    # Command(...) does, less its Python-level __new__): no frame per command.
    if not (set(map(type, origins)) <= _INT_ONLY and set(map(type, tags)) <= _INT_ONLY
            and set(map(type, payloads)) <= _BYTES_ONLY):
        raise InvalidMessage(f"{where}: commands must be (int origin, int tag, bytes payload)")
    if origins and (min(origins) < 0 or min(tags) < 0 or max(tags) > UINT64_MAX
                    or max(map(len, payloads)) > ENVELOPE_BYTES_MAX):
        raise InvalidMessage(f"{where}: a command's origin, tag or payload size is out of range")
    commands = zip(origins, tags, payloads, strict=True)  # equal lengths: a multiple of 3
    return tuple(map(tuple.__new__, itertools.repeat(Command), commands))


_INT_ONLY = frozenset({int})
_BYTES_ONLY = frozenset({bytes})


def _identity(value: Any) -> Any:
    return value


# Field decoders check the common, valid case inline and leave the naming of a fault to the
# `expect_*` function (every field of every message from a peer passes through one).

def _int_decoder(low: int) -> _Decoder:
    def decode(raw: Any, where: str) -> int:
        if type(raw) is int and low <= raw <= INT64_MAX:
            return raw
        return expect_int(raw, where, low=low)  # raises, naming what was wrong

    return decode


def _decode_bytes(raw: Any, where: str) -> bytes:
    if type(raw) is bytes and len(raw) <= RECORD_BYTES_MAX:
        return raw
    return expect_bytes(raw, where, length_max=RECORD_BYTES_MAX)


def _dataclass_codec(cls: type) -> tuple[_Encoder, _Decoder]:
    hints = typing.get_type_hints(cls)
    names = [item.name for item in dataclasses.fields(cls)]
    codecs = [_codec_for(hints[name], name) for name in names]
    encoders = [encode for encode, _ in codecs]
    decoders = [decode for _, decode in codecs]
    label = cls.__name__

    # Every message and record on every visit passes here: the fields are read in one call,
    # and only those whose encoding differs from their value (a batch, a tuple of nested
    # dataclasses, ...) go through their encoder.
    converted = [(position, encoder) for position, encoder in enumerate(encoders)
                 if encoder is not _identity]
    if len(names) < 2:  # attrgetter hands back a tuple only for two names or more
        def encode(value: Any) -> list[Any]:
            return [encoder(getattr(value, name)) for encoder, name in zip(encoders, names,
                                                                            strict=True)]
    else:
        read_fields = operator.attrgetter(*names)

        def encode(value: Any) -> list[Any]:
            fields = list(read_fields(value))
            for position, encoder in converted:
                fields[position] = encoder(fields[position])
            return fields

    places = [f"{label}.{name}" for name in names]  # where a fault is named, made once
    count = len(names)

    def decode(raw: Any, where: str) -> Any:
        if type(raw) is not list or len(raw) != count:
            expect_fields(expect_list(raw, where, length_max=count), where, count)  # raises
        return cls(*[decoder(item, place) for decoder, place, item in
                     zip(decoders, places, raw, strict=True)])

    return encode, decode


def _registry(classes: tuple[Any, ...]) -> dict[int, tuple[type, _Encoder, _Decoder]]:
    table: dict[int, tuple[type, _Encoder, _Decoder]] = {}
    for cls in classes:
        tag: int = cls.TAG
        assert tag not in table, f"duplicate tag {tag} for {cls.__name__}"
        table[tag] = (cls, *_dataclass_codec(cls))
    return table


def _field_plans(cls: type) -> list[FieldPlan]:
    """What `consensus.codec_compiled` makes `cls`'s straight-line codec from: the generic
    codec's own field encoders and decoders, and the checks it inlines for simple fields."""
    hints = typing.get_type_hints(cls)
    plans = []
    for item in dataclasses.fields(cls):
        hint = hints[item.name]
        encoder, decoder = _codec_for(hint, item.name)
        kind, high = "call", INT64_MAX
        if hint is int or hint is bool:
            kind = hint.__name__
        elif hint is bytes:
            kind, high = "bytes", RECORD_BYTES_MAX
        elif typing.get_origin(hint) is tuple and typing.get_args(hint) == (int, Ellipsis):
            kind = "ints"
        plans.append(FieldPlan(item.name, kind, -1 if item.name in _MAY_BE_NEGATIVE else 0,
                               high, ITEMS_MAX, None if encoder is _identity else encoder,
                               decoder))
    return plans


def _compiled(table: dict[int, tuple[type, _Encoder, _Decoder]]
              ) -> tuple[dict[type, TaggedEncoder], dict[int, TaggedDecoder]]:
    """The straight-line encoder per class and decoder per tag of `table`'s classes."""
    encoders: dict[type, TaggedEncoder] = {}
    decoders: dict[int, TaggedDecoder] = {}
    for tag, (cls, _, _) in table.items():
        plans = _field_plans(cls)
        encoders[cls] = compile_encoder(cls, tag, plans)
        decoders[tag] = compile_decoder(cls, plans)
    return encoders, decoders


_MESSAGES = _registry(MESSAGE_TYPES)
_RECORDS = _registry(RECORD_TYPES)
# Encoders: [TAG, field, ...] per class, as `[tag, *encode(value)]` from the tables above.
# Decoders: [TAG, field, ...] -> the object, or None for the generic decoder to name the fault.
_MESSAGE_ENCODERS, _MESSAGE_DECODERS = _compiled(_MESSAGES)
_RECORD_ENCODERS, _RECORD_DECODERS = _compiled(_RECORDS)


def encode_message(message: Message) -> bytes:
    return pack(_MESSAGE_ENCODERS[type(message)](message))


def encode_messages(messages: list[Message]) -> bytes:
    """Several messages to one peer in one frame (message merging)."""
    encoders = _MESSAGE_ENCODERS
    return pack([encoders[type(message)](message) for message in messages])


def frame_of_encoded(encoded: list[bytes]) -> bytes:
    """The frame `encode_messages` makes, from messages each already `encode_message`d: a
    msgpack array is its header and its items' encodings, one after the other."""
    try:  # as `pack`: a storage thread may take the last idle packer between a test and a pop
        packer = _idle_packers.pop()
    except IndexError:
        packer = msgpack.Packer(use_bin_type=True)
    try:
        header: bytes = packer.pack_array_header(len(encoded))
    finally:
        _idle_packers.append(packer)
    return header + b"".join(encoded)


def decode_message(data: bytes) -> Message:
    raw = unpack(data, bytes_max=MESSAGE_BYTES_MAX, what="message")
    return _decode_tagged(raw, _MESSAGES, _MESSAGE_DECODERS,  # type: ignore[no-any-return]
                          "message")


def decode_messages(data: bytes) -> list[Message]:
    raw = unpack(data, bytes_max=MESSAGE_BYTES_MAX, what="frame")
    if type(raw) is not list or len(raw) > ITEMS_MAX:
        expect_list(raw, "frame", length_max=ITEMS_MAX)  # raises, naming what was wrong
    # Every message from a peer comes here: a loop, not a comprehension around a call.
    messages: list[Message] = []
    compiled = _MESSAGE_DECODERS
    for item in raw:
        if type(item) is list and item and type(item[0]) is int and \
                (decode := compiled.get(item[0])) is not None and \
                (message := decode(item)) is not None:
            messages.append(message)
        else:
            messages.append(_decode_tagged(item, _MESSAGES, compiled, "message"))
    return messages


def encode_record(record: Record) -> bytes:
    return pack(_RECORD_ENCODERS[type(record)](record))


def encode_records(records: Sequence[Record]) -> list[bytes]:
    """`[encode_record(record) for record in records]`, with one packer for them all."""
    encoders = _RECORD_ENCODERS
    try:  # not `pop() if _idle_packers`: the loop may take the last one between the two
        packer = _idle_packers.pop()
    except IndexError:
        packer = msgpack.Packer(use_bin_type=True)
    try:
        return [packer.pack(encoders[type(record)](record)) for record in records]
    finally:
        _idle_packers.append(packer)


def encode_records_parted(records: Sequence[Record]) -> list[bytes | list[bytes]]:
    """`encode_records(records)`, but a snapshot record's encoding as two parts whose
    concatenation it is: its head, and its state, the very bytes object (the state, its last
    field, is not copied into an encoding: it may be the whole store, hundreds of MB)."""
    plain = iter(encode_records([record for record in records
                                 if type(record) is not SnapshotRecord]))
    return [_snapshot_record_parts(record) if type(record) is SnapshotRecord else next(plain)
            for record in records]


_EMPTY_BIN = b"\xc4\x00"  # msgpack's encoding of b""


def _snapshot_record_parts(record: SnapshotRecord) -> list[bytes]:
    head = encode_record(dataclasses.replace(record, state=b""))
    assert head.endswith(_EMPTY_BIN), "a snapshot record's state is its last field"
    return [head[:-len(_EMPTY_BIN)] + _bin_header(len(record.state)), record.state]


def _bin_header(length: int) -> bytes:
    """msgpack's head of a bin of `length` bytes (bin 8, 16 or 32, as its packer picks)."""
    if length < 1 << 8:
        return bytes((0xC4, length))
    if length < 1 << 16:
        return b"\xc5" + length.to_bytes(2, "big")
    return b"\xc6" + length.to_bytes(4, "big")


def decode_record(data: bytes) -> Record:
    raw = unpack(data, bytes_max=RECORD_BYTES_MAX, what="record")
    return _decode_tagged(raw, _RECORDS, _RECORD_DECODERS,  # type: ignore[no-any-return]
                          "record")


def _decode_tagged(raw: Any, table: dict[int, tuple[type, _Encoder, _Decoder]],
                   compiled: dict[int, TaggedDecoder], what: str) -> Any:
    # The valid case checked inline (every message of every frame from a peer comes here);
    # the `expect_*` calls below only name a fault.
    if type(raw) is list and 0 < len(raw) <= ITEMS_MAX and type(raw[0]) is int and \
            (decode_inline := compiled.get(raw[0])) is not None and \
            (decoded := decode_inline(raw)) is not None:
        return decoded
    items = expect_list(raw, what, length_max=ITEMS_MAX)
    if not items:
        raise InvalidMessage(f"{what}: empty")
    tag = expect_int(items[0], f"{what}.tag")
    if tag not in table:
        raise InvalidMessage(f"{what}.tag: unknown tag {tag}")
    cls, _, decode = table[tag]
    return decode(items[1:], cls.__name__)
