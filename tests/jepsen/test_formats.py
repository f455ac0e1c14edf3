"""History formats: the EDN reader, each format's reader (and its errors, which name the line),
detection, Cellar's JSON lines round trip and the Jepsen EDN writer."""

from __future__ import annotations

import pathlib

import pytest

from jepsen.errors import HistoryFormatError
from jepsen.formats import UNSET, load, parse, save
from jepsen.formats.detect import detect
from jepsen.formats.edn import Keyword, Reader, Symbol, Tagged, read_one, to_value
from jepsen.formats.edn_writer import dumps as edn_dumps
from jepsen.history import EventType, HistoryRecorder
from tests.jepsen.helpers import history

PUBLISHED = pathlib.Path(__file__).resolve().parent / "data" / "published"


def test_edn_reads_what_histories_use() -> None:
    form = read_one('{:process 3, :type :ok, :f :cas, :value [1 nil "a\\"b"], :x #{1 2}}', "t")
    assert form == {Keyword("process"): 3, Keyword("type"): Keyword("ok"),
                    Keyword("f"): Keyword("cas"), Keyword("value"): (1, None, 'a"b'),
                    Keyword("x"): frozenset({1, 2})}
    assert read_one("(1 -2 3N 4.5 true false \\a sym #_ skipped)", "t") == (
        1, -2, 3, 4.5, True, False, "a", Symbol("sym"))
    assert read_one('#inst "2024-01-01" ; a comment', "t") == Tagged("inst", "2024-01-01")
    assert to_value(read_one("[:timed-out {:a 1} #{2}]", "t")) == ("timed-out", (("a", 1),), (2,))


@pytest.mark.parametrize(("text", "line", "expected"), [
    ("[1 2", 1, "']' to close"),
    ("{:a 1\n :b}", 1, "even number"),
    ("[1\n2\n)]", 3, "']'"),
    ('"never closed', 1, "an EDN form"),
    ("\n\n:", 3, "well-formed"),
    ("[1] [2]", 1, "one form only"),
    ("[" * 100, 1, "nested"),
    ("12abc", 1, "malformed number"),
])
def test_edn_errors_name_the_line(text: str, line: int, expected: str) -> None:
    with pytest.raises(HistoryFormatError, match=expected) as caught:
        read_one(text, "bad.edn")
    assert caught.value.line == line
    assert str(caught.value).startswith(f"bad.edn:{line}: expected")


def test_sequence_items_report_their_lines() -> None:
    reader = Reader("; header\n[{:a 1}\n {:a 2}\n\n {:a 3}]\n", "t")
    assert [line for line, _ in reader.sequence_items()] == [2, 3, 5]


def test_jepsen_logs_are_read_as_cas_register_histories() -> None:
    loaded = load(PUBLISHED / "jepsen-etcd" / "etcd_000.log")
    assert loaded.format == "jepsen-log"
    assert loaded.initial is None
    hist = loaded.history
    assert len(hist.events) == 170
    first = hist.events[0]
    assert (first.process, first.type, first.f, first.value) == (0, EventType.INVOKE, "read", None)
    assert hist.line_of(0) == 1
    cas = next(op for op in hist.operations if op.f == "cas")
    assert isinstance(cas.input, tuple)
    assert len(cas.input) == 2
    statuses = {op.status for op in hist.operations}
    assert statuses == {EventType.OK, EventType.FAIL, EventType.INFO}


def test_jepsen_logs_keep_the_nemesis_and_skip_other_log_lines() -> None:
    text = ("INFO  jepsen.core - Running test\n"
            "INFO  jepsen.util - 0\t:invoke\t:write\t1\n"
            "INFO  jepsen.util - :nemesis\t:info\t:start\tCut off {:n1 #{:n2}}\n"
            "INFO  jepsen.util - 0\t:ok\t:write\t1\n")
    loaded = parse(text, "log")
    assert loaded.format == "jepsen-log"
    assert [event.process for event in loaded.history.events] == [0, "nemesis", 0]
    assert loaded.history.lines == (2, 3, 4)


