"""The sample histories other tools published, with the verdicts their authors know, and our
own corpus of good and bad histories: every bad one must be rejected.

The published files are kept unchanged under data/published/ (see the README there); our own
are under data/corpus/<model>/, named ...-ok.jsonl or ...-bad.jsonl for their verdict.
"""

from __future__ import annotations

import pathlib

import pytest

from jepsen.checker import check
from jepsen.formats import load
from jepsen.models import model_named
from jepsen.verdict import Verdict

DATA = pathlib.Path(__file__).resolve().parent / "data"
PUBLISHED = [
    ("jepsen-etcd/etcd_000.log", "jepsen-log", "cas-register", 85, Verdict.NOT_LINEARIZABLE),
    ("jepsen-etcd/etcd_002.log", "jepsen-log", "cas-register", 77, Verdict.LINEARIZABLE),
    ("porcupine-kv/c01-ok.txt", "porcupine-kv", "kv", 58, Verdict.LINEARIZABLE),
    ("porcupine-kv/c01-bad.txt", "porcupine-kv", "kv", 38, Verdict.NOT_LINEARIZABLE),
    ("knossos/memstress3-0.edn", "knossos", "cas-register", 317, Verdict.LINEARIZABLE),
    ("knossos/rethink-fail-minimal.edn", "knossos", "cas-register", 4,
     Verdict.NOT_LINEARIZABLE),
]
CORPUS = sorted((DATA / "corpus").glob("*/*.jsonl"))


@pytest.mark.parametrize(("name", "format", "model", "operations", "verdict"), PUBLISHED,
                         ids=[row[0] for row in PUBLISHED])
def test_published_histories_get_their_known_verdicts(name: str, format: str, model: str,
                                                      operations: int,
                                                      verdict: Verdict) -> None:
    loaded = load(DATA / "published" / name)
    assert loaded.format == format
    assert len(loaded.history.operations) == operations
    result = check(model_named(model, loaded.initial), loaded.history)  # type: ignore[arg-type]
    assert result.verdict is verdict
    assert (result.failure is not None) == (verdict is Verdict.NOT_LINEARIZABLE)


def test_the_etcd_failure_is_pinned_to_the_read_that_no_order_explains() -> None:
    loaded = load(DATA / "published" / "jepsen-etcd" / "etcd_000.log")
    result = check(model_named("cas-register", None), loaded.history)
    failure = result.failure
    assert failure is not None
    blamed = loaded.history.operations[failure.operation]
    assert (blamed.f, blamed.output, loaded.history.line_of(blamed.ret or 0)) == ("read", 2, 86)
    # write 1 returned (line 75), then a read saw 2, and no pending operation could write 2
    assert [loaded.history.operations[number].f for number in failure.window] == [
        "write", "read"]
    assert failure.exact


def test_the_knossos_nil_read_tells_nothing() -> None:
    loaded = load(DATA / "published" / "knossos" / "rethink-fail-minimal.edn")
    result = check(model_named("cas-register", 0), loaded.history)
    failure = result.failure
    assert failure is not None
    assert loaded.history.operations[failure.operation].output == 3
    assert failure.window == (failure.operation,)  # nobody ever wrote 3


def test_the_corpus_has_bad_histories_for_every_model() -> None:
    for model in ("register", "cas-register", "kv"):
        names = [path.name for path in CORPUS if path.parent.name == model]
        assert sum(name.endswith("-bad.jsonl") for name in names) >= 3, model
        assert sum(name.endswith("-ok.jsonl") for name in names) >= 2, model


@pytest.mark.parametrize("path", CORPUS, ids=[f"{p.parent.name}/{p.name}" for p in CORPUS])
def test_corpus_histories_get_the_verdict_in_their_name(path: pathlib.Path) -> None:
    loaded = load(path)
    assert loaded.format == "jsonl"
    result = check(model_named(path.parent.name, loaded.initial), loaded.history)  # type: ignore[arg-type]
    expected = Verdict.LINEARIZABLE if path.stem.endswith("-ok") else Verdict.NOT_LINEARIZABLE
    assert result.verdict is expected
