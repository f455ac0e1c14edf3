"""Histories of a simulated store: a correct store passes, a deliberately broken one (stale
reads, lost writes) is rejected, and one seed always gives the same history."""

from __future__ import annotations

import pytest

from jepsen.checker import check
from jepsen.models import KvModel, Model, RegisterModel
from jepsen.synthetic import Workload, generate
from jepsen.verdict import Verdict


def model_for(workload: Workload) -> Model:
    return KvModel() if workload.kind == "kv" else RegisterModel(None, cas=True)


@pytest.mark.parametrize("kind", ["kv", "cas-register"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_correct_store_is_linearizable(kind: str, seed: int) -> None:
    workload = Workload(kind=kind, processes=10, operations=400, keys=4, info_ppm=20_000)
    history = generate(workload, seed)
    assert len(history.operations) == 400
    assert check(model_for(workload), history).verdict is Verdict.LINEARIZABLE


@pytest.mark.parametrize("fault", ["stale_read_ppm", "lost_write_ppm"])
@pytest.mark.parametrize("kind", ["kv", "cas-register"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_broken_store_is_caught(fault: str, kind: str, seed: int) -> None:
    """One operation in ten goes wrong. (With more clients on one register a lost write hides
    more easily: another write may have overwritten it in any order the checker picks.)"""
    workload = Workload(kind=kind, processes=4, operations=400, keys=4,
                        **{fault: 100_000})
    result = check(model_for(workload), generate(workload, seed), timeout_s=30)
    assert result.verdict is Verdict.NOT_LINEARIZABLE
    assert result.failure is not None


def test_one_seed_one_history() -> None:
    workload = Workload(kind="kv", processes=5, operations=100, info_ppm=100_000)
    assert generate(workload, 9).events == generate(workload, 9).events
    assert generate(workload, 9).events != generate(workload, 10).events


def test_crashed_clients_continue_under_new_process_ids() -> None:
    workload = Workload(kind="kv", processes=3, operations=300, info_ppm=200_000)
    history = generate(workload, 4)
    processes = {op.process for op in history.operations}
    assert len(processes) > 3
    assert any(op.status.value == "info" for op in history.operations)
