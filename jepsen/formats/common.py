"""What the EDN-based readers share: turning one operation map into an event."""

from __future__ import annotations

from jepsen.errors import HistoryFormatError
from jepsen.formats.builder import EventsBuilder
from jepsen.formats.edn import Keyword, Symbol, to_value
from jepsen.history import NEMESIS, EventType, Process

TYPES = {member.value: member for member in EventType}
PROCESS = Keyword("process")
TYPE = Keyword("type")
F = Keyword("f")
VALUE = Keyword("value")
KEY = Keyword("key")


def edn_text(form: object) -> str:
    if isinstance(form, Keyword | Symbol):
        return str(form)
    if isinstance(form, str):
        return repr(form)
    return repr(to_value(form))[:60]


def read_process(form: object, source: str, line: int) -> Process:
    """An integer client, or any keyword, symbol or string (the nemesis and its like)."""
    if isinstance(form, int) and not isinstance(form, bool):
        return form
    if isinstance(form, Keyword | Symbol):
        return form.name
    if isinstance(form, str):
        return form or NEMESIS
    raise HistoryFormatError(source, line, "a process that is an integer or a keyword",
                             found=edn_text(form))


def read_type(form: object, source: str, line: int) -> EventType:
    if isinstance(form, Keyword) and form.name in TYPES:
        return TYPES[form.name]
    raise HistoryFormatError(source, line, "a type of :invoke, :ok, :fail or :info",
                             found=edn_text(form))


def read_function(form: object, source: str, line: int) -> str:
    if isinstance(form, Keyword | Symbol) and form.name:
        return form.name
    if isinstance(form, str) and form:
        return form
    raise HistoryFormatError(source, line, "a function such as :read", found=edn_text(form))


def add_operation_map(builder: EventsBuilder, form: object, line: int) -> EventType:
    """One `{:process .. :type .. :f .. :value ..}` map (`:key` optional) as an event."""
    source = builder.source
    if not isinstance(form, dict):
        raise HistoryFormatError(source, line, "an operation map {:process .. :type .. :f ..}",
                                 found=edn_text(form))
    for field in (PROCESS, TYPE, F):
        if field not in form:
            raise HistoryFormatError(source, line, f"a {field} entry in the operation map")
    kind = read_type(form[TYPE], source, line)
    builder.add(line, read_process(form[PROCESS], source, line), kind,
                read_function(form[F], source, line), value=to_value(form.get(VALUE)),
                key=to_value(form.get(KEY)))
    return kind
