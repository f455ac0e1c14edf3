"""The failure diagnosis must explain Knossos histories whose invocations carry no
value (Knossos fills an invocation's value from its completion, and so does the checker): the
"outcome unknown" relaxation used for operations pending at a cut must keep that value."""

from __future__ import annotations

import pathlib

from cellar.cli import main as cellar_main
from jepsen.check_cli import EXIT_NOT_LINEARIZABLE
from jepsen.checker import check
from jepsen.formats import parse
from jepsen.models import RegisterModel
from jepsen.verdict import Verdict

CAS_WITHOUT_INVOCATION_VALUE = """\
[{:process 0, :type :invoke, :f :cas, :value nil}
 {:process 1, :type :invoke, :f :read, :value nil}
 {:process 1, :type :ok, :f :read, :value 5}
 {:process 0, :type :ok, :f :cas, :value [0 1]}]
"""

WRITE_WITHOUT_INVOCATION_VALUE = """\
[{:process 3, :type :invoke, :f :read, :value nil}
 {:process 3, :type :ok, :f :read, :value 0}
 {:process 0, :type :invoke, :f :write, :value nil}
 {:process 1, :type :invoke, :f :read, :value nil}
 {:process 1, :type :ok, :f :read, :value 3}
 {:process 0, :type :ok, :f :write, :value 3}
 {:process 2, :type :invoke, :f :read, :value nil}
 {:process 2, :type :ok, :f :read, :value 7}]
"""


def test_a_refuted_history_with_a_valueless_cas_invocation_is_diagnosed() -> None:
    history = parse(CAS_WITHOUT_INVOCATION_VALUE, "h.edn").history
    model = RegisterModel(0, cas=True)
    assert check(model, history, explain=False).verdict is Verdict.NOT_LINEARIZABLE
    result = check(model, history)  # raised ModelError from inside the diagnosis
    assert result.verdict is Verdict.NOT_LINEARIZABLE
    assert result.failure is not None and result.failure.operation == 1  # the read of 5


def test_cellar_check_says_not_linearizable_not_unreadable(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "h.edn"
    path.write_text(CAS_WITHOUT_INVOCATION_VALUE)
    assert cellar_main(["check", str(path), "--model", "cas-register"]) == \
        EXIT_NOT_LINEARIZABLE


def test_the_blamed_completion_is_the_first_that_no_order_explains() -> None:
    history = parse(WRITE_WITHOUT_INVOCATION_VALUE, "h.edn").history
    result = check(RegisterModel(0), history)
    assert result.verdict is Verdict.NOT_LINEARIZABLE
    assert result.failure is not None
    # The read of 3 is explained by the write of 3, pending at its completion; the read of 7
    # is the first completion nothing explains.
    assert result.failure.operation == 3
