"""Writes a history as Jepsen EDN, so Knossos, Elle or Porcupine's tools can check it too.

    [{:index 0, :process 0, :type :invoke, :f :write, :value 3}
     {:index 1, :process 0, :type :ok, :f :write, :value 3}
     {:index 2, :process :nemesis, :type :info, :f :partition, :value "n1 | n2 n3"}]

One operation map per line inside one vector. Functions and types are keywords, non-integer
processes keywords too, values EDN (nil, booleans, numbers, strings, vectors); a per-key
operation carries `:key`, as in Porcupine's key-value logs. Knossos reads a read that returned
nil as "value unknown": a register that starts absent is better checked by Cellar itself.
"""

from __future__ import annotations

import math
import re

from jepsen.history import Event, History, Value

_KEYWORD = re.compile(r"[A-Za-z*+!_?<>=-][\w*+!_?<>=.:/-]*")


def keyword_or_string(name: str) -> str:
    return ":" + name if _KEYWORD.fullmatch(name) else edn_string(name)


def edn_string(text: str) -> str:
    escaped = (text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
               .replace("\t", "\\t").replace("\r", "\\r"))
    return f'"{escaped}"'


def edn_value(value: Value) -> str:
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"EDN has no literal for {value}")
        return repr(value)
    if isinstance(value, str):
        return edn_string(value)
    return "[" + " ".join(edn_value(item) for item in value) + "]"


def edn_event(event: Event) -> str:
    process = (str(event.process) if isinstance(event.process, int)
               else keyword_or_string(event.process))
    fields = [f":index {event.index}", f":process {process}", f":type :{event.type.value}",
              f":f {keyword_or_string(event.f)}"]
    if event.key is not None:
        fields.append(f":key {edn_value(event.key)}")
    fields.append(f":value {edn_value(event.value)}")
    return "{" + ", ".join(fields) + "}"


def dumps(history: History) -> str:
    if not history.events:
        return "[]\n"
    return "[" + "\n ".join(edn_event(event) for event in history.events) + "]\n"
