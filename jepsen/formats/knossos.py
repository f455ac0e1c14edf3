"""Knossos histories: one EDN vector (or list) of operation maps.

    [{:process 0, :type :invoke, :f :cas, :value [2 3]}
     {:process 0, :type :ok, :f :cas, :value [2 3]}
     {:process :nemesis, :type :info, :f :start, :value nil}]

The register starts at 0. Knossos's own reading is kept: `:fail` operations did not happen;
`:info` operations, and invocations that never complete, may or may not have taken effect; a
read whose completed value is nil tells nothing about the state, so it is read as an `info`
read (it constrains nothing); a process that is not an integer (the nemesis) is no client.
Other keys of an operation map (`:time`, `:index`, `:error`) are ignored.
"""

from __future__ import annotations

from dataclasses import replace

from jepsen.formats.builder import EventsBuilder
from jepsen.formats.common import add_operation_map
from jepsen.formats.edn import Reader
from jepsen.history import EventType, History, Value

NAME = "knossos"
INITIAL: Value = 0
_READS = ("read", "get")


def parse(text: str, source: str) -> tuple[History, Value]:
    builder = EventsBuilder(source)
    for line, form in Reader(text, source).sequence_items():
        kind = add_operation_map(builder, form, line)
        event = builder.events[-1]
        if kind is EventType.OK and event.f in _READS and event.value is None:
            builder.events[-1] = replace(event, type=EventType.INFO)
    return builder.build(), INITIAL
