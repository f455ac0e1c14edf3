"""Key-value histories as Porcupine's tests keep them: one EDN map per line.

    {:process 0, :type :invoke, :f :append, :key "4", :value "x 0 1 y"}
    {:process 0, :type :ok, :f :get, :key "5", :value ""}

Functions get, put and append on string values; every key starts as the empty string, `get`
returns the whole value, `append` concatenates. Blank lines and `;` comment lines are skipped.
"""

from __future__ import annotations

from jepsen.formats.builder import EventsBuilder
from jepsen.formats.common import add_operation_map
from jepsen.formats.edn import read_one
from jepsen.history import History, Value

NAME = "porcupine-kv"
INITIAL: Value = ""


def parse(text: str, source: str) -> tuple[History, Value]:
    builder = EventsBuilder(source)
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith(";"):
            continue
        add_operation_map(builder, read_one(stripped, source, line=number), number)
    return builder.build(), INITIAL
