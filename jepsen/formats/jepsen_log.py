"""Jepsen's text logs, as the etcd tests wrote them (and Porcupine and Horn's checker read them).

    INFO  jepsen.util - 3	:invoke	:cas	[1 4]
    INFO  jepsen.util - 3	:fail	:cas	[1 4]
    INFO  jepsen.util - 7	:info	:write	:timed-out
    INFO  jepsen.util - :nemesis	:info	:start	nil

An operation line is a log prefix ending in `jepsen.util - `, then process, type, function and
value (EDN), separated by tabs or spaces. Other log lines are skipped; a `jepsen.util` line that
is no operation is an error. The register starts absent (initial value nil), so `:ok :read nil`
means the key did not exist. `:fail` operations did not take effect (a cas whose compare failed,
a read that timed out); `:info` ones may take effect at any time after their invocation, or
never.
"""

from __future__ import annotations

import re

from jepsen.errors import HistoryFormatError
from jepsen.formats.builder import EventsBuilder
from jepsen.formats.common import read_function, read_process, read_type
from jepsen.formats.edn import Keyword, read_one, to_value
from jepsen.history import History, Value

NAME = "jepsen-log"
INITIAL: Value = None
MARKER = re.compile(r"\bjepsen\.util\s+-\s")
_OPERATION = re.compile(r"(?P<process>\S+)\s+(?P<type>:\S+)\s+(?P<f>:\S+)\s+(?P<value>\S.*?)\s*")


def _add_line(builder: EventsBuilder, text: str, number: int) -> None:
    source = builder.source
    match = _OPERATION.fullmatch(text)
    if match is None:
        raise HistoryFormatError(source, number, "process, type, function and value after "
                                 "'jepsen.util - '", found=repr(text[:60]))
    process_form = read_one(match["process"], source, line=number)
    if not isinstance(process_form, int | Keyword):
        raise HistoryFormatError(source, number, "a process that is an integer or :nemesis",
                                 found=repr(match["process"]))
    process = read_process(process_form, source, number)
    kind = read_type(read_one(match["type"], source, line=number), source, number)
    f = read_function(read_one(match["f"], source, line=number), source, number)
    if isinstance(process, int):
        value = to_value(read_one(match["value"], source, line=number))
    else:  # the nemesis logs free text as often as EDN: keep what does not parse as text
        try:
            value = to_value(read_one(match["value"], source, line=number))
        except HistoryFormatError:
            value = match["value"]
    builder.add(number, process, kind, f, value=value)


def parse(text: str, source: str) -> tuple[History, Value]:
    builder = EventsBuilder(source)
    for number, line in enumerate(text.splitlines(), start=1):
        marker = MARKER.search(line)
        if marker is not None:
            _add_line(builder, line[marker.end():].strip(), number)
    if not builder.events and text.strip():
        raise HistoryFormatError(source, None, "lines of operations logged by jepsen.util")
    return builder.build(), INITIAL
