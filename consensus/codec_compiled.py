"""Straight-line encoders and decoders for the codec's top-level messages and records.

Every message from a peer and every record a replica writes passes through the codec, several
per command on every replica. The generic per-class codec (`consensus.codec`) calls a function
per field, builds the field list twice on the way out and once more on the way in, and builds
the object through the frozen dataclass's constructor (`object.__setattr__` per field). Here
each class gets, once, two functions made from its field list (as `dataclasses` makes
`__init__`, and `consensus.slot_builder` its builders):

- an encoder returning `[TAG, field, field, ...]`, the generic encoder's list with its tag,
  so the bytes packed are the same;
- a decoder of a tagged array (`[TAG, field, ...]`, known to be a list) that checks integer,
  boolean, bytes and integer-tuple fields inline, calls the generic decoder for every other
  field (batches, nested dataclasses, optional values), and builds the object through its
  slots. It returns None when an inline check fails: the caller then runs the generic decoder,
  which names the fault (the first in field order, as before). When every inline check passes,
  the other fields are decoded in field order, so the first of those to fail is the first
  fault of all, raised by the same decoder with the same text.

So a decoder here accepts exactly what the generic one does and builds an equal object
(`tests/consensus/test_codec_compiled.py` pins both, and the encoders' output, to the generic
codec's on random and mutated input).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from consensus.slot_builder import slot_setters


@dataclass(frozen=True, slots=True)
class FieldPlan:
    """How one field is encoded and checked. `kind`: "int" (an integer in [low, high]),
    "bool", "bytes" (at most `high` long), "ints" (an array of at most `items_max` integers in
    [low, high], decoded as a tuple) or "call" (`decoder(raw, place)`, which raises on a
    fault). `encoder`: None when the value is its own encoding."""

    name: str
    kind: str
    low: int
    high: int
    items_max: int
    encoder: Callable[[Any], Any] | None
    decoder: Callable[[Any, str], Any]


TaggedEncoder = Callable[[Any], list[Any]]
TaggedDecoder = Callable[[list[Any]], Any]


def compile_encoder(cls: type, tag: int, plans: list[FieldPlan]) -> TaggedEncoder:
    """`value -> [tag, encoded field, ...]` for instances of `cls`."""
    namespace: dict[str, Any] = {}
    items = [str(int(tag))]
    for position, plan in enumerate(plans):
        read = f"value.{_identifier(plan.name)}"
        if plan.encoder is None:
            items.append(read)
        else:
            namespace[f"_encode_{position}"] = plan.encoder
            items.append(f"_encode_{position}({read})")
    source = f"def encode(value):\n    return [{', '.join(items)}]\n"
    encoder: TaggedEncoder = _compiled(source, namespace, "encode", f"encoder({cls.__name__})")
    return encoder


def compile_decoder(cls: type, plans: list[FieldPlan]) -> TaggedDecoder:
    """`[tag, raw field, ...] -> instance of cls`, or None where an inline check fails."""
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls, "_INT_ONLY": {int}}
    variables = [f"f{position}" for position in range(len(plans))]
    checks: list[str] = []
    conversions: list[str] = []
    for position, (plan, variable) in enumerate(zip(plans, variables, strict=True)):
        check, conversion = _field_code(position, plan, variable, namespace,
                                        f"{cls.__name__}.{plan.name}")
        checks += [check] if check else []
        conversions += [conversion] if conversion else []
    stores = []
    for position, ((_, setter), variable) in enumerate(zip(slot_setters(cls), variables,
                                                           strict=True)):
        namespace[f"_set_{position}"] = setter
        stores.append(f"    _set_{position}(built, {variable})\n")
    lines = [
        "def decode(raw):\n",
        f"    if len(raw) != {len(plans) + 1}:\n        return None\n",
        f"    _, {''.join(variable + ', ' for variable in variables)}= raw\n",
        f"    if not ({' and '.join(checks) or 'True'}):\n        return None\n",
        *(f"    {conversion}\n" for conversion in conversions),
        "    built = _new(_cls)\n",
        *stores,
        "    return built\n",
    ]
    decoder: TaggedDecoder = _compiled("".join(lines), namespace, "decode",
                                       f"decoder({cls.__name__})")
    return decoder


def _field_code(position: int, plan: FieldPlan, variable: str, namespace: dict[str, Any],
                place: str) -> tuple[str, str]:
    """The inline check of one field (an expression; "" when it has none) and the statement
    that converts or decodes it afterwards ("" when there is none)."""
    low, high = int(plan.low), int(plan.high)
    if plan.kind == "int":
        return f"type({variable}) is int and {low} <= {variable} <= {high}", ""
    if plan.kind == "bool":
        return f"type({variable}) is bool", ""
    if plan.kind == "bytes":
        return f"type({variable}) is bytes and len({variable}) <= {high}", ""
    if plan.kind == "ints":
        # set(map(type, ...)) and min/max run in C: no frame per item.
        return (f"type({variable}) is list and len({variable}) <= {int(plan.items_max)} and "
                f"set(map(type, {variable})) <= _INT_ONLY and (not {variable} or "
                f"({low} <= min({variable}) and max({variable}) <= {high}))",
                f"{variable} = tuple({variable})")
    assert plan.kind == "call", plan.kind
    namespace[f"_decode_{position}"] = plan.decoder
    return "", f"{variable} = _decode_{position}({variable}, {place!r})"


def _identifier(name: str) -> str:
    assert name.isidentifier(), name
    return name


def _compiled(source: str, namespace: dict[str, Any], name: str, label: str) -> Any:
    exec(source, namespace)  # noqa: S102 - made from field names, as dataclasses makes __init__
    function = namespace[name]
    function.__qualname__ = label
    return function