@pytest.mark.parametrize(("text", "line", "expected"), [
    ("INFO  jepsen.util - 0\t:invoke\n", 1, "process, type, function and value"),
    ("INFO  jepsen.util - 0\t:invoke\t:write\t[1\n", 1, "to close"),
    ("INFO  jepsen.util - 0\t:begin\t:write\t1\n", 1, "a type of"),
    ("INFO  jepsen.util - 0\t:invoke\t:write\t1\nINFO  jepsen.util - 1\t:ok\t:write\t1\n", 2,
     "pair up"),
    ("INFO  jepsen.util - x.y\t:invoke\t:write\t1\n", 1, "process"),
])
def test_malformed_jepsen_logs_name_the_line(text: str, line: int, expected: str) -> None:
    with pytest.raises(HistoryFormatError, match=expected) as caught:
        parse(text, "bad.log", "jepsen-log")
    assert caught.value.line == line


def test_porcupine_kv_lines() -> None:
    loaded = load(PUBLISHED / "porcupine-kv" / "c01-ok.txt")
    assert (loaded.format, loaded.initial) == ("porcupine-kv", "")
    first = loaded.history.operations[0]
    assert (first.f, first.key, first.input) == ("append", "0", "x 0 0 y")
    with pytest.raises(HistoryFormatError, match="a :type entry") as caught:
        parse('{:process 0, :type :invoke, :f :get, :key "1"}\n{:process 0, :f :get}\n', "kv",
              "porcupine-kv")
    assert caught.value.line == 2


def test_knossos_histories_read_nil_reads_as_unknown() -> None:
    loaded = load(PUBLISHED / "knossos" / "rethink-fail-minimal.edn")
    assert (loaded.format, loaded.initial) == ("knossos", 0)
    assert loaded.history.lines == (1, 2, 4, 5, 7, 8, 12, 13)
    text = "[{:process 0 :type :invoke :f :read :value nil}\n{:process 0 :type :ok :f :read}]"
    (read,) = parse(text, "k", "knossos").history.operations
    assert read.status is EventType.INFO


@pytest.mark.parametrize(("text", "line", "expected"), [
    ("{:process 0}", 1, "a vector or list"),
    ("[{:process 0 :type :invoke :f :read}\n 3]", 2, "an operation map"),
    ("[{:process 0 :type :invoke :f :read}\n {:process 0 :type :done :f :read}]", 2, "type"),
    ("[{:process 0 :type :invoke :f :read}\n {:process 1.5 :type :ok :f :read}]", 2, "process"),
    ("[{:process 0 :type :invoke :f :read}] extra", 1, "nothing after"),
    ("", 1, "a vector or list"),
])
def test_malformed_knossos_histories_name_the_line(text: str, line: int, expected: str) -> None:
    with pytest.raises(HistoryFormatError, match=expected) as caught:
        parse(text, "bad.edn", "knossos")
    assert caught.value.line == line


@pytest.mark.parametrize(("text", "format"), [
    ('{"cellar-history": 1}\n', "jsonl"),
    ('\n{"process": 0, "type": "invoke", "f": "read"}', "jsonl"),
    ("{:process 0, :type :invoke, :f :get}", "porcupine-kv"),
    ("; comment\n[{:process 0}]", "knossos"),
    ("({:process 0})", "knossos"),
    ("INFO  jepsen.util - 0\t:invoke\t:read\tnil", "jepsen-log"),
    ("log noise\nINFO  jepsen.util - 0\t:invoke\t:read\tnil", "jepsen-log"),
    ("", "jsonl"),
])
def test_formats_are_detected(text: str, format: str) -> None:
    assert detect(text, "t") == format


@pytest.mark.parametrize(("text", "source"), [('{"bad\n', "h.txt"), ("{bad\n", "h.jsonl"),
                                              ('{ "process": 0 "type": 1}', "h")])
