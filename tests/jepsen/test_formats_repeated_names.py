"""A malformed history file must be refused, never read silently.

A map that names the same key twice is not EDN (the Clojure reader refuses it: "Duplicate
key"), and a JSON object with a repeated name is ambiguous: the readers kept the last
entry and threw the other away, so a file could say two things and be checked as one of them.
"""

from __future__ import annotations

import pytest

from jepsen.errors import HistoryFormatError
from jepsen.formats import parse


def test_an_edn_operation_map_with_a_repeated_key_is_refused() -> None:
    text = ('{:process 0, :type :invoke, :f :put, :key "x", :value "a"}\n'
            '{:process 0, :type :ok, :f :put, :key "x", :value "a", :value "b"}\n')
    with pytest.raises(HistoryFormatError):
        parse(text, "h.edn", "porcupine-kv")


def test_a_knossos_map_with_a_repeated_key_is_refused() -> None:
    text = ("[{:process 0 :type :invoke :f :read :value nil}\n"
            " {:process 0 :type :ok :f :read :value 1 :value 2}]\n")
    with pytest.raises(HistoryFormatError):
        parse(text, "h.edn", "knossos")


def test_an_edn_map_whose_keys_python_calls_equal_is_not_collapsed() -> None:
    # 1 and true are different EDN keys, but a dict keyed by them keeps one: the value
    # {1 :a true :b} was read as [[1 "b"]], silently: it is refused, as a repeated key is.
    text = ("[{:process 0 :type :invoke :f :write :value {1 :a true :b}}\n"
            " {:process 0 :type :ok :f :write :value {1 :a true :b}}]\n")
    with pytest.raises(HistoryFormatError, match="a map without repeated keys"):
        parse(text, "h.edn", "knossos")


def test_a_json_event_with_a_repeated_field_is_refused() -> None:
    text = ('{"process": 0, "type": "invoke", "f": "read"}\n'
            '{"process": 0, "type": "ok", "f": "read", "value": 1, "value": 2}\n')
    with pytest.raises(HistoryFormatError):
        parse(text, "h.jsonl", "jsonl")
