"""`cellar check`: exit statuses, the JSON object, format detection, initial values, the HTML
report, and files it cannot read (exit 3, never a verdict)."""

from __future__ import annotations

import json
import pathlib
import re

import pytest

from cellar.cli import main
from jepsen.formats import save
from jepsen.history import HistoryRecorder
from tests.jepsen.helpers import history

PUBLISHED = pathlib.Path(__file__).resolve().parent / "data" / "published"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["check", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize(("name", "model", "status", "verdict"), [
    ("jepsen-etcd/etcd_002.log", "cas-register", 0, "linearizable"),
    ("jepsen-etcd/etcd_000.log", "cas-register", 1, "not-linearizable"),
    ("porcupine-kv/c01-ok.txt", "kv", 0, "linearizable"),
    ("porcupine-kv/c01-bad.txt", "kv", 1, "not-linearizable"),
    ("knossos/memstress3-0.edn", "cas-register", 0, "linearizable"),
    ("knossos/rethink-fail-minimal.edn", "cas-register", 1, "not-linearizable"),
])
def test_json_verdicts_and_exit_statuses(capsys: pytest.CaptureFixture[str], name: str,
                                         model: str, status: int, verdict: str) -> None:
    code, out, err = run(capsys, str(PUBLISHED / name), "--model", model, "--json")
    assert (code, err) == (status, "")
    document = json.loads(out)
    assert document["verdict"] == verdict
    assert document["operations"] > 0
    assert document["elapsed_ms"] >= 0
    assert ("failure" in document) == (status == 1)


def test_the_text_summary_points_at_the_failure(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, str(PUBLISHED / "jepsen-etcd" / "etcd_000.log"),
                       "--model", "cas-register")
    assert code == 1
    assert "verdict: NOT linearizable" in out
    assert re.search(r"etcd_000\.log:85-86\): read -> 2", out)
    assert "smallest window found" in out


def test_unknown_is_exit_2(capsys: pytest.CaptureFixture[str],
                           tmp_path: pathlib.Path) -> None:
    recorder = HistoryRecorder()
    for value in range(1, 19):
        recorder.invoke(100 + value, "write", value)
    for value in range(18, 0, -1):
        recorder.ok(recorder.invoke(1, "read"), value)
    recorder.ok(recorder.invoke(1, "read"), -1)
    save(recorder.history(), tmp_path / "hard.jsonl")
    code, out, _ = run(capsys, str(tmp_path / "hard.jsonl"), "--model", "register",
                       "--timeout", "0.05", "--json")
    assert code == 2
    document = json.loads(out)
    assert document["verdict"] == "unknown"
    assert "time budget" in document["reason"]


def test_initial_values_follow_the_format_unless_overridden(
        capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    hist = history("""
        0 invoke read
        0 ok read 0""")
    save(hist, tmp_path / "plain.jsonl")  # no initial in the header: the model's nil
    assert run(capsys, str(tmp_path / "plain.jsonl"), "--model", "register")[0] == 1
    assert run(capsys, str(tmp_path / "plain.jsonl"), "--model", "register",
               "--initial", "0")[0] == 0
    save(hist, tmp_path / "zero.jsonl", initial=0)
    assert run(capsys, str(tmp_path / "zero.jsonl"), "--model", "register")[0] == 0
    assert run(capsys, str(tmp_path / "zero.jsonl"), "--model", "register",
               "--initial", "null")[0] == 1
    # Knossos histories start at 0: the same file read as EDN is linearizable
    knossos = tmp_path / "h.edn"
    knossos.write_text("[{:process 0 :type :invoke :f :read :value nil}\n"
                       " {:process 0 :type :ok :f :read :value 0}]\n")
    assert run(capsys, str(knossos), "--model", "register")[0] == 0
    assert run(capsys, str(knossos), "--model", "register", "--format", "knossos",
               "--initial", "5")[0] == 1


@pytest.mark.parametrize(("content", "argv", "message"), [
    (None, ["--model", "register"], "No such file"),
    ("[{:process 0 :type :invoke}", ["--model", "register"], ":1: expected"),
    ("hello\n", ["--model", "register"], "--format"),
    ('{"process": 0, "type": "invoke", "f": "append", "value": "x"}', ["--model", "register"],
     ":1: operation 0: the register model has no function 'append'"),
    ("", ["--model", "queue"], "no model named"),
    ("", ["--model", "register", "--format", "csv"], "a format among"),
])
def test_what_cannot_be_checked_exits_3(capsys: pytest.CaptureFixture[str],
                                        tmp_path: pathlib.Path, content: str | None,
                                        argv: list[str], message: str) -> None:
    path = tmp_path / "history.txt"
    if content is not None:
        path.write_text(content)
    code, out, err = run(capsys, str(path), *argv)
    assert code == 3
    assert out == ""
    assert message in err


def test_usage_errors_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["check", "file", "--model", "register", "--timeout", "soon"])
    assert caught.value.code == 3
    assert "argument --timeout: not a number: 'soon'" in capsys.readouterr().err


@pytest.mark.parametrize(("name", "content"), [
    ("true-after-1.jsonl", '{"cellar-history": 1, "initial": 0}\n'
     '{"process": 0, "type": "invoke", "f": "write", "value": 1}\n'
     '{"process": 0, "type": "ok", "f": "write", "value": 1}\n'
     '{"process": 1, "type": "invoke", "f": "read", "value": null}\n'
     '{"process": 1, "type": "ok", "f": "read", "value": true}\n'),
    ("false-for-0.jsonl", '{"cellar-history": 1, "initial": 0}\n'
     '{"process": 1, "type": "invoke", "f": "read", "value": null}\n'
     '{"process": 1, "type": "ok", "f": "read", "value": false}\n'),
    ("cas-from-true.edn", "[{:process 0, :type :invoke, :f :write, :value 1}\n"
     " {:process 0, :type :ok, :f :write, :value 1}\n"
     " {:process 1, :type :invoke, :f :cas, :value [true 5]}\n"
     " {:process 1, :type :ok, :f :cas, :value [true 5]}\n"
     " {:process 2, :type :invoke, :f :read, :value nil}\n"
     " {:process 2, :type :ok, :f :read, :value 5}]\n"),
    ("float-for-int.edn", "[{:process 0, :type :invoke, :f :write, :value 2}\n"
     " {:process 0, :type :ok, :f :write, :value 2}\n"
     " {:process 1, :type :invoke, :f :read, :value nil}\n"
     " {:process 1, :type :ok, :f :read, :value 2.0}]\n"),
], ids=["true-after-1", "false-for-0", "cas-from-true", "float-for-int"])
def test_a_value_of_another_type_is_not_linearizable(capsys: pytest.CaptureFixture[str],
                                                     tmp_path: pathlib.Path, name: str,
                                                     content: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    code, out, _ = run(capsys, str(path), "--model", "cas-register")
    assert code == 1
    assert "verdict: NOT linearizable" in out


OK_HISTORY = ('{"process": 0, "type": "invoke", "f": "write", "value": 1}\n'
              '{"process": 0, "type": "ok", "f": "write", "value": 1}\n')


def nested_read(depth: int) -> str:
    return ('{"process": 0, "type": "invoke", "f": "read", "value": '
            + "[" * depth + "]" * depth + "}\n")


@pytest.mark.parametrize(("content", "argv", "message"), [
    (nested_read(5000), [], ":1: expected a JSON object nested at most 64 deep"),
    (nested_read(100), [], ":1: expected a JSON object nested at most 64 deep"),
    ('{"process": 0, "type": "invoke", "f": "write", "value": NaN}\n', [],
     ":1: expected a value that is null, a boolean, a finite number, a string or a list, "
     "found NaN"),
    ('{"process": 0, "type": "invoke", "f": "write", "value": [1e999]}\n', [],
     "found [Infinity]"),
    ("[{:process 0 :type :invoke :f :write :value 1e999}]", ["--format", "knossos"],
     ":1: expected a value with finite numbers only, found inf"),
    (OK_HISTORY, ["--initial", "NaN"], "--initial: a history number is finite; got nan"),
    (OK_HISTORY, ["--html", "/nonexistent/dir/r.html"],
     "--html: no directory '/nonexistent/dir' to write r.html into"),
], ids=["nested-5000-deep", "nested-100-deep", "nan", "infinity", "edn-infinity",
        "initial-nan", "html-into-a-missing-directory"])
def test_bad_input_is_one_line_and_exit_3(capsys: pytest.CaptureFixture[str],
                                         tmp_path: pathlib.Path, content: str,
                                         argv: list[str], message: str) -> None:
    path = tmp_path / "history"
    path.write_text(content)
    code, out, err = run(capsys, str(path), "--model", "register", *argv)
    assert (code, out) == (3, "")
    assert err.count("\n") == 1
    assert message in err


def test_an_html_report_that_cannot_be_written_is_exit_3(
        capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    (tmp_path / "ok.jsonl").write_text(OK_HISTORY)
    (tmp_path / "report.html").symlink_to(tmp_path / "gone" / "report.html")
    code, out, err = run(capsys, str(tmp_path / "ok.jsonl"), "--model", "register",
                         "--html", str(tmp_path / "report.html"))
    assert (code, out) == (3, "")
    assert err.startswith("cellar check: --html: [Errno 2] No such file or directory")
    assert err.count("\n") == 1


def test_html_report_is_written(capsys: pytest.CaptureFixture[str],
                                tmp_path: pathlib.Path) -> None:
    out_path = tmp_path / "report.html"
    code, out, _ = run(capsys, str(PUBLISHED / "porcupine-kv" / "c01-bad.txt"), "--model",
                       "kv", "--html", str(out_path))
    assert code == 1
    page = out_path.read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert "not-linearizable" in page
    assert "verdict: NOT linearizable" in out


def test_a_history_of_no_client_events_says_so(capsys: pytest.CaptureFixture[str],
                                               tmp_path: pathlib.Path) -> None:
    """Processes given as strings are the nemesis's: a history of only those checks nothing,
    which the summary must not pass over in silence."""
    path = tmp_path / "strings.jsonl"
    path.write_text(OK_HISTORY.replace('"process": 0', '"process": "0"'))
    code, out, _ = run(capsys, str(path), "--model", "cas-register")
    assert code == 0
    assert "warning: none of its 2 events is a client's" in out
    path.write_text(OK_HISTORY)
    assert "warning" not in run(capsys, str(path), "--model", "cas-register")[1]



@pytest.mark.parametrize(("initial", "message"), [
    ("[" * 2000 + "]" * 2000, "--initial: nested more than 64 deep"),
    ("[" * 100 + "]" * 100, "--initial: nested more than 64 deep"),
    ("9" * 5000, "--initial: Exceeds the limit"),
])
def test_an_initial_value_no_history_could_hold_is_exit_3(
        capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, initial: str,
        message: str) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(OK_HISTORY)
    code, out, err = run(capsys, str(path), "--model", "register", "--initial", initial)
    assert (code, out) == (3, "")
    assert err.startswith(f"cellar check: {message}") and err.count("\n") == 1


def test_an_integer_too_long_to_read_is_exit_3_naming_the_line(
        capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    """Python refuses to convert an integer of more than 4,300 digits: that had escaped as a
    traceback and exit 1, which says NOT linearizable."""
    path = tmp_path / "big.jsonl"
    path.write_text(OK_HISTORY + '{"process": 1, "type": "invoke", "f": "write", "value": '
                    + "9" * 5000 + "}\n")
    code, out, err = run(capsys, str(path), "--model", "register")
    assert (code, out) == (3, "")
    assert err.startswith(f"cellar check: {path}:3: expected a JSON object, found Exceeds")