def test_a_broken_json_line_is_read_as_json_to_say_what_is_wrong(text: str, source: str
                                                                 ) -> None:
    assert detect(text, source) == "jsonl"


def test_undetectable_files_ask_for_a_format() -> None:
    with pytest.raises(HistoryFormatError, match="--format") as caught:
        detect("\nhello world\n", "mystery.txt")
    assert caught.value.line == 2


def sample_history() -> HistoryRecorder:
    recorder = HistoryRecorder()
    write = recorder.invoke(0, "write", [1, "two", None, True, 2.5], key="k")
    recorder.nemesis("partition", "n1 | n2 n3")
    recorder.ok(write, [1, "two", None, True, 2.5])
    read = recorder.invoke(1, "read", key="k")
    recorder.info(read, "timed-out")
    recorder.invoke(2, "cas", [1, 2])
    return recorder


def test_jsonl_round_trip(tmp_path: pathlib.Path) -> None:
    original = sample_history().history()
    save(original, tmp_path / "h.jsonl", initial=0)
    loaded = load(tmp_path / "h.jsonl")
    assert (loaded.format, loaded.initial) == ("jsonl", 0)
    assert loaded.history.events == original.events
    save(original, tmp_path / "plain.jsonl")
    assert load(tmp_path / "plain.jsonl").initial is UNSET


@pytest.mark.parametrize(("text", "line", "expected"), [
    ('{"process": 0, "type": "invoke"}', 1, '"f" field'),
    ('{"process": 0, "type": "begin", "f": "read"}', 1, "a type of"),
    ('{"process": 0, "type": "invoke", "f": "read", "index": 4}', 1, "index 0"),
    ('{"process": 0, "type": "invoke", "f": "read", "value": {"a": 1}}', 1, "a value"),
    ('{"process": true, "type": "invoke", "f": "read"}', 1, "integer or a string"),
    ('\n\n{"process": 0, "type": "invoke", "f": "read"', 3, "a JSON object"),
    ('[1, 2]', 1, "a JSON object"),
    ('{"process": 0, "type": "invoke", "f": "read"}\n{"cellar-history": 1}', 2, "one header"),
    ('{"process": 0, "type": "ok", "f": "read"}', 1, "pair up"),
])
def test_malformed_jsonl_names_the_line(text: str, line: int, expected: str) -> None:
    with pytest.raises(HistoryFormatError, match=expected) as caught:
        parse(text, "bad.jsonl", "jsonl")
    assert caught.value.line == line


def test_undecodable_bytes_name_their_line(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "binary.jsonl"
    path.write_bytes(b'{"cellar-history": 1}\n\xff\xfe\n')
    with pytest.raises(HistoryFormatError, match="UTF-8") as caught:
        load(path)
    assert caught.value.line == 2


def test_unknown_format_names_are_refused() -> None:
    with pytest.raises(HistoryFormatError, match="a format among"):
        parse("", "t", "csv")


def test_the_edn_writer_round_trips_through_the_knossos_reader() -> None:
    original = sample_history().history()
    text = edn_dumps(original)
    assert text.splitlines()[0] == ('[{:index 0, :process 0, :type :invoke, :f :write, :key "k", '
                                    ':value [1 "two" nil true 2.5]}')
    assert ":process :nemesis" in text
    loaded = parse(text, "written.edn")
    assert loaded.format == "knossos"
    assert loaded.history.events == original.events


def test_the_edn_writer_writes_what_knossos_expects_of_a_register() -> None:
    hist = history("""
        0 invoke write 3
        0 ok write 3
        1 invoke read
        1 ok read 3""")
    lines = edn_dumps(hist).splitlines()
    assert lines == ["[{:index 0, :process 0, :type :invoke, :f :write, :value 3}",
                     " {:index 1, :process 0, :type :ok, :f :write, :value 3}",
                     " {:index 2, :process 1, :type :invoke, :f :read, :value nil}",
                     " {:index 3, :process 1, :type :ok, :f :read, :value 3}]"]
    assert edn_dumps(history("")) == "[]\n"
